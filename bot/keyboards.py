"""Keyboards and callback data.

Callback data is a prefix and a value ("pack:starter", "key:rotate"); handlers are registered
by pattern on the prefix, so a button from an old message still lands in the right handler,
which re-checks everything against the database.
"""

from __future__ import annotations

from collections.abc import Sequence

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, ReplyKeyboardMarkup

from billing.packs import Pack
from bot.texts import LANGUAGES, Lang, number
from bot.texts import plain as t

PACK = "pack:"
TERMS_ACCEPT = "terms:accept"
KEY_SNIPPET = "key:snippet"
KEY_ROTATE = "key:rotate"
KEY_ROTATE_CONFIRM = "key:rotate-confirm"
KEY_CANCEL = "key:cancel"

PACK_PATTERN = rf"^{PACK}"
TERMS_PATTERN = rf"^{TERMS_ACCEPT}$"
KEY_PATTERN = r"^key:"

MENU_ACTIONS = ("buy", "key", "balance", "help")


def main_menu(lang: Lang) -> ReplyKeyboardMarkup:
    """The persistent menu under the input field."""
    return ReplyKeyboardMarkup(
        [
            [t(lang, "button_buy"), t(lang, "button_key")],
            [t(lang, "button_balance"), t(lang, "button_help")],
        ],
        resize_keyboard=True,
        is_persistent=True,
    )


def menu_labels() -> dict[str, str]:
    """Every menu label in every language, mapped to its action ("buy", "key", ...)."""
    return {t(lang, f"button_{action}"): action for lang in LANGUAGES for action in MENU_ACTIONS}


def packs(lang: Lang, catalog: Sequence[Pack]) -> InlineKeyboardMarkup:
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
    )


def accept_terms(lang: Lang) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [[InlineKeyboardButton(t(lang, "button_accept_terms"), callback_data=TERMS_ACCEPT)]]
    )


def key_actions(lang: Lang) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [
            [InlineKeyboardButton(t(lang, "button_snippet"), callback_data=KEY_SNIPPET)],
            [InlineKeyboardButton(t(lang, "button_rotate"), callback_data=KEY_ROTATE)],
        ]
    )


def confirm_rotation(lang: Lang) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(
                    t(lang, "button_rotate_yes"), callback_data=KEY_ROTATE_CONFIRM
                ),
                InlineKeyboardButton(t(lang, "button_cancel"), callback_data=KEY_CANCEL),
            ]
        ]
    )
