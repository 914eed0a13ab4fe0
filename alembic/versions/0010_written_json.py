"""Tool schemas and calls kept as they were written on PostgreSQL: `json` instead of `jsonb` (which sorts an object's
keys) for `toolsets.tools`, `tool_calls.arguments` and `violations`, and `reviews.before` and `after`, so that reviser
prompts, exports and the UI show a tool's parameters in the order the model was shown them, and an export of the same
traffic is the same on SQLite and PostgreSQL. Rows stored before keep the order JSONB gave them. SQLite stores JSON as
text already: nothing changes there.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 15:10:00
"""

from tracemill.store.migrate import retype_on_postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = {"toolsets": ("tools",), "tool_calls": ("arguments", "violations"), "reviews": ("before", "after")}


def upgrade() -> None:
    retype_on_postgresql(COLUMNS, "json")


def downgrade() -> None:
    retype_on_postgresql(COLUMNS, "jsonb")
