"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 15:28:30.619134
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('api_keys',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_hash')
    )
    op.create_table('spans',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('span_id', sa.String(length=16), nullable=False),
    sa.Column('parent_span_id', sa.String(length=16), nullable=True),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('kind', sa.Integer(), nullable=False),
    sa.Column('start_time_ns', sa.BigInteger(), nullable=False),
    sa.Column('end_time_ns', sa.BigInteger(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=False),
    sa.Column('status_message', sa.Text(), nullable=False),
    sa.Column('service_name', sa.Text(), nullable=True),
    sa.Column('scope_name', sa.Text(), nullable=False),
    sa.Column('attributes', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('resource', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('events', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('links', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trace_id', 'span_id', name='uq_spans_trace_span')
    )
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.create_index('ix_spans_start', ['start_time_ns'], unique=False)

    op.create_table('tool_executions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('span_id', sa.String(length=16), nullable=False),
    sa.Column('tool_call_id', sa.Text(), nullable=True),
    sa.Column('tool_name', sa.Text(), nullable=True),
    sa.Column('arguments', sa.Text(), nullable=True),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('result', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trace_id', 'span_id', name='uq_tool_executions_trace_span')
    )
    with op.batch_alter_table('tool_executions', schema=None) as batch_op:
        batch_op.create_index('ix_tool_executions_trace_call', ['trace_id', 'tool_call_id'], unique=False)

    op.create_table('toolsets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('tools', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('tool_count', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('hash')
    )
    op.create_table('tool_calls',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('trace_id', sa.String(length=32), nullable=False),
    sa.Column('span_id', sa.String(length=16), nullable=False),
    sa.Column('call_index', sa.Integer(), nullable=False),
    sa.Column('tool_call_id', sa.Text(), nullable=True),
    sa.Column('raw', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('arguments', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=True),
    sa.Column('toolset_id', sa.Integer(), nullable=True),
    sa.Column('parsed', sa.Boolean(), nullable=False),
    sa.Column('name_valid', sa.Boolean(), nullable=True),
    sa.Column('schema_valid', sa.Boolean(), nullable=True),
    sa.Column('stage', sa.String(length=16), nullable=True),
    sa.Column('violations', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('execution_status', sa.String(length=16), nullable=True),
    sa.Column('execution_error', sa.Text(), nullable=True),
    sa.Column('execution_result', sa.Text(), nullable=True),
    sa.Column('execution_span_id', sa.String(length=16), nullable=True),
    sa.Column('model', sa.Text(), nullable=True),
    sa.Column('harness_version', sa.Text(), nullable=True),
    sa.Column('domain', sa.String(length=32), nullable=True),
    sa.Column('repairs_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('start_time_ns', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['repairs_id'], ['tool_calls.id'], ),
    sa.ForeignKeyConstraint(['toolset_id'], ['toolsets.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trace_id', 'span_id', 'call_index', name='uq_tool_calls_span_index')
    )
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.create_index('ix_tool_calls_model', ['model'], unique=False)
        batch_op.create_index('ix_tool_calls_name', ['name'], unique=False)
        batch_op.create_index('ix_tool_calls_trace_call', ['trace_id', 'tool_call_id'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.drop_index('ix_tool_calls_trace_call')
        batch_op.drop_index('ix_tool_calls_name')
        batch_op.drop_index('ix_tool_calls_model')

    op.drop_table('tool_calls')
    op.drop_table('toolsets')
    with op.batch_alter_table('tool_executions', schema=None) as batch_op:
        batch_op.drop_index('ix_tool_executions_trace_call')

    op.drop_table('tool_executions')
    with op.batch_alter_table('spans', schema=None) as batch_op:
        batch_op.drop_index('ix_spans_start')

    op.drop_table('spans')
    op.drop_table('api_keys')

