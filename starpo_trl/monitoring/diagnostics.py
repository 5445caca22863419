"""Echo-trap indicators: cheap measures of how varied the agent's reasoning is, on decoded text.

All are pure functions on lists of strings (one think text per trajectory), so they are tested on
hand-made text and cost microseconds per step:

- ``distinct_n``: distinct n-grams / all n-grams over the batch (1.0: no n-gram repeats).
- ``template_share``: share of texts equal to the batch's most common text once numbers are
  masked (the "echo trap": everyone writes the same template).
- ``ngram_jaccard``: overlap between this step's and the previous step's n-gram sets.

The dashboard of a finished (or running) run, with the collapse guard's events marked:

    python -m starpo_trl.monitoring.diagnostics plot RUN_DIR [--out dashboard.png]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
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


def load_run(run_dir: str) -> tuple[list[dict], list[dict] | None, str | None]:
    """``(log_history, guard events or None, env name or None)`` of a run directory.

    The log history comes from ``report.json`` (written by train.py), else ``trainer_state.json``,
    else the newest ``checkpoint-*/trainer_state.json``.
    """
    name = None
    report = os.path.join(run_dir, "report.json")
    states = [os.path.join(run_dir, "trainer_state.json")] + sorted(
        glob.glob(os.path.join(run_dir, "checkpoint-*", "trainer_state.json")),
        key=lambda p: int(p.split("-")[-1].split(os.sep)[0]),
        reverse=True,
    )
    if os.path.exists(report):
        with open(report) as f:
            data = json.load(f)
        history = data.get("log_history", [])
        from envs.contract import env_name

        name = env_name(data.get("env_id") or "") or None
    else:
        found = next((p for p in states if os.path.exists(p)), None)
        if found is None:
            raise FileNotFoundError(
                f"No report.json or trainer_state.json under {run_dir!r}: is it a train.py output_dir?"
            )
        with open(found) as f:
            history = json.load(f)["log_history"]
    events = None
    events_path = os.path.join(run_dir, "guard_events.json")
    if os.path.exists(events_path):
        with open(events_path) as f:
            events = json.load(f)
    return history, events, name


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        prog="python -m starpo_trl.monitoring.diagnostics", description="Training dashboards."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plot = sub.add_parser("plot", help="Draw success, reward std, entropy, grad norm and diversity with guard events.")
    plot.add_argument("run_dir")
    plot.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/dashboard.png)")
    args = parser.parse_args(argv)
    from starpo_trl.monitoring.plotting import env_names_from_history, plot_dashboard

    history, events, name = load_run(args.run_dir)
    # the training envs the history logs (report.json's env_id is the held-out env, which training may not play)
    envs = env_names_from_history(history) or ([name] if name else None)
    out = plot_dashboard(
        history,
        args.out or os.path.join(args.run_dir, "dashboard.png"),
        envs,
        events,
        title=os.path.basename(os.path.normpath(args.run_dir)),
    )
    print(out)
    return out


if __name__ == "__main__":
    main()
