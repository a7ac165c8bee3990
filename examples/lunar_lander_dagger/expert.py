"""Expert for the DAgger / HG-DAgger example: the refined LunarLander heuristic plus a takeover rule.

``act`` is ``examples/lunar_lander/policy.py`` (Gymnasium's heuristic with its constants as parameters);
the defaults below are the incumbent of ``ratchet run examples/lunar_lander`` on run seed 0 (three
promotions; validation mean 287.8, test 282.8 ± 21.7 with 99.5 % of 200 test episodes ≥ 200, as in the
top-level README).

``takeover`` is the scripted "person" of an I3L-style protocol: it says when the expert should grab the
controls from the student — the lander is in danger (tilted or spinning, falling fast close to the
ground, drifting far from the pad, or flying too high). The HG-DAgger refiner hands control back once it
has been false for ``handback_steps`` steps in a row.
"""
PARAMETERS = {
    "x_gain": {"default": 0.3785693186315053, "low": 0.0, "high": 1.5},
    "vx_gain": {"default": 1.3002312729169652, "low": 0.0, "high": 3.0},
    "angle_limit": {"default": 0.6076222200195335, "low": 0.05, "high": 1.0},
    "hover_x_gain": {"default": 1.0442123056042216, "low": 0.0, "high": 1.5},
    "angle_p": {"default": 1.499956804621498, "low": 0.0, "high": 1.5},
    "angle_d": {"default": 2.2426480512433784, "low": 0.0, "high": 3.0},
    "hover_p": {"default": 0.2869469398956856, "low": 0.0, "high": 1.5},
    "hover_d": {"default": 0.5891810921136462, "low": 0.0, "high": 1.5},
    "contact_vy_gain": {"default": 1.2820996716687132, "low": 0.0, "high": 1.5},
    "main_threshold": {"default": 0.15018554693039302, "low": 0.0, "high": 0.3},
    "side_threshold": {"default": 0.1506309789479229, "low": 0.0, "high": 0.3},
}


def act(observation, params):
    """Return a discrete LunarLander action (0 noop, 1 left, 2 main, 3 right)."""
    s = observation
    angle_lim = params["angle_limit"]
    angle_targ = s[0] * params["x_gain"] + s[2] * params["vx_gain"]
    angle_targ = max(-angle_lim, min(angle_lim, angle_targ))
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


def takeover(observation, params):
    """True when the lander is in danger: observation = x, y, vx, vy, angle, angular velocity, legs."""
    x, y, _vx, vy, angle, spin = observation[:6]
    if observation[6] and observation[7]:  # both legs down: nothing left to save
        return False
    tilted = abs(angle) > 0.6 or abs(spin) > 1.0
    falling = y < 0.4 and vy < -0.8
    astray = abs(x) > 0.5
    too_high = y > 1.6
    return bool(tilted or falling or astray or too_high)
