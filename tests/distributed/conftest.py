import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# the 2-process Bandit runs start from this warm start, so that rewards differ within groups
WARM_START = {"warm_start_episodes": 1200, "warm_start_epochs": 2, "warm_start_noise": 0.5, "num_start_states": 4}


@pytest.fixture(scope="session")
def warm_bandit(tmp_path_factory, worker_id):
    """The CPU demo's tiny model warm-started on Bandit (WARM_START), built once per test session and shared by
    the pytest-xdist workers (the first one builds it under a file lock), so that each 2-process launch does not
    repeat the same SFT in both of its processes."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent  # the parent is this session's, shared by its workers
    path = root / "warm-bandit"
    with FileLock(str(root / "warm-bandit.lock")):
        if not (path / "model.safetensors").exists():
            from trl import ModelConfig, TrlParser

            from starpo_trl import StarPOConfig
            from starpo_trl.config import RunArguments
            from starpo_trl.models import TinyModelArguments, load_model_and_tokenizer
            from starpo_trl.warm_start import warm_start_from_config

            recipe = yaml.safe_load((ROOT / "recipes/demo-cpu-bandit.yaml").read_text())
            parser = TrlParser((RunArguments, StarPOConfig, ModelConfig, TinyModelArguments))
            run_args, args, model_args, tiny_args = parser.parse_dict(
                {**recipe, **WARM_START, "output_dir": str(path), "report_to": "none"}
            )
            model, tokenizer = load_model_and_tokenizer(model_args, tiny_args, seed=args.seed)
            model = warm_start_from_config(model, tokenizer, run_args, args, str(path / "sft"))
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
    return path
