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
# single mutants, by name: why each is equivalent (read with `mutmut show NAME`)
EQUIVALENT: dict[str, str] = {}


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


def why_equivalent(name: str, before: str, after: str) -> str | None:
    if name in EQUIVALENT:
        return EQUIVALENT[name]
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
