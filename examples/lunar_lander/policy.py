"""Gymnasium's hand-written LunarLander heuristic with its constants exposed as parameters.

This is a port of ``heuristic()`` from ``gymnasium/envs/box2d/lunar_lander.py``
(Gymnasium, Farama Foundation; originally by Oleg Klimov for OpenAI Gym),
discrete-action branch. The controller computes a target tilt that points the
lander back toward the pad (proportional to horizontal offset and speed, clipped),
and a target hover height proportional to the horizontal offset. PD terms on the
angle and height errors give ``angle_todo`` and ``hover_todo``; once a leg touches
the ground it only damps vertical speed. The action is the main engine when the
hover demand dominates and exceeds a threshold, otherwise a side engine when the
angle demand exceeds a threshold, otherwise no-op.

With the defaults below the policy is exactly Gymnasium's heuristic (mean return
about 232 on held-out seeds); the constants are what ratchet refines.
"""

PARAMETERS = {
    # target angle = x_gain * x + vx_gain * vx, clipped to +-angle_limit
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
    # thresholds for firing the main / side engines
    "main_threshold": {"default": 0.05, "low": 0.0, "high": 0.3},
    "side_threshold": {"default": 0.05, "low": 0.0, "high": 0.3},
}


def act(observation, params):
    """Return a discrete LunarLander action (0 noop, 1 left, 2 main, 3 right)."""
    s = observation
    angle_lim = params["angle_limit"]
    angle_targ = s[0] * params["x_gain"] + s[2] * params["vx_gain"]
    angle_targ = min(angle_targ, angle_lim)
    angle_targ = max(angle_targ, -angle_lim)
    hover_targ = params["hover_x_gain"] * abs(s[0])

    angle_todo = (angle_targ - s[4]) * params["angle_p"] - s[5] * params["angle_d"]
    hover_todo = (hover_targ - s[1]) * params["hover_p"] - s[3] * params["hover_d"]

    if s[6] or s[7]:  # legs have contact
        angle_todo = 0.0
        hover_todo = -s[3] * params["contact_vy_gain"]

    side_thr = params["side_threshold"]
    if hover_todo > abs(angle_todo) and hover_todo > params["main_threshold"]:
        return 2
    if angle_todo < -side_thr:
        return 3
    if angle_todo > side_thr:
        return 1
    return 0
