"""Gymnasium's LunarLanderContinuous heuristic, flown in wind: the base of a residual policy.

A port of ``heuristic()`` from ``gymnasium/envs/box2d/lunar_lander.py`` (Gymnasium, Farama
Foundation; originally by Oleg Klimov for OpenAI Gym), continuous-action branch. It aims the lander's
tilt back toward the pad (proportional to horizontal offset and speed, clipped to ±0.4 rad), holds a
hover height proportional to the horizontal offset, and turns the two PD demands into the main and
side engine throttles; once a leg touches the ground it only damps the vertical speed. It was written
for calm air: wind and turbulence push it off the pad and into the ground, and tip it over once a leg
is down (the heuristic stops steering its tilt at touch-down).

The heuristic's gains and its tilt limit are parameters, and so is the gain its touch-down branch
sets to zero: ``contact_angle_gain`` (0 in the heuristic) keeps steering the tilt
toward upright after a leg touches down. With the defaults below the policy is exactly Gymnasium's
heuristic (``tests/test_policy.py`` checks it action for action). ratchet's ``residual`` refiner
keeps it as it is and learns a correction network added to its action.
"""
import numpy as np

PARAMETERS = {
    # target angle = x_gain * x + vx_gain * vx, clipped to +-angle_limit (rad)
    "x_gain": {"default": 0.5, "low": 0.0, "high": 1.5},
    "vx_gain": {"default": 1.0, "low": 0.0, "high": 3.0},
    "angle_limit": {"default": 0.4, "low": 0.05, "high": 1.0},
    # target height = hover_x_gain * |x|
    "hover_x_gain": {"default": 0.55, "low": 0.0, "high": 1.5},
    # angle_todo = (angle_targ - angle) * angle_p - angular_speed * angle_d
    "angle_p": {"default": 0.5, "low": 0.0, "high": 1.5},
    "angle_d": {"default": 1.0, "low": 0.0, "high": 3.0},
    # hover_todo = (hover_targ - y) * hover_p - vy * hover_d
    "hover_p": {"default": 0.5, "low": 0.0, "high": 1.5},
    "hover_d": {"default": 0.5, "low": 0.0, "high": 1.5},
    # after leg contact: hover_todo = -vy * contact_vy_gain
    "contact_vy_gain": {"default": 0.5, "low": 0.0, "high": 1.5},
    # after leg contact: angle_todo = contact_angle_gain * (-angle * angle_p - angular_speed * angle_d)
    "contact_angle_gain": {"default": 0.0, "low": 0.0, "high": 1.5},
}


def act(observation, params):
    """Return the [main, lateral] engine throttles, each in [-1, 1]."""
    s = observation
    lim = params["angle_limit"]
    angle_targ = min(lim, max(-lim, s[0] * params["x_gain"] + s[2] * params["vx_gain"]))
    hover_targ = params["hover_x_gain"] * np.abs(s[0])
    angle_todo = (angle_targ - s[4]) * params["angle_p"] - s[5] * params["angle_d"]
    hover_todo = (hover_targ - s[1]) * params["hover_p"] - s[3] * params["hover_d"]
    if s[6] or s[7]:  # legs have contact
        angle_todo = params["contact_angle_gain"] * (-s[4] * params["angle_p"] - s[5] * params["angle_d"])
        hover_todo = -s[3] * params["contact_vy_gain"]
    return np.clip(np.array([hover_todo * 20 - 1, -angle_todo * 20]), -1, +1)
