"""Does GRPO with the verifier reward beat the supervised warm-up that learned to copy? A tiny model on this machine's
CPU, within about 30 minutes for three seeds.

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/train_cpu.py --out /tmp/train-cpu
    .venv/bin/python bench/train_cpu.py --out /tmp/train-cpu-smoke --quick     # a one-minute smoke run

Data: RL prompt rows from the fault library (`tracemill.trainer.fault_rows.sampled_cases`: 3,000 calls with sampled
values to 11 small BFCL tools, written under the weak-model profiles), compact prompts
(`tracemill.trainer.tiny.COMPACT`); every faulty case and a third as many valid ones; a seeded 15 % held out as the
eval split. The model: `tracemill.trainer.tiny` at 96 wide, 3 layers, its tokenizer trained on these rows. Per seed:

1. warm-up: supervised fine-tuning on (prompt, answer) pairs (`tracemill.trainer.warmup`) of the train split, with
   the HELD_OUT fault kinds left out;
2. GRPO (`tracemill.trainer.run.train`, the product's own path) on the whole train split, from the warm-up's model.

After each stage the model alone answers every eval prompt (greedy) and its answer is read as the served reviser reads
it: verified ok, reference match (BFCL AST), invalid inputs copied unchanged, valid inputs changed; overall and on the
held-out kinds. Also `tracemill eval` of `model:DIR` (rules first, the model only where they fail) beside `rules`.
Writes results.json and reward_curve.png to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HELD_OUT = ("pythonic", "python_tag")  # fault kinds the warm-up never sees


def build_data(out: Path, quick: bool) -> Path:
    import random

    from tracemill.trainer.fault_rows import sampled_cases, write_rows
    from tracemill.trainer.tiny import COMPACT

    cases = sampled_cases(3000, seed=0)
    faulty = [c for c in cases if c.faults]
    valid = [c for c in cases if not c.faults]
    random.Random(0).shuffle(valid)
    chosen = faulty + valid[: len(faulty) // 3]
    if quick:
        chosen = chosen[:160]
    return write_rows(out / "data", chosen, COMPACT, eval_share=0.15, seed=0)


def corpus_of(data: Path) -> list[str]:
    """What the bench's tokenizer learns from: the reviser's system prompt, and every row's prompt and answer."""
    from tracemill.reviser_prompt import SYSTEM
    from tracemill.trainer.warmup import answer

    texts = [SYSTEM]
    for name in ("train.jsonl", "eval.jsonl"):
        for line in (data / name).read_text().splitlines():
            row = json.loads(line)
            texts += [m["content"] for m in row["prompt"]] + [answer(row) or ""]
    return texts


def generate(model_dir: Path, prompts: list[list[dict[str, str]]], max_new_tokens: int, batch: int = 32) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for start in range(0, len(prompts), batch):
        texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
                 for p in prompts[start:start + batch]]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            ids = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        out += tokenizer.batch_decode(ids[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def model_alone(model_dir: Path, rows: list[dict[str, Any]], max_new_tokens: int) -> dict[str, Any]:
    """The model's own answers, read as the served reviser reads them (`tracemill.trainer.rewards.score`)."""
    from tracemill.trainer.rewards import row_from_columns, score

    answers = generate(model_dir, [r["prompt"] for r in rows], max_new_tokens)
    figures: dict[str, Any] = {}
    scored = []
    for r, answer in zip(rows, answers, strict=True):
        s = score(answer, row_from_columns(r["raw"], r["tools"], r["context"], r["reference"], r["valid"]))
        ok = s.parses == 1 and s.tool_name == 1 and s.schema == 1
        scored.append((r, s, ok))
    for name, pick in (("all", lambda r: True), ("held_out", lambda r: bool(set(r["faults"]) & set(HELD_OUT))),
                       ("warmed_up_faults", lambda r: bool(r["faults"]) and not set(r["faults"]) & set(HELD_OUT))):
        part = [(r, s, ok) for r, s, ok in scored if pick(r)]
        figures[name] = {
            "rows": len(part),
            "verified_ok": _share([ok for _, _, ok in part]),
            "reference_match": _share([s.reference_match == 1.0 for _, s, _ in part if s.reference_match is not None]),
            "invalid_copied": _share([s.copied_invalid for r, s, _ in part if not r["valid"]]),
            "valid_changed": _share([s.preserve_valid < 0 for _, s, _ in part if s.preserve_valid is not None]),
            "ungrounded_values": _share([s.grounding < 0 for _, s, ok in part if ok]),
        }
    figures["examples"] = [{"raw": r["raw"], "answer": a} for r, a in zip(rows[:6], answers[:6], strict=True)]
    return figures


def with_rules(model_dir: Path, data: Path) -> dict[str, Any]:
    from tracemill.evaluation import evaluate
    from tracemill.revisers import rules_reviser
    from tracemill.suites import read_cases
    from tracemill.trainer.model_reviser import ModelReviser

    report = evaluate(read_cases(data / "eval.jsonl"), {"rules": rules_reviser, "model": ModelReviser(str(model_dir))})
    return {m.reviser: {"verified_ok": m.ok_rate, "reference_match": m.reference_match,
                        "valid_changed": m.valid_changed} for m in report.metrics}


def run_seed(seed: int, base: Path, data: Path, out: Path, sft_steps: int, grpo_steps: int,
             completion: int) -> dict[str, Any]:
    from tracemill.trainer.config import TrainConfig
    from tracemill.trainer.dataset import EVAL, load_rows
    from tracemill.trainer.run import make_plan, train
    from tracemill.trainer.warmup import warm_up

    rows = load_rows(data)
    held = rows.read(EVAL)
    seen = [r for r in rows.read() if not set(r["faults"]) & set(HELD_OUT)]
    result: dict[str, Any] = {"seed": seed}
    start = time.perf_counter()
    sft = warm_up(str(base), seen, out / "sft", sft_steps, 3e-3, 16, seed, "cpu", rows.prompt_settings, completion)
    result["sft_seconds"] = time.perf_counter() - start
    result["sft"] = model_alone(sft, held, completion)
    result["sft_with_rules"] = with_rules(sft, data)
    config = TrainConfig.model_validate({
        "device": "cpu", "model": {"base": str(sft), "kind": "full"}, "data": {"dataset": str(data)},
        "grpo": {"num_generations": 8, "per_device_batch_size": 16, "max_completion_length": completion,
                 "learning_rate": 3e-4, "max_steps": grpo_steps, "seed": seed, "temperature": 1.0},
        "output": {"dir": str(out / "grpo"), "save_steps": max(grpo_steps, 1), "register_model": False,
                   "logging_steps": 1},
        "eval": {"enabled": False}})
    start = time.perf_counter()
    outcome = train(make_plan(config))
    result["grpo_seconds"] = time.perf_counter() - start
    assert outcome.model_dir is not None
    result["grpo"] = model_alone(outcome.model_dir, held, completion)
    result["grpo_with_rules"] = with_rules(outcome.model_dir, data)
    result["curve"] = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    return result


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for result in results:
        curve = [c for c in result["curve"] if "reward" in c]
        steps = [c["step"] for c in curve]
        for ax, key in zip(axes, ("reward", "rewards/reference_match/mean", "frac_reward_zero_std"), strict=True):
            values = [c.get(key) for c in curve]
            window = 5
            smooth = [statistics.fmean([v for v in values[max(0, i - window + 1):i + 1] if v is not None] or [0])
                      for i in range(len(values))]
            ax.plot(steps, smooth, label=f"seed {result['seed']}")
    for ax, title in zip(axes, ("total reward (5-step mean)", "reference match term", "share of all-tied groups"),
                         strict=True):
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("GRPO on mined prompts, tiny model on CPU, after the supervised warm-up")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _cell(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    per_seed = " / ".join(f"{100 * v:.0f}" for v in known)
    return f"{100 * statistics.fmean(known):.1f} % ({per_seed})"


def markdown(summary: dict[str, Any]) -> str:
    """The report's tables: each figure's mean over seeds, and each seed's value, after each stage."""
    results = summary["results"]
    lines = [(f"seeds {', '.join(map(str, summary['seeds']))}; {summary['sft_steps']} warm-up steps, "
              f"{summary['grpo_steps']} GRPO steps; {summary['seconds'] / 60:.1f} minutes in all"), ""]
    for part, title in (("all", "every eval row"), ("held_out", f"rows with a held-out kind ({', '.join(HELD_OUT)})"),
                        ("warmed_up_faults", "faulty rows whose kinds the warm-up saw")):
        rows = results[0]["sft"][part]["rows"]
        lines += [f"The model alone, {title} ({rows} rows):", "",
                  "| after | verified ok | reference match | invalid inputs copied | valid inputs changed |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for stage, label in (("sft", "warm-up (SFT)"), ("grpo", "GRPO")):
            cells = [_cell([r[stage][part][key] for r in results])
                     for key in ("verified_ok", "reference_match", "invalid_copied", "valid_changed")]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["As a reviser (`model:DIR`: the rules first, the model where they fail), every eval row:", "",
              "| reviser | verified ok | reference match | valid inputs changed |", "| --- | ---: | ---: | ---: |"]
    for key, label in (("sft_with_rules", "warm-up model"), ("grpo_with_rules", "GRPO model")):
        for reviser in ("rules", "model"):
            if reviser == "rules" and key == "grpo_with_rules":
                continue
            cells = [_cell([r[key][reviser][m] for r in results])
                     for m in ("verified_ok", "reference_match", "valid_changed")]
            lines.append(f"| {'rules' if reviser == 'rules' else label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", action="store_true", help="only print the tables of OUT/results.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--grpo-steps", type=int, default=100)
    parser.add_argument("--completion", type=int, default=48, help="max completion tokens")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of about a minute")
    args = parser.parse_args()
    if args.report:
        print(markdown(json.loads((args.out / "results.json").read_text())))
        return
    if args.quick:
        args.seeds, args.sft_steps, args.grpo_steps, args.completion = args.seeds[:1], 10, 2, 24
    from tracemill.trainer.tiny import TinyModelSpec, build_tiny_model

    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    data = build_data(args.out, args.quick)
    spec = TinyModelSpec(hidden_size=96, layers=3, intermediate_size=288)
    base = build_tiny_model(args.out / "tiny", spec, corpus_of(data))
    results = []
    for seed in args.seeds:
        results.append(run_seed(seed, base, data, args.out / f"seed{seed}", args.sft_steps, args.grpo_steps,
                                args.completion))
        print(json.dumps({k: results[-1][k] for k in ("seed", "sft", "grpo")}, indent=1), flush=True)
    summary = {"held_out_kinds": HELD_OUT, "seeds": args.seeds, "sft_steps": args.sft_steps,
               "grpo_steps": args.grpo_steps, "seconds": time.perf_counter() - started,
               "card": json.loads((data / "dataset.json").read_text()), "results": results}
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    plot(results, args.out / "reward_curve.png")
    print(markdown(summary))
    print(f"{args.out}/results.json, reward_curve.png ({summary['seconds']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
