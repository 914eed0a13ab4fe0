"""the learning half of the loop: datasets, reviews, findings, models, deployments

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("filters", JSON, nullable=False),
        sa.Column("last_call_id", sa.BigInteger(), nullable=True),
        sa.Column("train_rows", sa.Integer(), nullable=False),
        sa.Column("eval_rows", sa.Integer(), nullable=False),
        sa.Column("card", JSON, nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "reviews",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("call_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), sa.ForeignKey("tool_calls.id"),
                  nullable=False),
        sa.Column("reviewer", sa.Text(), nullable=False),
        sa.Column("decision", sa.String(length=16), nullable=False),
        sa.Column("before", JSON, nullable=True),
        sa.Column("after", JSON, nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.UniqueConstraint("call_id", name="uq_reviews_call"),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(length=64), nullable=False, unique=True),
        sa.Column("hypothesis", sa.Text(), nullable=False),
        sa.Column("evidence", JSON, nullable=False),
        sa.Column("suggestion", sa.Text(), nullable=True),
        sa.Column("examples", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("seen", sa.Integer(), nullable=False),
        sa.Column("first_seen", WHEN, nullable=False),
        sa.Column("last_seen", WHEN, nullable=False),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False, unique=True),
        sa.Column("base_model", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), sa.ForeignKey("datasets.id"), nullable=True),
        sa.Column("dataset_hash", sa.String(length=64), nullable=True),
        sa.Column("config", JSON, nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("evaluation", JSON, nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model_id", sa.Integer(), sa.ForeignKey("models.id"), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("canary_percent", sa.Float(), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("justification", JSON, nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
    )


def downgrade() -> None:
    for table in ("deployments", "models", "findings", "reviews", "datasets"):
        op.drop_table(table)
