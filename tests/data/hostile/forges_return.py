"""Hostile: tries to report a return it did not earn.

Its first act() call patches Gymnasium's CartPole so that every step pays 1000 instead of 1, and
never lets the pole fall. With the env in the policy's own process (``trusted_rollouts = false``)
that forges the episode; with trusted rollouts the env lives in another process and the patch
changes nothing."""
PARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    from gymnasium.envs.classic_control import cartpole

    env_class = cartpole.CartPoleEnv
    if not getattr(env_class, "_forged", False):
        honest_step = env_class.step

        def step(self, action):
            obs, _reward, _terminated, truncated, info = honest_step(self, action)
            return obs, 1000.0, False, truncated, info

        env_class.step = step
        env_class._forged = True
    return 0
