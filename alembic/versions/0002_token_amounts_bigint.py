"""token amounts as 64-bit integers on PostgreSQL

PostgreSQL's INTEGER stops at 2,147,483,647: a balance past it made crediting a purchase fail.
SQLite's INTEGER is 64-bit already, so there the columns stay as they are (the models say so).

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, column, nullable)
COLUMNS = [
    ("account", "balance", False),
    ("account", "held", False),
    ("order", "tokens", False),
    ("purchase", "tokens", False),
    ("purchase", "refunded_tokens", False),
    ("purchase", "refund_shortfall", False),
    ("ledger_entry", "amount", False),
    ("ledger_entry", "prompt_tokens", True),
    ("ledger_entry", "completion_tokens", True),
    ("hold", "amount", False),
    ("hold", "used", False),
]


def _retype(old: sa.types.TypeEngine, new: sa.types.TypeEngine) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, type_=new, existing_type=old, existing_nullable=nullable)


def upgrade() -> None:
    _retype(sa.Integer(), sa.BigInteger())


def downgrade() -> None:
    _retype(sa.BigInteger(), sa.Integer())  # fails if an amount no longer fits: nothing is cut
