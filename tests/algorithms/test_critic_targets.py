"""The critic's targets with one row per turn (context windows), checked by hand and against the
same episodes laid out as whole-history rows."""

from types import SimpleNamespace

import pytest
import torch

from starpo_trl.algorithms.critic_targets import critic_targets


class FixedCritic:
    """A critic whose values are given: what ``critic_targets`` does with them is what is checked."""

    def __init__(self, values):
        self.v = torch.tensor(values)

    def values(self, input_ids, attention_mask, logits_to_keep, batch_size):
        return self.v.clone()


def settings(estimator="gae", gamma=1.0, lam=1.0, **kw):
    base = dict(per_device_train_batch_size=8, advantage_estimator=estimator, gamma=gamma, lam=lam)
    base.update(turn_gamma=1.0, turn_lambda=1.0, value_loss_tokens="all", whiten_advantages=False)
    return SimpleNamespace(**{**base, **kw})


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
