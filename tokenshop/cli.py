"""The `tokenshop` command: billing's, the API's and the bot's commands under one name.

Each package owns its commands in its own cli.py (billing/cli.py, api/cli.py, bot/cli.py); this
is the only module that imports all three, so billing still imports neither api nor bot.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from api.cli import app as api_app
from billing.cli import app as billing_app
from billing.cli import run
from bot.cli import app as bot_app

# The order `tokenshop --help` lists the commands in: what runs a service first, then the books.
LISTING = (
    "serve",
    "bot",
    "export-model",
    "migrate",
    "grant",
    "balance",
    "audit",
    "sweep",
    "packs",
    "keys",
)


class ListedGroup(TyperGroup):
    """Lists its commands in LISTING's order; one missing there comes last, never left out."""

    def list_commands(self, ctx: Any) -> list[str]:
        rank = {name: place for place, name in enumerate(LISTING)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    cls=ListedGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Tokenshop: a paid OpenAI-compatible API.",
)
for part in (api_app, bot_app, billing_app):
    app.add_typer(part)


def main(args: list[str] | None = None) -> None:
    """Run `tokenshop ARGS` with one-line errors instead of tracebacks and usage boxes."""
    run(app, args)
