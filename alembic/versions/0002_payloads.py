"""large attribute values stored once

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 16:05:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "payloads",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("digest"),
    )


def downgrade() -> None:
    op.drop_table("payloads")
