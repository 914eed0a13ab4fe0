"""ix_tool_calls_counts: the calls by day, model, harness version, domain and tool, so that SQLite reads the filter
values and the failure modes' totals from an index instead of sorting every call (`bench/README.md`, UI)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 19:00:00
"""

import sqlalchemy as sa

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tool_calls_counts", "tool_calls", [sa.text("(start_time_ns / 86400000000000)"), "model",
                                                           "harness_version", "domain", "name", "start_time_ns"])


def downgrade() -> None:
    op.drop_index("ix_tool_calls_counts", table_name="tool_calls")
