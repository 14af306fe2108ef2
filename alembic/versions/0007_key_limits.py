"""key limits: per-key spend limits with resets, expiry, model lists, RPM and TPM

`key_limit` holds a key's limits and its spend against them; `api_key.limit_id` points at it
(a rotated key's successor points at the same row, so it keeps the spend), and `hold.key_limit_id`
says which row a hold reserved from. Every live key gets a row of its own, numbered as the key,
with nothing spent: spend counts from here on.

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TEXT = sqlmodel.sql.sqltypes.AutoString
TIME = sqlmodel.sql.sqltypes.UTCDateTime
TOKENS = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "key_limit",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("spend_limit", TOKENS, nullable=True),
        sa.Column("period", TEXT(length=16), nullable=False),
        sa.Column("period_start", TIME(), nullable=True),
        sa.Column("spent", TOKENS, nullable=False),
        sa.Column("held", TOKENS, nullable=False),
        sa.Column("spent_total", TOKENS, nullable=False),
        sa.Column("expires_at", TIME(), nullable=True),
        sa.Column("models", TEXT(length=1024), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", TOKENS, nullable=True),
        sa.Column("window_start", TIME(), nullable=True),
        sa.Column("window_requests", sa.Integer(), nullable=False),
        sa.Column("window_tokens", TOKENS, nullable=False),
        sa.Column("alert_level", sa.Integer(), nullable=False),
        sa.Column("alert_period", TIME(), nullable=True),
        sa.Column("expiry_alerted_for", TIME(), nullable=True),
        sa.Column("updated_at", TIME(), nullable=False),
        sa.CheckConstraint(
            "held >= 0 AND spent >= 0 AND spent_total >= 0", name="ck_key_limit_sums"
        ),
        sa.CheckConstraint(
            "period IN ('daily', 'weekly', 'monthly', 'total')", name="ck_key_limit_period"
        ),
        sa.CheckConstraint(
            "(spend_limit IS NULL OR spend_limit >= 0) AND (rpm IS NULL OR rpm > 0) "
            "AND (tpm IS NULL OR tpm > 0)",
            name="ck_key_limit_values",
        ),
        sa.ForeignKeyConstraint(["account_id"], ["account.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("key_limit") as batch_op:
        batch_op.create_index(batch_op.f("ix_key_limit_account_id"), ["account_id"])
    with op.batch_alter_table("api_key") as batch_op:
        batch_op.add_column(sa.Column("limit_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_api_key_limit_id"), ["limit_id"])
        batch_op.create_foreign_key("fk_api_key_limit_id", "key_limit", ["limit_id"], ["id"])
    with op.batch_alter_table("hold") as batch_op:
        batch_op.add_column(sa.Column("key_limit_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_hold_key_limit_id"), ["key_limit_id"])

    op.execute(
        "INSERT INTO key_limit (id, account_id, period, spent, held, spent_total, "
        "window_requests, window_tokens, alert_level, updated_at) "
        "SELECT id, account_id, 'total', 0, 0, 0, 0, 0, 0, CURRENT_TIMESTAMP "
        "FROM api_key WHERE revoked_at IS NULL"
    )
    op.execute("UPDATE api_key SET limit_id = id WHERE revoked_at IS NULL")
    if op.get_bind().dialect.name == "postgresql":  # the rows above took ids by hand
        op.execute(
            "SELECT setval(pg_get_serial_sequence('key_limit', 'id'), "
            "COALESCE(MAX(id), 0) + 1, false) FROM key_limit"
        )


def downgrade() -> None:
    with op.batch_alter_table("hold") as batch_op:
        batch_op.drop_index(batch_op.f("ix_hold_key_limit_id"))
        batch_op.drop_column("key_limit_id")
    with op.batch_alter_table("api_key") as batch_op:
        batch_op.drop_constraint("fk_api_key_limit_id", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_api_key_limit_id"))
        batch_op.drop_column("limit_id")
    with op.batch_alter_table("key_limit") as batch_op:
        batch_op.drop_index(batch_op.f("ix_key_limit_account_id"))
    op.drop_table("key_limit")
