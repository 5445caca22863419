"""Episode statistics: the per-step training metrics and the held-out success table.

Logged keys that other parts read back are named in ``starpo_trl.monitoring.keys``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from starpo_trl.algorithms import between_group_share, nanstd
from starpo_trl.monitoring.diagnostics import reasoning_metrics
from starpo_trl.rollout import Episode
from starpo_trl.rollout.prompting import parse_reply


def episode_metrics(episodes: list[Episode], group_size: int | None = None) -> dict[str, float]:
    """Success, action rates, turns and reward statistics over a list of episodes.

    With ``group_size`` (episodes grouped consecutively by start state) also pass@k over each group
    and in-group reward std (mean, max, fraction of groups with zero std). Episodes whose env failed
    (``env_error``: at reset, in a step, a non-finite reward) count in ``env_errors`` and as not solved,
    and are left out of every reward statistic (a group's std is over its played episodes, groups with
    fewer than two left out); with none played the reward keys are absent.
    """
    if not episodes:
        return {}
    played = np.array([ep.env_error is None for ep in episodes])
    rewards = np.array([ep.reward if ok else np.nan for ep, ok in zip(episodes, played)], dtype=float)
    actions = sum(ep.num_actions for ep in episodes)
    metrics = {
        "success": float(np.mean([ep.success for ep in episodes])),
        **(
            {"reward_mean": float(np.nanmean(rewards)), "reward_std": float(np.nanstd(rewards))}
            if played.any()
            else {}
        ),
        "turns": float(np.mean([ep.num_turns for ep in episodes])),
        "actions": float(np.mean([ep.num_actions for ep in episodes])),
        "valid_action_rate": sum(ep.num_valid_actions for ep in episodes) / actions if actions else 0.0,
        "effective_action_rate": sum(ep.num_effective_actions for ep in episodes) / actions if actions else 0.0,
        "format_error_rate": sum(ep.num_format_errors for ep in episodes)
        / max(1, sum(ep.num_turns for ep in episodes)),
        "truncated": float(np.mean([ep.truncated for ep in episodes])),
        "env_errors": float((~played).sum()),
    }
    if group_size and len(episodes) % group_size == 0 and group_size > 1:
        success = np.array([ep.success for ep in episodes]).reshape(-1, group_size)
        metrics[f"pass@{group_size}"] = float(success.any(axis=1).mean())
        groups = [row[~np.isnan(row)] for row in rewards.reshape(-1, group_size)]
        stds = np.array([g.std(ddof=1) for g in groups if len(g) > 1])
        if len(stds):
            metrics.update(
                {
                    "group_reward_std_mean": float(stds.mean()),
                    "group_reward_std_max": float(stds.max()),
                    "frac_zero_std_groups": float(np.isclose(stds, 0.0).mean()),
                }
            )
    return metrics


def rollout_metrics(
    episodes: list[Episode],
    rewards: torch.Tensor,
    group_size: int,
    num_kept_groups: int,
    env: str | Callable[[Episode], str],
    timings: dict[str, float],
    think: bool = True,
    previous_thinks: list[str] | None = None,
    shaping: bool = False,
) -> tuple[dict[str, float], list[str]]:
    """Every metric of one training rollout by its logged key, and the rollout's reasoning texts
    (the next rollout's ``previous_thinks``, for the echo-trap similarity).

    ``episodes`` is the whole gathered batch (whole groups, in order), ``rewards`` their (NaN for
    excluded) rewards, ``env`` the name its ``env/<name>/...`` metrics go under, or a function giving
    each episode's (several envs in one run: a block of metrics per env), ``timings`` this process's
    seconds generating and in env calls (``Rollout.timings``).
    """
    names = [env(ep) for ep in episodes] if callable(env) else [env] * len(episodes)
    out: dict[str, float] = {}
    zero_std = []
    for name in dict.fromkeys(names):  # in order of appearance
        rows = [i for i, n in enumerate(names) if n == name]
        stats = episode_metrics([episodes[i] for i in rows], group_size)
        out.update({f"env/{name}/{key}": value for key, value in stats.items()})
        zero_std.append((stats.get("frac_zero_std_groups", 0.0), len(rows)))
        # how much of the return variance a critic could explain from the start state
        share = between_group_share(rewards[rows], group_size)
        if not math.isnan(share):
            out[f"env/{name}/reward_between_group_share"] = share
    thinks: list[str] = []
    if think:  # echo-trap indicators on the decoded reasoning
        texts = [parse_reply(m["content"]).think for ep in episodes for m in ep.messages if m["role"] == "assistant"]
        out.update({f"reasoning/{key}": value for key, value in reasoning_metrics(texts, previous_thinks).items()})
        thinks = [t for t in texts if t]
        if shaping:
            out["reasoning/shaping_reward"] = sum(ep.shaping_reward for ep in episodes) / len(episodes)
    model_tokens = [sum(ep.env_mask) for ep in episodes]
    out.update(
        {
            "env/errors": float(sum(ep.env_error is not None for ep in episodes)),
            "reward": torch.nanmean(rewards).item(),
            "reward_std": nanstd(rewards, dim=0).item(),
            "frac_reward_zero_std": sum(f * n for f, n in zero_std) / len(episodes),
            "rollout/cut_turn_fraction": sum(sum(ep.turn_cut) for ep in episodes)
            / max(1, sum(len(ep.turn_cut) for ep in episodes)),
            "rollout/kept_fraction": num_kept_groups * group_size / len(episodes),
            "completions/mean_length": sum(model_tokens) / len(model_tokens),
            "rollout/generate_seconds": timings["generate"],
            "rollout/env_seconds": timings["env"],
        }
    )
    return out, thinks


def critic_metrics(
    advantages: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mean and std of the critic's advantages, returns and values over the model tokens (``mask``)."""
    m = mask.bool()
    out = {}
    for name, x in (("advantages", advantages), ("returns", returns), ("values", values)):
        out[f"{name}/mean"] = x[m].mean().item() if m.any() else 0.0
        out[f"{name}/std"] = x[m].std().item() if m.sum() > 1 else 0.0
    out["advantages/max"] = advantages[m].max().item() if m.any() else 0.0
    out["advantages/min"] = advantages[m].min().item() if m.any() else 0.0
    return out


def sample_rows(episodes: list[Episode], advantages: list[float], n: int) -> list[dict]:
    """``n`` episodes spread evenly over ``episodes`` as rows of TRL's completions table: the first
    user message, the rest of the conversation, reward, advantage, seed, success, turns."""
    n = min(n, len(episodes))
    picks = sorted({round(j * (len(episodes) - 1) / max(1, n - 1)) for j in range(n)}) if n else []
    return [
        {
            "prompt": episodes[j].messages[0]["content"] if episodes[j].messages else "",
            "completion": "\n".join(f"[{m['role']}] {m['content']}" for m in episodes[j].messages[1:]),
            "reward": episodes[j].reward,
            "advantages": advantages[j],
            "seed": episodes[j].start.seed,
            "success": episodes[j].success,
            "turns": episodes[j].num_turns,
        }
        for j in picks
    ]


def episode_means(advantages: torch.Tensor, mask: torch.Tensor, owner: list[int], num_episodes: int) -> torch.Tensor:
    """Each episode's mean per-token advantage over its model tokens (``mask``), its rows being those
    whose ``owner`` it is (rows after ``len(owner)`` are padding). (B, T) -> (num_episodes,)."""
    n = len(owner)
    index = torch.tensor(owner, dtype=torch.long)
    sums = torch.zeros(num_episodes).index_add_(0, index, (advantages[:n] * mask[:n]).sum(1).float().cpu())
    counts = torch.zeros(num_episodes).index_add_(0, index, mask[:n].sum(1).float().cpu())
    return sums / counts.clamp(min=1)


def held_out_metrics(played: dict[str, list[Episode]]) -> dict[str, float]:
    """The held-out table from each eval env's episodes (env name -> episodes): ``episode_metrics`` over
    all of them, and with several envs also ``<name>/<metric>`` per env."""
    metrics = episode_metrics([ep for episodes in played.values() for ep in episodes])
    if len(played) > 1:
        for name, episodes in played.items():
            metrics.update({f"{name}/{k}": v for k, v in episode_metrics(episodes).items()})
    return metrics
