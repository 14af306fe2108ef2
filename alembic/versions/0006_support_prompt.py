"""support prompt: a buyer's next plain message after /paysupport goes to the operators

`account.support_prompt_at` is set when the bot asks a buyer to write to support and cleared by
the one process that forwards the buyer's next message, so it holds with several bot processes.

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    with op.batch_alter_table("account") as batch_op:
        batch_op.add_column(sa.Column("support_prompt_at", TIME(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("account") as batch_op:
        batch_op.drop_column("support_prompt_at")
