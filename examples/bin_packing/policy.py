"""Best fit for online bin packing, written as a program whose numbers can move.

``priority(item, bins, params)`` scores every candidate bin by the gap it would leave, ``gap = bins - item``
(the last entry of ``bins`` is always a new, empty bin). Best fit is ``-gap``: the tightest bin wins and a new
bin, whose gap is the largest, only when nothing else fits. The other terms are the ideas FunSearch's evolved
heuristics share (Romera-Paredes et al., Nature 2023), each switched off (zero weight) at its default:

- a *tight fit* bonus for gaps up to ``tight_gap`` (a fraction of the capacity): near-exact fits close a bin;
- a *dead gap* penalty for gaps above ``tight_gap`` and up to ``dead_gap``: a bin left with a small gap that few
  later items fit is capacity lost, so such a bin is better left open for a tighter item;
- a *spread* slope for gaps beyond ``spread_gap``: once the gap is large anyway, ``spread_weight`` above 1
  prefers the emptier bin (worst fit among them: the tight bins stay open for items that fit them exactly),
  1 makes them equal (the oldest wins), below 1 keeps best fit's order;
- a *new bin* bonus added to the last entry's score: positive opens new bins more readily, negative less
  (with a spread slope above 1 the new, emptiest bin would otherwise look best).

All scores are in units of the capacity. With the defaults below the policy is exactly best fit.
"""

import numpy as np

PARAMETERS = {
    "tight_gap": {"default": 0.02, "low": 0.0, "high": 0.1},
    "tight_bonus": {"default": 0.0, "low": 0.0, "high": 1.0},
    "dead_gap": {"default": 0.15, "low": 0.0, "high": 0.5},
    "dead_penalty": {"default": 0.0, "low": 0.0, "high": 1.0},
    "spread_gap": {"default": 0.5, "low": 0.0, "high": 1.0},
    "spread_weight": {"default": 0.0, "low": 0.0, "high": 3.0},
    "new_bin_bonus": {"default": 0.0, "low": -1.0, "high": 1.0},
}


def priority(item, bins, params):
    """Score each candidate bin (the last entry is a new bin); the item goes to the highest score."""
    capacity = bins[-1]
    gap = (bins - item) / capacity  # what would be left, as a fraction of the capacity
    score = -gap  # best fit
    tight = gap <= params["tight_gap"]
    score = score + np.where(tight, params["tight_bonus"], 0.0)
    dead = ~tight & (gap <= params["dead_gap"])
    score = score - np.where(dead, params["dead_penalty"], 0.0)
    score = score + params["spread_weight"] * np.maximum(gap - params["spread_gap"], 0.0)
    score[-1] += params["new_bin_bonus"]
    return score
