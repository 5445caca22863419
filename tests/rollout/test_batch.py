"""Episodes as TRL's batch, to the token: padding sides, masks, logprobs, rows per turn, padded row counts."""

import math

import torch

from starpo_trl.rollout.batch import episode_filter_values, episode_rows, episodes_to_tensors, padded_rows
from starpo_trl.rollout.engine import Episode, StartState

S = StartState("starpo/Bandit-v0", 0)


def test_episodes_to_tensors_by_hand():
    """Two episodes: prompts of 3 and 1 tokens (left-padded with pad id 0), completions of 5 and 2 tokens
    (right-padded), env tokens (mask 0) in the middle of the first; logprobs 0 on padding."""
    a = Episode(S, [11, 12, 13], [21, 22, 90, 91, 23], [1, 1, 0, 0, 1], [-0.1, -0.2, 0.0, 0.0, -0.3])
    b = Episode(S, [14], [24, 25], [1, 1], [-0.4, -0.5])
    t = episodes_to_tensors([a, b], pad_token_id=0, device="cpu")
    assert t["prompt_ids"].tolist() == [[11, 12, 13], [0, 0, 14]]
    assert t["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert t["completion_ids"].tolist() == [[21, 22, 90, 91, 23], [24, 25, 0, 0, 0]]
    assert t["completion_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert t["tool_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 1, 0, 0, 0]]
    assert torch.equal(
        t["sampling_per_token_logps"], torch.tensor([[-0.1, -0.2, 0.0, 0.0, -0.3], [-0.4, -0.5, 0.0, 0.0, 0.0]])
    )
    assert all(v.dtype == torch.long for k, v in t.items() if k != "sampling_per_token_logps")
    # the loss sees model tokens only: completion mask x tool mask
    assert (t["completion_mask"] * t["tool_mask"]).sum().item() == 5


def test_no_completion_token_at_all_gives_one_masked_padding_column():
    t = episodes_to_tensors([Episode(S, [5, 6]), Episode(S, [7])], pad_token_id=3, device="cpu")
    assert t["completion_ids"].tolist() == [[3], [3]]
    assert t["completion_mask"].tolist() == [[0], [0]] and t["tool_mask"].tolist() == [[0], [0]]
    assert t["sampling_per_token_logps"].tolist() == [[0.0], [0.0]]


def test_rows_per_turn_and_padded_row_counts():
    """A context-window episode (turn_prompts set) is one row per turn: that turn's prompt, its reply verbatim."""
    ep = Episode(
        S,
        [1, 2],
        [30, 31, 80, 32, 33, 34],
        [1, 1, 0, 1, 1, 1],
        [-1.0, -2.0, 0.0, -3.0, -4.0, -5.0],
        turn_rewards=[0.5, 1.0],
        turn_end_positions=[1, 5],
        reply_starts=[0, 3],
        turn_prompts=[[1, 2], [7, 80]],
    )
    whole = Episode(S, [9], [40], [1], [-0.5], turn_rewards=[0.0], turn_end_positions=[0])
    rows, owner = episode_rows([whole, ep])
    assert owner == [0, 1, 1] and rows[0] is whole
    assert [r.prompt_ids for r in rows[1:]] == [[1, 2], [7, 80]]
    assert [r.completion_ids for r in rows[1:]] == [[30, 31], [32, 33, 34]]
    assert [r.env_mask for r in rows[1:]] == [[1, 1], [1, 1, 1]]
    assert [r.logprobs for r in rows[1:]] == [[-1.0, -2.0], [-3.0, -4.0, -5.0]]
    assert [r.turn_rewards for r in rows[1:]] == [[0.5], [1.0]]
    assert [r.turn_end_positions for r in rows[1:]] == [[1], [2]]
    assert [padded_rows(n, 4) for n in (0, 1, 4, 5, 8)] == [4, 4, 4, 8, 8]


def test_filter_values_by_hand():
    a = Episode(S, [1], [5, 6, 90], [1, 1, 0], [-1.0, -3.0, 0.0])
    b = Episode(S, [1], [90], [0], [0.0])
    assert episode_filter_values([a, b], "length") == (None, [2, 0])
    entropies, lengths = episode_filter_values([a, b], "entropy")
    assert entropies[0] == 2.0 and math.isnan(entropies[1]) and lengths is None
    assert episode_filter_values([a, b], "std") == (None, None)


def test_a_pad_id_other_than_zero_and_an_episode_without_completion_beside_one_with():
    """The prompt and completion ids pad with the tokenizer's pad id (7 here), the masks with 0, and an episode
    that failed before the model wrote anything (no completion token) keeps every tensor's integer dtype."""
    failed, played = Episode(S, [11, 12]), Episode(S, [13], [21, 22], [1, 0], [-0.5, 0.0])
    t = episodes_to_tensors([failed, played], pad_token_id=7, device="cpu")
    assert t["prompt_ids"].tolist() == [[11, 12], [7, 13]] and t["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert t["completion_ids"].tolist() == [[7, 7], [21, 22]] and t["completion_ids"].dtype == torch.long
    assert t["completion_mask"].tolist() == [[0, 0], [1, 1]] and t["tool_mask"].tolist() == [[0, 0], [1, 0]]
    assert t["tool_mask"].dtype == torch.long and t["sampling_per_token_logps"].tolist() == [[0.0, 0.0], [-0.5, 0.0]]
    assert t["sampling_per_token_logps"].dtype == torch.float32


def test_turn_rows_keep_their_episodes_start_and_env_error():
    ep = Episode(
        StartState("starpo/FrozenLake-v0", 5),
        [1],
        [30, 80, 31],
        [1, 0, 1],
        [-1.0, 0.0, -2.0],
        turn_rewards=[0.0, 1.0],
        turn_end_positions=[0, 2],
        reply_starts=[0, 2],
        turn_prompts=[[1], [1, 30, 80]],
        env_error="step: boom",
    )
    rows, _ = episode_rows([ep])
    assert all(r.start == ep.start and r.env_error == "step: boom" for r in rows)


def test_trim_completion_padding_by_hand():
    """Completions of 2, 4 and 1 real tokens padded to 6: the last two columns are padding in every row and go,
    from every tensor on the completion axis (per-token advantages too); the prompt, though as wide as the
    completions here, the 1-D advantages and the scalar stay as they were."""
    from starpo_trl.rollout.batch import trim_completion_padding

    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    batch = {
        "prompt_ids": torch.arange(18).view(3, 6),
        "prompt_mask": torch.ones(3, 6, dtype=torch.long),
        "completion_ids": torch.arange(100, 118).view(3, 6) * mask,
        "completion_mask": mask,
        "tool_mask": torch.tensor([[1, 1, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]]),
        "sampling_per_token_logps": -torch.arange(18, dtype=torch.float32).view(3, 6) * mask,
        "advantages": torch.tensor([0.5, -1.0, 0.25]),
        "num_items_in_batch": torch.tensor(7),
    }
    out = trim_completion_padding(batch)
    assert out["completion_ids"].tolist() == [[100, 101, 0, 0], [106, 107, 108, 109], [112, 0, 0, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert out["tool_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 1], [1, 0, 0, 0]]
    assert out["sampling_per_token_logps"].tolist() == [
        [-0.0, -1.0, -0.0, -0.0],
        [-6.0, -7.0, -8.0, -9.0],
        [-12.0, -0.0, -0.0, -0.0],
    ]
    assert torch.equal(out["prompt_ids"], batch["prompt_ids"]) and out["prompt_mask"].shape == (3, 6)
    assert torch.equal(out["advantages"], batch["advantages"]) and int(out["num_items_in_batch"]) == 7
    per_token = trim_completion_padding({**batch, "advantages": torch.ones(3, 6)})
    assert per_token["advantages"].shape == (3, 4)
    assert trim_completion_padding(out) is out  # nothing left to cut
    empty = {**batch, "completion_mask": torch.zeros(3, 6, dtype=torch.long)}
    assert trim_completion_padding(empty)["completion_ids"].shape == (3, 1)  # one column keeps TRL's shapes valid
