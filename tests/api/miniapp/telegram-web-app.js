// A stand-in for Telegram's telegram-web-app.js in browser tests: the same `Telegram.WebApp`
// surface the page uses, initData and theme from `window.__TELEGRAM_STAND_IN__` (set by the
// test), and every event the page would post to Telegram recorded in `Telegram.WebView.events`.
// Telegram's answers come back through `Telegram.WebView.receiveEvent`, as in the real script.
(() => {
  const config = window.__TELEGRAM_STAND_IN__ || {};
  const events = [];
  const listeners = {};
  let invoiceCallbacks = {};
  let popupCallback = null;

  function postEvent(type, data) {
    events.push({ type, data: data === undefined ? null : data });
  }

  function applyTheme(themeParams) {
    for (const [name, value] of Object.entries(themeParams || {})) {
      document.documentElement.style.setProperty(`--tg-theme-${name.replace(/_/g, "-")}`, value);
    }
  }

  const fields = new URLSearchParams(config.initData || "");
  const initDataUnsafe = {};
  for (const [name, value] of fields) {
    try { initDataUnsafe[name] = JSON.parse(value); } catch (_) { initDataUnsafe[name] = value; }
  }

  const WebApp = {
    initData: config.initData || "",
    initDataUnsafe,
    version: "8.0",
    platform: "tdesktop",
    colorScheme: config.colorScheme || "light",
    themeParams: config.themeParams || {},
    ready() { postEvent("web_app_ready"); },
    expand() { postEvent("web_app_expand"); },
    close() { postEvent("web_app_close"); },
    onEvent(name, callback) { (listeners[name] = listeners[name] || []).push(callback); },
    offEvent(name, callback) { listeners[name] = (listeners[name] || []).filter((c) => c !== callback); },
    openInvoice(url, callback) {
      // The real script accepts t.me/$slug and t.me/invoice/slug links, and posts the slug.
      const match = url.match(/^https:\/\/t\.me\/(?:\$|invoice\/)([\w-]+)$/);
      if (!match) throw new Error("WebAppInvoiceUrlInvalid");
      invoiceCallbacks[match[1]] = callback;
      postEvent("web_app_open_invoice", { slug: match[1] });
    },
    showConfirm(message, callback) {
      postEvent("web_app_open_popup", {
        message, buttons: [{ id: "ok", type: "ok" }, { id: "cancel", type: "cancel" }],
      });
      popupCallback = (buttonId) => callback(buttonId === "ok");
      const answer = config.popupAnswer || "ok";
      setTimeout(() => receiveEvent("popup_closed", { button_id: answer }), 0);
    },
  };

  function emit(name, ...args) {
    for (const callback of listeners[name] || []) callback.apply(WebApp, args);
  }

  function receiveEvent(type, data) {
    if (type === "invoice_closed") {
      const callback = invoiceCallbacks[data.slug];
      delete invoiceCallbacks[data.slug];
      if (callback) callback(data.status);
      emit("invoiceClosed", { url: data.slug, status: data.status });
    } else if (type === "popup_closed") {
      const callback = popupCallback;
      popupCallback = null;
      if (callback) callback(data.button_id);
    } else if (type === "theme_changed") {
      WebApp.themeParams = data.theme_params;
      WebApp.colorScheme = data.color_scheme || WebApp.colorScheme;
      applyTheme(data.theme_params);
      emit("themeChanged");
    }
  }

  applyTheme(WebApp.themeParams);
  window.Telegram = { WebApp, WebView: { postEvent, receiveEvent, events } };
})();
