"""MountainCar-v0 from a controller that looks only at where the car is, never at how fast it moves.

It pushes right once the car is past a switch point, else left. No switch point gets the car up the
hill: climbing needs momentum, built by pushing the way the car already moves, and this program never
reads the velocity. Tuning its one number (CMA-ES alone) cannot fix that; a change of structure can.
"""

PARAMETERS = {
    "switch": {"default": -0.5, "low": -1.2, "high": 0.6},  # position (m) past which the car pushes right
}


def act(observation, params):
    # observation: position (m, -1.2 to 0.6), velocity (-0.07 to 0.07); actions 0 = push left, 1 = none, 2 = right
    return 2 if observation[0] > params["switch"] else 0
