"""The store: tables, engines and migrations."""

from tracemill.store.engine import is_sqlite, make_engine
from tracemill.store.tables import (
    ApiKeyRow,
    Base,
    SpanRow,
    ToolCallRow,
    ToolExecutionRow,
    ToolsetRow,
)

__all__ = [
    "ApiKeyRow", "Base", "SpanRow", "ToolCallRow", "ToolExecutionRow", "ToolsetRow", "is_sqlite", "make_engine",
]
