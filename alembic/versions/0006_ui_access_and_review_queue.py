"""the UI: who may sign in (users, failed sign-ins), and the human review queue (queued calls, reservations, how far
the queue's rules have read the store)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 13:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)
CALL_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False, unique=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=True),
        sa.Column("email", sa.Text(), nullable=True, unique=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("disabled_at", WHEN, nullable=True),
    )
    op.create_table(
        "sign_in_failures",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("at", WHEN, nullable=False),
    )
    op.create_index("ix_sign_in_failures_name_at", "sign_in_failures", ["name", "at"])
    op.create_table(
        "review_queue",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("call_id", CALL_ID, sa.ForeignKey("tool_calls.id"), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("queued_at", WHEN, nullable=False),
        sa.UniqueConstraint("call_id", name="uq_review_queue_call"),
    )
    op.create_table(
        "review_claims",
        sa.Column("call_id", CALL_ID, sa.ForeignKey("tool_calls.id"), primary_key=True),
        sa.Column("reviewer", sa.Text(), nullable=False),
        sa.Column("expires_at", WHEN, nullable=False),
    )
    op.create_table(
        "review_scans",
        sa.Column("rules", sa.String(length=64), primary_key=True),
        sa.Column("last_call_id", CALL_ID, nullable=False),
        sa.Column("scanned_at", WHEN, nullable=False),
    )


def downgrade() -> None:
    for table in ("review_scans", "review_claims", "review_queue", "sign_in_failures", "users"):
        op.drop_table(table)
