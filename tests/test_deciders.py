"""The decider contract (issue 42): ``[planner] decide`` is one Decider class per mode, behind one contract the
loop calls without asking which mode it runs, returning a typed Outcome."""

from __future__ import annotations

import typing
from types import SimpleNamespace

from ratchet.critic import Evaluation
from ratchet.deciders import DECIDERS, AtTheEnd, Decider, EveryGeneration, Outcome, Powered
from ratchet.gate import Decision
from ratchet.planner import Plan, Stop, StopKind
from ratchet.policy import Candidate
from ratchet.refiners import GenerationCost
from ratchet.rollout import Episode
from ratchet.spec import PlannerSpec
from ratchet.step import GenerationStep


def _eval(cid: str, returns, split: str = "validation") -> Evaluation:
    return Evaluation(cid, split, tuple(Episode(seed=i, episode_return=float(r), length=10, terminated=True,
                                                truncated=False) for i, r in enumerate(returns)))


def _step(**fields) -> GenerationStep:
    inc = Candidate.create("", {"x": 0.0})
    return GenerationStep(generation=3, refiner="cmaes", cost=GenerationCost(4), reserve=(0.0, 0),
                          plan=Plan(3, (1, 2)), incumbent=inc, incumbent_validation=_eval(inc.id, [1.0, 2.0]),
                          est_len=10.0, **fields)


def _decider(cls: type[Decider], final: bool = True) -> Decider:
    """A decider whose services and certifier are stand-ins: enough for what the tested branches read."""
    services = SimpleNamespace(spec=SimpleNamespace(planner=SimpleNamespace(final=final, confirm_top=3)))
    return cls(services, None, None, None, SimpleNamespace(shortlist=SimpleNamespace(led_by=lambda g: g == 3)))


def test_every_decide_mode_has_one_decider_behind_the_contract():
    modes = set(typing.get_args(PlannerSpec.model_fields["decide"].annotation))
    assert set(DECIDERS) == modes
    assert all(issubclass(cls, Decider) for cls in DECIDERS.values())
    # the paired rerun of the incumbent is priced only where the decisions read it
    assert DECIDERS["every"].pairs_with_incumbent and not DECIDERS["powered"].pairs_with_incumbent
    assert not DECIDERS["end"].pairs_with_incumbent


def test_when_each_mode_ends_with_the_final_decision():
    budget, clock, broken = Stop(StopKind.BUDGET, "b"), Stop(StopKind.CLOCK, "c"), Stop(StopKind.BROKEN, "x")
    assert _decider(EveryGeneration).concludes(budget) and not _decider(EveryGeneration).concludes(clock)
    assert not _decider(EveryGeneration, final=False).concludes(budget)
    for cls in (Powered, AtTheEnd):
        assert _decider(cls).concludes(budget) and _decider(cls).concludes(clock) and not _decider(cls).concludes(broken)
    # patience: a new shortlist leader counts as progress where the shortlist decides
    assert _decider(Powered).progressed(3) and not _decider(EveryGeneration).progressed(3)


def test_an_outcome_without_a_contender_says_why_in_one_line():
    every = _decider(EveryGeneration)
    out = every.decide(_step(failures=("HTTP 503", "timed out")))
    assert out == Outcome(None, "the LLM endpoint failed 2 request(s) this generation (last: timed out)",
                          _step().incumbent_validation)
    assert "all 5 proposal(s) were refused" in every.decide(_step(refused=5)).note
    assert every.decide(_step(train={"x": _eval("x", [1.0])})).note.startswith("no contender finished")
    end = _decider(AtTheEnd).decide(_step())
    assert end.decision is None and end.note == 'decide = "end": the gate decides when the search ends'
    assert not end.promoted and end.gain == 0.0


def test_a_promoting_outcome_carries_its_candidate_and_gain():
    cand = Candidate.create("", {"x": 1.0})
    inc_val, cand_val = _eval("inc", [1.0, 2.0]), _eval(cand.id, [4.0, 5.0])
    decision = Decision(cand.id, "inc", True, 0.001, 3.0, 2, "t", 0.05, True, "better")
    out = Outcome(decision, decision.reason, inc_val, cand, cand_val)
    assert out.promoted and out.gain == 3.0
    assert not Outcome(decision, "x", inc_val).promoted  # no candidate: nothing to promote
