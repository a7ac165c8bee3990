"""ratchet.refiners.cmaes: proposals stay in bounds, are reproducible, and learn from fitness."""

from __future__ import annotations

import numpy as np
from conftest import DATA

from ratchet.critic import Evaluation
from ratchet.policy import load_policy, parse_policy
from ratchet.refiners import CMAESRefiner, Refiner
from ratchet.rollout import Episode


def evaluation(cid: str, mean: float, error: bool = False) -> Evaluation:
    eps = [Episode(s, mean, 10, True, False, None) for s in range(3)]
    if error:
        eps[0] = Episode.failed(0, "policy raised ValueError: x", length=1, episode_return=mean)
    return Evaluation(cid, "train", tuple(eps))


def test_implements_the_refiner_interface():
    r = CMAESRefiner(load_policy(DATA / "cartpole_linear.py"))
    assert r.name == "cmaes"
    for method in ("propose", "observe", "recommend"):
        assert callable(getattr(r, method)) and hasattr(Refiner, method)


def test_proposals_in_bounds_and_reproducible():
    prog = load_policy(DATA / "policy_log_tuple.py")
    parent = prog.candidate()
    a = CMAESRefiner(prog, sigma0=0.5, seed=3)
    b = CMAESRefiner(prog, sigma0=0.5, seed=3)
    assert a.recommend() is None and a.sigma is None
    pa, pb = a.propose(parent, None, np.random.default_rng(0)), b.propose(parent, None, np.random.default_rng(0))
    assert [c.id for c in pa] == [c.id for c in pb]
    assert len(pa) == 4 + int(3 * np.log(3))  # pycma's default population for 3 parameters
    assert len({c.id for c in pa}) == len(pa)
    for cand in pa:
        assert cand.parent_id == parent.id and cand.refiner == "cmaes" and cand.source == prog.source
        for p in prog.parameters:
            assert p.low <= cand.params[p.name] <= p.high
    other = CMAESRefiner(prog, sigma0=0.5, seed=4).propose(parent, None, np.random.default_rng(0))
    assert [c.id for c in other] != [c.id for c in pa]


def test_popsize_option_and_one_parameter_policy():
    prog = parse_policy('PARAMETERS = {"k": (0.5, 0.0, 1.0)}\ndef act(o, p):\n    return 0\n')
    r = CMAESRefiner(prog, popsize=5, seed=0)
    props = r.propose(prog.candidate(), None, np.random.default_rng(0))
    assert len(props) == 5 and all(set(c.params) == {"k"} for c in props)
    r.observe([evaluation(c.id, float(c.params["k"])) for c in props])
    assert set(r.recommend().params) == {"k"}


def test_no_parameters_proposes_nothing():
    prog = load_policy(DATA / "policy_no_params.py")
    assert CMAESRefiner(prog).propose(prog.candidate(), None, np.random.default_rng(0)) == []


def test_observe_moves_the_mean_towards_better_fitness():
    prog = load_policy(DATA / "cartpole_linear.py")
    r = CMAESRefiner(prog, sigma0=0.3, seed=1)
    parent = prog.candidate()
    target = np.array([0.8, -0.5, 0.6, 0.2])
    names = [p.name for p in prog.parameters]

    def score(c):
        return -float(np.sum((np.array([c.params[n] for n in names]) - target) ** 2))

    for _ in range(25):
        props = r.propose(parent, None, np.random.default_rng(0))
        r.observe([evaluation(c.id, score(c)) for c in props])
    rec = r.recommend()
    assert rec.refiner == "cmaes-mean"
    assert score(rec) > score(parent) / 10  # much closer to the optimum than where it started
    assert r.sigma is not None and r.sigma > 0


def test_cmaes_searches_ints_and_choices_on_a_relaxed_rounded_space():
    """Int and categorical parameters are one coordinate each, rounded to the candidate's value (act gets a Python
    int and the choice), with a least step size there only, and CMA-ES finds the best integer and choice."""
    prog = load_policy(DATA / "cartpole_typed.py")
    assert CMAESRefiner(load_policy(DATA / "cartpole_linear.py")).step_floor() == [0.0] * 4  # floats: as ever
    r = CMAESRefiner(prog, sigma0=0.3, seed=1, popsize=8)
    assert r.step_floor() == [0.0, 0.0, 1 / 7 / 5, 1 / 3 / 5]  # a bin's width / (2m + 1), m = 2 rounded coordinates
    parent = prog.candidate()

    def score(c):
        return (-(c.params["horizon"] - 5) ** 2 - 3 * (c.params["rule"] != "velocity")
                - (c.params["w_angle"] - 0.2) ** 2 - (c.params["w_angular_velocity"] + 0.4) ** 2)

    seen = set()
    for _ in range(30):
        props = r.propose(parent, None, np.random.default_rng(0))
        assert all(type(c.params["horizon"]) is int and 0 <= c.params["horizon"] <= 6 for c in props)
        assert all(c.params["rule"] in ("angle", "both", "velocity") for c in props)
        seen |= {(c.params["horizon"], c.params["rule"]) for c in props}
        r.observe([evaluation(c.id, score(c)) for c in props])
    assert list(r._es.opts["minstd"]) == r.step_floor()
    rec = r.recommend()
    assert (rec.params["horizon"], rec.params["rule"]) == (5, "velocity") and score(rec) > -0.05
    assert len(seen) > 6  # it tried several integers and choices on the way


def test_errored_candidates_rank_last():
    prog = load_policy(DATA / "cartpole_linear.py")
    a, b = CMAESRefiner(prog, sigma0=0.3, seed=2), CMAESRefiner(prog, sigma0=0.3, seed=2)
    pa = a.propose(prog.candidate(), None, np.random.default_rng(0))
    pb = b.propose(prog.candidate(), None, np.random.default_rng(0))
    # in a, the first candidate has the best mean but errored; in b it simply has the worst mean.
    # CMA-ES uses ranks only, so both must end in exactly the same state.
    a.observe([evaluation(c.id, 1000.0 if i == 0 else float(i), error=(i == 0)) for i, c in enumerate(pa)])
    b.observe([evaluation(c.id, -1000.0 if i == 0 else float(i)) for i, c in enumerate(pb)])
    assert a.recommend().id == b.recommend().id
    assert a.sigma == b.sigma
    before = a.recommend().id
    a.observe([])  # observing again without proposing is a no-op
    assert a.recommend().id == before


def test_candidates_the_cascade_dropped_rank_below_every_survivor_by_their_first_stage_means():
    """[planner] cascade_episodes: a sample dropped after the first stage ranks below every sample that ran all the
    seeds, however high its first-stage mean, and above failed ones; among the dropped, by first-stage mean."""
    prog = load_policy(DATA / "cartpole_linear.py")
    a, b = CMAESRefiner(prog, sigma0=0.3, seed=2), CMAESRefiner(prog, sigma0=0.3, seed=2)
    pa = a.propose(prog.candidate(), None, np.random.default_rng(0))
    pb = b.propose(prog.candidate(), None, np.random.default_rng(0))
    assert len(pa) >= 6
    # in a, samples 0 and 1 were dropped with first-stage means far above every survivor's (1000 > 900); sample 2
    # failed. In b the same order is given by plain means: survivors 3.. by i, then 1 above 0, then 2 failed.
    a.dropped({pa[0].id: "cascade: ...", pa[1].id: "cascade: ..."})
    a.observe([evaluation(c.id, {0: 1000.0, 1: 2000.0}.get(i, float(i)), error=(i == 2)) for i, c in enumerate(pa)])
    b.observe([evaluation(c.id, {0: -20.0, 1: -10.0}.get(i, float(i)), error=(i == 2)) for i, c in enumerate(pb)])
    assert a.recommend().id == b.recommend().id
    assert a.sigma == b.sigma


# -- several refiners, one budget ------------------------------------------------------------------

def test_thompson_allocator_favours_the_arm_with_real_gains():
    from ratchet.refiners import ThompsonAllocator

    gains = {"good": 10.0, "meh": 1.0, "bad": 0.0}
    alloc = ThompsonAllocator(list(gains), seed=0)
    chosen = []
    for gen in range(1, 121):
        arm, why = alloc.choose(gen)
        assert why["arm"] == arm and set(why["arms"]) == set(gains)
        chosen.append(arm)
        alloc.record(arm, gains[arm] if gen % 2 else 0.0)  # promotions in half the generations
    assert chosen[:3] == ["good", "meh", "bad"]  # every arm tried once first
    assert chosen[60:].count("good") > 45
    again = ThompsonAllocator(list(gains), seed=0)
    for gen, arm in enumerate(chosen[:10], start=1):  # deterministic: a resumed run re-makes the same choices
        assert again.choose(gen)[0] == arm
        again.record(arm, gains[arm] if gen % 2 else 0.0)


def test_a_refiners_due_work_claims_the_generation_and_work_still_coming_keeps_it_out():
    """An arm whose prepared work is due (``Turn.DUE``) gets the generation before an untried arm and whatever the
    samples say; one whose work is still coming (``Turn.WAIT``) is passed over while another is available, and taken
    when it is the only one; with every arm ``FREE`` the choice and its reasons are those without turns."""
    from ratchet.refiners import ThompsonAllocator
    from ratchet.refiners.base import Turn

    alloc = ThompsonAllocator(["a", "b", "c"], seed=0)
    alloc.record("a", 5.0)
    assert alloc.choose(2, turns={"c": Turn.DUE})[0] == "c"  # b is untried: without turns it would come first
    assert alloc.choose(2, turns={"c": Turn.DUE})[1]["reason"] == "its work prepared ahead is due at this generation"
    assert alloc.choose(2, turns={"b": Turn.WAIT})[0] == "c"
    assert alloc.choose(2, ["b"], {"b": Turn.WAIT})[0] == "b"
    for arm in "bc":
        alloc.record(arm, 0.0)
    for gen in range(3, 30):
        free = alloc.choose(gen, turns={a: Turn.FREE for a in "abc"})
        assert free == alloc.choose(gen)
        assert alloc.choose(gen, turns={"a": Turn.WAIT})[0] != "a"


def test_ipop_restart_doubles_the_population_after_stagnation():
    import numpy as np

    from ratchet.critic import Evaluation
    from ratchet.policy import parse_policy
    from ratchet.refiners import CMAESRefiner
    from ratchet.rollout import Episode

    prog = parse_policy('PARAMETERS = {"a": (0.0, -1.0, 1.0), "b": (0.0, -1.0, 1.0)}\ndef act(o, p):\n    return 0\n')
    ref = CMAESRefiner(prog, 0.2, popsize=4, seed=1, restarts="ipop", stagnation=2)
    parent = prog.candidate()
    for _ in range(4):  # a flat objective never improves on its first generation's best
        cands = ref.propose(parent, None, np.random.default_rng(0))
        ref.observe([Evaluation(c.id, "train", (Episode(1, 1.0, 5, True, False),)) for c in cands])
    assert ref.population_size == 8 and ref.n_restarts == 1


def test_local_restart_returns_to_the_incumbent_when_no_sample_beats_it():
    """restarts = "local": after `stagnation` generations in which every sample lost to the incumbent on the same
    training seeds, the search restarts at the incumbent with the same population and a fresh sample stream; a
    generation in which a sample wins resets the count."""
    prog = parse_policy('PARAMETERS = {"a": (0.0, -1.0, 1.0), "b": (0.0, -1.0, 1.0)}\ndef act(o, p):\n    return 0\n')
    ref = CMAESRefiner(prog, 0.2, popsize=4, seed=1, restarts="local", stagnation=2)
    assert ref.generation_cost().reference  # it reads the incumbent's evaluation on the generation's seeds
    parent = prog.candidate()

    def generation(sample_mean: float) -> list:
        cands = ref.propose(parent, None, np.random.default_rng(0))
        ref.observe([evaluation(c.id, sample_mean) for c in cands] + [evaluation(parent.id, 1.0)])
        return cands

    first = generation(0.5)
    generation(2.0)  # a sample beat the incumbent: the count starts again
    generation(0.5)
    assert ref.n_restarts == 0
    generation(0.5)  # two generations in a row lost to the incumbent
    assert ref.generation_cost().proposals == 4  # the same population (IPOP would double it)
    again = generation(0.5)
    assert ref.n_restarts == 1 and ref.population_size == 4
    assert np.allclose(ref._es.x0, ref.flatten(parent.params))  # started again at the incumbent
    assert [c.params for c in again] != [c.params for c in first]  # a new sample stream


def test_a_mean_that_beats_the_incumbent_is_progress_for_local_restarts():
    """restarts = "local": the distribution's mean (recommend, evaluated beside the samples) beating the incumbent
    counts as progress even when every sample lost (a search near a good basin with a wide step size), so it is not
    restarted; with a mean that also loses, it is."""
    prog = parse_policy('PARAMETERS = {"a": (0.0, -1.0, 1.0), "b": (0.0, -1.0, 1.0)}\ndef act(o, p):\n    return 0\n')
    for mean_return, restarted in ((2.0, False), (0.5, True)):
        ref = CMAESRefiner(prog, 0.2, popsize=4, seed=1, restarts="local", stagnation=2)
        parent = prog.candidate()
        for _ in range(3):
            mean = ref.recommend()
            cands = ref.propose(parent, None, np.random.default_rng(0))
            evs = [evaluation(c.id, 0.5) for c in cands] + ([evaluation(mean.id, mean_return)] if mean else [])
            ref.observe(evs + [evaluation(parent.id, 1.0)])
        ref.propose(parent, None, np.random.default_rng(0))
        assert (ref.n_restarts == 1) is restarted


def test_rescue_restarts_only_while_the_incumbent_is_the_start():
    """restarts = "rescue": the local rule while nothing has been promoted; after the first promotion the search is
    never restarted (however long no sample beats the incumbent) and stops asking for the incumbent's reference runs."""
    prog = parse_policy('PARAMETERS = {"a": (0.0, -1.0, 1.0), "b": (0.0, -1.0, 1.0)}\ndef act(o, p):\n    return 0\n')
    ref = CMAESRefiner(prog, 0.2, popsize=4, seed=1, restarts="rescue", stagnation=2)
    start = prog.candidate()

    def generation(parent, sample_mean: float) -> list:
        cands = ref.propose(parent, None, np.random.default_rng(0))
        ref.observe([evaluation(c.id, sample_mean) for c in cands] + [evaluation(parent.id, 1.0)])
        return cands

    generation(start, 0.5)
    generation(start, 0.5)  # two generations lost to the start: restart due, as with "local"
    generation(start, 0.5)
    assert ref.n_restarts == 1 and np.allclose(ref._es.x0, ref.flatten(start.params))
    promoted = generation(start, 2.0)[0]
    assert ref.generation_cost().reference
    for _ in range(5):  # the incumbent is no longer the start: no restart, no reference runs
        generation(promoted, 0.5)
    assert ref.n_restarts == 1 and not ref.generation_cost().reference

    due = CMAESRefiner(prog, 0.2, popsize=4, seed=1, restarts="rescue", stagnation=1)
    first = due.propose(start, None, np.random.default_rng(0))
    due.observe([evaluation(c.id, 0.5) for c in first] + [evaluation(start.id, 1.0)])  # a restart is due ...
    due.propose(first[0], None, np.random.default_rng(0))  # ... but a promotion came first: none
    assert due.n_restarts == 0


def test_run_with_variants_records_each_allocation(tmp_path):
    from conftest import make_spec_dir, read_events

    from ratchet.ledger import EventType
    from ratchet.ledger.projection import project
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec = load_spec(make_spec_dir(tmp_path / "s", refiner={"sigma0_variants": [0.1, 0.5], "train_episodes": 2},
                                   budget={"env_steps": 40_000, "target": 500}, test={"episodes": 3}))
    start_run(spec, tmp_path / "runs", "arms")
    events = read_events(tmp_path / "runs" / "arms")
    plans = [e.payload for e in events if e.type is EventType.GENERATION_PLANNED]
    gens = project(events).generation_log
    assert len(plans) >= len(gens) >= 2
    assert {p["arm"] for p in plans[:2]} == {"cmaes-s0.1", "cmaes-s0.5"}
    assert all(p["reason"] and set(p["arms"]) == {"cmaes-s0.1", "cmaes-s0.5"} for p in plans)
    assert [g["refiner"] for g in gens] == [p["arm"] for p in plans[:len(gens)]]


def test_the_search_can_keep_its_own_path_after_a_promotion():
    """follow = "own": a promotion changes the candidates' parent, not the distribution (the same samples as a
    search that saw no promotion)."""
    prog = load_policy(DATA / "cartpole_linear.py")
    runs = []
    for promote in (False, True):
        r = CMAESRefiner(prog, sigma0=0.3, seed=1, follow="own")
        pop = r.propose(prog.candidate(), None, np.random.default_rng(0))
        r.observe([evaluation(c.id, float(i)) for i, c in enumerate(pop)])
        mean = np.array(r._es.mean)
        later = r.propose(pop[2] if promote else prog.candidate(), None, np.random.default_rng(0))
        assert np.allclose(r._es.mean, mean)
        runs.append([c.params for c in later])
        if promote:
            assert all(c.parent_id == pop[2].id for c in later)
    assert runs[0] == runs[1]


def test_the_search_follows_the_incumbent_after_a_promotion():
    """follow = "incumbent" (default): a new parent (a promotion) moves the CMA-ES mean onto it; step size is kept."""
    prog = load_policy(DATA / "cartpole_linear.py")
    r = CMAESRefiner(prog, sigma0=0.3, seed=1)
    pop = r.propose(prog.candidate(), None, np.random.default_rng(0))
    r.observe([evaluation(c.id, float(i)) for i, c in enumerate(pop)])
    promoted = pop[2]
    sigma = r.sigma
    later = r.propose(promoted, None, np.random.default_rng(0))
    unit = [p.to_unit(promoted.params[p.name]) for p in prog.parameters]
    assert np.allclose(r._es.mean, unit) and r.sigma == sigma
    assert all(c.parent_id == promoted.id for c in later)
    assert r.recommend().params == promoted.params


def test_a_refiner_whose_training_job_no_longer_fits_sits_out_while_a_cheaper_one_goes_on(tmp_path):
    """Two refiners in one budget: a residual refiner whose PPO job is larger than the whole budget is
    never chosen (the allocator tries untried arms first, in order, so it would come first), and CMA-ES
    spends the budget instead of the run stopping with nothing done."""
    from conftest import make_spec_dir, read_events

    from ratchet.ledger import EventType
    from ratchet.ledger.projection import project
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec_dir = make_spec_dir(tmp_path / "s", budget={"env_steps": 6_000}, refiner={"train_episodes": 2},
                             gate={"validation_episodes": 10, "max_share": 0.6}, test={"episodes": 3},
                             execution={"workers": 1})
    toml = (spec_dir / "ratchet.toml").read_text(encoding="utf-8")
    toml = toml.replace('[policy]\npath = "policy.py"', '[policy]\nkind = "residual"\npath = "policy.py"\nhidden = [8]')
    toml += ('\n[[refiners]]\nkind = "residual"\nenv_steps = 100000\nn_steps = 64\n'
             '\n[[refiners]]\nkind = "cmaes"\nsigma0 = 0.5\npopsize = 4\n')
    (spec_dir / "ratchet.toml").write_text(toml, encoding="utf-8")
    start_run(load_spec(spec_dir), tmp_path / "runs", "fit")
    events = read_events(tmp_path / "runs" / "fit")
    plans = [e.payload for e in events if e.type is EventType.GENERATION_PLANNED]
    gens = project(events).generation_log
    assert len(gens) >= 2 and {g["refiner"] for g in gens} == {"cmaes"}
    assert plans and all(p["arm"] == "cmaes" for p in plans)
    assert not [e for e in events if e.type is EventType.TRAINING_FINISHED]


def test_the_progress_line_names_the_refiner_when_a_run_has_several():
    from ratchet.planner import Usage
    from ratchet.progress import progress_line
    from ratchet.spec import BudgetSpec

    info = {"generation": 3, "best_train_mean": 1.0, "incumbent_validation_mean": 0.5, "usage": Usage(),
            "budget": BudgetSpec(env_steps=100), "refiner": "residual", "gated": False, "gate_note": None}
    assert progress_line({**info, "n_refiners": 2}).startswith("gen   3 residual | best train")
    assert progress_line(info).startswith("gen   3 | best train")


def test_an_elitist_search_draws_every_generation_around_the_incumbent():
    """elitist (the default for a deterministic task): each generation's distribution is centred on the incumbent
    again, however the samples before it did, so the search never drifts away from the best it has seen."""
    from types import SimpleNamespace

    from ratchet.refiners.cmaes import CMAESSettings, _build

    prog = load_policy(DATA / "cartpole_linear.py")
    parent = prog.candidate()
    unit = [p.to_unit(parent.params[p.name]) for p in prog.parameters]
    for elitist in (True, False):
        r = CMAESRefiner(prog, sigma0=0.3, seed=1, elitist=elitist)
        for _ in range(3):  # samples all worse than the incumbent; the mean moves to the best of them
            pop = r.propose(parent, None, np.random.default_rng(0))
            r.observe([evaluation(c.id, -10.0 + i) for i, c in enumerate(pop)])
        r.propose(parent, None, np.random.default_rng(0))
        assert np.allclose(r._es.mean, unit) == elitist
    ctx = SimpleNamespace(program=prog, start=parent, seed=0, task=SimpleNamespace(deterministic=True))
    assert _build(CMAESSettings(), "cmaes", ctx)[0].elitist  # on by default for a deterministic task
    assert not _build(CMAESSettings(elitist=False), "cmaes", ctx)[0].elitist
    ctx.task.deterministic = False
    assert not _build(CMAESSettings(), "cmaes", ctx)[0].elitist
