"""`tool_calls.service_name`: the service (`service.name` of the resource) whose span holds the call, kept with the
call as its model, harness version and domain are. Behind the reviser sidecar the store holds two records of each
answer, the model's as sent (`tracemill-serve`) and what the agent got (the agent's service); `--service` and
`stats --by service` read them apart, and looking each call's span up for it took three to four times as long as
reading the calls. Rows stored before are given their span's service.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 05:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tool_calls", sa.Column("service_name", sa.Text(), nullable=True))
    op.execute("UPDATE tool_calls SET service_name = (SELECT spans.service_name FROM spans "
               "WHERE spans.trace_id = tool_calls.trace_id AND spans.span_id = tool_calls.span_id)")


def downgrade() -> None:
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("service_name")
