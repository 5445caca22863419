"""`make mutate`: mutation testing (mutmut) of the algorithms, the step skip, the masks and the MI statistics.

    python scripts/mutate.py            # mutmut run, then the kill rate per module into docs/testing.md
    python scripts/mutate.py --report   # the table again from the last run's results (mutants/)

mutmut (configured in pyproject.toml, ``[tool.mutmut]``) changes one thing at a time in each function
of the modules listed there (an operator, a constant, an argument dropped, ...), runs the unit tests
that call that function, and counts the mutant killed when one fails. A surviving mutant is either
a gap in the tests or a change that cannot alter behaviour (an equivalent mutant). The equivalent
ones are recognised here by the rules below, each with its reason, and listed in docs/testing.md;
the kill rate is killed / (mutants - equivalent), per module: a mutant that no unit test reaches
counts as not killed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "testing.md"
MUTMUT = pathlib.Path(sys.executable).with_name("mutmut")
TARGET = 0.90

# (pattern on the mutated line, pattern on the original line, why the change cannot alter behaviour)
RULES = [
    (r"nan_to_num\([^)]*nan=None", r"nan=0\.0", "`torch.nan_to_num`'s default `nan` is 0.0"),
    (r"nan_to_num\([^)]*, \)", r"nan=0\.0", "`torch.nan_to_num`'s default `nan` is 0.0"),
    (r"torch\.(zeros|ones)(_like)?\(.*dtype=None", r"dtype=torch\.float32", "torch's default dtype is float32"),
    (r"torch\.zeros\((?!.*dtype)", r"torch\.zeros\(.*dtype=torch\.float32", "torch's default dtype is float32"),
    (r"torch\.full\(.*pad_token_id, (dtype=None|\))", r"dtype=torch\.long", "`torch.full` with an int fill is int64"),
    (r"device=None", r"device=", "on a CPU every tensor is on the CPU (device placement on a GPU: not verified here)"),
    (r"\.to\(None\)", r"\.to\(", "`.to(None)` moves nothing; on a CPU the tensors are where they were built"),
    (r"(device=values\.device|torch\.float32), \)", r"device=values\.device\)", "on a CPU every tensor is on the CPU"),
    (r'float\("NAN"\)', r'float\("nan"\)', "`float()` reads 'nan' in any case"),
    (r"pad\(.*\], padding_side=", r"padding_value=0(\.0)?, padding_side=", "trl's `pad` pads with 0 by default"),
    (r"pad\(.*padding_value=0(\.0)?, \)$", r'padding_side="right"', "trl's `pad` pads on the right by default"),
]
# an argument dropped (its line gone, or only the call's closing parenthesis left): (original line, why)
DROPPED = [
    (r"^padding_value=0(\.0)?,$", "trl's `pad` pads with 0 by default"),
    (r'^padding_side="right",$', "trl's `pad` pads on the right by default"),
]
# single mutants, by name (mutmut numbers a function's mutants anew when the function changes: re-read these then)
_NAN_STD = (
    "the group std is NaN only when fewer than two rewards are valid, and such a group is constant: its scale is inf"
)
EQUIVALENT: dict[str, str] = {
    "starpo_trl.algorithms.advantages.x_bilevel_gae__mutmut_28": "every turn's advantage is written before it is read",
    "starpo_trl.algorithms.advantages.x_bilevel_gae__mutmut_63": "a turn's last token takes G - V; next_a is read first at the token before",
    "starpo_trl.algorithms.advantages.x_place_rewards__mutmut_14": "turn ends strictly increase: no two turns add to one position",
    "starpo_trl.algorithms.advantages.x_place_rewards__mutmut_16": "the tensor starts at 0: adding to it is setting it",
    "starpo_trl.algorithms.advantages.x_grpo_advantages__mutmut_55": "the std is NaN only for a group with fewer than two valid rewards, whose centred rewards are 0 (or NaN, set to 0 after)",
    "starpo_trl.algorithms.advantages.x_reward_normalization_terms__mutmut_53": "the mean is NaN only for an all-failed group, which is constant: scale inf, its rewards NaN either way",
    "starpo_trl.algorithms.advantages.x_reward_normalization_terms__mutmut_61": "a group of one is constant: its scale is inf either way",
    "starpo_trl.algorithms.advantages.x_reward_normalization_terms__mutmut_78": _NAN_STD,
    "starpo_trl.algorithms.critic_targets.x_critic_targets__mutmut_19": "padding rows hold no model token: the estimator masks any reward placed there",
    "starpo_trl.algorithms.critic_targets.x_gather_turn_rows__mutmut_5": "the width only pads a batch whose episodes hold no reply; scatter reads back the same zeros",
    "starpo_trl.algorithms.filters.x_select_groups__mutmut_86": "the softmax mass would have to equal value - 1e-12 exactly",
    "starpo_trl.algorithms.scoring.x_filter_groups__mutmut_51": "one env whatever its index: the per-env path needs two",
    "starpo_trl.algorithms.scoring.x_filter_groups__mutmut_56": "with one env the per-env path keeps the same groups in the same rank order as the global one",
    "starpo_trl.algorithms.stats.x_between_group_share__mutmut_48": "total 0 means between = 0: 0 / 0 in torch is NaN too",
    "starpo_trl.algorithms.stats.x_nanstd__mutmut_45": "with one value the variance is 0 / 0: NaN either way",
    "starpo_trl.algorithms.critic_targets.x_fit_critic__mutmut_3": "slice(None, n) is slice(0, n)",
    "starpo_trl.algorithms.critic_targets.x_fit_critic__mutmut_5": "slice(n) is slice(0, n)",
    "starpo_trl.monitoring.mi_statistics.xǁEMANormalizerǁ__call____mutmut_32": "count is only compared with 0 and 2, and after one value the variance is 0 either way",
    "starpo_trl.monitoring.mi_statistics.xǁEMANormalizerǁ__init____mutmut_3": "the first value overwrites the mean before it is read",
}


def config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def results() -> dict[str, dict[str, str]]:
    """``{module path: {mutant name: status}}`` from mutants/*.meta, in mutmut's words: killed, timeout
    (the tests ran far longer than on the clean code: counted as detected, as mutmut does), survived,
    no tests, ..."""
    from mutmut.stats import status_by_exit_code

    out = {}
    for module in config()["only_mutate"]:
        meta = ROOT / "mutants" / f"{module}.meta"
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        out[module] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return out


UNDETECTED = ("survived", "no tests", "skipped", "not checked")


def diff(name: str) -> tuple[str, str]:
    """The original and the mutated line of a mutant."""
    text = subprocess.run([str(MUTMUT), "show", name], cwd=ROOT, capture_output=True, text=True).stdout
    minus = [line[1:].strip() for line in text.splitlines() if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:].strip() for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return (minus[0] if minus else ""), (plus[0] if plus else "")


# (original text, mutated text, why): a mutant whose line is the original line with one such swap
SWAPS = [
    ("scale, eps)", "scale, )", "grpo_advantages' default eps is the same 1e-4"),
    ("nan=0.0", "nan=None", "`torch.nan_to_num`'s default `nan` is 0.0"),
    (", nan=0.0)", ", )", "`torch.nan_to_num`'s default `nan` is 0.0"),
    (", padding_value=0, padding_side", ", padding_side", "trl's `pad` pads with 0 by default"),
    (", padding_value=0.0, padding_side", ", padding_side", "trl's `pad` pads with 0 by default"),
    (', padding_side="right")', ", )", "trl's `pad` pads on the right by default"),
    (', padding_side="right"', ", )", "trl's `pad` pads on the right by default"),
    (
        "torch.tensor(ep.logprobs, dtype=torch.float32)",
        "torch.tensor(ep.logprobs, dtype=None)",
        "a list of Python floats, or an empty one, makes float32",
    ),
    (
        "torch.tensor(ep.logprobs, dtype=torch.float32)",
        "torch.tensor(ep.logprobs, )",
        "a list of Python floats, or an empty one, makes float32",
    ),
    (
        "torch.tensor(entropies, dtype=torch.float32)",
        "torch.tensor(entropies, dtype=None)",
        "entropies are Python floats: float32; group_scores casts anyway",
    ),
    (
        "torch.tensor(entropies, dtype=torch.float32)",
        "torch.tensor(entropies, )",
        "entropies are Python floats: float32; group_scores casts anyway",
    ),
    (
        "torch.tensor(lengths, dtype=torch.float32)",
        "torch.tensor(lengths, dtype=None)",
        "group_scores casts the lengths to float",
    ),
    (
        "torch.tensor(lengths, dtype=torch.float32)",
        "torch.tensor(lengths, )",
        "group_scores casts the lengths to float",
    ),
]


def why_equivalent(name: str, before: str, after: str) -> str | None:
    if name in EQUIVALENT:
        return EQUIVALENT[name]
    for original, mutated, reason in SWAPS:
        starts = [i for i in range(len(before)) if before.startswith(original, i)]
        if any(before[:i] + mutated + before[i + len(original) :] == after for i in starts):
            return reason
    if after in ("", ")"):
        for original, reason in DROPPED:
            if re.search(original, before):
                return reason
    for mutated, original, reason in RULES:
        if re.search(mutated, after) and re.search(original, before):
            return reason
    return None


def report() -> dict:
    rows, equivalents, survivors = [], [], []
    for module, codes in results().items():
        killed = sum(1 for c in codes.values() if c not in UNDETECTED)
        no_tests = sum(1 for c in codes.values() if c in ("no tests", "skipped", "not checked"))
        equivalent = 0
        for name in sorted(n for n, c in codes.items() if c == "survived"):
            before, after = diff(name)
            reason = why_equivalent(name, before, after)
            short = name.split(".")[-1]
            if reason:
                equivalent += 1
                equivalents.append((module, short, before, after, reason))
            else:
                survivors.append((module, short, before, after))
        counted = len(codes) - equivalent  # a mutant no unit test reaches counts as not killed
        rate = killed / counted if counted else float("nan")
        rows.append((module, len(codes), killed, equivalent, no_tests, counted - killed - no_tests, rate))
    total_killed = sum(r[2] for r in rows)
    total_counted = sum(r[2] + r[4] + r[5] for r in rows)
    summary = {"rows": rows, "killed": total_killed, "counted": total_counted, "rate": total_killed / total_counted}
    write_doc(summary, equivalents, survivors)
    return summary


def _cell(code: str) -> str:
    return "`" + code.replace("|", "\\|").replace("`", "'")[:100] + "`"


def write_doc(summary: dict, equivalents: list, survivors: list) -> None:
    lines = [
        f"Measured by `make mutate` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit "
        f"{subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}"
        f"): **{100 * summary['rate']:.1f}%** of the non-equivalent mutants killed (target {100 * TARGET:.0f}%).",
        "",
        "| module | mutants | killed (or timed out) | equivalent | no unit test reaches it | survived | kill rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for module, n, killed, equivalent, no_tests, survived, rate in summary["rows"]:
        lines.append(f"| `{module}` | {n} | {killed} | {equivalent} | {no_tests} | {survived} | {100 * rate:.1f}% |")
    lines += ["", "Survivors (each a gap in the tests, or an equivalent mutant not yet recognised):", ""]
    if survivors:
        lines += ["| module | mutant | original | mutated |", "|---|---|---|---|"]
        lines += [f"| `{m}` | {n} | {_cell(b)} | {_cell(a)} |" for m, n, b, a in survivors]
    else:
        lines.append("None.")
    lines += ["", "Equivalent mutants (the change cannot alter behaviour):", ""]
    lines += ["| module | mutant | mutated | why equivalent |", "|---|---|---|---|"]
    lines += [f"| `{m}` | {n} | {_cell(a)} | {r} |" for m, n, _, a, r in equivalents]
    text = DOC.read_text()
    start, end = "<!-- mutate:results -->", "<!-- /mutate:results -->"
    head, rest = text.split(start, 1)
    DOC.write_text(head + start + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="store_true", help="only the table, from the last run's results")
    p.add_argument("--max-children", type=int, default=2)
    args = p.parse_args(argv)
    if not args.report:
        start = time.time()
        # from scratch: mutmut keeps which tests call which function from its last run for test files it deems
        # unchanged, so a function added since is checked only against the tests added with it
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        log = ROOT / "mutants.log"
        with open(log, "w") as f:
            subprocess.run(
                [str(MUTMUT), "run", "--max-children", str(args.max_children)],
                cwd=ROOT,
                stdout=f,
                stderr=f,
                check=True,
            )
        print(f"mutmut run: {time.time() - start:.0f} s (log: {log.name})")
    summary = report()
    for module, n, killed, equivalent, no_tests, survived, rate in summary["rows"]:
        print(
            f"{module:45s} {n:5d} mutants, {killed:5d} killed, {equivalent:4d} equivalent, {survived:4d} survived: {100 * rate:.1f}%"
        )
    print(f"kill rate {100 * summary['rate']:.1f}% (target {100 * TARGET:.0f}%); survivors in {DOC.relative_to(ROOT)}")
    return 0 if summary["rate"] >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
