"""Circle packing: n circles in the unit square, maximise the sum of their radii (n = 26 by default).

The problem AlphaEvolve, OpenEvolve, ShinkaEvolve and GEPA report on (AlphaEvolve 2.635 for n = 26; the best
published packing sums to about 2.6359). There is one problem, not a family of instances: ``make_instance`` ignores
its seed, and the score depends on the candidate alone, so the task is declared deterministic (``[task]
deterministic = true`` in ratchet.toml): each distinct candidate is scored once.

This evaluator is the trusted side: it asks the candidate's ``pack(n, params)`` for the circles and checks them
itself. A packing is valid when every radius is ≥ 0, every circle lies inside the square and no two overlap, each
within :data:`TOLERANCE`; its score is then the sum of the radii. An invalid packing scores 0 (failure label
``"invalid packing"``, with what broke in its text); an answer of the wrong shape, or one with non-finite numbers,
fails the instance for the candidate.

Options (``[task] options``): ``n``, the number of circles (default 26).
"""

import numpy as np

from ratchet.tasks.evaluator import as_array

FUNCTIONS = {"pack": "pack(n, params) -> np.ndarray: the n circles as an (n, 3) array of rows (x, y, radius)"}
DESCRIPTION = ("Pack n circles in the unit square [0, 1]^2 without overlap so that the sum of their radii is as "
               "large as possible. Score: the sum of the radii of a valid packing, 0 for an invalid one.")
SUCCESS = "the packing is valid"

#: How far a packing may break a constraint and still be valid (unit-square units).
TOLERANCE = 1e-9

N = int(globals().get("OPTIONS", {}).get("n", 26))  # OPTIONS: [task] options, set by ratchet before this runs


def make_instance(seed):
    """The one problem: the number of circles (the seed is ignored: the task is deterministic)."""
    return N


def check(circles):
    """Why ``circles`` (an (n, 3) array of x, y, radius) is not a valid packing, or None when it is."""
    x, y, r = circles[:, 0], circles[:, 1], circles[:, 2]
    if (r < 0).any():
        return f"circle {int(np.argmin(r))} has a negative radius {r.min():.3g}"
    out = np.maximum.reduce([r - x, r - y, x + r - 1, y + r - 1])
    if (out > TOLERANCE).any():
        i = int(np.argmax(out))
        return f"circle {i} (x {x[i]:.6f}, y {y[i]:.6f}, r {r[i]:.6f}) leaves the square by {out[i]:.3g}"
    i, j = np.triu_indices(len(r), 1)
    overlap = r[i] + r[j] - np.hypot(x[i] - x[j], y[i] - y[j])
    if (overlap > TOLERANCE).any():
        k = int(np.argmax(overlap))
        return f"circles {i[k]} and {j[k]} overlap by {overlap[k]:.3g}"
    return None


def evaluate(n, policy):
    """The sum of the radii of the candidate's packing, or 0 with the reason when it is invalid."""
    circles = as_array(policy.pack(n), (n, 3), "pack()")
    why = check(circles)
    if why is not None:
        return {"score": 0.0, "success": False, "failure": "invalid packing", "text": why}
    radii = circles[:, 2]
    return {"score": float(radii.sum()), "success": True,
            "diagnostics": {"smallest_radius": float(radii.min()), "largest_radius": float(radii.max())}}
