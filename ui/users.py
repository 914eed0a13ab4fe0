"""People who may sign in: their roles, argon2 password hashes (the password itself is never stored or logged), and
sign-in with a limit on failures per name, counted in the store so that new sessions and restarts do not reset it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from tracemill.store.tables import SignInFailureRow, UserRow, utcnow
from tracemill.ui.access import Identity, Role

_HASHER = PasswordHasher()
# Checked against when the name is unknown, so that an unknown name costs as long as a wrong password.
_DUMMY_HASH = _HASHER.hash("not a password anyone has")
MIN_PASSWORD_CHARS = 8
_NAME_KEY_CHARS = 128


class UserError(ValueError):
    """A user that cannot be added or changed as asked; the message says why."""


class SignInRefused(Exception):
    """Sign-in refused: wrong name or password (not said which), a disabled user, or too many failures."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: Role
    email: str | None
    has_password: bool
    created_at: datetime
    disabled_at: datetime | None


@dataclass(frozen=True, slots=True)
class SignInLimit:
    attempts: int  # failures for one name within `window` before further tries are refused
    window: timedelta


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise UserError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    return _HASHER.hash(password)


def add_user(engine: Engine, name: str, role: Role, password: str | None = None, email: str | None = None) -> User:
    """A new user. Without a password they can only sign in through single sign-on, as `email`."""
    name = name.strip()
    if not name:
        raise UserError("a user needs a name")
    if password is None and email is None:
        raise UserError(f"{name}: give a password, or an email to sign in with single sign-on")
    row = {"name": name, "role": role.value, "password_hash": hash_password(password) if password else None,
           "email": email.strip().lower() if email else None, "created_at": utcnow()}
    try:
        with engine.begin() as conn:
            conn.execute(insert(UserRow), [row])
    except IntegrityError:
        raise UserError(f"a user named {name!r} or with email {email!r} already exists") from None
    found = user(engine, name)
    assert found is not None
    return found


def _change(engine: Engine, name: str, **values: object) -> None:
    with engine.begin() as conn:
        if conn.execute(update(UserRow).where(UserRow.name == name).values(**values)).rowcount == 0:
            raise UserError(f"no user named {name!r}")


def set_role(engine: Engine, name: str, role: Role) -> None:
    _change(engine, name, role=role.value)


def set_password(engine: Engine, name: str, password: str) -> None:
    _change(engine, name, password_hash=hash_password(password))


def disable(engine: Engine, name: str) -> None:
    _change(engine, name, disabled_at=utcnow())


_COLUMNS = (UserRow.name, UserRow.role, UserRow.email, UserRow.password_hash, UserRow.created_at, UserRow.disabled_at)


def _user(row: Any) -> User:
    return User(row.name, Role(row.role), row.email, row.password_hash is not None, row.created_at, row.disabled_at)


def user(engine: Engine, name: str) -> User | None:
    with engine.connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(UserRow.name == name)).first()
    return _user(row) if row is not None else None


def users(engine: Engine) -> list[User]:
    with engine.connect() as conn:
        return [_user(row) for row in conn.execute(select(*_COLUMNS).order_by(UserRow.name))]


def _key(name: str) -> str:
    return name.strip().lower()[:_NAME_KEY_CHARS]


def sign_in(engine: Engine, name: str, password: str, limit: SignInLimit) -> Identity:
    """The identity of `name` when `password` is theirs. Raises SignInRefused otherwise, and once `limit.attempts`
    failures for the name fall within `limit.window`, refuses every try until the oldest of them is that old."""
    key, now = _key(name), utcnow()
    with engine.begin() as conn:
        conn.execute(delete(SignInFailureRow).where(SignInFailureRow.at < now - limit.window))
        recent = conn.execute(select(func.count(), func.min(SignInFailureRow.at))
                              .where(SignInFailureRow.name == key)).one()
    if recent[0] >= limit.attempts:
        oldest = recent[1] if recent[1].tzinfo else recent[1].replace(tzinfo=now.tzinfo)
        wait = max(1, int((oldest + limit.window - now).total_seconds() // 60) + 1)
        raise SignInRefused(f"too many failed sign-ins for this name: try again in {wait} min")
    with engine.connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(UserRow.name == name.strip())).first()
    if _matches(row.password_hash if row is not None else None, password) and row is not None:
        if row.disabled_at is not None:
            raise SignInRefused("this user is disabled")
        with engine.begin() as conn:
            conn.execute(delete(SignInFailureRow).where(SignInFailureRow.name == key))
        return Identity(row.name, Role(row.role))
    with engine.begin() as conn:
        conn.execute(insert(SignInFailureRow), [{"name": key, "at": now}])
    raise SignInRefused("wrong name or password")


def _matches(stored: str | None, password: str) -> bool:
    try:
        return _HASHER.verify(stored or _DUMMY_HASH, password) and stored is not None
    except (VerificationError, InvalidHashError):
        return False


def sso_identity(engine: Engine, email: str | None) -> Identity | None:
    """The identity single sign-on vouched for: the enabled user with this email, else None."""
    if not email:
        return None
    with engine.connect() as conn:
        row = conn.execute(select(*_COLUMNS).where(UserRow.email == email.strip().lower())).first()
    if row is None or row.disabled_at is not None:
        return None
    return Identity(row.name, Role(row.role), via="sso")
