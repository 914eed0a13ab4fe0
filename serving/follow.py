"""A running sidecar follows the deployments table: it polls the newest deployment's id (one cheap query), and when it
changes, builds the revisers the new state names (loading their LoRA adapters into vLLM first), swaps them in, and
unloads the adapters nothing serves any more. A change that cannot be applied (vLLM down, a model that does not load)
leaves the previous plan serving and is tried again at the next poll."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tracemill.reviser_prompt import PromptSettings
from tracemill.revisers import EndpointReviser, ReviserSpecError, make_reviser, rules_reviser
from tracemill.serving.adapters import AdapterError, Adapters
from tracemill.serving.deployments import RULES, Served, Version, newest_id, served
from tracemill.serving.plan import Plan, Serving
from tracemill.store.sqlite_writer import database_path

log = logging.getLogger("tracemill.serving")


class Follower:
    def __init__(self, db_url: str | None, static: Serving, adapters: Adapters | None = None,
                 poll_seconds: float = 1.0, on_change: Callable[[Plan], None] | None = None) -> None:
        self.db_url = db_url
        self.static = static
        self.adapters = adapters
        self.poll_seconds = poll_seconds
        self.on_change = on_change
        self.plan = Plan(static)
        self.applied: int | None = None
        self.last_error: str | None = None
        self._engine: Engine | None = None
        self._built: dict[tuple[str, int | None], Serving] = {}

    def _store(self) -> Engine | None:
        if self.db_url is None:
            return None
        path = database_path(self.db_url)
        if path is not None and not path.exists():
            return None  # no store yet: SQLite would create an empty one
        if self._engine is None:
            from tracemill.store.engine import make_engine

            self._engine = make_engine(self.db_url)
        return self._engine

    def _read(self, known: int | None) -> tuple[int | None, Served | None]:
        engine = self._store()
        if engine is None:
            return None, None
        with Session(engine) as conn:
            newest = newest_id(conn)
            return newest, (served(conn) if newest != known and newest is not None else None)

    async def check(self) -> None:
        try:
            newest, state = await asyncio.to_thread(self._read, self.applied)
        except SQLAlchemyError as exc:  # a store not migrated yet, or not answering: keep serving what is served
            self._failed(f"cannot read the deployments at {self.db_url}: {str(exc).splitlines()[0]}")
            return
        if newest == self.applied:
            return
        try:
            plan = await self._plan(state) if state is not None else Plan(self.static)
        except (AdapterError, ReviserSpecError, OSError) as exc:
            self._failed(f"deployment {newest} not applied, still serving {self.plan.active.version}: {exc}")
            return
        old, self.plan, self.applied, self.last_error = self.plan, plan, newest, None
        log.info("serving %s%s (deployment %s)", plan.active.version,
                 f", canary {plan.canary.version} at {plan.canary_percent:g} %" if plan.canary else "", newest)
        if self.on_change is not None:
            self.on_change(plan)
        await self._unload(old.adapters() - plan.adapters())

    def _failed(self, message: str) -> None:
        if message != self.last_error:
            log.error(message)
        self.last_error = message

    async def _unload(self, names: set[str]) -> None:
        for name in sorted(names):
            try:
                await self.adapters.unload(name)  # type: ignore[union-attr]
            except AdapterError as exc:
                log.warning("could not unload %s: %s", name, exc)

    async def _plan(self, state: Served) -> Plan:
        active = await self._serving(state.active, "active", state.deployment_id)
        canary = (await self._serving(state.canary, "canary", state.deployment_id)
                  if state.canary is not None else None)
        keep = {(v.name, v.model_id) for v in (state.active, state.canary) if v is not None}
        self._built = {k: v for k, v in self._built.items() if k in keep}
        return Plan(active, canary, state.canary_percent or 0.0)

    async def _serving(self, version: Version, role: str, deployment_id: int | None) -> Serving:
        """The version's reviser, built once for as long as it serves (a promoted canary keeps its own)."""
        key = (version.name, version.model_id)
        if key not in self._built:
            self._built[key] = await self._build(version, role, deployment_id)
        return replace(self._built[key], role=role, deployment_id=deployment_id)

    async def _build(self, version: Version, role: str, deployment_id: int | None) -> Serving:
        if version.model_id is None:
            return Serving(RULES, rules_reviser, role, deployment_id)
        prompt = PromptSettings.from_dict(version.config.get("prompt_settings"))
        if self.adapters is not None:
            name = await self.adapters.load(version)
            reviser = EndpointReviser(self.adapters.base_url, model=name, prompt=prompt)
            return Serving(version.name, reviser, role, deployment_id, adapter=name, in_process=False)
        reviser = await asyncio.to_thread(make_reviser, f"model:{version.path}")
        return Serving(version.name, reviser, role, deployment_id, in_process=False)

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.poll_seconds)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
