"""A packing of n = 26 circles as a construction with 52 numbers: where the circles start.

``pack(n, params)`` takes the starting centres (``params["centres"]``, 26 rows of x, y in the unit square) and runs
a short deterministic local optimisation from them, as the best programs AlphaEvolve and OpenEvolve report do:
SciPy's SLSQP over the centres and radii together, maximising the sum of the radii subject to no overlap and every
circle inside the square (analytic gradients, at most ``ITERATIONS`` iterations). What SLSQP leaves slightly
infeasible is then shrunk until the packing is valid, so the score is what the evaluator checks (and where SLSQP
ends worse than it started, the start is kept). The same
starting centres always give the same packing: the score is deterministic.

The search (CMA-ES, or mutate) moves the starting centres; each start falls into the basin of a local optimum, so
the search walks from basin to basin. At the defaults (rows of 5, 5, 6, 5, 5) it scores about 2.587.
"""

import numpy as np

N = 26
ITERATIONS = 300

PARAMETERS = {
    "centres": {"shape": [26, 2], "low": 0.0, "high": 1.0, "default": [
        [0.1, 0.1], [0.3, 0.1], [0.5, 0.1], [0.7, 0.1], [0.9, 0.1],
        [0.1, 0.3], [0.3, 0.3], [0.5, 0.3], [0.7, 0.3], [0.9, 0.3],
        [0.083, 0.5], [0.25, 0.5], [0.417, 0.5], [0.583, 0.5], [0.75, 0.5], [0.917, 0.5],
        [0.1, 0.7], [0.3, 0.7], [0.5, 0.7], [0.7, 0.7], [0.9, 0.7],
        [0.1, 0.9], [0.3, 0.9], [0.5, 0.9], [0.7, 0.9], [0.9, 0.9]]},
}

_I, _J = np.triu_indices(N, 1)


def _constraints(z):
    """Every constraint as a value that must be >= 0: pairs (squared distance minus squared sum of radii), then
    the four walls."""
    c, r = z[:2 * N].reshape(N, 2), z[2 * N:]
    d = c[_I] - c[_J]
    pair = (d ** 2).sum(1) - (r[_I] + r[_J]) ** 2
    return np.concatenate([pair, c[:, 0] - r, c[:, 1] - r, 1 - c[:, 0] - r, 1 - c[:, 1] - r])


def _jacobian(z):
    c, r = z[:2 * N].reshape(N, 2), z[2 * N:]
    d, s = c[_I] - c[_J], r[_I] + r[_J]
    m = len(_I)
    rows = np.arange(m)
    jp = np.zeros((m, 3 * N))
    jp[rows, 2 * _I], jp[rows, 2 * _I + 1] = 2 * d[:, 0], 2 * d[:, 1]
    jp[rows, 2 * _J], jp[rows, 2 * _J + 1] = -2 * d[:, 0], -2 * d[:, 1]
    jp[rows, 2 * N + _I], jp[rows, 2 * N + _J] = -2 * s, -2 * s
    k = np.arange(N)
    jw = np.zeros((4 * N, 3 * N))
    for w, (axis, sign) in enumerate(((0, 1), (1, 1), (0, -1), (1, -1))):
        jw[w * N + k, 2 * k + axis] = sign
        jw[w * N + k, 2 * N + k] = -1
    return np.vstack([jp, jw])


def _valid(c, r):
    """Radii shrunk until the circles at centres ``c`` are inside the square and apart (a few 1e-12 at most)."""
    c = np.clip(c, 0.0, 1.0)
    r = np.clip(np.minimum.reduce([r, c[:, 0], c[:, 1], 1 - c[:, 0], 1 - c[:, 1]]), 0.0, None)
    dist = np.hypot(*(c[_I] - c[_J]).T)
    for _ in range(100):
        over = r[_I] + r[_J] > dist
        if not over.any():
            break
        scale = np.ones(N)
        f = np.where(over, dist / np.maximum(r[_I] + r[_J], 1e-300), 1.0) * (1 - 1e-12)
        np.minimum.at(scale, _I, f)
        np.minimum.at(scale, _J, f)
        r = r * scale
    return c, r


def pack(n, params):
    """The circles, as rows (x, y, radius), after SLSQP from the starting centres."""
    from scipy.optimize import minimize

    if n != N:
        raise ValueError(f"this construction packs {N} circles, not {n}")
    c0 = np.clip(np.asarray(params["centres"], dtype=np.float64).reshape(N, 2), 0.01, 0.99)
    c0, r0 = _valid(c0, np.full(N, 0.05))
    n_var = 3 * N
    goal = np.concatenate([np.zeros(2 * N), -np.ones(N)])
    res = minimize(lambda z: float(goal @ z), np.concatenate([c0.ravel(), r0]), jac=lambda z: goal, method="SLSQP",
                   bounds=[(0.0, 1.0)] * (2 * N) + [(0.0, 0.5)] * N,
                   constraints=[{"type": "ineq", "fun": _constraints, "jac": _jacobian}],
                   options={"maxiter": ITERATIONS, "ftol": 1e-12})
    c, r = c0, r0
    if np.all(np.isfinite(res.x)) and len(res.x) == n_var:
        c1, r1 = _valid(res.x[:2 * N].reshape(N, 2), res.x[2 * N:])
        if r1.sum() > r.sum():  # SLSQP may stop somewhere worse than it started (a failed line search)
            c, r = c1, r1
    return np.column_stack([c, r])
