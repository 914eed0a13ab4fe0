"""An optional supervised warm-up before GRPO: a short TRL SFT run on the rows' (prompt, answer) pairs, so that a
model that has never seen the answer format produces calls at all and GRPO's groups stop tying. The answer is the
reference call(s) as compact JSON, and the output itself for a row that was valid as sent (the prompt says to repeat
a valid call unchanged). Kept short on purpose: supervised training on these pairs learns to copy."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tracemill.reviser_prompt import PromptSettings


def answer(row: Mapping[str, Any]) -> str | None:
    """The answer a reviser should give for a row; None for a row without a reference."""
    if row.get("valid"):
        return str(row["raw"])
    reference = json.loads(row["reference"]) if isinstance(row.get("reference"), str) else row.get("reference")
    if not reference:
        return None
    return json.dumps(reference[0] if len(reference) == 1 else reference, ensure_ascii=False, separators=(", ", ": "))


def pairs(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Conversational prompt-completion columns, as TRL's SFTTrainer takes them."""
    kept = [(r["prompt"], a) for r in rows if (a := answer(r)) is not None]
    return {"prompt": [p for p, _ in kept], "completion": [[{"role": "assistant", "content": a}] for _, a in kept]}


def sft_trainer(base: str, rows: Sequence[Mapping[str, Any]], out: Path, steps: int, learning_rate: float,
                batch_size: int, seed: int, device: str):  # type: ignore[no-untyped-def]
    """TRL's SFTTrainer of `base` on the rows' pairs, its checkpoints under `out`. Nothing is truncated (TRL's
    default cuts at 1024 tokens, and a prompt holds the conversation, the tools and the output whole): a batch is as
    long as its longest pair, so the warm-up's memory grows with the longest prompt of the export."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(out / "checkpoints"), max_steps=steps, learning_rate=learning_rate,
                     per_device_train_batch_size=batch_size, seed=seed, use_cpu=device == "cpu",
                     bf16=device == "cuda", logging_steps=max(1, steps // 10), save_strategy="no", report_to="none",
                     completion_only_loss=True, max_length=None, gradient_checkpointing=False,
                     model_init_kwargs={"dtype": "bfloat16" if device == "cuda" else "float32"})
    return SFTTrainer(model=base, args=args, train_dataset=Dataset.from_dict(pairs(rows)))


def warm_up(base: str, rows: Sequence[Mapping[str, Any]], out: Path, steps: int, learning_rate: float,
            batch_size: int, seed: int, device: str, settings: PromptSettings, max_new_tokens: int) -> Path:
    """Fine-tune `base` on the pairs for `steps` steps and save the whole model, its tokenizer and its reviser card
    to `out` (so that `model:OUT` works too). Under `accelerate launch` every process trains; the first saves, and
    none goes on before it has."""
    from tracemill.trainer.model_reviser import ReviserCard

    trainer = sft_trainer(base, rows, out, steps, learning_rate, batch_size, seed, device)
    trainer.train()
    trainer.save_model(str(out))
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(str(out))
        ReviserCard(str(out), "full", settings, max_new_tokens, {"warmup_steps": steps, "from": base}).save(out)
    trainer.accelerator.wait_for_everyone()
    return out
