"""The ``ppo`` and ``residual`` refiners and the ``sb3`` and ``residual`` policy kinds (issue 10).

Tiny sizes throughout (CartPole, a 16-unit MLP, one training job of a thousand env steps per run), so
the file stays well under a minute on 2 cores. Tests that train need the ``rl`` extra.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, comparable, count_events, events_of, read_events

from ratchet.errors import PolicyError
from ratchet.execution import BUDGET_SKIP
from ratchet.ledger import EventType
from ratchet.ledger.projection import project

ROOT = Path(__file__).resolve().parents[1]
needs_rl = pytest.mark.skipif(find_spec("torch") is None or find_spec("stable_baselines3") is None,
                              reason="needs the rl extra: pip install 'policy-ratchet[rl]'")

#: One training job of 1,024 env steps (two checkpoints of 512), then the budget has no room for another.
PPO_TABLE = {"kind": "ppo", "env_steps": 1024, "checkpoints": 2, "n_steps": 256, "batch_size": 64, "n_epochs": 4,
             "seeds": 4}


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


def write_spec(directory: Path, policy: dict, refiner: dict, budget: int, env_id: str = "CartPole-v1",
               env_kwargs: dict | None = None) -> Path:
    """A small run spec with one ``[[refiners]]`` table."""
    directory.mkdir(parents=True, exist_ok=True)
    sections = {"task": {"env_id": env_id, "max_episode_steps": 100, **({"env_kwargs": env_kwargs} if env_kwargs else {})},
                "policy": policy, "budget": {"env_steps": budget}, "gate": {"validation_episodes": 6},
                "refiner": {"train_episodes": 2}, "test": {"episodes": 4},
                "execution": {"workers": 2, "episode_timeout_s": 60, "training_timeout_s": 300}}
    lines = ['name = "ppo-test"', "seed = 0"]
    for name, table in sections.items():
        lines += [f"\n[{name}]"] + [f"{k} = {_toml(v)}" for k, v in table.items()]
    lines += ["\n[[refiners]]"] + [f"{k} = {_toml(v)}" for k, v in refiner.items()]
    (directory / "ratchet.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


# -- residual policies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("example", ["cartpole", "windy"])
def test_a_residual_policy_with_a_zero_correction_equals_its_base_bit_for_bit(example):
    from ratchet.policies import build, mlp
    from ratchet.policy import bind_spaces, compile_policy, load_policy
    from ratchet.rollout import run_episode
    from ratchet.task import GymTask

    if example == "cartpole":
        prog, task = load_policy(DATA / "cartpole_linear.py"), GymTask("CartPole-v1")
        params = {"w_position": 0.1, "w_velocity": 0.5, "w_angle": 1.0, "w_angular_velocity": 0.5}
    else:
        prog = load_policy(ROOT / "examples" / "lunar_lander_windy" / "policy.py")
        task = GymTask("LunarLander-v3", {"continuous": True, "enable_wind": True, "wind_power": 20.0,
                                          "turbulence_power": 2.0})
        params = dict(prog.defaults)
    env = task.make_env()
    net = mlp.init_weights(env.observation_space, env.action_space, hidden=[8], zero_output=True, seed=3)
    residual = build("residual", prog.source, {"correction": net.to_bytes()})
    base = compile_policy(prog.source)
    for module in (residual, base):
        bind_spaces(module, env.observation_space, env.action_space)
    actions = {"base": [], "residual": []}

    def recording(name, fn):
        def act(obs, p):
            a = fn(obs, p)
            actions[name].append(np.array(a, copy=True))
            return a
        return act

    for seed in (0, 1):
        eb = run_episode(env, recording("base", base.act), None, params, seed, task)
        er = run_episode(env, recording("residual", residual.act), residual.reset, params, seed, task)
        assert eb.error is None and er.error is None
        assert (er.episode_return, er.length, er.terminated, er.truncated) == \
               (eb.episode_return, eb.length, eb.terminated, eb.truncated)
    assert len(actions["base"]) == len(actions["residual"])
    for a, b in zip(actions["base"], actions["residual"]):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


# -- sb3 zips, read without unpickling -----------------------------------------------------------------


def _fake_zip(data: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data", json.dumps(data))
        z.writestr("policy.pth", b"")
    return buf.getvalue()


@pytest.mark.parametrize("module, extra, algo", [
    ("stable_baselines3.common.policies", {"clip_range": {}, "gae_lambda": 0.95}, "PPO"),
    ("stable_baselines3.common.policies", {"gae_lambda": 1.0}, "A2C"),
    ("stable_baselines3.sac.policies", {}, "SAC"),
    ("stable_baselines3.td3.policies", {}, "TD3"),
])
def test_the_algorithm_is_read_from_the_zips_json(module, extra, algo):
    from ratchet.policies.sb3 import algorithm_of

    assert algorithm_of(_fake_zip({"policy_class": {"__module__": module}, **extra})) == algo


def test_unsupported_or_broken_zips_are_refused_with_a_reason():
    from ratchet.policies.sb3 import algorithm_of

    with pytest.raises(PolicyError, match="unsupported algorithm"):
        algorithm_of(_fake_zip({"policy_class": {"__module__": "stable_baselines3.dqn.policies"}}))
    with pytest.raises(PolicyError, match="not a Stable-Baselines3"):
        algorithm_of(b"not a zip")


def test_ppo_settings_round_to_whole_rollouts_and_check_the_batch():
    from ratchet.refiners.ppo import PPOSettings

    s = PPOSettings(env_steps=1000, checkpoints=2, n_steps=256)
    assert (s.checkpoint_env_steps, s.job_env_steps) == (512, 1024)
    with pytest.raises(ValueError, match="batch_size"):
        PPOSettings(n_steps=64, batch_size=128)
    with pytest.raises(ValueError):
        PPOSettings(learnin_rate=0.1)


def test_a_ppo_refiner_continues_its_training_line_and_follows_outside_promotions():
    import hashlib
    from types import SimpleNamespace

    from ratchet.execution.training import TrainingOutput, TrainingResult
    from ratchet.policy import Candidate
    from ratchet.refiners.ppo import PPORefiner, PPOSettings

    jobs = []

    def train(job):
        jobs.append(job)
        digest = lambda i: hashlib.sha256(f"{len(jobs)}-{i}".encode()).hexdigest()
        return TrainingResult(tuple(TrainingOutput({}, {"artifacts": {"weights": digest(i)}}) for i in range(2)),
                              job.env_steps)

    seeds = iter(range(10**6))
    ctx = SimpleNamespace(seed=7, train=train, training_seeds=lambda n: [next(seeds) for _ in range(n)])
    ref = PPORefiner(PPOSettings(seeds=2), "ppo", ctx, "ppo")
    assert (ref.population_size, ref.training_env_steps) == (2, 20480)
    start = Candidate.create("", {}, kind="mlp", artifacts={"weights": "0" * 64})
    first = ref.propose(start, None, np.random.default_rng(0))
    assert [c.parent_id for c in first] == [start.id] * 2 and jobs[0].parent == start
    second = ref.propose(start, None, np.random.default_rng(0))  # nothing promoted: continue from its last checkpoint
    assert jobs[1].parent == first[-1] and all(c.parent_id == first[-1].id for c in second)
    ref.propose(second[0], None, np.random.default_rng(0))  # its own checkpoint promoted: still its line
    assert jobs[2].parent == second[-1]
    other = Candidate.create("", {}, kind="mlp", artifacts={"weights": "f" * 64}, refiner="other")
    ref.propose(other, None, np.random.default_rng(0))  # another refiner's promotion: follow the incumbent
    assert jobs[3].parent == other
    assert len({j.settings["seed"] for j in jobs}) == 4 and len({j.key for j in jobs}) == 4


def test_the_last_job_is_cut_to_what_the_budget_has_left():
    """fit_training cuts the next job to whole rollouts within the room (at most ``checkpoints`` parts), for
    one proposal only; no cut when not even one rollout fits or the whole job would."""
    from types import SimpleNamespace

    from ratchet.execution.training import TrainingResult
    from ratchet.policy import Candidate
    from ratchet.refiners.ppo import PPORefiner, PPOSettings

    jobs = []
    ctx = SimpleNamespace(seed=0, training_seeds=lambda n: list(range(n)),
                          train=lambda job: jobs.append(job) or TrainingResult((), job.env_steps))
    ref = PPORefiner(PPOSettings(env_steps=8192, checkpoints=4, n_steps=1024), "ppo", ctx, "ppo")
    assert not ref.fit_training(1000) and not ref.fit_training(8192)
    assert ref.fit_training(5000) and (ref.population_size, ref.training_env_steps) == (4, 4096)
    ref.propose(Candidate.create("", {}, kind="mlp", artifacts={"weights": "0" * 64}), None, np.random.default_rng(0))
    assert jobs[-1].env_steps == 4096 and jobs[-1].settings["checkpoints"] == 4
    assert jobs[-1].settings["env_steps"] == 4096
    assert (ref.population_size, ref.training_env_steps) == (4, 8192)  # the cut was for that job only
    assert ref.fit_training(2500) and (ref.population_size, ref.training_env_steps) == (2, 2048)


# -- end to end ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    d = tmp_path_factory.mktemp("mlp")
    spec_dir = write_spec(d / "spec", {"kind": "mlp", "hidden": [16]}, PPO_TABLE, budget=3000)
    result = start_run(load_spec(spec_dir), d / "runs", "m")
    return spec_dir, d / "runs" / "m", result


@needs_rl
def test_ppo_refines_a_tiny_mlp_on_cartpole(mlp_run):
    _, run_dir, result = mlp_run
    events = read_events(run_dir)
    (trained,) = events_of(events, EventType.TRAINING_FINISHED)
    p = trained.payload
    assert p["error"] is None and p["trainer"] == "ppo" and p["env_steps"] == 1024
    assert len(p["outputs"]) == 2 and all(set(o["artifacts"]) == {"weights", "critic"} for o in p["outputs"])
    assert [o["info"]["env_steps"] for o in p["outputs"]] == [512, 1024]
    proposed = [e.payload["candidate"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)]
    start, children = proposed[0], proposed[1:]
    assert start["kind"] == "mlp" and len(children) == 2
    for c in children:
        assert c["kind"] == "mlp" and c["refiner"] == "ppo" and c["parent_id"] == start["id"]
        assert c["artifacts"]["weights"] != start["artifacts"]["weights"]
    # the checkpoints were evaluated by workers without errors, and training counted in the budget
    evaluated = events_of(events, EventType.EPISODES_EVALUATED)
    assert all(ep["error"] is None for e in evaluated for ep in e.payload["episodes"])
    st = project(events)
    assert st.status == "finished" and st.training_env_steps == 1024
    assert st.env_steps == 1024 + sum(e.payload["summary"]["env_steps"] for e in evaluated if e.payload["split"] != "test")
    assert st.env_steps == events_of(events, EventType.RUN_FINISHED)[0].payload["env_steps"]
    assert result.test.n == 4


@needs_rl
def test_a_run_spends_the_rest_of_its_budget_on_a_shorter_last_training_job(tmp_path):
    """When the next full job (1,024 env steps) no longer fits the env-step budget but one rollout per
    checkpoint does, the last job is cut to whole rollouts instead of the run stopping with the rest unspent."""
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec_dir = write_spec(tmp_path / "spec", {"kind": "mlp", "hidden": [16]}, PPO_TABLE, budget=4000)
    start_run(load_spec(spec_dir), tmp_path / "runs", "m")
    events = read_events(tmp_path / "runs" / "m")
    jobs = [e.payload for e in events_of(events, EventType.TRAINING_FINISHED)]
    assert [(j["env_steps"], j["settings"]["checkpoints"], len(j["outputs"])) for j in jobs] == [(1024, 2, 2), (512, 2, 2)]
    st = project(events)
    assert st.training_env_steps == 1536 and st.env_steps <= 4000


@needs_rl
def test_kill_9_during_training_then_resume_gives_the_same_ledger(mlp_run, tmp_path):
    """A run killed while its training job runs, then resumed, records what an uninterrupted run records
    (the job is re-run from scratch and gives the same checkpoints: a run seed reproduces candidates)."""
    spec_dir, whole_dir, _ = mlp_run
    runs = tmp_path / "runs"
    db = runs / "k" / "ledger.sqlite"
    cmd = [sys.executable, "-m", "ratchet.cli"]
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd + ["run", str(spec_dir), "--runs-dir", str(runs), "--run-id", "k", "--no-report"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # a loaded machine may take a minute to start the CLI alone
        while count_events(db, "episodes_evaluated") < 1:  # the start's validation: training comes next
            assert proc.poll() is None, (tmp_path / "run.log").read_text()
            assert time.monotonic() < deadline, "no evaluation recorded within 180 s"
            time.sleep(0.05)
        time.sleep(1.0)  # well inside the training job (imports alone take longer)
        assert count_events(db, "training_finished") == 0, "training finished before the kill; make it longer"
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its sandboxed trainer and workers
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert project(read_events(runs / "k")).status == "interrupted"
    done = subprocess.run(cmd + ["resume", "k", "--runs-dir", str(runs), "--no-report"], capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    a, b = comparable(read_events(whole_dir)), comparable(read_events(runs / "k"))
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], key


def _make_sb3_zip(path: Path) -> None:
    """A few hundred env steps of SB3 PPO on CartPole, in a separate process (this one never imports SB3)."""
    code = ("import torch, gymnasium as gym\nfrom stable_baselines3 import PPO\ntorch.set_num_threads(1)\n"
            "m = PPO('MlpPolicy', gym.make('CartPole-v1'), n_steps=256, batch_size=64, n_epochs=2, seed=0,"
            " device='cpu', policy_kwargs={'net_arch': [16]})\n"
            f"m.learn(256)\nm.save({str(path)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@needs_rl
def test_an_sb3_zip_is_refined_and_only_workers_unpickle_it(tmp_path, monkeypatch):
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec_dir = write_spec(tmp_path / "spec", {"kind": "sb3", "path": "model.zip"}, PPO_TABLE, budget=3000)
    _make_sb3_zip(spec_dir / "model.zip")
    # the driver cannot import torch or SB3 (so it cannot unpickle the model): everything runs in workers
    blocked = ("torch", "stable_baselines3")
    for mod in [m for m in sys.modules if m.split(".")[0] in blocked]:
        monkeypatch.delitem(sys.modules, mod)
    attempts = []

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                attempts.append(name)
                raise ImportError(f"the driver must not import {name}")

    monkeypatch.setattr(sys, "meta_path", [Blocker(), *sys.meta_path])
    result = start_run(load_spec(spec_dir), tmp_path / "runs", "s")
    assert attempts == [] and not [m for m in sys.modules if m.split(".")[0] in blocked]
    events = read_events(tmp_path / "runs" / "s")
    trained, *cut = events_of(events, EventType.TRAINING_FINISHED)  # then maybe a last job cut to the budget
    assert trained.payload["error"] is None and len(trained.payload["outputs"]) == 2
    assert [o["info"]["env_steps"] for o in trained.payload["outputs"]] == [512, 1024]  # not the zip's own 256
    assert all(e.payload["error"] is None and e.payload["env_steps"] < 1024 for e in cut)
    proposed = [e.payload["candidate"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)]
    n = 1 + sum(len(e.payload["outputs"]) for e in [trained, *cut])
    assert [c["kind"] for c in proposed] == ["sb3"] * n
    assert len({c["artifacts"]["model"] for c in proposed}) == n
    evaluated = events_of(events, EventType.EPISODES_EVALUATED)
    # workers loaded every zip (a final validation the env-step cap cut short skips its last episodes: no decision)
    assert all(ep["error"] in (None, BUDGET_SKIP) for e in evaluated for ep in e.payload["episodes"])
    assert result.test is not None
    # a checkpoint is a zip SB3 writes and reads (checked as an archive here, without unpickling)
    from ratchet.ledger import SQLiteLedger
    from ratchet.loop import LEDGER_FILE

    ledger = SQLiteLedger(tmp_path / "runs" / "s" / LEDGER_FILE, create=False)
    try:
        names = zipfile.ZipFile(io.BytesIO(ledger.get_artifact(proposed[1]["artifacts"]["model"]))).namelist()
    finally:
        ledger.close()
    assert {"data", "policy.pth"} <= set(names)


@needs_rl
def test_the_residual_refiner_trains_the_correction_and_keeps_the_base(tmp_path):
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec_dir = write_spec(tmp_path / "spec", {"kind": "residual", "path": "policy.py", "hidden": [8]},
                          {**PPO_TABLE, "kind": "residual"}, budget=3000)
    (spec_dir / "policy.py").write_text((DATA / "cartpole_linear.py").read_text())
    start_run(load_spec(spec_dir), tmp_path / "runs", "r")
    events = read_events(tmp_path / "runs" / "r")
    trained = events_of(events, EventType.TRAINING_FINISHED)
    assert trained and all(t.payload["error"] is None and t.payload["trainer"] == "residual" for t in trained)
    proposed = [e.payload["candidate"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)]
    start, children = proposed[0], proposed[1:]
    assert len(children) == 2 * len(trained)
    for c in children:
        assert c["kind"] == "residual" and c["refiner"] == "residual"
        assert c["params"] == start["params"] and c["source"] in (None, start["source"])
        assert c["artifacts"]["correction"] != start["artifacts"]["correction"]
    evaluated = events_of(events, EventType.EPISODES_EVALUATED)
    assert all(ep["error"] is None for e in evaluated for ep in e.payload["episodes"])


_OTHER_ALGORITHMS = """
import sys, torch, gymnasium as gym
from stable_baselines3 import A2C, SAC, TD3
torch.set_num_threads(1)
out = sys.argv[1]
A2C('MlpPolicy', gym.make('CartPole-v1'), n_steps=8, seed=0, device='cpu',
    policy_kwargs={'net_arch': [16]}).learn(64).save(out + '/a2c.zip')
for name, cls in (('sac', SAC), ('td3', TD3)):
    cls('MlpPolicy', gym.make('Pendulum-v1'), learning_starts=32, batch_size=32, buffer_size=1000, seed=0,
        device='cpu', policy_kwargs={'net_arch': [16]}).learn(64).save(out + '/' + name + '.zip')
"""


@needs_rl
def test_a2c_sac_and_td3_zips_are_evaluated_and_fine_tuned_with_their_own_algorithm(tmp_path):
    """Issue 10: SB3 zips of PPO, A2C, SAC and TD3 are starting points; the ``ppo`` trainer fine-tunes an A2C,
    SAC or TD3 zip with its own algorithm (in the sandbox) and saves a zip of the same algorithm, which a
    worker loads and acts with."""
    from ratchet.execution import Job
    from ratchet.execution.process import ProcessExecutor
    from ratchet.execution.training import TrainingJob
    from ratchet.ledger.artifacts import digest
    from ratchet.policies.sb3 import algorithm_of
    from ratchet.policy import Candidate
    from ratchet.refiners.ppo import PPOSettings
    from ratchet.task import GymTask

    subprocess.run([sys.executable, "-c", _OTHER_ALGORITHMS, str(tmp_path)], check=True, timeout=300)
    settings = {**PPOSettings(env_steps=64, checkpoints=1, n_steps=32, batch_size=32, seeds=2).model_dump(mode="json"),
                "seed": 3}
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        for name, env_id in (("a2c", "CartPole-v1"), ("sac", "Pendulum-v1"), ("td3", "Pendulum-v1")):
            data = (tmp_path / f"{name}.zip").read_bytes()
            assert algorithm_of(data) == name.upper()
            task = GymTask(env_id, max_episode_steps=50)
            start = Candidate.create("", {}, kind="sb3", artifacts={"model": digest(data)})
            job = TrainingJob("ppo", start, settings, (11, 12), 64, artifacts={digest(data): data})
            result = ex.train(task, job, 300)
            assert result.error is None, (name, result.error)
            (out,) = result.outputs
            model = out.artifacts["model"]
            assert algorithm_of(model) == name.upper() and model != data  # trained further, same algorithm
            assert 0 < result.env_steps <= 64
            tuned = Candidate.create("", {}, kind="sb3", artifacts={"model": digest(model)})
            episodes = ex.run(task, [Job(c, s, artifacts={digest(b): b}) for c, b in ((start, data), (tuned, model))
                                     for s in (0, 1)])
            assert all(e.error is None and e.length > 0 for e in episodes), (name, [e.error for e in episodes])


_VECNORMALIZE = """
import json, sys, numpy as np, torch, gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
torch.set_num_threads(1)
out, seeds = sys.argv[1], json.loads(sys.argv[2])
make = lambda: gym.make('CartPole-v1', max_episode_steps=100)
vn = VecNormalize(DummyVecEnv([make]), norm_reward=True)
model = PPO('MlpPolicy', vn, n_steps=128, batch_size=64, n_epochs=2, seed=0, device='cpu',
            policy_kwargs={'net_arch': [16]})
model.learn(512)
model.save(out + '/model.zip')
vn.save(out + '/vecnormalize.pkl')
vn.training = False
returns = {}
for name, norm in (('normalized', vn.normalize_obs), ('raw', lambda o: o)):
    rs = []
    for s in seeds:  # SB3's own loop, the model acting on VecNormalize's observations
        env = make(); obs, _ = env.reset(seed=s); total, done = 0.0, False
        while not done:
            a, _ = model.predict(norm(obs), deterministic=True)
            obs, r, term, trunc, _ = env.step(int(a)); total += r; done = term or trunc
        rs.append(total)
    returns[name] = rs
print(json.dumps(returns))
"""


@needs_rl
def test_an_sb3_model_with_vecnormalize_statistics_acts_on_normalised_observations(tmp_path):
    """A model trained in SB3's VecNormalize carries its statistics file (``[policy] normalization``): workers
    act on observations normalised as SB3 does, training continues in them, and export writes them back."""
    from ratchet.execution import Job
    from ratchet.execution.process import ProcessExecutor
    from ratchet.execution.training import TrainingJob
    from ratchet.policies.export import export_candidate
    from ratchet.policies.start import start_candidate
    from ratchet.refiners.ppo import PPOSettings
    from ratchet.spec import load_spec
    from ratchet.task import GymTask

    spec_dir = write_spec(tmp_path / "spec", {"kind": "sb3", "path": "model.zip",
                                              "normalization": "vecnormalize.pkl"}, PPO_TABLE, budget=3000)
    seeds = [0, 1, 2, 3]
    ref = json.loads(subprocess.run([sys.executable, "-c", _VECNORMALIZE, str(spec_dir), json.dumps(seeds)],
                                    check=True, timeout=300, capture_output=True, text=True).stdout)
    assert ref["normalized"] != ref["raw"], "the statistics should matter, or the test proves nothing"
    spec = load_spec(spec_dir)
    _, start, blobs = start_candidate(spec.policy, spec_dir, None, 0, None)
    assert set(start.artifacts) == {"model", "vecnormalize"}
    task = GymTask("CartPole-v1", max_episode_steps=100)
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        episodes = ex.run(task, [Job(start, s, artifacts=blobs) for s in seeds])
        assert [e.episode_return for e in episodes] == ref["normalized"]
        settings = {**PPOSettings(env_steps=256, checkpoints=1, n_steps=128, batch_size=64,
                                  seeds=2).model_dump(mode="json"), "seed": 1}
        result = ex.train(task, TrainingJob("ppo", start, settings, (5, 6), 256, artifacts=blobs), 300)
        assert result.error is None, result.error
        assert set(result.outputs[0].artifacts) == {"model"}  # the statistics stay frozen: the same artifact
    paths = export_candidate(start, blobs, tmp_path / "out.zip")
    assert [p.name for p in paths] == ["out.zip", "out_vecnormalize.pkl"]
    assert paths[1].read_bytes() == (spec_dir / "vecnormalize.pkl").read_bytes()
    from ratchet.errors import SpecError

    with pytest.raises(SpecError, match="normalization"):
        load_spec(write_spec(tmp_path / "bad", {"kind": "mlp", "normalization": "v.pkl"}, PPO_TABLE, budget=3000))
