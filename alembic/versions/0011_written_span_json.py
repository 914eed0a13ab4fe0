"""The spans and log events kept as they were sent on PostgreSQL: `json` instead of `jsonb` for `spans.attributes`,
`resource`, `events` and `links`, and `log_events.attributes` and `body`. An attribute or a log body can be a map (an
OTLP `kvlist`): an instrumentation may send the conversation so. JSONB sorted its keys, and the arguments of a call in
the conversation reached the reviser's prompt in another order than on SQLite and than the sidecar sees at serving
time. Rows stored before keep the order JSONB gave them. SQLite stores JSON as text already: nothing changes there.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 17:15:00
"""

from tracemill.store.migrate import retype_on_postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = {"spans": ("attributes", "resource", "events", "links"), "log_events": ("attributes", "body")}


def upgrade() -> None:
    retype_on_postgresql(COLUMNS, "json")


def downgrade() -> None:
    retype_on_postgresql(COLUMNS, "jsonb")
