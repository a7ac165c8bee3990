"""Gymnasium's hand-written BipedalWalker heuristic with its constants exposed as parameters.

This is a port of ``BipedalWalkerHeuristics`` from ``gymnasium/envs/box2d/bipedal_walker.py``
(Gymnasium, Farama Foundation; originally by Oleg Klimov for OpenAI Gym), the demo controller
at the bottom of that file, for BipedalWalker-v3 (normal terrain).

The controller is a three-state gait machine over a *moving* and a *supporting* leg:

* ``STAY_ON_ONE_LEG`` — swing the moving leg forward (hip target ``lift_hip``, knee target
  ``lift_knee``) while the supporting knee straightens gradually toward ``support_knee``
  (by ``knee_step`` per step, plus ``knee_step_fast`` when the hull is faster than ``speed``).
  When the supporting hip angle drops below ``behind_threshold`` (the supporting leg is behind
  the body) → ``PUT_OTHER_DOWN``.
* ``PUT_OTHER_DOWN`` — bring the moving leg down (hip ``put_down_hip``, knee ``put_down_knee``)
  until its foot touches the ground → ``PUSH_OFF``; the supporting-knee target is reset to
  ``min(moving knee angle, support_knee)``.
* ``PUSH_OFF`` — extend the old supporting knee to ``push_knee`` to push the body forward until
  that knee passes ``push_end_knee`` or the hull is faster than ``push_end_speed * speed``; then
  the legs swap roles → ``STAY_ON_ONE_LEG``.

Joint targets are tracked by PD terms (``hip_p``/``hip_d``, ``knee_p``/``knee_d``); every step
both hips also get a PD correction that keeps the hull level (``head_p``/``head_d``) and both
knees a term against vertical hull speed (``vy_damp``). The torques are scaled by
``output_gain`` and clipped to [-1, 1].

With the defaults below the policy is exactly Gymnasium's heuristic, including two quirks of
the original: the first action of an episode is all zeros (the demo loop steps once with a
zero action before the heuristic sees an observation), and a joint target that is exactly 0.0
is treated as "no target" (the original tests ``if knee_targ[0]:``). The arithmetic is done in
the same order and types as the original, so on a fresh env and the same seed the episode
matches the original step for step (ratchet casts actions to float32, as this function returns). It walks but
has "no notion of balance" (Gymnasium's comment): it often falls, which costs -100. The
constants are what ratchet refines. The gait state lives in module globals, reset by
``reset(params, seed)`` at the start of every episode.
"""
import numpy as np

PARAMETERS = {
    # hull speed above which the supporting knee straightens faster / push-off ends early
    "speed": {"default": 0.29, "low": 0.1, "high": 0.6},
    # supporting-knee target (upper limit) while standing on one leg
    "support_knee": {"default": 0.1, "low": -0.3, "high": 0.5},
    # per-step increase of the supporting-knee target; the fast one is added when vx > speed
    "knee_step": {"default": 0.03, "low": 0.0, "high": 0.1},
    "knee_step_fast": {"default": 0.03, "low": 0.0, "high": 0.1},
    # swing phase: hip / knee targets of the moving leg
    "lift_hip": {"default": 1.1, "low": 0.5, "high": 1.5},
    "lift_knee": {"default": -0.6, "low": -1.2, "high": 0.2},
    # supporting hip angle below which the supporting leg counts as behind -> put the other down
    "behind_threshold": {"default": 0.1, "low": -0.3, "high": 0.5},
    # put-down phase: hip / knee targets of the moving leg
    "put_down_hip": {"default": 0.1, "low": -0.3, "high": 0.6},
    "put_down_knee": {"default": 0.1, "low": -0.3, "high": 0.5},
    # push-off: supporting-knee target, and the knee angle / speed factor that end the push
    "push_knee": {"default": 1.0, "low": 0.3, "high": 1.5},
    "push_end_knee": {"default": 0.88, "low": 0.4, "high": 1.2},
    "push_end_speed": {"default": 1.2, "low": 0.8, "high": 2.0},
    # PD gains tracking the joint targets
    "hip_p": {"default": 0.9, "low": 0.0, "high": 3.0},
    "hip_d": {"default": 0.25, "low": 0.0, "high": 1.0},
    "knee_p": {"default": 4.0, "low": 0.0, "high": 10.0},
    "knee_d": {"default": 0.25, "low": 0.0, "high": 1.0},
    # hull-levelling PD on both hips: hip_todo -= head_p * (0 - angle) - head_d * angular_speed
    "head_p": {"default": 0.9, "low": 0.0, "high": 3.0},
    "head_d": {"default": 1.5, "low": 0.0, "high": 4.0},
    # knee_todo -= vy_damp * vertical_speed (damps bouncing)
    "vy_damp": {"default": 15.0, "low": 0.0, "high": 30.0},
    # action = clip(output_gain * todo, -1, 1)
    "output_gain": {"default": 0.5, "low": 0.1, "high": 1.0},
}

STAY_ON_ONE_LEG, PUT_OTHER_DOWN, PUSH_OFF = 1, 2, 3

_ZERO_ACTION = np.zeros(4, dtype=np.float32)

# Gait state (reset at every episode start).
_first_step = True
_state = STAY_ON_ONE_LEG
_moving_leg = 0
_supporting_leg = 1
_supporting_knee_angle = 0.1


def reset(params, seed):
    """Start a new episode: first leg 0 swings, supporting-knee target = ``support_knee``."""
    global _first_step, _state, _moving_leg, _supporting_leg, _supporting_knee_angle
    _first_step = True
    _state = STAY_ON_ONE_LEG
    _moving_leg = 0
    _supporting_leg = 1
    _supporting_knee_angle = params["support_knee"]


def act(observation, params):
    """Return the four joint torques (hip 0, knee 0, hip 1, knee 1) as float32 in [-1, 1]."""
    global _first_step, _state, _moving_leg, _supporting_leg, _supporting_knee_angle
    if _first_step:  # the original demo steps once with a zero action before using observations
        _first_step = False
        return _ZERO_ACTION.copy()

    s = observation
    p = params
    speed = p["speed"]
    support_knee = p["support_knee"]
    moving = _moving_leg
    supporting = _supporting_leg
    moving_s_base = 4 + 5 * moving
    supporting_s_base = 4 + 5 * supporting

    hip_targ = [None, None]
    knee_targ = [None, None]

    state = _state
    ska = _supporting_knee_angle
    if state == STAY_ON_ONE_LEG:
        hip_targ[moving] = p["lift_hip"]
        knee_targ[moving] = p["lift_knee"]
        ska += p["knee_step"]
        if s[2] > speed:
            ska += p["knee_step_fast"]
        ska = min(ska, support_knee)
        knee_targ[supporting] = ska
        if s[supporting_s_base + 0] < p["behind_threshold"]:  # supporting leg is behind
            state = PUT_OTHER_DOWN
    if state == PUT_OTHER_DOWN:
        hip_targ[moving] = p["put_down_hip"]
        knee_targ[moving] = p["put_down_knee"]
        knee_targ[supporting] = ska
        if s[moving_s_base + 4]:  # moving leg touches the ground
            state = PUSH_OFF
            ska = min(s[moving_s_base + 2], support_knee)
    if state == PUSH_OFF:
        knee_targ[moving] = ska
        knee_targ[supporting] = p["push_knee"]
        if s[supporting_s_base + 2] > p["push_end_knee"] or s[2] > p["push_end_speed"] * speed:
            state = STAY_ON_ONE_LEG
            _moving_leg = 1 - moving
            _supporting_leg = moving
    _state = state
    _supporting_knee_angle = ska

    hip_todo = [0.0, 0.0]
    knee_todo = [0.0, 0.0]
    hip_p, hip_d, knee_p, knee_d = p["hip_p"], p["hip_d"], p["knee_p"], p["knee_d"]
    # "if target:" as in the original (None and exactly 0.0 mean no target)
    if hip_targ[0]:
        hip_todo[0] = hip_p * (hip_targ[0] - s[4]) - hip_d * s[5]
    if hip_targ[1]:
        hip_todo[1] = hip_p * (hip_targ[1] - s[9]) - hip_d * s[10]
    if knee_targ[0]:
        knee_todo[0] = knee_p * (knee_targ[0] - s[6]) - knee_d * s[7]
    if knee_targ[1]:
        knee_todo[1] = knee_p * (knee_targ[1] - s[11]) - knee_d * s[12]

    head = p["head_p"] * (0 - s[0]) - p["head_d"] * s[1]  # keep the hull level
    hip_todo[0] -= head
    hip_todo[1] -= head
    vy = p["vy_damp"] * s[3]  # vertical speed, to damp oscillations
    knee_todo[0] -= vy
    knee_todo[1] -= vy

    a = np.array([hip_todo[0], knee_todo[0], hip_todo[1], knee_todo[1]], dtype=np.float64)
    return np.clip(p["output_gain"] * a, -1.0, 1.0).astype(np.float32)
