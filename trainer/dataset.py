"""The trainer's input: the RL prompt rows of `tracemill mine` (DESIGN.md, "RL prompt rows"), checked before any model
loads. A row that cannot be trained on is an error naming its file, line and field."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tracemill.reviser_prompt import PromptSettings
from tracemill.tools import ToolFormatError, normalize_tools

CARD = "dataset.json"
TRAIN, EVAL = "train.jsonl", "eval.jsonl"
# The columns the rewards read; TRL passes each to every reward function.
REWARD_COLUMNS = ("raw", "tools", "context", "reference", "valid")


class DatasetError(ValueError):
    """A dataset that cannot be trained on; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class PromptRows:
    folder: Path
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    prompt_settings: PromptSettings
    content_hash: str
    card: dict[str, Any]

    @property
    def eval_path(self) -> Path | None:
        return self.folder / EVAL if self.eval else None

    def training_columns(self, limit: int | None = None) -> dict[str, list[Any]]:
        """The columns GRPOTrainer takes: `prompt` and the reward columns, as the rows hold them."""
        rows = self.train[:limit] if limit else self.train
        return {key: [r.get(key) for r in rows] for key in ("prompt", *REWARD_COLUMNS)}


def _json_text(row: Mapping[str, Any], key: str, where: str, kinds: tuple[type, ...]) -> Any:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DatasetError(f"{where}: {key!r} must be JSON text (the miner's export), got {type(value).__name__}")
    try:
        decoded = json.loads(value)
    except ValueError as exc:
        raise DatasetError(f"{where}: {key!r} is not JSON ({exc})") from None
    if decoded is not None and not isinstance(decoded, kinds):
        raise DatasetError(f"{where}: {key!r} must hold a {' or '.join(k.__name__ for k in kinds)}")
    return decoded


def check_row(row: Any, where: str) -> None:
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: expected an object, got {type(row).__name__}")
    prompt = row.get("prompt")
    if not (isinstance(prompt, list) and prompt and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt)):
        raise DatasetError(f"{where}: 'prompt' must be a non-empty list of {{role, content}} messages")
    if not isinstance(row.get("raw"), str):
        raise DatasetError(f"{where}: 'raw' must be the model's output as text")
    if not isinstance(row.get("valid"), bool):
        raise DatasetError(f"{where}: 'valid' must be true or false")
    tools = _json_text(row, "tools", where, (list,))
    if not tools:
        raise DatasetError(f"{where}: 'tools' must list the tools the prompt shows (the reward verifies against them)")
    try:
        normalize_tools(tools)
    except ToolFormatError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    _json_text(row, "context", where, (list,))
    _json_text(row, "reference", where, (list,))


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not valid JSON ({exc})") from None
            check_row(row, f"{path}:{n}")
            rows.append(row)
    return rows


def load_rows(folder: Path) -> PromptRows:
    """The rows and card of a `tracemill mine` export. Raises DatasetError."""
    if not folder.is_dir():
        raise DatasetError(f"{folder}: no such dataset folder (make one with `tracemill mine --out {folder}`)")
    card_path = folder / CARD
    try:
        card = orjson.loads(card_path.read_bytes())
    except FileNotFoundError:
        raise DatasetError(f"{card_path}: missing: the trainer needs the card's prompt_settings") from None
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"{card_path}: not valid JSON ({exc})") from None
    settings = card.get("prompt_settings") if isinstance(card, Mapping) else None
    if not isinstance(settings, Mapping):
        raise DatasetError(f"{card_path}: no 'prompt_settings': the model must be asked the way its data was built")
    if not (folder / TRAIN).is_file():
        raise DatasetError(f"{folder / TRAIN}: missing")
    train = _rows(folder / TRAIN)
    if not train:
        raise DatasetError(f"{folder / TRAIN}: no rows to train on")
    evaluation = _rows(folder / EVAL) if (folder / EVAL).is_file() else []
    content_hash = card.get("content_hash") or hashlib.sha256(
        (folder / TRAIN).read_bytes() + ((folder / EVAL).read_bytes() if evaluation else b"")).hexdigest()
    return PromptRows(folder, train, evaluation, PromptSettings.from_dict(settings), str(content_hash), dict(card))


def failure_classes(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        key = str(row.get("failure_class") or ("valid" if row.get("valid") else "unknown"))
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
