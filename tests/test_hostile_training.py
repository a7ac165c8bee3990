"""Training answers and artifacts are untrusted input: a hostile trainer, a forged answer, an artifact that
unpacks to gigabytes. Each is that job's recorded failure (one line), never a driver exception, never an
event that breaks resume; the driver never loads more than :func:`ratchet.npz.unpack_limit` of an artifact."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from conftest import DATA, SimulatedKill, read_events
from test_dagger import TASK, _Executor, _spec_dir, _student, round0  # noqa: F401 - round0 is a fixture

from ratchet.data import DataError, Dataset
from ratchet.errors import PolicyError
from ratchet.execution.training import (
    InfoField,
    Role,
    TrainingAnswer,
    TrainingJob,
    TrainingOutput,
    TrainingResult,
    accept,
)
from ratchet.npz import NpzError, load_npz, npz_headers, unpack_limit
from ratchet.policies import describe_artifact
from ratchet.policies.mlp import load_weights
from ratchet.policy import Candidate
from ratchet.refiners import dagger, ppo


def _bomb(n: int = 100_000_000) -> bytes:
    """An .npz of ``n`` zeros deflated to about n/1000 bytes."""
    buf = io.BytesIO()
    np.savez_compressed(buf, obs=np.zeros(n, np.uint8))
    return buf.getvalue()


# -- §2: artifacts are described and loaded without trusting their size ---------------------------------
def test_a_decompression_bomb_is_described_from_its_headers_and_never_loaded():
    import tracemalloc

    bomb = _bomb()
    assert len(bomb) < 200_000
    tracemalloc.start()
    line = describe_artifact("critic", bomb)
    weights = describe_artifact("weights", bomb)
    with pytest.raises(DataError, match="unpacks to 100,000,128 bytes"):
        Dataset.from_bytes(bomb)
    with pytest.raises(PolicyError, match="unpacks to 100,000,128 bytes"):
        load_weights(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 2**20  # nothing near the 100 MB (or 800 MB as float64) the arrays hold
    assert line.startswith("critic: 1 arrays, 100,000,000 numbers (not loaded: an .npz of")
    assert "the driver loads at most 67,108,864" in weights
    [h] = npz_headers(bomb, limit=2**40)
    assert (h.name, h.shape, h.dtype, h.nbytes) == ("obs", (100_000_000,), np.dtype(np.uint8), 100_000_000)


def test_arrays_that_fit_load_and_pickles_are_refused():
    buf = io.BytesIO()
    np.savez(buf, a=np.ones((3, 4), np.float32), b=np.arange(5))
    assert describe_artifact("critic", buf.getvalue()) == "critic: 2 arrays, 17 numbers, norm 6.481"
    assert set(load_npz(buf.getvalue())) == {"a", "b"}
    obj = io.BytesIO()
    np.savez(obj, a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(NpzError, match="holds Python objects"):
        npz_headers(obj.getvalue())
    with pytest.raises(NpzError, match="not an .npz"):
        npz_headers(b"PK\x03\x04garbage")
    assert unpack_limit(10) == 64 * 2**20 and unpack_limit(2**40) == 2 * 2**30


# -- §1: the answer is checked against the trainer's declaration ----------------------------------------
def _job(answer: TrainingAnswer, env_steps: int = 100, **settings) -> TrainingJob:
    parent = Candidate.create("", {}, kind="mlp", artifacts={"weights": "0" * 64})
    return TrainingJob("dagger", parent, settings, (1, 2), env_steps, answer=answer)


def test_accept_checks_roles_info_types_ranges_and_sizes(round0):  # noqa: F811 - pytest passes the fixture
    job = _job(dagger.ANSWER, 200, round=0)
    info = {"round": 0, "mode": "bc", "episodes": [], "labelled_steps": 10, "expert_steps": 10, "env_steps": 100,
            "expert_steps_per_episode": 0.0, "dataset": Dataset.from_bytes(round0["dataset"]).summary(),
            "bc": {"updates": 3, "loss_last": 0.5}}
    good = TrainingOutput(dict(round0), info)
    assert accept(job, TrainingResult((good,), 0)).error is None

    def why(artifacts=None, **changes):
        out = TrainingOutput(dict(round0) if artifacts is None else artifacts, {**info, **changes})
        res = accept(job, TrainingResult((out,), 0))
        assert res.outputs == () and res.env_steps == 200 and "\n" not in res.error
        return res.error

    assert "missing ['dataset']" in why({"weights": round0["weights"]})
    assert "unknown ['extra']" in why({**round0, "extra": b"x"})
    assert "info 'round' = 'zz' (expected int)" in why(round="zz")
    assert "info 'round' = True (expected int)" in why(round=True)
    assert "info 'env_steps' = 201 (expected int in 0..200)" in why(env_steps=201)
    assert "info 'mode' = 'x'" in why(mode="x")
    assert "not finite JSON" in why(expert_steps_per_episode=float("nan"))
    assert "info 'bc': 'loss' is not a finite number" in why(bc={"loss": "low"})
    assert "unpacks to" in why({**round0, "dataset": _bomb()})
    assert "artifact 'weights': not an mlp weights artifact" in why({**round0, "weights": b"junk"})
    assert "info 'episodes'" in why(episodes=[{"seed": 1}])
    assert "wrong keys (unknown ['x'])" in why(x=1)
    assert "2 outputs (expected 1..1)" in accept(job, TrainingResult((good, good), 0)).error
    assert "a result of type str" in accept(job, "garbage").error
    assert "no declaration" in accept(_job(None), TrainingResult((good,), 0)).error


def test_ppo_declares_its_checkpoints_by_policy_kind():
    job = _job(ppo.answer("mlp"), 256, checkpoints=2)
    critic = io.BytesIO()
    np.savez(critic, w=np.zeros((4, 1), np.float32))
    out = TrainingOutput({"weights": _student(), "critic": critic.getvalue()},
                         {"checkpoint": 3, "env_steps": 128, "episodes": 2, "train_return_mean": None})
    assert "info 'checkpoint' = 3 (expected int in 1..2)" in accept(job, TrainingResult((out,), 0)).error
    out = TrainingOutput({"model": b"not a zip"}, {"checkpoint": 1, "env_steps": 128, "episodes": 2,
                                                  "train_return_mean": 1.5})
    assert "artifact 'model': not a zip archive" in accept(_job(ppo.answer("sb3"), 256, checkpoints=2),
                                                           TrainingResult((out,), 0)).error


def test_a_role_check_that_raises_anything_is_a_failure_not_a_crash():
    def explode(value):
        raise MemoryError("boom")

    answer = TrainingAnswer(roles=(Role("x", required=False, check=explode),), info=(InfoField("n", "int", check=explode),))
    res = accept(_job(answer), TrainingResult((TrainingOutput({"x": b""}, {"n": 1}),), 0))
    assert res.error.endswith("output 1: artifact 'x': boom") and res.outputs == ()
    res = accept(_job(answer), TrainingResult((TrainingOutput({}, {"n": 1}),), 0))
    assert res.error.endswith("cannot be read (MemoryError)") and res.outputs == ()


@pytest.mark.parametrize("forge, reason", [
    ("infinite-size", "artifact 'weights' of size inf"),
    ("deep", "not JSON (nested too deeply)"),
    ("no-dataset", "missing ['dataset']"),
    ("bad-round", "info 'round' = 'zz' (expected int)"),
    ("bomb", "unpacks to 100,000,128 bytes"),
])
def test_a_trainer_that_forges_its_answer_fails_its_job_and_the_run_resumes(tmp_path, forge, reason):
    from ratchet.loop import resume_run, start_run

    d = _spec_dir(tmp_path, kind="dagger")
    source = (DATA / "hostile" / "forges_training_answer.py").read_text()
    (d / "expert.py").write_text(source.replace('FORGE = "infinite-size"', f"FORGE = {forge!r}"))
    from ratchet.spec import load_spec

    spec = load_spec(d)
    killed = _Executor(die_in_job=2)  # the first (forged) answer recorded, then the driver dies
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "h", executor=killed)
    killed.close()
    again = _Executor()
    try:
        res = resume_run(tmp_path / "runs" / "h", executor=again)
    finally:
        again.close()
    events = read_events(tmp_path / "runs" / "h")
    jobs = [e.payload for e in events if e.type.value == "training_finished"]
    assert len(jobs) == 3 and all(j["outputs"] == [] and reason in j["error"] for j in jobs), jobs[0]["error"]
    assert all("\n" not in j["error"] and len(j["error"]) <= 500 for j in jobs)
    assert "training failed 3 times in a row" in res.stop_reason and res.incumbent.id == spec_start(events)
    json.dumps([e.payload for e in events])  # every event is plain JSON


def spec_start(events) -> str:
    return next(e for e in events if e.type.value == "run_started").payload["start_candidate"]["id"]
