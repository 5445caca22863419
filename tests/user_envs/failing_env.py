"""An env whose reset always raises after the contract check's seeds (0 and 1)."""

import gymnasium as gym

from envs.bandit import BanditEnv


class AlwaysFails(BanditEnv):
    def reset(self, *, seed=None, options=None):
        if seed is not None and seed > 1:
            raise RuntimeError("this env is broken")
        return super().reset(seed=seed, options=options)


gym.register("AlwaysFails-v0", entry_point=AlwaysFails, disable_env_checker=True, order_enforce=False)
