"""Mutual-information collapse metrics: the quantities on hand-made probabilities, the reasoning
spans to the token, the cross log-probabilities against single forward passes, and the guard rule."""

import math

import pytest
import torch

from starpo_trl.monitoring.mutual_info import (
    EMANormalizer,
    cross_logprobs,
    mi_forward_passes,
    mi_metrics,
    mi_statistics,
    reasoning_pairs,
    reasoning_span,
)
from starpo_trl.rollout.engine import Episode, StartState


def test_two_inputs_with_known_probabilities():
    # p(z_i | x_j): each reasoning is 4x likelier under its own input
    cross = torch.tensor([[0.8, 0.2], [0.2, 0.8]]).log()
    out = mi_statistics(cross, torch.tensor([0, 1]))
    assert out["conditional_entropy"] == pytest.approx(-math.log(0.8))  # 0.2231
    assert out["reasoning_entropy"] == pytest.approx(math.log(2))  # p(z_i) = (0.8 + 0.2) / 2 = 0.5
    assert out["mi_estimate"] == pytest.approx(math.log(2) + math.log(0.8))  # 0.4700 <= log 2
    assert out["mi_upper_bound"] == pytest.approx(math.log(2))
    assert out["retrieval_accuracy"] == 1.0 and out["retrieval_chance"] == 0.5
    assert "own_input_zscore" not in out  # one other input: no spread to compare against
    # RAGEN's z: matched - marginal = ln .8 - ln .5 for both; the marginals are equal, std 0 -> / (0 + 1e-3)
    assert out["marginal_std"] == 0.0 and out["mi_zscore"] == pytest.approx((math.log(0.8) - math.log(0.5)) / 1e-3)


def test_three_inputs_by_hand():
    cross = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.1, 0.3, 0.4]]).log()
    out = mi_statistics(cross, torch.tensor([0, 1, 2]))
    # H(Z|X) = -(ln .5 + ln .6 + ln .4) / 3; p(z) = 1/3, 1/3, 0.8/3
    assert out["conditional_entropy"] == pytest.approx(0.706754512)
    assert out["reasoning_entropy"] == pytest.approx(1.172993472)
    assert out["mi_estimate"] == pytest.approx(0.466238960)
    assert out["retrieval_accuracy"] == 1.0
    # z: (ln .5 - mean(ln .3, ln .2)) / std(ln .3, ln .2) = 2.4888; then 1.5994 and 1.0774
    assert out["own_input_zscore"] == pytest.approx(1.721871134)
    # RAGEN's: marginals ln 1/3, ln 1/3, ln 0.8/3 (population std 0.105191); mean(matched - marginal) = 0.466239
    assert out["marginal_std"] == pytest.approx(0.1051907, abs=1e-6)
    assert out["mi_zscore"] == pytest.approx(0.466238960 / (0.1051907 + 1e-3), abs=1e-5)
    assert out["mi_zscore"] == pytest.approx(
        _ragen_zscore([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.1, 0.3, 0.4]], [0, 1, 2])
    )
    # reasonings that ignore their input: every input scores them alike -> no information
    flat = mi_statistics(torch.tensor([[0.3, 0.3, 0.3], [0.6, 0.6, 0.6]]).log(), torch.tensor([2, 1]))
    assert flat["mi_estimate"] == pytest.approx(0.0, abs=1e-12)
    assert flat["conditional_entropy"] == pytest.approx(flat["reasoning_entropy"])
    # a reasoning scored higher under another input than its own: retrieval misses it
    assert mi_statistics(cross, torch.tensor([0, 1, 0]))["retrieval_accuracy"] == pytest.approx(2 / 3)


def test_reasoning_span_decodes_to_the_think_text(tiny_tokenizer):
    text = "<think>go left twice</think> <answer>Left</answer>"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    start, end = reasoning_span(tiny_tokenizer, ids)
    assert tiny_tokenizer.decode(ids[start:end]) == "go left twice"
    assert tiny_tokenizer.decode(ids[:start]) == "<think>"
    assert reasoning_span(tiny_tokenizer, tiny_tokenizer("<answer>Left</answer>")["input_ids"]) is None
    assert reasoning_span(tiny_tokenizer, tiny_tokenizer("<think></think>")["input_ids"]) is None
    assert reasoning_span(tiny_tokenizer, tiny_tokenizer("<think>unclosed")["input_ids"]) is None


def _episode(tok, prompt, replies, env_texts):
    """An episode whose completion alternates reply tokens (mask 1) and env tokens (mask 0)."""
    ids, mask = [], []
    for reply, env in zip(replies, env_texts):
        r = tok(reply, add_special_tokens=False)["input_ids"]
        e = tok(env, add_special_tokens=False)["input_ids"] if env else []
        ids += r + e
        mask += [1] * len(r) + [0] * len(e)
    return Episode(StartState("starpo/Bandit-v0", 0), tok(prompt, add_special_tokens=False)["input_ids"], ids, mask)


def test_pairs_take_the_chosen_turn(tiny_tokenizer):
    tok = tiny_tokenizer
    ep = _episode(
        tok, "P:", ["<think>a b</think><answer>Up</answer>", "<think>c d</think><answer>Down</answer>"], [" ok ", ""]
    )
    ((x, z),) = reasoning_pairs([ep], tok, "first")
    assert tok.decode(z) == "a b" and tok.decode(x) == "P:<think>"
    draws = {
        tok.decode(reasoning_pairs([ep], tok, "uniform", torch.Generator().manual_seed(s))[0][1]) for s in range(20)
    }
    assert draws == {"a b", "c d"}  # both turns get drawn
    later = [p for s in range(20) for p in reasoning_pairs([ep], tok, "uniform", torch.Generator().manual_seed(s))]
    x2 = next(x for x, z in later if tok.decode(z) == "c d")
    assert tok.decode(x2) == "P:<think>a b</think><answer>Up</answer> ok <think>"  # the history, env tokens included


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_cross_logprobs_equal_single_forward_passes(tiny_tokenizer, fresh_model, shared_prefix):
    """Every (reasoning, input) score equals the sum of the reasoning's token logprobs in one plain forward pass
    of input + reasoning, whether each input's cache is shared by the reasonings (2 at a time: chunks of
    different lengths, one reasoning of a single token) or every concatenation is read whole."""
    tok = tiny_tokenizer
    xs = [
        tok("first input <think>", add_special_tokens=False)["input_ids"],
        tok("x2 <think>", add_special_tokens=False)["input_ids"],
    ]
    zs = [
        tok("go", add_special_tokens=False)["input_ids"],
        tok("turn right now", add_special_tokens=False)["input_ids"],
        tok("a", add_special_tokens=False)["input_ids"],
    ]
    assert len(zs[2]) == 1 and len(zs[1]) > 1
    cross = cross_logprobs(
        fresh_model, xs, zs, tok.pad_token_id, batch_size=2, temperature=0.7, shared_prefix=shared_prefix
    )
    for i, z in enumerate(zs):
        for j, x in enumerate(xs):
            ids = torch.tensor([x + z])
            logits = fresh_model(ids).logits[0, :-1].float() / 0.7
            want = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[len(x) - 1 :].sum()
            assert cross[i, j].item() == pytest.approx(want.item(), abs=1e-4)


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_cross_logprobs_makes_the_counted_forward_passes(tiny_tokenizer, fresh_model, shared_prefix):
    """Sharded weights (ZeRO-3, FSDP) need the same number of forward passes on every process: the pass makes
    exactly ``mi_forward_passes`` of them (3 inputs, 5 reasonings, 2 at a time: 3 x (1 + 3) = 12 shared, 8 whole),
    and tops up to ``num_batches`` with stand-ins; an empty sample makes only the stand-ins."""
    tok = tiny_tokenizer
    xs = [tok(f"input {k} <think>", add_special_tokens=False)["input_ids"] for k in range(3)]
    zs = [tok(" ".join(["go"] * (k + 1)), add_special_tokens=False)["input_ids"] for k in range(5)]
    calls = []
    hook = fresh_model.register_forward_hook(lambda *a: calls.append(1))
    try:
        cross_logprobs(fresh_model, xs, zs, tok.pad_token_id, batch_size=2, shared_prefix=shared_prefix)
        assert len(calls) == mi_forward_passes(3, 5, 2, shared_prefix) == (12 if shared_prefix else 8)
        calls.clear()
        cross_logprobs(fresh_model, xs, zs, tok.pad_token_id, 2, num_batches=15, shared_prefix=shared_prefix)
        assert len(calls) == 15
        calls.clear()
        cross_logprobs(fresh_model, [], [], tok.pad_token_id, 2, num_batches=4, shared_prefix=shared_prefix)
        assert len(calls) == 4 and mi_forward_passes(0, 0, 2, shared_prefix) == 0
    finally:
        hook.remove()


def test_shared_prefix_needs_an_extendable_cache(tiny_tokenizer):
    """A model that returns no cache object gets a clear error naming the setting that reads inputs whole."""

    class NoCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None, **kwargs):
            from transformers.modeling_outputs import CausalLMOutput

            return CausalLMOutput(logits=torch.zeros(*input_ids.shape, 5))

    with pytest.raises(ValueError, match="mi_metrics_shared_prefix=False"):
        cross_logprobs(NoCache(), [[1, 2]], [[3]], 0)
    assert cross_logprobs(NoCache(), [[1, 2]], [[3]], 0, shared_prefix=False)[0, 0].item() == pytest.approx(
        -math.log(5)
    )


def test_mi_metrics_on_a_rollout(tiny_tokenizer, fresh_model):
    tok = tiny_tokenizer
    episodes = [
        _episode(tok, f"state {g}:", [f"<think>plan {g} {k}</think><answer>Up</answer>"], [""])
        for g in range(3)
        for k in range(2)
    ]
    out = mi_metrics(fresh_model, episodes, tok, group_size=2, max_inputs=3, per_input=2)
    assert out["num_inputs"] == 3 and out["num_reasonings"] == 6  # a group's copies share their first-turn input
    assert out["mi_upper_bound"] == pytest.approx(math.log(3)) and out["retrieval_chance"] == pytest.approx(1 / 3)
    assert 0 <= out["retrieval_accuracy"] <= 1 and out["mi_estimate"] <= math.log(3) + 1e-9
    assert math.isfinite(out["mi_estimate_per_token"])
    assert mi_metrics(fresh_model, episodes[:2], tok, group_size=2) == {}  # one input: nothing to compare


def test_ema_normalizer():
    ema = EMANormalizer(weight=0.5)
    assert math.isnan(ema(1.0)) and math.isnan(ema(3.0))  # mean 2, var 0.5 * (0 + 0.5 * 4) = 1
    assert ema(4.0) == pytest.approx(2.0)  # (4 - 2) / 1


def test_ema_normalizer_default_weight_by_hand_and_a_flat_series():
    ema = EMANormalizer()  # weight 0.1
    assert math.isnan(ema(1.0))  # mean 1
    assert math.isnan(ema(2.0))  # delta 1: mean 1.1, var 0.9 * (0 + 0.1 * 1) = 0.09
    assert ema(4.0) == pytest.approx((4 - 1.1) / 0.3)  # then delta 2.9: mean 1.39, var 0.9 * (0.09 + 0.841) = 0.8379
    assert ema(1.39) == pytest.approx(0.0, abs=1e-9)
    assert ema(2.39) == pytest.approx(1 / (0.9 * 0.8379) ** 0.5)  # delta 0 kept the mean; var 0.9 * 0.8379
    flat = EMANormalizer()
    assert all(math.isnan(flat(2.0)) for _ in range(4))  # no spread: no z-score, not a division by zero


@pytest.mark.trains
def test_trainer_logs_the_mi_metrics_and_the_guard_reads_them(tmp_path, tiny_tokenizer, fresh_model):
    from conftest import ScriptedBackend
    from helpers import make_args

    from starpo_trl import MultiTurnStarPOTrainer
    from starpo_trl.monitoring.guard import signals_from_logs

    # a reasoning of its own for each start state (group of 4)
    backend = ScriptedBackend(
        tiny_tokenizer,
        lambda call, i: f"<think>arm {i // 4} first</think><answer>Dragon</answer>",
        tiny_tokenizer.eos_token_id,
    )
    # FrozenLake: every seed is its own lake, so 4 start states are 4 distinct inputs
    args = make_args(tmp_path, env_id="starpo/FrozenLake-v0", mi_metrics_every=2, max_steps=3, logging_steps=1)
    trainer = MultiTurnStarPOTrainer(fresh_model, args, processing_class=tiny_tokenizer, backend=backend)
    trainer.train()
    rows = [row for row in trainer.state.log_history if "collapse/mi_estimate" in row]
    assert [row["step"] for row in rows] == [1, 3]  # computed at global steps 0 and 2, logged with them
    row = rows[0]
    assert row["collapse/num_inputs"] == 4 and row["collapse/num_reasonings"] == 8  # 4 start states x 2
    assert row["collapse/mi_upper_bound"] == pytest.approx(math.log(4)) and row["collapse/retrieval_chance"] == 0.25
    assert 0 <= row["collapse/retrieval_accuracy"] <= 1 and row["collapse/mi_estimate"] <= math.log(4) + 1e-9
    assert row["collapse/conditional_entropy"] > 0 and math.isfinite(row["collapse/mi_zscore"])
    # RAGEN's mi_zscore_ema: the per-token MI estimate over (running mean of marginal_std, decay 0.9) + 1e-3;
    # on the first pass the running mean is the value itself
    assert row["collapse/marginal_std_ema"] == row["collapse/marginal_std"]
    assert row["collapse/mi_zscore_ema"] == pytest.approx(row["collapse/mi_zscore"], rel=1e-9)
    second = rows[1]
    for suffix, estimate in (("", "mi_estimate_per_token"), ("_seq", "mi_estimate")):
        ema = 0.9 * row[f"collapse/marginal_std{suffix}"] + 0.1 * second[f"collapse/marginal_std{suffix}"]
        assert second[f"collapse/marginal_std_ema{suffix}"] == pytest.approx(ema, rel=1e-12)
        assert second[f"collapse/mi_zscore_ema{suffix}"] == pytest.approx(
            second[f"collapse/{estimate}"] / (ema + 1e-3)
        )
    assert "collapse/mi_estimate_running_z" not in row  # our own running z needs two values first
    assert row["collapse/mi_seconds"] > 0  # what experiments/collapse.py reports as the MI pass's overhead
    assert signals_from_logs(row, "Bandit-v0")["retrieval"] == row["collapse/retrieval_accuracy"]
    with pytest.raises(ValueError, match="mi_metrics_turn"):
        make_args(tmp_path, mi_metrics_turn="last")


def test_guard_warns_when_retrieval_falls():
    from starpo_trl.monitoring.guard import CollapseMonitor
    from starpo_trl.monitoring.settings import GuardSettings

    monitor = CollapseMonitor(
        GuardSettings(
            collapse_guard_smoothing=1.0,
            collapse_guard_retrieval_fraction=0.5,
            collapse_guard_retrieval_warmup=3,
            collapse_guard_patience=2,
        )
    )
    fired = [monitor.update(step, {"retrieval": v}) for step, v in enumerate([0.9, 0.8, 1.0, 0.6, 0.44, 0.4, 0.1])]
    # early level 0.9: 0.6 holds nothing, 0.44 and 0.4 fall below 0.45 -> fires on the second in a row, once
    assert fired == [[], [], [], [], [], ["retrieval"], []]


def test_identical_inputs_are_one_input(tiny_tokenizer):
    tok = tiny_tokenizer
    episodes = [_episode(tok, "same:", [f"<think>r{k}</think><answer>Up</answer>"], [""]) for k in range(4)]
    episodes += [_episode(tok, "other:", ["<think>q</think><answer>Up</answer>"], [""]) for _ in range(2)]
    from starpo_trl.monitoring.mutual_info import mi_sample

    xs, zs, own = mi_sample(episodes, tok, group_size=2, max_inputs=3, per_input=2)
    assert len(xs) == 2 and own == [0, 0, 0, 0, 1, 1]  # the first two groups share their prompt


@pytest.mark.trains
@pytest.mark.parametrize("mode", ["zero3", "fsdp"])
def test_mi_pass_on_weights_sharded_across_two_processes(tmp_path, mode):
    """The MI pass on a policy sharded by ZeRO-3 or FSDP2 (2 CPU processes, gloo; tests/distributed/dist_mi_sharded.py):
    the processes hold 2 and 3 inputs, so their own forward passes differ (shared prefix at batch 2: 6 and 12;
    whole: 4 and 9), yet each makes the larger number (the run would hang otherwise) and both get the mean of
    the two processes' unsharded statistics."""
    from helpers import run_two_processes

    ranks = run_two_processes("dist_mi_sharded.py", tmp_path, 29570 + ["zero3", "fsdp"].index(mode), mode)
    for r in ranks:
        assert r["local_numel"] < r["total_numel"]  # the weights really are sharded
    for shared in (True, False):
        a, b = (r[f"shared_{shared}"] for r in ranks)
        assert (a["num_inputs_own"], b["num_inputs_own"]) == (2, 3)
        most = max(mi_forward_passes(2, 4, 2, shared), mi_forward_passes(3, 6, 2, shared))
        assert a["forward_calls"] == b["forward_calls"] == most == (12 if shared else 9)
        for r in (a, b):
            assert r["keys_equal"] and r["finite"] and r["max_diff"] < 1e-4
        assert a["mi_estimate"] == b["mi_estimate"]


def _by_loop(probs: list[list[float]], own: list[int], lengths: list[int] | None = None) -> dict[str, float]:
    """The statistics by a plain loop over the (reasoning, input) probabilities, for the tests below:
    rows are reasonings, columns inputs; with ``lengths``, each log-probability divided by its row's length."""
    n_x = len(probs[0])
    matched, marginal, hits = [], [], 0
    for i, row in enumerate(probs):
        logs = [math.log(p) / (lengths[i] if lengths else 1) for p in row]
        matched.append(logs[own[i]])
        marginal.append(math.log(sum(math.exp(v) for v in logs) / n_x))
        best = max(range(n_x), key=lambda j: logs[j])
        hits += best == own[i]
    n = len(probs)
    return {
        "conditional_entropy": -sum(matched) / n,
        "reasoning_entropy": -sum(marginal) / n,
        "mi_estimate": sum(m - g for m, g in zip(matched, marginal)) / n,
        "retrieval_accuracy": hits / n,
    }


def _ragen_zscore(probs, own, lengths=None):
    """RAGEN's mi_zscore (ragen/trainer/collapse_metrics.py) by a plain loop: per reasoning, own-input score minus
    the log of the mean probability over the inputs, over (population std of the latter + 1e-3), averaged."""
    lengths = lengths or [1] * len(probs)
    matched = [math.log(row[j]) / n for row, j, n in zip(probs, own, lengths)]
    marginal = [math.log(sum(math.exp(math.log(p) / n) for p in row) / len(row)) for row, n in zip(probs, lengths)]
    mean = sum(marginal) / len(marginal)
    std = math.sqrt(sum((g - mean) ** 2 for g in marginal) / len(marginal))
    return sum((m - g) / (std + 1e-3) for m, g in zip(matched, marginal)) / len(matched)


def test_more_reasonings_than_inputs_and_unequal_lengths():
    """3 reasonings of 1, 2 and 4 tokens over 2 inputs. The third is likelier under the other input, so
    retrieval is 2/3 (an argmax over the inputs axis); per token, each row is divided by its own length."""
    from starpo_trl.monitoring.mutual_info import mi_sample_statistics

    probs, own, lengths = [[0.8, 0.2], [0.3, 0.6], [0.4, 0.1]], [0, 1, 1], [1, 2, 4]
    out = mi_sample_statistics(torch.tensor(probs, dtype=torch.float64).log(), torch.tensor(own), lengths)
    assert out["num_inputs"] == 2 and out["num_reasonings"] == 3
    assert out["retrieval_accuracy"] == pytest.approx(2 / 3) and out["retrieval_chance"] == 0.5
    # H(Z|X) = -(ln .8 + ln .6 + ln .1) / 3 = 1.2109; per token -(ln .8 + ln(.6) / 2 + ln(.1) / 4) / 3 = 0.3514
    assert out["conditional_entropy"] == pytest.approx(-(math.log(0.8) + math.log(0.6) + math.log(0.1)) / 3)
    per_token = -(math.log(0.8) + math.log(0.6) / 2 + math.log(0.1) / 4) / 3
    assert out["conditional_entropy_per_token"] == pytest.approx(per_token)
    for key, value in _by_loop(probs, own).items():
        assert out[key] == pytest.approx(value, abs=1e-12), key
    for key, value in _by_loop(probs, own, lengths).items():
        if key != "retrieval_accuracy":  # a positive row scale keeps the argmax: logged once
            assert out[f"{key}_per_token"] == pytest.approx(value, abs=1e-12), key
    assert "retrieval_accuracy_per_token" not in out and "mi_zscore_per_token" not in out
    # RAGEN's names: its scores are per-token means, so mi_zscore is per token and mi_zscore_seq per reasoning
    assert out["mi_zscore"] == pytest.approx(_ragen_zscore(probs, own, lengths), abs=1e-12)
    assert out["mi_zscore_seq"] == pytest.approx(_ragen_zscore(probs, own), abs=1e-12)
    assert out["mi_zscore"] != pytest.approx(out["mi_zscore_seq"])
    # the per-token figures are not the per-reasoning ones: the lengths matter
    assert out["mi_estimate_per_token"] != pytest.approx(out["mi_estimate"])


def test_fewer_reasonings_than_inputs():
    """2 reasonings over 3 inputs: the first is retrieved (its own input scores it highest), the second not."""
    probs, own = [[0.1, 0.2, 0.5], [0.3, 0.4, 0.2]], [2, 0]
    out = mi_statistics(torch.tensor(probs, dtype=torch.float64).log(), torch.tensor(own))
    assert out["retrieval_accuracy"] == 0.5 and out["retrieval_chance"] == pytest.approx(1 / 3)
    assert out["mi_upper_bound"] == pytest.approx(math.log(3))
    # p(z_0) = 0.8 / 3, p(z_1) = 0.9 / 3; I = mean(ln .5 - ln(.8 / 3), ln .3 - ln(.9 / 3)) = (0.6286 + 0) / 2
    assert out["mi_estimate"] == pytest.approx((math.log(0.5 / (0.8 / 3)) + math.log(0.3 / 0.3)) / 2)
    for key, value in _by_loop(probs, own).items():
        assert out[key] == pytest.approx(value, abs=1e-12), key


def test_mi_from_sample_divides_each_reasoning_by_its_own_token_count(tiny_tokenizer, fresh_model):
    """On the model: reasonings of 1, 3 and 2 tokens over 2 inputs. The per-token H(Z|X) is the mean of each
    reasoning's own-input score (one plain forward pass) divided by its token count."""
    from starpo_trl.monitoring.mutual_info import mi_from_sample

    tok = tiny_tokenizer
    xs = [tok(t, add_special_tokens=False)["input_ids"] for t in ("first input <think>", "x2 <think>")]
    zs = [tok(t, add_special_tokens=False)["input_ids"] for t in ("a", "a b c", "go up")]
    own = [0, 1, 0]
    assert [len(z) for z in zs] == [1, 3, 2]
    out = mi_from_sample(fresh_model, (xs, zs, own), tok.pad_token_id, batch_size=2)
    scores = []
    for z, j in zip(zs, own):
        ids = torch.tensor([xs[j] + z])
        logits = fresh_model(ids).logits[0, :-1].float()
        scores.append(torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[len(xs[j]) - 1 :].sum().item())
    assert out["conditional_entropy"] == pytest.approx(-sum(scores) / 3, abs=1e-4)
    per_token = -sum(s / len(z) for s, z in zip(scores, zs)) / 3
    assert out["conditional_entropy_per_token"] == pytest.approx(per_token, abs=1e-4)
    assert (out["num_inputs"], out["num_reasonings"]) == (2.0, 3.0)


def test_ragens_zscore_ema_by_hand():
    from starpo_trl.monitoring.mi_statistics import ragen_zscore_ema

    assert ragen_zscore_ema(0.5, 0.099) == pytest.approx(0.5 / 0.1)
    assert ragen_zscore_ema(0.3, 0.0) == pytest.approx(300.0)
