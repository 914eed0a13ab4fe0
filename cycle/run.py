"""One cycle: mine -> decide -> train -> evaluate -> deploy, each step recorded in `cycles` before it starts and its
figures when it ends, under the store's `cycle` lock.

Killed at any step (SIGKILL, power), a cycle leaves the active deployment as it was: the deployment and the cycle's
record of it are one transaction, which commits whole or not at all, and it commits only while this process still
holds the lock. The next cycle marks the dead one `interrupted`, removes what it left of its training (unless its
model was registered) and of a half-written export, and starts clean from the calls the last cycle that trained had
read.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from tracemill.cycle import record
from tracemill.cycle.decide import TRAIN, WAIT, decide
from tracemill.cycle.gate import BASELINE, CANDIDATE, GateResult, judge
from tracemill.cycle.lock import LockBusy, StoreLock
from tracemill.cycle.record import CycleRecord, Status, Step
from tracemill.cycle.settings import CycleSettings
from tracemill.store.queries import CallFilter, committed_ids
from tracemill.store.tables import ModelRow, ToolCallRow, utcnow

LOCK = "cycle"
DATASET, RUN = "dataset", "run"  # in WORK/cycle-NNNN/


class CycleBusy(LockBusy):
    """Another cycle is running (it holds the store's `cycle` lock)."""


class CycleError(RuntimeError):
    """A cycle that failed (the train extra missing, the lock lost, any error of a step, which is its `__cause__`):
    recorded as failed; the message says which cycle, at which step and why."""


def _folder(settings: CycleSettings, cycle_id: int) -> Path:
    return settings.work.resolve() / f"cycle-{cycle_id:04d}"


def _clean_up(engine: Engine, settings: CycleSettings, cycle_ids: list[int]) -> None:
    """Remove what unfinished cycles left of their training (checkpoints, a model never registered); their datasets
    stay, as the `datasets` table records them."""
    with engine.connect() as conn:
        paths = [Path(p) for p in conn.execute(select(ModelRow.path)).scalars()]
    for cycle_id in cycle_ids:
        folder = _folder(settings, cycle_id)
        run = folder / RUN
        if run.is_dir() and not any(p.is_relative_to(run) for p in paths):
            shutil.rmtree(run, ignore_errors=True)
        for partial in folder.glob(f".{DATASET}.partial-*"):  # an export killed half-way
            shutil.rmtree(partial, ignore_errors=True)


def _new_calls(engine: Engine, where: CallFilter) -> tuple[int, int]:
    """(calls, failed calls) `where` selects."""
    failed = CallFilter(failed=True, up_to_execution_id=where.up_to_execution_id).conditions()
    with engine.connect() as conn:
        counted = select(func.count(), func.count().filter(*failed)).select_from(ToolCallRow)
        row = conn.execute(where.apply(counted)).one()
    return int(row[0]), int(row[1])


class _Cycle:
    def __init__(self, engine: Engine, settings: CycleSettings, lock: StoreLock, say: Callable[[str], None]) -> None:
        self.engine, self.settings, self.lock, self.say = engine, settings, lock, say
        self.id = record.start(engine, lock.holder, settings.force)
        self.folder = _folder(settings, self.id)
        self.step = Step.MINE

    def enter(self, step: Step, message: str, **values: Any) -> None:
        if self.lock.lost.is_set():
            raise CycleError("the cycle lock was lost (this process stalled past its time to live and another "
                             "cycle took over): stopping before the next step")
        self.step = step
        record.write(self.engine, self.id, step=step, **values)
        self.say(f"{step}: {message}")

    def finish(self, **values: Any) -> CycleRecord:
        record.write(self.engine, self.id, **record.finished(Status.DONE, step=Step.DONE, **values))
        return self.get()

    def get(self) -> CycleRecord:
        with self.engine.connect() as conn:
            return record.get(conn, self.id)

    def run(self) -> CycleRecord:
        from tracemill.miner.export import MineOptions, bounded, mine, since_read

        s = self.settings
        with self.engine.connect() as conn:
            previous = record.last_trained_read(conn)
        since = previous.call_id if previous is not None else None
        read = bounded(CallFilter(), committed_ids(self.engine))
        # the calls after the last trained cycle's, and its older calls whose execution failed since (read as valid)
        where = since_read(self.engine, read, previous) if previous is not None else read
        calls, failures = _new_calls(self.engine, where)
        m = s.mining
        window = f"; exported: every call of the last {m.window_days:g} day(s)" if m.window_days is not None else ""
        self.enter(Step.MINE, f"calls after id {since or 0}" + (f" up to {read.up_to_id}{window}" if calls
                                                                 else ": none new"), since_call_id=since)
        if not calls:
            return self.finish(decision=WAIT, reason="no new calls since the last cycle that trained")
        if m.window_days is not None:
            where = replace(read, since=utcnow() - timedelta(days=m.window_days))
        exported = mine(self.engine, self.folder / DATASET, MineOptions(
            where=where, eval_share=m.eval_share, valid_share=m.valid_share, seed=m.seed, prompt=m.prompt,
            workers=m.workers))
        last = exported.card["last_call_id"]
        splits = exported.card["splits"]
        self.enter(Step.DECIDE, f"{calls} new calls, {failures} failed; mined {splits['train']['rows']} train and "
                   f"{splits['eval']['rows']} held-out rows", last_call_id=last, new_calls=calls,
                   new_failures=failures, dataset_id=exported.dataset_id)
        decision = decide(self.engine, failures, s.decision, s.force, held_out_rows=splits["eval"]["rows"],
                          held_out_needed=s.gate.min_held_out_cases)
        record.write(self.engine, self.id, decision=decision.decision, reason=decision.reason,
                     harness_rates=[r.to_dict() for r in decision.rates], top_modes=decision.top_modes)
        self.say(f"decide: {decision.decision}: {decision.reason}")
        for mode in decision.top_modes:
            self.say(f"  fix first: {mode['label']} ({mode['count']} calls)")
        if decision.decision != TRAIN:
            return self.finish()
        return self.train_and_gate(exported.path)

    def train_and_gate(self, dataset: Path) -> CycleRecord:
        if importlib.util.find_spec("trl") is None:
            raise CycleError("training needs the train extra (torch, transformers, TRL, PEFT): "
                             "pip install 'tracemill[train]'")
        from tracemill.trainer.finish import register
        from tracemill.trainer.run import make_plan, train

        s = self.settings
        config = s.train.model_copy(update={
            "model": s.train.model.model_copy(update={"base": s.base_model}),
            "data": s.train.data.model_copy(update={"dataset": dataset}),
            "output": s.train.output.model_copy(update={"dir": self.folder / RUN, "database_url": s.store,
                                                         "register_model": True, "name": self._model_name()}),
        })
        plan = make_plan(config)
        self.enter(Step.TRAIN, f"{plan.rows.train_rows} rows, from {s.base_model}, on {plan.device}")
        outcome = train(plan, echo=self.say)
        if outcome.interrupted or outcome.model_dir is None:
            raise KeyboardInterrupt
        baseline = self._baseline()
        self.enter(Step.EVALUATE, f"the candidate against {baseline[0]} on the same held-out cases",
                   baseline=baseline[0])
        figures, evaluation = self._evaluate(plan, baseline)
        model = register(plan, outcome.model_dir, outcome.metrics, evaluation, s.store)
        verdict = judge(figures, s.gate)
        record.write(self.engine, self.id, model_id=model.id, figures=figures, gate=verdict.to_dict())
        self.say(f"evaluate: {model.name}: gate {verdict.reason}")
        if not verdict.passed:
            return self.finish()
        return self._deploy(model, verdict, baseline[0])

    def _model_name(self) -> str | None:
        """`[output] name` with the cycle's id appended, as each cycle registers a model of its own (None: the
        registry's `reviser-NNNN`); refused before training when a model already has it."""
        configured = self.settings.train.output.name
        if configured is None:
            return None
        name = f"{configured}-cycle-{self.id:04d}"
        with self.engine.connect() as conn:
            if conn.execute(select(ModelRow.id).where(ModelRow.name == name)).first() is not None:
                raise CycleError(f"a model named {name} is already registered: change [output] name")
        return name

    def _baseline(self) -> tuple[str, Any]:
        """The active version's name and reviser (the rules alone when no model is active)."""
        from tracemill.revisers import make_reviser, rules_reviser
        from tracemill.serving.deployments import served

        with Session(self.engine) as session:
            active = served(session).active
        if active.model_id is None:
            return active.name, rules_reviser
        return active.name, make_reviser("model:" + active.path)

    def _evaluate(self, plan: Any, baseline: tuple[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(per suite: the candidate's and the baseline's metrics; the same as the registry keeps them)."""
        from tracemill.evaluation import evaluate
        from tracemill.revisers import rules_reviser
        from tracemill.trainer.finish import eval_suites, figures, write_report
        from tracemill.trainer.model_reviser import ModelReviser
        from tracemill.trainer.run import EVAL, MODEL

        name, reviser = baseline
        revisers = {name: reviser, "model": ModelReviser(str(plan.out / MODEL))}
        if name != "rules":
            revisers["rules"] = rules_reviser
        pairs, evaluation = {}, {}
        for suite, cases in eval_suites(plan).items():
            report = evaluate(cases, revisers, suite)
            write_report(plan.out / EVAL / suite, report)
            evaluation[suite] = figures(report)
            pairs[suite] = {"cases": report.cases, CANDIDATE: evaluation[suite]["model"],
                            BASELINE: evaluation[suite][name]}
            self.say(f"evaluate: {suite}: {report.cases} cases\n{report.markdown()}")
        return pairs, evaluation

    def _deploy(self, model: ModelRow, verdict: GateResult, replaces: str) -> CycleRecord:
        from tracemill.serving.deployments import deploy_in

        self.enter(Step.DEPLOY, f"{model.name} replaces {replaces}")
        with Session(self.engine) as session, session.begin():
            conn = session.connection()
            if not self.lock.renew(conn):
                raise CycleError("the cycle lock was lost before deploying: nothing deployed")
            rows = deploy_in(session, model.name, self.settings.actor, note=f"cycle {self.id}: gate {verdict.reason}")
            deployment = rows[-1].id
            record.write(conn, self.id, **record.finished(Status.DONE, step=Step.DONE, deployed=True,
                                                          deployment_id=deployment))
            self.say(f"deploy: committing {model.name} as active")
        self.say(f"deploy: {model.name} is active (deployment {deployment})")
        return self.get()


def run_cycle(settings: CycleSettings, progress: Callable[[str], None] | None = None) -> CycleRecord:
    """One iteration; returns its record. Raises CycleBusy when another cycle runs, CycleError when it fails (recorded
    as failed), KeyboardInterrupt on Ctrl-C (recorded as interrupted); either removes what it left of its training."""
    from tracemill.store.cli import open_store

    say = progress or (lambda _: None)
    engine = open_store(settings.store)
    lock = StoreLock(engine, LOCK, settings.lock_ttl_s)
    try:
        try:
            lock.acquire()
        except LockBusy as exc:
            raise CycleBusy(str(exc)) from None
        try:
            dead = record.abandon_running(engine)
            for cycle in dead:
                say(f"cycle {cycle.id} was killed at step {cycle.step}: marked interrupted, starting clean")
            _clean_up(engine, settings, [c.id for c in dead])
            cycle = _Cycle(engine, settings, lock, say)
            say(f"cycle {cycle.id} ({lock.holder})")
            try:
                return cycle.run()
            except KeyboardInterrupt:
                record.write(engine, cycle.id, **record.finished(Status.INTERRUPTED,
                                                                 error=f"stopped by Ctrl-C at step {cycle.step}"))
                _clean_up(engine, settings, [cycle.id])
                raise
            except Exception as exc:
                said = exc if isinstance(exc, CycleError) else f"{type(exc).__name__}: {exc}"
                error = f"at step {cycle.step}: {said}"
                record.write(engine, cycle.id, **record.finished(Status.FAILED, error=error))
                _clean_up(engine, settings, [cycle.id])
                raise CycleError(f"cycle {cycle.id} failed {error}") from exc
        finally:
            lock.release()
    finally:
        engine.dispose()
