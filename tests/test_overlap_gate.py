"""``[planner] overlap_gate`` (issue 42: the search does not wait for the gate): a generation's contender is validated
in one executor call with the next generation's training episodes, where nothing the verdict says can change that
generation; the run makes the same candidates and promotions as without it, counts every episode once, stays within
its budget, resumes exactly when killed between the call and its read-back, and takes the plain path otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DATA, SimulatedKill, read_events
from test_refiner_contract import Dying, _spec

from ratchet.critic import Evaluation
from ratchet.loop import recorded_spec, resume_run, start_run
from ratchet.policy import load_policy
from ratchet.refiners.cmaes import CMAESRefiner
from ratchet.spec import spec_from_dict

BUDGET = 6000
BOTH = {0, 1}  # an executor call with training (seed % 3 == 0) and validation (seed % 3 == 1) episodes: run ahead


class Calls(Dying):
    """The one-worker pool of the refiner contract's tests, noting each call's splits (``seed % 3``: SeedSplits'
    code) and its jobs; with ``die``, killed (like kill -9) right after the first call that ran ahead."""

    def __init__(self, die: bool = False) -> None:
        super().__init__()
        self.die, self.calls, self.jobs = die, [], []

    def run(self, task, jobs, on_episode=None, **kw):
        splits = {j.seed % 3 for j in jobs}
        self.calls.append(splits)
        self.jobs.append([(j.candidate.id, j.seed) for j in jobs])
        out = super().run(task, jobs, on_episode, **kw)
        if self.die and splits == BOTH:
            raise SimulatedKill("killed between the call that ran ahead and its read-back")
        return out


def _cartpole(directory: Path, overlap: bool, refiner=None, **sections):
    """The refiner contract's CartPole run (cmaes, popsize 4, 2 training and 6 validation episodes, 6,000 env steps),
    CMA-ES on its own path, with ``[planner] overlap_gate = overlap`` and ``sections`` merged in."""
    spec = _spec(directory, "cmaes", **({"follow": "own"} if refiner is None else refiner))
    d = spec.to_dict()
    d["planner"]["overlap_gate"] = overlap
    for name, table in sections.items():
        d.setdefault(name, {}).update(table)
    return spec_from_dict(d, directory)


def _run(spec, runs: Path, die: bool = False):
    ex = Calls(die)
    try:
        if die:
            with pytest.raises(SimulatedKill):
                start_run(spec, runs, "r", executor=ex)
        else:
            start_run(spec, runs, "r", executor=ex)
    finally:
        ex.close()
    return read_events(runs / "r"), ex


def _decisions(events):
    """What the search did: each generation's proposals (ids, in order), the gate decisions and the promotions."""
    return ([(e.payload["generation"], e.payload["candidate"]["id"]) for e in events if e.type.value ==
             "candidate_proposed"],
            [(e.payload["generation"], e.payload["candidate_id"], e.payload["promoted"]) for e in events
             if e.type.value == "gate_decided"],
            [(e.payload["generation"], e.payload["to"]) for e in events if e.type.value == "incumbent_changed"])


def _finished(events):
    return next(e.payload for e in events if e.type.value == "run_finished")


def _run_steps(events) -> int:
    """Env steps of every episode the run ran for its decisions (test episodes aside), recorded or not read."""
    return sum(e.payload["summary"]["env_steps"] for e in events
               if e.type.value == "episodes_evaluated" and e.payload["split"] != "test")


@pytest.mark.parametrize("gate", [{}, {"test": "group-t", "batch": 2, "min_episodes": 2}], ids=["fixed", "sequential"])
def test_the_gate_runs_beside_the_next_generation_with_the_same_candidates_and_promotions(tmp_path, gate):
    """A sequential gate's first batch runs ahead; its later batches (and the incumbent's extension) as usual."""
    off, plain = _run(_cartpole(tmp_path / "s", False, gate=gate), tmp_path / "off")
    on, ahead = _run(_cartpole(tmp_path / "s", True, gate=gate), tmp_path / "on")
    assert BOTH not in plain.calls and ahead.calls.count(BOTH) >= 2  # validations ran beside training episodes
    assert _decisions(on) == _decisions(off)
    assert len(_decisions(on)[2]) >= 2  # promotions happened: the new incumbent's reference ran after its verdict
    # every episode run is counted, once (the old incumbent's reference a promotion made useless as re-evaluation),
    # and the budget is a hard cap on all of it
    fin = _finished(on)
    assert fin["env_steps"] == _run_steps(on) <= BUDGET
    assert fin["env_steps"] - _finished(off)["env_steps"] == (
        fin["env_steps_breakdown"]["re-evaluation"] - _finished(off)["env_steps_breakdown"]["re-evaluation"])


def test_a_run_killed_between_the_call_that_ran_ahead_and_its_read_back_resumes_exactly(tmp_path):
    spec = _cartpole(tmp_path / "s", True)
    whole, _ = _run(spec, tmp_path / "a")
    _, killed = _run(spec, tmp_path / "b", die=True)
    ran_ahead = {job for jobs, splits in zip(killed.jobs, killed.calls) if splits == BOTH for job in jobs}
    with Calls() as ex:
        resume_run(tmp_path / "b" / "r", executor=ex)
    resumed = read_events(tmp_path / "b" / "r")
    assert _decisions(resumed) == _decisions(whole)
    a, b = _finished(whole), _finished(resumed)
    assert (a["env_steps"], a["episodes"], a["incumbent_id"]) == (b["env_steps"], b["episodes"], b["incumbent_id"])
    assert b["env_steps"] == _run_steps(resumed)  # nothing counted twice, nothing left uncounted
    assert ran_ahead and not ran_ahead & {job for jobs in ex.jobs for job in jobs}  # read back, never run again


@pytest.mark.parametrize("why", ["follows the incumbent", "patience at its last", "a wall-clock budget",
                                 "decide = powered"])
def test_the_plain_path_where_the_verdict_could_change_the_next_generation(tmp_path, why):
    refiner, sections = None, {}
    if why == "follows the incumbent":  # a promotion moves CMA-ES's mean: its next samples need the verdict
        refiner = {"follow": "incumbent"}
    elif why == "patience at its last":
        sections = {"budget": {"patience": 1}}
    elif why == "a wall-clock budget":  # a stop on the clock depends on timing, not on what the ledger records
        sections = {"budget": {"wall_clock_s": 3600}}
    else:
        sections = {"planner": {"decide": "powered"}}
    on, ahead = _run(_cartpole(tmp_path / "s", True, refiner, **sections), tmp_path / "on")
    assert BOTH not in ahead.calls
    if why == "follows the incumbent":  # exactly today's path: the same events as with the setting off
        off, _ = _run(_cartpole(tmp_path / "s", False, refiner, **sections), tmp_path / "off")
        assert [(e.type, e.key) for e in on] == [(e.type, e.key) for e in off]
        assert _decisions(on) == _decisions(off)


def test_cmaes_proposes_without_the_verdict_only_on_its_own_path():
    program = load_policy(DATA / "cartpole_linear.py")
    assert CMAESRefiner(program, follow="own").proposes_without_verdict()
    assert not CMAESRefiner(program).proposes_without_verdict()  # follow = "incumbent", the default
    assert not CMAESRefiner(program, follow="own", restarts="local").proposes_without_verdict()
    assert not CMAESRefiner(program, follow="own", elitist=True).proposes_without_verdict()


def test_a_recorded_spec_without_the_setting_keeps_the_plain_path(tmp_path):
    spec = _cartpole(tmp_path / "s", True)
    d = spec.to_dict()
    assert d["planner"]["overlap_gate"] is True
    del d["planner"]["overlap_gate"]
    assert recorded_spec(d).planner.overlap_gate is False


def test_the_proposals_made_ahead_are_those_made_after_the_verdict():
    """CMA-ES on its own path: asked for its next population before a promotion's verdict (from the old incumbent) it
    proposes the same candidates as after it (from the new one)."""
    import numpy as np

    program = load_policy(DATA / "cartpole_linear.py")
    start = program.candidate()
    got = []
    for ahead in (False, True):
        r = CMAESRefiner(program, popsize=4, seed=3, follow="own")
        rng = np.random.default_rng(0)
        first = r.propose(start, None, rng)
        r.observe([Evaluation(c.id, "train", ()) for c in first])
        promoted = first[0]
        if ahead:
            nxt = r.propose(start, None, rng)
            r.verdict(promoted.id, True, "promoted")
        else:
            r.verdict(promoted.id, True, "promoted")
            nxt = r.propose(promoted, None, rng)
        got.append([c.id for c in nxt])
    assert got[0] == got[1]
