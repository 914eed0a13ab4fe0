"""Collector API keys: created once and shown once, stored as SHA-256, checked against `Authorization: Bearer`."""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tracemill.store.errors import StoreUnavailable, describe
from tracemill.store.tables import ApiKeyRow, utcnow

log = logging.getLogger("tracemill.collector")

KEY_PREFIX = "tm_"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(engine: Engine, name: str) -> tuple[ApiKeyRow, str]:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with Session(engine, expire_on_commit=False) as session, session.begin():
        row = ApiKeyRow(name=name, prefix=key[:10], key_hash=_digest(key), created_at=utcnow())
        session.add(row)
    return row, key


def list_keys(engine: Engine) -> list[ApiKeyRow]:
    with Session(engine) as session:
        return list(session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id)))


def revoke_key(engine: Engine, key_id: int) -> bool:
    with engine.begin() as conn:
        result = conn.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
                              .values(revoked_at=utcnow()))
    return result.rowcount > 0


class KeyChecker:
    """Which keys are valid now, re-read from the store at most every `ttl` seconds (keys are made by another
    process: `tracemill keys create`). `check` raises StoreUnavailable when they cannot be read."""

    def __init__(self, engine: Engine, ttl: float = 2.0) -> None:
        self.engine = engine
        self.ttl = ttl
        self._hashes: frozenset[str] = frozenset()
        self._enforced = False  # once any key was made, even one since revoked, requests need a valid key
        self._loaded_at = float("-inf")
        self._failing = False
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._loaded_at <= self.ttl:
                return
            try:
                with self.engine.connect() as conn:
                    rows = conn.execute(select(ApiKeyRow.key_hash, ApiKeyRow.revoked_at)).all()
            except SQLAlchemyError as exc:
                if not self._failing:
                    log.error("the store is unavailable: %s", describe(exc))
                    self._failing = True
                raise StoreUnavailable(type(exc).__name__) from None
            if self._failing:
                log.warning("the store answers again")
                self._failing = False
            self._hashes = frozenset(h for h, revoked in rows if revoked is None)
            self._enforced = bool(rows)
            self._loaded_at = time.monotonic()

    def check(self, authorization: str | None) -> str | None:
        """None when the request may proceed, else why not."""
        self._refresh()
        if not self._enforced:
            return None
        if not authorization:
            return "this collector requires an API key: send 'Authorization: Bearer <key>'"
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return "the Authorization header must be 'Bearer <key>'"
        if _digest(key.strip()) not in self._hashes:
            return "the API key is not valid (unknown or revoked)"
        return None
