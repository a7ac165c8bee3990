"""Fault injection: random worker kills during a real `ratchet run`, the driver killed once, then
`ratchet resume` (with workers still being killed). The ledger must hold every evaluation exactly once,
the run must finish normally, and its results must equal an undisturbed run of the same spec."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import count_events, events_of, make_spec_dir, read_events

from ratchet.ledger import EventType
from ratchet.ledger.projection import project

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
CLI = [sys.executable, "-m", "ratchet.cli"]


def _age_s(pid: int) -> float:
    start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _worker_children(pid: int, min_age_s: float = 1.5) -> list[int]:
    """The driver's worker processes (its direct children that run a worker, possibly via a launcher)
    that have been up for ``min_age_s`` (so most kills land on working workers, not starting ones)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            try:
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
                age = _age_s(kid)
            except (OSError, IndexError, ValueError):
                continue
            if b"ratchet.execution.worker" in cmdline and age >= min_age_s:
                out.append(kid)
    return out


class WorkerKiller(threading.Thread):
    """SIGKILLs a random worker of ``pid`` every 0.8–1.6 s until stopped or ``max_kills`` are done."""

    def __init__(self, pid: int, seed: int, max_kills: int = 6) -> None:
        super().__init__(daemon=True)
        self.pid, self.rng, self.kills, self.max_kills = pid, random.Random(seed), 0, max_kills
        self.stopped = threading.Event()

    def run(self) -> None:
        while self.kills < self.max_kills and not self.stopped.wait(self.rng.uniform(0.8, 1.6)):
            kids = _worker_children(self.pid)
            if kids:
                try:
                    os.kill(self.rng.choice(kids), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass

    def stop(self) -> int:
        self.stopped.set()
        self.join()
        return self.kills


def _evaluations(events) -> dict[str, list]:
    return {e.key: [(ep["seed"], ep["episode_return"], ep["length"], ep["error"]) for ep in e.payload["episodes"]]
            for e in events_of(events, EventType.EPISODES_EVALUATED)}


def test_random_worker_kills_and_a_driver_kill_leave_no_trace(tmp_path):
    # random kills can hit one episode's fresh worker again (likelier on a loaded machine): three reruns make a
    # death charged to a candidate vanishingly rare, so any difference from the clean run is a real bug
    spec_dir = make_spec_dir(tmp_path / "spec", "cartpole_paced.py", budget={"env_steps": 80_000}, gate={"validation_episodes": 10},
                             test={"episodes": 10}, execution={"workers": 2, "death_retries": 3})
    clean_runs, runs = tmp_path / "clean", tmp_path / "runs"
    done = subprocess.run(CLI + ["run", str(spec_dir), "--runs-dir", str(clean_runs), "--run-id", "f", "--no-report"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    clean = read_events(clean_runs / "f")

    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    driver = subprocess.Popen(CLI + ["run", str(spec_dir), "--runs-dir", str(runs), "--run-id", "f", "--no-report"],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    killer = WorkerKiller(driver.pid, seed=1)
    killer.start()
    try:
        deadline = time.monotonic() + 120
        while count_events(runs / "f" / "ledger.sqlite", "episodes_evaluated") < 12 or killer.kills < 3:
            assert driver.poll() is None, f"run ended before the driver kill: {(tmp_path / 'run.log').read_text()}"
            assert time.monotonic() < deadline, "too few evaluations within 120 s"
            time.sleep(0.02)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
    finally:
        kills_first = killer.stop()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()
    before = read_events(runs / "f")
    assert project(before).status == "interrupted"

    resumer = subprocess.Popen(CLI + ["resume", "f", "--runs-dir", str(runs), "--no-report"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    killer = WorkerKiller(resumer.pid, seed=2)
    killer.start()
    try:
        _out, err = resumer.communicate(timeout=300)
    finally:
        kills_second = killer.stop()
    assert resumer.returncode == 0, err
    assert kills_first >= 3 and kills_second >= 1, (kills_first, kills_second)
    print(f"worker kills: {kills_first} before the driver kill, {kills_second} during resume")

    after = read_events(runs / "f")
    assert project(after).status == "finished"
    keys = [e.key for e in events_of(after, EventType.EPISODES_EVALUATED)]
    assert len(keys) == len(set(keys))  # each evaluation exactly once
    # nothing lost and nothing charged to a candidate for a worker that was killed from outside:
    # the evaluations are exactly those of the undisturbed run, episode for episode
    assert _evaluations(after) == _evaluations(clean)
    assert project(after).incumbent_id == project(clean).incumbent_id
