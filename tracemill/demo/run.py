"""The demo's steps, in order (`Demo.run`), and what each one found (`Demo.summary`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tracemill.console import print_rule, print_table
from tracemill.demo.phases import AGENT_SERVICE, Phase, measure, table
from tracemill.demo.processes import DemoError, Processes
from tracemill.net import ServerThread

if TYPE_CHECKING:
    from rich.console import Console

    from tracemill.demo.cli import Sizes

CYCLE_STEPS = ("cycle ", "mine:", "decide:", "  fix first:", "train:", "evaluate:", "deploy:")
SIDECAR_EXPORT_S = 6.0  # the sidecar's span batches leave every 5 s: what it traced is stored within this


class Demo:
    def __init__(self, folder: Path, sizes: Sizes, processes: Processes, console: Console) -> None:
        self.folder, self.sizes, self.processes, self.console = folder, sizes, processes, console
        self.db = f"sqlite:///{folder / 'store.db'}"
        self.phases: list[Phase] = []
        self.timings: dict[str, float] = {}
        self.cycle: dict[str, Any] = {}  # the cycle's record (`tracemill cycle --history --json`)
        self.candidate: str | None = None
        self.deployed: str | None = None
        self.tiny_size: str | None = None
        self._model_server: ServerThread | None = None
        self._sdk = False
        self._closed = False

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        print_rule(self.console, f"[bold]{title}")
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
            collector = self.processes.serve("collector", "collector", "--grpc-port", "0", "--db", self.db,
                                             "--workers", "1")
            weak = WeakModel(s.profile, s.harness_version, s.seed)
            self._model_server = ServerThread(weak.app()).start()
            sidecar = self.processes.serve("serve", "serve", "--upstream", self._model_server.url + "/v1",
                                           "--db", self.db, "--collector", collector)
            import tracemill.sdk as tm

            tm.init(collector, service_name=AGENT_SERVICE, harness_version=s.harness_version)
            self._sdk = True
            self.console.print(f"collector {collector} (store {self.folder / 'store.db'}) · weak model "
                               f"{self._model_server.url}/v1 ({s.profile}) · sidecar {sidecar}/v1 (tracemill serve)")
        with self.step("2. phase 1: the agent with no sidecar, then through the sidecar (rules reviser)"):
            self._phase("baseline", "no sidecar", self._model_server.url + "/v1", s.seed, weak)
            self._phase("rules", "sidecar: rules", sidecar + "/v1", s.seed, weak)
            time.sleep(SIDECAR_EXPORT_S)
        with self.step("3. tracemill cycle --force: mine, decide, train the tiny reviser (GRPO, CPU), evaluate"):
            self._cycle()
        wanted = "no worse than" if not s.margin else f"at least {s.margin:.1%} better than"
        with self.step(f"4. the cycle's gate: the candidate is deployed only if {wanted} the active reviser"):
            self._gate(sidecar)
        served_by = (f"sidecar: {self.deployed}" if self.deployed
                     else f"sidecar: {self.cycle['baseline']} ({self.candidate} refused)")
        with self.step("5. phase 2: the agent through the sidecar, serving what the gate let through"):
            self._phase("model" if self.deployed else "rules again", served_by, sidecar + "/v1", s.seed + 1, weak)
        self.close()
        print_rule(self.console, "[bold]before and after")
        print_table(table(self.phases), self.console)
        self.console.print(f"Phase 1's two rows ran the same episodes (seed {s.seed}: the same tasks, and the same "
                           "model answers until a revised call changes the conversation); phase 2 ran new ones (seed "
                           f"{s.seed + 1}), new traffic for a model trained on phase 1.")
        self.console.print("time per step: " + ", ".join(f"{k.split('.')[0]}. {v:.0f} s"
                                                         for k, v in self.timings.items()))

    def _phase(self, name: str, served_by: str, base_url: str, seed: int, weak: Any) -> None:
        from openai import APIError
        from rich.progress import Progress

        import tracemill.sdk as tm
        from tracemill.demo.agent import run_episodes
        from tracemill.simulate.scenarios import mcp_bench_scenarios
        from tracemill.store.engine import make_engine

        since = datetime.now(UTC)
        with Progress(console=self.console, transient=True) as progress:
            task = progress.add_task(f"{name}: episodes", total=self.sizes.episodes)
            try:
                tally = run_episodes(base_url, self.sizes.profile, mcp_bench_scenarios(), self.sizes.episodes, seed,
                                     weak.settings, self.sizes.harness_version,
                                     on_episode=lambda n: progress.update(task, completed=n))
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

    def _cycle(self) -> None:
        from rich.progress import Progress

        from tracemill.demo.cli import CYCLE_CONFIG

        self._wait("tiny-model")  # built in the background since step 1
        self.tiny_size = self.processes.tail("tiny-model", 1).rpartition("(")[2].rstrip(")") or None
        s = self.sizes
        config = self.folder / "cycle.toml"
        config.write_text(CYCLE_CONFIG.format(base=self.folder / "tiny", work=self.folder / "cycles",
                                              margin=s.margin, warmup=s.warmup_steps, steps=s.steps, seed=s.seed))
        run = self.folder / "cycles" / "cycle-0001" / "run"
        shown: list[str] = []

        def follow(progress: Progress, task: Any) -> None:
            lines = [line for line in self.processes.tail("cycle", 400).splitlines()
                     if line.startswith(CYCLE_STEPS)]
            for line in lines[len(shown):]:
                self.console.print(line)
            shown[:] = lines
            progress.update(task, completed=_grpo_steps(run))

        with Progress(console=self.console, transient=True) as progress:
            task = progress.add_task("the cycle (GRPO steps)", total=s.steps)
            self.processes.run("cycle", "cycle", "--config", str(config), "--db", self.db,
                               while_running=lambda: follow(progress, task))
            follow(progress, task)
        history = self.processes.run("cycle-history", "cycle", "--history", "--json", "--limit", "1", "--db", self.db)
        self.cycle = cycle = json.loads(history[history.index("["):])[0]
        if cycle["model_id"] is None:
            raise DemoError(f"the cycle trained no model ({cycle['status']}: {cycle['error'] or cycle['reason']})")
        self.candidate = self._model_name(cycle["model_id"])

    def _model_name(self, model_id: int) -> str:
        from sqlalchemy.orm import Session

        from tracemill.store.engine import make_engine
        from tracemill.store.tables import ModelRow

        engine = make_engine(self.db)
        try:
            with Session(engine) as session:
                return session.get_one(ModelRow, model_id).name
        finally:
            engine.dispose()

    def _wait(self, name: str) -> None:
        """Wait for a background command the demo started to end."""
        for entry_name, proc in list(self.processes.running):
            if entry_name == name:
                proc.wait()
                self.processes.running.remove((entry_name, proc))
                if proc.returncode != 0:
                    raise DemoError(f"`tracemill {name}` failed:\n{self.processes.tail(name)}")

    def _gate(self, sidecar: str) -> None:
        from rich.table import Table

        from tracemill.rates import percent

        gate, candidate = self.cycle["gate"], self.candidate
        if gate.get("checks"):  # none where it refused before measuring (too few held-out cases)
            shown = Table(title=f"the cycle's gate: {candidate} beside {self.cycle['baseline']} (active) on the same "
                                "held-out cases")
            for column in ("check", "suite", candidate, self.cycle["baseline"], "needed", "passed"):
                shown.add_column(column)
            for check in gate["checks"]:
                shown.add_row(check["name"].replace("_", " "), check["suite"], percent(check["candidate"]),
                              percent(check["baseline"]), check["needed"], "yes" if check["passed"] else "[bold]no[/]")
            print_table(shown, self.console)
        if not self.cycle["deployed"]:
            self.console.print(f"[bold]the gate refused {candidate}[/]: {gate.get('reason')}. The sidecar keeps "
                               f"{self.cycle['baseline']}.")
            return
        self.console.print(f"the cycle deployed {candidate} (deployment {self.cycle['deployment_id']}): "
                           f"{gate.get('reason')}")
        deadline = time.monotonic() + 180
        while (health := httpx.get(sidecar + "/healthz", timeout=5).json())["version"] != candidate:
            if health.get("deployment_error") or time.monotonic() > deadline:
                raise DemoError(f"the sidecar did not start serving {candidate}: "
                                f"{health.get('deployment_error') or 'timed out'}\n{self.processes.tail('serve')}")
            time.sleep(0.5)
        self.deployed = candidate
        self.console.print(f"the sidecar serves {candidate} (loaded in its process, asked where the rules fail)")

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
        for name in ("cycle", "cycle-history", "tiny-model", "serve"):
            self.processes.stop(name)
        self.processes.stop_all()

    def summary(self) -> dict[str, Any]:
        return {"phases": [p.to_dict() for p in self.phases], "cycle": self.cycle, "candidate": self.candidate,
                "deployed": self.deployed, "timings_s": self.timings}


def _grpo_steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"reward"' in line)
