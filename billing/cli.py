"""Billing's `tokenshop` commands (keys, grant, balance, audit, sweep, packs, migrate, promo,
strays) and the runner every package's commands share.

Bad arguments print one line, `tokenshop: error: ...`, and exit 2; `audit` exits 1 when the
books do not balance. The API's and the bot's commands live in api/cli.py and bot/cli.py;
tokenshop/cli.py puts all of them under one name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Annotated

import typer
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session
from typer.exceptions import TyperException

from billing import accounts, key_limits, keys, ledger, promos, stray_charges
from billing.db import make_engine, session_scope
from billing.errors import BillingError
from billing.models import Account, ApiKey, utcnow
from billing.settings import BillingSettings

app = typer.Typer(rich_markup_mode=None, help="The books: accounts, keys and balances.")
keys_app = typer.Typer(
    no_args_is_help=True, help="Issue, show, list, limit, rotate and revoke API keys."
)
app.add_typer(keys_app, name="keys")
promo_app = typer.Typer(no_args_is_help=True, help="Promo codes buyers redeem with /promo.")
app.add_typer(promo_app, name="promo")

AccountOpt = Annotated[int | None, typer.Option("--account", help="Account id.")]
TelegramOpt = Annotated[int | None, typer.Option("--telegram-id", help="Telegram user id.")]


class CliError(Exception):
    """A one-line message for the operator; exits 2. Any package's command may raise it."""


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
            session=session,
            account_id=account.id,
            secret_key=settings.resolved_secret_key(),
            defaults=settings.key_defaults(),
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


@keys_app.command("list")
def keys_list(account: AccountOpt = None, telegram_id: TelegramOpt = None) -> None:
    """Each live key of the account: its id, name, limits and spend this period."""
    now = utcnow()
    with _books() as (session, _):
        row = _account(session, account, telegram_id)
        assert row.id is not None
        found = key_limits.reports(session=session, account_id=row.id, now=now)
    if not found:
        raise CliError(f"account {row.id} has no live key")
    for key, report in found:
        typer.echo(f"key {key.id}\t{key.name} (…{key.hint})\t{describe(report)}")


@keys_app.command("limit")
def keys_limit(
    key_id: Annotated[int, typer.Option("--key-id", help="The key's id (keys list, GET /v1/key).")],
    spend: Annotated[
        int | None, typer.Option(min=0, help="Tokens the key may spend per period.")
    ] = None,
    period: Annotated[
        str | None, typer.Option(help="daily, weekly, monthly (UTC) or total.")
    ] = None,
    expires: Annotated[
        str | None, typer.Option(help="ISO date or time (UTC unless zoned), or 30d from now.")
    ] = None,
    models: Annotated[str | None, typer.Option(help="Models it may use, a,b (empty: all).")] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option(min=1, help="Tokens per minute.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove every limit first.")] = False,
) -> None:
    """Set a key's limits; the options left out stay as they are. Every API process enforces
    them within KEY_CACHE_SECONDS."""
    changes: dict[str, object] = {}
    if spend is not None:
        changes["spend"] = spend
    if period is not None:
        changes["period"] = period.lower()
    if expires is not None:
        changes["expires_at"] = key_limits.parse_time(expires)
    if models is not None:
        changes["models"] = key_limits.split_models(models)
    if rpm is not None:
        changes["rpm"] = rpm
    if tpm is not None:
        changes["tpm"] = tpm
    if not changes and not clear:
        raise CliError("give at least one limit to set, or --clear")
    with _books() as (session, _):
        key = session.get(ApiKey, key_id)
        if key is None:
            raise CliError(f"no key {key_id}")
        report = key_limits.set_limits(
            session=session,
            account_id=key.account_id,
            key_id=key_id,
            clear=clear,
            changes=changes,
            now=utcnow(),
        )
    typer.echo(f"key {key_id}: {describe(report)}")


def describe(report: key_limits.KeyReport) -> str:
    """A key's limits and spend in one line, as the operator reads them."""
    limits = report.limits
    parts = []
    if limits.spend is not None:
        resets = f", resets {report.resets_at:%Y-%m-%d %H:%M} UTC" if report.resets_at else ""
        parts.append(f"spend {report.spent}/{limits.spend} {limits.period}{resets}")
    else:
        parts.append(f"spent {report.spent_total}, no spend limit")
    if limits.expires_at is not None:
        parts.append(f"expires {limits.expires_at:%Y-%m-%d %H:%M} UTC")
    if limits.models:
        parts.append(f"models {','.join(limits.models)}")
    if limits.rpm is not None:
        parts.append(f"rpm {limits.rpm}")
    if limits.tpm is not None:
        parts.append(f"tpm {limits.tpm}")
    return "; ".join(parts)


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
    """List the catalog of token packs, then the monthly plans (PLANS)."""
    settings = BillingSettings()
    for pack in settings.catalog():
        typer.echo(f"{pack.id}\t{pack.tokens} tokens\t{pack.price} {pack.currency}\t{pack.title}")
    for plan in settings.plan_catalog():
        days = plan.period_seconds // 86_400
        typer.echo(
            f"{plan.id}\t{plan.tokens} tokens every {days} days\t{plan.price} {plan.currency}"
            f"\t{plan.title} (plan)"
        )


@promo_app.command("create")
def promo_create(
    code: Annotated[str, typer.Argument(help="3-32 letters, digits, _ or -; case-insensitive.")],
    tokens: Annotated[int, typer.Option(min=1, help="Tokens each redemption gives.")],
    uses: Annotated[int, typer.Option(min=1, help="Redemptions in all (one per buyer).")],
    days: Annotated[int | None, typer.Option(min=1, help="Valid this many days.")] = None,
) -> None:
    """Create a promo code."""
    expires = utcnow() + timedelta(days=days) if days else None
    with _books() as (session, _):
        promo = promos.create_promo(
            session=session, code=code, tokens=tokens, max_uses=uses, expires_at=expires
        )
        until = f"{promo.expires_at:%Y-%m-%d %H:%M} UTC" if promo.expires_at else "no expiry"
    typer.echo(f"promo {promo.code}: {promo.tokens} tokens, {promo.max_uses} uses, {until}")


@promo_app.command("list")
def promo_list() -> None:
    """The newest promo codes and their uses."""
    with _books() as (session, _):
        for promo in promos.list_promos(session=session):
            until = f"{promo.expires_at:%Y-%m-%d %H:%M}" if promo.expires_at else "-"
            typer.echo(
                f"{promo.code}\t{promo.tokens} tokens\t{promo.uses}/{promo.max_uses}\t{until}"
            )


@app.command()
def strays() -> None:
    """Paid charges that could not be credited and are not refunded yet (the bot's /refund
    retries one); exits 1 when there are any."""
    with _books() as (session, _):
        owed = stray_charges.unrefunded(session=session)
    for charge in owed:
        typer.echo(
            f"{charge.telegram_payment_charge_id}\tuser {charge.telegram_id}\t{charge.amount} Stars"
            f"\t{charge.reason}\t{charge.refund_error or 'not tried'}"
        )
    if owed:
        typer.echo(f"strays: {len(owed)} charge(s) owed back", err=True)
        raise typer.Exit(1)
    typer.echo("strays: none owed")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"tokenshop: error: {message}", err=True)
    sys.exit(code)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def run(cli: typer.Typer, args: list[str] | None = None) -> None:
    """Run a command line with one-line errors instead of tracebacks and usage boxes."""
    command = typer.main.get_command(cli)
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
