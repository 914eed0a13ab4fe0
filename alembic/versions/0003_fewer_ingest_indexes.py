"""fewer indexes on what the collector inserts: each one is paid for by every insert, and these four cost half of a
collector's writing time (`bench/README.md`, Ingest)

- `ix_tool_calls_trace_call`, `ix_tool_executions_trace_call`: the unique (trace_id, span_id, …) indexes already find
  a trace's calls and executions.
- `ix_tool_calls_model`, `ix_tool_calls_name`: `tracemill stats` groups whole tables, which a scan does as well.

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
    op.drop_index("ix_tool_calls_model", table_name="tool_calls")
    op.drop_index("ix_tool_calls_name", table_name="tool_calls")


def downgrade() -> None:
    op.create_index("ix_tool_calls_name", "tool_calls", ["name"])
    op.create_index("ix_tool_calls_model", "tool_calls", ["model"])
    op.create_index("ix_tool_executions_trace_call", "tool_executions", ["trace_id", "tool_call_id"])
    op.create_index("ix_tool_calls_trace_call", "tool_calls", ["trace_id", "tool_call_id"])
