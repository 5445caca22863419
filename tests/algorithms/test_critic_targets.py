"""The critic's targets with one row per turn (context windows), checked by hand and against the
same episodes laid out as whole-history rows."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from starpo_trl.algorithms.critic_targets import TargetSettings, critic_targets
from starpo_trl.algorithms.settings import AdvantageSettings, CriticSettings


class FixedCritic:
    """A critic whose values are given: what ``critic_targets`` does with them is what is checked."""

    def __init__(self, values):
        self.v = torch.tensor(values)

    def values(self, input_ids, attention_mask, logits_to_keep, batch_size):
        return self.v.clone()


def settings(estimator="gae", gamma=1.0, lam=1.0, **kw):
    """``TargetSettings`` read from a config holding these fields (the layers' defaults for the rest), as the
    trainer reads them from its ``StarPOConfig``."""
    base = dict(per_device_train_batch_size=8, advantage_estimator=estimator, gamma=gamma, lam=lam)
    base.update(turn_gamma=1.0, turn_lambda=1.0, value_loss_tokens="all", whiten_advantages=False)
    base.update(context_window="full", steps_per_generation=1, seed=0, max_grad_norm=1.0)
    defaults = {**AdvantageSettings().values(), **CriticSettings().values()}
    return TargetSettings.of(SimpleNamespace(**{**defaults, **base, **kw}))


def row(length, ends, turns=1):
    return SimpleNamespace(completion_ids=[0] * length, turn_end_positions=ends, turn_rewards=[0.0] * turns)


# episode A: turn 1 replies 2 tokens, turn 2 one token; episode B: one turn of 2 tokens
TURN_REWARDS = [[1.0, 2.0], [0.5]]
# one row per turn (A1, A2, B1) and a padding row; width 2
WINDOW_ROWS = [row(2, [1]), row(1, [0]), row(2, [1]), row(2, [1])]
WINDOW_OWNER = [0, 0, 1]
WINDOW_VALUES = [[0.5, 0.2], [0.4, 0.0], [0.1, 0.3], [9.0, 9.0]]
WINDOW_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]])
# the same episodes as whole-history rows: A = reply, reply, env, env, reply; B = reply, reply
FULL_ROWS = [row(5, [1, 4], turns=2), row(2, [1])]
FULL_VALUES = [[0.5, 0.2, 7.0, 7.0, 0.4], [0.1, 0.3, 0.0, 0.0, 0.0]]
FULL_MASK = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]])


def window_targets(args):
    args = dataclasses.replace(args, turn_rows=True)  # one row per turn, as context_window: window:1 gives
    ids = torch.zeros_like(WINDOW_MASK)
    critic = FixedCritic(WINDOW_VALUES)
    return critic_targets(critic, WINDOW_ROWS, WINDOW_OWNER, TURN_REWARDS, ids, ids, 2, WINDOW_MASK, args)


def full_targets(args):
    ids = torch.zeros_like(FULL_MASK)
    return critic_targets(FixedCritic(FULL_VALUES), FULL_ROWS, [0, 1], TURN_REWARDS, ids, ids, 5, FULL_MASK, args)


def test_gae_over_turn_rows_by_hand():
    out = window_targets(settings())
    # gamma = lambda = 1: the return of a token is the reward still to come, the advantage return - value.
    # A: rewards 1 (end of turn 1) and 2 -> returns 3, 3 | 2; B: 0.5 -> 0.5, 0.5
    assert torch.allclose(out.returns, torch.tensor([[3.0, 3.0], [2.0, 0.0], [0.5, 0.5], [0.0, 0.0]]))
    assert torch.allclose(out.advantages, torch.tensor([[2.5, 2.8], [1.6, 0.0], [0.4, 0.2], [0.0, 0.0]]))
    assert torch.equal(out.values[3], torch.zeros(2))  # padding holds no value


@pytest.mark.parametrize(
    "estimator,kw",
    [
        ("gae", dict(gamma=0.9, lam=0.8)),
        ("bilevel_gae", dict(gamma=0.95, lam=0.9, turn_gamma=0.9, turn_lambda=0.7)),
        ("turn_gae", dict(turn_gamma=0.8, turn_lambda=0.6)),
    ],
)
def test_turn_rows_give_what_whole_history_rows_give(estimator, kw):
    """Same values at the same model tokens: the same advantages and returns, token for token."""
    window, full = window_targets(settings(estimator, **kw)), full_targets(settings(estimator, **kw))
    for name in ("advantages", "returns"):
        w, f = getattr(window, name), getattr(full, name)
        a_window = torch.cat([w[0, :2], w[1, :1]])  # episode A's model tokens, turn by turn
        assert torch.allclose(a_window, f[0, [0, 1, 4]], atol=1e-6), name
        assert torch.allclose(w[2], f[1, :2], atol=1e-6), name
        assert w[3].abs().sum() == 0 and w[1, 1] == 0  # padding and the reply's padding


class RecordingCritic(FixedCritic):
    """FixedCritic that also keeps what it was asked."""

    def values(self, input_ids, attention_mask, logits_to_keep, batch_size):
        self.asked = (input_ids, attention_mask, logits_to_keep, batch_size)
        return super().values(input_ids, attention_mask, logits_to_keep, batch_size)


# whole-history rows: A = reply (2 tokens), env, reply (1 token); B = one reply of 2 tokens; then a padding row
ROWS = [row(4, [1, 3], turns=2), row(4, [1]), row(4, [1])]
VALUES = [[0.5, 0.2, 9.0, 0.4], [0.1, 0.3, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]]
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
# GAE with gamma = lam = 1 on the model tokens: A: rewards 1 (t=1) and 2 (t=3), values 0.5, 0.2, 0.4
#   t=3: 2 - 0.4 = 1.6; t=1: 1 + 0.4 - 0.2 + 1.6 - 0.4 ... = return - value: returns 3, 3, -, 2 -> adv 2.5, 2.8, 0, 1.6
#   B: reward 0.5 at t=1: returns 0.5, 0.5 -> adv 0.4, 0.2
ADV = [[2.5, 2.8, 0.0, 1.6], [0.4, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]


def test_whole_history_rows_by_hand_padding_value_tokens_and_what_the_critic_is_asked():
    ids, attention = torch.arange(12).view(3, 4), torch.ones(3, 4, dtype=torch.long)
    critic = RecordingCritic(VALUES)
    out = critic_targets(
        critic, ROWS, [0, 1], TURN_REWARDS, ids, attention, 4, MASK, settings(per_device_train_batch_size=3)
    )
    assert critic.asked[0] is ids and critic.asked[1] is attention and critic.asked[2:] == (4, 3)
    assert torch.allclose(out.advantages, torch.tensor(ADV), atol=1e-6)
    assert torch.allclose(
        out.returns, torch.tensor([[3.0, 3.0, 0.0, 2.0], [0.5, 0.5, 0.0, 0.0], [0.0] * 4]), atol=1e-6
    )
    assert torch.equal(out.values, torch.tensor(VALUES) * MASK)  # values off the model tokens are 0
    assert torch.equal(out.value_mask, MASK)  # value_loss_tokens "all": every model token
    ends = critic_targets(
        FixedCritic(VALUES),
        ROWS,
        [0, 1],
        TURN_REWARDS,
        ids,
        attention,
        4,
        MASK,
        settings(value_loss_tokens="turn_ends"),
    )
    assert ends.value_mask.tolist() == [[0, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]  # each turn's last model token


def test_whitening_uses_the_whole_batchs_statistics():
    """The 6 model-token advantages 2.5, 2.8, 1.6, 0.4, 0.2 (A, B) whitened over all of them; split across two
    processes (A's row here, B's there), each process whitens with the sum of both processes' statistics."""
    ids = torch.zeros(3, 4, dtype=torch.long)
    flat = [2.5, 2.8, 1.6, 0.4, 0.2]
    mean = sum(flat) / 5
    std = (sum((x - mean) ** 2 for x in flat) / 4) ** 0.5
    want = [
        [(2.5 - mean) / std, (2.8 - mean) / std, 0.0, (1.6 - mean) / std],
        [(0.4 - mean) / std, (0.2 - mean) / std, 0.0, 0.0],
    ]
    out = critic_targets(
        FixedCritic(VALUES), ROWS, [0, 1], TURN_REWARDS, ids, ids, 4, MASK, settings(whiten_advantages=True)
    )
    assert torch.allclose(out.advantages[:2], torch.tensor(want), atol=1e-5) and torch.equal(
        out.advantages[2], torch.zeros(4)
    )
    # process 0 holds A (and a padding row); process 1's statistics of B: count 2, sum 0.6, sum of squares 0.2
    other = torch.tensor([2.0, 0.6, 0.2], dtype=torch.float64)
    rows, values, mask = [ROWS[0], ROWS[2]], [VALUES[0], VALUES[2]], MASK[[0, 2]]
    mine = critic_targets(
        FixedCritic(values),
        rows,
        [0],
        TURN_REWARDS[:1],
        ids[:2],
        ids[:2],
        4,
        mask,
        settings(whiten_advantages=True),
        lambda s: s + other,
    )
    assert torch.allclose(mine.advantages[0], torch.tensor(want[0]), atol=1e-5)
    # without whitening the advantages stay as GAE gives them
    assert torch.allclose(
        critic_targets(FixedCritic(VALUES), ROWS, [0, 1], TURN_REWARDS, ids, ids, 4, MASK, settings()).advantages,
        torch.tensor(ADV),
        atol=1e-6,
    )


def test_estimators_by_name_pass_every_discount_in_its_place():
    from starpo_trl.algorithms import bilevel_gae
    from starpo_trl.algorithms.estimators import get_estimator

    values, mask = torch.tensor([[0.3, 0.4, 9.0, 0.1, 0.2]]), torch.tensor([[1, 1, 0, 1, 1]])
    s = settings(gamma=0.5, lam=0.8, turn_gamma=0.9, turn_lambda=0.6)
    for name, turn_only in (("bilevel_gae", False), ("turn_gae", True)):
        got = get_estimator(name).fn([[1.0, 2.0]], [[1, 4]], values, mask, s.advantages)
        want = bilevel_gae([[1.0, 2.0]], [[1, 4]], values, mask, 0.5, 0.8, 0.9, 0.6, turn_level_only=turn_only)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), name
        assert got[0].device == values.device
    with pytest.raises(ValueError, match=r"advantage_estimator must be one of \[.*'bilevel_gae'.*\], got 'nope'"):
        get_estimator("nope")


def test_a_registered_estimator_is_found_by_name_and_a_group_one_unless_told():
    from starpo_trl.algorithms.estimators import (
        ESTIMATORS,
        critic_estimators,
        get_estimator,
        register_advantage_estimator,
    )

    try:

        @register_advantage_estimator("test_group")
        def group(rewards, group_size, scale):
            return rewards

        @register_advantage_estimator("test_critic", critic=True)
        def with_critic(turn_rewards, turn_ends, values, mask, settings):
            return values, values

        assert get_estimator("test_group").name == "test_group" and get_estimator("test_group").fn is group
        assert get_estimator("test_group").critic is False and get_estimator("test_critic").critic is True
        assert get_estimator("test_group").per_turn is False and get_estimator("test_critic").per_turn is False

        @register_advantage_estimator("test_turns", per_turn=True)
        def per_turn(rewards, turn_rewards, anchors, group_size, settings):
            return turn_rewards

        assert get_estimator("test_turns").per_turn is True and get_estimator("test_turns").critic is False
        assert "test_critic" in critic_estimators() and "test_group" not in critic_estimators()
        assert {"bilevel_gae", "gae", "turn_gae"} <= set(critic_estimators())
        # a name is registered once: a second registration is refused (it silently replaced the first), unless asked
        with pytest.raises(ValueError, match="'test_group' is already registered"):
            register_advantage_estimator("test_group")(lambda rewards, group_size, scale: rewards)
        with pytest.raises(ValueError, match="'grpo' is already registered"):
            register_advantage_estimator("grpo", critic=True)(with_critic)
        assert get_estimator("test_group").fn is group and get_estimator("grpo").critic is False
        again = register_advantage_estimator("test_group", replace=True)(lambda rewards, group_size, scale: rewards)
        assert get_estimator("test_group").fn is again
        with pytest.raises(ValueError, match="^an estimator is a critic estimator or a turn estimator, not both$"):
            register_advantage_estimator("test_both", critic=True, per_turn=True)
        assert get_estimator("gigpo").per_turn and not get_estimator("gigpo").critic
    finally:
        ESTIMATORS.pop("test_group", None)
        ESTIMATORS.pop("test_critic", None)
        ESTIMATORS.pop("test_turns", None)


def test_fit_critic_passes_the_real_rows_the_targets_and_a_per_step_order():
    """fit_critic hands the critic the first num_rows rows (the rest is padding) with this step's targets, the
    configured epochs, micro-batches and grad clip, a generator seeded by seed and step, and names the stats."""
    from starpo_trl.algorithms.critic_targets import CriticTargets, fit_critic

    class Recorder:
        def fit(self, *args, reduce=None):
            self.args, self.reduce = args, reduce
            return [{"value_loss": 0.5}, {"value_loss": 0.25}]

    ids, attention = torch.arange(12).view(3, 4), torch.ones(3, 4, dtype=torch.long)
    targets = CriticTargets(torch.zeros(3, 4), torch.full((3, 4), 1.0), torch.full((3, 4), 2.0), MASK)
    args = settings(critic_epochs=4, steps_per_generation=2, seed=3, max_grad_norm=0.7)
    critic, reduce = Recorder(), object()
    stats = fit_critic(critic, (ids, attention, 4), targets, 2, args, step=5, reduce=reduce)
    assert stats == [{"critic/value_loss": 0.5}, {"critic/value_loss": 0.25}] and critic.reduce is reduce
    got_ids, got_attention, keep, values, returns, value_mask, epochs, micro, generator, clip = critic.args
    assert torch.equal(got_ids, ids[:2]) and torch.equal(got_attention, attention[:2]) and keep == 4
    assert torch.equal(values, targets.values[:2]) and torch.equal(returns, targets.returns[:2])
    assert torch.equal(value_mask, MASK[:2]) and (epochs, micro, clip) == (4, 2, 0.7)
    want = torch.Generator().manual_seed(3 * 1_000_003 + 5)
    assert torch.equal(torch.randperm(10, generator=generator), torch.randperm(10, generator=want))


def test_the_row_layout_comes_from_the_context_window_setting_not_from_row_counts():
    """Two one-turn episodes under a context window have as many rows as episodes; they are still turn rows
    (joined per episode), and with one turn each that gives what one row per episode gives."""
    rows, mask = [row(2, [1]), row(2, [1])], torch.tensor([[1, 1], [1, 1]])
    values, rewards, ids = [[0.5, 0.2], [0.1, 0.3]], [[1.0], [0.5]], torch.zeros(2, 2, dtype=torch.long)
    full = critic_targets(FixedCritic(values), rows, [0, 1], rewards, ids, ids, 2, mask, settings())
    window = critic_targets(
        FixedCritic(values), rows, [0, 1], rewards, ids, ids, 2, mask, settings(context_window="single_turn")
    )
    assert torch.allclose(full.advantages, torch.tensor([[0.5, 0.8], [0.4, 0.2]]))
    assert torch.allclose(window.advantages, full.advantages) and torch.allclose(window.returns, full.returns)


def test_target_settings_are_read_from_the_run_config_once(tmp_path):
    """The trainer reads what the critic's targets need from its config once: each field from the layer that owns
    it, and the row layout decided from the context window (not guessed later from row counts)."""
    from helpers import make_args

    args = make_args(
        tmp_path,
        advantage_estimator="bilevel_gae",
        gamma=0.9,
        lam=0.8,
        turn_gamma=0.7,
        turn_lambda=0.6,
        value_loss_tokens="turn_ends",
        whiten_advantages=True,
        critic_epochs=3,
        per_device_train_batch_size=2,
        seed=7,
        max_grad_norm=0.5,
    )
    got = TargetSettings.of(args)
    assert got.advantages == AdvantageSettings.of(args) and got.critic == CriticSettings.of(args)
    assert (got.advantages.gamma, got.advantages.lam, got.advantages.turn_gamma, got.advantages.turn_lambda) == (
        0.9,
        0.8,
        0.7,
        0.6,
    )
    assert (got.critic.value_loss_tokens, got.critic.whiten_advantages, got.critic.critic_epochs) == (
        "turn_ends",
        True,
        3,
    )
    assert (got.micro_batch, got.micro_batches, got.seed, got.max_grad_norm) == (
        2,
        args.steps_per_generation,
        7,
        0.5,
    )
    assert got.turn_rows is False
    assert TargetSettings.of(make_args(tmp_path, context_window="window:2")).turn_rows is True
