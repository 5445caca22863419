"""Refilling the filtered batch (``rollout_filter_refill``): dynamic sampling with the StarPO-S filter.

The filter can keep fewer groups than a step should train on: with ``rollout_filter_include_zero=False``
a group whose episodes all earned the same reward is never kept, and ``top_p`` / ``min_p`` keep a
varying count. With the refill on, a training step that kept fewer than ``refill_groups()`` groups
plays further rounds from new start states, as many groups per round as the first (the same env
for each group), each round filtered on its own, until the kept groups reach the target or
``rollout_filter_max_rounds`` rounds have been played; the best ``target`` kept groups by the
filter's score (ties: the earlier group) are then trained on, or all of them when fewer (logged).

New start states come from ``FreshSeeds``: training seeds (``train_seed_offset`` ..
``+ num_train_seeds``) not played before in this run. Every process draws the same seeds and
decides on the same gathered episodes, so all processes play the same rounds. Held-out evaluation
never refills.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from starpo_trl.algorithms.filters import best_groups
from starpo_trl.algorithms.scoring import episode_reward_tensor, filter_groups, filter_scores
from starpo_trl.algorithms.settings import ScoringSettings
from starpo_trl.env_configs import EnvConfig, process_starts
from starpo_trl.rollout.batch import episode_filter_values

# a seed range at most this long is listed to draw from; a longer one is drawn from with retries
LISTED_SEEDS = 1_000_000


class FreshSeeds:
    """Seeds of ``seeds`` (a range) never played in this run: ``mark`` the seeds played, ``draw`` new ones.

    ``draw`` is deterministic in (``seed``, ``step``, ``round``) and the marked seeds, so every process
    draws the same. Seeds the sampler plays after a refill drew them may repeat them (as it repeats
    its own over epochs); a refill never repeats a seed played before it."""

    def __init__(self, seeds: range, seed: int):
        self.seeds, self.seed = seeds, seed
        self.played: set[int] = set()

    def mark(self, seeds) -> None:
        self.played.update(int(s) for s in seeds)

    def left(self) -> int:
        """How many seeds of the range were never played."""
        return len(self.seeds) - sum(1 for s in self.played if s in self.seeds)

    def draw(self, n: int, step: int, round_: int) -> list[int] | None:
        """``n`` distinct unplayed seeds (marked played), or None when fewer than ``n`` are left."""
        if self.left() < n:
            return None
        rng = random.Random(f"{self.seed}/{step}/{round_}")
        if len(self.seeds) <= LISTED_SEEDS:
            drawn = rng.sample([s for s in self.seeds if s not in self.played], n)
        else:  # a huge range: few of its seeds are played, so a random one is almost always new
            drawn = []
            while len(drawn) < n:
                s = self.seeds[rng.randrange(len(self.seeds))]
                if s not in self.played and s not in drawn:
                    drawn.append(s)
        self.mark(drawn)
        return drawn

    def state_dict(self) -> dict:
        return {"refill_played_seeds": sorted(self.played)}

    def load_state_dict(self, state: dict) -> None:
        self.played = set(state.get("refill_played_seeds", []))


@dataclass
class Refilled:
    episodes: list  # every round's gathered episodes, round after round
    kept_groups: torch.Tensor  # (K,) the groups trained on, indices into episodes // group_size, sorted
    group_env: list[int]  # the env index of every group of every round
    rounds: int  # rounds played, the first included
    target: int  # the kept-group count aimed at


def refill(
    episodes: list,
    group_env: list[int],
    group_size: int,
    target: int,
    max_rounds: int,
    num_processes: int,
    select: Callable[[list, list[int]], tuple[torch.Tensor, torch.Tensor, bool]],
    play_round: Callable[[int], list | None],
) -> Refilled:
    """Rounds until the kept groups reach ``target`` (see the module docstring).

    ``episodes`` are the first round's gathered episodes (groups contiguous, ``group_env`` the env index of
    each of its groups); ``select(episodes, group_env)`` filters one round: (kept group indices, every
    group's score, whether the largest scores are the best); ``play_round(r)`` plays round ``r`` (1, 2, ...)
    from new start states and returns its gathered episodes, or None when no new seed is left. The kept
    groups are cut to ``target`` (the best first) and then, lowest first, until their episodes divide evenly
    among ``num_processes``."""
    episodes = list(episodes)
    kept, scores, largest = select(episodes, group_env)
    envs, rounds = list(group_env), 1
    while len(kept) < target and rounds < max_rounds:
        more = play_round(rounds)
        if more is None:
            break
        more_kept, more_scores, _ = select(more, group_env)
        kept = torch.cat([kept, more_kept + len(episodes) // group_size])
        scores = torch.cat([scores, more_scores])
        episodes, envs, rounds = episodes + list(more), envs + list(group_env), rounds + 1
    kept = best_groups(scores, kept, target, largest)
    while len(kept) * group_size % num_processes:
        kept = kept[:-1]
    return Refilled(episodes, torch.sort(kept).values, envs, rounds, target)


def round_filter(
    settings: ScoringSettings, group_size: int
) -> Callable[[list, list[int]], tuple[torch.Tensor, torch.Tensor, bool]]:
    """``refill``'s ``select``: one round's gathered episodes -> the groups the ``rollout_filter_*`` settings
    keep (no trimming for processes), every group's score, and whether the largest are best."""

    def select(episodes: list, group_env: list[int]):
        failed = torch.tensor([ep.env_error is not None for ep in episodes])
        rewards = episode_reward_tensor([ep.reward for ep in episodes], failed, settings)
        values = episode_filter_values(episodes, settings.rollout_filter_metric)
        values = [None if v is None else torch.tensor(v, dtype=torch.float32) for v in values]
        kept = filter_groups(rewards, group_size, settings, *values, group_env=group_env)
        return (kept, *filter_scores(rewards, group_size, settings, *values))

    return select


class Refiller:
    """The trainer's refill, with its settings read once: ``scoring`` (the filter's and the rewards' settings,
    ``rollout_filter_max_rounds``), ``group_size`` episodes per group, ``target`` kept groups aimed at,
    ``seeds`` the fresh training seeds. ``play(starts)`` plays (and scores with the reward functions) this
    process's start states, ``gather(episodes)`` returns every process's in process order; ``group_envs`` is the
    env of each of a step's groups and ``group_env`` its index among the training envs. Every process calls it
    with the same gathered first round."""

    def __init__(
        self,
        scoring: ScoringSettings,
        group_size: int,
        target: int,
        seeds: FreshSeeds,
        group_envs: list[EnvConfig],
        group_env: list[int],
        play,
        gather,
        accelerator,
    ):
        self.settings, self.group_size, self.target, self.seeds = scoring, group_size, target, seeds
        self.group_envs, self.group_env = group_envs, group_env
        self.play, self.gather, self.accelerator = play, gather, accelerator

    @classmethod
    def of(cls, config, group_envs: list[EnvConfig], group_env: list[int], play, gather, accelerator) -> Refiller:
        """Read from a ``StarPOConfig``: its scoring settings, ``num_generations``, ``refill_groups()`` and its
        training seeds (``train_seeds()``, drawn with ``seed``)."""
        seeds = FreshSeeds(config.train_seeds(), config.seed)
        return cls(
            ScoringSettings.of(config),
            config.num_generations,
            config.refill_groups(),
            seeds,
            group_envs,
            group_env,
            play,
            gather,
            accelerator,
        )

    def __call__(self, episodes: list, step: int, timings: dict[str, float]) -> tuple[Refilled, dict[str, float]]:
        """The refilled batch of training step ``step`` (``timings`` gain the extra rounds' seconds), and its metrics."""
        self.seeds.mark(ep.start.seed for ep in episodes)
        g, n, rank = self.group_size, self.accelerator.num_processes, self.accelerator.process_index

        def play_round(round_: int) -> list | None:
            seeds = self.seeds.draw(len(self.group_envs), step, round_)
            if seeds is None:
                return None
            mine = seeds[rank * len(seeds) // n : (rank + 1) * len(seeds) // n]
            more = self.play(process_starts(self.group_envs, [s for s in mine for _ in range(g)], g, rank))
            for key, seconds in more.timings.items():
                timings[key] = timings.get(key, 0.0) + seconds
            return self.gather(list(more))

        rounds, select = self.settings.rollout_filter_max_rounds, round_filter(self.settings, g)
        refilled = refill(episodes, self.group_env, g, self.target, rounds, n, select, play_round)
        return refilled, refill_metrics(refilled, g)


def refill_metrics(refilled: Refilled, group_size: int) -> dict[str, float]:
    """``rollout/refill_rounds`` (rounds played, the first included), ``rollout/groups_generated`` and, when
    any group was kept, ``rollout/groups_generated_per_kept``; ``rollout/refill_short`` is 1 when the kept
    groups stayed below the target."""
    generated, kept = len(refilled.episodes) // group_size, len(refilled.kept_groups)
    metrics = {
        "rollout/refill_rounds": float(refilled.rounds),
        "rollout/groups_generated": float(generated),
        "rollout/refill_short": float(kept < refilled.target),
    }
    if kept:
        metrics["rollout/groups_generated_per_kept"] = generated / kept
    return metrics
