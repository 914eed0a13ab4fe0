"""no index on spans.start_time_ns

Spans arrive with start times spread over the runs they belong to (seconds to minutes), so each request's inserts land
on hundreds of different pages of this index: a fifth of what a SQLite commit writes (`bench/README.md`, Ingest).
Nothing reads spans by start time; `spans.id` gives the order of arrival.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 20:30:00
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_spans_start", table_name="spans")


def downgrade() -> None:
    op.create_index("ix_spans_start", "spans", ["start_time_ns"])
