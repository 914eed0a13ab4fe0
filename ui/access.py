"""Who is signed in, and what their role lets them do."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Role(str, enum.Enum):
    VIEWER = "viewer"  # reads everything, with content in sensitive domains masked
    REVIEWER = "reviewer"  # also decides on queued calls, and sees sensitive content
    ADMIN = "admin"  # also deploys and rolls back

    @classmethod
    def parse(cls, value: str) -> Role:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"no role {value!r}; roles: {', '.join(r.value for r in cls)}") from None


class NotAllowed(PermissionError):
    """An action the signed-in person's role does not allow; the message says which role it needs."""


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    role: Role
    via: str = "password"  # password | sso

    @property
    def can_decide(self) -> bool:
        return self.role in (Role.REVIEWER, Role.ADMIN)

    @property
    def can_deploy(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def sees_sensitive(self) -> bool:
        return self.role in (Role.REVIEWER, Role.ADMIN)

    def require_decide(self) -> None:
        if not self.can_decide:
            raise NotAllowed(f"{self.name} is a {self.role.value}: only reviewers and admins decide on calls")

    def require_deploy(self) -> None:
        if not self.can_deploy:
            raise NotAllowed(f"{self.name} is a {self.role.value}: only admins deploy and roll back")
