"""The benchmarks' scripts (benchmarks/): their tables, and where every published number comes from (both results
files, with their provenance, rendered into the reports and README)."""

import json
import math
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.fixture(autouse=True)
def _readme_copy(tmp_path, monkeypatch):
    """The scripts rewrite README.md's result tables with BENCHMARKS.md: tests write a copy."""
    import report

    copy = tmp_path / "README.md"
    copy.write_text((ROOT / "README.md").read_text())
    monkeypatch.setattr(report, "README", copy)


def test_mi_pass_rows_and_table(tmp_path, monkeypatch, tiny_tokenizer):
    """`speed.py mi` on the tiny model and a small sample: both ways score alike, the forward passes are
    counted (3 inputs x 4 reasonings: whole 6 at batch 2, 1 at 16; shared 3 x (1 + 2) = 9 and 3 x 2 = 6),
    and the table shows them."""
    import report
    import speed

    from starpo_trl.tiny import build_tiny_model

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    model = build_tiny_model(tiny_tokenizer, seed=3, hidden_size=32, num_layers=1)
    rows = speed.mi_pass_rows(model, "tiny", inputs=3, reasonings=4, input_len=20, reasoning_len=3, repeats=1)
    assert rows["batch_2"]["max_abs_diff"] < 1e-4 and rows["batch_16"]["max_abs_diff"] < 1e-4
    assert (rows["batch_2"]["forward_passes_whole"], rows["batch_2"]["forward_passes_shared"]) == (6, 9)
    assert (rows["batch_16"]["forward_passes_whole"], rows["batch_16"]["forward_passes_shared"]) == (1, 6)
    assert len(rows["batch_2"]["speedup_repeats"]) == 1
    rows["batch_2"].update(whole_s=8.0, shared_prefix_s=2.0, speedup=4.0, speedup_repeats=[3.5, 4.0, 4.5])
    report.store("mi_pass", rows, seeds=[0])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "tiny; one random sample of 3 inputs x 4 reasonings, 20 and 3 tokens" in text
    assert "| 2 | 6 / 9 | 8.00 | 2.00 | 4.0 (3.5-4.5, 3) |" in text
    del rows["batch_2"]["speedup_repeats"]  # a run stored before repeats were
    report.store("mi_pass", rows, seeds=[0])
    assert "| 2 | 6 / 9 | 8.00 | 2.00 | 4.0 (median only) |" in (tmp_path / "BENCHMARKS.md").read_text()


def test_vllm_cpu_table(tmp_path, monkeypatch):
    import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    mismatch = dict(tokens=241, token_mean=0.0229, token_p90=0.059, token_max=0.1315, seq_mean=0.1406, seq_max=0.444)
    sync = {"against_new": {"token_mean": 0.02}, "against_old": {"token_mean": 0.9}}
    parts = {
        "colocate": {
            "engine_start_seconds": 81.8,
            "vllm_dtype": "torch.bfloat16",
            "episodes": {"replies": 12, "replies_verbatim": 12},
            "mismatch": mismatch,
            "weight_sync": sync,
            "train_step_seconds": 144.1,
        },
        "lora": {"weight_sync": sync},
    }
    report.store("vllm_cpu", {"parts": parts, "versions": {"vllm": "0.32.0", "python": "3.11.7"}}, seeds=None)
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## The real vLLM engine on CPU (`make test-vllm STORE=1`" in text and "vllm-cpu 0.32.0" in text
    for row in (
        "| colocate | engine start, s | 82 |",
        "| colocate | engine dtype (model saved in float32) | bfloat16 |",
        "| colocate | replies kept token for token (ids and logprobs) | 12 of 12 |",
        "| colocate | mismatch per token: mean, p90, max (241 tokens) | 0.0229, 0.0590, 0.1315 |",
        "| colocate | mismatch per episode (sum): mean, max | 0.141, 0.444 |",
        "| lora | after an optimizer step, mean token mismatch against the new / the old weights | 0.0200 / 0.9000 |",
        "| colocate | one StarPO step through the engine, s | 144 |",
    ):
        assert row in text, row


# -- provenance: every published number comes from a stored run ------------------------------------------------------
def _results(folder: str = "benchmarks") -> dict:
    return json.loads((ROOT / folder / "results.json").read_text())


def _report(folder: str):
    """The report module of ``folder``: the benchmarks' (imported as its scripts import it) or the experiments'."""
    import report

    if folder == "benchmarks":
        return report
    from experiments import report as experiments_report

    return experiments_report


@pytest.mark.parametrize("folder", ["benchmarks", "experiments"])
def test_every_results_section_carries_its_provenance(folder):
    """Each section of either results file says the commit it was measured at (and whether the code differed), the
    command, the seeds, the machine, the time and the wall time; a top-level number is a copy of its section's."""
    import report

    results = _results(folder)
    assert len(results) > 5
    for key, section in results.items():
        if isinstance(section, dict):
            missing = [k for k in report.PROVENANCE if k not in section]
            assert not missing, f"section {key!r} has no {missing}: store it with report.store, never by hand"
            if not section.get("backfilled"):
                assert re.fullmatch(r"[0-9a-f]{40}", section["commit"]), key
                assert isinstance(section["dirty"], bool) and section["command"].startswith("python "), key
        else:
            assert any(results[s].get(key) == section for s in report.HEADLINE_SECTIONS if s in results), key
    for run in results.get("real_model", {}).get("runs", []):
        assert all(k in run["provenance"] for k in report.PROVENANCE), run["recipe"]


def test_store_stamps_the_commit_command_seeds_and_wall_time(tmp_path, monkeypatch):
    import report

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "experiments/learning.py"), "windows"])
    assert report.provenance([0])["command"] == "python -m experiments.learning windows"  # run as a module
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks/demo.py"), "--seeds", "1", "2"])
    section = report.store("demo_seeds", {}, seeds=range(1, 3), wall_seconds=12.34)["demo_seeds"]
    head = report._git("rev-parse", "HEAD").strip()
    assert section["commit"] == head and isinstance(section["dirty"], bool)
    assert section["command"] == "python benchmarks/demo.py --seeds 1 2"
    assert section["seeds"] == [1, 2] and section["wall_seconds"] == 12.3
    # a replay keeps the stored run's provenance, not its own
    kept = report.store("x", {"a": 1}, seeds=[0], kept_from=section)["x"]
    assert {k: kept[k] for k in report.PROVENANCE} == {k: section[k] for k in report.PROVENANCE} and kept["a"] == 1


def test_readme_result_tables_are_rendered_from_results_json():
    """README.md's result tables are the renderings of the two results files (run a script to change them), and
    no other table in it holds a decimal number (a result written by hand)."""
    import report

    experiments = _report("experiments")
    text = (ROOT / "README.md").read_text()
    rendered = report.render_readme(text, _results())
    rendered = report.render_readme(rendered, _results("experiments"), experiments.README_TABLES)
    assert text == rendered, "README's result tables differ from results.json"
    outside = re.sub(r"<!-- results:(\S+) -->.*?<!-- /results:\1 -->", "", text, flags=re.S)
    rows = [line for line in outside.splitlines() if line.startswith("|")]
    assert rows and not [line for line in rows if re.search(r"\d\.\d", line)]
    for name in [*report.README_TABLES, *experiments.README_TABLES]:
        assert f"<!-- results:{name} -->" in text


@pytest.mark.parametrize("folder", ["benchmarks", "experiments"])
def test_each_report_is_the_rendering_of_its_results_and_shows_every_section(folder):
    """BENCHMARKS.md and experiments/README.md are what their renderers make of their results file (one renderer
    per section, in ``SECTIONS``), and every stored section changes the report: a section no renderer reads would
    be a number nobody sees."""
    report = _report(folder)
    results = _results(folder)
    text = report.render(results)
    assert report.MARKDOWN.read_text() == text, f"{report.MARKDOWN.name} differs from its results: run report.write"
    for key in results:
        if (
            key not in _report("benchmarks").HEADLINE
        ):  # top-level copies of a section's ratios, rendered with that section
            assert report.render({k: v for k, v in results.items() if k != key}) != text, f"{key!r} is not rendered"


def test_demo_gain_and_its_standard_error_by_hand():
    from demo import gain

    # 0.3 -> 0.5 on 256 episodes: se = sqrt(0.21 / 256 + 0.25 / 256) = 0.04239; 0.2 / se = 4.72
    g = gain(0.3, 0.5, 256)
    assert g["gain"] == 0.2 and g["standard_error"] == pytest.approx(math.sqrt(0.46 / 256), abs=1e-4)
    assert g["gain_in_standard_errors"] == pytest.approx(0.2 / math.sqrt(0.46 / 256), abs=0.01)
    assert gain(1.0, 1.0, 256)["gain_in_standard_errors"] is None


def test_ratios_show_the_median_and_the_spread_of_their_repeats():
    from report import spread_text

    section = {"kv_reuse_speedup": 3.1, "kv_reuse_speedup_repeats": [3.4, 2.9, 3.1]}
    assert spread_text(section, "kv_reuse_speedup") == "3.10 (2.90-3.40, 3 repeats)"
    assert spread_text({"kv_reuse_speedup": 3.1}, "kv_reuse_speedup") == "3.10"  # measured before repeats were stored


def test_demo_tables_by_hand():
    import report

    stamp = {"commit": "a" * 40, "dirty": False, "machine": "m", "measured_at": "t", "wall_seconds": 300.0}
    run = lambda b, a, g, z: {  # noqa: E731
        "success_before": b,
        "success_after": a,
        "episodes": 256,
        "gain": g,
        "gain_in_standard_errors": z,
        "rl_steps": 60,
    }
    results = {
        "demo": {"starpo/FrozenLake-v0": run(0.16, 0.41, 0.25, 6.5), **stamp, "note": "make test ran beside it"},
        "demo_seeds": {
            "starpo/FrozenLake-v0": {"per_seed": {"1": run(0.19, 0.37, 0.18, 4.8), "2": run(0.2, 0.28, 0.08, 1.9)}},
            **stamp,
            "seeds": [1, 2],
        },
    }
    lines = report.demo_table(results)
    assert "| `starpo/FrozenLake-v0` | 256 | 0.160 | 0.410 | +25.0 points / +6.5 | 60 |" in lines
    assert "(make test ran beside it.)" in lines and any("5.0 min for both envs" in line for line in lines)
    # three seeds: mean gain (25 + 18 + 8) / 3 = 17.0; two of three meet 10 points and 3 standard errors
    assert (
        "| `starpo/FrozenLake-v0` | 0.160, 0.190, 0.200 | 0.410, 0.370, 0.280 | +17.0 (+8.0, +25.0) | 2 of 3 |"
        in lines
    )


def test_activation_checkpointing_is_timed_both_ways_with_the_same_gradients(tmp_path, monkeypatch, tiny_tokenizer):
    """`utilisation.py checkpointing`: each repeat times the same micro-batch with checkpointing on and off, the
    speedup is on / off per repeat, the model is left as it was (off), the gradients agree both ways (what makes
    turning it off free), and BENCHMARKS.md shows the row."""
    import report
    import torch
    import utilisation

    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    row = utilisation.checkpointing_row(model, 2, 16, 2)
    assert len(row["on"]) == len(row["off"]) == 2 and min(row["on"] + row["off"]) > 0
    assert row["off_speedup"]["repeats"] == [a / b for a, b in zip(row["on"], row["off"])]
    assert not model.is_gradient_checkpointing

    ids = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for on in (True, False):
        model.train()
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(*grads, strict=True))

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    row = {
        "rows": 4,
        "length": 256,
        "on": [0.3, 0.33],
        "off": [0.2, 0.3],
        "off_speedup": utilisation.spread([1.5, 1.1]),
    }
    per_model = {"tiny": row, "SmolLM2": row}  # stored in this order, read back sorted
    report.store("activation_checkpointing", {"per_model": per_model, "note": "a job ran beside it"}, seeds=[0])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text == report.render(report.load())  # the report written as it stores reads as one rendered later
    assert "## Activation checkpointing (`python benchmarks/utilisation.py checkpointing`" in text
    assert "| tiny | 4 x 256 tokens | 0.300, 0.330 | 0.200, 0.300 | x1.300 (1.100-1.500) |" in text
    assert "(a job ran beside it.)" in text


def test_micro_batches_are_timed_padded_and_cut_and_the_table_renders(tmp_path, monkeypatch, tiny_tokenizer):
    """`utilisation.py padding`: each repeat times the same micro-batches padded and cut, the speedup is padded /
    cut per repeat, equal lengths leave nothing to cut, and BENCHMARKS.md shows the row."""
    import report
    import utilisation

    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    same = utilisation.padding_row(model, 4, 2, 8, (5, 5), 2)
    assert same["padded_columns"] == same["cut_columns"] == 2 * 5  # two micro-batches of width 5
    assert len(same["uncut"]) == len(same["cut"]) == 2 and min(same["uncut"] + same["cut"]) > 0
    assert same["cut_speedup"]["repeats"] == [a / b for a, b in zip(same["uncut"], same["cut"])]
    model.eval()
    varied = utilisation.padding_row(model, 8, 2, 8, (1, 40), 1)
    assert varied["cut_columns"] < varied["padded_columns"] and model.training is False  # left as it was

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    row = {
        "rows": 32,
        "micro": 2,
        "prompt": 192,
        "lengths": [64, 512],
        "padded_columns": 8000,
        "cut_columns": 6000,
        "uncut": [2.0, 2.2],
        "cut": [1.6, 2.0],
        "cut_speedup": utilisation.spread([1.25, 1.1]),
    }
    report.store("micro_batch_padding", {"per_model": {"tiny": {"FrozenLake-like": row}}}, seeds=[0])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text == report.render(report.load())
    assert "## Micro-batches at their own width (`python benchmarks/utilisation.py padding`" in text
    assert (
        "| tiny | FrozenLake-like | 32, 2 | 192, 64-512 | 8000 -> 6000 | 2.00, 2.20 | 1.60, 2.00 | x1.175 (1.100-1.250) |"
        in text
    )


def test_finished_rows_are_timed_carried_and_dropped_and_the_table_renders(tmp_path, monkeypatch, tiny_tokenizer):
    """`utilisation.py finished`: each repeat plays the same rollout with finished rows carried and dropped (the
    order alternates), the speedup is carried / dropped per repeat, dropping never adds decode work, and
    BENCHMARKS.md shows the row."""
    import report
    import utilisation

    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    calls = []
    real = utilisation.lake_rollout

    def spy(model, tok, episodes, seed, **kw):
        calls.append((seed, kw["drop_finished_rows"]))
        return real(model, tok, episodes, seed, **kw)

    monkeypatch.setattr(utilisation, "lake_rollout", spy)
    row = utilisation.finished_rows_row(model, tiny_tokenizer, 4, 2)
    assert calls == [(0, False), (0, True), (1, True), (1, False)]
    assert len(row["carried"]) == len(row["dropped"]) == 2
    assert row["dropped_speedup"]["repeats"] == [a / b for a, b in zip(row["carried"], row["dropped"])]
    assert all(d <= c for c, d in zip(row["row_steps"]["carried"], row["row_steps"]["dropped"]))

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    stored = {
        "episodes": 32,
        "carried": [2.0, 2.2, 2.4],
        "dropped": [1.6, 2.0, 2.0],
        "row_steps": {"carried": [900, 1000, 1100], "dropped": [700, 720, 800]},
        "finished_row_share": {"carried": utilisation.spread([0.25]), "dropped": utilisation.spread([0.05])},
        "dropped_speedup": utilisation.spread([1.25, 1.1, 1.2]),
    }
    report.store("finished_rows", {"per_model": {"tiny": stored}}, seeds=[0, 1, 2])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text == report.render(report.load())
    assert "## Finished rows leave the batch (`python benchmarks/utilisation.py finished`" in text
    assert (
        "| tiny | 32 | 0.250 -> 0.050 | 1000 -> 720 | 2.00, 2.20, 2.40 | 1.60, 2.00, 2.00 | x1.200 (1.100-1.250) |"
        in text
    )


def test_decode_split_fits_the_history_line_and_the_table_renders(tmp_path, monkeypatch, tiny_tokenizer):
    """`utilisation.py decode`: the step times at each history length (stand-ins here, on a line worked out by
    hand: 0.1 s + 0.0002 s per token of mean context) give back that slope and intercept; the shares are the
    linear layers' time at the rate for that many rows, the slope's part, the timed sampling and the rest, adding
    to one; BENCHMARKS.md shows a row per history length, shortest first."""
    import report
    import utilisation

    from starpo_trl.tiny import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)

    def fake_decode_row(model, tok, batch, history, new, rates, repeats):
        return {"history_tokens": history, "step_seconds": utilisation.spread([0.1 + 0.0002 * (history + new / 2)])}

    monkeypatch.setattr(utilisation, "decode_row", fake_decode_row)
    monkeypatch.setattr(utilisation, "sampling_seconds", lambda rows, vocab, repeats: 0.01)
    per_token = utilisation.weight_flops_per_token(model)
    rates = {8: 8 * per_token / 0.02, 64: 1.0}  # the linear layers of 8 rows take 0.02 s at the 8-row rate
    row = utilisation.decode_split_row(model, tiny_tokenizer, 8, (64, 256, 1024), 16, rates, 1)
    assert abs(row["seconds_per_history_token"] - 0.0002) < 1e-12 and abs(row["fixed_seconds"] - 0.1) < 1e-12
    step = 0.1 + 0.0002 * 264  # 256 cached + 8 on average while the 16 new tokens are sampled
    split = row["split"]["256"]
    assert abs(split["step_seconds"] - step) < 1e-12
    assert abs(split["linear_share"] - 0.02 / step) < 1e-9 and abs(split["sampling_share"] - 0.01 / step) < 1e-9
    assert abs(split["history_share"] - 0.0002 * 264 / step) < 1e-9
    assert abs(split["rest_share"] - (0.1 - 0.02 - 0.01) / step) < 1e-9
    assert 0 < utilisation.sampling_seconds(4, 100, 1) < 1

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    report.store("decode_split", {"per_model": {"tiny": [row]}}, seeds=[0])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert text == report.render(report.load())
    assert "## Where a decode step's time goes (`python benchmarks/utilisation.py decode`" in text
    assert "| tiny | 8 | 256 | 0.153 | 0.13 | 0.35 | 0.07 | 0.46 |" in text
    # rows in the order of their history length (results.json sorts the keys as text: "1024" < "256" < "64")
    assert text.index("| tiny | 8 | 64 |") < text.index("| tiny | 8 | 256 |") < text.index("| tiny | 8 | 1024 |")


def test_utilisation_counts_flops_by_hand_and_renders_its_table(tmp_path, monkeypatch):
    """benchmarks/utilisation.py: the FLOPs it divides by are the model's linear layers (worked out here from the
    tiny model's config), the quick run measures every part, and BENCHMARKS.md shows each row with its spread."""
    import report
    import torch
    import utilisation

    from starpo_trl.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok)
    c = model.config
    d, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    kv = c.num_key_value_heads * (d // c.num_attention_heads)
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * f  # q, o; k, v; gate, up, down
    assert utilisation.weight_flops_per_token(model) == 2 * (c.num_hidden_layers * per_layer + v * d)
    assert utilisation.attention_width(model) == (c.num_hidden_layers, d)
    spread = utilisation.spread([3.0, 1.0, 2.0])
    assert (spread["median"], spread["min"], spread["max"]) == (2.0, 1.0, 3.0)
    shapes = {
        "rows": (1, 8),
        "peak_size": 256,
        "rollout_episodes": 4,
        "prefill": (2, 16),
        "decode": [(4, 24, 3)],
        "train": [(2, 16, 4)],
    }
    out = utilisation.measure("tiny", model, tok, shapes, repeats=1)
    assert out["threads"]["default_threads"] == torch.get_num_threads()  # restored after the one-thread runs
    assert len(out["threads"]["train"]["one"]) == 1 and out["rollout"]["episodes"] == 4
    assert 0 <= out["rollout"]["finished_row_share"]["median"] < 1
    assert out["peak_gflops"] > 0 and set(out["matmul_gflops_by_rows"]) == {"1", "8"}
    step = out["decode"][0]
    assert step["batch"] == 4 and 0 < step["step_mfu"]["median"] < 1 and step["step_seconds_with_check"]["median"] > 0
    train = out["train"][0]
    assert (train["real_tokens"], train["padded_tokens"]) == (16 + 4, 32)  # half the rows cut to 4 real tokens

    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(report, "MARKDOWN", tmp_path / "BENCHMARKS.md")
    mfu = {"median": 0.25, "min": 0.2, "max": 0.3}
    row = {"batch": 64, "history_tokens": 512, "step_mfu": mfu, "step_matmul_share": 0.61, "check_share": 0.08}
    model_row = {
        "peak_gflops": 71.4,
        "prefill": {"rows": 8, "prompt_tokens": 256, "mfu": mfu},
        "decode": [row],
        "train": [{"rows": 4, "length": 512, "real_tokens": 1280, "padded_tokens": 2048, "mfu": mfu}],
        "rollout": {"episodes": 64, "turns_per_episode": 2.5, "mfu": mfu, "finished_row_share": mfu},
        "threads": {"train": {"one_thread_speedup": mfu}, "decode_step": {"one_thread_speedup": mfu}},
    }
    report.store("utilisation", {"per_model": {"SmolLM2": model_row}, "shapes": {}}, seeds=[0])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Throughput against the machine's limit (`python benchmarks/utilisation.py`" in text
    assert "| SmolLM2 | 71 | decode step | 64 rows, 512 cached | 0.250 (0.200-0.300) | 0.61 | 0.08 |" in text
    assert (
        "| SmolLM2 | 71 | train (forward + backward) | 4 x 512, 1280 real tokens | 0.250 (0.200-0.300) | | |" in text
    )


def test_prose_is_wrapped_and_tables_are_not():
    import report

    table = "| " + " | ".join(["a long cell"] * 30) + " |"
    prose = " ".join(["word"] * 100)
    out = report.wrapped(["# " + prose, table, prose, "- " + prose, ""])
    assert out[:2] == ["# " + prose, table] and out[-2:] == ["- " + prose, ""]
    body = out[2:-2]
    assert len(body) > 1 and all(len(x) <= report.PROSE_WIDTH for x in body) and " ".join(body) == prose


def test_the_benchmarks_refuse_to_measure_another_checkouts_code(monkeypatch, tmp_path):
    """The benchmarks import the installed package (no sys.path edits) and record this checkout's commit: code
    imported from elsewhere is refused, naming what to do."""
    import report

    report.check_code_is_this_checkout()  # this checkout's install
    monkeypatch.setattr(report, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=r"not from this checkout .*pip install -e"):
        report.check_code_is_this_checkout()
