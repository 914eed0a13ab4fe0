"""drop the (trace_id, tool_call_id) indexes: the unique (trace_id, span_id, …) indexes already find a trace's calls
and executions, and each extra index on a random key made every insert slower (a quarter of a collector write)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 18:50:00
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_tool_calls_trace_call", table_name="tool_calls")
    op.drop_index("ix_tool_executions_trace_call", table_name="tool_executions")


def downgrade() -> None:
    op.create_index("ix_tool_executions_trace_call", "tool_executions", ["trace_id", "tool_call_id"])
    op.create_index("ix_tool_calls_trace_call", "tool_calls", ["trace_id", "tool_call_id"])
