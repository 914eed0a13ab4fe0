"""`tracemill demo`: the loop so far, on the embedded default (a SQLite file, CPU, nothing else to install).

It starts a collector, sends it the simulated traffic of three weak open models over MCP-Bench's real tool schemas,
prints what the verifier found in the store, and measures the deterministic reviser on BFCL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

from tracemill.faults import WEAK_PROFILES
from tracemill.net import free_port


def _tracemill(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tracemill.cli", *args], check=True)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"the collector exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise click.ClickException(f"the collector did not answer at {url} within {timeout:.0f}s")


@click.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("tracemill-demo.db"),
              show_default=True, help="SQLite file for the demo's store (replaced on each run).")
@click.option("--port", type=int, default=None, help="Port for the demo's collector (default: a free one).")
@click.option("--traces", type=click.IntRange(1), default=300, show_default=True, help="Episodes per model profile.")
def demo(db_path: Path, port: int | None, traces: int) -> None:
    """Run the loop so far on SQLite and the CPU: collect, verify, mine, measure."""
    from rich.console import Console

    console = Console()
    db_path = db_path.resolve()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    db_url = f"sqlite:///{db_path}"
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"

    console.rule(f"1. collector on {db_path.name}")
    collector = subprocess.Popen([sys.executable, "-m", "tracemill.cli", "collector", "--port", str(port),
                                  "--grpc-port", "0", "--db", db_url, "--log-level", "warning"])
    try:
        _wait_healthy(url, collector)
        console.print(f"listening on {url}/v1/traces")
        console.rule("2. agents on three open models send their traces")
        for seed, profile in enumerate(WEAK_PROFILES):
            _tracemill("simulate", "--endpoint", url, "--traces", str(traces), "--model-profile", profile,
                       "--seed", str(seed))
    finally:
        collector.terminate()
        collector.wait(60)

    console.rule("3. what the verifier found in the store (MCP-Bench's rule-based metrics)")
    _tracemill("stats", "--db", db_url, "--by", "model")
    _tracemill("stats", "--db", db_url, "--by", "domain")
    console.rule("4. failure modes, and the failed calls mined as RL prompts")
    _tracemill("failures", "--db", db_url, "--by", "stage,kind", "--limit", "8")
    dataset = db_path.with_name(db_path.stem + "-dataset")
    _tracemill("mine", "--db", db_url, "--out", str(dataset))
    console.rule("5. the deterministic reviser on BFCL with a weak model's faults")
    _tracemill("eval", "--cases", "bfcl", "--reviser", "none,json-repair,rules")
    console.print(f"\nThe store is {db_path}, the RL prompts {dataset}: try `tracemill failures --db {db_url}`.")
