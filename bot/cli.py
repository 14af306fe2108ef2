"""The bot's `tokenshop` command: `bot` runs it (the same as `python -m bot`).

The bot is imported only when the command runs, so the other commands start without it.
"""

from __future__ import annotations

import typer

app = typer.Typer(rich_markup_mode=None, help="The Telegram shop bot.")


@app.command()
def bot() -> None:
    """Run the Telegram bot."""
    from bot.__main__ import main as run_bot

    run_bot()
