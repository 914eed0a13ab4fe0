"""Alembic environment: runs Tracemill's migrations on the connection `tracemill.store.migrate` hands it."""

from alembic import context

from tracemill.store.tables import Base

config = context.config
connection = config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
