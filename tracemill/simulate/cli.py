"""The `tracemill simulate` command."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from tracemill.faults import PROFILES


@click.command()
@click.option("--endpoint", default="http://127.0.0.1:4318", show_default=True,
              help="The collector's base URL (or its /v1/traces URL).")
@click.option("--tools", "tools_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Tools to simulate over: MCP-Bench servers JSON, a JSON list of tools, or BFCL JSON Lines. "
                   "Default: MCP-Bench's servers and tasks, plus BFCL rows (legal ones included).")
@click.option("--traces", default=100, show_default=True, type=click.IntRange(min=1), help="Episodes to send.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--model-profile", "profile", default="llama3.1-8b", show_default=True,
              type=click.Choice(sorted(PROFILES)), help="The weak model's fault rates (tracemill.faults.PROFILES).")
@click.option("--harness-version", default="sim-1", show_default=True,
              help="The agent's harness version: prompt-v1 ... prompt-v6 change what the model gets wrong, as "
                   "tracemill.simulate.harness documents; any other name is simulated as prompt-v1.")
@click.option("--tool-error-rate", default=0.05, show_default=True, type=click.FloatRange(0, 1),
              help="Share of correct calls whose execution fails anyway.")
@click.option("--api-key", default=None, help="Collector API key (Authorization: Bearer).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def simulate(endpoint: str, tools_file: Path | None, traces: int, seed: int, profile: str, harness_version: str,
             tool_error_rate: float, api_key: str | None, as_json: bool) -> None:
    """Send a realistic agent workload to a collector; return once every span is delivered.

    Each episode is an MCP-Bench task (or a BFCL row) run by a weak open model: tool calls leaked as text, broken
    JSON, near-miss names, wrong types, retries, failed executions. Every injected fault is recorded under
    `tracemill.sim.*`. The same seed sends the same spans (ids included), so a re-run stores nothing twice."""
    from rich.progress import Progress

    from tracemill.simulate import DeliveryError
    from tracemill.simulate import simulate as run

    started = time.perf_counter()
    with Progress(disable=as_json, transient=True) as progress:
        task = progress.add_task("episodes", total=traces)
        try:
            summary = run(endpoint, traces=traces, seed=seed, profile=profile, tools_file=tools_file,
                          harness_version=harness_version, api_key=api_key, tool_error_rate=tool_error_rate,
                          on_episode=lambda n: progress.update(task, completed=n))
        except (DeliveryError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    elapsed = time.perf_counter() - started
    out = {**summary.to_dict(), "seconds": round(elapsed, 2), "spans_per_second": round(summary.spans / elapsed)}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"{summary.episodes} episodes, {summary.spans} spans, {summary.calls} tool calls delivered to "
               f"{endpoint} in {elapsed:.1f} s ({out['spans_per_second']} spans/s)")
    for name, value in summary.metrics().items():
        click.echo(f"  expected {name}: {value if isinstance(value, int) or value is None else f'{value:.3f}'}")
