"""tool_calls found by their call id alone, and a call written as text by its response: the writer of a call seen
through a second instrumentation (another trace, maybe another ingest process) finds the row stored for it

- `ix_tool_calls_tool_call_id`: the calls with a given tool call id, whatever their trace.
- `response_id` (new, NULL in rows stored before): the response that holds a call written as text, indexed where set.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 19:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tool_calls", sa.Column("response_id", sa.Text(), nullable=True))
    op.create_index("ix_tool_calls_tool_call_id", "tool_calls", ["tool_call_id"])
    where = sa.text("response_id IS NOT NULL")  # only calls written as text have one
    op.create_index("ix_tool_calls_response_id", "tool_calls", ["response_id"], sqlite_where=where,
                    postgresql_where=where)


def downgrade() -> None:
    op.drop_index("ix_tool_calls_response_id", table_name="tool_calls")
    op.drop_index("ix_tool_calls_tool_call_id", table_name="tool_calls")
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("response_id")
