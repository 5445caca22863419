"""Every snippet in README.md and docs/*.md runs: Python blocks are executed (a Hub model id is
served by the tiny offline model, and StarPOConfig is shrunk to one CPU step, so the same
statements run here); shell blocks name only make targets, files and flags that exist."""

import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the guides and the experiments' written report; their snippets run (the rendered reports have none)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "experiments").glob("[a-z]*.md"))]
REPORTS = [ROOT / "BENCHMARKS.md", ROOT / "experiments" / "README.md"]


def blocks(kind: str):
    for page in PAGES:
        for i, code in enumerate(re.findall(rf"^```{kind}\n(.*?)^```", page.read_text(), flags=re.S | re.M)):
            yield pytest.param(code, id=f"{page.name}:{i}")


SMALL = dict(
    max_steps=1,
    num_start_states=2,
    num_generations=2,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=1,
    max_turns=1,
    max_tokens_per_turn=8,
    num_eval_episodes=2,
    rollout_filter_ratio=1.0,
    bf16=False,
    use_cpu=True,
    report_to=[],
    save_strategy="no",
    disable_tqdm=True,
)


@pytest.mark.parametrize("code", list(blocks("python")))
def test_python_snippets_run(code, tmp_path, tiny_tokenizer, monkeypatch):
    import starpo_trl
    from starpo_trl import MultiTurnStarPOTrainer, StarPOConfig
    from starpo_trl.tiny import build_tiny_model

    def small_config(**kwargs):
        return StarPOConfig(**{**kwargs, **SMALL, "output_dir": str(tmp_path / "run")})

    def tiny_trainer(model, args, **kwargs):
        if isinstance(model, str) and "/" in model:  # a Hub id: the tiny model stands in for it
            model, kwargs["processing_class"] = build_tiny_model(tiny_tokenizer, seed=0), tiny_tokenizer
        return MultiTurnStarPOTrainer(model, args, **kwargs)

    monkeypatch.setattr(starpo_trl, "StarPOConfig", small_config)
    monkeypatch.setattr(starpo_trl, "MultiTurnStarPOTrainer", tiny_trainer)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})


def commands(code: str) -> list[list[str]]:
    joined = code.replace("\\\n", " ")
    return [shlex.split(line.split("#")[0]) for line in joined.splitlines() if line.split("#")[0].strip()]


@pytest.mark.parametrize("code", list(blocks("bash")))
def test_shell_snippets_name_what_exists(code):
    import evaluate
    import train

    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for words in commands(code):
        if words[0] == "make":
            assert words[1] in targets, words
        if "--config_file" in words:
            assert (ROOT / words[words.index("--config_file") + 1]).is_file(), words
        if "train.py" in words:
            argv = words[words.index("train.py") + 1 :]
            recipe = argv[argv.index("--config") + 1]
            assert (ROOT / recipe).is_file(), recipe
            known = {a.dest for a in train.parser()._actions}
            assert all(a.lstrip("-") in known for a in argv[::2] if a.startswith("--") and a != "--config"), argv
        if "evaluate.py" in words:
            evaluate.parser().parse_args(words[words.index("evaluate.py") + 1 :])


@pytest.mark.parametrize("code", list(blocks("yaml")))
def test_yaml_snippets_are_accepted_settings(code, tmp_path):
    """A YAML block of settings is what StarPOConfig accepts (the checks that run before any model loads)."""
    import yaml

    from starpo_trl import StarPOConfig

    StarPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, **yaml.safe_load(code))


def test_the_settings_reference_is_current_and_every_setting_has_a_help_text():
    """docs/reference.md is generated from StarPOConfig / RunArguments: it names every field they declare (#45, item 12)."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import config_reference

    from starpo_trl.config import RunArguments, StarPOConfig

    layers = config_reference.settings_classes()  # the layers' settings StarPOConfig is composed from
    assert {c.__name__ for c in layers} >= {"RolloutSettings", "FilterSettings", "AdvantageSettings", "GuardSettings"}
    for cls in (StarPOConfig, RunArguments, *layers):
        fields = config_reference.own_fields(cls)
        assert len(fields) > (5 if cls in (StarPOConfig, RunArguments) else 1)
        missing = [f.name for f in fields if not f.metadata.get("help")]
        assert not missing, f"{cls.__name__} fields without a help text: {missing}"
    # in a fresh process: the snippet tests above shrink StarPOConfig's defaults in this one
    import subprocess

    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py"), "--check"], cwd=ROOT)
    assert check.returncode == 0, "run: python scripts/config_reference.py"
    text = (ROOT / "docs" / "reference.md").read_text()
    for name in ("max_turns", "eval_temperature", "turn_lambda", "reward_norm_scope", "warm_start_batch_size"):
        assert f"| `{name}` |" in text


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_section_lands_on_a_heading():
    """The README's link for the filter rules landed on the top of docs/training.md: sections were bold paragraphs."""
    links = 0
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w\-]+\.md)#([\w\-]+)\)", page.read_text()):
            path = (page.parent / target) if not target.startswith("docs/") else ROOT / target
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)}
            assert anchor in headings, f"{page.name} links to {target}#{anchor}, which has no such heading"
            links += 1
    assert links >= 3


def test_every_relative_link_lands_on_a_file():
    """Links between the guides, the reports and the code resolve from the page that holds them (files moved
    between folders: docs/real-model.md went to experiments/, the experiments' figures to experiments/figures/)."""
    links = 0
    for page in [*PAGES, *REPORTS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[\w\-]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
            links += 1
    assert links >= 20


def test_the_readme_stays_a_short_guide():
    """README under 12 KB (#46): what it is, the commands, how a step works, results as tables; the rest in docs/."""
    assert len((ROOT / "README.md").read_bytes()) < 12 * 1024
