"""ratchet evaluator: online 1-D bin packing, as in FunSearch (Romera-Paredes et al., Nature 2023).

One self-contained file (ratchet stores its source in the ledger, so a resumed or replayed run scores with exactly
this code): the instance kind comes from the spec's ``[task] options = {kind = "weibull"}`` (or ``"or"``), which
ratchet sets as the module global ``OPTIONS`` before the file runs. ``benchmarks/bin_packing.py`` and
``tests/test_bin_packing.py`` load it too (``OPTIONS`` unset: Weibull) for the reference heuristics.

Instance kinds (every instance is generated from its seed with ``numpy.random.default_rng(seed)``):

- ``"weibull"``: 5,000 items, sizes ``round(45 * Weibull(shape 3))`` clipped to [1, 100], bin capacity 100
  (FunSearch's "Weibull 5k" distribution).
- ``"or"``: 500 items, sizes uniform integers in [20, 100], bin capacity 150 (the distribution of the OR-Library
  "OR3" instances — generated here, not OR3 itself).

Packing is online: items arrive in order and each is placed at once. For every item the policy's
``priority(item, bins)`` sees the remaining capacities of the open bins the item fits, in the order they were
opened, followed by one entry equal to the full capacity ("open a new bin"), and the item goes to the bin with
the highest score (ties: the first). FunSearch hands its heuristic all pre-allocated bins, the empty ones too;
one full-capacity entry stands for all of them.

Score: ``-excess %``, where ``excess % = 100 * (bins used - L1) / L1`` and ``L1 = ceil(sum(sizes) / capacity)``
(FunSearch's metric), so higher is better and 0 would be a perfect packing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ratchet.tasks.evaluator import CandidateError

KINDS: dict[str, dict[str, int | str]] = {
    "weibull": {"n_items": 5000, "capacity": 100, "label": "Weibull 5k (shape 3, scale 45, sizes 1-100)"},
    "or": {"n_items": 500, "capacity": 150, "label": "OR-style (500 items, sizes uniform 20-100)"},
}

FUNCTIONS = {
    "priority": (
        "priority(item, bins, params) -> np.ndarray: item is the size of the item to place (a float); bins is a "
        "float64 array (n,) of the remaining capacities of the open bins the item fits (every entry >= item), in "
        "the order the bins were opened, and its LAST entry is always the full bin capacity, standing for a new, "
        "empty bin. Return n finite scores (an array of shape (n,)); the item goes to the bin with the highest "
        "score (ties: the first)."
    )
}

WASTEFUL_PCT = 50.0  # excess above this gets the failure label "wasteful packing" (best fit is about 4 %)


def description(kind: str) -> str:
    """The task in words, for people and LLM prompts."""
    k = KINDS[kind]
    if kind == "weibull":
        dist = ("sizes are round(45 * w) for w drawn from a Weibull distribution of shape 3, clipped to 1..100 "
                "(mean about 40)")
    else:
        dist = "sizes are uniform random integers 20..100"
    return (
        f"Online one-dimensional bin packing ({k['label']}). Each instance is a sequence of {k['n_items']:,} "
        f"items whose {dist}; every bin holds {k['capacity']}. Items arrive one at a time and must be placed "
        "immediately, without knowing the later items. For every item the policy's priority(item, bins) scores "
        "the candidate bins: the open bins with room for the item, in the order they were opened, and, as the "
        "last entry, one new empty bin (remaining capacity = the full capacity); the item goes to the "
        "highest-scoring one. Best fit is priority = -(bins - item): the tightest open bin, a new bin only when "
        "nothing fits. Metric (FunSearch's): excess % = 100 * (bins used - L1) / L1 with the lower bound "
        "L1 = ceil(total size / capacity); the score is -excess %, so higher is better. Known ideas that beat "
        "best fit: avoid leaving small gaps that no later item can fill, strongly prefer near-exact fits, and "
        "sometimes open a new bin rather than spoil a nearly full one. The function is called once per item "
        "and must be fast (vectorised numpy, no per-bin Python loops)."
    )


def make_items(kind: str, seed: int) -> np.ndarray:
    """The item sizes of instance ``seed`` of ``kind`` (int64 array)."""
    rng = np.random.default_rng(seed)
    n = int(KINDS[kind]["n_items"])
    if kind == "weibull":
        sizes = np.clip(np.round(45.0 * rng.weibull(3.0, size=n)), 1, 100)
    elif kind == "or":
        sizes = rng.integers(20, 100, size=n, endpoint=True)
    else:
        raise ValueError(f"unknown bin packing kind {kind!r}; known: {sorted(KINDS)}")
    return sizes.astype(np.int64)


def make_kind_instance(kind: str, seed: int) -> dict:
    """Instance ``seed``: its items, capacity and L1 lower bound (a plain dict: it pickles anywhere)."""
    items = make_items(kind, seed)
    capacity = int(KINDS[kind]["capacity"])
    return {"kind": kind, "seed": int(seed), "capacity": capacity, "items": items,
            "lower_bound": lower_bound(items, capacity)}


def lower_bound(items: np.ndarray, capacity: int) -> int:
    """L1 = ceil(sum of sizes / capacity), the bound FunSearch's excess is measured against."""
    return -(-int(np.sum(items)) // int(capacity))  # exact integer ceil


def check_scores(scores: object, n: int) -> np.ndarray:
    """The candidate's scores as a float64 array of shape (n,), or CandidateError."""
    try:
        s = np.asarray(scores)
    except Exception as e:  # anything unconvertible is the candidate's answer, not the evaluator's fault
        raise CandidateError(f"priority returned something that is not an array ({type(scores).__name__})") from e
    if s.dtype == np.bool_ or not (np.issubdtype(s.dtype, np.integer) or np.issubdtype(s.dtype, np.floating)):
        raise CandidateError(f"priority returned dtype {s.dtype}; expected a numeric (int or float) array")
    if s.shape != (n,):
        raise CandidateError(f"priority returned shape {s.shape}; expected ({n},), one score per entry of bins")
    s = s.astype(np.float64, copy=False)
    if not np.all(np.isfinite(s)):
        raise CandidateError("priority returned a non-finite score (nan or inf)")
    return s


def pack(items: np.ndarray, capacity: int, priority: Callable[[float, np.ndarray], object]) -> dict:
    """Pack ``items`` online with ``priority(item, bins) -> scores``; one call per item.

    Returns ``{"bins_used", "remaining" (float64 array, one entry per used bin), "new_bin_choices"}``, the last
    being how often the policy opened a new bin although an open bin had room.
    """
    n = len(items)
    rem = np.empty(n, dtype=np.float64)  # remaining capacity of the open bins, in opening order
    used = 0
    new_when_fit = 0
    cap = float(capacity)
    for size in items:
        item = float(size)
        fit = np.flatnonzero(rem[:used] >= item)
        bins = np.empty(len(fit) + 1, dtype=np.float64)
        bins[:-1] = rem[fit]
        bins[-1] = cap
        scores = check_scores(priority(item, bins), len(bins))
        k = int(np.argmax(scores))
        if k == len(fit):
            if len(fit):
                new_when_fit += 1
            rem[used] = cap - item
            used += 1
        else:
            rem[fit[k]] -= item
    return {"bins_used": used, "remaining": rem[:used].copy(), "new_bin_choices": new_when_fit}


def score_packing(instance: dict, packed: dict) -> dict:
    """The evaluator's answer for one packed instance."""
    lb = int(instance["lower_bound"])
    used = int(packed["bins_used"])
    excess = 100.0 * (used - lb) / lb
    cap = float(instance["capacity"])
    out = {
        "score": -excess,
        "diagnostics": {
            "bins_used": float(used),
            "lower_bound": float(lb),
            "excess_pct": excess,
            "mean_fill": float(np.mean(1.0 - packed["remaining"] / cap)),
            "new_bin_choices": float(packed["new_bin_choices"]),
        },
        "cost": len(instance["items"]),
    }
    if excess > WASTEFUL_PCT:
        out["failure"] = "wasteful packing"
        out["text"] = (f"{used} bins for a lower bound of {lb} ({excess:.1f} % excess; best fit is about 4-6 %); "
                       f"a new bin was opened {packed['new_bin_choices']} times although an open bin had room")
    return out


def evaluate(instance: dict, policy: object) -> dict:
    """Score ``policy.priority`` on one instance (the evaluator contract's ``evaluate``)."""
    packed = pack(instance["items"], int(instance["capacity"]), policy.priority)  # type: ignore[attr-defined]
    return score_packing(instance, packed)


# Reference heuristics, as plain functions priority(item, bins) (no params), for benchmarks and tests.
def best_fit(item: float, bins: np.ndarray) -> np.ndarray:
    """The tightest bin that fits; a new bin only when nothing fits."""
    return -(bins - item)


def first_fit(item: float, bins: np.ndarray) -> np.ndarray:
    """The first (oldest) open bin that fits; the new-bin entry is last, so it is chosen only when nothing fits."""
    return -np.arange(len(bins), dtype=np.float64)


def excess_pct(instance: dict, priority: Callable[[float, np.ndarray], object]) -> float:
    """Excess % of one heuristic on one instance (no policy wrapper)."""
    return float(score_packing(instance, pack(instance["items"], int(instance["capacity"]), priority))
                 ["diagnostics"]["excess_pct"])


# -- the evaluator contract (ratchet.tasks.evaluator) ---------------------------------------------------------

KIND = str(globals().get("OPTIONS", {}).get("kind", "weibull"))
if KIND not in KINDS:
    raise ValueError(f"[task] options kind = {KIND!r}; known: {sorted(KINDS)}")
DESCRIPTION = description(KIND)
COST_UNIT = "items"
MAX_COST = int(KINDS[KIND]["n_items"])


def make_instance(seed: int) -> dict:
    """Instance ``seed`` of this evaluator's kind: its item sizes drawn with numpy's default_rng(seed)."""
    return make_kind_instance(KIND, seed)
