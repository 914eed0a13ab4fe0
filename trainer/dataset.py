"""The trainer's input: the RL prompt rows of `tracemill mine` (DESIGN.md, "RL prompt rows"), checked before any model
loads. A row that cannot be trained on is an error naming its file, line and field.

The files are read a line at a time and never held whole: an export of a million stored calls is gigabytes of JSON
Lines, and with agent contexts of 57k-128k tokens each row's `context` is hundreds of KB. GRPO reads the train split as
an Arrow file (`training_dataset`), memory-mapped, as `datasets` reads its own."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tracemill.reviser_prompt import PromptSettings
from tracemill.tools import ToolFormatError, normalize_tools

CARD = "dataset.json"
TRAIN, EVAL = "train.jsonl", "eval.jsonl"
# The columns the rewards read; TRL passes each to every reward function.
REWARD_COLUMNS = ("raw", "tools", "context", "reference", "valid")
_ARROW_BATCH_CHARS = 16 << 20  # rows are written to the Arrow file about this much text at a time

if TYPE_CHECKING:
    from datasets import Dataset


class DatasetError(ValueError):
    """A dataset that cannot be trained on; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class PromptRows:
    """A checked export: its rows counted, not held."""

    folder: Path
    train_rows: int
    eval_rows: int
    failure_classes: dict[str, int]  # of the train split
    prompt_settings: PromptSettings
    content_hash: str
    card: dict[str, Any]

    @property
    def train_path(self) -> Path:
        return self.folder / TRAIN

    @property
    def eval_path(self) -> Path | None:
        return self.folder / EVAL if self.eval_rows else None

    def read(self, split: str = TRAIN, limit: int | None = None) -> list[dict[str, Any]]:
        """The first `limit` rows of a split's file (every row without), as dicts: for the warm-up's pairs and the
        benchmarks, not for GRPO."""
        return [row for _, row in itertools.islice(_lines(self.folder / split), limit)]

    def training_dataset(self, folder: Path, limit: int | None = None) -> Dataset:
        """The columns GRPOTrainer takes (`prompt` and the reward columns) of the first `limit` train rows, written to
        an Arrow file in `folder` and memory-mapped. Processes training together each write their own and put it in
        place whole: the same rows, the same file."""
        import pyarrow as pa
        from datasets import Dataset

        name = f"train-rows-{self.content_hash[:16]}-{limit or 'all'}.arrow"
        path = folder / name
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{name}.{os.getpid()}"
            schema = _training_schema()
            with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                batch: list[dict[str, Any]] = []
                chars = 0
                for _, row in itertools.islice(_lines(self.train_path), limit):
                    batch.append(_training_row(row))
                    chars += sum(len(v) for v in batch[-1].values() if isinstance(v, str))
                    if chars >= _ARROW_BATCH_CHARS:
                        writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
                        batch, chars = [], 0
                if batch:
                    writer.write_batch(pa.RecordBatch.from_pylist(batch, schema=schema))
            os.replace(partial, path)
        return Dataset.from_file(str(path))


def _training_schema() -> Any:
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([("prompt", pa.list_(message)), ("raw", pa.string()), ("tools", pa.string()),
                      ("context", pa.string()), ("reference", pa.string()), ("valid", pa.bool_())])


def _training_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
            **{key: row.get(key) for key in REWARD_COLUMNS}}


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


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded row) of each line that is not blank."""
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield n, orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not valid JSON ({exc})") from None


def _checked(path: Path) -> tuple[int, dict[str, int]]:
    """Every row of the file checked: how many there are, and how many of each failure class."""
    classes: Counter[str] = Counter()
    rows = 0
    for n, row in _lines(path):
        check_row(row, f"{path}:{n}")
        rows += 1
        classes[str(row.get("failure_class") or ("valid" if row.get("valid") else "unknown"))] += 1
    return rows, dict(sorted(classes.items()))


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
    train, classes = _checked(folder / TRAIN)
    if not train:
        raise DatasetError(f"{folder / TRAIN}: no rows to train on")
    evaluation = _checked(folder / EVAL)[0] if (folder / EVAL).is_file() else 0
    content_hash = card.get("content_hash") or _files_hash(
        [folder / TRAIN, *([folder / EVAL] if evaluation else [])])
    return PromptRows(folder, train, evaluation, classes, PromptSettings.from_dict(settings), str(content_hash),
                      dict(card))


def _files_hash(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()
