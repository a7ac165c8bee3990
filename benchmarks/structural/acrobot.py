"""A minimal Acrobot-v1 program (benchmark start for structural search): push the first joint the way
its own angular velocity points, with one gain. CMA-ES can only tune the gain; the structure is the limit."""

PARAMETERS = {
    "gain": {"default": 0.0, "low": -1.0, "high": 1.0},
}


def act(observation, params):
    # observation: cos θ1, sin θ1, cos θ2, sin θ2, θ1' (rad/s), θ2' (rad/s); actions 0, 1, 2 = torque -1, 0, +1
    return 2 if params["gain"] * observation[4] > 0 else 0
