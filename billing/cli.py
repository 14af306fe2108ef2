"""The `tokenshop` command: the operator's console for the books, the API and the bot.

Bad arguments print one line, `tokenshop: error: ...`, and exit 2; `audit` exits 1 when the
books do not balance. The API and the bot are imported only by the commands that run them, so
the bookkeeping commands start fast and need neither.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session
from typer.exceptions import TyperException

from billing import accounts, keys, ledger
from billing.db import make_engine, session_scope
from billing.errors import BillingError
from billing.models import Account
from billing.settings import BillingSettings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Tokenshop: a paid OpenAI-compatible API.",
)
keys_app = typer.Typer(no_args_is_help=True, help="Issue, show, rotate and revoke API keys.")
app.add_typer(keys_app, name="keys")

AccountOpt = Annotated[int | None, typer.Option("--account", help="Account id.")]
TelegramOpt = Annotated[int | None, typer.Option("--telegram-id", help="Telegram user id.")]


class CliError(Exception):
    """A one-line message for the operator; exits 2."""


@contextmanager
def _books() -> Iterator[tuple[Session, BillingSettings]]:
    settings = BillingSettings()
    engine: Engine = make_engine(settings.database_url)
    try:
        with session_scope(engine) as session:
            yield session, settings
    finally:
        engine.dispose()


def _account(session: Session, account_id: int | None, telegram_id: int | None) -> Account:
    if (account_id is None) == (telegram_id is None):
        raise CliError("give exactly one of --account and --telegram-id")
    return accounts.get_account(session=session, account_id=account_id, telegram_id=telegram_id)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 1,
) -> None:
    """Serve the OpenAI-compatible API."""
    import uvicorn

    uvicorn.run(
        "api.main:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        proxy_headers=True,
        log_config=None,
    )


@app.command()
def bot() -> None:
    """Run the Telegram bot."""
    from bot.__main__ import main as run_bot

    run_bot()


@app.command("export-model")
def export_model(
    source: Annotated[str, typer.Argument(help="A local transformers dir or a hub id.")],
    out: Annotated[Path, typer.Argument(help="The export dir to create (then add it to MODELS).")],
    quantize: Annotated[
        str | None,
        typer.Option(help="Quantize the weights: int8 or int4 (4x or ~7x less to read per token)."),
    ] = None,
) -> None:
    """Export a model to ONNX for serving (needs the `export` extra)."""
    from api.engine.export.exporter import ExportFailed, ExportUnavailable
    from api.engine.export.exporter import export_model as export

    try:
        result = export(source, out, quantize, progress=lambda line: typer.echo(line, err=True))
    except (ExportUnavailable, ExportFailed, FileExistsError) as exc:
        raise CliError(str(exc)) from exc
    typer.echo(result.path)


@app.command()
def migrate() -> None:
    """Bring the database schema up to date (alembic upgrade head)."""
    from alembic import command
    from alembic.config import Config

    command.upgrade(Config("alembic.ini"), "head")


@keys_app.command("issue")
def keys_issue(
    tokens: Annotated[int, typer.Option(min=0, help="Tokens to grant the account.")],
    telegram_id: TelegramOpt = None,
    name: Annotated[str | None, typer.Option(help="A label for a new account.")] = None,
) -> None:
    """Make (or find) an account, grant it tokens and print its key on the last line."""
    with _books() as (session, settings):
        if telegram_id is None:
            account = accounts.create_account(session=session, name=name)
        else:
            account = accounts.get_or_create_account(
                session=session, telegram_id=telegram_id, name=name
            )
        assert account.id is not None
        if tokens:
            ledger.grant(session=session, account_id=account.id, tokens=tokens, note="cli issue")
        key, _ = keys.ensure_key(
            session=session, account_id=account.id, secret_key=settings.resolved_secret_key()
        )
        available = ledger.get_balance(session=session, account_id=account.id).available
    typer.echo(f"account {account.id}: {available} tokens available")
    typer.echo(key)


@keys_app.command("show")
def keys_show(account: AccountOpt = None, telegram_id: TelegramOpt = None) -> None:
    """Print the account's live key."""
    with _books() as (session, settings):
        row = _account(session, account, telegram_id)
        assert row.id is not None
        key = keys.show_key(
            session=session, account_id=row.id, secret_key=settings.resolved_secret_key()
        )
    if key is None:
        raise CliError(f"account {row.id} has no live key")
    typer.echo(key)


@keys_app.command("rotate")
def keys_rotate(account: AccountOpt = None, telegram_id: TelegramOpt = None) -> None:
    """Revoke the live key and print a new one."""
    with _books() as (session, settings):
        row = _account(session, account, telegram_id)
        assert row.id is not None
        key = keys.rotate_key(
            session=session, account_id=row.id, secret_key=settings.resolved_secret_key()
        )
    typer.echo(key)


@keys_app.command("revoke")
def keys_revoke(account: AccountOpt = None, telegram_id: TelegramOpt = None) -> None:
    """Revoke the live key; the account keeps its tokens."""
    with _books() as (session, _):
        row = _account(session, account, telegram_id)
        assert row.id is not None
        revoked = keys.revoke_key(session=session, account_id=row.id)
    if not revoked:
        raise CliError(f"account {row.id} has no live key")
    typer.echo(f"account {row.id}: key revoked")


@app.command()
def grant(
    tokens: Annotated[int, typer.Argument(help="Tokens to add.")],
    account: AccountOpt = None,
    telegram_id: TelegramOpt = None,
    note: Annotated[str | None, typer.Option(help="Why, for the ledger.")] = None,
) -> None:
    """Give an account tokens."""
    with _books() as (session, _):
        row = _account(session, account, telegram_id)
        assert row.id is not None
        ledger.grant(session=session, account_id=row.id, tokens=tokens, note=note)
        available = ledger.get_balance(session=session, account_id=row.id).available
    typer.echo(f"account {row.id}: {available} tokens available")


@app.command()
def balance(account: AccountOpt = None, telegram_id: TelegramOpt = None) -> None:
    """Show an account's balance."""
    with _books() as (session, _):
        row = _account(session, account, telegram_id)
        assert row.id is not None
        b = ledger.get_balance(session=session, account_id=row.id)
    typer.echo(
        f"account {row.id}: available {b.available}, held {b.held}, purchased {b.purchased}, "
        f"granted {b.granted}, used {b.used}, refunded {b.refunded}"
    )


@app.command()
def audit() -> None:
    """Check the books; exit 1 on any mismatch."""
    with _books() as (session, _):
        problems = ledger.audit(session=session)
    for problem in problems:
        typer.echo(problem)
    if problems:
        typer.echo(f"audit: {len(problems)} problem(s)", err=True)
        raise typer.Exit(1)
    typer.echo("audit: ok")


@app.command()
def sweep() -> None:
    """Resolve holds past their expiry (the API also does this periodically)."""
    with _books() as (session, _):
        count = ledger.release_stale_holds(session=session)
    typer.echo(f"resolved {count} stale hold(s)")


@app.command()
def packs() -> None:
    """List the catalog of token packs."""
    for pack in BillingSettings().catalog():
        typer.echo(f"{pack.id}\t{pack.tokens} tokens\t{pack.price} {pack.currency}\t{pack.title}")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"tokenshop: error: {message}", err=True)
    sys.exit(code)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def main(args: list[str] | None = None) -> None:
    """Run the CLI with one-line errors instead of tracebacks and usage boxes."""
    command = typer.main.get_command(app)
    try:
        code = command(args=args, standalone_mode=False)
    except TyperException as exc:  # usage errors: unknown command, bad or missing option
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            typer.echo(ctx.get_help())
            return
        _fail(_first_line(exc.format_message()))  # type: ignore[attr-defined]
    except typer.Abort:
        _fail("aborted", 1)
    except (CliError, BillingError) as exc:
        _fail(str(exc))
    except DBAPIError as exc:
        reason = _first_line(str(exc.orig))
        _fail(f"database error ({reason}); is it migrated? run 'tokenshop migrate'", 1)
    except ValueError as exc:  # settings that do not validate
        _fail(_first_line(str(exc)))
    if isinstance(code, int) and code:
        sys.exit(code)
