"""Energy-pumping swing-up plus linear balance controller for Pendulum-v1.

Pendulum-v1 integrates ``thdot += (15 sin th + 3 u) dt`` (g=10, m=l=1, dt=0.05),
with ``th = 0`` upright, so ``E = 0.5 thdot**2 + 15 cos th`` is conserved when
``u = 0`` and equals 15 at rest upright. Far from the top the controller pumps
energy toward ``energy_target * 15`` with
``u = pump_gain * (E_target - E) * (thdot + phase_lead * sin th)``
(``dE/dt = 3 u thdot``): a smoothed bang-bang push along the velocity
(Astrom & Furuta style energy control). ``phase_lead`` lets the torque reverse
before the swing's turning point; a time-optimal swing-up (checked against a
dynamic-programming solution) reverses earlier than pure energy pumping does.
Within the upright cone ``cos th > switch_cos`` it switches to a PD (LQR-like)
stabiliser ``u = -(kp th + kd thdot)``. Torque is clipped to the env's +-2 limit.
The observation is ``[cos th, sin th, thdot]``. The defaults are reasonable but
untuned (plain energy pumping, soft PD; mean return about -156); tuned
parameters reach about -149.
"""
import numpy as np

PARAMETERS = {
    # swing-up: u = pump_gain * (energy_target*15 - E) * (thdot + phase_lead * sin th)
    "pump_gain": {"default": 1.0, "low": 0.01, "high": 100.0, "scale": "log"},
    "energy_target": {"default": 1.0, "low": 0.8, "high": 1.2},
    # phase shift of the pumping signal: push along (thdot + phase_lead * sin th)
    "phase_lead": {"default": 0.0, "low": -4.0, "high": 4.0},
    # switch to balance when cos(theta) exceeds this
    "switch_cos": {"default": 0.85, "low": 0.5, "high": 0.99},
    # balance: u = -(kp * theta + kd * thetadot)
    "kp": {"default": 10.0, "low": 0.0, "high": 40.0},
    "kd": {"default": 2.0, "low": 0.0, "high": 10.0},
}

_MAX_TORQUE = 2.0


def act(observation, params):
    """Return a torque array of shape (1,), float32, within [-2, 2]."""
    c, s, thdot = float(observation[0]), float(observation[1]), float(observation[2])
    if c > params["switch_cos"]:
        th = np.arctan2(s, c)
        u = -(params["kp"] * th + params["kd"] * thdot)
    else:
        energy = 0.5 * thdot * thdot + 15.0 * c
        u = (params["pump_gain"] * (params["energy_target"] * 15.0 - energy)
             * (thdot + params["phase_lead"] * s))
    u = min(max(u, -_MAX_TORQUE), _MAX_TORQUE)
    return np.array([u], dtype=np.float32)
