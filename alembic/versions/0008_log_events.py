"""log_events: GenAI events sent as OTLP log records, joined to their spans by trace and span id

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 15:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON_TYPE = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "log_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("event_name", sa.Text(), nullable=False),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("attributes", JSON_TYPE, nullable=False),
        sa.Column("body", JSON_TYPE, nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("trace_id", "span_id", "digest", name="uq_log_events_trace_span_digest"),
    )


def downgrade() -> None:
    op.drop_table("log_events")
