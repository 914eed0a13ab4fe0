"""the retrain-and-deploy cycle: one row per `tracemill cycle` iteration (what it mined, decided, trained, measured
and deployed), and named locks held by a process until they expire (one cycle at a time)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 15:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)
CALL_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "cycles",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("started_at", WHEN, nullable=False),
        sa.Column("finished_at", WHEN, nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("step", sa.String(length=16), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("since_call_id", CALL_ID, nullable=True),
        sa.Column("last_call_id", CALL_ID, nullable=True),
        sa.Column("new_calls", sa.Integer(), nullable=False),
        sa.Column("new_failures", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), sa.ForeignKey("datasets.id"), nullable=True),
        sa.Column("decision", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("harness_rates", JSON, nullable=False),
        sa.Column("top_modes", JSON, nullable=False),
        sa.Column("model_id", sa.Integer(), sa.ForeignKey("models.id"), nullable=True),
        sa.Column("baseline", sa.Text(), nullable=True),
        sa.Column("figures", JSON, nullable=False),
        sa.Column("gate", JSON, nullable=False),
        sa.Column("deployed", sa.Boolean(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), sa.ForeignKey("deployments.id"), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_table(
        "locks",
        sa.Column("name", sa.String(length=64), primary_key=True),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("acquired_at", WHEN, nullable=False),
        sa.Column("expires_at", WHEN, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("locks")
    op.drop_table("cycles")
