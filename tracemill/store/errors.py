"""Store errors as a log or an answer may show them: the kind of error, the driver's error code and the table and
operation of the statement, never the statement's values (span contents) nor the driver's message about a statement,
which can quote them."""

from __future__ import annotations

import re

from sqlalchemy.exc import DBAPIError, StatementError

_OPERATION = re.compile(r"\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM|SELECT\b.*?\bFROM)\s+\"?(\w+)",
                        re.IGNORECASE | re.DOTALL)
_OPERATIONS = {"INSERT": "INSERT INTO", "UPDATE": "UPDATE", "DELETE": "DELETE FROM", "SELECT": "SELECT … FROM"}


class StoreUnavailable(RuntimeError):
    """The store cannot be reached now. The message, for a client, is the kind of error only."""


def describe(exc: BaseException) -> str:
    """e.g. "DataError (22P05) in INSERT INTO tool_calls", or "OperationalError while connecting: <the driver's
    message>" (a connection error quotes no data)."""
    kind = type(exc).__name__
    if not isinstance(exc, StatementError):
        return kind
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "sqlite_errorname", None)
    kind += f" ({code})" if code else ""
    if exc.statement is None:
        if isinstance(exc, DBAPIError):
            detail = str(exc.orig).strip().splitlines()
            return f"{kind} while connecting: {detail[0]}" if detail else f"{kind} while connecting"
        return kind
    found = _OPERATION.match(exc.statement)
    if found is None:
        words = exc.statement.split(None, 1)
        return f"{kind} in {words[0].upper()}" if words else kind
    return f"{kind} in {_OPERATIONS[found.group(1).split()[0].upper()]} {found.group(2)}"
