"""Why a run promoted little, in numbers, and what to change: read from a finished run's ledger.

:func:`run_advice` looks at what the gate said each generation (the ``gate_note`` of every
``generation_finished`` event), at the gate decisions, and at the final incumbent's parameters. It
never runs policy code (the policy file is parsed with ``ast`` only).
"""

from __future__ import annotations

from typing import Any

__all__ = ["determinism_notes", "parameters_at_bounds", "run_advice"]

_SCREEN = ("not better on training seeds", "training mean")
_SHARE = "validation would take"
_BUDGET = "the budget cannot pay for validation"


def parameters_at_bounds(state: Any, tolerance: float = 1e-3) -> list[str]:
    """One line per scalar parameter of the final incumbent that the search moved to (within ``tolerance`` of its
    range) a bound, and one per array parameter with elements moved there (counted, not listed): the search
    wanted to go further than the declared range allows. A value the starting policy already had (at its bound from
    the start) is no sign of that and is not named."""
    from ratchet.policy import _infer_dims, parse_policy

    if not state.incumbent_id or state.incumbent_id == state.baseline_id or not state.policy_source:
        return []
    try:
        values = state.candidates.get(state.incumbent_id, {}).get("params", {})
        program = parse_policy(state.policy_source, "<policy>", dims=_infer_dims(state.policy_source, values),
                               functions=None)
    except Exception:  # noqa: BLE001 - advice is a hint: a source or parameters it cannot read give none, never a failed report
        return []
    values = state.candidates.get(state.incumbent_id, {}).get("params", {})
    start = state.candidates.get(state.baseline_id, {}).get("params", {})
    out = []
    for p in program.parameters:
        v = values.get(p.name)
        if p.is_array and isinstance(v, (list, tuple)):
            out += _array_at_bounds(p, v, tolerance, start.get(p.name))
            continue
        if not isinstance(v, (int, float)) or isinstance(v, bool) or p.type == "categorical":  # choices have no bounds
            continue
        if v == start.get(p.name):  # never moved
            continue
        span = p.high - p.low
        for side, bound in (("lower", p.low), ("upper", p.high)):
            if abs(v - bound) <= tolerance * span:
                out.append(f"parameter {p.name} = {v:.6g} sits at its {side} bound {bound:g}: the search wanted to "
                           "go further; widen its range in PARAMETERS")
    return out


def _array_at_bounds(p: Any, value: Any, tolerance: float, start: Any = None) -> list[str]:
    """One line for an array parameter with elements moved to a bound (how many, of how many; elements equal to
    ``start``'s, the starting policy's value, never moved), none otherwise."""
    import numpy as np

    try:
        v = np.asarray(value, dtype=np.float64).reshape(p.shape)
    except ValueError:
        return []
    try:
        moved = v != np.asarray(start, dtype=np.float64).reshape(p.shape)
    except (TypeError, ValueError):  # no start value of that shape: every element counts
        moved = np.ones(p.shape, dtype=bool)
    lo, hi = p.array("low"), p.array("high")
    span = hi - lo
    low, high = int(np.sum(moved & (v - lo <= tolerance * span))), int(np.sum(moved & (hi - v <= tolerance * span)))
    if not low + high:
        return []
    return [(f"parameter {p.name}: {low + high} of {v.size} elements sit at a bound ({low} lower, {high} upper): "
             "the search wanted to go further; widen their range in PARAMETERS")]


def run_advice(state: Any) -> list[str]:
    """Likely causes, in numbers, when a run promoted nothing or little (and did not reach its ``[budget]
    target``), and what to change (validation episodes, sigma0, bounds, budget), plus parameters left at a
    bound. Empty when there is nothing to say.

    Args:
        state: A projected run (:class:`ratchet.ledger.projection.RunState`).
    """
    out: list[str] = _not_deterministic(state)
    log, spec = state.generation_log, state.spec
    gate, refiner = spec.get("gate", {}), spec.get("refiner", {})
    n = len(log)
    reached = str(state.stop_reason or "").startswith("target reached")  # it promoted enough to stop
    if n and not reached and len(state.promotions) <= max(1, n // 10):
        notes = [g.get("gate_note") or "" for g in log if not g.get("gated")]
        screened = sum(note.startswith(_SCREEN) for note in notes)
        share = sum(note.startswith(_SHARE) for note in notes)
        budget = sum(note.startswith(_BUDGET) for note in notes)
        head = f"{len(state.promotions)} promotion(s) in {n} generation(s)"
        if screened >= max(1, n // 2):
            tables = [t for t in spec.get("refiners") or [] if t.get("kind") == "cmaes"]
            cmaes, table = (tables[0], "[[refiners]]") if tables else (refiner, "[refiner]")
            step = (f"try a smaller {table} sigma0 (now {cmaes.get('sigma0', 0.2):g}) for local steps, "
                    if tables or not spec.get("refiners") else "")
            rescue = (f"; nothing was promoted: {table} restarts = \"rescue\" starts CMA-ES again at the start when "
                      f"neither its samples nor its mean beat it for {table} stagnation generations"
                      if step and not state.promotions and cmaes.get("restarts", "none") in ("none", "ipop") else "")
            out.append(f"{head}: in {screened} the best contender did not beat the incumbent on the training seeds; "
                       f"the search is not finding better candidates: {step}more [planner] train_episodes for less "
                       "noisy ranking" + (", or wider parameter bounds" if step else "") + rescue)
        # refused for want of evidence: not those a guard refused after the test passed (a game's cycle guards)
        # (an exact decision needs no evidence: determinism_notes speaks of those)
        rejected = [g for g in state.gates if not g.get("promoted") and g.get("test") != "exact" and not (
            isinstance(g.get("p_value"), (int, float)) and isinstance(g.get("alpha"), (int, float))
            and g["p_value"] < g["alpha"])]
        gains = [g["mean_diff"] for g in rejected if isinstance(g.get("mean_diff"), (int, float))
                 and g["mean_diff"] == g["mean_diff"] and g["mean_diff"] > 0]
        # gates that lacked power want more validation seeds, so fewer is never also advised
        fewer = "" if gains else f" or lower [gate] validation_episodes (now {gate.get('validation_episodes')})"
        if share:
            out.append(f"{head}: {share} generation(s) skipped the gate because validation would exceed [gate] "
                       f"max_share = {gate.get('max_share', 0.3):g} of the {state.cost_unit}; raise max_share"
                       + (fewer or " or the budget"))
        if budget:
            out.append(f"{head}: in {budget} generation(s) the budget could not pay for a validation; raise the "
                       f"budget{fewer}")
        if gains:
            lo, hi = f"{min(gains):+.3g}", f"{max(gains):+.3g}"
            span = lo if lo == hi else f"{lo} to {hi}"  # one value, not "+1.63 to +1.63"
            out.append(f"{len(rejected)} gated candidate(s) were rejected, {len(gains)} of them with a positive mean "
                       f"gain ({span}) the test could not certify at its level: raise "
                       f"[gate] validation_episodes (now {gate.get('validation_episodes')}), or use test = \"betting\" "
                       "with validation_episodes = 100–200 (it stops early when the evidence is clear)")
    return out + parameters_at_bounds(state)


def _not_deterministic(state: Any) -> list[str]:
    """One line when the task was declared deterministic (``[task] deterministic``) and re-evaluations scored
    differently (gates refused with ``stopped_because = "not_deterministic"``): every such gate refused its candidate,
    so the run could promote nothing; what to change. Empty otherwise."""
    refused = [g for g in state.gates if g.get("stopped_because") == "not_deterministic"]
    if not refused or not (state.task or {}).get("deterministic"):
        return []
    return [(f"the task was declared deterministic but is not: {len(refused)} re-evaluation(s) scored differently "
             "from the first, and each refused its candidate; remove [task] deterministic = true (or make the "
             "task's score depend on the candidate alone, e.g. fix its seeding)")]


#: Most candidates evaluated more than once before :func:`determinism_notes` calls a task's scores deterministic.
_SEEN_TWICE = 2


def determinism_notes(state: Any) -> list[str]:
    """What the run's scores say about determinism, one line each (``ratchet show`` and the report).

    A task declared deterministic (``[task] deterministic``): that no statistics were needed, or — when a candidate
    scored differently on a re-evaluation (a gate's ``stopped_because = "not_deterministic"``, or two evaluations of
    one candidate that differ, its test included) — that the task is not deterministic, naming the candidate and the
    two scores. Any other task whose every candidate evaluated more than once (at least two of them, no errored
    episode) scored the same on every seed and evaluation: a hint to declare it. Empty otherwise.

    Args:
        state: A projected run (:class:`ratchet.ledger.projection.RunState`).
    """
    task = state.task or {}
    scores: dict[str, list[float]] = {}  # candidate id -> every clean score, in the order recorded
    errored = False
    for ev in state.evaluations:
        for ep in ev["episodes"]:
            if ep.get("error") is None:
                scores.setdefault(ev["candidate_id"], []).append(float(ep["episode_return"]))
            else:
                errored = True
    differs = next(((cid, s[0], next(x for x in s if x != s[0])) for cid, s in scores.items() if len(set(s)) > 1),
                   None)
    if task.get("deterministic"):
        refused = [g for g in state.gates if g.get("stopped_because") == "not_deterministic"]
        if refused:
            return [f"{len(refused)} decision(s) found a re-evaluation that differs: {refused[0]['reason']}"]
        if differs is not None:
            cid, a, b = differs
            return [(f"the task is not deterministic: candidate {cid} scored {a!r} and {b!r} on re-evaluation; "
                     "[task] deterministic = true does not hold for this task")]
        n = sum(len(s) for s in scores.values())
        return [(f"deterministic task ([task] deterministic): each distinct candidate was scored once ({len(scores)} "
                 f"candidates, {n} evaluations with the exact re-evaluations and the test); a promotion needed a strict "
                 "improvement beyond [gate] tolerance confirmed by an exact re-evaluation: no statistics were needed")]
    repeated = [s for s in scores.values() if len(s) > 1]
    if errored or differs is not None or len(repeated) < _SEEN_TWICE:
        return []
    return [(f"scores look deterministic: each of the {len(repeated)} candidates evaluated more than once scored the "
             "same on every seed and every evaluation; if the task's score depends on the candidate alone, declare "
             "[task] deterministic = true: each candidate is then scored once and promoted by an exact comparison, "
             "without repeats on identical instances or statistics")]
