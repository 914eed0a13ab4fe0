"""Tool schemas and calls kept as they were written on PostgreSQL: `json` instead of `jsonb` (which sorts an object's
keys) for `toolsets.tools`, `tool_calls.arguments` and `violations`, and `reviews.before` and `after`, so that reviser
prompts, exports and the UI show a tool's parameters in the order the model was shown them, and an export of the same
traffic is the same on SQLite and PostgreSQL. Rows stored before keep the order JSONB gave them. SQLite stores JSON as
text already: nothing changes there.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 15:10:00
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = {"toolsets": ("tools",), "tool_calls": ("arguments", "violations"), "reviews": ("before", "after")}


def _retype(to: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in COLUMNS.items():  # one statement a table: each rewrites it
        changes = ", ".join(f'ALTER COLUMN "{c}" TYPE {to} USING "{c}"::{to}' for c in columns)
        op.execute(f"ALTER TABLE {table} {changes}")


def upgrade() -> None:
    _retype("json")


def downgrade() -> None:
    _retype("jsonb")
