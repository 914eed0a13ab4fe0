"""`model:PATH`: a reviser model trained by `tracemill train`, run with transformers.

PATH is the model folder a run saves (`OUTPUT/model`): the weights (a full model, or a LoRA adapter over the base
model it names) and `reviser.json`, which records the base, the kind and the `PromptSettings` the model was trained
with, so that it is always asked the way it learned. Like every reviser it keeps `revise`'s contract: the rules go
first, the model is asked only where they cannot make the output valid (or always, with `always`), and its answer is
kept only when it is valid (`tracemill.revisers.model_answer`); a call valid as sent is never changed.

For a model served behind an OpenAI-compatible endpoint (vLLM), use `endpoint:URL` with the same prompt settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracemill.repair import revise
from tracemill.reviser_prompt import PromptSettings, build_prompt
from tracemill.revisers import ReviserSpecError, model_answer
from tracemill.revision import Revision
from tracemill.tools import Tool

CARD = "reviser.json"


@dataclass(frozen=True, slots=True)
class ReviserCard:
    """What a model folder says about itself (`reviser.json`)."""

    base_model: str
    kind: str  # lora | full
    prompt_settings: PromptSettings
    max_new_tokens: int = 256
    extra: dict[str, Any] = field(default_factory=dict)  # dataset hash, run name, ...

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prompt_settings": self.prompt_settings.to_dict()}

    def save(self, folder: Path) -> None:
        (folder / CARD).write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))

    @classmethod
    def load(cls, folder: Path) -> ReviserCard:
        path = folder / CARD
        if not path.is_file():
            raise ReviserSpecError(f"model:{folder}: not a trained reviser (no {CARD}; `tracemill train` saves one "
                                   "beside the weights)")
        try:
            data = orjson.loads(path.read_bytes())
            return cls(str(data["base_model"]), str(data["kind"]), PromptSettings.from_dict(data["prompt_settings"]),
                       int(data.get("max_new_tokens", 256)), dict(data.get("extra") or {}))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ReviserSpecError(f"model:{folder}: {CARD} cannot be read ({exc!r})") from None


def load_model(folder: Path, card: ReviserCard, device: str | None = None):  # type: ignore[no-untyped-def]
    """(model, tokenizer) of a saved reviser, ready to generate; a LoRA adapter is merged into its base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if card.kind == "lora":
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(card.base_model, dtype=dtype)
        model = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return model.to(device).eval(), tokenizer


class ModelReviser:
    """The reviser `model:PATH` names (the factory the `tracemill.revisers` entry point points at)."""

    takes_argument = True
    spec_help = "a reviser model trained by `tracemill train` (its model folder)"

    def __init__(self, path: str, always: bool = False, device: str | None = None) -> None:
        self.folder = Path(path).expanduser()
        self.card = ReviserCard.load(self.folder)
        self.always = always
        try:
            self.model, self.tokenizer = load_model(self.folder, self.card, device)
        except ImportError as exc:
            raise ReviserSpecError(f"model:{path}: the model reviser needs the train extra "
                                   f"(pip install 'tracemill[train]'): {exc}") from None
        except OSError as exc:
            raise ReviserSpecError(f"model:{path}: cannot load the model ({exc})") from None

    def generate(self, messages: Sequence[Mapping[str, str]]) -> str:
        import torch

        inputs = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                                    return_dict=True, return_tensors="pt").to(self.model.device)
        with torch.inference_mode():
            output = self.model.generate(**inputs, max_new_tokens=self.card.max_new_tokens, do_sample=False,
                                         pad_token_id=self.tokenizer.pad_token_id)
        return self.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    def __call__(self, raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
        first = revise(raw, index, context)
        if first.ok and not (self.always and first.changed):
            return first
        prompt = build_prompt(raw, index, context, self.card.prompt_settings)
        answer = self.generate(prompt.to_list())
        return model_answer(first, raw, answer, index, context, f"the model reviser {self.folder}")
