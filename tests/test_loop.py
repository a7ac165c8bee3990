"""ratchet.loop end to end: refinement on CartPole, ledger invariants, crash and resume."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import RecordingExecutor, SimulatedKill, events_of, make_spec_dir, normalized, read_events

from ratchet.critic import Evaluation
from ratchet.errors import LedgerError, RatchetError, RunNotFoundError, SpecError
from ratchet.execution import ExecutorCapabilities
from ratchet.execution.process import ProcessExecutor
from ratchet.gate import PairedTestGate
from ratchet.ledger import EventType
from ratchet.ledger.projection import project
from ratchet.loop import eval_key, resume_run, start_run
from ratchet.planner import SeedSplits
from ratchet.policy import load_policy
from ratchet.refiners.cmaes import NO_PARAMETERS
from ratchet.rollout import Episode
from ratchet.spec import load_spec

# -- the shared finished run -----------------------------------------------------------------------

def test_refinement_improves_the_policy(finished_run):
    result, run_dir, spec_dir = finished_run
    events = read_events(run_dir)
    promotions = events_of(events, EventType.INCUMBENT_CHANGED)
    assert len(promotions) >= 1
    assert result.incumbent.id == promotions[-1].payload["to"] != result.baseline_test.candidate_id
    assert result.test.split == "test" and result.test.n == 20 and result.baseline_test.n == 20
    assert result.test.mean > result.baseline_test.mean + 50  # zero weights fall in ~10 steps
    assert result.test.n_errors == 0
    assert result.stop_reason
    assert (run_dir / "policy.py").read_text() == (spec_dir / "policy.py").read_text()
    prog = load_policy(spec_dir / "policy.py")
    for p in prog.parameters:
        assert p.low <= result.incumbent.params[p.name] <= p.high


def test_incumbent_validation_mean_never_decreases(finished_run):
    result, run_dir, _ = finished_run
    events = read_events(run_dir)
    baseline_val = next(e.payload for e in events_of(events, EventType.EPISODES_EVALUATED)
                        if e.payload["split"] == "validation")
    current_id, current_mean = baseline_val["candidate_id"], baseline_val["summary"]["mean"]
    for e in events_of(events, EventType.INCUMBENT_CHANGED):
        p = e.payload
        assert p["from"] == current_id
        assert p["previous_validation_mean"] == current_mean
        assert p["validation_mean"] > current_mean
        current_id, current_mean = p["to"], p["validation_mean"]
    assert current_id == result.incumbent.id
    means = [g.payload["incumbent_validation_mean"] for g in events_of(events, EventType.GENERATION_FINISHED)]
    assert means == sorted(means)


def test_env_steps_within_budget(finished_run):
    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    assert 0 < st.env_steps <= st.spec["budget"]["env_steps"]
    assert st.validation_env_steps <= st.env_steps


def test_test_split_only_evaluated_at_the_end(finished_run):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    test_evals = [e for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["split"] == "test"]
    assert len(test_evals) == 2  # the final incumbent and the starting policy, once each
    last_gate = max(e.seq for e in events_of(events, EventType.GATE_DECIDED))
    last_generation = max(e.seq for e in events_of(events, EventType.GENERATION_FINISHED))
    assert all(e.seq > max(last_gate, last_generation) for e in test_evals)
    assert events[-1].type is EventType.RUN_FINISHED
    # nothing was chosen after the test evaluations began
    first_test = min(e.seq for e in test_evals)
    assert not [e for e in events if e.seq > first_test and e.type in
                (EventType.GATE_DECIDED, EventType.INCUMBENT_CHANGED, EventType.CANDIDATE_PROPOSED)]


def test_seed_splits_disjoint_in_the_ledger(finished_run):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    started = events_of(events, EventType.RUN_STARTED)[0].payload
    by_split: dict[str, set[int]] = {"train": set(), "validation": set(), "test": set()}
    for e in events_of(events, EventType.EPISODES_EVALUATED):
        p = e.payload
        assert [ep["seed"] for ep in p["episodes"]] == p["seeds"]
        by_split[p["split"]].update(p["seeds"])
        if p["split"] == "validation":
            # one fixed validation seed list (the final decision may read the first seeds the budget affords)
            assert p["seeds"] == started["seeds"]["validation"][:len(p["seeds"])]
        if p["split"] == "test":
            assert p["seeds"] == started["seeds"]["test"]
    assert len(by_split["validation"]) == 10 and len(by_split["test"]) == 20
    assert not by_split["train"] & by_split["validation"]
    assert not by_split["train"] & by_split["test"]
    assert not by_split["validation"] & by_split["test"]
    splits = SeedSplits(0)
    assert started["seeds"]["validation"] == splits.seeds("validation", 0, 10)
    # every generation trains on fresh seeds
    gens = [g.payload["train_seeds"] for g in events_of(events, EventType.GENERATION_FINISHED)]
    flat = [s for g in gens for s in g]
    # ... and a decision's confirmations on fresh training seeds of their own range
    confirmation = set(splits.seeds("train", 2_000_000_000, 1000))
    assert len(flat) == len(set(flat)) and not set(flat) & confirmation
    assert by_split["train"] - set(flat) <= confirmation and set(flat) <= by_split["train"]


def test_gate_decisions_are_reproducible_from_the_ledger(finished_run):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    st = project(events)
    gate = PairedTestGate(st.spec["gate"]["alpha"], st.spec["gate"]["test"], st.spec["gate"]["min_improvement"])
    vals = {e.payload["candidate_id"]: e.payload for e in events_of(events, EventType.EPISODES_EVALUATED)
            if e.payload["split"] == "validation"}
    gates = events_of(events, EventType.GATE_DECIDED)
    assert gates
    promoted = set()
    contested, carry = 0, 0.0  # as the loop counts them: alpha spending and the fallback's carried level
    for g in gates:
        p = g.payload

        def evaluation(cid: str) -> Evaluation:
            return Evaluation(cid, "validation", tuple(Episode.from_dict(e) for e in vals[cid]["episodes"]))

        cand = evaluation(p["candidate_id"])  # the final decision may read the first seeds only
        inc = evaluation(p["incumbent_id"])
        inc = Evaluation(inc.candidate_id, "validation", inc.episodes[:cand.n])
        d = gate.decide(cand, inc, k=contested + 1, carry=carry)
        assert d.promoted == p["promoted"]
        assert d.p_value == p["p_value"] and d.alpha == p["alpha"]
        contested, carry = contested + d.contested, (d.alpha if d.promoted else 0.0)
        if p["promoted"]:
            promoted.add(p["candidate_id"])
    assert promoted == {e.payload["to"] for e in events_of(events, EventType.INCUMBENT_CHANGED)}


def test_every_evaluated_candidate_was_proposed_first(finished_run):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    proposed_at = {}
    for e in events_of(events, EventType.CANDIDATE_PROPOSED):
        proposed_at.setdefault(e.payload["candidate"]["id"], e.seq)
    for e in events_of(events, EventType.EPISODES_EVALUATED):
        assert proposed_at[e.payload["candidate_id"]] < e.seq
        assert e.key == eval_key(e.payload["split"], e.payload["candidate_id"], e.payload["seeds"])


def test_start_run_refuses_an_existing_run(finished_run):
    _result, run_dir, spec_dir = finished_run
    with pytest.raises(RatchetError, match="already exists"):
        start_run(load_spec(spec_dir), run_dir.parent, run_dir.name)


def test_resume_refuses_a_finished_run(finished_run):
    _, run_dir, _ = finished_run
    with pytest.raises(LedgerError, match="already finished"):
        resume_run(run_dir)
    with pytest.raises(RunNotFoundError, match="no run"):
        resume_run("no-such-run", run_dir.parent)


# -- small runs of their own -----------------------------------------------------------------------

def test_policy_without_parameters_stops_at_once(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", "policy_no_params.py", test={"episodes": 5},
                                   gate={"validation_episodes": 5}, execution={"workers": 1}))
    result = start_run(spec, tmp_path / "runs", "np")
    assert result.stop_reason == NO_PARAMETERS
    assert result.incumbent.id == result.test.candidate_id == result.baseline_test.candidate_id
    events = read_events(tmp_path / "runs" / "np")
    assert not events_of(events, EventType.GENERATION_FINISHED)
    assert events[-1].type is EventType.RUN_FINISHED


def test_target_stops_the_run(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"target": 5.0}, test={"episodes": 5},
                                   gate={"validation_episodes": 5}, execution={"workers": 1}))
    result = start_run(spec, tmp_path / "runs", "tg")
    assert result.stop_reason.startswith("target reached")
    st = project(read_events(tmp_path / "runs" / "tg"))
    assert st.generations == 0 and st.status == "finished"


def _small_spec(tmp_path, budget: dict):
    d = make_spec_dir(tmp_path / "s", budget=budget, test={"episodes": 5}, gate={"validation_episodes": 5},
                      execution={"workers": 1})
    if "env_steps" not in budget:  # drop the fixture's env-step budget so only the given limits apply
        (d / "ratchet.toml").write_text((d / "ratchet.toml").read_text().replace("env_steps = 20000\n", ""))
    return load_spec(d)


def test_episode_budget(tmp_path):
    spec = _small_spec(tmp_path, {"episodes": 150})
    assert spec.budget.env_steps is None
    start_run(spec, tmp_path / "runs", "ep")
    st = project(read_events(tmp_path / "runs" / "ep"))
    assert st.status == "finished" and 0 < st.episodes <= 150
    assert st.generations >= 1


def test_wall_clock_budget(tmp_path, pool):
    # 8 s: the baseline's evaluation comes first, and on a loaded machine it took 2.5 s (a 1.5 s budget was spent
    # before any generation); a warm pool: starting a worker alone can take longer than that
    spec = _small_spec(tmp_path, {"wall_clock_s": 8})
    result = start_run(spec, tmp_path / "runs", "wc", executor=pool)
    st = project(read_events(tmp_path / "runs" / "wc"))
    assert result.stop_reason == "wall-clock budget used"
    assert st.generation_log and st.generation_log[-1]["env_steps"] > 0
    assert 8 <= st.wall_clock_s < 120  # the generation under way finishes (on a loaded machine: 52 s seen)


def test_patience(tmp_path):
    spec = _small_spec(tmp_path, {"env_steps": 200_000, "patience": 2})
    result = start_run(spec, tmp_path / "runs", "pt")
    assert result.stop_reason.startswith("patience")
    gens = project(read_events(tmp_path / "runs" / "pt")).generation_log
    assert [g["promoted"] for g in gens[-2:]] == [False, False]


# regression (was a bug): planner.py/loop.py treat the env-step budget as a soft limit: can_afford_generation and
# should_gate estimate episode length from the previous generation, so when CMA-ES finds much longer episodes the
# run overshoots [budget] env_steps (seed 2, 1000 steps -> 1638)
@pytest.mark.parametrize("seed, env_steps", [(2, 2500), (2, 25_000), (3, 40_000)])
def test_env_step_budget_is_never_exceeded(tmp_path, seed, env_steps):
    spec = load_spec(make_spec_dir(tmp_path / "s", seed=seed, budget={"env_steps": env_steps}, test={"episodes": 3},
                                   gate={"validation_episodes": 5}, execution={"workers": 1}))
    start_run(spec, tmp_path / "runs", "b")
    st = project(read_events(tmp_path / "runs" / "b"))
    assert st.status == "finished"
    assert st.env_steps <= env_steps
    if env_steps >= 25_000:
        assert st.generations >= 1  # the budget was really spent on refinement, not refused up front


# regression (was a bug): loop.py never stops when every episode errors with length 0 (e.g. a policy whose top level
# raises): usage.env_steps stays 0, so neither the env-step budget nor can_afford_generation ends the run and it
# loops forever appending events
def test_policy_that_never_runs_does_not_loop_forever(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", "policy_import_error.py", budget={"env_steps": 3000},
                                   test={"episodes": 5}, gate={"validation_episodes": 5}, execution={"workers": 1}))
    guard = RecordingExecutor(ProcessExecutor(workers=1, episode_timeout_s=30), max_calls=30)
    try:
        result = start_run(spec, tmp_path / "runs", "bad", executor=guard)
    except RatchetError:
        return  # refusing to run a policy that cannot load is acceptable too
    finally:
        guard.close()
    assert result.test.n_errors == result.test.n  # it ended, and says the policy never worked


def test_killed_run_resumes_to_the_same_ledger(finished_run, tmp_path):
    """Kill (simulated, mid-evaluation) then resume: nothing recorded is recomputed, the end state equals an
    uninterrupted run of the same spec, and the resumed session may even use a different worker count."""
    ref_result, ref_dir, spec_dir = finished_run
    spec = load_spec(spec_dir)
    runs = tmp_path / "runs"
    dying = RecordingExecutor(ProcessExecutor(workers=1, episode_timeout_s=30), die_after=120)
    with pytest.raises(SimulatedKill):
        start_run(spec, runs, "cp-ref", executor=dying)
    before = read_events(runs / "cp-ref")
    assert not events_of(before, EventType.RUN_FINISHED) and not events_of(before, EventType.RUN_FAILED)
    done_before = events_of(before, EventType.EPISODES_EVALUATED)
    assert len(done_before) >= 3
    assert project(before).status in ("running", "interrupted")

    resumer = RecordingExecutor(ProcessExecutor(workers=2, episode_timeout_s=30))
    infos: list[dict] = []
    result = resume_run("cp-ref", runs, executor=resumer, progress=infos.append)
    after = read_events(runs / "cp-ref")
    # the progress callback is told which generations were read back (the printer marks where the resume began)
    recorded = len(events_of(before, EventType.GENERATION_FINISHED))
    assert [i["replayed"] for i in infos] == [True] * recorded + [False] * (len(infos) - recorded)
    assert 0 < recorded < len(infos)

    # what was recorded before is untouched
    assert [(e.seq, e.key, e.payload, e.time) for e in after[:len(before)]] == \
        [(e.seq, e.key, e.payload, e.time) for e in before]
    assert len(events_of(after, EventType.RUN_RESUMED)) == 1
    # no recorded evaluation was executed again
    recorded_pairs = {(p["candidate_id"], s) for p in (e.payload for e in done_before) for s in p["seeds"]}
    assert not recorded_pairs & set(resumer.jobs)
    keys = [(e.payload["candidate_id"], e.payload["split"], tuple(e.payload["seeds"]))
            for e in events_of(after, EventType.EPISODES_EVALUATED)]
    assert len(keys) == len(set(keys))
    # and the outcome is the uninterrupted run's, event for event
    assert result.incumbent == ref_result.incumbent
    assert result.test.summary() == ref_result.test.summary()
    # (evaluations finish in completion order, which depends on worker scheduling: compare by key)
    ref = {key: (t, p) for t, key, p in normalized(read_events(ref_dir))}
    got = {key: (t, p) for t, key, p in normalized(after) if t != "run_resumed"}
    assert got.keys() == ref.keys()
    for key, value in ref.items():
        assert got[key] == value, key
    st = project(after)
    assert st.status == "finished" and st.env_steps == project(read_events(ref_dir)).env_steps


# regression (was a bug): loop.py resume_run sets the wall-clock offset to events[-1].time - events[0].time, which
# after a second resume includes the downtime between earlier sessions
def test_wall_clock_excludes_downtime_across_two_resumes(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 60_000}, test={"episodes": 5},
                                   gate={"validation_episodes": 5}, execution={"workers": 1}))
    runs = tmp_path / "runs"
    with pytest.raises(SimulatedKill):
        start_run(spec, runs, "wc", executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=15))
    # pretend the first session ended an hour ago
    con = sqlite3.connect(str(runs / "wc" / "ledger.sqlite"))
    with con:
        con.execute("UPDATE events SET time = time - 3600")
    con.close()
    with pytest.raises(SimulatedKill):
        resume_run("wc", runs, executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=15))
    resume_run("wc", runs, executor=ProcessExecutor(workers=1))
    st = project(read_events(runs / "wc"))
    assert st.status == "finished"
    assert st.wall_clock_s < 600


# -- ledgers in a database (--storage) -------------------------------------------------------------

def test_run_in_a_database_resumes_on_another_machine(shared_storage, tmp_path):
    """A run whose ledger lives in a shared database is killed; another machine (no run directory there)
    resumes it by id; its events stay gap-free and the recorded prefix is untouched."""
    from conftest import interrupted_run
    from sqlalchemy.engine import make_url

    from ratchet.loop import open_ledger

    run_id = interrupted_run(tmp_path, shared_storage, "db")
    spec = load_spec(tmp_path / "s")
    run_dir = tmp_path / "runs" / run_id
    assert (run_dir / "policy.py").is_file() and not (run_dir / "ledger.sqlite").exists()
    pointer = (run_dir / "ledger.json").read_text()
    password = make_url(shared_storage).password
    assert run_id in pointer and (not password or password not in pointer)
    with pytest.raises(RatchetError, match="already exists"):
        start_run(spec, tmp_path / "other", run_id, storage=shared_storage)
    assert not (tmp_path / "other").exists()

    elsewhere = tmp_path / "elsewhere"
    before = open_ledger(run_id, elsewhere, storage=shared_storage).read()
    assert project(before).status in ("running", "interrupted")  # (the "killed" writer is this process)
    result = resume_run(run_id, elsewhere, storage=shared_storage, executor=ProcessExecutor(workers=1))
    assert result.run_dir == elsewhere / run_id and (elsewhere / run_id / "ledger.json").is_file()
    after = open_ledger(elsewhere / run_id, storage=shared_storage).read()
    assert after[:len(before)] == before
    assert [e.seq for e in after] == list(range(1, len(after) + 1))
    assert project(after).status == "finished" and len(events_of(after, EventType.RUN_RESUMED)) == 1
    keys = [e.key for e in events_of(after, EventType.EPISODES_EVALUATED)]
    assert len(keys) == len(set(keys))


def test_bad_storage_fails_before_a_run_directory_exists(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s"))
    for storage in ("not a url", "postgresql://ratchet:s3cret@127.0.0.1:1/ratchet"):
        with pytest.raises(LedgerError) as info:
            start_run(spec, tmp_path / "runs", "bad", storage=storage)
        assert "s3cret" not in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_a_budget_too_small_for_one_generation_says_why(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 100}, test={"episodes": 3},
                                   task={"max_episode_steps": 20}, gate={"validation_episodes": 3},
                                   execution={"workers": 1}))
    result = start_run(spec, tmp_path / "runs", "tiny")
    assert result.stop_reason.startswith("budget: no room for a single generation (")
    assert "after validation used" in result.stop_reason
    assert "of [budget] env_steps = 100); raise [budget] env_steps" in result.stop_reason
    assert result.test is None and result.baseline_test is None  # nothing searched: no test episodes spent


# new-user trial: with every episode priced at the time limit, a budget too small for one generation is known before
# any episode; the run validated the start and spent its test episodes first
def test_start_run_refuses_an_env_step_budget_too_small_for_one_generation_at_worst_case_prices(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 1500, "pricing": "worst-case"},
                                   test={"episodes": 3}, gate={"validation_episodes": 3}, execution={"workers": 1}))
    with pytest.raises(SpecError, match=r"^budget: no room for a single generation \(up to [\d,]+ env steps: .*; "
                                        r"\[budget\] env_steps = 1,500, before the starting policy's validation\); "
                                        r"raise \[budget\] env_steps"):
        start_run(spec, tmp_path / "runs", "tiny")
    assert not (tmp_path / "runs" / "tiny").exists()  # nothing was run or written


# regression (issue 18 §6): [budget] episodes = 20 ran the first validation and the test episodes, then stopped with
# "no room for a single generation"; the episodes a generation takes are known before the run, so it never starts
def test_start_run_refuses_an_episode_budget_too_small_for_one_generation(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", gate={"validation_episodes": 3}, execution={"workers": 1}))
    small = spec.model_copy(update={"budget": spec.budget.model_copy(update={"episodes": 20})})
    with pytest.raises(SpecError, match=r"\[budget\] episodes = 20 cannot pay for a single generation: 3 for the "
                                        r"starting policy's first validation \+ \d+ for a generation"):
        start_run(small, tmp_path / "runs", "tiny")
    assert not (tmp_path / "runs").exists()  # nothing was run or written


def test_a_generation_the_env_step_cap_cuts_short_is_not_judged(tmp_path):
    """Work is priced by the episode lengths seen; when the executor's hard cap stops a generation, the
    run ends without judging it, and the env-step budget is never exceeded."""
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 2000}, test={"episodes": 3},
                                   gate={"validation_episodes": 3}, execution={"workers": 1},
                                   planner={"decide": "every"}))  # (powered: its confirmations' reserve ends it first)
    result = start_run(spec, tmp_path / "runs", "tiny")
    state = project(read_events(tmp_path / "runs" / "tiny"))
    assert state.env_steps <= 2000
    assert result.stop_reason.startswith("env-step budget used (the last generation was cut short")
    finished = events_of(read_events(tmp_path / "runs" / "tiny"), EventType.RUN_FINISHED)[0].payload
    assert sum(v for v in finished["env_steps_breakdown"].values()) == 2000


def test_a_run_being_written_cannot_be_resumed_or_restarted_from_this_machine(tmp_path):
    """Two writers would interleave one ledger: the run directory's lock lets only one in."""
    from ratchet.loop import lock_run_dir

    spec = _small_spec(tmp_path, {"env_steps": 3000})
    runs = tmp_path / "runs"
    with pytest.raises(SimulatedKill):
        start_run(spec, runs, "locked", executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=5))
    held = lock_run_dir(runs / "locked")  # stands in for a writer that is still alive
    try:
        with pytest.raises(LedgerError, match="being written by another ratchet process"):
            resume_run("locked", runs)
    finally:
        import os

        os.close(held)
    assert resume_run("locked", runs).stop_reason  # once the writer is gone, it resumes


# -- the budget is a hard cap (issue 8) -------------------------------------------------------------

# regression (was a bug): the starting policy's first validation ignored the budget: [budget] episodes = 5 ran its
# 30 validation episodes. A spec built with model_copy skips validation, so start_run checks again.
def test_start_run_refuses_a_budget_too_small_for_the_first_validation(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", gate={"validation_episodes": 30}, execution={"workers": 1}))
    small = spec.model_copy(update={"budget": spec.budget.model_copy(update={"episodes": 5})})
    with pytest.raises(SpecError, match=r"\[budget\] episodes = 5 cannot pay for the starting policy's first "
                                        r"validation \(\[gate\] validation_episodes = 30"):
        start_run(small, tmp_path / "runs", "tiny")
    assert not (tmp_path / "runs").exists()  # nothing was written


# regression (was a bug): "nl\n" passed the run-id check (the regex's "$" matches before a final newline)
@pytest.mark.parametrize("run_id", ["nl\n", "a\nb", "x" * 201, "../up"])
def test_start_run_refuses_bad_run_ids(tmp_path, run_id):
    spec = load_spec(make_spec_dir(tmp_path / "s", execution={"workers": 1}))
    with pytest.raises(RatchetError, match="must be a plain name"):
        start_run(spec, tmp_path / "runs", run_id)
    assert not (tmp_path / "runs").exists()


def test_start_run_refuses_a_runs_dir_that_is_a_run(tmp_path):
    """Regression: --runs-dir runs/<a run> made the new run inside the old one's directory, without a word."""
    spec = load_spec(make_spec_dir(tmp_path / "s", execution={"workers": 1}))
    inside = tmp_path / "runs" / "old"
    inside.mkdir(parents=True)
    (inside / "ledger.sqlite").write_bytes(b"")
    with pytest.raises(RatchetError, match=r"is a run's own directory; give the folder that holds runs \(.*runs\)"):
        start_run(spec, inside, "new")
    assert sorted(p.name for p in inside.iterdir()) == ["ledger.sqlite"]


class _ScriptedExecutor:
    """Returns made-up episodes of 40 env steps without running anything: every third one errored (a timeout
    that reports its length), every other one truncated. It honours no env-step cap (worst-case pricing)."""

    capabilities = ExecutorCapabilities()

    def run(self, task, jobs, on_episode=None):
        eps = []
        for i, job in enumerate(jobs):
            if job.seed // 3 % 3 == 0:  # seed % 3 is the split
                ep = Episode.failed(job.seed, "timeout after 1 s", length=40, task=task)
            else:
                ep = Episode(job.seed, float(job.seed % 11), 40, False, job.seed // 3 % 2 == 0, None)
            eps.append(ep)
            if on_episode is not None:
                on_episode(i, ep)
        return eps

    def describe(self):
        return {"backend": "scripted"}

    def close(self):
        pass


def test_every_env_step_counts_whatever_ended_the_episode(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 4000}, gate={"validation_episodes": 5},
                                   task={"env_id": "CartPole-v1", "max_episode_steps": 40}, test={"episodes": 3},
                                   execution={"workers": 1}))
    start_run(spec, tmp_path / "runs", "steps", executor=_ScriptedExecutor())
    events = read_events(tmp_path / "runs" / "steps")
    st = project(events)
    evals = [e.payload for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["split"] != "test"]
    lengths = [ep["length"] for p in evals for ep in p["episodes"]]
    assert any(ep["error"] for p in evals for ep in p["episodes"])  # errored episodes were there, and counted
    assert st.generations >= 2
    assert st.env_steps == sum(lengths) == 40 * len(lengths) <= 4000


class _CappingScriptedExecutor(_ScriptedExecutor):
    """The scripted executor, honouring an env-step cap (and declaring so)."""

    capabilities = ExecutorCapabilities(caps_env_steps=True)

    def run(self, task, jobs, on_episode=None, *, max_env_steps=None):
        eps = super().run(task, jobs)
        if max_env_steps is not None:
            from ratchet.execution import BUDGET_SKIP

            eps = [ep if 40 * (i + 1) <= max_env_steps else Episode.failed(ep.seed, BUDGET_SKIP, task=task)
                   for i, ep in enumerate(eps)]
        for i, ep in enumerate(eps):
            if on_episode is not None:
                on_episode(i, ep)
        return eps


# regression (was a bug): with decide = "every" the search keeps no confirmation in reserve, and the final decision's
# first round of confirmation was sized by the episode budget alone: a budget that ends just so had the executor's cap
# skip some of its episodes (1640 env steps with 5 validation seeds: 4 of 8; 3800 with 25: 2 of 20; 2800 with
# confirm_episodes = 20: 47 of 80) and the decision read nothing. A round the env steps left cannot pay for whole is now
# sized to what the budget leaves once the final validation is paid for (2800: 6 seeds a candidate), or not run.
@pytest.mark.parametrize(("validation", "confirm", "env_steps"), [(5, None, 1640), (25, None, 3800), (5, 20, 2800)])
def test_the_final_confirmation_is_sized_within_the_env_step_budget(tmp_path, validation, confirm, env_steps):
    from ratchet.execution import BUDGET_SKIP

    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": env_steps}, test={"episodes": 3},
                                   gate={"validation_episodes": validation}, execution={"workers": 1},
                                   task={"env_id": "CartPole-v1", "max_episode_steps": 40},
                                   planner={"decide": "every", **({"confirm_episodes": confirm} if confirm else {})}))
    start_run(spec, tmp_path / "runs", "end", executor=_CappingScriptedExecutor())
    events = read_events(tmp_path / "runs" / "end")
    (final,) = events_of(events, EventType.FINAL_DECISION)
    assert "cut short" not in final.payload["note"]
    assert not [ep for e in events_of(events, EventType.EPISODES_EVALUATED) for ep in e.payload["episodes"]
                if ep["error"] == BUDGET_SKIP]  # every episode a decision reads ran
    last = max(i for i, e in enumerate(events) if e.type is EventType.GENERATION_FINISHED)
    rounds = {len(e.payload["episodes"]) for e in events[last:] if e.type is EventType.EPISODES_EVALUATED
              and e.payload["split"] == "train"}
    if confirm:  # a smaller round than confirm_episodes, read at its real size
        assert len(rounds) == 1 and 1 <= rounds.pop() < confirm
    else:  # no room for a round and the final validation: none
        assert not rounds and "cannot pay for a confirmation" in final.payload["note"]
    assert project(events).env_steps <= env_steps


def test_an_executor_declares_what_it_does_and_the_run_reads_it_once(tmp_path):
    """Issue 42: capabilities are declared in the Executor contract (ExecutorCapabilities), never probed by name: a
    scripted executor that caps nothing says so and gets worst-case pricing, one that declares an exact cap gets
    observed pricing and the cap; an executor that declares nothing cannot start a run (no silent worst case)."""
    from ratchet.execution.process import ProcessExecutor as PE

    assert PE.capabilities == ExecutorCapabilities(caps_env_steps=True, records_traces=True, trains=True)
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 2000}, gate={"validation_episodes": 5},
                                   task={"env_id": "CartPole-v1", "max_episode_steps": 40}, test={"episodes": 3},
                                   execution={"workers": 1}))  # worst case: a generation and its gate cost 1,400
    for name, executor, pricing in [("worst", _ScriptedExecutor(), "worst-case"),
                                    ("observed", _CappingScriptedExecutor(), "observed")]:
        start_run(spec, tmp_path / "runs", name, executor=executor)
        (started,) = events_of(read_events(tmp_path / "runs" / name), EventType.RUN_STARTED)
        assert started.payload["pricing"] == pricing

    class Undeclared:
        def run(self, task, jobs, on_episode=None):
            raise AssertionError("never runs")

        def describe(self):
            return {"backend": "undeclared"}

        def close(self):
            pass

    with pytest.raises(RatchetError, match="declares no capabilities: give it a class attribute"):
        start_run(spec, tmp_path / "runs", "undeclared", executor=Undeclared())
    assert not (tmp_path / "runs" / "undeclared").exists()


def test_a_sequential_gate_reads_validation_in_batches_and_resumes_exactly(tmp_path):
    """[gate] test = "betting": each decision reads validation seeds a batch at a time (the incumbent's
    validation grows only as far as decisions read), stops early, and a run killed mid-way resumes to the
    uninterrupted run's evaluations."""
    d = make_spec_dir(tmp_path / "s", budget={"env_steps": 30000}, test={"episodes": 3},
                      gate={"test": "betting", "validation_episodes": 40, "batch": 10, "min_episodes": 10,
                            "return_range": [0.0, 500.0]}, execution={"workers": 1})
    spec = load_spec(d)
    ref = start_run(spec, tmp_path / "runs", "ref")
    events = read_events(tmp_path / "runs" / "ref")
    gates = [e.payload for e in events_of(events, EventType.GATE_DECIDED)]
    assert gates and all(g["test"] == "betting" and g["episodes_used"] <= 40 for g in gates)
    assert any(g["episodes_used"] < 40 for g in gates)  # some decision stopped early
    val = [e.payload for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["split"] == "validation"]
    assert events_of(events, EventType.EPISODES_EVALUATED)[0].payload["seeds"] == \
        val[0]["seeds"] and len(val[0]["seeds"]) == 10  # the starting policy: first batch only
    dying = RecordingExecutor(ProcessExecutor(workers=1, episode_timeout_s=30), die_after=60)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "killed", executor=dying)
    result = resume_run("killed", tmp_path / "runs")
    assert result.incumbent == ref.incumbent and result.test.summary() == ref.test.summary()

    def evaluations(run):
        return {e.key: e.payload["episodes"] for e in events_of(read_events(tmp_path / "runs" / run),
                                                               EventType.EPISODES_EVALUATED)}
    assert evaluations("killed") == evaluations("ref")


def test_a_cascade_drops_contenders_after_their_first_stage_and_resumes_exactly(tmp_path):
    """[planner] cascade_episodes: every contender and the incumbent run the first training seeds; a dropped
    contender is a recorded rejection that cost only those episodes (and their env steps), the rest run the other
    seeds under their own evaluation key, the gate reads only validation seeds, and a run killed mid-way resumes
    to the uninterrupted run's ledger."""
    d = make_spec_dir(tmp_path / "s", budget={"env_steps": 12_000}, test={"episodes": 2},
                      gate={"validation_episodes": 6}, planner={"cascade_episodes": 1, "cascade_margin": 0.0},
                      refiner={"train_episodes": 4, "popsize": 6, "sigma0": 0.5}, execution={"workers": 1})
    policy = (d / "policy.py").read_text()  # a start that balances a while: most samples around it do worse
    (d / "policy.py").write_text(policy.replace('"w_angle": {"default": 0.0', '"w_angle": {"default": 0.3'))
    spec = load_spec(d)
    ref = start_run(spec, tmp_path / "runs", "ref")
    events = read_events(tmp_path / "runs" / "ref")
    train = [e.payload for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["split"] == "train"]
    dropped = [e.payload for e in events_of(events, EventType.PROPOSAL_REJECTED)
               if e.payload["reason"].startswith("cascade:")]
    assert dropped, "nothing dropped: the test shows nothing"
    assert all(p["kind"] == "cascade" for p in dropped)
    for p in dropped:  # one evaluation, on the generation's first training seed, and the rejection says what it cost
        own = [t for t in train if t["candidate_id"] == p["detail"]["candidate_id"] and t["generation"] == p["generation"]]
        assert len(own) == 1 and len(own[0]["seeds"]) == 1
        assert p["detail"]["episodes"] == 1 and p["detail"]["env_steps"] == own[0]["summary"]["env_steps"]
    out = {(p["generation"], p["detail"]["candidate_id"]) for p in dropped}
    for g in (e.payload for e in events_of(events, EventType.GENERATION_FINISHED)):  # stage 1, then the rest
        seeds = g["train_seeds"]
        first = {t["candidate_id"] for t in train if t["seeds"] == seeds[:1]}
        rest = {t["candidate_id"] for t in train if t["seeds"] == seeds[1:]}
        assert g["incumbent_id"] in first | rest and rest and rest < first
        assert first - rest == {c for gen, c in out if gen == g["generation"]}
        assert not [t for t in train if t["seeds"] == seeds]
    # the budget counts exactly what ran: the dropped contenders' first stage only
    st = project(events)
    assert st.env_steps == sum(e.payload["summary"]["env_steps"] for e in events_of(events, EventType.EPISODES_EVALUATED)
                               if e.payload["split"] != "test")
    # the gate reads only validation seeds, and no training seed is one of them
    validation = set(events[0].payload["seeds"]["validation"])
    assert events_of(events, EventType.GATE_DECIDED)
    assert all(set(e.payload["seeds"]) <= validation for e in events_of(events, EventType.EPISODES_EVALUATED)
               if e.payload["split"] == "validation")
    assert not {s for t in train for s in t["seeds"]} & validation
    # kill mid-run, resume: the same ledger
    dying = RecordingExecutor(ProcessExecutor(workers=1, episode_timeout_s=30), die_after=len(train) + 4)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "killed", executor=dying)
    result = resume_run("killed", tmp_path / "runs")
    assert result.incumbent == ref.incumbent and result.test.summary() == ref.test.summary()
    ref_events = {key: (t, p) for t, key, p in normalized(events)}
    got = {key: (t, p) for t, key, p in normalized(read_events(tmp_path / "runs" / "killed")) if t != "run_resumed"}
    assert got == ref_events
