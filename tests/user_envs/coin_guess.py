"""An env that lives outside the package, as a user's own would: ``coin_guess:CoinGuess-v0``."""

import gymnasium as gym

from envs.base import TextEnv, step_info


class CoinGuessEnv(TextEnv):
    action_names = ["heads", "tails"]
    instructions = "A coin was tossed. Guess the side it shows: heads or tails. Reward 1 for a right guess."

    def __init__(self, bias: float = 0.5, render_mode=None):
        super().__init__(render_mode)
        self.bias = bias

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.side = 0 if self.np_random.random() < self.bias else 1
        return self.render_text(), step_info(False, True, False)

    def step(self, action):
        idx = self.match_action(action)
        right = idx == self.side
        return self.render_text(), float(right), True, False, step_info(right, idx is not None, idx is not None)

    def render_text(self):
        return "The coin is on the table."

    def expert_action(self):
        return self.action_names[self.side]


gym.register("CoinGuess-v0", entry_point=CoinGuessEnv, disable_env_checker=True, order_enforce=False)
