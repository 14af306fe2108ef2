"""shop: stray charges, support messages, several named keys, promo codes, referrals

`stray_charge` records a paid charge that could not be credited, and its refund. `support_message`
and `support_copy` carry a buyer's message to the operators and a reply back. `api_key.name` and
the end of the one-live-key index let an account hold several named keys; `hold.key_id` says
which key a request used, so its usage entry (request_id = the hold's id) is that key's usage.
`promo_code`, `promo_redemption` and `referral` are the growth tools; `account` gains the chosen
language, its referral code and when the user blocked the bot.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKENS = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TEXT = sqlmodel.sql.sqltypes.AutoString
TIME = sqlmodel.sql.sqltypes.UTCDateTime
ONE_LIVE_KEY = "uq_api_key_one_active_per_account"
LIVE = sa.text("revoked_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "stray_charge",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("telegram_payment_charge_id", TEXT(length=255), nullable=False),
        sa.Column("telegram_id", sa.BigInteger(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=True),
        sa.Column("amount", sa.Integer(), nullable=False),
        sa.Column("currency", TEXT(length=8), nullable=False),
        sa.Column("payload", TEXT(length=255), nullable=True),
        sa.Column("reason", TEXT(length=32), nullable=False),
        sa.Column("created_at", TIME(), nullable=False),
        sa.Column("refund_tried_at", TIME(), nullable=True),
        sa.Column("refunded_at", TIME(), nullable=True),
        sa.Column("refund_error", TEXT(length=255), nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["account.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("telegram_payment_charge_id"),
    )
    with op.batch_alter_table("stray_charge") as batch_op:
        batch_op.create_index(batch_op.f("ix_stray_charge_account_id"), ["account_id"])
        batch_op.create_index(batch_op.f("ix_stray_charge_telegram_id"), ["telegram_id"])

    op.create_table(
        "support_message",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("operator_id", sa.BigInteger(), nullable=True),
        sa.Column("text", TEXT(length=4096), nullable=False),
        sa.Column("created_at", TIME(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["account.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("support_message") as batch_op:
        batch_op.create_index(batch_op.f("ix_support_message_account_id"), ["account_id"])
    op.create_table(
        "support_copy",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("support_message_id", sa.Integer(), nullable=False),
        sa.Column("chat_id", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["support_message_id"], ["support_message.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("chat_id", "message_id", name="uq_support_copy_message"),
    )
    with op.batch_alter_table("support_copy") as batch_op:
        batch_op.create_index(
            batch_op.f("ix_support_copy_support_message_id"), ["support_message_id"]
        )

    op.create_table(
        "promo_code",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("code", TEXT(length=32), nullable=False),
        sa.Column("tokens", TOKENS, nullable=False),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("expires_at", TIME(), nullable=True),
        sa.Column("created_by", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TIME(), nullable=False),
        sa.CheckConstraint("tokens > 0 AND max_uses > 0", name="ck_promo_code_positive"),
        sa.CheckConstraint("uses >= 0 AND uses <= max_uses", name="ck_promo_code_uses_within_max"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("code"),
    )
    op.create_table(
        "promo_redemption",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("promo_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("created_at", TIME(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["account.id"]),
        sa.ForeignKeyConstraint(["promo_id"], ["promo_code.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("promo_id", "account_id", name="uq_promo_redemption_once_per_account"),
    )
    with op.batch_alter_table("promo_redemption") as batch_op:
        batch_op.create_index(batch_op.f("ix_promo_redemption_account_id"), ["account_id"])

    op.create_table(
        "referral",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("referrer_id", sa.Integer(), nullable=False),
        sa.Column("referred_id", sa.Integer(), nullable=False),
        sa.Column("share_percent", sa.Integer(), nullable=False),
        sa.Column("created_at", TIME(), nullable=False),
        sa.Column("rewarded_at", TIME(), nullable=True),
        sa.Column("reward_tokens", TOKENS, nullable=False),
        sa.Column("purchase_id", sa.Integer(), nullable=True),
        sa.CheckConstraint("share_percent >= 0 AND share_percent <= 100", name="ck_referral_share"),
        sa.ForeignKeyConstraint(["purchase_id"], ["purchase.id"]),
        sa.ForeignKeyConstraint(["referred_id"], ["account.id"]),
        sa.ForeignKeyConstraint(["referrer_id"], ["account.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("referred_id"),
    )
    with op.batch_alter_table("referral") as batch_op:
        batch_op.create_index(batch_op.f("ix_referral_referrer_id"), ["referrer_id"])

    with op.batch_alter_table("account") as batch_op:
        batch_op.add_column(sa.Column("chosen_language", TEXT(length=16), nullable=True))
        batch_op.add_column(sa.Column("referral_code", TEXT(length=32), nullable=True))
        batch_op.add_column(sa.Column("blocked_at", TIME(), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_account_referral_code"), ["referral_code"], unique=True
        )
    with op.batch_alter_table("api_key") as batch_op:
        batch_op.add_column(
            sa.Column("name", TEXT(length=64), nullable=False, server_default="default")
        )
        batch_op.drop_index(ONE_LIVE_KEY, sqlite_where=LIVE, postgresql_where=LIVE)
    with op.batch_alter_table("api_key") as batch_op:
        batch_op.alter_column("name", server_default=None)
    with op.batch_alter_table("hold") as batch_op:
        batch_op.add_column(sa.Column("key_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_hold_key_id"), ["key_id"])


def downgrade() -> None:
    """Fails while an account has two live keys: revoke the extra ones first."""
    with op.batch_alter_table("hold") as batch_op:
        batch_op.drop_index(batch_op.f("ix_hold_key_id"))
        batch_op.drop_column("key_id")
    with op.batch_alter_table("api_key") as batch_op:
        batch_op.create_index(
            ONE_LIVE_KEY, ["account_id"], unique=True, sqlite_where=LIVE, postgresql_where=LIVE
        )
        batch_op.drop_column("name")
    with op.batch_alter_table("account") as batch_op:
        batch_op.drop_index(batch_op.f("ix_account_referral_code"))
        batch_op.drop_column("blocked_at")
        batch_op.drop_column("referral_code")
        batch_op.drop_column("chosen_language")
    with op.batch_alter_table("referral") as batch_op:
        batch_op.drop_index(batch_op.f("ix_referral_referrer_id"))
    op.drop_table("referral")
    with op.batch_alter_table("promo_redemption") as batch_op:
        batch_op.drop_index(batch_op.f("ix_promo_redemption_account_id"))
    op.drop_table("promo_redemption")
    op.drop_table("promo_code")
    with op.batch_alter_table("support_copy") as batch_op:
        batch_op.drop_index(batch_op.f("ix_support_copy_support_message_id"))
    op.drop_table("support_copy")
    with op.batch_alter_table("support_message") as batch_op:
        batch_op.drop_index(batch_op.f("ix_support_message_account_id"))
    op.drop_table("support_message")
    with op.batch_alter_table("stray_charge") as batch_op:
        batch_op.drop_index(batch_op.f("ix_stray_charge_telegram_id"))
        batch_op.drop_index(batch_op.f("ix_stray_charge_account_id"))
    op.drop_table("stray_charge")
