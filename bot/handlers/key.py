"""My keys: several named keys per account, each shown masked (and in full behind a spoiler)
with its own usage and limits; create, rename, limit, rotate and revoke (revoking leaves no
replacement; rotating keeps the limits and their spend).

A key is re-derived from its salt each time (billing stores no key), so showing it again costs
nothing. Rotating and revoking ask first, because the old key stops working at once. Buttons
carry the key's row id and every handler re-checks that it is a live key of the sender.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlmodel import Session, col, select
from telegram import ForceReply, Update
from telegram.ext import ContextTypes

from billing import keys
from billing.errors import InvalidLimits, KeyNotFound, TooManyKeys
from billing.key_limits import KeyReport
from billing.models import ApiKey
from billing.stats import KeyUsage, UsageRow, usage_by_day, usage_by_key
from bot import keyboards
from bot.handlers import key_limits
from bot.runtime import account_of, lang, runtime
from bot.texts import LANGUAGES, Html, Lang, lines, number, plain, snippet, t

CARD_USAGE_ROWS = 5
_RENAME_ID = re.compile(r"#(\d+)")


@dataclass(frozen=True)
class KeyView:
    id: int
    name: str
    key: str
    usage: KeyUsage


async def show_key(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """`/key` and the menu: the one key's card, or the list when there are several."""
    assert update.effective_message is not None
    language = lang(update, context)
    views, ever = await _keys(update, context)
    if not views and not ever:
        await update.effective_message.reply_text(
            t(language, "key_none"),
            reply_markup=keyboards.packs(language, runtime(context).catalog),
        )
        return
    if len(views) == 1:
        text, markup = await _card(update, context, views[0], language, len(views))
        await update.effective_message.reply_text(text, reply_markup=markup)
        return
    await update.effective_message.reply_text(
        _list(language, views), reply_markup=keyboards.key_list(language, _buttons(views))
    )


async def on_key_action(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The buttons of "My keys" (`key:<action>[:<id>]`)."""
    query = update.callback_query
    assert query is not None and query.data is not None
    assert update.effective_message is not None
    await query.answer()
    language = lang(update, context)
    action, _, raw_id = query.data.removeprefix(keyboards.KEY).partition(":")
    key_id = int(raw_id) if raw_id.isdigit() else None
    if action == "list":
        views, _ = await _keys(update, context)
        await query.edit_message_text(
            _list(language, views), reply_markup=keyboards.key_list(language, _buttons(views))
        )
        return
    if action == "new":
        await _create(update, context, language)
        return
    if action == "cancel":
        await query.edit_message_text(t(language, "key_unchanged"))
        return
    views, _ = await _keys(update, context)
    view = next((v for v in views if v.id == key_id), None)
    if view is None:  # revoked meanwhile, someone else's, or an old button
        await query.edit_message_text(
            _list(language, views), reply_markup=keyboards.key_list(language, _buttons(views))
        )
        return
    if action == "show":
        text, markup = await _card(update, context, view, language, len(views))
        await query.edit_message_text(text, reply_markup=markup)
    elif action == "snippet":
        await update.effective_message.reply_text(_snippet(context, language, view.key))
    elif action in ("rotate", "revoke"):
        await query.edit_message_text(
            t(language, f"{action}_confirm", name=view.name),
            reply_markup=keyboards.confirm_key(language, action, view.id),
        )
    elif action == "rotate-yes":
        await _rotate(update, context, language, view)
    elif action == "revoke-yes":
        await _revoke(update, context, language, view)
    elif action == "limits":
        await key_limits.ask(update, context, view.name, view.id)
    elif action == "rename":
        await update.effective_message.reply_text(
            plain(language, "rename_prompt", name=view.name, id=view.id),
            reply_markup=ForceReply(input_field_placeholder=view.name),
        )


def is_rename_prompt(text: str | None) -> bool:
    if not text or _RENAME_ID.search(text) is None:
        return False
    prefixes = {plain(code, "rename_prompt", name="", id="").split("«")[0] for code in LANGUAGES}
    return any(text.startswith(prefix) for prefix in prefixes)


async def on_rename_reply(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The new name, sent as a reply to the rename prompt."""
    message = update.effective_message
    assert message is not None and message.reply_to_message is not None
    found = _RENAME_ID.search(message.reply_to_message.text or "")
    assert found is not None
    key_id = int(found.group(1))
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    name = message.text or ""

    def work(session: Session) -> str:
        return keys.rename_key(
            session=session, account_id=account_id, key_id=key_id, name=name
        ).name

    language = lang(update, context)
    try:
        renamed = await runtime(context).run(work)
    except KeyNotFound:
        await message.reply_text(t(language, "key_gone"))
        return
    await message.reply_text(t(language, "renamed", name=renamed))
    await show_key(update, context)


async def on_limits_reply(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """New limits, sent as a reply to the 🚦 Limits prompt; then the card again."""
    message = update.effective_message
    assert message is not None and message.reply_to_message is not None
    key_id = key_limits.key_id_in_prompt(message.reply_to_message.text)
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    text = message.text or ""
    language = lang(update, context)
    try:
        name = await runtime(context).run(
            lambda s: key_limits.set_from_text(s, account_id=account_id, key_id=key_id, text=text)
        )
    except InvalidLimits as error:
        await message.reply_text(t(language, "limits_invalid", error=str(error)))
        return
    except KeyNotFound:
        await message.reply_text(t(language, "key_gone"))
        return
    await message.reply_text(t(language, "limits_set", name=name))
    await show_key(update, context)


async def _keys(update: Update, context: ContextTypes.DEFAULT_TYPE) -> tuple[list[KeyView], bool]:
    """The sender's live keys with their usage, and whether the account ever had a key."""
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> tuple[list[KeyView], bool]:
        live = keys.live_keys(session=session, account_id=account_id)
        usage = usage_by_key(session=session, account_id=account_id)
        ever = (
            session.exec(select(ApiKey.id).where(col(ApiKey.account_id) == account_id)).first()
            is not None
        )
        views = [
            KeyView(
                row.id,
                row.name,
                keys.derive_key(shop.secret_key, row.salt),
                usage.get(row.id, KeyUsage(0, 0)),
            )
            for row in live
            if row.id is not None
        ]
        return views, ever

    return await shop.read(work)


def _buttons(views: list[KeyView]) -> list[tuple[str, int]]:
    return [(f"{view.name} · {keys.mask_key(view.key)}", view.id) for view in views]


def _list(language: Lang, views: list[KeyView]) -> Html:
    if not views:
        return t(language, "keys_empty")
    return lines(
        [t(language, "keys_title")]
        + [
            t(
                language,
                "keys_line",
                name=view.name,
                masked=keys.mask_key(view.key),
                requests=number(language, view.usage.requests),
                tokens=number(language, view.usage.charged),
            )
            for view in views
        ]
    )


async def _card(
    update: Update, context: ContextTypes.DEFAULT_TYPE, view: KeyView, language: Lang, count: int
) -> tuple[Html, keyboards.InlineKeyboardMarkup]:
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> tuple[list[UsageRow], KeyReport | None]:
        rows, _ = usage_by_day(
            session=session, account_id=account_id, key_id=view.id, per_page=CARD_USAGE_ROWS
        )
        return rows, key_limits.read_report(session, view.id)

    rows, report = await runtime(context).read(work)
    parts = [
        t(
            language,
            "key_show",
            name=view.name,
            masked=keys.mask_key(view.key),
            key=view.key,
            base_url=runtime(context).settings.public_api_base_url,
        ),
        t(
            language,
            "key_usage",
            requests=number(language, view.usage.requests),
            tokens=number(language, view.usage.charged),
        ),
        key_limits.describe(language, report),
    ]
    parts.extend(usage_line(language, row) for row in rows)
    markup = keyboards.key_actions(
        language, view.id, several=count > 1, app_url=runtime(context).settings.public_app_url
    )
    return lines(parts), markup


def usage_line(language: Lang, row: UsageRow) -> Html:
    return t(
        language,
        "usage_line",
        day=row.day,
        model=row.model,
        requests=number(language, row.requests),
        prompt=number(language, row.prompt_tokens),
        completion=number(language, row.completion_tokens),
        charged=number(language, row.charged),
    )


async def _create(update: Update, context: ContextTypes.DEFAULT_TYPE, language: Lang) -> None:
    query = update.callback_query
    assert query is not None
    views, ever = await _keys(update, context)
    if not views and not ever:
        await query.edit_message_text(
            t(language, "key_none"),
            reply_markup=keyboards.packs(language, runtime(context).catalog),
        )
        return
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)
    name = plain(language, "key_default_name", number=len(views) + 1)

    def work(session: Session) -> int:
        row, _ = keys.create_key(
            session=session,
            account_id=account_id,
            secret_key=shop.secret_key,
            name=name,
            defaults=shop.settings.key_defaults(),
        )
        assert row.id is not None
        return row.id

    try:
        key_id = await shop.run(work)
    except TooManyKeys:
        await query.edit_message_text(t(language, "keys_too_many", limit=keys.MAX_LIVE_KEYS))
        return
    views, _ = await _keys(update, context)
    view = next(v for v in views if v.id == key_id)
    text, markup = await _card(update, context, view, language, len(views))
    await query.edit_message_text(lines([t(language, "key_created"), text]), reply_markup=markup)


async def _rotate(
    update: Update, context: ContextTypes.DEFAULT_TYPE, language: Lang, view: KeyView
) -> None:
    query = update.callback_query
    assert query is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> str:
        return keys.rotate_key(
            session=session, account_id=account_id, secret_key=shop.secret_key, key_id=view.id
        )

    try:
        key = await shop.run(work)
    except KeyNotFound:
        await query.edit_message_text(t(language, "key_gone"))
        return
    await query.edit_message_text(
        t(language, "rotated", name=view.name, snippet=_snippet(context, language, key))
    )


async def _revoke(
    update: Update, context: ContextTypes.DEFAULT_TYPE, language: Lang, view: KeyView
) -> None:
    query = update.callback_query
    assert query is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id

    def work(session: Session) -> bool:
        return keys.revoke_key(session=session, account_id=account_id, key_id=view.id)

    revoked = await runtime(context).run(work)
    views, _ = await _keys(update, context)
    await query.edit_message_text(
        lines(
            [
                t(language, "revoked" if revoked else "key_gone", name=view.name),
                _list(language, views),
            ]
        ),
        reply_markup=keyboards.key_list(language, _buttons(views)),
    )


def _snippet(context: ContextTypes.DEFAULT_TYPE, language: Lang, key: str) -> Html:
    settings = runtime(context).settings
    return snippet(
        language, key=key, base_url=settings.public_api_base_url, model=settings.snippet_model
    )
