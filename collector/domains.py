"""Keyword classification of a tool into a domain (medical and legal calls go to human review).

A tool name qualified as `Server Name:tool` (as MCP-Bench shows tools) weighs its server name most, then the tool's
own name, then its description, each counting once per domain it mentions; the domain with the highest score wins,
ties going to the first in `DOMAINS`.
"""

from __future__ import annotations

import re
from functools import lru_cache

from tracemill.tools import Tool

# Each fragment matches at the start of a word of the camelCase-split, lower-cased text.
_KEYWORDS: dict[str, tuple[str, ...]] = {
    "medical": (
        r"medic", r"clinic", r"drugs?\b", r"dos(?:e|es|age|ing)\b", r"patients?\b", r"diagnos", r"bmi\b", r"bsa\b",
        r"genes?\b", r"genetic", r"genom", r"myvariant", r"hgvs\b", r"bio ?mcp", r"biomedic", r"biomarker", r"disease",
        r"symptom", r"therap", r"pharma", r"prescri", r"healthcare", r"hospital", r"doctor", r"physician",
        r"nurs(?:e|es|ing)\b", r"egfr\b", r"creatinine", r"cardi(?:o|ac)", r"cancer", r"oncolog", r"tumou?r",
        r"fda\b", r"vaccin", r"allerg", r"insulin", r"glucose", r"kidney", r"renal\b", r"hepat", r"blood\b",
        r"pediatric", r"paediatric", r"pregnan", r"surg(?:ery|ical|eon)", r"mortality", r"adverse event",
    ),
    "legal": (
        r"legal", r"laws?\b", r"lawyer", r"attorney", r"court", r"contracts?\b", r"statut", r"complian", r"litigat",
        r"jurisdic", r"legislat", r"plaintiff", r"defendant", r"torts?\b", r"patent", r"trademark", r"copyright",
        r"subpoena", r"affidavit", r"notar", r"clauses?\b", r"gdpr\b", r"hipaa\b", r"case law", r"regulatory filing",
    ),
    "finance": (
        r"financ", r"stocks?\b", r"crypto", r"bitcoin", r"blockchain", r"liquidity", r"dex(?:es)?\b", r"ohlcv\b",
        r"candlestick", r"exchange rate", r"currenc", r"forex\b", r"trading", r"invest", r"portfolio", r"bank",
        r"loans?\b", r"mortgage", r"interest rate", r"tax(?:es)?\b", r"invoice", r"payment", r"accounting",
        r"okx\b", r"market cap", r"dividend", r"earnings", r"revenue", r"ticker", r"equit(?:y|ies)\b", r"bonds?\b",
        r"prices?\b", r"pricing",
    ),
    "weather": (
        r"weather", r"forecast", r"precipitation", r"rain(?:fall)?\b", r"humidity", r"wind speed", r"meteorolog",
        r"climate",
    ),
    "maps": (
        r"maps?\b", r"geocod", r"directions?\b", r"rout(?:e|es|ing)\b", r"navigat", r"latitude", r"longitude",
        r"coordinates", r"nearby", r"distance matrix", r"elevation", r"address(?:es)?\b", r"locations?\b",
        r"places?\b", r"national parks?\b", r"campgrounds?\b",
    ),
    "science": (
        r"scien", r"physic", r"chemi", r"biolog", r"astronom", r"asteroid", r"nasa\b", r"planet", r"exoplanet",
        r"solar\b", r"geomagnetic", r"matri(?:x|ces)\b", r"tensors?\b", r"eigen", r"integral", r"derivative",
        r"equations?\b", r"arxiv", r"academic", r"papers?\b", r"research", r"scholar", r"math",
        r"calculus", r"algebra", r"molecul", r"quantum", r"experiment",
    ),
}
DOMAINS: tuple[str, ...] = tuple(_KEYWORDS)
_PATTERNS = {domain: re.compile(r"\b(?:" + "|".join(words) + ")") for domain, words in _KEYWORDS.items()}
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NON_WORD = re.compile(r"[^a-z0-9]+")
_SERVER_WEIGHT, _NAME_WEIGHT, _DESCRIPTION_WEIGHT = 5, 3, 1


def call_domain(declared: str | None, tool: Tool | None, name: str | None) -> str | None:
    """A stored call's domain: the one its trace declares (`tracemill.domain`), else the tool's by its keywords."""
    return declared or classify_domain(tool, name)


def classify_domain(tool: Tool | None, name: str | None = None) -> str | None:
    """The domain of a tool (or of a bare tool name, when the tool is unknown); None when no keyword matches.
    `name` is the name as called and wins over `tool.name`."""
    full_name = name if name is not None else (tool.name if tool is not None else "")
    return _classify(full_name or "", tool.description if tool is not None else "")


@lru_cache(maxsize=8192)
def _classify(full_name: str, description: str) -> str | None:
    server, _, short_name = full_name.rpartition(":")
    scores = dict.fromkeys(DOMAINS, 0)
    for text, weight in ((server, _SERVER_WEIGHT), (short_name, _NAME_WEIGHT), (description, _DESCRIPTION_WEIGHT)):
        if not text:
            continue
        words = _NON_WORD.sub(" ", _CAMEL.sub(r"\1 \2", text).lower())
        for domain, pattern in _PATTERNS.items():
            if pattern.search(words):
                scores[domain] += weight
    best = max(DOMAINS, key=lambda d: scores[d])  # max keeps the first of equal scores: DOMAINS order breaks ties
    return best if scores[best] > 0 else None
