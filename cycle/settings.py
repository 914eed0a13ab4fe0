"""What a cycle is told: the store, its work folder, the base model and the training config, when to train, and the
gate a candidate must pass to be deployed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tracemill.reviser_prompt import PromptSettings
from tracemill.trainer.config import ConfigError, TrainConfig, parse_config, read_toml
from tracemill.trainer.launch import needs_accelerate

# model.base and data.dataset are set by each cycle; a config needs them to be whole, so these stand in until then
_PER_CYCLE = {"model": {"base": "(the cycle's base model)"}, "data": {"dataset": "(the cycle's dataset)"}}


def train_config(sections: dict[str, Any] | None = None, folder: Path | None = None,
                 source: str = "the cycle's train settings") -> TrainConfig:
    """A `TrainConfig` from the sections of a train TOML (`[grpo]`, `[warmup]`, `[eval]`, ...), where `model.base`,
    `data.dataset`, `output.dir` and the database are the cycle's. Raises ConfigError naming the field."""
    data = {**(sections or {})}
    data["model"] = {**_PER_CYCLE["model"], **data.get("model", {})}
    data["data"] = {**_PER_CYCLE["data"], **data.get("data", {})}
    return parse_config(data, (folder or Path.cwd()).resolve(), source)


@dataclass(frozen=True, slots=True)
class Decision:
    """When to train: at least `min_new_failures` failed calls since the last cycle that trained, and harness tuning
    no longer paying: over the newest `plateau_window` harness versions (in the order they first appear), no version's
    failure rate fell below the one before it by `plateau_tolerance` (absolute, 0.01 = one point) or more with a
    two-proportion test's p below `alpha` (a fall the traffic cannot tell from chance does not count)."""

    min_new_failures: int = 50
    plateau_window: int = 3
    plateau_tolerance: float = 0.01
    alpha: float = 0.05
    top_modes: int = 5  # failure modes named when the harness should change first

    def __post_init__(self) -> None:
        if self.min_new_failures < 0 or self.plateau_window < 2 or not 0 <= self.plateau_tolerance < 1 \
                or not 0 < self.alpha < 1:
            raise ValueError("decision: min_new_failures >= 0, plateau_window >= 2, 0 <= plateau_tolerance < 1 and "
                             "0 < alpha < 1")


@dataclass(frozen=True, slots=True)
class Gate:
    """What a candidate must show on the same held-out cases as the active reviser to replace it: at least
    `min_held_out_cases` of them; reference match and input schema compliance each at least the active's plus its
    margin (absolute: 0.01 is one point; 0 lets a candidate no worse than the active one replace it), capped at 100%;
    and no valid call changed, on the held-out split and on each built-in suite of the train config's `[eval]`."""

    reference_margin: float = 0.01
    schema_margin: float = 0.0
    min_held_out_cases: int = 30

    def __post_init__(self) -> None:
        if not (0 <= self.reference_margin < 1 and 0 <= self.schema_margin < 1):
            raise ValueError("gate: margins are shares between 0 and 1")
        if self.min_held_out_cases < 1:
            raise ValueError("gate: min_held_out_cases >= 1")


@dataclass(frozen=True, slots=True)
class Mining:
    """How the calls a candidate learns from are exported (`tracemill mine`'s options). `window_days`: the calls
    stored in that many days before the cycle, old and new (the split by trace, with the same seed and eval share,
    keeps every trace on its side from cycle to cycle); unset, the calls since the last cycle that trained only."""

    eval_share: float = 0.2
    valid_share: float = 0.2
    seed: int = 0
    prompt: PromptSettings = PromptSettings()
    workers: int = 1
    window_days: float | None = None

    def __post_init__(self) -> None:
        if self.window_days is not None and not self.window_days > 0:
            raise ValueError(f"window_days must be more than 0, not {self.window_days}")


@dataclass(frozen=True, slots=True)
class CycleSettings:
    store: str  # the store's URL
    work: Path  # each cycle's dataset and model go to WORK/cycle-NNNN/
    base_model: str  # a local model folder or hub id the candidate is trained from
    train: TrainConfig = field(default_factory=train_config)
    decision: Decision = Decision()
    gate: Gate = Gate()
    mining: Mining = Mining()
    force: bool = False  # train whatever the decision says (not: deploy whatever the gate says)
    lock_ttl_s: float = 120.0
    actor: str = "tracemill cycle"


_CYCLE_KEYS = {"base", "work", "force", "lock_ttl_s"}


def _pick(table: dict[str, Any], kind: type, where: str) -> Any:
    known = set(kind.__dataclass_fields__)  # type: ignore[attr-defined]
    try:
        return kind(**{k: v for k, v in table.items() if k in known})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_settings(path: Path, store: str, overrides: dict[str, Any] | None = None) -> CycleSettings:
    """A cycle's settings from a TOML file: `[cycle]` (base, work, and the decision's and the gate's keys), `[mine]`
    (`Mining`'s keys and the prompt settings) and any section of a train config. `overrides` (the command line's
    options, None where not given) win over the file. Raises ConfigError naming the file and the key."""
    source = str(path)
    data = read_toml(path)
    cycle = {**data.pop("cycle", {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    mining = data.pop("mine", {})
    allowed = _CYCLE_KEYS | set(Decision.__dataclass_fields__) | set(Gate.__dataclass_fields__)
    allowed_mine = set(Mining.__dataclass_fields__) | set(PromptSettings.__dataclass_fields__)
    for table, keys, name in ((cycle, allowed, "cycle"), (mining, allowed_mine, "mine")):
        unknown = sorted(set(table) - keys - {"prompt"})
        if unknown:
            raise ConfigError(f"{source}: [{name}]: unknown key(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(keys - {'prompt'}))}")
    base = cycle.get("base") or data.get("model", {}).get("base")
    if not base:
        raise ConfigError(f"{source}: no base model: set [cycle] base (or [model] base), or give --base")
    folder = path.parent.resolve()
    local = folder / str(base)
    prompt = _pick(mining, PromptSettings, f"{source}: [mine]")
    train = train_config(data, folder, source)
    if needs_accelerate(train):
        raise ConfigError(f"{source}: [launch]: a cycle trains in its own process, on one device; num_processes = "
                          f"{train.launch.num_processes}, deepspeed = {train.launch.deepspeed!r} would be ignored. "
                          "Remove [launch], or train on several GPUs with `tracemill train --config` and deploy that "
                          "model with `tracemill deploy`")
    return CycleSettings(
        store=store, work=(folder / str(cycle.get("work", "cycles"))).resolve(),
        base_model=str(local.resolve()) if local.exists() else str(base),
        train=train,
        decision=_pick(cycle, Decision, f"{source}: [cycle]"), gate=_pick(cycle, Gate, f"{source}: [cycle]"),
        mining=replace(_pick(mining, Mining, f"{source}: [mine]"), prompt=prompt),
        force=bool(cycle.get("force", False)), lock_ttl_s=float(cycle.get("lock_ttl_s", 120.0)))
