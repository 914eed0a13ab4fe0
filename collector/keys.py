"""Collector API keys: created once and shown once, stored as SHA-256, checked against `Authorization: Bearer`."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from tracemill.store.tables import ApiKeyRow, utcnow

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
    process: `tracemill keys create`)."""

    def __init__(self, engine: Engine, ttl: float = 2.0) -> None:
        self.engine = engine
        self.ttl = ttl
        self._hashes: frozenset[str] = frozenset()
        self._loaded_at = float("-inf")
        self._lock = threading.Lock()

    def _valid_hashes(self) -> frozenset[str]:
        with self._lock:
            if time.monotonic() - self._loaded_at > self.ttl:
                with self.engine.connect() as conn:
                    rows = conn.execute(select(ApiKeyRow.key_hash).where(ApiKeyRow.revoked_at.is_(None)))
                    self._hashes = frozenset(r[0] for r in rows)
                self._loaded_at = time.monotonic()
            return self._hashes

    def check(self, authorization: str | None) -> str | None:
        """None when the request may proceed, else why not."""
        hashes = self._valid_hashes()
        if not hashes:
            return None
        if not authorization:
            return "this collector requires an API key: send 'Authorization: Bearer <key>'"
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return "the Authorization header must be 'Bearer <key>'"
        if _digest(key.strip()) not in hashes:
            return "the API key is not valid (unknown or revoked)"
        return None
