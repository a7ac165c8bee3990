"""ratchet.ledger.lease: one writer per run, across machines (heartbeat, expiry, take-over, status).

The two-host test runs `ratchet` in its own UTS namespace with another host name (``unshare --uts``,
needs root); it is skipped where that is not possible.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import events_of, interrupted_run, make_spec_dir, unique_run_id

from ratchet.errors import LedgerError, WriterLeaseError
from ratchet.ledger import EventType, SQLiteLedger
from ratchet.ledger.lease import LeaseHolder, LeaseInfo, WriterLease, format_age, lease_ttl_s
from ratchet.ledger.projection import project


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_ttl_from_argument_environment_or_default(monkeypatch):
    monkeypatch.delenv("RATCHET_LEASE_TTL_S", raising=False)
    assert lease_ttl_s() == 60.0 and lease_ttl_s(2.5) == 2.5
    monkeypatch.setenv("RATCHET_LEASE_TTL_S", "0.75")
    assert lease_ttl_s() == 0.75
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("RATCHET_LEASE_TTL_S", bad)
        with pytest.raises(LedgerError, match="RATCHET_LEASE_TTL_S must be a positive number of seconds"):
            lease_ttl_s()


def test_format_age():
    assert [format_age(s) for s in (0.4, 59, 119, 180, 7199, 7200, 3 * 86400)] == \
        ["0 s", "59 s", "119 s", "3 min", "120 min", "2 h", "3 days"]


def test_heartbeat_keeps_the_lease_and_release_frees_it(tmp_path):
    a = SQLiteLedger(tmp_path / "r" / "ledger.sqlite")
    lease = WriterLease.acquire(a, "r", ttl_s=6)  # lost only if the heartbeat thread waits 4 s for a CPU
    try:
        time.sleep(9)  # past its time-to-live: alive only thanks to the heartbeat (every 2 s)
        other = SQLiteLedger(tmp_path / "r" / "ledger.sqlite")
        with pytest.raises(WriterLeaseError, match=rf"run r is being written by pid {os.getpid()} on host .* \(last "
                                                   r"heartbeat \d s ago\); wait for it to end or stop it"):
            WriterLease.acquire(other, "r", ttl_s=0.6)
        assert not lease.lost
        a.append(EventType.RUN_STARTED, "run_started", {})
    finally:
        lease.release()
    assert other.read_lease().released
    second = WriterLease.acquire(other, "r", ttl_s=0.6)  # at once, no waiting for expiry
    second.release()
    other.close()
    a.close()


def test_a_lost_lease_is_noticed_by_the_heartbeat_and_stops_appends(tmp_path):
    a = SQLiteLedger(tmp_path / "r" / "ledger.sqlite")
    b = SQLiteLedger(tmp_path / "r" / "ledger.sqlite")
    lease = WriterLease.acquire(a, "r", ttl_s=0.3)
    b.acquire_lease(LeaseHolder("thief", "elsewhere", 7), 30, take_over=lease.holder.token)
    deadline = time.monotonic() + 60
    while not lease.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lease.lost
    with pytest.raises(WriterLeaseError, match="pid 7 on host elsewhere"):
        a.append(EventType.RUN_STARTED, "run_started", {})
    lease.release()  # does not release the thief's lease
    assert b.read_lease().holder.token == "thief" and not b.read_lease().released
    a.close()
    b.close()


def test_a_dead_writer_on_this_host_is_taken_over_at_once(tmp_path):
    led = SQLiteLedger(tmp_path / "r" / "ledger.sqlite")
    led.acquire_lease(LeaseHolder("dead", os.uname().nodename, _dead_pid()), 3600)
    other = SQLiteLedger(tmp_path / "r" / "ledger.sqlite")
    lease = WriterLease.acquire(other, "r")
    assert other.read_lease().holder.token == lease.holder.token
    lease.release()
    # a live pid on another host cannot be checked: only expiry frees its lease
    led.acquire_lease(LeaseHolder("far", "machine-a", os.getpid()), 3600)
    with pytest.raises(WriterLeaseError, match="pid .* on host machine-a .* its lease expires in 60 min"):
        WriterLease.acquire(other, "r")
    led.close()
    other.close()


def _started(pid: int, host: str) -> list:
    led_events = [("run_started", EventType.RUN_STARTED,
                   {"run_id": "r", "spec": {"task": {"env_id": "CartPole-v1"}}, "policy_source": "", "pid": pid,
                    "host": host})]
    from ratchet.ledger import Event

    return [Event(i + 1, t, k, 1000.0, p) for i, (k, t, p) in enumerate(led_events)]


def test_status_from_the_lease():
    here = os.uname().nodename
    events = _started(123, "machine-a")
    live = LeaseInfo(LeaseHolder("t", "machine-a", 123), heartbeat_at=1000, expires_at=1060, now=1010)
    stale = LeaseInfo(LeaseHolder("t", "machine-a", 123), heartbeat_at=1000, expires_at=1060, now=1000 + 180)
    released = LeaseInfo(LeaseHolder("t", "machine-a", 123), 1000, 1000, 1010, released=True)
    assert project(events).status == "running"  # no lease (an older ledger): a writer elsewhere cannot be judged
    st = project(events, live)
    assert st.status == st.status_text == "running" and st.writer["host"] == "machine-a"
    st = project(events, stale)
    assert st.status == "stale" and st.status_text == "stale: last heartbeat 3 min ago on host machine-a"
    assert st.to_json()["status"] == "stale" and st.to_json()["writer"]["last_heartbeat_s_ago"] == 180
    assert project(events, released).status == "interrupted"
    dead_here = LeaseInfo(LeaseHolder("t", here, _dead_pid()), 1000, 1060, 1010)
    assert project(_started(dead_here.holder.pid, here), dead_here).status == "interrupted"  # fast signal


# -- whole runs -------------------------------------------------------------------------------------

_RESUMER = r"""
import json, sys, time
from pathlib import Path
from ratchet.errors import RatchetError
from ratchet.execution.process import ProcessExecutor
from ratchet.loop import resume_run

a = json.loads(sys.argv[1])
go = Path(a["go"])
(go.parent / f"ready-{a['i']}").touch()
while not go.exists():
    time.sleep(0.002)
try:
    resume_run(a["run"], a["runs"], storage=a["url"], executor=ProcessExecutor(workers=1))
    print(json.dumps("finished"))
except RatchetError as exc:
    print(json.dumps(str(exc)))
"""


def test_two_resumes_from_different_run_directories_one_runs(shared_storage, tmp_path):
    """Two processes resume one database-held run at once, each from its own run directory (so no
    directory lock can help): exactly one runs it; the other is refused (or finds it finished)."""
    run_id = interrupted_run(tmp_path, shared_storage, "race")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _RESUMER, json.dumps(
        {"run": run_id, "runs": str(tmp_path / f"machine{i}"), "url": shared_storage, "go": str(go), "i": i})],
        stdout=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    outcomes = [json.loads(p.communicate(timeout=180)[0].strip().splitlines()[-1]) for p in procs]
    assert outcomes.count("finished") == 1, outcomes
    loser = next(o for o in outcomes if o != "finished")
    assert "is being written by pid" in loser or "already finished" in loser, loser
    from ratchet.loop import open_ledger

    events = open_ledger(run_id, tmp_path, storage=shared_storage).read()
    assert project(events).status == "finished"
    assert len(events_of(events, EventType.RUN_RESUMED)) == 1
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    keys = [e.key for e in events_of(events, EventType.EPISODES_EVALUATED)]
    assert len(keys) == len(set(keys))


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--uts", "true"], capture_output=True, check=False).returncode == 0


def _on_host(host: str, *args: str) -> list[str]:
    """``ratchet ARGS`` as run on a machine named ``host`` (its own UTS namespace)."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, sys.executable, "-m", "ratchet.cli",
            *args]


def _evaluations(url: str, run_id: str) -> int:
    from ratchet.errors import RatchetError
    from ratchet.ledger.sql import SQLAlchemyLedger

    try:
        led = SQLAlchemyLedger(url, run_id, readonly=True)
    except RatchetError:
        return 0
    try:
        return len(events_of(led.read(), EventType.EPISODES_EVALUATED))
    finally:
        led.close()


def _shift_lease(url: str, run_id: str, seconds: float) -> None:
    """Move the run's lease ``seconds`` into the past (as if that much time had passed without a heartbeat)."""
    from sqlalchemy import create_engine, text

    from ratchet.ledger.sql import LEASES_TABLE, database_url

    engine = create_engine(database_url(url))
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {LEASES_TABLE} SET heartbeat_at = heartbeat_at - :s, expires_at = expires_at - :s "
                          "WHERE run_id = :r"), {"s": seconds, "r": run_id})
    engine.dispose()


@pytest.mark.skipif(not _can_unshare(), reason="needs root and `unshare --uts` to give a process another host name")
@pytest.mark.timeout(900)  # three CLI processes: on a loaded machine each took over a minute to start
def test_two_host_resume(shared_storage, tmp_path):
    """A run in a shared database is killed on host A. From host B, `ratchet resume` is refused while A's
    lease lives (`ratchet show` says running), and works once it expired (`show` then says stale)."""
    spec_dir = make_spec_dir(tmp_path / "s", budget={"env_steps": 60_000, "episodes": 80}, test={"episodes": 5},
                             gate={"validation_episodes": 5}, execution={"workers": 1})
    run_id = unique_run_id("twohost")
    env = {**os.environ, "COLUMNS": "250"}
    # 10 min: alive for the whole refusal check (with the default 60 s, a loaded machine's `ratchet show` started
    # after A's lease had expired)
    env["RATCHET_LEASE_TTL_S"] = "600"
    storage = ["--storage", shared_storage]
    a = subprocess.Popen(_on_host("hosta", "run", str(spec_dir), "--runs-dir", str(tmp_path / "a"), "--run-id", run_id,
                                  "--no-report", *storage), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 300
        while _evaluations(shared_storage, run_id) < 3:
            assert a.poll() is None, f"host A's run ended before it could be killed: {a.stderr.read()}"
            assert time.monotonic() < deadline, "host A recorded no evaluations within 300 s"
            time.sleep(0.1)
        os.kill(a.pid, signal.SIGKILL)
        a.wait(10)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        a.stderr.close()

    def on_b(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(_on_host("hostb", *args, "--runs-dir", str(tmp_path / "b"), *storage),
                              capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL,
                              check=False)

    shown = on_b("show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "running"  # A's lease is live and B cannot see A's processes
    refused = on_b("resume", run_id, "--no-report")
    assert refused.returncode == 1
    assert f"run {run_id} is being written by pid {a.pid} on host hosta (last heartbeat" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr

    _shift_lease(shared_storage, run_id, 1200)  # twenty minutes pass: A's lease expired
    shown = on_b("show", run_id)  # (20 min plus the time since A's last heartbeat: a third of 10 min, and the checks)
    assert re.search(r"stale: last heartbeat 2[0-9] min ago on host hosta", shown.stdout), shown.stdout + shown.stderr
    done = on_b("resume", run_id, "--no-report")
    assert done.returncode == 0, done.stdout + done.stderr

    from ratchet.ledger.sql import SQLAlchemyLedger

    led = SQLAlchemyLedger(shared_storage, run_id, readonly=True)
    events, lease = led.read(), led.read_lease()
    led.close()
    assert project(events, lease).status == "finished"
    resumed = events_of(events, EventType.RUN_RESUMED)
    assert [e.payload["host"] for e in resumed] == ["hostb"]
    assert events[0].payload["host"] == "hosta"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    keys = [e.key for e in events_of(events, EventType.EPISODES_EVALUATED)]
    assert len(keys) == len(set(keys))
    assert lease.holder.host == "hostb" and lease.released


def test_a_stalled_writer_that_lost_its_lease_stops(postgres_url, tmp_path):
    """A writer frozen (SIGSTOP) past its lease's expiry is taken over; when it wakes up it appends
    nothing more and exits with one line saying so."""
    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger.sql import SQLAlchemyLedger
    from ratchet.loop import resume_run

    spec_dir = make_spec_dir(tmp_path / "s", budget={"env_steps": 60_000, "episodes": 80}, test={"episodes": 5},
                             gate={"validation_episodes": 5}, execution={"workers": 1})
    run_id = unique_run_id("stalled")
    env = {**os.environ, "RATCHET_LEASE_TTL_S": "2"}
    a = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "run", str(spec_dir), "--runs-dir", str(tmp_path / "a"),
                          "--run-id", run_id, "--no-report", "--storage", postgres_url], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True)
    try:
        deadline = time.monotonic() + 300  # a loaded machine may take a minute or more to start the CLI
        while _evaluations(postgres_url, run_id) < 3:
            assert a.poll() is None, f"the run ended before it could be stopped: {a.stderr.read()}"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(a.pid, signal.SIGSTOP)
        led = SQLAlchemyLedger(postgres_url, run_id, readonly=True)
        while not led.read_lease().expired:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        led.close()
        result = resume_run(run_id, tmp_path / "b", storage=postgres_url, executor=ProcessExecutor(workers=1))
        assert result.stop_reason
        led = SQLAlchemyLedger(postgres_url, run_id, readonly=True)
        finished = led.read()
        os.kill(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
    assert a.returncode == 1, err
    assert "lost the writer lease" in err and "Traceback" not in err
    assert led.read() == finished  # not one event from the stalled writer after the take-over
    assert project(finished).status == "finished"
    led.close()
