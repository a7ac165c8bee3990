"""The shortlist of decide = "powered": shrinkage, power, confirmation and the run that uses them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import events_of, make_spec_dir, read_events

from ratchet.critic import Episode, Evaluation
from ratchet.ledger import EventType
from ratchet.ledger.projection import project
from ratchet.loop import start_run
from ratchet.planner import SeedSplits
from ratchet.policy import Candidate
from ratchet.shortlist import Shortlist, gate_power, shrink
from ratchet.spec import load_spec


def _eval(cid: str, returns, split: str = "train", seeds=None, length: int = 10) -> Evaluation:
    seeds = seeds if seeds is not None else range(len(returns))
    return Evaluation(cid, split, tuple(Episode(seed=int(s), episode_return=float(r), length=length, terminated=True,
                                                truncated=False) for s, r in zip(seeds, returns)))


def _cands(n: int) -> list[Candidate]:
    return [Candidate.create("", {"x": float(i)}) for i in range(n)]


def test_shrink_pulls_noisy_means_toward_their_average():
    # spread of the means no larger than the noise: all shrunk to the average
    m, b = shrink([1.0, 2.0, 3.0], within_var=100.0, n=5)
    assert m == 2.0 and b == 0.0
    # spread far above the noise: almost nothing shrunk
    m, b = shrink([0.0, 100.0, 200.0], within_var=1.0, n=5)
    assert m == 100.0 and b > 0.99
    # too few to estimate a spread from
    assert shrink([5.0, 7.0], 1.0, 5) == (6.0, 1.0)


def test_gate_power_is_the_normal_approximation():
    # gain of 2 sd at n = 4: z = 2*2 - z_{0.95}; Φ(4 - 1.645) ≈ 0.9907
    assert gate_power(2.0, 1.0, 4, 0.05) == pytest.approx(0.9907, abs=1e-3)
    assert gate_power(0.0, 1.0, 100, 0.05) == pytest.approx(0.05, abs=1e-9)
    assert gate_power(1.0, 0.0, 10, 0.05) == 1.0 and gate_power(-1.0, 0.0, 10, 0.05) == 0.0
    assert gate_power(1.0, 1.0, 1, 0.05) == 0.0  # no test on one seed
    # a level so small that 1 - level rounds to 1.0 (gate.alpha = 1e-17 is a valid setting): a tiny power, no error
    assert 0.0 < gate_power(2.0, 1.0, 4, 1e-17) < gate_power(2.0, 1.0, 4, 0.05)


def test_the_shortlist_keeps_the_best_ranks_by_expected_gain_and_confirms_paired():
    inc = Candidate.create("", {"x": -1.0})
    sl = Shortlist(size=3)
    sl.fallback = 10.0
    cands = _cands(5)
    rng = np.random.default_rng(0)
    train = {c.id: _eval(c.id, 10 + 5 * i + rng.normal(0, 1, 5)) for i, c in enumerate(cands)}
    train[inc.id] = _eval(inc.id, [10.0] * 5)
    sl.observe(1, cands, train, inc, recommended=cands[0])
    assert sl.latest is not None and sl.latest.candidate is cands[0]
    top = sl.top(3)
    assert [e.candidate for e in top] == [cands[4], cands[3], cands[2]]
    assert sl.baseline() == 10.0  # the incumbent's training returns (here equal to its validation mean)
    assert cands[0].id in sl.entries  # the latest recommendation stays on, beside the best
    assert [e.candidate for e in sl.candidates(2)] == [cands[4], cands[3], cands[0]]
    # confirmation: paired differences on the same seeds; the gain replaces the expectation
    lead = top[0]
    before = sl.expected_gain(lead)
    sl.confirm(lead, _eval(lead.candidate.id, [12.0, 14.0, 13.0], seeds=[7, 8, 9]),
               _eval(inc.id, [10.0, 10.0, 10.0], seeds=[7, 8, 9]))
    assert lead.confirmed_gain == pytest.approx(3.0) and lead.against == inc.id
    assert sl.expected_gain(lead) == pytest.approx(3.0)
    assert sl.calibration() == pytest.approx(min(1.0, 3.0 / before))
    # an error on confirmation seeds: never certified
    second = sl.top(3)[1]
    sl.confirm(second, _eval(second.candidate.id, [50.0, 50.0]).__class__(
        second.candidate.id, "train", (Episode(seed=1, episode_return=0.0, length=1, terminated=False,
                                               truncated=False, error="boom"),)), _eval(inc.id, [1.0]))
    assert sl.expected_gain(second) == -math.inf
    # a promotion: the winner leaves, the baseline restarts from its validation mean, confirmations lapse
    sl.decide(lead.candidate.id, True, validation_mean=30.0, diff_sd=4.0)
    assert lead.candidate.id not in sl.entries and sl.baseline() == 30.0 and sl.diff_sd == 4.0
    assert all(e.confirmed_gain is None for e in sl.entries.values())


def test_a_powered_run_decides_rarely_spends_its_budget_and_resumes_the_same(tmp_path):
    """decide = "powered" on CartPole: decisions only where powered and once at the end (recorded as
    final_decision), confirmations on their own training seeds, the budget spent but for a sliver."""
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 20_000}, test={"episodes": 5},
                                   gate={"validation_episodes": 20, "max_share": 0.5}, execution={"workers": 1},
                                   planner={"decide": "powered"}, refiner={"follow": "own"}))
    result = start_run(spec, tmp_path / "runs", "pw")
    events = read_events(result.run_dir)
    st = project(events)
    gens = events_of(events, EventType.GENERATION_FINISHED)
    final = events_of(events, EventType.FINAL_DECISION)
    assert len(final) == 1 and len(st.gates) <= len(gens)
    assert result.test.mean >= result.baseline_test.mean
    breakdown = events_of(events, EventType.RUN_FINISHED)[0].payload["env_steps_breakdown"]
    # a sliver stays: the last confirmation's seeds come whole (each costs every candidate's episode), and the
    # final validation keeps a margin of 10 % plus 3 sd √n of its episode lengths (CartPole's vary widely)
    assert breakdown["unused"] <= 0.2 * 20_000, breakdown
    confirmation = set(SeedSplits(0).seeds("train", 2_000_000_000, 2_000))
    gen_seeds = {s for g in gens for s in g.payload["train_seeds"]}
    read = {s for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["split"] == "train"
            for s in e.payload["seeds"]}
    assert read - gen_seeds and read - gen_seeds <= confirmation
    # CMA-ES declares no paired reference: the incumbent is not re-run on the generations' seeds
    assert all(g.payload["incumbent_train_mean"] is None for g in gens)


def test_decide_every_with_final_gates_the_shortlist_once_more_with_the_budget_left(tmp_path):
    """[planner] final = true (the default) with decide = "every": the generations' gates as usual, and once the
    budget ends the search a final_decision over the candidates no gate decided, paid with the env steps the kept
    validation leaves; the same run with final = false leaves them unspent."""
    runs = {}
    for final in (True, False):
        spec = load_spec(make_spec_dir(tmp_path / f"s{final}", budget={"env_steps": 20_000}, test={"episodes": 5},
                                       gate={"validation_episodes": 20, "max_share": 0.5}, execution={"workers": 1},
                                       planner={"decide": "every", "final": final}))
        result = start_run(spec, tmp_path / "runs", f"f{final}")
        runs[final] = read_events(result.run_dir)
        assert result.test.mean >= result.baseline_test.mean
    with_final, without = runs[True], runs[False]
    assert len(events_of(with_final, EventType.FINAL_DECISION)) == 1 and not events_of(without, EventType.FINAL_DECISION)
    gens = [e.payload for e in events_of(with_final, EventType.GENERATION_FINISHED)]
    # the kept validation priced at the shortlist's lengths, not the longest seen: at least as many generations
    assert len(gens) >= len(events_of(without, EventType.GENERATION_FINISHED))
    gated = {g["gated_id"] for g in gens if g.get("gated_id")}
    final = events_of(with_final, EventType.FINAL_DECISION)[0].payload
    assert final.get("candidate_id") not in gated  # a decided candidate leaves the shortlist
    used = [events_of(ev, EventType.RUN_FINISHED)[0].payload["env_steps"] for ev in (with_final, without)]
    assert used[0] > used[1]


def test_decide_end_searches_the_whole_budget_and_decides_once(tmp_path):
    """decide = "end" on CartPole: no gate during the search, one final_decision over the shortlist when the budget
    ends it (the only gate decision, at the first level of alpha spending)."""
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 20_000}, test={"episodes": 5},
                                   gate={"validation_episodes": 20, "max_share": 0.5}, execution={"workers": 1},
                                   planner={"decide": "end"}))
    result = start_run(spec, tmp_path / "runs", "end")
    events = read_events(result.run_dir)
    gens = [e.payload for e in events_of(events, EventType.GENERATION_FINISHED)]
    assert len(gens) > 3 and not any(g["gated"] for g in gens)
    assert all("search ends" in g["gate_note"] for g in gens)
    (final,) = events_of(events, EventType.FINAL_DECISION)
    decisions = events_of(events, EventType.GATE_DECIDED)
    assert len(decisions) == int(final.payload["gated"]) and all(d.key.startswith("gate/final/") for d in decisions)
    if decisions:  # the run's only contested decision: tested at alpha / 4 (harmonic spending, k = 1)
        assert decisions[0].payload["alpha"] == pytest.approx(0.05 / 4)
    assert result.test.mean >= result.baseline_test.mean
    finished = events_of(events, EventType.RUN_FINISHED)[0].payload
    assert finished["stop_kind"] == "budget"
    breakdown = finished["env_steps_breakdown"]
    assert breakdown["search"] > max(breakdown["validation"], breakdown["re-evaluation"]), breakdown


def test_a_run_bounded_by_its_wall_clock_alone_ends_its_final_decision(tmp_path, pool):
    """decide = "end" with only [budget] wall_clock_s: the final decision confirms once (no env steps or episodes left
    to spend on successive halving, which used to loop for ever) and the run finishes."""
    from ratchet.spec import BudgetSpec

    spec = load_spec(make_spec_dir(tmp_path / "s", test={"episodes": 5}, gate={"validation_episodes": 20},
                                   planner={"decide": "end"}))
    spec = spec.model_copy(update={"budget": BudgetSpec(wall_clock_s=2.0)})
    assert spec.budget.env_steps is None and spec.budget.episodes is None
    # a warm pool: on a loaded machine, starting a worker alone can take longer than the budget
    result = start_run(spec, tmp_path / "runs", "clock", executor=pool)
    events = read_events(result.run_dir)
    assert events_of(events, EventType.RUN_FINISHED)[0].payload["stop_kind"] == "clock"
    assert len(events_of(events, EventType.FINAL_DECISION)) == 1


def test_the_final_decision_follows_what_stopped_the_run_not_its_wording(tmp_path):
    """decide = "every" with final: a patience stop says the run should end now, so no final decision runs; the
    stop's kind is recorded beside its text."""
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 200_000, "patience": 2}, test={"episodes": 5},
                                   gate={"validation_episodes": 20}, execution={"workers": 1}))
    result = start_run(spec, tmp_path / "runs", "pat")
    events = read_events(result.run_dir)
    finished = events_of(events, EventType.RUN_FINISHED)[0].payload
    assert finished["stop_kind"] == "patience" and finished["stop_reason"].startswith("patience")
    assert not events_of(events, EventType.FINAL_DECISION)


def test_the_final_pick_is_among_the_last_round_of_successive_halving(tmp_path):
    """A candidate halving left out keeps its first, noisier (and here luckier) confirmed gain: the final decision
    gates the best of the last round's survivors, not the best estimate overall."""
    from ratchet.loop import rebuild_run
    from ratchet.runs import open_ledger
    from ratchet.shortlist import Entry

    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 3_000}, test={"episodes": 2},
                                   gate={"validation_episodes": 4}, execution={"workers": 1}, planner={"final": False}))
    result = start_run(spec, tmp_path / "runs", "sh")
    run, _ = rebuild_run(open_ledger(result.run_dir), result.run_dir, None)
    certifier = run.decider.certifier
    try:
        a, b, c = (Entry(cand, 1, 0.0, 5) for cand in _cands(3))
        certifier.shortlist = Shortlist(entries={e.candidate.id: e for e in (a, b, c)})
        ids = [e.candidate.id for e in (a, b, c)]
        rounds = iter([dict(zip(ids, (60.0, 50.0, 45.0))), dict(zip(ids[:2], (0.0, 30.0)))])  # round 2: a and b

        def confirm(generation, entries, incumbent, inc_val, n):
            gains = next(rounds)
            assert {e.candidate.id for e in entries} == set(gains)
            for e in entries:
                e.diffs.extend([gains[e.candidate.id]] * n)
            return False

        sizes = iter([20, 0])
        gated = []
        certifier.confirm = confirm
        certifier.confirmation_size = lambda runs, length, length_sd=0.0: next(sizes)
        certifier.final_validation = lambda length, length_sd=0.0: 4
        run.decide = lambda generation, cand, incumbent, inc_val, **kw: (gated.append(cand.id), (None, None, inc_val))[1]
        inc = run.start
        certifier.certify(1, inc, _eval(inc.id, [0.0] * 4, "validation"), (0.0, 0), 1.0, final=True)
        assert gated == [b.candidate.id]  # b: 40 over both rounds; c's 45 rests on one round
    finally:
        run.executor.close()


def test_refiner_settings_in_the_legacy_table_all_reach_cmaes(tmp_path):
    """Every CMA-ES setting written in [refiner] reaches the refiner (``follow`` was once dropped silently)."""
    spec = load_spec(make_spec_dir(tmp_path / "s", refiner={"follow": "own", "restarts": "ipop", "stagnation": 4}))
    (entry,) = spec.refiner_entries()
    assert entry["follow"] == "own" and entry["restarts"] == "ipop" and entry["stagnation"] == 4


def test_a_run_recorded_before_the_final_decision_resumes_without_it(tmp_path):
    """A ledger's spec written before ``[planner] final`` existed is read with ``final = false`` (its loop), a new
    one as recorded."""
    from ratchet.loop import recorded_spec

    data = load_spec(make_spec_dir(tmp_path / "s")).to_dict()
    assert recorded_spec(data).planner.final is True
    del data["planner"]["final"]
    assert recorded_spec(data).planner.final is False


def test_the_final_validation_is_priced_for_the_executors_cap():
    """The executor starts an episode only while the time limit still fits under the hard cap: short episodes under a
    long time limit need that room for the last one, beyond the 10 % margin; long ones are priced as before."""
    from ratchet.deciders.certify import _validation_price

    assert _validation_price(30, 25.0, 0.0, 500) == pytest.approx(29 * 25 + 500)  # CartPole-like: the cap binds
    assert _validation_price(150, 300.0, 0.0, 1000) == pytest.approx(1.1 * 150 * 300)  # LunarLander-like: the margin
    assert _validation_price(30, 25.0, 0.0, None) == pytest.approx(1.1 * 30 * 25)  # no time limit: no cap


# regression: with short episodes (CartPole at 25-45 steps, a 500-step time limit) the confirmation spent the room
# the cap needs, the executor skipped the last validation episodes and the run's one decision was thrown away
# ("validation cut short by the env-step budget" on run seeds 4 and 6)
@pytest.mark.parametrize("seed", [4, 6])
def test_decide_end_is_not_cut_short_by_the_cap(tmp_path, seed):
    spec = load_spec(make_spec_dir(tmp_path / "s", policy="cartpole_weak_hint.py", seed=seed,
                                   refiner={"sigma0": 0.5, "popsize": 6, "train_episodes": 2}, planner={"decide": "end"},
                                   gate={"validation_episodes": 30, "max_share": 0.5}, budget={"env_steps": 20_000},
                                   test={"episodes": 5}))
    result = start_run(spec, tmp_path / "runs", "cap")
    (final,) = events_of(read_events(result.run_dir), EventType.FINAL_DECISION)
    assert "cut short" not in final.payload["note"], final.payload


# regression: the final decision's first round of confirmation ran whatever [budget] episodes had left (the
# executor has no hard cap on episodes): a run with episodes = 76 played 98
@pytest.mark.parametrize("episodes", [76, 90])
def test_the_final_decision_never_runs_past_an_episode_budget(tmp_path, episodes):
    spec = load_spec(make_spec_dir(tmp_path / "s", seed=1, refiner={"sigma0": 0.5, "popsize": 6, "train_episodes": 2},
                                   gate={"validation_episodes": 30, "max_share": 0.5},
                                   budget={"episodes": episodes}, test={"episodes": 5}))
    result = start_run(spec, tmp_path / "runs", "ep")
    events = read_events(result.run_dir)
    assert len(events_of(events, EventType.FINAL_DECISION)) == 1
    assert events_of(events, EventType.RUN_FINISHED)[0].payload["episodes"] <= episodes
