"""The world model: transitions recorded on the trusted side, the ensemble, imagined rollouts, the screen."""

from __future__ import annotations

import json
import re
import types

import gymnasium as gym
import numpy as np
import pytest

from ratchet.tasks.gym import GymTask
from ratchet.worldmodel.imagine import action_encoder, imagined_returns
from ratchet.worldmodel.model import WorldModel, WorldModelError, fit_model
from ratchet.worldmodel.screen import ScreenState, choose, optimistic, rank_correlation
from ratchet.worldmodel.transitions import Transitions, TransitionsError, record_transitions


def _pendulum_policy(gain: float) -> types.SimpleNamespace:
    return types.SimpleNamespace(act=lambda obs, p: np.array([np.clip(-p["k"] * obs[2], -2, 2)], np.float32))


def _pendulum_data(tmp_path, episodes: int = 4, gain: float = 1.0) -> Transitions:
    task = GymTask("Pendulum-v1", max_episode_steps=50)
    data = Transitions.empty(3, 1)
    for seed in range(episodes):
        path = tmp_path / f"{seed}.transitions.npz"
        ep = record_transitions(task.make_env(), _pendulum_policy(gain), {"k": gain}, seed, task, str(path))
        got = Transitions.from_bytes(path.read_bytes())
        assert len(got) == ep.length == 50 and got.first[0] and not got.first[1:].any()
        assert got.truncated[-1] and not got.terminated.any()
        assert abs(float(got.reward.sum()) - ep.episode_return) < 1e-3
        data = data.joined(got)
    return data


def test_transitions_record_an_episode_as_it_ran_and_the_data_set_is_bounded(tmp_path):
    data = _pendulum_data(tmp_path, episodes=3)
    assert len(data) == 150 and len(data.starts()) == 3
    assert np.allclose(data.next_obs[:49], data.obs[1:50])  # consecutive steps of one episode
    kept = data.joined(data, limit=200)
    assert len(kept) == 200 and np.array_equal(kept.reward[-150:], data.reward)  # the newest rows are kept
    back = Transitions.from_bytes(kept.to_bytes())
    assert np.array_equal(back.obs, kept.obs) and np.array_equal(back.first, kept.first)


def test_transitions_of_a_discrete_action_are_one_hot(tmp_path):
    task = GymTask("CartPole-v1")
    path = tmp_path / "c.transitions.npz"
    record_transitions(task.make_env(), types.SimpleNamespace(act=lambda o, p: int(o[2] > 0)), {}, 3, task, str(path))
    data = Transitions.from_bytes(path.read_bytes())
    assert data.action.shape[1] == 2 and np.array_equal(data.action.sum(1), np.ones(len(data)))
    assert data.terminated[-1]


@pytest.mark.parametrize("bad", [b"not a zip", Transitions.empty(3, 1).to_bytes()[:-20]])
def test_transitions_refuse_bytes_they_did_not_write(bad):
    with pytest.raises(TransitionsError):
        Transitions.from_bytes(bad)


def test_transitions_refuse_non_finite_numbers_and_pickles(tmp_path):
    import io

    data = _pendulum_data(tmp_path, episodes=1)
    buf = io.BytesIO()
    arrays = {f: getattr(data, f) for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "first")}
    arrays["reward"] = arrays["reward"].copy()
    arrays["reward"][3] = np.nan
    np.savez(buf, **arrays)
    with pytest.raises(TransitionsError, match="finite"):
        Transitions.from_bytes(buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, **{**arrays, "reward": np.array([object()] * len(data), dtype=object)})
    with pytest.raises(TransitionsError):
        Transitions.from_bytes(buf.getvalue())


def test_the_model_is_deterministic_and_predicts_held_out_steps(tmp_path):
    data = _pendulum_data(tmp_path, episodes=4)
    model, fit = fit_model(data, members=3, hidden=32, updates=150, seed=1)
    again, fit2 = fit_model(data, members=3, hidden=32, updates=150, seed=1)
    assert model.to_bytes() == again.to_bytes() and fit == fit2
    assert fit.rows + fit.holdout == len(data) and fit.holdout_error < 0.3 and fit.disagreement > 0
    back = WorldModel.from_bytes(model.to_bytes())
    nxt, r, p = back.predict(data.obs[:5].astype(np.float64), data.action[:5].astype(np.float64), 2)
    assert nxt.shape == (5, 3) and r.shape == (5,) and p.shape == (5,)
    with pytest.raises(WorldModelError):
        WorldModel.from_bytes(data.to_bytes())


def test_imagined_returns_rank_pendulum_policies_as_real_episodes_do(tmp_path):
    data = Transitions.empty(3, 1)
    for gain in (0.0, 0.5, 1.0, 2.0):  # a spread of behaviour to learn from
        data = data.joined(_pendulum_data(tmp_path, episodes=2, gain=gain))
    model, _ = fit_model(data, members=3, hidden=32, updates=400, seed=0)
    env = gym.make("Pendulum-v1")
    gains = [0.0, 1.0, 2.0]
    act = _pendulum_policy(0).act
    imagined = imagined_returns(model, act, [{"k": g} for g in gains], data.starts()[:4], 50,
                                action_encoder(env.action_space))
    assert imagined.shape == (3, 3) and np.isfinite(imagined).all()
    task = GymTask("Pendulum-v1", max_episode_steps=50)
    real = []
    for g in gains:
        rets = [record_transitions(task.make_env(), _pendulum_policy(g), {"k": g}, s, task,
                                   str(tmp_path / "r.transitions.npz")).episode_return for s in range(4)]
        real.append(float(np.mean(rets)))
    rho = rank_correlation(optimistic(imagined, 0.0), real)
    assert rho is not None and rho > 0


def test_the_screen_keeps_the_best_with_optimism_and_switches_off_when_it_does_not_predict():
    returns = np.array([[1.0, 1.0], [0.0, 4.0], [3.0, 3.0]])  # means 1, 2, 3; the second is uncertain
    assert choose(optimistic(returns, 0.0), 2) == [2, 1]
    assert choose(optimistic(returns, 1.0), 1) == [1]  # 2 + 1 × 2 beats 3 + 0
    assert choose([1.0, float("nan"), 1.0], 3) == [0, 2, 1]
    assert rank_correlation([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert rank_correlation([1, 2], [1, 2]) is None and rank_correlation([1, 1, 1], [1, 2, 3]) is None
    state = ScreenState(min_correlation=0.2, window=2, judge="kept")  # the rule of runs recorded before controls
    assert state.judge_generation(1, 0.9, [], []) and state.judge_generation(2, None, [], [])
    assert state.judge_generation(3, -0.1, [], [])  # mean 0.4: still on
    assert not state.judge_generation(4, -0.5, [], []) and state.switched_off_at == 4
    assert not state.judge_generation(5, 1.0, [], [])  # off for the rest of the run


# -- the screen around a refiner ------------------------------------------------------------------------------------

class _Inner:
    """A refiner that proposes ``n`` candidates of one program and keeps what it observes."""

    name = "inner"

    def __init__(self, n: int) -> None:
        self.n, self.observed = n, []

    def propose(self, parent, critique, rng):
        from ratchet.policy import Candidate

        return [Candidate.create("def act(o, p):\n    return 0\n", {"k": float(i)}) for i in range(self.n)]

    def generation_cost(self):
        from ratchet.refiners.base import GenerationCost

        return GenerationCost(proposals=self.n, recommends=True)

    def take_rejections(self):
        return []

    def observe(self, evaluations):
        self.observed = list(evaluations)

    def recommend(self):
        return None

    def fit(self, room):
        return False

    def idle_reason(self):
        return None

    def verdict(self, candidate_id, promoted, note):
        pass

    def summary(self):
        return {"sigma": 0.1}


def _screen_ctx(tmp_path, imagined):
    """A context whose data set is a recorded pendulum data set and whose training job answers ``imagined``."""
    from ratchet.execution.training import TrainingOutput, TrainingResult, accept

    data = _pendulum_data(tmp_path, episodes=2)
    model, _ = fit_model(data, members=2, hidden=8, updates=10, seed=0)
    store = {"d" * 64: data.to_bytes(), "m" * 64: model.to_bytes()}
    jobs = []

    def train(job):
        jobs.append(job)
        result = accept(job, TrainingResult((TrainingOutput({"world_model": store["m" * 64]},
                                                            {"returns": imagined}),), 0))
        assert result.error is None, result.error
        out = result.outputs[0]
        return TrainingResult((TrainingOutput({}, {**out.info, "artifacts": {"world_model": "m" * 64}}),), 0)

    ctx = types.SimpleNamespace(seed=3, train=train, artifact=store.__getitem__, transitions=lambda: ["d" * 64],
                                task=types.SimpleNamespace(step_limit=200))
    return ctx, jobs


def _settings(**kw):
    from ratchet.spec import ModelSpec

    return ModelSpec(**{"screen": True, "min_transitions": 50, **kw})


def _ev(cid, mean):
    from ratchet.critic import Evaluation
    from ratchet.rollout import Episode

    return Evaluation(cid, "train", (Episode(1, mean, 10, False, True),))


def test_the_screen_runs_the_best_ranked_and_tells_the_refiner_every_proposal(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import ScreenedRefiner

    imagined = [[0.0, 0.0], [5.0, 5.0], [1.0, 1.0], [9.0, 9.0]]  # proposal 3 best, then 1, 2, 0
    ctx, jobs = _screen_ctx(tmp_path, imagined)
    inner = _Inner(4)
    ref = ScreenedRefiner(inner, _settings(factor=2, optimism=0.0), ctx)
    assert ref.generation_cost().proposals == 2 and ref.generation_cost().recommends
    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": -1.0})
    kept = ref.propose(parent, None, np.random.default_rng(0))
    assert [c.params["k"] for c in kept] == [3.0, 1.0]
    assert len(jobs) == 1 and jobs[0].env_steps == 0 and len(jobs[0].settings["params"]) == 4
    rejected = ref.take_rejections()
    assert [r.detail["candidate_id"] for r in rejected] == [inner.propose(None, None, None)[i].id for i in (2, 0)]
    incumbent = _ev(parent.id, -1.0)
    ref.observe([_ev(kept[0].id, -5.0), _ev(kept[1].id, -7.0), incumbent])
    told = {e.candidate_id: e.mean for e in inner.observed}
    assert len(inner.observed) == 5 and inner.observed[-1] is incumbent  # the parent's reference stays last
    out = inner.propose(None, None, None)
    assert told[out[2].id] == -8.0 and told[out[0].id] == -9.0  # below every real one, in the model's order
    s = ref.summary()
    assert s["sigma"] == 0.1 and s["screen_kept"] == 2 and s["screen_saved"] == 2 and s["screen_on"]
    assert s["model_rows"] == 100 and s["model_error"] >= 0 and s["model_disagreement"] >= 0


def test_the_screens_account_ranks_the_recommendation_it_did_not_choose_beside_what_it_kept(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import ScreenedRefiner

    imagined = [[0.0, 0.0], [5.0, 5.0], [1.0, 1.0], [9.0, 9.0], [3.0, 3.0]]  # the last: the recommendation
    ctx, jobs = _screen_ctx(tmp_path, imagined)
    inner = _Inner(4)
    mean = Candidate.create("def act(o, p):\n    return 0\n", {"k": 1.5})
    inner.recommend = lambda: mean
    ref = ScreenedRefiner(inner, _settings(factor=2, optimism=0.0), ctx)
    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": -1.0})
    assert ref.recommend() is mean  # the loop asks before it proposes
    kept = ref.propose(parent, None, np.random.default_rng(0))
    assert [c.params["k"] for c in kept] == [3.0, 1.0]  # ranked among the proposals only
    assert [p["k"] for p in jobs[0].settings["params"]] == [0.0, 1.0, 2.0, 3.0, 1.5]
    ref.observe([_ev(kept[0].id, -5.0), _ev(kept[1].id, -7.0), _ev(mean.id, -8.0)])
    assert ref.summary()["screen_rank_correlation"] == 1.0  # three that ran, the model's order is the real one
    told = {e.candidate_id: e.mean for e in inner.observed}
    assert told[inner.propose(None, None, None)[2].id] == -8.0  # stand-ins below the kept ones, as before


def test_the_screens_controls_run_screened_out_proposals_drawn_at_random(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import ScreenedRefiner

    ctx, _ = _screen_ctx(tmp_path, [[float(i)] * 2 for i in range(8)])  # the model prefers higher k
    inner = _Inner(8)
    ref = ScreenedRefiner(inner, _settings(factor=2, optimism=0.0, controls=1), ctx)
    assert ref.generation_cost().proposals == 5  # the best 4 and one control
    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": -1.0})
    kept = ref.propose(parent, None, np.random.default_rng(0))
    ks = [c.params["k"] for c in kept]
    assert ks[:4] == [7.0, 6.0, 5.0, 4.0] and ks[4] in (3.0, 2.0, 1.0, 0.0)
    rejected = ref.take_rejections()
    assert len(rejected) == 3 and {r.detail["rank"] for r in rejected} == {1, 2, 3, 4, 5, 6, 7, 8} - set(
        range(1, 5)) - {8 - int(ks[4])}  # each rejection carries the model's own rank
    again = ScreenedRefiner(_Inner(8), _settings(factor=2, optimism=0.0, controls=1), _screen_ctx(tmp_path, [
        [float(i)] * 2 for i in range(8)])[0])
    assert [c.id for c in again.propose(parent, None, np.random.default_rng(5))] == [c.id for c in kept]  # seeded
    ref.observe([_ev(c.id, c.params["k"]) for c in kept])
    assert ref.summary()["screen_rank_correlation"] == 1.0 and ref.summary()["screen_kept"] == 5
    told = {e.candidate_id: e.mean for e in inner.observed}
    stand_ins = [told[r.detail["candidate_id"]] for r in rejected]
    assert len(told) == 8 and stand_ins == [ks[4] - 1, ks[4] - 2, ks[4] - 3]  # below every real one, the control's too


def test_the_screen_switches_itself_off_when_what_it_kept_does_no_better_than_its_controls(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import ScreenedRefiner

    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": 0.0})

    def screened(sign: float, **settings):
        ctx, jobs = _screen_ctx(tmp_path, [[float(i)] * 2 for i in range(8)])  # the model prefers higher k
        ref = ScreenedRefiner(_Inner(8), _settings(factor=2, optimism=0.0, window=2, **settings), ctx)
        for generation in range(2):
            kept = ref.propose(parent, None, np.random.default_rng(0))
            ref.observe([_ev(c.id, sign * c.params["k"]) for c in kept])
            if generation == 0:  # one generation is too few to judge by, whatever it says
                assert ref.summary()["screen_on"]
        return ref, jobs

    wrong, jobs = screened(-1.0, controls=1)  # the real returns say the opposite: every control beats the kept
    s = wrong.summary()
    assert s["screen_advantage"] == -1.0 and s["screen_pairs"] == 8 and s["screen_margin"] < 0
    assert not s["screen_on"] and wrong.generation_cost().proposals == 8  # off: every proposal is run
    assert len(wrong.propose(parent, None, np.random.default_rng(0))) == 8 and len(jobs) == 2
    right, _ = screened(1.0, controls=1)
    assert right.summary()["screen_advantage"] == 1.0 and right.summary()["screen_on"]
    # without controls the rank correlation among what ran (biased low) switches nothing off ...
    blind, _ = screened(-1.0)
    s = blind.summary()
    assert s["screen_rank_correlation"] == -1.0 and s["screen_on"] and s["screen_advantage"] is None
    # ... except in a run recorded before controls judged the screen
    old, _ = screened(-1.0, judge="kept", controls=1)
    assert not old.summary()["screen_on"] and not {"screen_advantage", "screen_pairs", "screen_margin"} & set(
        old.summary())  # its generation_finished as it was recorded


def test_before_the_model_can_screen_only_as_many_proposals_run_as_in_a_screened_generation(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import NOT_YET_SCREENED, ScreenedRefiner

    ctx, jobs = _screen_ctx(tmp_path, [[0.0]] * 8)
    inner = _Inner(8)
    ref = ScreenedRefiner(inner, _settings(min_transitions=101, controls=1, unscreened="kept"), ctx)  # has 100
    assert ref.generation_cost().proposals == 5  # the 4 a screened generation keeps and its control, not all 8
    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": -1.0})
    ran = ref.propose(parent, None, np.random.default_rng(0))
    assert [c.params["k"] for c in ran] == [0.0, 1.0, 2.0, 3.0, 4.0] and not jobs  # the first ones; no model job
    rejected = ref.take_rejections()
    assert [r.detail["candidate_id"] for r in rejected] == [c.id for c in inner.propose(None, None, None)[5:]]
    assert all(r.reason == NOT_YET_SCREENED for r in rejected)
    ref.observe([_ev(c.id, -c.params["k"]) for c in ran])  # nothing was screened: nothing judges the screen
    s = ref.summary()
    assert s["screen_waiting"] and s["screen_kept"] == 5 and s["screen_saved"] == 3 and s["screen_on"]
    assert s.get("screen_advantage") is None and s.get("screen_pairs") == 0 and "screen_rank_correlation" not in s
    told = {e.candidate_id: e.mean for e in inner.observed}
    assert len(told) == 8 and [told[r.detail["candidate_id"]] for r in rejected] == [-5.0, -6.0, -7.0]  # below all


def test_the_screens_defaults_are_the_specs(tmp_path):
    from ratchet.refiners.screened import ScreenedRefiner
    from ratchet.spec import ModelSpec

    state, spec = ScreenState(), ModelSpec()
    assert (state.min_correlation, state.window, state.judge) == (spec.min_correlation, spec.window, spec.judge)
    ctx, _ = _screen_ctx(tmp_path, [])
    ref = ScreenedRefiner(_Inner(4), _settings(), ctx)
    assert (ref.state.min_correlation, ref.state.window) == (spec.min_correlation, spec.window)


def test_the_screen_waits_for_enough_transitions_and_skips_proposals_of_several_programs(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import ScreenedRefiner

    ctx, jobs = _screen_ctx(tmp_path, [[0.0]] * 4)
    ref = ScreenedRefiner(_Inner(4), _settings(min_transitions=101, unscreened="all"), ctx)  # the data set has 100
    assert ref.generation_cost().proposals == 4
    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": 0.0})
    assert len(ref.propose(parent, None, np.random.default_rng(0))) == 4 and not jobs
    inner = _Inner(4)
    inner.propose = lambda *a: [Candidate.create(f"def act(o, p):\n    return {i}\n", {"k": 0.0}) for i in range(4)]
    ref = ScreenedRefiner(inner, _settings(), ctx)
    assert len(ref.propose(parent, None, np.random.default_rng(0))) == 4 and not jobs
    assert "not one program" in ref.summary()["screen_note"]


# -- in a run ----------------------------------------------------------------------------------------------------------

_MODEL = {"screen": True, "min_transitions": 50, "members": 2, "hidden": 8, "updates": 20, "horizon": 20, "starts": 2,
          "record_episodes": 4}


def _screened_spec(tmp_path, **model):
    from conftest import make_spec_dir

    from ratchet.spec import load_spec

    return load_spec(make_spec_dir(tmp_path / "spec", budget={"env_steps": 100_000, "episodes": 60},
                                   gate={"validation_episodes": 4}, test={"episodes": 3}, execution={"workers": 1},
                                   model={**_MODEL, **model}))


def test_a_screened_run_records_transitions_screens_and_resumes_exactly(tmp_path):
    from conftest import RecordingExecutor, SimulatedKill, comparable, events_of, read_events

    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger import EventType
    from ratchet.ledger.projection import project
    from ratchet.loop import resume_run, start_run

    spec = _screened_spec(tmp_path, unscreened="kept")
    assert spec.refiner.popsize == 8  # a small budget's population, times [model] factor
    whole = start_run(spec, tmp_path / "runs", "whole")
    events = read_events(whole.run_dir)
    recorded = events_of(events, EventType.TRANSITIONS_RECORDED)
    assert recorded and all(e.payload["artifact"] and e.payload["rows"] > 0 for e in recorded)
    gens = events_of(events, EventType.GENERATION_FINISHED)
    first = gens[0].payload  # before the model has min_transitions: as many run as in a screened generation
    assert first["screen_waiting"] and (first["screen_kept"], first["screen_proposed"]) == (4, 8)
    screened = [g.payload for g in gens if g.payload["screen_kept"] < g.payload["screen_proposed"]
                and not g.payload.get("screen_waiting")]
    assert screened and all(g["screen_kept"] == 4 and g["model_rows"] >= 50 for g in screened)
    assert events_of(events, EventType.TRAINING_FINISHED)  # the sandboxed model job
    wm = project(events).world_model()
    assert wm is not None and wm["saved"] == 4 * (len(screened) + 1) and wm["holdout_error"] is not None
    assert wm["screened"] == len(screened)
    kinds = {e.payload["kind"] for e in events_of(events, EventType.PROPOSAL_REJECTED)}
    assert {"screened_out", "not_screened"} <= kinds  # recorded for counting, not read back from the reason's words
    from typer.testing import CliRunner

    from ratchet.cli import app

    shown = CliRunner().invoke(app, ["show", str(whole.run_dir), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["world_model"] == wm
    shown = CliRunner().invoke(app, ["show", str(whole.run_dir)], env={"COLUMNS": "200"})
    assert "world model" in shown.stdout and f"{wm['saved']} proposal(s) not run" in shown.stdout
    # new-user pass: the proposals it screened out were counted as "no usable new source, a duplicate, or dropped by
    # the cascade", naming every cause but the one that rejected them; now the row counts the recorded reasons
    reasons = json.loads(CliRunner().invoke(app, ["show", str(whole.run_dir), "--json"]).stdout)[
        "rejected_proposal_reasons"]
    screened = next(r["count"] for r in reasons if r["reason"] == "screened out by the world model")
    assert re.search(rf"rejected proposals │ \d+ \((.*, )?{screened} screened out by the world model[,)]",
                     " ".join(shown.stdout.split()))
    from ratchet.report import write_run_report

    html = write_run_report(whole.run_dir, videos=False).read_text(encoding="utf-8")
    assert "<h2>World model</h2>" in html and "proposal(s) not run" in html
    from ratchet.dashboard import Dashboard, RunSource

    dash = Dashboard(RunSource(tmp_path / "runs"))
    try:
        view = dash.page("whole").view()
        assert view["world_model"]["saved"] == wm["saved"] and "proposal(s) not run" in view["world_model"]["text"]
    finally:
        dash.close()
    # a kill in the middle of a screened run, then resume: the same ledger as the run that was never killed
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "killed",
                  executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=30))
    resume_run("killed", tmp_path / "runs")
    assert comparable(read_events(tmp_path / "runs" / "killed")) == comparable(events)


def test_a_screened_run_with_a_control_runs_it_and_resumes_exactly(tmp_path):
    from conftest import RecordingExecutor, SimulatedKill, comparable, events_of, read_events

    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger import EventType
    from ratchet.loop import resume_run, start_run

    spec = _screened_spec(tmp_path, controls=1)
    whole = start_run(spec, tmp_path / "runs", "whole")
    events = read_events(whole.run_dir)
    gens = [g.payload for g in events_of(events, EventType.GENERATION_FINISHED)]
    assert any(g["screen_kept"] == 5 and g["screen_proposed"] == 8 for g in gens)  # the best 4 and a control
    judged = [g for g in gens if g["screen_kept"] == 5]
    assert judged[-1]["screen_pairs"] == 4 * len(judged) and -1 <= judged[-1]["screen_advantage"] <= 1
    # the account against the controls, where show, the report and the dashboard show the screen's
    from typer.testing import CliRunner

    from ratchet.cli import app
    from ratchet.dashboard import Dashboard, RunSource
    from ratchet.ledger.projection import project
    from ratchet.report import write_run_report

    wm = project(events).world_model()
    assert wm is not None and wm["pairs"] == 4 * len(judged) and wm["advantage"] == judged[-1]["screen_advantage"]
    shown = CliRunner().invoke(app, ["show", str(whole.run_dir)], env={"COLUMNS": "300"})
    assert "advantage over random screened-out controls" in " ".join(shown.stdout.split())
    html = write_run_report(whole.run_dir, videos=False).read_text(encoding="utf-8")
    assert f"advantage over random screened-out controls {wm['advantage']:+.2f} over {wm['pairs']} pair(s)" in html
    dash = Dashboard(RunSource(tmp_path / "runs"))
    try:
        view = dash.page("whole").view()
        assert view["world_model"]["advantage"] == wm["advantage"] and "controls" in view["world_model"]["text"]
    finally:
        dash.close()
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "killed",
                  executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=30))
    resume_run("killed", tmp_path / "runs")
    assert comparable(read_events(tmp_path / "runs" / "killed")) == comparable(events)


def test_the_screens_account_reads_its_controls_and_an_older_run_keeps_its_own():
    from ratchet.ledger.projection import world_model_account, world_model_text

    base = {"screen_on": True, "screen_proposed": 8, "screen_kept": 5, "screen_saved": 3, "model_rows": 400,
            "model_error": 0.01, "model_disagreement": 0.02}
    new = [{**base, "screen_rank_correlation": -0.5, "screen_advantage": 0.25, "screen_pairs": 4, "screen_margin": 10.0},
           {**base, "screen_rank_correlation": -0.3, "screen_advantage": 0.5, "screen_pairs": 8, "screen_margin": 30.0}]
    wm = world_model_account(new)
    assert wm is not None and (wm["judge"], wm["advantage"], wm["pairs"], wm["margin"]) == ("controls", 0.5, 8, 20.0)
    text = world_model_text(wm)
    assert "advantage over random screened-out controls +0.50 over 8 pair(s) (kept won 75 %)" in text
    assert "kept minus controls +20" in text and "biased low" in text
    off = world_model_text(world_model_account([*new, {**new[-1], "screen_on": False, "screen_advantage": -0.1}]) or {})
    assert "switched off (its kept candidates did no better than the controls)" in off
    none = world_model_text(world_model_account([{**base, "screen_advantage": None, "screen_pairs": 0}]) or {})
    assert "no controls run yet" in none
    old = world_model_account([{**base, "screen_on": False, "screen_rank_correlation": -0.5}])  # an older ledger
    assert old is not None and old["judge"] == "kept" and old["advantage"] is None
    assert "switched off (it did not predict)" in world_model_text(old) and "controls" not in world_model_text(old)


def test_a_run_recorded_before_controls_judged_the_screen_resumes_with_its_rule():
    from ratchet.loop import recorded_spec
    from ratchet.spec import spec_from_dict

    data = spec_from_dict({"task": {"env_id": "Pendulum-v1"}, "budget": {"episodes": 128},
                           "model": {"screen": True}}, ".").to_dict()
    assert data["model"]["judge"] == "controls" and recorded_spec(data).model.judge == "controls"
    del data["model"]["judge"]  # as a ledger recorded it before the key
    assert recorded_spec(data).model.judge == "kept"


def test_a_run_recorded_before_unscreened_ran_every_proposal_before_the_model_could_screen_and_resumes_so():
    from ratchet.loop import recorded_spec
    from ratchet.spec import spec_from_dict

    data = spec_from_dict({"task": {"env_id": "Pendulum-v1"}, "budget": {"episodes": 128},
                           "model": {"screen": True, "unscreened": "kept"}}, ".").to_dict()
    assert data["model"]["unscreened"] == "kept" and recorded_spec(data).model.unscreened == "kept"
    del data["model"]["unscreened"]  # as a ledger recorded it before the key
    assert recorded_spec(data).model.unscreened == "all"


def test_the_imagined_horizon_is_the_tasks_step_limit_at_most_the_cap(tmp_path):
    from ratchet.policy import Candidate
    from ratchet.refiners.screened import ScreenedRefiner
    from ratchet.worldmodel.screen import HORIZON_CAP, horizon_for

    assert horizon_for(200) == 200 and horizon_for(999) == 999 and horizon_for(10**6) == HORIZON_CAP == 1000
    assert horizon_for(None) == HORIZON_CAP
    parent = Candidate.create("def act(o, p):\n    return 0\n", {"k": -1.0})
    for step_limit, horizon, used in [(999, None, 999), (5000, None, 1000), (999, 20, 20)]:
        ctx, jobs = _screen_ctx(tmp_path, [[float(i)] * 2 for i in range(4)])
        ctx.task = types.SimpleNamespace(step_limit=step_limit)
        ScreenedRefiner(_Inner(4), _settings(horizon=horizon), ctx).propose(parent, None, np.random.default_rng(0))
        assert jobs[0].settings["horizon"] == used


@pytest.mark.parametrize(("model", "words"), [({"factor": 0}, "factor"), ({"screen": "yes"}, "screen"),
                                              ({"horizon": 10**6}, "horizon"), ({"nope": 1}, "nope"),
                                              ({"controls": 17}, "controls"), ({"judge": "best"}, "judge"),
                                              ({"horizon": 0}, "horizon")])
def test_a_bad_model_section_is_one_line(model, words):
    from ratchet.errors import SpecError
    from ratchet.spec import spec_from_dict

    with pytest.raises(SpecError) as err:
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 128}, "model": model}, ".")
    assert "\n" not in str(err.value) and "model" in str(err.value) and words in str(err.value)


def test_the_screen_is_off_by_default_and_sizes_a_small_budgets_population():
    from ratchet.spec import spec_from_dict

    plain = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 128}}, ".")
    assert not plain.model.screen and plain.refiner.popsize == 4
    on = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 128},
                         "model": {"screen": True, "factor": 3}}, ".")
    assert on.refiner.popsize == 12


def test_the_screen_passes_the_loops_word_on_refusals_drops_and_budgets_to_its_refiner():
    """What the loop tells a refiner (duplicates refused, cascade drops, its own budget spent) reaches the refiner the
    screen wraps: a CMA-ES behind the screen ranks cascade-dropped samples last as it does alone."""
    from ratchet.refiners.screened import ScreenedRefiner

    heard: list[tuple[str, dict]] = []

    class Told(_Inner):
        def refused(self, reasons):
            heard.append(("refused", dict(reasons)))

        def dropped(self, reasons):
            heard.append(("dropped", dict(reasons)))

        def budget_spent(self):
            return True

    ctx = types.SimpleNamespace(seed=0, train=None, artifact=None, transitions=list)
    ref = ScreenedRefiner(Told(2), _settings(), ctx)
    ref.refused({"a": "duplicate: x"})
    ref.dropped({"b": "cascade: y"})
    assert heard == [("refused", {"a": "duplicate: x"}), ("dropped", {"b": "cascade: y"})]
    assert ref.budget_spent()
