"""A module that registers a Gymnasium env when imported (for the ``module:EnvId`` form)."""
import gymnasium

gymnasium.register(id="RatchetCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                   max_episode_steps=200, reward_threshold=190.0)
