"""My key: the key (masked, and in full behind a spoiler), the setup example, and rotation.

The key is re-derived from its salt each time (billing stores no key), so showing it again
costs nothing. Rotation asks first, because the old key stops working at once.
"""

from __future__ import annotations

from sqlmodel import Session
from telegram import Update
from telegram.ext import ContextTypes

from billing import keys
from bot import keyboards
from bot.runtime import account_of, lang, runtime
from bot.texts import Html, Lang, snippet, t


async def show_key(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.effective_message is not None
    key = await _current_key(update, context)
    language = lang(update)
    if key is None:
        await update.effective_message.reply_text(
            t(language, "key_none"),
            reply_markup=keyboards.packs(language, runtime(context).catalog),
        )
        return
    await update.effective_message.reply_text(
        _key_card(context, language, key), reply_markup=keyboards.key_actions(language)
    )


async def on_key_action(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """The buttons under "My key": setup example, rotate, confirm, cancel."""
    query = update.callback_query
    assert query is not None and update.effective_message is not None
    await query.answer()
    language = lang(update)
    if query.data == keyboards.KEY_ROTATE:
        await query.edit_message_text(
            t(language, "rotate_confirm"), reply_markup=keyboards.confirm_rotation(language)
        )
    elif query.data == keyboards.KEY_ROTATE_CONFIRM:
        await _rotate(update, context, language)
    elif query.data == keyboards.KEY_CANCEL:
        await query.edit_message_text(t(language, "rotate_cancelled"))
    elif query.data == keyboards.KEY_SNIPPET:
        key = await _current_key(update, context)
        if key is None:
            await show_key(update, context)
            return
        await update.effective_message.reply_text(_snippet(context, language, key))


async def _rotate(update: Update, context: ContextTypes.DEFAULT_TYPE, language: Lang) -> None:
    query = update.callback_query
    assert query is not None
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> str | None:
        if keys.active_key(session=session, account_id=account_id) is None:
            return None  # nothing to rotate: keys come with the first pack
        return keys.rotate_key(session=session, account_id=account_id, secret_key=shop.secret_key)

    key = await shop.run(work)
    if key is None:
        await query.edit_message_text(
            t(language, "key_none"), reply_markup=keyboards.packs(language, shop.catalog)
        )
        return
    await query.edit_message_text(t(language, "rotated", snippet=_snippet(context, language, key)))


async def _current_key(update: Update, context: ContextTypes.DEFAULT_TYPE) -> str | None:
    account = await account_of(update, context)
    assert account.id is not None
    account_id = account.id
    shop = runtime(context)

    def work(session: Session) -> str | None:
        return keys.show_key(session=session, account_id=account_id, secret_key=shop.secret_key)

    return await shop.read(work)


def _key_card(context: ContextTypes.DEFAULT_TYPE, language: Lang, key: str) -> Html:
    return t(
        language,
        "key_show",
        masked=keys.mask_key(key),
        key=key,
        base_url=runtime(context).settings.public_api_base_url,
    )


def _snippet(context: ContextTypes.DEFAULT_TYPE, language: Lang, key: str) -> Html:
    settings = runtime(context).settings
    return snippet(
        language, key=key, base_url=settings.public_api_base_url, model=settings.snippet_model
    )
