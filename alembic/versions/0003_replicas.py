"""replicas: process leases, per-key request slots, job state shared by bot processes

`account.open_holds` counts each account's requests in flight, so the statement that places a
hold can refuse one past the key's limit on every replica at once; it starts as the number of
holds open now. `hold.owner` and `idempotent_request.owner` name the `api_process` lease of the
process that placed them; rows from before this revision have none (the TTL still resolves
them). `job_state` and `reported_problem` keep the bot's reconciliation across restarts.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKENS = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TEXT = sqlmodel.sql.sqltypes.AutoString
TIME = sqlmodel.sql.sqltypes.UTCDateTime


def upgrade() -> None:
    op.create_table(
        "api_process",
        sa.Column("id", TEXT(length=64), nullable=False),
        sa.Column("name", TEXT(length=255), nullable=False),
        sa.Column("started_at", TIME(), nullable=False),
        sa.Column("heartbeat_at", TIME(), nullable=False),
        sa.Column("expires_at", TIME(), nullable=False),
        sa.Column("stopped_at", TIME(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("api_process") as batch_op:
        batch_op.create_index(batch_op.f("ix_api_process_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_api_process_expires_at"), ["expires_at"])
    op.create_table(
        "job_state",
        sa.Column("name", TEXT(length=64), nullable=False),
        sa.Column("position", TOKENS, nullable=False),
        sa.Column("updated_at", TIME(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "reported_problem",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", TEXT(length=64), nullable=False),
        sa.Column("digest", TEXT(length=64), nullable=False),
        sa.Column("charge_id", TEXT(length=255), nullable=True),
        sa.Column("message", TEXT(), nullable=False),
        sa.Column("reported_at", TIME(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    with op.batch_alter_table("reported_problem") as batch_op:
        batch_op.create_index(batch_op.f("ix_reported_problem_charge_id"), ["charge_id"])

    with op.batch_alter_table("account") as batch_op:
        batch_op.add_column(
            sa.Column("open_holds", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.create_check_constraint("ck_account_open_holds_nonnegative", "open_holds >= 0")
    op.execute(
        "UPDATE account SET open_holds = "
        "(SELECT count(*) FROM hold WHERE hold.account_id = account.id AND hold.state = 'held')"
    )
    with op.batch_alter_table("account") as batch_op:
        batch_op.alter_column("open_holds", server_default=None)
    with op.batch_alter_table("hold") as batch_op:
        batch_op.add_column(sa.Column("owner", TEXT(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_hold_owner"), ["owner"], unique=False)
    with op.batch_alter_table("idempotent_request") as batch_op:
        batch_op.add_column(sa.Column("owner", TEXT(length=64), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_idempotent_request_created_at"), ["created_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("idempotent_request") as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotent_request_created_at"))
        batch_op.drop_column("owner")
    with op.batch_alter_table("hold") as batch_op:
        batch_op.drop_index(batch_op.f("ix_hold_owner"))
        batch_op.drop_column("owner")
    with op.batch_alter_table("account") as batch_op:
        batch_op.drop_constraint("ck_account_open_holds_nonnegative", type_="check")
        batch_op.drop_column("open_holds")
    with op.batch_alter_table("reported_problem") as batch_op:
        batch_op.drop_index(batch_op.f("ix_reported_problem_charge_id"))
    op.drop_table("reported_problem")
    op.drop_table("job_state")
    with op.batch_alter_table("api_process") as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_process_expires_at"))
        batch_op.drop_index(batch_op.f("ix_api_process_name"))
    op.drop_table("api_process")
