"""Messages to the operators (`ADMIN_TELEGRAM_IDS`): money that could not be matched to tokens.

Best effort: an operator who blocked the bot must not break the handler that found the problem,
and every alert is also logged.
"""

from __future__ import annotations

import logging

from telegram import Bot
from telegram.error import TelegramError

from bot.settings import BotSettings
from bot.texts import Html

logger = logging.getLogger(__name__)


async def tell_operators(bot: Bot, settings: BotSettings, text: Html) -> None:
    logger.warning("operator alert: %s", text)
    for admin_id in sorted(settings.admin_telegram_ids):
        try:
            await bot.send_message(admin_id, text)
        except TelegramError:
            logger.warning("could not alert operator %s", admin_id, exc_info=True)
