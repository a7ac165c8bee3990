"""Failure diagnosers: label why an episode failed, from its recorded outcome only.

A diagnoser maps an :class:`~ratchet.rollout.Episode` to a list of labels, most specific first; the
critic groups failing episodes by the first label. Diagnosers read only what the ledger holds
(termination flags, final observation, final reward), so they never run policy code. Tasks without a
diagnoser fall back to clustering (see :class:`~ratchet.critic.Critic`).
"""

from __future__ import annotations

from collections.abc import Callable

from ratchet.rollout import Episode

__all__ = [
    "Diagnoser",
    "bipedal_walker",
    "cartpole",
    "diagnoser_for",
    "lunar_lander",
    "mountain_car",
    "observation_names",
]

Diagnoser = Callable[[Episode], list[str]]


def _obs(ep: Episode) -> list[float]:
    return list(ep.diagnostics.get("final_observation") or [])


def lunar_lander(ep: Episode) -> list[str]:
    """LunarLander (v2/v3), from the env's termination rules.

    The env ends an episode with reward −100 when the lander's body touches the ground (crash) or
    ``|x| ≥ 1`` (out of bounds), and with +100 when the lander comes to rest. The pad spans
    ``|x| ≤ 0.2`` in observation units (between the flags).

    Labels: ``error``, ``hovered until time-out``, ``flew out of bounds``, ``crashed``,
    ``landed off the pad``, ``landed, low score``.
    """
    if ep.error:
        return ["error"]
    obs = _obs(ep)
    x = obs[0] if obs else 0.0
    if ep.timed_out:
        return ["hovered until time-out"]
    final = ep.diagnostics.get("final_reward")
    if final is None and ep.terminated and len(obs) >= 8:  # ledgers written before final_reward was recorded
        landed = obs[6] > 0 and obs[7] > 0 and abs(obs[4]) < 0.5
        final = 100 if landed and abs(x) < 1.0 else -100
    if ep.terminated and final == -100:
        return ["flew out of bounds"] if abs(x) >= 1.0 else ["crashed"]
    if ep.terminated and abs(x) > 0.2:
        return ["landed off the pad"]
    return ["landed, low score"]


def cartpole(ep: Episode) -> list[str]:
    """CartPole: the episode ends when ``|x| > 2.4`` (cart left the track) or ``|θ| > 12°`` (pole fell)."""
    if ep.error:
        return ["error"]
    if ep.timed_out:
        return ["time-out"]
    obs = _obs(ep)
    if obs and abs(obs[0]) > 2.4:
        return ["cart left the track"]
    return ["pole fell"]


def bipedal_walker(ep: Episode) -> list[str]:
    """BipedalWalker: −100 on the last step means the hull touched the ground or walked off the left
    edge (fell); a time-out with almost no forward speed (``|obs[2]| < 0.02``) is a stall."""
    if ep.error:
        return ["error"]
    if ep.terminated and ep.diagnostics.get("final_reward") == -100:
        return ["fell"]
    obs = _obs(ep)
    if ep.timed_out and obs and abs(obs[2]) < 0.02:
        return ["stalled"]
    if ep.timed_out:
        return ["time-out"]
    return ["reached the end, low score"]


def mountain_car(ep: Episode) -> list[str]:
    """MountainCar (v0 and Continuous): the episode terminates when the car reaches the flag (position ≥ 0.5)
    and is truncated at the time limit. A failing episode that terminated reached the goal, only too slowly
    (or, Continuous, too wastefully) for the success threshold: it is named so, never as a crash.

    Labels: ``error``, ``time-out before reaching the goal``, ``reached the goal, return below the success
    threshold``.
    """
    if ep.error:
        return ["error"]
    if ep.timed_out:
        return ["time-out before reaching the goal"]
    return ["reached the goal, return below the success threshold"]


_DIAGNOSERS: dict[str, Diagnoser] = {
    "LunarLander-": lunar_lander,
    "CartPole-": cartpole,
    "BipedalWalker-": bipedal_walker,
    "MountainCar-": mountain_car,
    "MountainCarContinuous-": mountain_car,
}

_NAMES: dict[str, list[str]] = {
    "LunarLander-": ["x", "y", "vx", "vy", "angle", "angular_velocity", "left_leg_contact", "right_leg_contact"],
    "CartPole-": ["cart_position", "cart_velocity", "pole_angle", "pole_angular_velocity"],
    "Pendulum-": ["cos_theta", "sin_theta", "theta_dot"],
    "MountainCarContinuous-": ["position", "velocity"],
    "MountainCar-": ["position", "velocity"],
    "Acrobot-": ["cos_theta1", "sin_theta1", "cos_theta2", "sin_theta2", "theta1_dot", "theta2_dot"],
}


def _match(env_id: str, table: dict) -> object | None:
    for prefix, value in table.items():
        if env_id.split("/")[-1].startswith(prefix):
            return value
    return None


def diagnoser_for(env_id: str) -> Diagnoser | None:
    """The shipped diagnoser for a Gymnasium id (LunarLander, CartPole, BipedalWalker, MountainCar), or None."""
    return _match(env_id, _DIAGNOSERS)  # type: ignore[return-value]


def observation_names(env_id: str, size: int) -> list[str]:
    """Readable names of the observation's components (``obs[i]`` when unknown)."""
    names = _match(env_id, _NAMES)
    if isinstance(names, list) and len(names) == size:
        return list(names)
    return [f"obs[{i}]" for i in range(size)]
