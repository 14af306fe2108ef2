"""plans: monthly Telegram Stars subscriptions that credit tokens every period

`subscription` is one buyer's plan, started by its order's first charge and renewed by Telegram
every `period_seconds`; `purchase.subscription_id` marks each of its charges, and
`order.subscription_period` marks an order whose invoice link is a subscription's.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKENS = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TEXT = sqlmodel.sql.sqltypes.AutoString
TIME = sqlmodel.sql.sqltypes.UTCDateTime
PURCHASE_SUBSCRIPTION_FK = "fk_purchase_subscription_id_subscription"


def upgrade() -> None:
    op.create_table(
        "subscription",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("order_id", TEXT(length=64), nullable=False),
        sa.Column("plan_id", TEXT(length=64), nullable=False),
        sa.Column("plan_title", TEXT(length=255), nullable=False),
        sa.Column("tokens", TOKENS, nullable=False),
        sa.Column("price", sa.Integer(), nullable=False),
        sa.Column("period_seconds", sa.Integer(), nullable=False),
        sa.Column("first_charge_id", TEXT(length=255), nullable=True),
        sa.Column("expires_at", TIME(), nullable=False),
        sa.Column("canceled_at", TIME(), nullable=True),
        sa.Column("reminded_for", TIME(), nullable=True),
        sa.Column("created_at", TIME(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["account.id"]),
        sa.ForeignKeyConstraint(["order_id"], ["order.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("order_id"),
        sa.UniqueConstraint("first_charge_id"),
    )
    with op.batch_alter_table("subscription") as batch_op:
        batch_op.create_index(batch_op.f("ix_subscription_account_id"), ["account_id"])
        batch_op.create_index(batch_op.f("ix_subscription_expires_at"), ["expires_at"])
    with op.batch_alter_table("order") as batch_op:
        batch_op.add_column(sa.Column("subscription_period", sa.Integer(), nullable=True))
    with op.batch_alter_table("purchase") as batch_op:
        batch_op.add_column(sa.Column("subscription_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_purchase_subscription_id"), ["subscription_id"])
        batch_op.create_foreign_key(
            PURCHASE_SUBSCRIPTION_FK, "subscription", ["subscription_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("purchase") as batch_op:
        batch_op.drop_constraint(PURCHASE_SUBSCRIPTION_FK, type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_purchase_subscription_id"))
        batch_op.drop_column("subscription_id")
    with op.batch_alter_table("order") as batch_op:
        batch_op.drop_column("subscription_period")
    with op.batch_alter_table("subscription") as batch_op:
        batch_op.drop_index(batch_op.f("ix_subscription_expires_at"))
        batch_op.drop_index(batch_op.f("ix_subscription_account_id"))
    op.drop_table("subscription")
