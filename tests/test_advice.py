"""ratchet.advice: a run that promoted little says why, in numbers, and what to change."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import DATA
from ratchet.advice import parameters_at_bounds, run_advice


def _state(notes, gates=(), promotions=(), params=None):
    source = (DATA / "cartpole_linear.py").read_text()
    cands = {"base": {"params": {"w_position": 0.0, "w_velocity": 0.0, "w_angle": 0.0, "w_angular_velocity": 0.0}}}
    if params is not None:
        cands["inc"] = {"params": params}
    return SimpleNamespace(
        generation_log=[{"generation": i + 1, "gated": note is None, "gate_note": note} for i, note in enumerate(notes)],
        spec={"gate": {"validation_episodes": 8, "max_share": 0.3}, "refiner": {"sigma0": 0.2}},
        promotions=list(promotions), gates=list(gates), policy_source=source, baseline_id="base",
        incumbent_id="inc" if params is not None else "base", candidates=cands)


def test_names_the_causes_in_numbers():
    notes = ["not better on training seeds (paired mean difference -1.00)"] * 6 + \
            ["validation would take 40 % of env steps, over [gate] max_share = 0.3; it waits"] * 2 + [None, None]
    gates = [{"promoted": False, "mean_diff": 20.5}, {"promoted": False, "mean_diff": 24.0}]
    lines = run_advice(_state(notes, gates))
    text = "\n".join(lines)
    assert "0 promotion(s) in 10 generation(s): in 6 the best contender did not beat the incumbent" in text
    assert "sigma0 (now 0.2)" in text
    assert "2 generation(s) skipped the gate because validation would exceed [gate] max_share = 0.3" in text
    assert "2 gated candidate(s) were rejected, 2 of them with a positive mean gain (+20.5 to +24)" in text
    assert "validation_episodes (now 8)" in text


def test_quiet_when_the_run_promoted_often():
    notes = [None] * 10
    assert run_advice(_state(notes, promotions=[{}] * 5)) == []


def test_parameters_at_a_bound_are_named():
    st = _state([None], params={"w_position": 0.1, "w_velocity": 1.0, "w_angle": -1.0, "w_angular_velocity": 0.5})
    lines = parameters_at_bounds(st)
    assert len(lines) == 2
    assert "w_velocity = 1 sits at its upper bound 1" in lines[0] and "widen its range" in lines[0]
    assert "w_angle = -1 sits at its lower bound -1" in lines[1]
