"""FrozenLake: cross a frozen lake to the goal without falling into a hole.

## Description
A random square lake per seed (Gymnasium's ``generate_random_map``: each cell frozen with
probability ``p``, always with a path from start to goal) played with Gymnasium's own
``FrozenLakeEnv`` dynamics. On slippery ice (default) the intended move happens with probability
1/3 and each perpendicular move with probability 1/3.

## Actions
``Left``, ``Down``, ``Right``, ``Up`` (Gymnasium's order 0..3). Anything else is an invalid action:
the state does not change and the step counts.

## Observation
The lake, one text row per line::

    P_O_
    ____
    _O__
    ___G

``P`` player, ``_`` frozen ice, ``O`` hole, ``G`` goal, ``X`` player in a hole, ``√`` player on the goal.

## Rewards
+1 on reaching the goal, 0 otherwise.

## Termination
Terminated in a hole or on the goal (``success`` only on the goal); truncated after ``max_steps``.

## Arguments
``size=4``, ``p=0.8`` (frozen probability), ``is_slippery=True``, ``desc=None`` (a fixed map, as a
list of strings in Gymnasium's ``SFHG`` letters, instead of one per seed), ``max_steps=100``,
``render_mode=None | "ansi"``.

## Version history
v0: first version.
"""

from __future__ import annotations

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from envs.base import TextEnv, step_info, value_iteration

ACTIONS = ["Left", "Down", "Right", "Up"]


class FrozenLakeEnv(TextEnv):
    action_names = ACTIONS

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = True,
        desc: list[str] | None = None,
        max_steps: int = 100,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode)
        if not 0 < p <= 1:
            raise ValueError(f"p (frozen probability) must be in (0, 1], got {p}")
        self.size, self.p, self.is_slippery, self.max_steps = size, p, is_slippery, max_steps
        self.fixed_desc = [str(row) for row in desc] if desc is not None else None
        slip = (
            "The ice is slippery: you move in the intended direction only 1/3 of the time, otherwise to "
            "one of the two perpendicular directions. "
            if is_slippery
            else ""
        )
        self.instructions = (
            "You are walking on a frozen lake. Reach the goal without falling into a hole. "
            + slip
            + "Symbols: P you, _ frozen ice, O hole, G goal, X you in a hole, √ you on the goal. "
            f"Actions: {', '.join(ACTIONS)}. Reward: 1 on reaching the goal, 0 otherwise."
        )
        self._policy_cache: dict[tuple[str, ...], object] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        lake_seed = self.new_episode_seed(seed)
        desc = self.fixed_desc or generate_random_map(size=self.size, p=self.p, seed=lake_seed)
        self.lake = GymFrozenLake(desc=desc, is_slippery=self.is_slippery)
        self.lake.reset(seed=lake_seed)
        self.desc_rows = tuple(desc)
        self.steps = 0
        self.done = False
        return self.render_text(), step_info(False, True, False)

    @property
    def state(self) -> int:
        return int(self.lake.s)

    def state_key(self) -> int:
        """The square the player is on (the lake is the start state's)."""
        return self.state

    def step(self, action: str):
        self.steps += 1
        idx = self.match_action(action)
        reward, terminated, effective = 0.0, self.done, False
        if idx is not None and not self.done:
            before = self.state
            _, reward, terminated, _, _ = self.lake.step(idx)
            effective = self.state != before
            self.done = terminated
        success = self._cell(self.state) == "G"
        truncated = not terminated and self.steps >= self.max_steps
        return (
            self.render_text(),
            float(reward),
            bool(terminated),
            truncated,
            step_info(success, idx is not None, effective),
        )

    def _cell(self, s: int) -> str:
        ncol = len(self.desc_rows[0])
        return self.desc_rows[s // ncol][s % ncol]

    def render_text(self) -> str:
        ncol = len(self.desc_rows[0])
        pr, pc = divmod(self.state, ncol)
        rows = []
        for r, line in enumerate(self.desc_rows):
            out = []
            for c, ch in enumerate(line):
                if (r, c) == (pr, pc):
                    out.append({"H": "X", "G": "√"}.get(ch, "P"))
                else:
                    out.append({"S": "_", "F": "_", "H": "O", "G": "G"}[ch])
            rows.append("".join(out))
        return "\n".join(rows)

    def expert_thought(self) -> str:
        """Where the player and the goal are (rows and columns from 1) and which moves lead into a hole,
        e.g. ``I am at row 1, column 2. The goal is at row 4, column 4. Holes: Down.``"""
        ncol = len(self.desc_rows[0])
        pr, pc = divmod(self.state, ncol)
        gr, gc = next((r, row.index("G")) for r, row in enumerate(self.desc_rows) if "G" in row)
        steps = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
        holes = [
            name
            for name, (dr, dc) in steps.items()
            if 0 <= pr + dr < len(self.desc_rows) and 0 <= pc + dc < ncol and self.desc_rows[pr + dr][pc + dc] == "H"
        ]
        return f"I am at row {pr + 1}, column {pc + 1}. The goal is at row {gr + 1}, column {gc + 1}. " + (
            f"Holes: {', '.join(holes)}." if holes else "No hole next to me."
        )

    def expert_action(self) -> str:
        """Optimal action by value iteration on the lake's transition table (success probability)."""
        policy = self._policy_cache.get(self.desc_rows)
        if policy is None:
            policy = value_iteration(self.lake.P, self.lake.observation_space.n, 4, gamma=0.999)
            self._policy_cache[self.desc_rows] = policy
        return ACTIONS[int(policy[self.state])]
