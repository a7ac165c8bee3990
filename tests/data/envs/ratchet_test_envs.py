"""A module that registers Gymnasium envs when imported (for the ``module:EnvId`` form): a CartPole, and two whose
own code raises (in step, in reset)."""
import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv

gymnasium.register(id="RatchetCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                   max_episode_steps=200, reward_threshold=190.0)


class StepRaises(CartPoleEnv):
    """CartPole whose 5th step of every episode raises (a bug of the env's own, not of any policy)."""

    def reset(self, **kwargs):
        self.steps_taken = 0
        return super().reset(**kwargs)

    def step(self, action):
        self.steps_taken += 1
        if self.steps_taken == 5:
            raise RuntimeError("env bug in step")
        return super().step(action)


class ResetRaises(CartPoleEnv):
    """CartPole whose reset raises."""

    def reset(self, **kwargs):
        raise ValueError("env bug in reset")


gymnasium.register(id="RatchetStepRaises-v0", entry_point=StepRaises, max_episode_steps=200)
gymnasium.register(id="RatchetResetRaises-v0", entry_point=ResetRaises, max_episode_steps=200)
