"""`tracemill tiny-model`: a small Qwen3-style causal LM built from a config, with a byte-level BPE tokenizer trained
here on tool-call text, and a ChatML chat template, saved in Hugging Face format. Nothing is downloaded.

The tokenizer learns from reviser prompts and answers made from the fault library (`tracemill.trainer.fault_rows`:
BFCL and MCP-Bench calls, their corrupted forms, the tool lines and conversations around them). Its merges may cross
spaces and punctuation (not newlines, backslashes or digits), so the schema fragments and JSON punctuation that fill
these prompts become single tokens and a compact prompt stays short: what makes a CPU training run affordable. The
weights are random: the model is for tests, benchmarks and the demo, not for use.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from tracemill.reviser_prompt import SYSTEM, PromptSettings

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
# The prompt settings that keep a tiny model's prompts short: the tool the output names, no descriptions.
COMPACT = PromptSettings(max_tools=1, budget_tokens=48, descriptions=False, parameter_descriptions=False, system=False)


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    vocab_size: int = 4096
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 192
    max_positions: int = 1024
    max_token_chars: int = 24
    seed: int = 0


def corpus(seeds: Sequence[int] = (0, 1), settings: Sequence[PromptSettings] = (COMPACT, PromptSettings())
           ) -> Iterator[str]:
    """Tool-call text: reviser prompts in the given settings, the raw outputs and the reference calls."""
    import orjson

    from tracemill.trainer.fault_rows import fault_cases, prompt_row

    yield SYSTEM
    for seed in seeds:
        for case in fault_cases(seed):
            for i, setting in enumerate(settings):
                if i and seed:
                    continue
                row = prompt_row(case, setting)
                yield from (m["content"] for m in row["prompt"])
            for call in case.reference or ():
                yield orjson.dumps(call.to_dict()).decode()


def train_tokenizer(texts: Iterable[str], spec: TinyModelSpec):  # type: ignore[no-untyped-def]
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Newlines stand alone, so that no token crosses from a prompt into its answer (a chat turn's header ends in one);
    # so do backslashes and digits, so that a number is the same tokens in a broken output and in its fix (`\"27\"`
    # and `27` share `2`, `7`) and an answer can copy it.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r'[\n\\]'), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  max_token_length=spec.max_token_chars, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=spec.max_positions)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out: Path, spec: TinyModelSpec = TinyModelSpec(), texts: Iterable[str] | None = None) -> Path:
    """Train the tokenizer (on `texts`, by default the `corpus`), build the model from a config with seeded random
    weights, and save both to `out`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = train_tokenizer(iter(texts) if texts is not None else corpus(), spec)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden_size // spec.heads, max_position_embeddings=spec.max_positions, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


_DEFAULT = TinyModelSpec()


@click.command("tiny-model")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder to save it in.")
@click.option("--vocab-size", default=_DEFAULT.vocab_size, show_default=True)
@click.option("--hidden-size", default=_DEFAULT.hidden_size, show_default=True)
@click.option("--layers", default=_DEFAULT.layers, show_default=True)
@click.option("--seed", default=_DEFAULT.seed, show_default=True)
def tiny_model(out: Path, vocab_size: int, hidden_size: int, layers: int, seed: int) -> None:
    """Build a tiny Qwen3-style model and its tokenizer (trained here on tool-call text), for tests and the demo."""
    spec = TinyModelSpec(vocab_size=vocab_size, hidden_size=hidden_size, layers=layers, seed=seed,
                         intermediate_size=3 * hidden_size)
    if hidden_size % spec.heads:
        raise click.BadParameter(f"must be a multiple of {spec.heads}", param_hint="--hidden-size")
    build_tiny_model(out, spec)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    click.echo(f"{out}: {asdict(spec)} ({size / 1e6:.1f} MB)")
