"""Provenance for the results.json sections measured before the scripts recorded it.

    python benchmarks/provenance.py     # fills in what git history tells, then rewrites BENCHMARKS.md

Since ``report.store`` stamps every section it writes (commit, whether the code differed from it,
command, seeds, machine, time, wall time), this is for the older sections only: each gets the commit
that first stored its current measurement (found by walking results.json's history; the measured
code is that commit or the one before it), ``dirty: null`` (unknown), the command that writes the
section, the seeds and wall time where the section itself says them (else null), and
``backfilled: true``. Real-model runs and baselines, measured one by one, get the same per entry
under ``provenance``. A section that already carries a commit is left as it is; nothing measured
is changed.
"""

from __future__ import annotations

import json
import subprocess

from report import PROVENANCE, RESULTS, ROOT, load, write

# the command that writes each section (its script's documented entry point)
COMMANDS = {
    "collapse": "python benchmarks/collapse.py",
    "context_windows": "python benchmarks/learning.py windows",
    "critic_memory": "python benchmarks/critic_memory.py",
    "env_concurrency": "python benchmarks/env_concurrency.py",
    "envs": "python benchmarks/env_speed.py",
    "filter_strategies": "python benchmarks/learning.py strategies",
    "learning": "python benchmarks/learning.py ratios",
    "mi_pass": "python benchmarks/speed.py mi",
    "mi_warm_starts": "python benchmarks/collapse.py --start-mi",
    "multi_env": "python benchmarks/multi_env.py",
    "real_model": "python benchmarks/real_model.py",
    "speed": "python benchmarks/speed.py",
    "utilisation": "python benchmarks/utilisation.py",
    "whitening": "python benchmarks/whitening.py",
}


def history() -> list[tuple[str, str, dict]]:
    """``(commit, date, results)`` for every commit that changed results.json, oldest first."""
    path = str(RESULTS.relative_to(ROOT))
    log = subprocess.run(
        ["git", "log", "--reverse", "--format=%H %cd", "--date=format:%Y-%m-%d %H:%M UTC", "--", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    out = []
    for line in log:
        commit, date = line.split(" ", 1)
        text = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True).stdout
        try:
            out.append((commit, date, json.loads(text)))
        except json.JSONDecodeError:
            continue
    return out


def first_commit(past, find) -> tuple[str, str] | tuple[None, None]:
    """The first ``(commit, date)`` whose results ``find`` says hold the measurement."""
    for commit, date, results in past:
        if find(results):
            return commit, date
    return None, None


def backfilled(commit, date, machine, command, seeds, wall) -> dict:
    return {
        "commit": commit,
        "dirty": None,
        "command": command,
        "seeds": seeds,
        "machine": machine,
        "measured_at": date,
        "wall_seconds": wall,
        "backfilled": True,
    }


def _seed(flags: str) -> int:
    words = flags.split()
    return int(words[words.index("--seed") + 1]) if "--seed" in words else 0


def backfill() -> dict:
    results, past = load(), history()
    for key, section in results.items():
        if not isinstance(section, dict) or "commit" in section:
            continue
        when = section.get("measured_at")
        commit, _ = first_commit(past, lambda r: isinstance(r.get(key), dict) and r[key].get("measured_at") == when)
        walls = (
            [r.get("wall_seconds") for r in section.get("runs", {}).values()]
            if isinstance(section.get("runs"), dict)
            else []
        )
        wall = section.get("wall_seconds") or (round(sum(walls), 1) if walls and None not in walls else None)
        seeds = section.get("seeds")
        section.update(
            backfilled(commit, when, section.get("machine"), section.get("command", COMMANDS.get(key)), seeds, wall)
        )
        assert all(k in section for k in PROVENANCE), key
    real = results.get("real_model", {})
    for run in real.get("runs", []):
        if "provenance" in run:
            continue
        same = lambda r, run=run: any(  # noqa: E731
            (x.get("recipe"), x.get("flags", ""), x.get("success_after"))
            == (run["recipe"], run.get("flags", ""), run["success_after"])
            for x in r.get("real_model", {}).get("runs", [])
        )
        commit, date = first_commit(past, same)
        command = f"python benchmarks/real_model.py rl {run['recipe']} {run.get('flags', '')}".strip()
        run["provenance"] = backfilled(
            commit, date, real.get("machine"), command, [_seed(run.get("flags", ""))], run["wall_seconds"]
        )
    for env_id, base in real.get("baseline", {}).items():
        if "provenance" in base:
            continue
        same = lambda r, env_id=env_id, base=base: (
            r.get("real_model", {})
            .get("baseline", {})
            .get(env_id, {})
            .get(  # noqa: E731
                "success"
            )
            == base["success"]
        )
        commit, date = first_commit(past, same)
        command = f"python benchmarks/real_model.py baseline {env_id}"
        base["provenance"] = backfilled(commit, date, real.get("machine"), command, None, base.get("wall_seconds"))
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    write(results)
    return results


if __name__ == "__main__":
    backfill()
