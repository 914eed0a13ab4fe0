"""The demo's steps, in order (`Demo.run`), and what each one found (`Demo.summary`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tracemill.demo.gate import Verdict, judge
from tracemill.demo.phases import Phase, measure, table
from tracemill.demo.processes import DemoError, Processes
from tracemill.net import ServerThread, free_port

if TYPE_CHECKING:
    from rich.console import Console

    from tracemill.demo.cli import Sizes

SIDECAR_EXPORT_S = 6.0  # the sidecar's span batches leave every 5 s: what it traced is stored within this


class Demo:
    def __init__(self, folder: Path, sizes: Sizes, processes: Processes, console: Console) -> None:
        self.folder, self.sizes, self.processes, self.console = folder, sizes, processes, console
        self.db = f"sqlite:///{folder / 'store.db'}"
        self.phases: list[Phase] = []
        self.timings: dict[str, float] = {}
        self.dataset: dict[str, Any] = {}
        self.verdict: Verdict | None = None
        self.deployed: str | None = None
        self.tiny_size: str | None = None
        self._model_server: ServerThread | None = None
        self._sdk = False
        self._closed = False

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.console.rule(f"[bold]{title}")
        started = time.monotonic()
        yield
        self.timings[title] = round(time.monotonic() - started, 1)

    def run(self) -> None:
        from tracemill.demo.weak_model import WeakModel

        s = self.sizes
        self.console.print(f"Tracemill demo in {self.folder}: a simulated {s.profile} agent (harness "
                           f"{s.harness_version}) on MCP-Bench's tool schemas, {s.episodes} episodes a phase. Ctrl-C "
                           "stops it cleanly.")
        with self.step("1. the collector, a weak model server and the reviser sidecar in front of it"):
            self.processes.start("tiny-model", "tiny-model", "--out", str(self.folder / "tiny"))
            collector = f"http://127.0.0.1:{free_port()}"
            self.processes.start("collector", "collector", "--port", collector.rsplit(":", 1)[1], "--db", self.db,
                                 "--workers", "1", "--log-level", "warning")
            self.processes.wait_healthy("collector", collector)
            weak = WeakModel(s.profile, s.harness_version, s.seed)
            self._model_server = ServerThread(weak.app()).start()
            sidecar = f"http://127.0.0.1:{free_port()}"
            self.processes.start("serve", "serve", "--upstream", self._model_server.url + "/v1", "--port",
                                 sidecar.rsplit(":", 1)[1], "--db", self.db, "--collector", collector,
                                 "--log-level", "warning")
            self.processes.wait_healthy("serve", sidecar)
            import tracemill.sdk as tm

            tm.init(collector, service_name="demo-agent", harness_version=s.harness_version)
            self._sdk = True
            self.console.print(f"collector {collector} (store {self.folder / 'store.db'}) · weak model "
                               f"{self._model_server.url}/v1 ({s.profile}) · sidecar {sidecar}/v1 (tracemill serve)")
        with self.step("2. phase 1: the agent with no sidecar, then through the sidecar (rules reviser)"):
            self._phase("baseline", "no sidecar", self._model_server.url + "/v1", s.seed, weak)
            self._phase("rules", "sidecar: rules", sidecar + "/v1", s.seed, weak)
            time.sleep(SIDECAR_EXPORT_S)
        with self.step("3. mine the store: failed and repaired calls as RL prompts"):
            self._mine()
        with self.step("4. train the tiny reviser with GRPO (CPU)"):
            candidate = self._train()
        with self.step("5. the gate: the candidate beside the rules on the held-out split"):
            self._gate(candidate, sidecar)
        served_by = f"sidecar: {self.deployed}" if self.deployed else f"sidecar: rules ({candidate} refused)"
        with self.step("6. phase 2: the agent through the sidecar, serving what the gate let through"):
            self._phase("model" if self.deployed else "rules again", served_by, sidecar + "/v1", s.seed + 1, weak)
        self.close()
        self.console.rule("[bold]before and after")
        self.console.print(table(self.phases))
        self.console.print(f"Phase 1's two rows ran the same episodes (seed {s.seed}: the same tasks, and the same "
                           "model answers until a revised call changes the conversation); phase 2 ran new ones (seed "
                           f"{s.seed + 1}), new traffic for a model trained on phase 1.")
        self.console.print("time per step: " + ", ".join(f"{k.split('.')[0]}. {v:.0f} s"
                                                         for k, v in self.timings.items()))

    def _phase(self, name: str, served_by: str, base_url: str, seed: int, weak: Any) -> None:
        from rich.progress import Progress

        import tracemill.sdk as tm
        from tracemill.demo.agent import run_episodes
        from tracemill.simulate.scenarios import mcp_bench_scenarios
        from tracemill.store.engine import make_engine

        since = datetime.now(UTC)
        from openai import APIError

        with Progress(console=self.console, transient=True) as progress:
            task = progress.add_task(f"{name}: episodes", total=self.sizes.episodes)
            try:
                tally = run_episodes(base_url, self.sizes.profile, mcp_bench_scenarios(), self.sizes.episodes, seed,
                                     weak.settings, on_episode=lambda n: progress.update(task, completed=n))
            except APIError as exc:
                raise DemoError(f"the agent's model call failed in phase {name!r} ({base_url}): {exc}; the end of the "
                                f"sidecar's log:\n{self.processes.tail('serve')}") from None
        if not tm.flush(30):
            raise DemoError("the agent's spans did not all reach the collector within 30 s")
        until = datetime.now(UTC)
        engine = make_engine(self.db)
        try:
            metrics = measure(engine, self.sizes.harness_version, since, until)
        finally:
            engine.dispose()
        self.phases.append(Phase(name, served_by, since, until, tally.episodes, tally.requests, tally.revised,
                                 tally.by_model, metrics))
        self.console.print(f"{name} ({served_by}): {tally.episodes} episodes, {tally.requests} model calls, "
                           f"{metrics.total_calls} tool calls stored, {tally.revised} answers revised"
                           + (f", {tally.by_model} of them by the model reviser" if tally.by_model else ""))

    def _mine(self) -> None:
        out = self.processes.run("mine", "mine", "--db", self.db, "--out", str(self.folder / "mined"), "--eval-share",
                                 "0.2", "--max-tools", "1", "--budget-tokens", "48", "--json")
        card = json.loads(out[out.index("{"):])
        counts = card["counts"]
        self.dataset = {"train_rows": card["splits"]["train"]["rows"], "eval_rows": card["splits"]["eval"]["rows"],
                        "failure_class": counts["failure_class"], "provenance": counts["provenance"]}
        shown = ", ".join(f"{k} {v}" for k, v in sorted(counts["failure_class"].items(), key=lambda kv: -kv[1]))
        self.console.print(f"{self.folder / 'mined'}: {self.dataset['train_rows']} train rows, "
                           f"{self.dataset['eval_rows']} held-out rows (a fifth of the traces)\n  by failure class: "
                           f"{shown}\n  references: " + ", ".join(f"{k} {v}" for k, v in counts["provenance"].items()))

    def _train(self) -> str:
        from rich.progress import Progress

        from tracemill.demo.cli import TRAIN_CONFIG

        self._wait("tiny-model")  # built in the background since step 1
        self.tiny_size = self.processes.tail("tiny-model", 1).rpartition("(")[2].rstrip(")") or None
        run = self.folder / "run"
        config = self.folder / "train.toml"
        s = self.sizes
        config.write_text(TRAIN_CONFIG.format(base=self.folder / "tiny", data=self.folder / "mined",
                                              warmup=s.warmup_steps, steps=s.steps, seed=s.seed, out=run, db=self.db))
        with Progress(console=self.console, transient=True) as progress:
            task = progress.add_task("warm-up, then GRPO steps", total=s.steps)
            self.processes.run("train", "train", "--config", str(config),
                               while_running=lambda: progress.update(task, completed=_grpo_steps(run)))
        candidate = self._newest_model()
        self.console.print(f"{candidate}: {run / 'model'} ({self.tiny_size}), {s.warmup_steps} warm-up steps and "
                           f"{_grpo_steps(run)} GRPO steps; metrics in {run / 'metrics.jsonl'}")
        return candidate

    def _wait(self, name: str) -> None:
        """Wait for a background command the demo started to end."""
        for entry_name, proc in list(self.processes.running):
            if entry_name == name:
                proc.wait()
                self.processes.running.remove((entry_name, proc))
                if proc.returncode != 0:
                    raise DemoError(f"`tracemill {name}` failed:\n{self.processes.tail(name)}")

    def _newest_model(self) -> str:
        return self._model_row(lambda row: row.name)

    def _model_row(self, read: Callable[[Any], Any]) -> Any:
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        from tracemill.store.engine import make_engine
        from tracemill.store.tables import ModelRow

        engine = make_engine(self.db)
        try:
            with Session(engine) as session:
                row = session.scalars(select(ModelRow).order_by(ModelRow.id.desc()).limit(1)).first()
                if row is None:
                    raise DemoError("`tracemill train` registered no model")
                return read(row)
        finally:
            engine.dispose()

    def _gate(self, candidate: str, sidecar: str) -> None:
        from rich.table import Table

        self.verdict = verdict = judge(candidate, self._model_row(lambda row: dict(row.evaluation or {})),
                                       self.sizes.margin)
        shown = Table(title=f"{candidate} beside the rules on {verdict.cases} held-out cases")
        for column in ("check", candidate, "rules (active)", "rule", "passed"):
            shown.add_column(column)
        from tracemill.rates import percent

        for check in verdict.checks:
            shown.add_row(check.name, percent(check.candidate), percent(check.active), check.rule,
                          "yes" if check.passed else "[bold]no[/]")
        self.console.print(shown)
        if not verdict.passed:
            reasons = "; ".join(verdict.reasons()) or "the trainer measured no figures for it"
            self.console.print(f"[bold]the gate refused {candidate}[/]: {reasons}. The sidecar keeps the rules.")
            return
        note = f"demo gate passed (margin {self.sizes.margin:g})"
        self.console.print(self.processes.run("deploy", "deploy", candidate, "--db", self.db, "--actor",
                                              "tracemill-demo", "--note", note).strip().splitlines()[-1])
        deadline = time.monotonic() + 180
        while (health := httpx.get(sidecar + "/healthz", timeout=5).json())["version"] != candidate:
            if health.get("deployment_error") or time.monotonic() > deadline:
                raise DemoError(f"the sidecar did not start serving {candidate}: "
                                f"{health.get('deployment_error') or 'timed out'}\n{self.processes.tail('serve')}")
            time.sleep(0.5)
        self.deployed = candidate
        self.console.print(f"the sidecar serves {candidate} (loaded in its process, behind the rules)")

    def close(self) -> None:
        """Stop what the demo started, newest first; the collector last, so that every span sent is stored."""
        if self._closed:
            return
        self._closed = True
        if self._sdk:
            import tracemill.sdk as tm

            tm.flush(10)
            tm.shutdown()
        if self._model_server is not None:
            self._model_server.stop()
        for name in ("train", "mine", "deploy", "tiny-model", "serve"):
            self.processes.stop(name)
        self.processes.stop_all()

    def summary(self) -> dict[str, Any]:
        verdict = self.verdict
        return {"phases": [p.to_dict() for p in self.phases], "dataset": self.dataset, "deployed": self.deployed,
                "gate": None if verdict is None else {
                    "candidate": verdict.candidate, "passed": verdict.passed, "cases": verdict.cases,
                    "reasons": verdict.reasons(),
                    "checks": [{"name": c.name, "candidate": c.candidate, "active": c.active, "passed": c.passed,
                                "rule": c.rule} for c in verdict.checks]},
                "timings_s": self.timings}


def _grpo_steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"reward"' in line)
