"""Learning from corrections: dagger / hg-dagger / bc refiners, data sets, Minari, takeovers in the ledger."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from conftest import SimulatedKill, read_events

from ratchet.data import DataError, Dataset, from_minari, run_dataset, to_minari
from ratchet.errors import RatchetError, SpecError
from ratchet.execution.process import ProcessExecutor
from ratchet.ledger.artifacts import digest
from ratchet.policies.mlp import init_weights, load_weights
from ratchet.refiners.dagger import behaviour_cloning, train
from ratchet.spec import load_spec, spec_from_dict
from ratchet.task import GymTask

EXPERT = '''"""CartPole expert with a takeover rule (tests)."""
PARAMETERS = {"w_angle": {"default": 1.0, "low": 0.0, "high": 5.0}}


def act(observation, params):
    o = observation
    return int(params["w_angle"] * o[2] + 0.5 * o[3] + 0.05 * o[0] + 0.2 * o[1] > 0)


def takeover(observation, params):
    return abs(observation[2]) > 0.05 or abs(observation[0]) > 1.0
'''
TASK = GymTask("CartPole-v1", max_episode_steps=100)


def _parent(weights: bytes, dataset: bytes | None = None, expert: str = EXPERT) -> dict:
    arts = {"weights": weights, "expert": expert.encode()}
    if dataset is not None:
        arts["dataset"] = dataset
    return {"kind": "mlp", "source": "", "params": {}, "artifacts": arts}


def _student(seed: int = 0) -> bytes:
    env = TASK.make_env()
    try:
        return init_weights(env.observation_space, env.action_space, hidden=(8,), seed=seed).to_bytes()
    finally:
        env.close()


@pytest.fixture(scope="module")
def round0() -> dict:
    """Round 0: behaviour cloning on one expert episode (little training, so the student still errs)."""
    settings = {"mode": "bc", "round": 0, "updates": 30, "expert_params": {"w_angle": 1.0}}
    outs, used = train(TASK, _parent(_student()), settings, [11], 100)
    assert used == 100 and len(outs) == 1
    return dict(outs[0].artifacts)


@pytest.mark.parametrize("mode", ["dagger", "hg-dagger", "bc"])
def test_each_mode_collects_aggregates_and_retrains(round0, mode):
    settings = {"mode": mode, "round": 1, "updates": 30, "handback_steps": 3, "expert_params": {"w_angle": 1.0}}
    outs, used = train(TASK, _parent(round0["weights"], round0["dataset"]), settings, [21, 22], 200)
    info, arts = outs[0].info, outs[0].artifacts
    old, new = Dataset.from_bytes(round0["dataset"]), Dataset.from_bytes(arts["dataset"])
    assert len(new) == len(old) + info["labelled_steps"] and used == info["env_steps"] <= 200
    assert info["round"] == 1 and new.round.max() == (1 if info["labelled_steps"] else 0)
    assert load_weights(arts["weights"]).to_bytes() != round0["weights"]
    for ep in info["episodes"]:  # segments cover the episode; labelled ranges are what was added
        segs = ep["segments"]
        assert segs[0][0] == 0 and segs[-1][1] == ep["length"]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(segs))
        assert ep["expert_steps"] == sum(e - s for s, e, who in segs if who == "expert")
    labelled = sum(e - s for ep in info["episodes"] for s, e in ep["labelled"])
    assert labelled == info["labelled_steps"]
    added = new.take(new.round == 1)
    if mode == "dagger":  # the student flies, the expert labels everything
        assert info["expert_steps"] == 0 and labelled == info["env_steps"] and not added.expert.any()
    elif mode == "bc":
        assert info["expert_steps"] == info["env_steps"] == labelled and added.expert.all()
    else:  # only takeover steps are labelled, and they are exactly the expert's segments
        assert labelled == info["expert_steps"] > 0 and added.expert.all()
        assert any(who == "student" for ep in info["episodes"] for _, _, who in ep["segments"])
        assert (added.label == added.executed).all()


def test_label_budget_stops_collection(round0):
    settings = {"mode": "dagger", "round": 1, "updates": 5, "label_budget": 37, "expert_params": {"w_angle": 1.0}}
    outs, used = train(TASK, _parent(round0["weights"], round0["dataset"]), settings, [21, 22], 200)
    assert outs[0].info["labelled_steps"] == 37 == used


def test_behaviour_cloning_is_deterministic_and_learns(round0):
    data = Dataset.from_bytes(round0["dataset"])
    mlp = load_weights(_student())
    a, info = behaviour_cloning(mlp, data, updates=200, seed=3, normalize=True)
    b, _ = behaviour_cloning(mlp, data, updates=200, seed=3, normalize=True)
    assert a.to_bytes() == b.to_bytes()
    assert info["loss_last"] < info["loss_first"] and info["accuracy"] > 0.8


def test_dataset_bytes_concat_and_segments():
    steps = [{"obs": np.full(4, i, np.float32), "next_obs": np.full(4, i + 1, np.float32), "label": i % 2,
              "executed": 0, "reward": 1.0, "terminated": False, "truncated": False, "expert": True, "round": 0,
              "episode": ep, "seed": ep, "step": i}
             for ep in (0, 1) for i in range(3) if (ep, i) != (1, 1)]
    ds = Dataset.from_steps(steps, "discrete", 4, env_id="CartPole-v1")
    assert list(ds.segments()) == [(0, 3), (3, 4), (4, 5)]
    assert Dataset.from_bytes(ds.to_bytes()).to_bytes() == ds.to_bytes()
    both = ds.concat(ds)
    assert len(both) == 10 and sorted(set(both.episode.tolist())) == [0, 1, 2, 3]
    assert all(getattr(both, f).dtype == getattr(ds, f).dtype for f in ("expert", "terminated", "label", "obs"))
    with pytest.raises(DataError):
        Dataset.from_bytes(b"not an npz")


def test_minari_round_trip(tmp_path, round0):
    pytest.importorskip("minari")
    pytest.importorskip("h5py")
    import minari

    settings = {"mode": "hg-dagger", "round": 1, "updates": 5, "handback_steps": 3, "expert_params": {"w_angle": 1.0}}
    outs, _ = train(TASK, _parent(round0["weights"], round0["dataset"]), settings, [21, 22], 200)
    ds = Dataset.from_bytes(outs[0].artifacts["dataset"])
    path = to_minari(ds, tmp_path / "m", env_id="CartPole-v1")
    m = minari.MinariDataset(path / "data")  # Minari itself reads it
    assert m.total_steps == len(ds) and m.total_episodes == sum(1 for _ in ds.segments())
    assert m.env_spec.id == "CartPole-v1"
    back = from_minari(path)
    assert back.to_bytes() == ds.to_bytes()
    # a data set written by someone else: every step a demonstration
    plain = from_minari(m, expert=True)
    assert len(plain) == len(ds) and plain.expert.all() and (plain.label == ds.label).all()
    with pytest.raises(DataError, match="exists"):
        to_minari(ds, path, env_id="CartPole-v1")


class _Context:
    """A RefinerContext that runs training jobs in-process (no sandbox, no ledger)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.store, self.task, self.seed, self.name, self.n = files, {}, TASK, 0, "hg", 0
        for data in files.values():
            self.store[digest(data)] = data
        self.jobs = []

    def read_input(self, path: str) -> bytes:
        return self.files[path]

    def training_seeds(self, n: int) -> list[int]:
        self.n += n
        return list(range(self.n - n, self.n))

    def train(self, job):
        from ratchet.execution.training import TrainingOutput, TrainingResult

        self.jobs.append(job)
        arts = {role: self.store[h] for role, h in job.parent.artifacts.items()}
        outs, _used = train(TASK, {"kind": "mlp", "artifacts": arts}, job.settings, list(job.seeds), job.env_steps)
        res = []
        for o in outs:
            for data in o.artifacts.values():
                self.store[digest(data)] = data
            digests = {r: digest(b) for r, b in o.artifacts.items()}
            res.append(TrainingOutput(o.artifacts, {**o.info, "artifacts": digests}))
        return TrainingResult(tuple(res), job.env_steps)


def test_refiner_starts_from_demonstrations_and_keeps_aggregating(round0):
    from ratchet.policy import Candidate
    from ratchet.refiners.dagger import KINDS, CorrectionSettings

    demos = Dataset.from_bytes(round0["dataset"])
    ctx = _Context({"expert.py": EXPERT.encode(), "demos.npz": demos.to_bytes()})
    settings = CorrectionSettings(expert="expert.py", demonstrations="demos.npz", episodes=2, updates=3, rounds=2)
    [refiner] = KINDS["hg-dagger"].build(settings, "hg", ctx)
    assert KINDS["hg-dagger"].files(settings) == ["expert.py", "demos.npz"]
    start = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(_student(1))})
    ctx.store[start.artifacts["weights"]] = _student(1)
    assert refiner.training_env_steps == 0
    [student0] = refiner.propose(start, None, None)
    assert ctx.jobs[0].seeds == () and ctx.jobs[0].settings["mode"] == "bc"  # no expert episodes: the demos
    assert refiner.rounds[0]["dataset"]["steps"] == len(demos)
    # the gate rejected student0: the next round flies the incumbent (start) but aggregates onto the new data
    [student1] = refiner.propose(start, None, None)
    assert ctx.jobs[1].parent.artifacts["dataset"] == student0.artifacts["dataset"]
    assert ctx.jobs[1].settings["mode"] == "hg-dagger" and student1.parent_id == start.id
    assert refiner.idle_reason() is None
    refiner.propose(student1, None, None)
    assert [r["round"] for r in refiner.rounds] == [0, 1, 2] and "rounds done" in refiner.idle_reason()


def _spec_dir(tmp_path: Path, kind: str = "hg-dagger", **extra) -> Path:
    d = tmp_path / "spec"
    d.mkdir()
    (d / "expert.py").write_text(EXPERT)
    table = {"kind": kind, "expert": "expert.py", "initial_episodes": 1, "episodes": 2, "rounds": 1, "updates": 3,
             "handback_steps": 3, **extra}
    lines = ["name = \"dg\"", "seed = 1", "[task]", "env_id = \"CartPole-v1\"", "max_episode_steps = 100",
             "[policy]", "kind = \"mlp\"", "hidden = [8]", "[[refiners]]"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in table.items()]
    lines += ["[refiner]", "train_episodes = 2", "[gate]", "validation_episodes = 4", "spending = \"none\"",
              "max_share = 0.9", "[budget]", "env_steps = 5000", "[test]", "episodes = 3",
              "[execution]", "workers = 1"]
    (d / "ratchet.toml").write_text("\n".join(lines) + "\n")
    return d


def test_spec_checks_the_expert_file_and_policy_kind(tmp_path):
    d = _spec_dir(tmp_path)
    assert load_spec(d).refiner_entries()[0]["kind"] == "hg-dagger"
    (d / "expert.py").unlink()
    with pytest.raises(SpecError, match="file not found"):
        load_spec(d)
    with pytest.raises(SpecError, match="cannot refine a 'program' policy"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "refiners": [{"kind": "dagger", "expert": "e.py"}]})
    with pytest.raises(SpecError, match="expert"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "policy": {"kind": "mlp"}, "refiners": [{"kind": "dagger"}]})


class _Executor(ProcessExecutor):
    """A process pool that counts training jobs and can 'die' (as under kill -9) in the middle of one."""

    def __init__(self, die_in_job: int | None = None) -> None:
        super().__init__(workers=1)
        self.jobs = 0
        self.die_in_job = die_in_job

    def train(self, task, job, timeout_s=3600.0):
        self.jobs += 1
        if self.jobs == self.die_in_job:
            raise SimulatedKill("killed during a training job")
        return super().train(task, job, timeout_s)


def test_hg_dagger_run_records_takeovers_and_resumes_mid_round(tmp_path):
    from ratchet.loop import resume_run, start_run

    spec = load_spec(_spec_dir(tmp_path))
    killed = _Executor(die_in_job=2)  # round 0 finishes, round 1 (the first takeovers) is under way
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "dg", executor=killed)
    killed.close()
    events = read_events(tmp_path / "runs" / "dg")
    assert [e.payload["settings"]["round"] for e in events if e.type.value == "training_finished"] == [0]
    started = next(e for e in events if e.type.value == "run_started")
    assert set(started.payload["inputs"]) == {"expert.py"}
    (tmp_path / "spec" / "expert.py").write_text("garbage")  # a resumed run reads the recorded copy

    again = _Executor()
    try:
        res = resume_run(tmp_path / "runs" / "dg", executor=again)
    finally:
        again.close()
    assert again.jobs == 1  # round 0 read back from the ledger, round 1 run once
    events = read_events(tmp_path / "runs" / "dg")
    rounds = [e.payload for e in events if e.type.value == "training_finished"]
    assert [r["settings"]["round"] for r in rounds] == [0, 1] and all(r["error"] is None for r in rounds)
    info = rounds[1]["outputs"][0]["info"]
    assert info["mode"] == "hg-dagger" and info["expert_steps"] == info["labelled_steps"] > 0
    takeovers = [s for ep in info["episodes"] for s in ep["segments"] if s[2] == "expert"]
    assert takeovers and all(e > s for s, e, _ in takeovers)
    # every student is a candidate that went through the gate
    proposed = [e.payload["candidate"] for e in events if e.type.value == "candidate_proposed"]
    assert sum(c.get("refiner") == "hg-dagger" for c in proposed) == 2
    assert sum(e.type.value == "gate_decided" for e in events) >= 1
    assert res.incumbent.kind == "mlp" and "dataset" in res.incumbent.artifacts
    assert "correction rounds done" in res.stop_reason
    data = run_dataset(tmp_path / "runs" / "dg")  # the newest aggregate, as the ledger holds it
    assert sorted(set(data.round.tolist())) == [0, 1] and int(data.expert.sum()) == len(data)
    assert run_dataset(tmp_path / "runs" / "dg", candidate=res.incumbent.id).to_bytes() == \
        Dataset.from_bytes(read_artifact(tmp_path / "runs" / "dg", res.incumbent.artifacts["dataset"])).to_bytes()


def read_artifact(run_dir: Path, digest: str) -> bytes:
    from ratchet.loop import open_ledger

    ledger = open_ledger(run_dir, readonly=True)
    try:
        return ledger.get_artifact(digest)
    finally:
        ledger.close()


def test_without_a_takeover_function_disagreement_takes_over(round0):
    expert = EXPERT.split("def takeover")[0]
    settings = {"mode": "hg-dagger", "round": 1, "updates": 5, "handback_steps": 2, "expert_params": {"w_angle": 1.0}}
    outs, _ = train(TASK, _parent(round0["weights"], round0["dataset"], expert=expert), settings, [21], 100)
    info = outs[0].info
    assert info["expert_steps"] == info["labelled_steps"] > 0


def test_box_actions_clone_by_squared_error():
    task = GymTask("Pendulum-v1", max_episode_steps=50)
    expert = ('PARAMETERS = {"k": {"default": 2.0, "low": 0.0, "high": 5.0}}\n'
              "def act(o, p):\n    return [max(-2.0, min(2.0, -p['k'] * o[2]))]\n")
    env = task.make_env()
    w = init_weights(env.observation_space, env.action_space, hidden=(8,), seed=0).to_bytes()
    env.close()
    outs, used = train(task, {"kind": "mlp", "artifacts": {"weights": w, "expert": expert.encode()}},
                       {"mode": "bc", "round": 0, "updates": 200, "expert_params": {"k": 2.0}}, [1, 2], 100)
    data = Dataset.from_bytes(outs[0].artifacts["dataset"])
    assert data.label.shape == (100, 1) and data.meta["action"] == "box" and used == 100
    assert outs[0].info["bc"]["loss_last"] < outs[0].info["bc"]["loss_first"]
    student = load_weights(outs[0].artifacts["weights"])
    assert student.act(data.obs[0]).shape == (1,)


def test_demonstrations_without_an_expert_clone_round_0_then_go_idle(round0):
    """A person's data set (ratchet correct -o person.npz) can start a bc/hg-dagger run with no expert."""
    from ratchet.policy import Candidate
    from ratchet.refiners.dagger import KINDS, CorrectionSettings

    demos = Dataset.from_bytes(round0["dataset"])
    ctx = _Context({"person.npz": demos.to_bytes()})
    for kind in ("bc", "hg-dagger"):
        settings = CorrectionSettings(demonstrations="person.npz", updates=3)
        [refiner] = KINDS[kind].build(settings, kind, ctx)
        assert KINDS[kind].files(settings) == ["person.npz"] and refiner.idle_reason() is None
        start = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(_student(1))})
        ctx.store[start.artifacts["weights"]] = _student(1)
        [student0] = refiner.propose(start, None, None)
        assert "expert" not in ctx.jobs[-1].parent.artifacts and ctx.jobs[-1].seeds == ()
        assert refiner.rounds[0]["dataset"]["steps"] == len(demos) and refiner.rounds[0]["env_steps"] == 0
        assert "no expert" in refiner.idle_reason()
        assert refiner.propose(student0, None, None) == []


def test_demonstrations_that_cannot_teach_the_task_are_refused_before_the_run_begins(round0, tmp_path):
    """Labels out of CartPole's two actions, observations of another width, an empty set: one line naming the file
    and what is wrong, and no run directory left (regression: the run started, used its budget on failing training
    jobs and exited 0; labels of -1 trained on action 1 without a word)."""
    from dataclasses import replace

    from ratchet.loop import start_run

    demos = Dataset.from_bytes(round0["dataset"])
    cases = {"neg.npz": (replace(demos, label=demos.label * 0 - 1), "label -1 is out of range for CartPole-v1's 2"),
             "wide.npz": (replace(demos, obs=np.zeros((len(demos), 8))), "observations of 8 numbers, but CartPole"),
             "empty.npz": (Dataset.empty(4, "discrete"), "no steps")}
    for i, (name, (data, fragment)) in enumerate(cases.items()):
        (tmp_path / str(i)).mkdir()
        d = _spec_dir(tmp_path / str(i), kind="bc", demonstrations=name)
        (d / name).write_bytes(data.to_bytes())
        with pytest.raises(RatchetError, match=rf"\[\[refiners\]\] bc: demonstrations {name}: {fragment}"):
            start_run(load_spec(d), tmp_path / "runs", f"r{i}")
        assert not (tmp_path / "runs" / f"r{i}").exists()


def test_spec_needs_an_expert_or_demonstrations():
    with pytest.raises(SpecError, match="expert .* or demonstrations"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "policy": {"kind": "mlp"}, "refiners": [{"kind": "bc"}]})
    with pytest.raises(SpecError, match="expert_params without an expert"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "policy": {"kind": "mlp"},
                        "refiners": [{"kind": "bc", "demonstrations": "d.npz", "expert_params": {"a": 1}}]})
    spec = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "policy": {"kind": "mlp"},
                           "refiners": [{"kind": "bc", "demonstrations": "d.npz"}]})
    assert spec.refiner_entries()[0]["demonstrations"] == "d.npz"
