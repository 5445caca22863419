"""A reasoning-gym task as a text env: its question in, its own scorer as the reward.

## Description
One procedurally generated question of a `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_
dataset (``pip install starpo-trl[reasoning-gym]``): ``dataset`` names it (``chain_sum``,
``basic_arithmetic``, ``countdown``, ... any of ``reasoning_gym.factory.DATASETS``) and
``config`` holds that dataset's own settings (e.g. ``{"min_terms": 2, "max_terms": 4}``). The seed
decides the question (the dataset is built with ``seed`` and ``size=1``), so the same seed gives
the same question. With ``max_attempts > 1`` a wrong answer gets feedback and the question again,
up to that many answers (multi-turn).

## Actions
The answer as free text (what goes inside ``<answer>...</answer>``).

## Observation
The dataset's question; after a wrong answer with attempts left:
``Not correct (score 0.25). Attempt 2 of 3. <question>``.

## Rewards
The dataset's ``score_answer`` (0 to 1) of each answer.

## Termination
Terminated when an answer scores at least ``success_score`` (success) or after ``max_attempts``
answers.

## Arguments
``dataset="chain_sum"``, ``config=None``, ``max_attempts=1``, ``success_score=1.0``,
``render_mode=None | "ansi"``.

## Version history
v0: first version.
"""

from __future__ import annotations

from envs.base import TextEnv, step_info


class ReasoningGymEnv(TextEnv):
    def __init__(
        self,
        dataset: str = "chain_sum",
        config: dict | None = None,
        max_attempts: int = 1,
        success_score: float = 1.0,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode)
        try:
            import reasoning_gym
        except ImportError:
            raise ImportError(
                "starpo/ReasoningGym-v0 needs reasoning-gym: pip install 'starpo-trl[reasoning-gym]' (or reasoning-gym)."
            ) from None
        if dataset not in reasoning_gym.factory.DATASETS:
            raise ValueError(
                f"reasoning-gym has no dataset {dataset!r}; some it has: {sorted(reasoning_gym.factory.DATASETS)[:12]}"
            )
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self._create = reasoning_gym.create_dataset
        self.dataset, self.config = dataset, dict(config or {})
        self.max_attempts, self.success_score = max_attempts, success_score
        self._create(dataset, seed=0, size=1, **self.config)  # a bad config fails here, with the dataset's own message
        self.instructions = "Answer the question with its final answer only, in the form the question asks for." + (
            f" A wrong answer gets feedback; you have {max_attempts} attempts." if max_attempts > 1 else ""
        )
        self.entry, self.attempts, self.feedback = None, 0, ""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.source = self._create(self.dataset, seed=self.new_episode_seed(seed), size=1, **self.config)
        self.entry, self.attempts, self.feedback = self.source[0], 0, ""
        return self.render_text(), step_info(False, True, False)

    def step(self, action):
        answer = action.strip() if isinstance(action, str) else ""
        score = float(self.source.score_answer(answer=answer, entry=self.entry)) if answer else 0.0
        self.attempts += 1
        success = score >= self.success_score
        done = success or self.attempts >= self.max_attempts
        self.feedback = (
            "" if done else f"Not correct (score {score:g}). Attempt {self.attempts + 1} of {self.max_attempts}. "
        )
        return self.render_text(), score, done, False, step_info(success, bool(answer), bool(answer))

    def render_text(self) -> str:
        return self.feedback + str(self.entry["question"])

    def expert_action(self) -> str:
        return str(self.entry["answer"])
