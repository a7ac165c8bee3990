"""Every policy kind through every surface: run → kill -9 → resume → replay → export for a residual policy
(file ledger and ``--storage sqlite:///``), an mlp candidate evaluated and exported, an SB3 model exported
as stored, a residual policy with a zero correction equal to its base bit for bit, and the report and
``show`` summarising networks instead of listing their numbers."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA, events_of, make_spec_dir, run_then_kill_9, unique_run_id

from ratchet.errors import PolicyError
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.ledger import EventType
from ratchet.ledger.artifacts import candidate_artifacts, digest
from ratchet.ledger.projection import project
from ratchet.loop import open_run
from ratchet.policies import describe_artifact
from ratchet.policies.export import export_candidate, export_paths
from ratchet.policies.mlp import init_weights
from ratchet.policies.start import start_candidate
from ratchet.policy import Candidate, load_policy
from ratchet.spec import PolicySpec
from ratchet.task import GymTask

CLI = [sys.executable, "-m", "ratchet.cli"]
CARTPOLE = GymTask("CartPole-v1")


@pytest.fixture(scope="module")
def executor():
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    yield ex
    ex.close()


def _spaces(task: GymTask):
    env = task.make_env()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _standalone_return(module, task: GymTask, seed: int) -> tuple[float, int]:
    """One episode of an exported standalone program (its ``Policy``), seeded as ratchet seeds one."""
    env = task.make_env()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    policy = module.Policy()
    policy.reset(seed, env.observation_space, env.action_space)
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        action = policy.act(obs)
        if not isinstance(action, int):
            action = np.asarray(action, dtype=np.float64).reshape(env.action_space.shape)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, steps, done = total + float(reward), steps + 1, terminated or truncated
    env.close()
    return total, steps


# -- residual: run → kill -9 → resume → replay → export --------------------------------------------

def _count(open_ledger, type_: str) -> int:
    """Events of ``type_`` in a ledger another process is writing (0 while it is being created)."""
    try:
        ledger = open_ledger()
    except Exception:  # noqa: BLE001 - another process is still creating the ledger: count 0
        return 0
    try:
        return sum(1 for e in ledger.read() if e.type.value == type_)
    except Exception:  # noqa: BLE001 - another process is mid-write: count 0 and poll again
        return 0
    finally:
        ledger.close()


def _residual_spec(directory: Path) -> Path:
    spec = make_spec_dir(directory, policy="cartpole_linear.py", budget={"env_steps": 6_000},
                         gate={"validation_episodes": 10, "max_share": 0.6}, test={"episodes": 10},
                         execution={"workers": 1}, refiner={"train_episodes": 2})
    toml = (spec / "ratchet.toml").read_text(encoding="utf-8")
    toml = toml.replace('[policy]\npath = "policy.py"', '[policy]\nkind = "residual"\npath = "policy.py"\nhidden = [8]')
    toml += '\n[[refiners]]\nkind = "cmaes"\nsigma0 = 0.5\npopsize = 4\n'
    (spec / "ratchet.toml").write_text(toml, encoding="utf-8")
    return spec


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux")
@pytest.mark.parametrize("storage", ["file", "sqlite-url", "postgresql"])
def test_residual_run_kill_9_resume_replay_export(tmp_path, storage, request):
    """A residual run (cmaes on the base's PARAMETERS) killed with SIGKILL, resumed, then every command on it:
    its correction is found in the artifact store (the run's file, or a shared database's table; PostgreSQL
    only with RATCHET_TEST_POSTGRES_URL set)."""
    from typer.testing import CliRunner

    from ratchet.cli import app
    from ratchet.ledger import SQLiteLedger

    spec_dir = _residual_spec(tmp_path / "spec")
    runs = tmp_path / "runs"
    url = {"file": None, "sqlite-url": f"sqlite:///{tmp_path / 'shared.sqlite'}"}.get(storage)
    if storage == "postgresql":
        url = request.getfixturevalue("postgres_url")
    run_id = "r" if storage != "postgresql" else unique_run_id("kinds")
    extra = [] if url is None else ["--storage", url]
    if url is None:
        def open_ledger():
            return SQLiteLedger(runs / run_id / "ledger.sqlite", create=False, readonly=True)
    else:
        def open_ledger():
            from ratchet.ledger.sql import SQLAlchemyLedger

            return SQLAlchemyLedger(url, run_id, create=False, readonly=True)
    run_then_kill_9(tmp_path, spec_dir, runs, lambda _: _count(open_ledger, "episodes_evaluated") >= 3,
                    "no evaluations recorded", run_id=run_id, extra=extra)
    runner = CliRunner(env={"COLUMNS": "250"})

    def cli(*args: str):
        res = runner.invoke(app, [*args, "--runs-dir", str(runs), *extra])
        assert res.exit_code == 0, res.output
        return res

    cli("resume", run_id, "--no-report")
    ledger, _ = open_run(run_id, runs, storage=url)
    try:
        events = ledger.read()
        st = project(events)
        start = Candidate.from_dict(events_of(events, EventType.RUN_STARTED)[0].payload["start_candidate"])
        incumbent = st.candidate(st.incumbent_id)
        blobs = candidate_artifacts(ledger, [start, incumbent])  # found in the store after the resume
    finally:
        ledger.close()
    assert st.status == "finished" and len(events_of(events, EventType.RUN_RESUMED)) == 1
    assert start.kind == incumbent.kind == "residual"
    assert incumbent.artifacts["correction"] == start.artifacts["correction"]  # cmaes tunes the base's PARAMETERS
    assert set(blobs) == {start.artifacts["correction"]}

    test_eval = st.evaluation(incumbent.id, "test")
    seed = test_eval.seeds[0]
    assert "match: identical return and length" in cli("replay", run_id, "--seed", str(seed)).stdout
    if storage != "file":
        return  # the rest reads the ledger the same way for every store

    shown = json.loads(cli("show", "r", "--json").stdout)
    assert shown["incumbent"]["kind"] == "residual" and set(shown["incumbent"]["artifacts"]) == {"correction"}
    assert "correction: mlp 4-8-2 (tanh, discrete)" in cli("show", "r").stdout
    assert "failure modes" in cli("critique", "r", "--split", "test").stdout
    evaluated = " ".join(cli("evaluate", "--run", "r", "-n", "2", "--workers", "1").stdout.split())
    assert "over 2 episodes" in evaluated
    assert "(seeds 0..1 from --seed/--episodes, not the run's test seeds" in evaluated

    out = tmp_path / "export" / "policy.py"
    out.parent.mkdir()
    cli("export", "r", "-o", str(out))
    base, npz, runner_py = out, out.with_name("policy_correction.npz"), out.with_name("policy_residual.py")
    assert npz.read_bytes() == blobs[incumbent.artifacts["correction"]]
    assert load_policy(base).defaults == dict(incumbent.params)  # the base program holds the refined values
    recorded = {e.seed: e for e in test_eval.episodes}
    for s in test_eval.seeds[:3]:  # the standalone program flies as ratchet did, bit for bit
        assert _standalone_return(_load_module(runner_py), CARTPOLE, s) == \
            (recorded[s].episode_return, recorded[s].length)

    report = tmp_path / "report.html"
    cli("report", "r", "-o", str(report), "--no-videos")
    html = report.read_text(encoding="utf-8")
    assert "Parameter changes (residual policy)" in html
    assert re.search(r"env steps went to: search [\d,]+ · re-evaluation [\d,]+ · validation [\d,]+", html), html[:2000]


# -- mlp: every command on a run's network -----------------------------------------------------------

def _write_mlp_run(run_dir: Path, executor) -> tuple[Candidate, Candidate, dict[str, bytes]]:
    """A finished run's ledger whose start is a fresh mlp and whose incumbent is a network trained from it
    (its weights moved): written event by event with real episodes, as the loop records them (no refiner
    for networks is needed for what the commands read)."""
    from ratchet.critic import Critic, Evaluation
    from ratchet.ledger import SQLiteLedger
    from ratchet.loop import LEDGER_FILE
    from ratchet.spec import load_spec

    spec = load_spec(make_spec_dir(run_dir.parent / "spec")).to_dict()
    spec["policy"] = {**spec["policy"], "kind": "mlp", "hidden": [16]}
    _, start, blobs = start_candidate(PolicySpec(kind="mlp", hidden=[16]), run_dir, _spaces(CARTPOLE), 0, None)
    from ratchet.policies.mlp import load_weights

    net = load_weights(blobs[start.artifacts["weights"]])
    last_w, last_b = net.weights[-1]
    moved = net.with_weights([*net.weights[:-1], (last_w + 0.05 * np.sign(last_w), last_b)]).to_bytes()
    trained = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(moved)}, parent_id=start.id,
                               refiner="ppo")
    blobs[digest(moved)] = moved
    run_dir.mkdir(parents=True)
    ledger = SQLiteLedger(run_dir / LEDGER_FILE)
    try:
        for data in blobs.values():
            ledger.put_artifact(data)
        ledger.append(EventType.RUN_STARTED, "run_started", {
            "run_id": run_dir.name, "spec": spec, "policy_source": "", "policy_path": "", "task": CARTPOLE.to_dict(),
            "versions": {}, "pid": 0, "host": "test", "execution": {"backend": "process"},
            "start_candidate": start.to_dict()})
        evals = {}
        for gen, cand in ((0, start), (1, trained)):
            ledger.append(EventType.CANDIDATE_PROPOSED, f"candidate/{cand.id}", {"generation": gen,
                                                                                "candidate": cand.to_dict()})
            for split, seeds in (("validation", [1, 2, 3]), ("test", [100, 101, 102, 103])):
                eps = executor.run(CARTPOLE, [Job(cand, s, blobs) for s in seeds])
                ev = evals[cand.id, split] = Evaluation(cand.id, split, tuple(eps))
                ledger.append(EventType.EPISODES_EVALUATED, f"eval/{split}/{cand.id}", {
                    "candidate_id": cand.id, "split": split, "generation": gen, "seeds": seeds,
                    "summary": ev.summary(), "episodes": [e.to_dict() for e in eps]})
        ledger.append(EventType.INCUMBENT_CHANGED, "incumbent/1", {
            "generation": 1, "from": start.id, "to": trained.id, "env_steps": 0, "params": {},
            "validation_mean": evals[trained.id, "validation"].mean,
            "previous_validation_mean": evals[start.id, "validation"].mean})
        critic = Critic.for_task(CARTPOLE)
        ledger.append(EventType.RUN_FINISHED, "run_finished", {
            "stop_reason": "budget", "generations": 1, "incumbent_id": trained.id, "baseline_id": start.id,
            "test": evals[trained.id, "test"].summary(), "baseline_test": evals[start.id, "test"].summary(),
            "test_critique": critic.critique(evals[trained.id, "test"], evals[start.id, "test"]).to_dict(),
            "baseline_test_critique": critic.critique(evals[start.id, "test"]).to_dict(), "wall_clock_s": 1.0})
    finally:
        ledger.close()
    return start, trained, blobs


def test_an_mlp_run_through_every_command(tmp_path, executor):
    from typer.testing import CliRunner

    from ratchet.cli import app

    runs = tmp_path / "runs"
    start, trained, blobs = _write_mlp_run(runs / "m", executor)
    runner = CliRunner(env={"COLUMNS": "250"})

    def cli(*args: str):
        res = runner.invoke(app, [*args, "--runs-dir", str(runs)])
        assert res.exit_code == 0, res.output
        return res.stdout

    assert "incumbent mlp" in cli("show", "m") and "weights: mlp 4-16-2 (tanh, discrete)" in cli("show", "m")
    assert "match: identical return and length" in cli("replay", "m", "--seed", "101")
    assert "match" in cli("replay", "m", "--seed", "2", "--candidate", start.id)
    assert f"candidate {trained.id} (mlp)" in cli("evaluate", "--run", "m", "--seeds", "100,101", "--workers", "1")
    assert "Candidate" in cli("critique", "m", "--split", "test")
    cli("export", "m", "-o", str(tmp_path / "net.py"))
    assert (tmp_path / "net.npz").read_bytes() == blobs[trained.artifacts["weights"]]
    cli("report", "m", "-o", str(tmp_path / "r.html"), "--no-videos")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Parameter changes (mlp policy)" in page and "mlp 4-16-2 (tanh, discrete): 114 weights" in page
    assert "of 114 changed" in page


# -- residual with a zero correction is its base ------------------------------------------------------

@pytest.mark.parametrize("env_id, policy", [("CartPole-v1", "cartpole_linear.py"),
                                            ("Pendulum-v1", None)])
def test_zero_correction_residual_equals_its_base_bit_for_bit(tmp_path, executor, env_id, policy):
    task = GymTask(env_id)
    if policy is None:  # a Box action space: the base's action must come back unclipped and unchanged
        path = tmp_path / "pendulum.py"
        path.write_text('import math\nPARAMETERS = {"k": {"default": 1.7, "low": 0.0, "high": 5.0}}\n'
                        "def act(observation, params):  # a float64 list, not clipped by the residual\n"
                        "    return [2.0 * math.tanh(params['k'] * (observation[2] + 0.3 * observation[0]))]\n",
                        encoding="utf-8")
    else:
        path = DATA / policy
    program = load_policy(path)
    params = {p.name: (0.3 if p.name != "k" else 2.5) for p in program.parameters}
    base = program.candidate(params)
    _, residual, blobs = start_candidate(PolicySpec(kind="residual", hidden=[16]), tmp_path, _spaces(task), 7,
                                         program)
    residual = Candidate.create(residual.source, params, kind="residual", artifacts=residual.artifacts)
    seeds = [0, 1, 2, 3]
    a = executor.run(task, [Job(base, s) for s in seeds])
    b = executor.run(task, [Job(residual, s, blobs) for s in seeds])
    assert all(e.error is None for e in a + b), [e.error for e in a + b]
    assert [(e.episode_return, e.length, e.terminated, e.truncated) for e in a] == \
        [(e.episode_return, e.length, e.terminated, e.truncated) for e in b]


# -- mlp: evaluated and exported --------------------------------------------------------------------

def test_mlp_candidate_evaluated_and_exported(tmp_path, executor):
    program, cand, blobs = start_candidate(PolicySpec(kind="mlp", hidden=[16, 16]), tmp_path, _spaces(CARTPOLE), 3, None)
    assert cand.kind == "mlp" and not program.parameters and set(blobs) == set(cand.artifacts.values())
    seeds = [10, 11, 12]
    eps = executor.run(CARTPOLE, [Job(cand, s, blobs) for s in seeds])
    assert all(e.error is None and e.length > 0 for e in eps)
    again = executor.run(CARTPOLE, [Job(cand, s, blobs) for s in seeds])  # replay: the same episodes
    assert [e.episode_return for e in again] == [e.episode_return for e in eps]
    with pytest.raises(Exception, match="lacks the bytes"):  # a job without its artifacts cannot build the policy
        from ratchet.execution import policy_payload

        policy_payload(Job(cand, 0))

    (tmp_path / "out").mkdir()
    paths = export_candidate(cand, blobs, tmp_path / "out" / "net.npz", header="test export", task=CARTPOLE.to_dict())
    assert [p.name for p in paths] == ["net.py", "net.npz"]
    assert paths[1].read_bytes() == blobs[cand.artifacts["weights"]]
    module = _load_module(paths[0])
    assert module.ENV_ID == "CartPole-v1"
    for s, ep in zip(seeds, eps):
        assert _standalone_return(module, CARTPOLE, s) == (ep.episode_return, ep.length)
    demo = subprocess.run([sys.executable, str(paths[0]), "10"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert demo.returncode == 0 and f"return {eps[0].episode_return!r}" in demo.stdout, demo.stderr
    # the exported weights start a new run where this one ended: [policy] kind = "mlp", path = "net.npz"
    _, again, _ = start_candidate(PolicySpec(kind="mlp", path="out/net.npz"), tmp_path, _spaces(CARTPOLE), 0, None)
    assert again.id == cand.id
    with pytest.raises(PolicyError, match="the task has 3 and 1"):
        start_candidate(PolicySpec(kind="mlp", path="out/net.npz"), tmp_path, _spaces(GymTask("Pendulum-v1")), 0, None)
    # hidden/activation set in [policy] must describe the file's network (4-16-16-2, tanh), not be ignored
    _, same, _ = start_candidate(PolicySpec(kind="mlp", path="out/net.npz", hidden=[16, 16], activation="tanh"),
                                 tmp_path, _spaces(CARTPOLE), 0, None)
    assert same.id == cand.id
    for wrong in ({"hidden": [64, 64]}, {"activation": "relu"}):
        with pytest.raises(PolicyError) as info:
            start_candidate(PolicySpec(kind="mlp", path="out/net.npz", **wrong), tmp_path, _spaces(CARTPOLE), 0, None)
        msg = str(info.value)
        assert "\n" not in msg and "4-16-16-2 layers, tanh" in msg and "remove hidden/activation" in msg, msg
        assert next(iter(wrong)) in msg


def test_mlp_box_export_acts_like_ratchet(tmp_path):
    """The standalone network (NumPy only) gives ratchet's actions exactly, for a Box action space too."""
    spaces = _spaces(GymTask("Pendulum-v1"))
    net = init_weights(*spaces, hidden=(8,), activation="relu", seed=1)
    net = net.with_weights([(w * 30.0, b + 0.1) for w, b in net.weights])  # large outputs: clipping matters
    data = net.to_bytes()
    cand = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(data)})
    py, _ = export_candidate(cand, {digest(data): data}, tmp_path / "p.py")
    exported = _load_module(py).Policy()
    rng = np.random.default_rng(0)
    for _ in range(50):
        obs = spaces[0].sample() if rng.random() < 0.5 else rng.normal(size=3) * 5
        assert np.array_equal(exported.act(obs), net.act(obs))


# -- sb3: the model's bytes as stored -----------------------------------------------------------------

def _damaged_zip(at: int, value: int) -> bytes:
    """A two-member zip ("data", "policy.pth") with one byte of its central directory entry set (or OR-ed)."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("data", "{}")
        z.writestr("policy.pth", b"x")
    b = bytearray(buf.getvalue())
    i = b.find(b"PK\x01\x02")
    b[i + at] = value if at != 9 else b[i + at] | value
    if at == 9:
        b[i + 46] = 0xFF  # the name's first byte, not UTF-8, while the flag says UTF-8
    return bytes(b)


@pytest.mark.parametrize("at, value, why", [(6, 160, "NotImplementedError"), (9, 0x08, "UnicodeDecodeError")])
def test_a_damaged_sb3_zip_is_one_line(tmp_path, at, value, why):
    """A central directory that claims a zip version or a name encoding zipfile cannot read (regression: its
    NotImplementedError / UnicodeDecodeError came out as a traceback)."""
    (tmp_path / "model.zip").write_bytes(_damaged_zip(at, value))
    with pytest.raises(PolicyError) as info:
        start_candidate(PolicySpec(kind="sb3", path="model.zip"), tmp_path, _spaces(CARTPOLE), 0, None)
    msg = str(info.value)
    assert "\n" not in msg and "model.zip: not a zip archive" in msg and why in msg and "model.save()" in msg


def test_sb3_export_writes_the_stored_zip(tmp_path):
    data = b"PK\x03\x04 not unpickled by the driver"
    cand = Candidate.create("", {}, kind="sb3", artifacts={"model": digest(data)})
    with pytest.raises(Exception, match=r"\.zip"):
        export_paths(cand, tmp_path / "model.pt")
    (path,) = export_candidate(cand, {digest(data): data}, tmp_path / "model.zip")
    assert path.read_bytes() == data
    assert "Stable-Baselines3 .zip" in describe_artifact("model", data)


def test_describe_artifact_of_a_refiners_training_state():
    import io

    buf = io.BytesIO()
    np.savez(buf, w=np.ones((3, 4)), b=np.zeros(4))  # e.g. a PPO critic: arrays, unused when acting
    assert describe_artifact("critic", buf.getvalue()) == "critic: 2 arrays, 16 numbers, norm 3.464"
    assert describe_artifact("critic", b"not an npz", with_role=False) == "10 bytes"
    assert describe_artifact("weights", None) == "weights: not read"


def test_sb3_export_opens_with_ppo_load(tmp_path):
    sb3 = pytest.importorskip("stable_baselines3", reason="needs stable-baselines3 (pip install stable-baselines3)")
    model = sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=0, device="cpu")
    model.save(tmp_path / "start.zip")
    data = (tmp_path / "start.zip").read_bytes()
    cand = Candidate.create("", {}, kind="sb3", artifacts={"model": digest(data)})
    (path,) = export_candidate(cand, {digest(data): data}, tmp_path / "exported.zip")
    loaded = sb3.PPO.load(path, device="cpu")
    obs = np.zeros(4, dtype=np.float32)
    assert loaded.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]


# -- the report and show summarise networks -----------------------------------------------------------

def test_report_summarises_networks_not_numbers():
    from ratchet.ledger.projection import RunState
    from ratchet.report.html import render_report

    spaces = _spaces(CARTPOLE)
    a = init_weights(*spaces, hidden=(64, 64), seed=0)
    b = a.with_weights([(w + 0.01, v) for w, v in a.weights])
    da, db = a.to_bytes(), b.to_bytes()
    c0 = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(da)})
    c1 = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(db)}, parent_id=c0.id, refiner="ppo")
    st = RunState(run_id="x", status="finished", spec={"task": {"env_id": "CartPole-v1"}}, baseline_id=c0.id,
                  incumbent_id=c1.id, candidates={c.id: c.to_dict() for c in (c0, c1)})
    page = render_report(st, artifacts={digest(da): da, digest(db): db})
    assert "Parameter changes (mlp policy)" in page
    assert "mlp 4-64-64-2 (tanh, discrete): 4,610 weights" in page
    assert "of 4,610 changed" in page
    assert page.count("<tr>") < 20  # a summary, not a table of weights


def test_correct_serves_a_runs_mlp_incumbent_and_writes_the_persons_data(tmp_path, executor):
    """`ratchet correct RUN`: the page plays the run's incumbent; keys over HTTP take over; the data set is written."""
    import json
    import re
    import urllib.request

    from ratchet.data import Dataset

    run_dir = tmp_path / "runs" / "m"
    _write_mlp_run(run_dir, executor)
    out_file = tmp_path / "person.npz"
    proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "correct", str(run_dir), "--episodes", "1",
                             "-o", str(out_file), "--interval-ms", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"})
    try:
        url = re.search(r"open (http://127\.0\.0\.1:\d+/[\w-]{20,}/) ", proc.stdout.readline()).group(1)  # token path

        def step(**msg):
            req = urllib.request.Request(url + "step", data=json.dumps(msg).encode(), method="POST")
            return json.loads(urllib.request.urlopen(req, timeout=30).read())

        assert step(held=[])["control"] == "student"
        assert step(held=["ArrowLeft"], pressed=["ArrowLeft"])["control"] == "person"
        assert step(held=[], handback=True)["control"] == "student"
        while not step(held=[])["done"]:
            pass
        rest, errors = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, errors
    assert "XDG_RUNTIME_DIR" not in errors and "Traceback" not in errors, errors  # SDL renders off screen, quietly
    assert "1 under your control" in rest and "recorded in the run's ledger" in rest
    data = Dataset.from_bytes(out_file.read_bytes())
    assert len(data) == 1 and data.expert.all() and data.label.tolist() == [0]


def test_correct_on_a_missing_run_is_one_error_line(tmp_path):
    from typer.testing import CliRunner

    from ratchet.cli import app

    got = CliRunner().invoke(app, ["correct", str(tmp_path / "nope")])
    assert got.exit_code != 0 and "no run" in got.output


def test_a_policy_file_that_never_ends_is_refused_after_a_bounded_read(monkeypatch):
    """A [policy] path naming a device (/dev/zero: size 0, endless bytes) is refused once past the size limit
    (regression: its size was checked, then it was read until the memory ran out)."""
    from ratchet.policies import start

    monkeypatch.setattr(start, "MAX_MODEL_BYTES", 1000)
    with pytest.raises(PolicyError, match="/dev/zero is larger than 1,000 bytes"):
        start.read_sb3_zip("/dev/zero")
