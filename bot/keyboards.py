"""Keyboards and callback data.

Callback data is a prefix and a value ("pack:starter", "key:rotate"); handlers are registered
by pattern on the prefix, so a button from an old message still lands in the right handler,
which re-checks everything against the database.
"""

from __future__ import annotations

from collections.abc import Sequence

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, ReplyKeyboardMarkup, WebAppInfo

from billing.packs import Pack
from billing.plans import Plan
from bot.texts import LANGUAGES, Lang, number
from bot.texts import plain as t

PACK = "pack:"
PLAN = "plan:"  # + plan id: subscribe to a monthly plan
SUBSCRIPTION = "sub:"  # sub:cancel:<subscription id>, sub:resume:<subscription id>
TERMS_ACCEPT = "terms:accept"
KEY = "key:"  # key:list, key:new, key:cancel, key:<action>:<key id>
REFUND_PURCHASE = "refund:p:"  # + purchase id
REFUND_CANCEL = "refund:cancel"
SUPPORT_WRITE = "support:write"
CLAIM = "claim:"  # + purchase id: the buyer asks for a refund
USAGE = "usage:"  # usage:page:<n>, usage:csv
LANGUAGE = "lang:"  # + language code

PACK_PATTERN = rf"^{PACK}"
PLAN_PATTERN = rf"^{PLAN}"
SUBSCRIPTION_PATTERN = rf"^{SUBSCRIPTION}(cancel|resume):\d+$"
TERMS_PATTERN = rf"^{TERMS_ACCEPT}$"
KEY_PATTERN = rf"^{KEY}"
REFUND_PATTERN = r"^refund:"
SUPPORT_PATTERN = rf"^{SUPPORT_WRITE}$"
CLAIM_PATTERN = rf"^{CLAIM}"
USAGE_PATTERN = rf"^{USAGE}"
LANGUAGE_PATTERN = rf"^{LANGUAGE}"

MENU_ACTIONS = ("buy", "key", "balance", "help", "support")


def main_menu(lang: Lang) -> ReplyKeyboardMarkup:
    """The persistent menu under the input field."""
    return ReplyKeyboardMarkup(
        [
            [t(lang, "button_buy"), t(lang, "button_key")],
            [t(lang, "button_balance"), t(lang, "button_support")],
            [t(lang, "button_help")],
        ],
        resize_keyboard=True,
        is_persistent=True,
    )


def menu_labels() -> dict[str, str]:
    """Every menu label in every language, mapped to its action ("buy", "key", ...)."""
    return {t(lang, f"button_{action}"): action for lang in LANGUAGES for action in MENU_ACTIONS}


def packs(lang: Lang, catalog: Sequence[Pack], plans: Sequence[Plan] = ()) -> InlineKeyboardMarkup:
    """The packs, then the monthly plans."""
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(
                    t(
                        lang,
                        "pack_button",
                        title=pack.title,
                        tokens=number(lang, pack.tokens),
                        price=pack.price,
                    ),
                    callback_data=f"{PACK}{pack.id}",
                )
            ]
            for pack in catalog
        ]
        + plan_rows(lang, plans)
    )


def plan_rows(lang: Lang, plans: Sequence[Plan]) -> list[list[InlineKeyboardButton]]:
    return [
        [
            InlineKeyboardButton(
                t(
                    lang,
                    "plan_button",
                    title=plan.title,
                    tokens=number(lang, plan.tokens),
                    price=plan.price,
                ),
                callback_data=f"{PLAN}{plan.id}",
            )
        ]
        for plan in plans
    ]


def subscribe(lang: Lang, link: str, price: int) -> InlineKeyboardMarkup:
    """The subscription's invoice link: Telegram's payment form opens on tap."""
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(t(lang, "button_subscribe", price=price), url=link)]]
    )


def subscription_actions(
    lang: Lang, running: Sequence[tuple[int, bool]], plans: Sequence[Plan] = ()
) -> InlineKeyboardMarkup:
    """Cancel or resume each running subscription (id, cancelled), then the plans on sale."""
    return InlineKeyboardMarkup(
        [
            [
                _button(lang, "button_plan_resume", f"{SUBSCRIPTION}resume:{subscription_id}")
                if canceled
                else _button(lang, "button_plan_cancel", f"{SUBSCRIPTION}cancel:{subscription_id}")
            ]
            for subscription_id, canceled in running
        ]
        + plan_rows(lang, plans)
    )


def accept_terms(lang: Lang) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(t(lang, "button_accept_terms"), callback_data=TERMS_ACCEPT)]]
    )


def open_app(lang: Lang, app_url: str, page: str) -> InlineKeyboardButton:
    """A button that opens the Mini App (PUBLIC_APP_URL) on one of its pages."""
    separator = "&" if "?" in app_url else "?"
    return InlineKeyboardButton(
        t(lang, "button_open_app"), web_app=WebAppInfo(f"{app_url}{separator}page={page}")
    )


def key_actions(
    lang: Lang, key_id: int, *, several: bool, app_url: str | None = None
) -> InlineKeyboardMarkup:
    rows = [
        [
            _button(lang, "button_snippet", f"{KEY}snippet:{key_id}"),
            _button(lang, "button_limits", f"{KEY}limits:{key_id}"),
        ],
        [
            _button(lang, "button_rename", f"{KEY}rename:{key_id}"),
            _button(lang, "button_rotate", f"{KEY}rotate:{key_id}"),
            _button(lang, "button_revoke", f"{KEY}revoke:{key_id}"),
        ],
        [_button(lang, "button_new_key", f"{KEY}new")],
    ]
    if several:
        rows.append([_button(lang, "button_all_keys", f"{KEY}list")])
    if app_url:
        rows.append([open_app(lang, app_url, "keys")])
    return InlineKeyboardMarkup(rows)


def key_list(lang: Lang, keys: Sequence[tuple[str, int]]) -> InlineKeyboardMarkup:
    """One button per key (its label and id), and a new one."""
    return InlineKeyboardMarkup(
        [
            [InlineKeyboardButton(label, callback_data=f"{KEY}show:{key_id}")]
            for label, key_id in keys
        ]
        + [[_button(lang, "button_new_key", f"{KEY}new")]]
    )


def confirm_key(lang: Lang, action: str, key_id: int) -> InlineKeyboardMarkup:
    """Rotate or revoke, confirmed."""
    return InlineKeyboardMarkup(
        [
            [
                _button(lang, f"button_{action}_yes", f"{KEY}{action}-yes:{key_id}"),
                _button(lang, "button_cancel", f"{KEY}cancel"),
            ]
        ]
    )


def confirm_refund(lang: Lang, purchase_id: int, price: int) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(
                    t(lang, "button_refund_yes", price=price),
                    callback_data=f"{REFUND_PURCHASE}{purchase_id}",
                ),
                _button(lang, "button_cancel", REFUND_CANCEL),
            ]
        ]
    )


def write_to_support(
    lang: Lang, refundable: Sequence[tuple[int, str, int]] = ()
) -> InlineKeyboardMarkup:
    """Write to support; and one refund request button per (purchase id, pack, price) given."""
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(
                    t(lang, "button_claim", pack=pack, price=price),
                    callback_data=f"{CLAIM}{purchase_id}",
                )
            ]
            for purchase_id, pack, price in refundable
        ]
        + [[_button(lang, "button_write_support", SUPPORT_WRITE)]]
    )


def usage_pages(
    lang: Lang, page: int, older: bool, app_url: str | None = None
) -> InlineKeyboardMarkup:
    """Paging through usage by day, newest first, the CSV export, and the Mini App's chart."""
    row = []
    if older:
        row.append(_button(lang, "button_older", f"{USAGE}page:{page + 1}"))
    if page > 0:
        row.append(_button(lang, "button_newer", f"{USAGE}page:{page - 1}"))
    rows = [row, [_button(lang, "button_csv", f"{USAGE}csv")]]
    if app_url:
        rows.append([open_app(lang, app_url, "usage")])
    return InlineKeyboardMarkup(rows)


def languages(names: dict[str, str]) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [
            [InlineKeyboardButton(name, callback_data=f"{LANGUAGE}{code}")]
            for code, name in names.items()
        ]
    )


def _button(lang: Lang, text_id: str, data: str) -> InlineKeyboardButton:
    return InlineKeyboardButton(t(lang, text_id), callback_data=data)
