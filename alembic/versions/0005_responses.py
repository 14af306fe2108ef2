"""responses: stored Responses API answers, per account

`stored_response` keeps a response and the conversation that led to it, so
`previous_response_id` continues it on any replica; old rows are deleted after retention.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TEXT = sqlmodel.sql.sqltypes.AutoString
TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "stored_response",
        sa.Column("id", TEXT(length=64), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("created_at", TIME(), nullable=False),
        sa.Column("conversation", TEXT(), nullable=False),
        sa.Column("response", TEXT(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["account.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("stored_response") as batch_op:
        batch_op.create_index(batch_op.f("ix_stored_response_account_id"), ["account_id"])
        batch_op.create_index(batch_op.f("ix_stored_response_created_at"), ["created_at"])


def downgrade() -> None:
    with op.batch_alter_table("stored_response") as batch_op:
        batch_op.drop_index(batch_op.f("ix_stored_response_created_at"))
        batch_op.drop_index(batch_op.f("ix_stored_response_account_id"))
    op.drop_table("stored_response")
