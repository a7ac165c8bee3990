"""ratchet evaluator: online bin packing by a compiled program (examples/bin_packing's task, C++ candidates).

The instances, the scoring and the metric are examples/bin_packing/evaluate.py's, loaded from that file (the
instance kind from ``[task] options``, as there): only how the candidate is asked differs. A Python candidate is
called once per item; this one is a program (``[policy] kind = "source"``) that gets the whole instance on stdin
(``CAPACITY N`` then the N item sizes) and prints the bin of every item. The evaluator checks that the answer is a
valid *online* packing (item i goes to a bin opened before it, or to the next new bin; no bin overfilled) and scores
it exactly as the Python evaluator scores its packing, so the same heuristic gets the same score in either language
(tests/test_source_policy.py checks it).

ratchet stores this file's source in the ledger; the file it loads (../bin_packing/evaluate.py) is read when the
evaluator loads, so keep it unchanged for a run's resume and replay.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ratchet.tasks.evaluator import CandidateError, numbers

_spec = importlib.util.spec_from_file_location(
    "cpp_binpack_core", Path(__file__).resolve().parent.parent / "bin_packing" / "evaluate.py")
assert _spec is not None and _spec.loader is not None
core = importlib.util.module_from_spec(_spec)
core.OPTIONS = dict(globals().get("OPTIONS") or {})  # type: ignore[attr-defined]  # the instance kind, as there
_spec.loader.exec_module(core)

FUNCTIONS = {
    "pack": (
        "pack(instance, params) -> str: instance is text, 'CAPACITY N' then the N item sizes; answer with N bin "
        "numbers (0 for the first bin opened, then 1, ...), the bin each item goes to, items placed online in order"
    )
}
DESCRIPTION = core.DESCRIPTION
COST_UNIT = core.COST_UNIT
MAX_COST = core.MAX_COST


def make_instance(seed: int) -> dict:
    """Instance ``seed``: examples/bin_packing's, the same items for the same seed."""
    return core.make_instance(seed)


def replay(items: np.ndarray, capacity: int, bins: np.ndarray) -> dict:
    """The packing an answer describes, checked online: ``{"bins_used", "remaining", "new_bin_choices"}`` as
    examples/bin_packing's pack() reports it; CandidateError for a bin not yet opened or overfilled."""
    rem = np.empty(len(items), dtype=np.float64)
    used, new_when_fit, cap = 0, 0, float(capacity)
    for i, (size, b) in enumerate(zip(items, bins)):
        item = float(size)
        if b == used:  # a new bin
            if np.any(rem[:used] >= item):
                new_when_fit += 1
            rem[used] = cap - item
            used += 1
        elif 0 <= b < used:
            if rem[b] < item:
                raise CandidateError(f"item {i} (size {int(size)}) does not fit bin {b} ({rem[b]:g} left)")
            rem[b] -= item
        else:
            raise CandidateError(f"item {i} goes to bin {b}, but only bins 0..{used} can take it (online)")
    return {"bins_used": used, "remaining": rem[:used].copy(), "new_bin_choices": new_when_fit}


def evaluate(instance: dict, policy: object) -> dict:
    """Score the program's packing of one instance (the evaluator contract's ``evaluate``)."""
    items = instance["items"]
    text = f"{instance['capacity']} {len(items)}\n" + " ".join(str(int(x)) for x in items) + "\n"
    answer = policy.pack(text)  # type: ignore[attr-defined]
    bins = numbers(answer, len(items), "the bins", dtype=np.int64)
    return core.score_packing(instance, replay(items, int(instance["capacity"]), bins))
