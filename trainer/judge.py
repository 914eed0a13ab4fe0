"""The optional LLM judge reward: any OpenAI-compatible chat endpoint scores whether the recovered call serves the
user's request (0-10, scaled to 0-1). Off by default; a judge that cannot answer for one completion leaves its whole
group out (None for each of the prompt's completions: TRL would count a lone None as 0 beside its siblings' scores),
counted in the `judge_failed` metric, and never stops training."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tracemill.repair import revise
from tracemill.reviser_prompt import message_text
from tracemill.trainer.rewards import completion_text, row_from_columns

JUDGE_SYSTEM = ("You judge tool calls. Given a user's request and the tool call an assistant made for it, reply with "
                "one number from 0 to 10: 10 when the call does what the user asked with the values the user gave, "
                "0 when it does something else or uses values the user never gave.")
_SCORE = re.compile(r"\b(10|[0-9])(?:\.\d+)?\b")


class LLMJudge:
    """A TRL reward function: `judge(completions, raw, tools, context, ...)` -> one score in [0, 1] or None each, for
    a batch as TRL passes it: each prompt's `num_generations` completions in a row."""

    __name__ = "judge"

    def __init__(self, url: str, model: str, num_generations: int, timeout: float = 30.0, workers: int = 8) -> None:
        url = url.rstrip("/")
        self.chat_url = url if url.endswith("/chat/completions") else url + "/chat/completions"
        self.model = model
        self.num_generations = num_generations
        self.timeout = timeout
        self.workers = workers

    def ask(self, request: str, call: str) -> float | None:
        import httpx

        body = {"model": self.model, "temperature": 0, "max_tokens": 8, "messages": [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Request:\n{request}\n\nTool call:\n{call}\n\nScore:"}]}
        try:
            response = httpx.post(self.chat_url, json=body, timeout=self.timeout)
            response.raise_for_status()
            text = response.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None
        found = _SCORE.search(text)
        return int(found.group(1)) / 10 if found else None

    def __call__(self, completions: Sequence[Any], raw: Sequence[str], tools: Sequence[Any],
                 context: Sequence[Any] | None = None, log_metric: Callable[[str, float], None] | None = None,
                 **_: Any) -> list[float | None]:
        jobs: list[tuple[str, str] | float | None] = []  # a question for the judge, or the score without asking
        for i, completion in enumerate(completions):
            row = row_from_columns(raw[i], tools[i], context[i] if context else None)
            requests = [text for role, text in map(message_text, row.context or ()) if role in ("user", "human")]
            if not requests:
                jobs.append(None)  # nothing to judge the call against
                continue
            revision = revise(completion_text(completion), row.index, row.context)
            jobs.append((requests[-1], json.dumps([c.to_dict() for c in revision.calls], ensure_ascii=False))
                        if revision.calls else 0.0)
        asked = [j for j in jobs if isinstance(j, tuple)]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            answers = iter(list(pool.map(lambda job: self.ask(*job), asked)))
        scores = [next(answers) if isinstance(j, tuple) else j for j in jobs]
        failed = [s is None and isinstance(j, tuple) for s, j in zip(scores, jobs, strict=True)]
        if log_metric is not None and asked:
            log_metric("judge_failed", sum(failed) / len(asked))
        return self.without_failed_groups(scores, failed)

    def without_failed_groups(self, scores: list[float | None], failed: list[bool]) -> list[float | None]:
        """None for every completion of a group the judge failed on. TRL groups the batches of all processes, joined
        in process order, by position, so a group may straddle two processes: the failures are joined the same way."""
        from accelerate import PartialState
        from accelerate.utils import gather_object

        start = PartialState().process_index * len(scores)  # TRL gives every process a batch of the same size
        groups = {i // self.num_generations for i, f in enumerate(gather_object(failed)) if f}
        return [None if (start + i) // self.num_generations in groups else s for i, s in enumerate(scores)]
