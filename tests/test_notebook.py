"""notebooks/colab_lora.ipynb executed end to end on CPU with nbclient: every cell a Colab user runs (install from the
checkout it sits in, train, the dashboard and completions table, evaluation), with the offline SmolLM2-135M-Instruct
for one step (a LoRA adapter, as on Colab, whose base evaluate.py loads from its directory).
Left out: `pip install` (the test runs in the installed checkout), `nvidia-smi`, and the Hub cell (tagged `hub`:
it needs a login)."""

import os
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = (
    "--dtype float32 --fp16 false --use_cpu true --report_to none "
    "--gradient_checkpointing false --max_steps 1 --num_start_states 2 --num_generations 2 --rollout_filter_ratio 1.0 "
    "--per_device_train_batch_size 4 --gradient_accumulation_steps 1 --max_turns 1 --max_tokens_per_turn 8 "
    "--max_episode_tokens 64 --num_eval_episodes 2"
)


def test_the_colab_notebook_runs_end_to_end_on_cpu(tmp_path, monkeypatch):
    from starpo_trl.offline_model import build

    flags = f"--model_name_or_path {build()} {SMALL}"
    nb = nbformat.read(ROOT / "notebooks" / "colab_lora.ipynb", as_version=4)
    cells = []
    for cell in nb.cells:
        if "hub" in cell.metadata.get("tags", []):
            continue
        if cell.cell_type == "code":
            lines = [line for line in cell.source.splitlines() if not line.startswith(("!pip install", "!nvidia-smi"))]
            cell.source = (
                "\n".join(lines)
                .replace("--config recipes/colab-lora.yaml", f"--config recipes/colab-lora.yaml {flags}")
                .replace("--num_episodes 128", "--num_episodes 2")
            )
        cells.append(cell)
    nb.cells = cells
    work = tmp_path / "checkout"  # a clone's layout: the notebook finds train.py here and stays
    (work / "notebooks").mkdir(parents=True)
    for name in ("train.py", "evaluate.py", "recipes"):
        (work / name).symlink_to(ROOT / name)
    # the kernel's `!python` is this environment's python, one thread per torch op (tests run two at a time)
    monkeypatch.setenv("PATH", f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work / "notebooks")}}
    )
    client.execute()  # a Python cell that fails raises here (the dashboard and the completions table included)
    run = work / "runs" / "colab-lora-sokoban"
    assert (
        (run / "dashboard.png").exists() and (run / "report.json").exists() and (run / "adapter_config.json").exists()
    )
    outputs = ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells if c.cell_type == "code"]
    train_out = next(o for o in outputs if "starpo/Sokoban-v0: success" in o)
    assert "held-out episodes per env" in train_out
    eval_out = outputs[-1]
    assert "success" in eval_out and "Traceback" not in eval_out
