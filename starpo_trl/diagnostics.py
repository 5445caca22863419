"""Echo-trap indicators: cheap measures of how varied the agent's reasoning is, on decoded text.

All are pure functions on lists of strings (one think text per trajectory), so they are tested on
hand-made text and cost microseconds per step:

- ``distinct_n``: distinct n-grams / all n-grams over the batch (1.0: no n-gram repeats).
- ``template_share``: share of texts equal to the batch's most common text once numbers are
  masked (the "echo trap": everyone writes the same template).
- ``ngram_jaccard``: overlap between this step's and the previous step's n-gram sets.
"""

from __future__ import annotations

import re
from collections import Counter

_NUMBER = re.compile(r"\d+(\.\d+)?")


def _ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    words = text.split()
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: list[str], n: int = 2) -> float:
    grams = [g for t in texts for g in _ngrams(t, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def template_share(texts: list[str]) -> float:
    if not texts:
        return 0.0
    masked = Counter(" ".join(_NUMBER.sub("#", t).lower().split()) for t in texts)
    return masked.most_common(1)[0][1] / len(texts)


def ngram_jaccard(texts: list[str], previous: list[str], n: int = 2) -> float:
    a = {g for t in texts for g in _ngrams(t, n)}
    b = {g for t in previous for g in _ngrams(t, n)}
    return len(a & b) / len(a | b) if a | b else 0.0


def reasoning_metrics(thinks: list[str | None], previous: list[str] | None = None) -> dict[str, float]:
    """Indicators over one step's think texts (``None``: the reply had no parseable think)."""
    present = [t for t in thinks if t]
    metrics = {
        "reasoning_rate": len(present) / len(thinks) if thinks else 0.0,
        "think_words": sum(len(t.split()) for t in present) / len(present) if present else 0.0,
        "distinct_2": distinct_n(present, 2),
        "template_share": template_share(present),
    }
    if previous is not None:
        metrics["similarity_to_previous_step"] = ngram_jaccard(present, previous)
    return metrics
