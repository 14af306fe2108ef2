"""`build_application(settings)`: the bot's handlers in order, its error handler, its lifecycle.

Order matters in python-telegram-bot: within a group the first matching handler wins, and
groups run from the lowest number up. The pre-checkout handler has a group of its own ahead of
everything, and updates are processed concurrently, so a slow handler for one buyer never
delays another buyer's pre-checkout answer (Telegram waits 10 seconds at most).
"""

from __future__ import annotations

import logging

from telegram import (
    BotCommand,
    BotCommandScopeChat,
    LinkPreviewOptions,
    MenuButtonDefault,
    MenuButtonWebApp,
    Update,
    WebAppInfo,
)
from telegram.constants import ParseMode
from telegram.error import TelegramError
from telegram.ext import (
    Application,
    CallbackQueryHandler,
    ChatMemberHandler,
    CommandHandler,
    ContextTypes,
    Defaults,
    MessageHandler,
    PreCheckoutQueryHandler,
    TypeHandler,
    filters,
)

from billing.db import make_engine
from bot import keyboards
from bot.handlers import (
    admin,
    balance,
    claims,
    errors,
    growth,
    key,
    key_limits,
    language,
    members,
    payments,
    plans,
    shop,
    start,
    support,
)
from bot.jobs import notices_job, reconcile_job
from bot.key_alerts import key_alerts_job
from bot.logs import protect_token
from bot.runtime import RUNTIME, SETTINGS, Runtime, remember_language, runtime_of
from bot.settings import BotSettings
from bot.texts import DEFAULT, LANGUAGES, Lang, plain

logger = logging.getLogger(__name__)

ALLOWED_UPDATES = [
    Update.MESSAGE,
    Update.CALLBACK_QUERY,
    Update.PRE_CHECKOUT_QUERY,
    Update.MY_CHAT_MEMBER,
]
CONCURRENT_UPDATES = 64
FIRST_NOTICES_AFTER_S = 10
FIRST_RECONCILE_AFTER_S = 60

COMMANDS = (
    "start",
    "buy",
    "plan",
    "key",
    "balance",
    "paysupport",
    "promo",
    "invite",
    "language",
    "terms",
    "privacy",
    "help",
)
_ADMIN_COMMANDS = [
    ("stats", "Buyers, revenue, tokens"),
    ("refund", "<charge_id>: refund a payment"),
    ("grant", "<telegram_id> <tokens>: give tokens"),
    ("promo_new", "<code> <tokens> <uses> [days]: a promo code"),
    ("promos", "Promo codes and their uses"),
]


def build_application(settings: BotSettings) -> Application:  # type: ignore[type-arg]
    """The bot, ready to run; nothing touches the network or the database until it starts."""
    if settings.telegram_bot_token is None or not settings.token().strip():
        raise ValueError("TELEGRAM_BOT_TOKEN is not set")
    protect_token(settings.token())
    builder = (
        Application.builder()
        .token(settings.token())
        .defaults(
            Defaults(
                parse_mode=ParseMode.HTML, link_preview_options=LinkPreviewOptions(is_disabled=True)
            )
        )
        .concurrent_updates(CONCURRENT_UPDATES)
        .post_init(_post_init)
        .post_shutdown(_post_shutdown)
    )
    if settings.telegram_api_base_url:
        builder = builder.base_url(settings.telegram_api_base_url)
    application = builder.build()
    application.bot_data[SETTINGS] = settings
    _add_handlers(application, settings)
    application.add_error_handler(errors.on_error)
    return application


def _add_handlers(application: Application, settings: BotSettings) -> None:  # type: ignore[type-arg]
    private = filters.ChatType.PRIVATE
    operators = filters.User(user_id=settings.admin_telegram_ids) & private
    # Group -2: the sender's chosen language, read once per process, before any reply.
    application.add_handler(TypeHandler(Update, remember_language), group=-2)
    # Group -1: money first, never behind anything else.
    application.add_handler(PreCheckoutQueryHandler(payments.on_pre_checkout), group=-1)
    application.add_handlers(
        [
            MessageHandler(filters.SUCCESSFUL_PAYMENT, payments.on_successful_payment),
            MessageHandler(filters.StatusUpdate.REFUNDED_PAYMENT, payments.on_refunded_payment),
            ChatMemberHandler(members.on_my_chat_member, ChatMemberHandler.MY_CHAT_MEMBER),
            CommandHandler("start", start.start, filters=private),
            CommandHandler("buy", shop.show_packs, filters=private),
            CommandHandler("plan", plans.show_plan, filters=private),
            CommandHandler("key", key.show_key, filters=private),
            CommandHandler("balance", balance.show_balance, filters=private),
            CommandHandler("help", support.show_help, filters=private),
            CommandHandler("terms", support.show_terms),
            CommandHandler("privacy", support.show_privacy),
            CommandHandler("paysupport", support.pay_support, filters=private),
            CommandHandler("promo", growth.redeem_promo, filters=private),
            CommandHandler("invite", growth.invite, filters=private),
            CommandHandler("language", language.choose, filters=private),
            CommandHandler("stats", admin.stats, filters=operators),
            CommandHandler("refund", admin.refund, filters=operators),
            CommandHandler("grant", admin.grant, filters=operators),
            CommandHandler("promo_new", admin.new_promo, filters=operators),
            CommandHandler("promos", admin.list_promos, filters=operators),
            CallbackQueryHandler(shop.on_accept_terms, pattern=keyboards.TERMS_PATTERN),
            CallbackQueryHandler(shop.on_pack, pattern=keyboards.PACK_PATTERN),
            CallbackQueryHandler(plans.on_plan, pattern=keyboards.PLAN_PATTERN),
            CallbackQueryHandler(
                plans.on_subscription_action, pattern=keyboards.SUBSCRIPTION_PATTERN
            ),
            CallbackQueryHandler(key.on_key_action, pattern=keyboards.KEY_PATTERN),
            CallbackQueryHandler(admin.on_refund_action, pattern=keyboards.REFUND_PATTERN),
            CallbackQueryHandler(support.ask, pattern=keyboards.SUPPORT_PATTERN),
            CallbackQueryHandler(claims.on_claim, pattern=keyboards.CLAIM_PATTERN),
            CallbackQueryHandler(balance.on_usage_action, pattern=keyboards.USAGE_PATTERN),
            CallbackQueryHandler(language.on_language, pattern=keyboards.LANGUAGE_PATTERN),
            MessageHandler(filters.REPLY & filters.TEXT & ~filters.COMMAND & private, replies),
            MessageHandler(filters.Text(list(keyboards.menu_labels())) & private, start.on_menu),
            MessageHandler(filters.COMMAND & private, support.unknown_command),
            MessageHandler(filters.TEXT & private, support.on_text),
        ]
    )


async def replies(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """A text sent as a reply to one of the bot's messages: a key's new name or limits, or
    support."""
    message = update.effective_message
    assert message is not None and message.reply_to_message is not None
    if key.is_rename_prompt(message.reply_to_message.text):
        await key.on_rename_reply(update, context)
    elif key_limits.is_limits_prompt(message.reply_to_message.text):
        await key.on_limits_reply(update, context)
    else:
        await support.on_reply(update, context)


async def _post_init(application: Application) -> None:  # type: ignore[type-arg]
    """Open the database and schedule the jobs; announce the commands to Telegram."""
    settings: BotSettings = application.bot_data[SETTINGS]
    application.bot_data[RUNTIME] = Runtime(
        settings=settings,
        engine=make_engine(settings.database_url),
        secret_key=settings.resolved_secret_key(),
        catalog=settings.catalog(),
        plans=settings.plan_catalog(),
    )
    if application.job_queue is not None:
        application.job_queue.run_repeating(
            notices_job,
            interval=settings.notice_interval_seconds,
            first=FIRST_NOTICES_AFTER_S,
            name="balance-notices",
        )
        application.job_queue.run_repeating(
            reconcile_job,
            interval=settings.reconcile_interval_seconds,
            first=FIRST_RECONCILE_AFTER_S,
            name="reconcile-stars",
        )
        application.job_queue.run_repeating(
            key_alerts_job,
            interval=settings.notice_interval_seconds,
            first=FIRST_NOTICES_AFTER_S,
            name="key-alerts",
        )
    await _set_commands(application, settings)
    await _set_menu_button(application, settings)


async def _set_commands(application: Application, settings: BotSettings) -> None:  # type: ignore[type-arg]
    try:
        for lang in LANGUAGES:
            await application.bot.set_my_commands(
                _commands(lang), language_code=None if lang == DEFAULT else lang
            )
        for admin_id in sorted(settings.admin_telegram_ids):
            await application.bot.set_my_commands(
                _commands(DEFAULT) + [BotCommand(*item) for item in _ADMIN_COMMANDS],
                scope=BotCommandScopeChat(admin_id),
            )
    except TelegramError:
        # An operator who never opened the bot has no chat yet; the bot works without menus.
        logger.warning("could not set the bot's command menu", exc_info=True)


async def _set_menu_button(application: Application, settings: BotSettings) -> None:  # type: ignore[type-arg]
    """The chat's menu button opens the Mini App when PUBLIC_APP_URL is set (else Telegram's
    default, the commands, also after the setting is removed)."""
    button = (
        MenuButtonWebApp(plain(DEFAULT, "menu_button_app"), WebAppInfo(settings.public_app_url))
        if settings.public_app_url
        else MenuButtonDefault()
    )
    try:
        await application.bot.set_chat_menu_button(menu_button=button)
    except TelegramError:
        logger.warning("could not set the bot's menu button", exc_info=True)


def _commands(lang: Lang) -> list[BotCommand]:
    return [BotCommand(name, plain(lang, f"command_{name}")) for name in COMMANDS]


async def _post_shutdown(application: Application) -> None:  # type: ignore[type-arg]
    if RUNTIME in application.bot_data:
        runtime_of(application.bot_data).engine.dispose()
