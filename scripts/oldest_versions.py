"""Run the trainer's core tests on the OLDEST versions pyproject.toml allows.

CI installs the newest release in every range, so a range's floor is otherwise never run: a floor that
no longer works (an API renamed since, a release that does not import with the others) passes CI and
breaks for the user who has that version. This installs each pinned library's floor (``name>=X`` in
``[project] dependencies``) into ``.floors/`` (``pip --no-deps --target``; the rest of the venv as it
is), checks that exactly those versions are the ones imported, then runs the core tests on them.

    python scripts/oldest_versions.py          # make test-floors
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = ROOT / ".floors"
# the libraries whose APIs the trainer, rollouts, LoRA path and envs call
LIBRARIES = ("transformers", "trl", "peft", "accelerate", "datasets", "gymnasium")
TESTS = (
    "tests/test_trainer.py",
    "tests/test_peft.py",
    "tests/test_trl_private.py",
    "tests/rollout/test_rollout.py",
    "tests/rollout/test_real_model.py",
    "tests/envs/test_envs.py",
    # the MI pass's shared prefix passes the model's cache by the name that version gives it
    "tests/monitoring/test_mutual_info.py::test_cross_logprobs_equal_single_forward_passes",
    "tests/monitoring/test_mutual_info.py::test_cross_logprobs_makes_the_counted_forward_passes",
)


def floors(pyproject: pathlib.Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{name: floor}`` for each of ``LIBRARIES`` from ``name>=X`` in the project's dependencies."""
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject.read_text(), re.S | re.M).group(1)
    found = {}
    for spec in re.findall(r'"([^"]+)"', block):
        req = Requirement(spec)
        lows = [s.version for s in req.specifier if s.operator == ">="]
        if req.name.lower() in LIBRARIES and lows:
            found[req.name.lower()] = lows[0]
    missing = [name for name in LIBRARIES if name not in found]
    if missing:
        raise SystemExit(f"pyproject.toml gives no 'name>=X' floor for {missing}")
    return found


def main() -> int:
    pins = floors()
    print("floors:", ", ".join(f"{k}=={v}" for k, v in pins.items()), flush=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(TARGET)]
        + [f"{k}=={v}" for k, v in pins.items()],
        check=True,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TARGET), str(ROOT)])}
    check = "from packaging.version import Version\n" + "\n".join(
        f"import {k}\nassert Version({k}.__version__) == Version({v!r}), ({k!r}, {k}.__version__)"
        for k, v in pins.items()
    )
    subprocess.run([sys.executable, "-c", check], env=env, check=True)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", *TESTS], env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
