"""kill -9 a real `ratchet run` process mid-run, then `ratchet resume` it to completion."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import children_of, comparable, count_events, events_of, make_spec_dir, read_events, run_then_kill_9

from ratchet.ledger import EventType
from ratchet.ledger.projection import project

CLI = [sys.executable, "-m", "ratchet.cli"]
# a whole run, killed, and its resume: on a loaded machine the CLI's start alone took over a minute
pytestmark = [pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc"),
              pytest.mark.timeout(900)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _reap(pids: set[int], within_s: float = 60) -> bool:
    """Wait for orphaned ``pids`` to exit on their own (kill -9 the rest); whether they all did in time."""
    t0 = time.monotonic()
    while any(_alive(p) for p in pids) and time.monotonic() - t0 < within_s:
        time.sleep(0.05)
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)
    return time.monotonic() - t0 < within_s


def test_kill_9_then_resume(tmp_path):
    spec_dir = make_spec_dir(tmp_path / "spec", budget={"env_steps": 150_000}, gate={"validation_episodes": 10},
                             test={"episodes": 10}, execution={"workers": 1})
    runs = tmp_path / "runs"
    db = runs / "k" / "ledger.sqlite"
    workers = run_then_kill_9(tmp_path, spec_dir, runs, lambda kids: count_events(db, "episodes_evaluated") >= 4,
                               "no evaluations recorded")
    assert workers, "the run should have started a worker process"
    # its workers are in their own sessions; they exit when their socket closes
    assert _reap(workers), "orphaned workers did not exit after the run was killed"

    before = read_events(runs / "k")
    evaluated_before = events_of(before, EventType.EPISODES_EVALUATED)
    assert len(evaluated_before) >= 4
    assert not events_of(before, EventType.RUN_FINISHED)
    assert project(before).status == "interrupted"

    done = subprocess.run(CLI + ["resume", "k", "--runs-dir", str(runs), "--no-report"], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr

    after = read_events(runs / "k")
    st = project(after)
    assert st.status == "finished"
    assert len(events_of(after, EventType.RUN_RESUMED)) == 1
    # everything recorded before the kill is still there, unchanged
    by_key = {e.key: e for e in after}
    for e in before:
        assert by_key[e.key].payload == e.payload and by_key[e.key].seq == e.seq and by_key[e.key].time == e.time
    # each (candidate, split, seeds) evaluation exactly once
    keys = [(e.payload["candidate_id"], e.payload["split"], tuple(e.payload["seeds"]))
            for e in events_of(after, EventType.EPISODES_EVALUATED)]
    assert len(keys) == len(set(keys))
    # the run used its whole budget across both sessions and did its test evaluation once
    assert 75_000 < st.env_steps <= 150_000
    assert st.env_steps == sum(e.payload["summary"]["env_steps"] for e in events_of(after, EventType.EPISODES_EVALUATED)
                               if e.payload["split"] != "test")
    assert sum(1 for k in keys if k[1] == "test") == 2
    assert st.test is not None and st.test["n"] == 10


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_then_resume(tmp_path, signum):
    spec_dir = make_spec_dir(tmp_path / "spec", budget={"env_steps": 60_000}, gate={"validation_episodes": 10},
                             test={"episodes": 10}, execution={"workers": 1})
    runs = tmp_path / "runs"
    db = runs / "c" / "ledger.sqlite"
    # a shell's background job inherits SIGINT ignored (POSIX); restore the default so the signal is heard
    proc = subprocess.Popen(CLI + ["run", str(spec_dir), "--runs-dir", str(runs), "--run-id", "c", "--no-report"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509 - only this call runs in the child
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while count_events(db, "episodes_evaluated") < 4:
            workers |= children_of(proc.pid)
            assert proc.poll() is None, "run ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        workers |= children_of(proc.pid)
        os.kill(proc.pid, signum)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted; continue with `ratchet resume" in err
    assert "Traceback" not in err
    # Ctrl-C closes the pool: no worker outlives the run
    t0 = time.monotonic()
    while any(_alive(w) for w in workers) and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    leftover = [w for w in workers if _alive(w)]
    for w in leftover:
        os.kill(w, signal.SIGKILL)
    assert not leftover
    before = read_events(runs / "c")
    assert not events_of(before, EventType.RUN_FINISHED) and not events_of(before, EventType.RUN_FAILED)
    assert project(before).status == "interrupted"

    done = subprocess.run(CLI + ["resume", str(runs / "c"), "--no-report"], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    after = read_events(runs / "c")
    assert project(after).status == "finished"
    assert [e.payload for e in after[:len(before)]] == [e.payload for e in before]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_kill_9_during_a_dagger_training_job_then_resume(tmp_path):
    """hg-dagger (a tiny CartPole student): kill -9 the run while round 1's sandboxed training job is in
    flight (round 0 recorded), resume, and end with the ledger of a run that was never interrupted."""
    from test_dagger import _spec_dir

    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec_dir = _spec_dir(tmp_path)
    start_run(load_spec(spec_dir), tmp_path / "ref", "k")  # the uninterrupted run
    runs = tmp_path / "runs"
    db = runs / "k" / "ledger.sqlite"

    def training(kids: set[int]) -> bool:  # round 0 recorded, round 1's trainer process running
        return any("ratchet.execution.training" in _cmdline(k) for k in kids) and \
            count_events(db, "training_finished") == 1

    helpers = run_then_kill_9(tmp_path, spec_dir, runs, training, "round 1's training job never started")
    _reap(helpers)  # the trainer and the workers are in their own sessions: they exit on their own

    before = read_events(runs / "k")
    assert [e.payload["settings"]["round"] for e in events_of(before, EventType.TRAINING_FINISHED)] == [0]
    assert not events_of(before, EventType.RUN_FINISHED) and project(before).status == "interrupted"
    done = subprocess.run(CLI + ["resume", "k", "--runs-dir", str(runs), "--no-report"], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    after = read_events(runs / "k")
    by_key = {e.key: e for e in after}
    for e in before:  # what was recorded before the kill is unchanged
        assert by_key[e.key].payload == e.payload and by_key[e.key].seq == e.seq and by_key[e.key].time == e.time

    assert comparable(after) == comparable(read_events(tmp_path / "ref" / "k"))
    assert [e.payload["settings"]["round"] for e in events_of(after, EventType.TRAINING_FINISHED)] == [0, 1]
    assert project(after).status == "finished"


def test_kill_9_with_llm_requests_in_flight_then_resume(tmp_path, standin):
    """An llm run sends a generation's 4 requests at once; kill -9 it once 3 answers are recorded, the 4th still out
    (its answer takes 120 s). Resuming reads the 3 back (never asking for them again), asks for the 4th again and
    finishes; every request ends up recorded once."""
    import hashlib
    import json

    from conftest import GOOD_EDIT

    arrivals: list[int] = []

    def respond(body):  # the 4th request to arrive is the slow one
        arrivals.append(body["seed"])
        return {"content": GOOD_EDIT, **({"delay": 120.0} if len(arrivals) == 4 else {})}

    server = standin(respond=respond, latency=0.1)
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 4, "variants": 1, "concurrency": 4,
           "budget_requests": 8, "retries": 0}
    spec_dir = make_spec_dir(tmp_path / "spec", test={"episodes": 5}, execution={"workers": 1})
    with open(spec_dir / "ratchet.toml", "a", encoding="utf-8") as f:
        f.write("\n[[refiners]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in llm.items()))
    runs = tmp_path / "runs"
    db = runs / "k" / "ledger.sqlite"
    workers = run_then_kill_9(tmp_path, spec_dir, runs, lambda kids: count_events(db, "llm_call") >= 3,
                              "3 answers not recorded")
    _reap(workers)
    before = events_of(read_events(runs / "k"), EventType.LLM_CALL)
    assert len(before) == 3 and len(server.requests) == 4
    done = subprocess.run(CLI + ["resume", "k", "--runs-dir", str(runs), "--no-report"], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    asked: dict[str, int] = {}
    for q in server.requests:
        digest = hashlib.sha256(json.dumps(q["body"], sort_keys=True).encode()).hexdigest()[:24]
        asked[digest] = asked.get(digest, 0) + 1
    assert all(asked[e.key.rsplit("/", 1)[1]] == 1 for e in before)  # an answer received is never asked for again
    calls = events_of(read_events(runs / "k"), EventType.LLM_CALL)
    assert len(calls) == len({e.key for e in calls}) == 8 and sorted(asked.values()) == [1] * 7 + [2]
