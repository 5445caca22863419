import json
import pathlib
import subprocess
import sys

import pytest
import yaml
from helpers import TINY_LORA_FLAGS

from starpo_trl.rollout import RolloutConfig, RolloutEngine, StartState
from starpo_trl.rollout.prompting import parse_reply
from starpo_trl.warm_start import demonstrations

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _demos(tokenizer, seeds, noise, cfg, actions_per_turn=1, seed=0):
    return demonstrations(
        tokenizer,
        [tokenizer.eos_token_id],
        "starpo/FrozenLake-v0",
        {"is_slippery": False},
        seeds,
        noise,
        cfg,
        actions_per_turn,
        seed,
    )


def test_demonstrations_are_engine_episodes_with_expert_replies(tiny_tokenizer, scripted):
    """The engine plays the demonstrations (ExpertBackend in place of a model): the same replies fed
    to the engine by a scripted backend give the same messages and the same tokens; the mask is 1
    on exactly the replies and their end-of-turn token."""
    cfg = RolloutConfig(max_turns=4)
    (demo,) = _demos(tiny_tokenizer, [3], 0.5, cfg, actions_per_turn=2, seed=1)
    replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
    assert len(replies) >= 2 and all(parse_reply(r).format_ok for r in replies)
    assert any("||" in r for r in replies)  # two actions per turn, planned on a copy of the env
    eng = RolloutEngine(tiny_tokenizer, scripted(lambda call, i: replies[call]), cfg, [tiny_tokenizer.eos_token_id])
    ep = eng.run([StartState("starpo/FrozenLake-v0", 3, (("is_slippery", False),))])[0]
    assert [m for m in demo["messages"] if m["role"] != "system"] == ep.messages
    assert demo["input_ids"] == ep.prompt_ids + ep.completion_ids
    assert demo["assistant_masks"] == [0] * len(ep.prompt_ids) + ep.env_mask
    masked = [t for t, m in zip(demo["input_ids"], demo["assistant_masks"]) if m]
    assert tiny_tokenizer.decode(masked) == "".join(r + tiny_tokenizer.eos_token for r in replies)
    # the noise-free expert solves it
    (full,) = _demos(tiny_tokenizer, [7], 0.0, RolloutConfig(max_turns=10, max_actions_per_episode=10))
    assert full["success"]


def test_noisy_demonstrations_are_worse_than_clean_ones(tiny_tokenizer):
    cfg = RolloutConfig(max_turns=5)
    clean = _demos(tiny_tokenizer, range(60), 0.0, cfg, actions_per_turn=2)
    noisy = _demos(tiny_tokenizer, range(60), 0.8, cfg, actions_per_turn=2)
    assert sum(clean["success"]) > sum(noisy["success"]) + 10


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_warm_start_follows_the_runs_gradient_checkpointing(tmp_path, tiny_tokenizer, fresh_model, checkpointing):
    """The SFT warm start trades memory for compute as the run does (TRL's configs turn checkpointing on by
    default; the demo recipes turn it off), and the trade never changes the weights it gives."""
    import torch
    from helpers import make_args
    from trl import SFTTrainer

    import starpo_trl.warm_start as ws
    from starpo_trl.config import RunArguments
    from starpo_trl.tiny import build_tiny_model

    seen = []
    original = SFTTrainer.train

    def train(self, *a, **k):
        out = original(self, *a, **k)
        seen.append((self.args.gradient_checkpointing, self.model.is_gradient_checkpointing))
        return out

    args = make_args(tmp_path, gradient_checkpointing=checkpointing, env_id="starpo/FrozenLake-v0")
    run = RunArguments(warm_start_episodes=8, warm_start_batch_size=4, warm_start_epochs=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SFTTrainer, "train", train)
        trained = ws.warm_start_from_config(fresh_model, tiny_tokenizer, run, args, str(tmp_path / "ws"))
    assert seen == [(checkpointing, checkpointing)]
    other = make_args(tmp_path, gradient_checkpointing=not checkpointing, env_id="starpo/FrozenLake-v0")
    again = ws.warm_start_from_config(
        build_tiny_model(tiny_tokenizer, seed=1), tiny_tokenizer, run, other, str(tmp_path / "ws2")
    )
    for a, b in zip(trained.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


# the recipes to start from (recipes/) and the tries of the experiments' recipe searches (experiments/recipes/)
RECIPE_FILES = sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "experiments/recipes").glob("*.yaml"))


@pytest.mark.parametrize("recipe", RECIPE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipes_parse(recipe):
    import train

    config = yaml.safe_load(recipe.read_text())
    config.pop("bf16", None)  # recipes for GPUs ask for bf16 or fp16, which this CPU cannot check
    config.pop("fp16", None)
    config.pop("use_cpu", None)
    run_args, args, model_args, _ = train.parser().parse_dict(config)
    first = config["env_id"] if "env_id" in config else config["env_configs"][0]["env_id"]  # several envs: the first
    assert args.env_id == first and model_args.model_name_or_path == config["model_name_or_path"]


def test_train_and_evaluate_cli_end_to_end(tmp_path):
    """train.py with a warm start and LoRA, then evaluate.py on the saved model alone. The warm start trains the
    whole model and LoRA only adds to it, so the adapter on the original base is not the trained policy: the saved
    model is the merged one, and evaluate.py on it reproduces training's greedy evaluation."""
    out = tmp_path / "run"
    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(ROOT / "recipes/demo-cpu-bandit.yaml"),
        "--output_dir",
        str(out),
        "--report_path",
        str(report),
        "--warm_start_episodes",
        "48",
        "--warm_start_epochs",
        "1",
        *TINY_LORA_FLAGS,
        "--learning_rate",
        "0.05",
        "--max_steps",
        "2",
        "--num_eval_episodes",
        "8",
        "--eval_temperature",
        "0",
        "--disable_tqdm",
        "true",
        "--tiny_hidden_size",
        "32",
        "--tiny_num_layers",
        "1",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path)
    data = json.loads(report.read_text())
    (result,) = data["results"]
    assert result["env_id"] == "starpo/Bandit-v0" and result["episodes"] == 8
    assert 0 <= result["success_before"] <= 1 and 0 <= result["success_after"] <= 1 and data["wall_seconds"] > 0
    assert (out / "curves.png").stat().st_size > 1000 and (out / "model.safetensors").exists()
    assert not any((out / name).exists() for name in ("adapter_config.json", "adapter_model.safetensors"))
    assert "library_name: transformers" in (out / "README.md").read_text()

    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "evaluate.py"),
            "--model_name_or_path",
            str(out),
            "--output",
            str(tmp_path / "eval.json"),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    metrics = json.loads((tmp_path / "eval.json").read_text())
    assert metrics["episodes"] == 8 and metrics["temperature"] == 0 and "success" in res.stdout
    after = json.loads((out / "report.json").read_text())["after"]
    for key in ("success", "reward_mean", "turns", "format_error_rate"):  # greedy: the very same episodes
        assert metrics[key] == pytest.approx(after[key]), key


def test_evaluate_cli_rejects_unknown_env(tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), "--model_name_or_path", "x", "--env_id", "starpo/Nope-v0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert res.returncode != 0 and "Known starpo envs" in res.stderr


def test_colab_notebook_is_valid_and_installs_like_the_readme():
    import json
    import re

    nb = json.loads((ROOT / "notebooks/colab_lora.ipynb").read_text())
    assert nb["nbformat"] == 4 and all(c["cell_type"] in ("markdown", "code") for c in nb["cells"])
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    readme = (ROOT / "README.md").read_text()
    install = re.search(r'pip install -e "\.\[gpu\]"', readme)
    assert install, "the README lost its GPU install command"
    assert f"!{install.group(0)}" in code
    for recipe in re.findall(r"recipes/[\w.-]+\.yaml", code):
        assert (ROOT / recipe).exists(), recipe
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            python = "\n".join(
                line for line in "".join(cell["source"]).splitlines() if not line.startswith(("!", "%"))
            )
            compile(python, "cell", "exec")  # every Python line of every cell parses


@pytest.mark.parametrize(
    "env, extra, message",
    [
        ("ACCELERATE_USE_DEEPSPEED", {}, "cannot run under DeepSpeed"),
        ("ACCELERATE_USE_FSDP", {"use_peft": True}, "with LoRA cannot run under FSDP"),
    ],
)
def test_warm_start_under_deepspeed_or_lora_under_fsdp_fails_before_the_model_loads(
    tmp_path, monkeypatch, env, extra, message
):
    import train

    parser = train.parser()
    config = yaml.safe_load((ROOT / "recipes/demo-cpu-bandit.yaml").read_text())
    run_args, args, model_args, tiny_args = parser.parse_dict({**config, "output_dir": str(tmp_path), **extra})
    assert run_args.warm_start_episodes > 0
    monkeypatch.setenv(env, "true")  # as `accelerate launch` with a DeepSpeed / FSDP config sets it
    monkeypatch.setattr(train, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=message) as err:
        train.main(run_args, args, model_args, tiny_args)
    assert "warm_start_episodes=0" in str(err.value)


def test_report_path_may_not_be_the_runs_own_report(tmp_path, monkeypatch):
    import train

    parser = train.parser()
    config = yaml.safe_load((ROOT / "recipes/demo-cpu-bandit.yaml").read_text())
    parsed = parser.parse_dict({**config, "output_dir": str(tmp_path), "report_path": str(tmp_path / "report.json")})
    monkeypatch.setattr(train, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="another file"):
        train.main(*parsed)


def test_the_expert_keeps_to_the_action_budgets(tiny_tokenizer):
    """Two actions per turn, but only three in the episode: the second turn's reply names one."""
    cfg = RolloutConfig(max_turns=4, max_actions_per_turn=5, max_actions_per_episode=3)
    (demo,) = _demos(tiny_tokenizer, [11], 0.0, cfg, actions_per_turn=2)
    answers = [parse_reply(m["content"]).actions for m in demo["messages"] if m["role"] == "assistant"]
    assert answers == [["Right", "Right"], ["Down"]] and not demo["success"]  # the clean expert's path on lake 11


def test_the_expert_says_what_it_reads_off_the_state_before_its_action(tiny_tokenizer):
    """warm_start_think: state. On a fixed lake the thought of each turn is worked out by hand from the grid
    (rows and columns from 1, the moves that fall into a hole) and comes before the action in the think."""
    from starpo_trl.warm_start import expert_reply

    assert expert_reply(["Down"], True, thought="I am here.") == (
        "<think>I am here. The best action is Down.</think><answer>Down</answer>"
    )
    assert expert_reply(["Down"], False, thought="I am here.") == "<answer>Down</answer>"
    lake = ["SFFF", "FHFH", "FFFH", "HFFG"]  # Gymnasium's 4x4 map
    (demo,) = demonstrations(
        tiny_tokenizer,
        [tiny_tokenizer.eos_token_id],
        "starpo/FrozenLake-v0",
        {"is_slippery": False, "desc": lake},
        [0],
        0.0,
        RolloutConfig(max_turns=2),
        describe_state=True,
    )
    replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
    # the expert (value iteration, ties to the lowest action) goes Down, Down from the start
    assert replies == [
        "<think>I am at row 1, column 1. The goal is at row 4, column 4. No hole next to me. "
        "The best action is Down.</think><answer>Down</answer>",
        "<think>I am at row 2, column 1. The goal is at row 4, column 4. Holes: Right. "
        "The best action is Down.</think><answer>Down</answer>",
    ]


def test_sokoban_thought_by_hand():
    import gymnasium as gym

    env = gym.make("starpo/Sokoban-v0")
    env.reset(seed=3)
    inner = env.unwrapped
    # the room of seed 3 (paper symbols): player at (2, 4), box X at (3, 2), target O at (2, 3), 0-based
    assert inner.render_text().splitlines()[2:4] == ["#_#OP#", "#_X__#"]
    assert inner.expert_thought() == "I am at row 3, column 5. Box at row 4, column 3. Target at row 3, column 4."
    inner.boxes = {(2, 3)}  # the box on its target: nothing left to say but where the player is
    assert inner.expert_thought() == "I am at row 3, column 5."


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"warm_start_think": "states"}, "must be 'action' or 'state'"),
        ({"warm_start_think": "state"}, "BanditEnv has no expert_thought"),
        (
            {"warm_start_think": "state", "env_id": "starpo/FrozenLake-v0", "env_kwargs": {}, "enable_think": False},
            "enable_think=true",
        ),
    ],
)
def test_a_state_think_the_env_cannot_give_fails_before_the_model_loads(tmp_path, monkeypatch, extra, message):
    import train

    config = yaml.safe_load((ROOT / "recipes/demo-cpu-bandit.yaml").read_text())
    parsed = train.parser().parse_dict({**config, "output_dir": str(tmp_path), **extra})
    monkeypatch.setattr(train, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=message):
        train.main(*parsed)


def test_the_closing_line_names_each_eval_env_and_says_when_success_is_pooled(tmp_path):
    from helpers import make_args

    import train

    one = make_args(tmp_path, eval_env_id="starpo/BanditTest-v0")
    result = train.held_out_result(one, {"success": 0.25}, {"success": 0.5})
    assert result == {"env_id": "starpo/BanditTest-v0", "success_before": 0.25, "success_after": 0.5}
    assert train.summary_lines(one, result) == ["starpo/BanditTest-v0: success 0.25 -> 0.5"]
    two = make_args(tmp_path, eval_env_configs=[{"env_id": "starpo/BanditTest-v0"}, {"env_id": "starpo/Bandit-v0"}])
    before = {"success": 0.375, "BanditTest-v0/success": 0.25, "Bandit-v0/success": 0.5}
    after = {"success": 0.625, "BanditTest-v0/success": 0.5, "Bandit-v0/success": 0.75}
    result = train.held_out_result(two, before, after)
    # several envs: report.json names no single env and calls the pooled numbers pooled (#45, item 3)
    assert result["env_id"] is None and "success_after" not in result
    assert result["eval_env_ids"] == ["starpo/BanditTest-v0", "starpo/Bandit-v0"]
    assert (result["pooled_success_before"], result["pooled_success_after"]) == (0.375, 0.625)
    assert result["eval_envs"]["BanditTest-v0"] == {
        "env_id": "starpo/BanditTest-v0",
        "success_before": 0.25,
        "success_after": 0.5,
    }
    assert train.held_out_result(two, None, after)["eval_envs"]["Bandit-v0"]["success_before"] is None
    assert train.summary_lines(two, result) == [
        "starpo/BanditTest-v0: success 0.25 -> 0.5",
        "starpo/Bandit-v0: success 0.5 -> 0.75",
        "all 2 eval envs pooled: success 0.375 -> 0.625",
    ]


def test_eval_env_id_and_eval_env_configs_together_are_refused(tmp_path):
    """The configs' envs are the ones played: naming another env beside them mislabelled the results (#45, item 3)."""
    from helpers import make_args

    configs = [{"env_id": "starpo/BanditTest-v0"}, {"env_id": "starpo/Bandit-v0"}]
    with pytest.raises(ValueError, match="eval_env_configs \\(several\\), not both"):
        make_args(tmp_path, eval_env_id="starpo/BanditTest-v0", eval_env_configs=configs)
    with pytest.raises(ValueError, match="not both"):
        make_args(tmp_path, eval_env_kwargs={"arm_names": [["A", "B"]]}, eval_env_configs=configs)


def test_the_model_card_lists_every_eval_env_and_marks_pooled_rows(tmp_path):
    from helpers import make_args

    from starpo_trl.monitoring.model_card import render_model_card

    two = make_args(tmp_path, eval_env_configs=[{"env_id": "starpo/BanditTest-v0"}, {"env_id": "starpo/Bandit-v0"}])
    evaluation = {"after RL": {"success": 0.625, "BanditTest-v0/success": 0.5, "Bandit-v0/success": 0.75}}
    card = str(render_model_card(two, None, evaluation))
    assert "- evaluation envs (one row each below, and all pooled): `starpo/BanditTest-v0`" in card
    assert "`starpo/Bandit-v0`, kwargs `{}`" in card
    assert "| success (all envs pooled) | 0.625 |" in card and "| BanditTest-v0/success | 0.5 |" in card
    one = str(
        render_model_card(
            make_args(tmp_path, eval_env_id="starpo/BanditTest-v0"), None, {"after RL": {"success": 0.5}}
        )
    )
    assert "- evaluation env: `starpo/BanditTest-v0`" in one and "| success | 0.5 |" in one
    assert "- train env: `starpo/Bandit-v0`, kwargs `{}`" in one and "# Bandit-v0 agent" in one


def test_the_model_card_of_a_multi_env_run_names_every_training_env(tmp_path):
    """Under env_configs the card names each training env with its own kwargs and group share (env_id and
    env_kwargs then hold only the first env and the top-level kwargs), and tags every env."""
    from helpers import make_args

    from starpo_trl.monitoring.model_card import render_model_card

    configs = [
        {"env_id": "starpo/Bandit-v0", "n_groups": 1},
        {"env_id": "starpo/FrozenLake-v0", "env_kwargs": {"size": 4}, "n_groups": 3},
    ]
    args = make_args(tmp_path, env_id=None, env_configs=configs)
    card = str(render_model_card(args, None, {}))
    assert (
        "- train envs: `starpo/Bandit-v0`, kwargs `{}`, n_groups 1; "
        "`starpo/FrozenLake-v0`, kwargs `{'size': 4}`, n_groups 3" in card
    )
    assert "# Bandit-v0 + FrozenLake-v0 agent" in card
    assert "A multi-turn agent for `starpo/Bandit-v0`, `starpo/FrozenLake-v0`" in card
    assert "- FrozenLake-v0" in card  # a tag in the card's YAML header
