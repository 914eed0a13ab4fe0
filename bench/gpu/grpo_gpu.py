"""GRPO on one GPU with a Qwen3-0.6B-sized model built from a config (random weights; nothing is downloaded): LoRA on
and off, generation with transformers. Prints generation tokens/s, training tokens/s, seconds per step and peak GPU
memory per mode, and writes them as JSON. `--dry-run`: the same code on the CPU with a tiny model and one step.

    bench/gpu/run.sh               # on the GPU machine (installs TRL and the project from bench/gpu/wheels)
    bench/gpu/run.sh --dry-run     # here: the CPU dry run CI runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 4096}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 4096, "max_position_embeddings": 1024}


def build(folder: Path, dims: dict[str, Any], cuda: bool) -> Path:
    """A Qwen3 model of the given size with random weights, and a tokenizer trained here on tool-call text."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from tracemill.trainer.tiny import TinyModelSpec, corpus, train_tokenizer

    tokenizer = train_tokenizer(corpus(seeds=(0,)), TinyModelSpec(vocab_size=min(dims["vocab_size"], 8192)))
    config = Qwen3Config(**{**dims, "vocab_size": max(dims["vocab_size"], len(tokenizer))}, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16 if cuda else torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def rows(n: int) -> dict[str, list[Any]]:
    from tracemill.reviser_prompt import PromptSettings
    from tracemill.trainer.dataset import REWARD_COLUMNS
    from tracemill.trainer.fault_rows import fault_cases, prompt_row

    made = [prompt_row(c, PromptSettings(max_tools=2)) for c in fault_cases(0, max_calls=1)[:n]]
    return {k: [r[k] for r in made] for k in ("prompt", *REWARD_COLUMNS)}


def generation_rate(folder: Path, prompts: list[Any], new_tokens: int, cuda: bool) -> float:
    """Tokens a second from model.generate, sampling, on one batch of prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16 if cuda else torch.float32)
    model = model.to("cuda" if cuda else "cpu").eval()
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    with torch.inference_mode():
        model.generate(**inputs, max_new_tokens=4, do_sample=True)  # warm-up
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True)
        if cuda:
            torch.cuda.synchronize()
    made = (out.shape[1] - inputs["input_ids"].shape[1]) * out.shape[0]
    del model
    return made / (time.perf_counter() - start)


def grpo(folder: Path, data: dict[str, list[Any]], lora: bool, args: argparse.Namespace, cuda: bool,
         out: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from tracemill.trainer.rewards import DEFAULT_WEIGHTS, REWARD_FUNCTIONS, TERMS

    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    config = GRPOConfig(
        output_dir=str(out / ("lora" if lora else "full")), use_cpu=not cuda, bf16=cuda,
        per_device_train_batch_size=args.batch, num_generations=args.generations,
        max_completion_length=args.completion, max_steps=args.steps, learning_rate=1e-5 if not lora else 1e-4,
        logging_steps=1, save_strategy="no", report_to="none", gradient_checkpointing=cuda,
        reward_weights=[DEFAULT_WEIGHTS[t] for t in TERMS], model_init_kwargs={
            "dtype": torch.bfloat16 if cuda else torch.float32})
    trainer = GRPOTrainer(model=str(folder), reward_funcs=[REWARD_FUNCTIONS[t] for t in TERMS], args=config,
                          train_dataset=Dataset.from_dict(data),
                          peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM") if lora else None)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    timed = logs[1:] or logs  # the first step pays for compilation and allocation
    step_s = statistics.median(h["step_time"] for h in timed)
    tokens = [b["num_tokens"] - a["num_tokens"] for a, b in itertools.pairwise(logs)] or [logs[0]["num_tokens"]]
    result = {"mode": "lora" if lora else "full", "steps": len(logs), "s_per_step": step_s,
              "train_tokens_per_s": statistics.median(tokens) / step_s,
              "completion_mean_tokens": statistics.fmean(h["completions/mean_length"] for h in logs),
              "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
    del trainer
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="GRPO on one GPU: LoRA and full, tokens/s, memory, s/step")
    parser.add_argument("--dry-run", action="store_true", help="CPU, a tiny model, one step per mode")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64, help="completions per step (per_device_train_batch_size)")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    if args.dry_run:
        args.steps, args.batch, args.generations, args.completion = 1, 4, 2, 8
    elif not cuda:
        raise SystemExit("no GPU here: use --dry-run")
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(Path(tmp) / "model", TINY if args.dry_run else QWEN3_06B, cuda)
        data = rows(max(64, args.batch * args.steps // args.generations))
        params = sum(p.numel() for p in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
            folder / "model.safetensors").values())
        figures: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if cuda else "cpu (dry run)", "parameters": params,
            "torch": torch.__version__, "batch": args.batch, "generations": args.generations,
            "completion_tokens": args.completion,
            "generation_tokens_per_s": generation_rate(folder, data["prompt"][: args.batch], args.completion, cuda),
            "modes": [grpo(folder, data, lora, args, cuda, Path(tmp)) for lora in (True, False)]}
    for mode in figures["modes"]:
        memory = mode["peak_gpu_memory_gib"]
        print(f"{mode['mode']:>4}: {mode['s_per_step']:.2f} s/step, {mode['train_tokens_per_s']:.0f} training "
              f"tokens/s, peak GPU memory {'-' if memory is None else f'{memory:.1f} GiB'}")
    print(f"generation: {figures['generation_tokens_per_s']:.0f} tokens/s ({args.batch} sequences, transformers)")
    print(json.dumps(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
