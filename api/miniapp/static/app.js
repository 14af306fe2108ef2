// Tokenshop's Mini App: a page over the JSON API at ./api (api/routes/miniapp.py). It proves who
// the user is with Telegram's signed initData, then uses the short session the server returns.
// Every figure comes from the API; the page only draws it (uPlot, vendored) and acts on it.
"use strict";

(() => {
  const tg = window.Telegram && window.Telegram.WebApp;
  const state = { token: null, me: null, usageDays: 30, operatorDays: 30, balance: null };
  const charts = {};
  window.tokenshop = { state, charts }; // for a look from the browser's console (and tests)
  const palette = ["#3390ec", "#f5a623", "#2ecc71", "#e74c3c", "#9b59b6", "#1abc9c", "#e67e22", "#7f8c8d"];
  let number = new Intl.NumberFormat("en-US");
  let lang = "en";

  // Texts: English is the page's own (index.html and here); Russian as the bot speaks it.
  const TEXTS = {
    en: {
      open_from_telegram: "Open this page from the bot's menu in Telegram.",
      sign_in_failed: "Sign-in failed.",
      export_failed: "The export failed; try again.",
      no_key: "No key yet: make one below, or buy a pack and the bot makes one.",
      key_usage: "{requests} requests · {tokens} tokens",
      no_limits: "No limits",
      limits: "Limits: {list}",
      spend_total: "{spent} of {spend} tokens",
      spend_period: "{spent} of {spend} tokens {period} (resets {at} UTC)",
      daily: "today", weekly: "this week", monthly: "this month",
      expires: "expires {date}",
      models: "models {list}",
      rpm: "{n} requests/min",
      tpm: "{n} tokens/min",
      rename: "Rename", limits_button: "Limits", rotate: "Rotate", revoke: "Revoke", save: "Save",
      new_name: "New name",
      rotate_confirm: "Rotate “{name}”? The key stops working at once and a new one replaces it.",
      revoke_confirm: "Revoke “{name}”? It stops working at once.",
      pack_tokens: "{tokens} tokens",
      plan_tokens: "{tokens} tokens every {days} days, until you cancel (/plan in the bot)",
      per_month: "{price} ⭐/month",
      payment_failed: "The payment did not go through.",
      crediting: "Payment received: crediting your tokens…",
      credited: "Credited: +{tokens} tokens.",
      credit_later: "The payment is being credited; the bot will confirm it in the chat.",
      copied: "Copied.",
      csv_sent: "The bot sent the CSV to your chat.",
      support_sent: "Sent: an operator will answer here and in the chat.",
      support_saved: "Saved; the operators will see it.",
      prompt: "prompt", completion: "completion", day: "Day",
    },
    ru: {
      tab_balance: "Баланс", tab_usage: "Расход", tab_keys: "Ключи", tab_buy: "Купить",
      tab_support: "Поддержка", tab_operator: "Оператор",
      available: "Доступно", tokens: "токенов", held: "Заняты запросами", purchased: "Куплено",
      granted: "Подарено", used: "Израсходовано", refunded: "Возвращено", buy_tokens: "Купить токены",
      days_7: "7 дней", days_30: "30 дней", days_90: "90 дней",
      day: "День", model: "Модель", prompt: "запрос", completion: "ответ", billed: "Списано",
      usage_empty: "За это время запросов не было.", download_csv: "Скачать CSV",
      new_secret: "Ваш новый ключ: скопируйте его сейчас, здесь он показан один раз",
      copy: "Копировать", new_key_name: "Название нового ключа", new_key: "Новый ключ",
      terms_prompt: "Перед покупкой прочитайте условия (отправьте боту <b>/terms</b>) и примите их.",
      accept_terms: "Принимаю условия",
      stars_hint: "Оплата в Telegram Stars; токены зачисляются, как только Telegram подтвердит платёж.",
      thread_empty: "Напишите нам: оператор ответит здесь и в чате с ботом.",
      your_message: "Ваше сообщение", send: "Отправить",
      open_from_telegram: "Откройте эту страницу из меню бота в Telegram.",
      sign_in_failed: "Не удалось войти.",
      export_failed: "Не удалось выгрузить; попробуйте ещё раз.",
      no_key: "Ключей пока нет: создайте ключ ниже или купите пакет, и бот выдаст ключ.",
      key_usage: "{requests} запросов · {tokens} токенов",
      no_limits: "Без ограничений",
      limits: "Ограничения: {list}",
      spend_total: "{spent} из {spend} токенов",
      spend_period: "{spent} из {spend} токенов {period} (сброс {at} UTC)",
      daily: "сегодня", weekly: "на этой неделе", monthly: "в этом месяце",
      expires: "действует до {date}",
      models: "модели {list}",
      rpm: "{n} запросов/мин",
      tpm: "{n} токенов/мин",
      rename: "Переименовать", limits_button: "Ограничения", rotate: "Заменить", revoke: "Отозвать",
      save: "Сохранить", new_name: "Новое название",
      rotate_confirm: "Заменить «{name}»? Ключ сразу перестанет работать, его заменит новый.",
      revoke_confirm: "Отозвать «{name}»? Ключ сразу перестанет работать.",
      pack_tokens: "{tokens} токенов",
      plan_tokens: "{tokens} токенов каждые {days} дней, пока не отмените (/plan в боте)",
      per_month: "{price} ⭐/мес.",
      payment_failed: "Платёж не прошёл.",
      crediting: "Платёж получен: зачисляем токены…",
      credited: "Зачислено: +{tokens} токенов.",
      credit_later: "Платёж зачисляется; бот подтвердит его в чате.",
      copied: "Скопировано.",
      csv_to_chat: "Прислать CSV в чат",
      csv_sent: "Бот прислал CSV в ваш чат.",
      support_sent: "Отправлено: оператор ответит здесь и в чате.",
      support_saved: "Сохранено; операторы увидят сообщение.",
    },
  };

  function t(id, values = {}) {
    const template = (TEXTS[lang] && TEXTS[lang][id]) || TEXTS.en[id] || id;
    return template.replace(/\{(\w+)\}/g, (_, name) => String(values[name]));
  }

  function localize(code) {
    lang = code && code.toLowerCase().startsWith("ru") ? "ru" : "en";
    number = new Intl.NumberFormat(lang === "ru" ? "ru-RU" : "en-US");
    document.documentElement.lang = lang;
    if (lang === "en") return; // the page is written in English
    for (const element of document.querySelectorAll("[data-t]")) {
      const text = TEXTS[lang][element.dataset.t];
      if (!text) continue;
      if (element.hasAttribute("data-t-html")) element.innerHTML = text; // our own markup only
      else element.textContent = text;
    }
    for (const element of document.querySelectorAll("[data-t-placeholder]")) {
      const text = TEXTS[lang][element.dataset.tPlaceholder];
      if (text) { element.placeholder = text; element.setAttribute("aria-label", text); }
    }
  }
  const $ = (selector, root = document) => root.querySelector(selector);

  // ---- Talking to the server.
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function signIn() {
    const initData = tg ? tg.initData : "";
    if (!initData) throw new ApiError(401, t("open_from_telegram"));
    const answer = await fetch("api/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ init_data: initData }),
    });
    const body = await answer.json();
    if (!answer.ok) throw new ApiError(answer.status, body.error ? body.error.message : t("sign_in_failed"));
    state.token = body.token;
    state.me = body.me;
  }

  async function call(method, path, body, retried = false) {
    if (!state.token) await signIn();
    const options = { method, headers: { Authorization: `Bearer ${state.token}` } };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    const answer = await fetch(`api/${path}`, options);
    if (answer.status === 401 && !retried) { // the session ran out: sign in again once
      state.token = null;
      return call(method, path, body, true);
    }
    if (answer.status === 204) return null;
    const type = answer.headers.get("content-type") || "";
    const result = type.includes("json") ? await answer.json() : await answer.text();
    if (!answer.ok) throw new ApiError(answer.status, result.error ? result.error.message : String(result));
    return result;
  }

  function notify(text) {
    const notice = $("#notice");
    notice.textContent = text;
    notice.hidden = !text;
  }

  async function guarded(work) {
    try {
      notify("");
      await work();
    } catch (error) {
      notify(error.message || String(error));
    }
  }

  // ---- Pages and tabs.
  const loaders = {
    balance: loadBalance, usage: loadUsage, keys: loadKeys,
    buy: loadShop, support: loadSupport, operator: loadOperator,
  };

  function show(page) {
    for (const tab of document.querySelectorAll("#tabs button")) {
      tab.setAttribute("aria-selected", String(tab.dataset.page === page));
    }
    for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${page}`;
    return guarded(loaders[page]);
  }

  // ---- Balance.
  async function loadBalance() {
    const balance = await call("GET", "balance");
    state.balance = balance;
    for (const [name, value] of Object.entries(balance)) {
      const cell = document.querySelector(`[data-figure="${name}"]`);
      if (cell) cell.textContent = number.format(value);
    }
  }

  // ---- Charts.
  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function dayStamp(day) {
    return Date.parse(`${day}T00:00:00Z`) / 1000;
  }

  function draw(id, days, series) {
    const element = document.getElementById(id);
    if (charts[id]) charts[id].destroy();
    element.textContent = "";
    const text = css("--text") || "#000";
    const grid = css("--separator") || "rgba(127,127,127,0.25)";
    const axis = { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } };
    const options = {
      width: Math.max(element.clientWidth, 280),
      height: 220,
      scales: { x: { time: true } },
      series: [{ label: t("day"), value: (_, stamp) => stamp == null ? "—" : new Date(stamp * 1000).toISOString().slice(0, 10) }]
        .concat(series.map((item, n) => ({
          label: item.label,
          stroke: palette[n % palette.length],
          width: 2,
          dash: item.dash,
          points: { show: true, size: 5 },
          value: (_, value) => value == null ? "—" : number.format(value),
        }))),
      axes: [axis, Object.assign({ size: 60, values: (_, ticks) => ticks.map((v) => compact(v)) }, axis)],
    };
    charts[id] = new uPlot(options, [days.map(dayStamp), ...series.map((item) => item.values)], element);
  }

  function compact(value) {
    if (Math.abs(value) >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
    if (Math.abs(value) >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
    return String(value);
  }

  function usageSeries(usage) {
    return usage.models.flatMap((model) => [
      { label: `${model.model} ${t("prompt")}`, values: model.prompt },
      { label: `${model.model} ${t("completion")}`, values: model.completion, dash: [6, 4] },
    ]);
  }

  function fill(tableId, rows) {
    const body = $(`#${tableId} tbody`);
    body.textContent = "";
    for (const cells of rows) {
      const row = body.insertRow();
      for (const value of cells) row.insertCell().textContent = typeof value === "number" ? number.format(value) : value;
    }
  }

  function usageRows(usage) {
    const rows = [];
    usage.days.forEach((day, at) => {
      for (const model of usage.models) {
        if (model.requests[at] || model.prompt[at] || model.completion[at]) {
          rows.push([day, model.model, model.prompt[at], model.completion[at], model.charged[at]]);
        }
      }
    });
    return rows.reverse(); // newest first
  }

  // ---- Usage.
  async function loadUsage() {
    const usage = await call("GET", `usage?days=${state.usageDays}`);
    draw("usage-chart", usage.days, usageSeries(usage));
    const rows = usageRows(usage);
    fill("usage-table", rows);
    $("#usage-empty").hidden = rows.length > 0;
  }

  async function downloadCsv() {
    if (!state.token) await signIn();
    const answer = await fetch("api/usage.csv", { headers: { Authorization: `Bearer ${state.token}` } });
    if (!answer.ok) throw new ApiError(answer.status, t("export_failed"));
    const link = document.createElement("a");
    link.href = URL.createObjectURL(await answer.blob());
    link.download = "tokenshop-usage.csv";
    document.body.appendChild(link);
    link.click();
    link.remove();
  }

  // ---- Keys.
  async function loadKeys() {
    const keys = await call("GET", "keys");
    const list = $("#key-list");
    list.textContent = "";
    if (!keys.length) {
      const empty = document.createElement("li");
      empty.textContent = t("no_key");
      list.appendChild(empty);
    }
    for (const key of keys) {
      const item = document.createElement("li");
      item.dataset.keyId = key.id;
      item.innerHTML = `<div class="title"></div><code class="masked"></code>
        <div class="hint usage"></div>
        <div class="hint limits"></div>
        <div class="actions">
          <button data-action="rename"></button>
          <button data-action="limits"></button>
          <button data-action="rotate"></button>
          <button data-action="revoke" class="danger"></button>
        </div>`;
      $(".title", item).textContent = key.name;
      $(".masked", item).textContent = key.masked;
      for (const action of ["rename", "rotate", "revoke"]) $(`[data-action="${action}"]`, item).textContent = t(action);
      $('[data-action="limits"]', item).textContent = t("limits_button");
      $(".usage", item).textContent = t("key_usage", { requests: number.format(key.requests), tokens: number.format(key.charged) });
      $(".limits", item).textContent = describeLimits(key.limits);
      item.dataset.limits = limitsInWords(key.limits);
      list.appendChild(item);
    }
  }

  function describeLimits(limits) {
    const parts = [];
    if (limits && limits.spend !== null) {
      const figures = { spent: number.format(limits.spent), spend: number.format(limits.spend) };
      parts.push(limits.period === "total" ? t("spend_total", figures) : t("spend_period", {
        ...figures, period: t(limits.period), at: limits.resets_at.slice(0, 16).replace("T", " "),
      }));
    }
    if (limits && limits.expires_at) parts.push(t("expires", { date: limits.expires_at.slice(0, 10) }));
    if (limits && limits.models.length) parts.push(t("models", { list: limits.models.join(", ") }));
    if (limits && limits.rpm !== null) parts.push(t("rpm", { n: number.format(limits.rpm) }));
    if (limits && limits.tpm !== null) parts.push(t("tpm", { n: number.format(limits.tpm) }));
    return parts.length ? t("limits", { list: parts.join("; ") }) : t("no_limits");
  }

  function limitsInWords(limits) { // as the bot and the API read them back
    if (!limits) return "";
    const words = [];
    if (limits.spend !== null) words.push(`spend ${limits.spend} ${limits.period}`);
    if (limits.rpm !== null) words.push(`rpm ${limits.rpm}`);
    if (limits.tpm !== null) words.push(`tpm ${limits.tpm}`);
    if (limits.models.length) words.push(`models ${limits.models.join(",")}`);
    if (limits.expires_at) words.push(`expires ${limits.expires_at.slice(0, 10)}`);
    return words.join("; ");
  }

  function inlineForm(item, { value, label, placeholder, maxLength, save }) {
    const input = document.createElement("input");
    input.value = value;
    input.maxLength = maxLength;
    input.placeholder = placeholder || "";
    input.setAttribute("aria-label", label);
    const form = document.createElement("form");
    form.className = "row";
    form.append(input, Object.assign(document.createElement("button"), { type: "submit", className: "primary", textContent: t("save") }));
    form.addEventListener("submit", (submitted) => {
      submitted.preventDefault();
      guarded(async () => {
        await save(input.value);
        await loadKeys();
      });
    });
    $(".actions", item).replaceWith(form);
    input.focus();
  }

  function showSecret(issued) {
    $("#new-secret-value").textContent = issued.secret;
    $("#new-secret").hidden = false;
  }

  function confirm(message) {
    return new Promise((resolve) => {
      if (tg && tg.showConfirm) tg.showConfirm(message, (ok) => resolve(Boolean(ok)));
      else resolve(window.confirm(message));
    });
  }

  async function onKeyAction(event) {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const item = button.closest("li");
    const id = item.dataset.keyId;
    const name = $(".title", item).textContent;
    const action = button.dataset.action;
    if (action === "rename") {
      inlineForm(item, {
        value: name, label: t("new_name"), maxLength: 64,
        save: (value) => call("PATCH", `keys/${id}`, { name: value }),
      });
      return;
    }
    if (action === "limits") {
      inlineForm(item, {
        value: item.dataset.limits, label: "Limits", maxLength: 2048,
        placeholder: "spend 5000 daily; rpm 60; models demo; expires 2027-01-31",
        save: (value) => call("PUT", `keys/${id}/limits`, { text: value.trim() || "clear" }),
      });
      return;
    }
    if (action === "rotate" && await confirm(t("rotate_confirm", { name }))) {
      const issued = await call("POST", `keys/${id}/rotate`);
      await loadKeys(); // the list first, so the new key never sits beside the old one's card
      showSecret(issued);
    }
    if (action === "revoke" && await confirm(t("revoke_confirm", { name }))) {
      await call("DELETE", `keys/${id}`);
      await loadKeys();
    }
  }

  // ---- Buying.
  async function loadShop() {
    const shop = await call("GET", "shop");
    $("#terms").hidden = shop.terms_accepted;
    const list = $("#packs");
    list.textContent = "";
    const items = shop.packs.map((pack) => ({ ...pack, kind: "pack", hint: t("pack_tokens", { tokens: number.format(pack.tokens) }), price: `${pack.price} ⭐` }))
      .concat((shop.plans || []).map((plan) => ({
        ...plan, kind: "plan", title: `🔁 ${plan.title}`,
        hint: t("plan_tokens", { tokens: number.format(plan.tokens), days: plan.period_days }),
        price: t("per_month", { price: plan.price }),
      })));
    for (const pack of items) {
      const item = document.createElement("li");
      item.style.padding = "0";
      const button = document.createElement("button");
      button.className = "pack";
      button.dataset[pack.kind] = pack.id;
      button.disabled = !shop.terms_accepted;
      button.innerHTML = `<span><span class="title"></span><br><span class="hint"></span></span><span class="price"></span>`;
      $(".title", button).textContent = pack.title;
      $(".hint", button).textContent = pack.hint;
      $(".price", button).textContent = pack.price;
      item.appendChild(button);
      list.appendChild(item);
    }
  }

  async function buy(choice) {
    // choice: { pack_id } or { plan_id } (a monthly plan: a Stars subscription)
    const before = (await call("GET", "balance")).available;
    const { invoice_link: link } = await call("POST", "invoice", choice);
    tg.openInvoice(link, (status) => {
      if (status === "paid") guarded(() => waitForCredit(before));
      else if (status === "failed") notify(t("payment_failed"));
    });
  }

  async function waitForCredit(before) {
    // Telegram tells the bot, and the bot credits; the page only waits to see it.
    notify(t("crediting"));
    for (let attempt = 0; attempt < 40; attempt += 1) {
      await loadBalance();
      if (state.balance.available > before) {
        const credited = state.balance.available - before;
        await show("balance");
        notify(t("credited", { tokens: number.format(credited) }));
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 1500));
    }
    notify(t("credit_later"));
  }

  // ---- Support.
  async function loadSupport() {
    const { messages } = await call("GET", "support");
    const thread = $("#thread");
    thread.textContent = "";
    for (const message of messages) {
      const item = document.createElement("li");
      item.className = message.from_operator ? "theirs" : "mine";
      item.textContent = message.text;
      const time = document.createElement("time");
      time.textContent = new Date(message.at).toISOString().slice(0, 16).replace("T", " ");
      item.appendChild(time);
      thread.appendChild(item);
    }
    $("#thread-empty").hidden = messages.length > 0;
  }

  // ---- Operator.
  async function loadOperator() {
    const report = await call("GET", `operator?days=${state.operatorDays}`);
    document.querySelector('[data-op="revenue"]').textContent = `${number.format(report.revenue)} ⭐`;
    const packs = [...new Set(report.sales.map((row) => row.pack))].sort();
    const index = Object.fromEntries(report.days.map((day, at) => [day, at]));
    draw("revenue-chart", report.days, packs.map((pack) => {
      const values = report.days.map(() => 0);
      for (const row of report.sales) if (row.pack === pack && row.day in index) values[index[row.day]] += row.stars;
      return { label: `${pack} ⭐`, values };
    }));
    fill("sales-table", report.sales.slice().reverse().map((r) => [r.day, r.pack, r.purchases, r.stars]));
    fill("refunds-table", report.refunds.slice().reverse().map((r) => [r.day, r.refunds, r.stars]));
    const byDay = (field) => report.days.map((day) => {
      const found = report.buyers.find((row) => row.day === day);
      return found ? found[field] : 0;
    });
    draw("buyers-chart", report.days, [
      { label: "new", values: byDay("new") },
      { label: "paying", values: byDay("paying") },
    ]);
    draw("tokens-chart", report.days, usageSeries(report.usage));
    fill("tokens-table", usageRows(report.usage));
    fill("top-table", report.top_accounts.map((a) => [a.name || `#${a.account_id}`, a.used, a.stars]));
    document.querySelector('[data-op="holds"]').textContent = number.format(report.open_holds.holds);
    document.querySelector('[data-op="held"]').textContent = number.format(report.open_holds.tokens);
    fill("stray-table", report.stray_charges.map((s) => [s.charge_id, String(s.telegram_id), s.stars, s.reason]));
    fill("queue-table", report.support_queue.map((w) => [w.name || String(w.telegram_id), w.text]));
    fill("upstream-table", report.upstreams.map((u) => [u.model, u.url, u.up ? "up" : "down"]));
  }

  // ---- Wiring.
  function wire() {
    $("#tabs").addEventListener("click", (event) => {
      const tab = event.target.closest("button[data-page]");
      if (tab) show(tab.dataset.page);
    });
    for (const button of document.querySelectorAll("[data-goto]")) {
      button.addEventListener("click", () => show(button.dataset.goto));
    }
    for (const group of document.querySelectorAll("[data-window]")) {
      group.addEventListener("click", (event) => {
        const button = event.target.closest("button[data-days]");
        if (!button) return;
        for (const other of group.querySelectorAll("button")) other.setAttribute("aria-pressed", String(other === button));
        const days = Number(button.dataset.days);
        if (group.dataset.window === "usage") { state.usageDays = days; guarded(loadUsage); }
        else { state.operatorDays = days; guarded(loadOperator); }
      });
    }
    $("#usage-csv").addEventListener("click", () => guarded(downloadCsv));
    $("#usage-csv-chat").addEventListener("click", () => guarded(async () => {
      await call("POST", "usage.csv/send");
      notify(t("csv_sent"));
    }));
    $("#key-list").addEventListener("click", (event) => guarded(() => onKeyAction(event)));
    $("#new-key").addEventListener("submit", (event) => {
      event.preventDefault();
      const name = event.target.elements.name.value.trim() || "default";
      guarded(async () => {
        const issued = await call("POST", "keys", { name });
        event.target.reset();
        await loadKeys();
        showSecret(issued);
      });
    });
    $("#copy-secret").addEventListener("click", () => {
      navigator.clipboard.writeText($("#new-secret-value").textContent).then(() => notify(t("copied")), () => {});
    });
    $("#accept-terms").addEventListener("click", () => guarded(async () => {
      await call("POST", "terms");
      await loadShop();
    }));
    $("#packs").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-pack], button[data-plan]");
      if (!button) return;
      const choice = button.dataset.plan ? { plan_id: button.dataset.plan } : { pack_id: button.dataset.pack };
      guarded(() => buy(choice));
    });
    $("#support-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = event.target.elements.text.value.trim();
      if (!text) return;
      guarded(async () => {
        const sent = await call("POST", "support", { text });
        event.target.reset();
        await loadSupport();
        notify(t(sent.delivered ? "support_sent" : "support_saved"));
      });
    });
  }

  async function start() {
    wire();
    if (tg) {
      tg.ready();
      tg.expand();
      // the user switched Telegram's theme: the CSS follows by itself, the charts are redrawn
      tg.onEvent("themeChanged", () => show($('#tabs [aria-selected="true"]').dataset.page));
    }
    await guarded(async () => {
      await signIn();
      localize(state.me.language);
      $('[data-page="operator"]').hidden = !state.me.operator;
      const wanted = new URLSearchParams(location.search).get("page") || (tg && tg.initDataUnsafe && tg.initDataUnsafe.start_param);
      await show(wanted in loaders ? wanted : "balance");
    });
  }

  start();
})();
