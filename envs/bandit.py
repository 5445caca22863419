"""Two-armed bandit: one pull, one turn.

## Description
Two named arms. One is safe (always pays ``safe_reward``), the other risky (pays ``risky_reward``
with probability ``risky_prob``, else 0). The seed decides which name is the risky arm; the
observation describes both, so the agent must read it. With the defaults the risky arm is the
better bet (expected 0.25 against 0.15). Training uses the names ``Dragon``/``Phoenix``; the
registered test variant ``starpo/BanditTest-v0`` uses ``Tiger``/``Crane`` to check that the
learned behaviour is not tied to two words. ``arm_names`` may also be a list of pairs (one drawn
per seed, then the risky one of its two names), e.g. ``PAYOUT_TRAIN_PAIRS``: many pairs, none of
them the test names, so that only the payouts tell the arms apart.

Held out (``starpo/BanditHeldout-v0``): ``HELDOUT_PAIRS``, 16 pairs of the same kinds of names
(animals, stones, stars, plants), none in any training pair; ``BanditTest-v0``'s Tiger / Crane is
the first. With ``pair_by_seed=True`` the seed picks pair ``seed % len(arm_names)``, so any 16
consecutive seeds show every pair once (the seed still draws which name is risky).

Varied payouts (``vary_payouts=True``; ``starpo/BanditPayouts-v0`` on the training pairs,
``starpo/BanditPayoutsHeldout-v0`` on the held-out ones): each seed draws the safe payout from
0.1-0.6, the risky payout from 0.5-1.5 and its probability from 0.1-0.6 (two decimals, as shown),
again until the two expected payouts differ by at least 0.1, so every prompt is decidable from its
numbers and the safe arm is the better bet in about half of them (46% of 20,000 seeds). A policy
must compare the numbers: picking the line that says "with probability" is right only half the time.

The paper's form (``show_payouts=False``; ``starpo/BanditSymbolic-v0`` and
``starpo/BanditSymbolicTest-v0``): the observation gives only the two names, a low-risk-sounding
and a high-risk-sounding one, and the agent must reason from their meaning. ``arm_names`` is then
``(low-risk name, high-risk name)`` (or a list of such pairs, one drawn per seed): the high-risk
name is always the risky arm, which has the higher expected payout; the seed decides the order in
which the two are listed. Training uses ``Phoenix``/``Dragon``; the test variant draws from
pairs never seen in training (``Turtle``/``Shark``, ``Bank``/``Casino``, ``Shield``/``Sword``,
``Oak``/``Storm``).

Mirrored seeds (``mirror_seeds=True``, payouts shown): seeds ``2k`` and ``2k+1`` show the same name
pair with the risky arm swapped (the pair and the first one's risky arm drawn from ``k``). The two
prompts differ only in which line says "with probability", so a policy that ignores the payouts
earns the best arm on exactly one of them. Trained on consecutive seeds (``shuffle_dataset: false``,
an even ``num_start_states``), every step holds each prompt with its mirror: a preference for one
name gets as much reward on one as it loses on the other, and what is left of the gradient is the
reading of the payout lines (StarPOConfig refuses a mirrored env without those settings, before any model
loads). Over many ``k`` the pairs and risky arms are as often drawn as without it.

## Actions
The arm names, e.g. ``Dragon`` or ``Phoenix`` (case-insensitive). Anything else is an invalid
action: nothing is pulled and the step counts.

## Observation
::

    Arm Dragon: pays 0.15 every time.
    Arm Phoenix: pays 1.0 with probability 0.25, otherwise 0.

With ``show_payouts=False``: ``Arms: Dragon, Phoenix.``

## Rewards
The pulled arm's payout. With ``expected_reward=True``, its expected payout instead (0.25 for the
risky arm, 0.15 for the safe one with the defaults): the same choice problem without the draw's
noise, for training (a group of 8 pulls cannot tell a 0.1 edge from luck: the risky arm's payout
has a standard deviation of 0.43). Observation, actions and ``success`` are unchanged.

## Termination
Terminated after the first valid pull. ``success`` means the arm with the higher expected payout
was chosen, whatever the draw paid. Truncated after ``max_steps`` invalid actions.

## Arguments
``arm_names=("Dragon", "Phoenix")``, ``safe_reward=0.15``, ``risky_reward=1.0``,
``risky_prob=0.25``, ``max_steps=10``, ``show_payouts=True``, ``expected_reward=False``,
``mirror_seeds=False``, ``pair_by_seed=False``, ``vary_payouts=False``, ``render_mode=None | "ansi"``.

## Version history
v0: first version; ``show_payouts`` added (the paper's names-only form); several pairs with
payouts shown; ``expected_reward``; ``mirror_seeds``; ``pair_by_seed`` and ``vary_payouts`` (the held-out
pairs and the varied payouts).
"""

from __future__ import annotations

import numpy as np

from envs.base import TextEnv, step_info

TRAIN_ARMS = ("Dragon", "Phoenix")
TEST_ARMS = ("Tiger", "Crane")
# with payouts shown: training pairs that leave out the test names (the payouts alone tell the arms apart)
PAYOUT_TRAIN_PAIRS = [
    ("Dragon", "Phoenix"),
    ("Lion", "Eagle"),
    ("Wolf", "Owl"),
    ("Ruby", "Pearl"),
    ("Maple", "Cedar"),
    ("Comet", "Moon"),
    ("Falcon", "Dove"),
    ("Bear", "Fox"),
    ("River", "Stone"),
    ("Amber", "Jade"),
    ("Orion", "Vega"),
    ("Rose", "Lily"),
]
# held out from every training pair above: 16 pairs of animals, stones, stars and plants (Tiger / Crane, BanditTest's
# pair, among them); starpo/BanditHeldout-v0 shows pair ``seed % 16``, so any 16 consecutive seeds show each once
HELDOUT_PAIRS = [
    ("Tiger", "Crane"),
    ("Otter", "Heron"),
    ("Lynx", "Raven"),
    ("Badger", "Swan"),
    ("Bison", "Koala"),
    ("Onyx", "Topaz"),
    ("Opal", "Garnet"),
    ("Quartz", "Agate"),
    ("Sirius", "Rigel"),
    ("Altair", "Deneb"),
    ("Polaris", "Mira"),
    ("Willow", "Birch"),
    ("Aspen", "Hazel"),
    ("Tulip", "Iris"),
    ("Fern", "Ivy"),
    ("Clover", "Poppy"),
]
# varied payouts (``vary_payouts``): the ranges each seed draws from, and the smallest gap between the two arms'
# expected payouts (a prompt must be decidable from its numbers)
SAFE_RANGE, RISKY_RANGE, PROB_RANGE, MIN_GAP = (0.1, 0.6), (0.5, 1.5), (0.1, 0.6), 0.1
# the paper's form: (low-risk-sounding, high-risk-sounding) names; the high-risk one is the risky arm
SYMBOLIC_TRAIN_ARMS = ("Phoenix", "Dragon")
SYMBOLIC_TEST_ARMS = [("Turtle", "Shark"), ("Bank", "Casino"), ("Shield", "Sword"), ("Oak", "Storm")]


class BanditEnv(TextEnv):
    def __init__(
        self,
        arm_names: tuple[str, str] | list = TRAIN_ARMS,
        safe_reward: float = 0.15,
        risky_reward: float = 1.0,
        risky_prob: float = 0.25,
        max_steps: int = 10,
        show_payouts: bool = True,
        expected_reward: bool = False,
        mirror_seeds: bool = False,
        pair_by_seed: bool = False,
        vary_payouts: bool = False,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode)
        pairs = (
            [tuple(p) for p in arm_names] if arm_names and not isinstance(arm_names[0], str) else [tuple(arm_names)]
        )
        for pair in pairs:
            if len(pair) != 2 or pair[0].lower() == pair[1].lower():
                raise ValueError(f"arm_names must be two different names (or a list of such pairs), got {arm_names!r}")
        if not 0 <= risky_prob <= 1:
            raise ValueError(f"risky_prob must be in [0, 1], got {risky_prob}")
        if mirror_seeds and not show_payouts:
            raise ValueError(
                "mirror_seeds needs show_payouts=True: without payouts the high-risk-sounding name is always the "
                "risky arm, so there is no mirror to show."
            )
        if vary_payouts and not show_payouts:
            raise ValueError("vary_payouts needs show_payouts=True: the payouts are what the prompt must be read for.")
        if pair_by_seed and (mirror_seeds or not show_payouts):
            raise ValueError("pair_by_seed is for the held-out pairs with payouts shown, without mirror_seeds.")
        self.pairs, self.show_payouts, self.expected_reward = pairs, show_payouts, expected_reward
        self.mirror_seeds, self.pair_by_seed, self.vary_payouts = mirror_seeds, pair_by_seed, vary_payouts
        self.safe_reward, self.risky_reward, self.risky_prob = safe_reward, risky_reward, risky_prob
        self.max_steps = max_steps
        self._set_names(list(pairs[0]))

    def _set_names(self, names: list[str]) -> None:
        self.action_names = names
        if self.show_payouts:
            self.instructions = (
                f"You are playing a two-armed bandit. Pull exactly one arm: {names[0]} or {names[1]}. "
                "Each arm's payout is described below. Choose the arm with the higher expected reward. "
                f"Actions: {', '.join(names)}."
            )
        else:
            self.instructions = (
                f"You are playing a two-armed bandit. Pull exactly one arm: {names[0]} or {names[1]}. Each arm has its own "
                "reward distribution, related to its name. Think about the symbolic meaning of each name to guess how its "
                "rewards behave, and choose the arm you expect to pay more on average. "
                f"Actions: {', '.join(names)}."
            )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.show_payouts:  # several pairs: the seed picks the pair, then which of its names is risky
            mirrored = self.mirror_seeds and seed is not None
            rng = np.random.default_rng(seed // 2) if mirrored else self.np_random  # 2k and 2k+1 draw alike
            if self.pair_by_seed and seed is not None:
                self._set_names(list(self.pairs[seed % len(self.pairs)]))
            elif len(self.pairs) > 1:
                self._set_names(list(self.pairs[int(rng.integers(len(self.pairs)))]))
            self.risky = int(rng.integers(2)) ^ (seed % 2 if mirrored else 0)
            if self.vary_payouts:
                self._draw_payouts(rng)
        else:  # the high-risk-sounding name is the risky arm; the seed picks the pair and the listing order
            low, high = self.pairs[int(self.np_random.integers(len(self.pairs)))]
            first_high = bool(self.np_random.integers(2))
            self._set_names([high, low] if first_high else [low, high])
            self.risky = 0 if first_high else 1
        self.pulled: int | None = None
        self.steps = 0
        return self.render_text(), step_info(False, True, False)

    def _draw_payouts(self, rng) -> None:
        """Payouts for this seed, rounded to what the prompt shows (two decimals): drawn again until the two
        expected payouts differ by at least ``MIN_GAP``. The safe arm is the better bet in about half the seeds."""
        while True:
            safe = round(float(rng.uniform(*SAFE_RANGE)), 2)
            risky = round(float(rng.uniform(*RISKY_RANGE)), 2)
            prob = round(float(rng.uniform(*PROB_RANGE)), 2)
            if abs(risky * prob - safe) >= MIN_GAP:
                self.safe_reward, self.risky_reward, self.risky_prob = safe, risky, prob
                return

    def _describe(self, arm: int) -> str:
        if arm == self.risky:
            return f"pays {self.risky_reward} with probability {self.risky_prob}, otherwise 0."
        return f"pays {self.safe_reward} every time."

    @property
    def best_arm(self) -> int:
        return self.risky if self.risky_reward * self.risky_prob > self.safe_reward else 1 - self.risky

    def step(self, action: str):
        self.steps += 1
        idx = self.match_action(action)
        if self.pulled is not None or idx is None:
            done = self.pulled is not None
            return (
                self.render_text(),
                0.0,
                done,
                self.steps >= self.max_steps and not done,
                step_info(done and self.pulled == self.best_arm, idx is not None, False),
            )
        self.pulled = idx
        if idx == self.risky and self.expected_reward:
            reward = self.risky_reward * self.risky_prob
        elif idx == self.risky:
            reward = self.risky_reward if self.np_random.random() < self.risky_prob else 0.0
        else:
            reward = self.safe_reward
        return self.render_text(), float(reward), True, False, step_info(idx == self.best_arm, True, True)

    def render_text(self) -> str:
        if self.show_payouts:
            lines = [f"Arm {name}: {self._describe(i)}" for i, name in enumerate(self.action_names)]
        else:
            lines = [f"Arms: {', '.join(self.action_names)}."]
        if self.pulled is not None:
            lines.append(f"You pulled {self.action_names[self.pulled]}.")
        return "\n".join(lines)

    def expert_action(self) -> str:
        return self.action_names[self.best_arm]
