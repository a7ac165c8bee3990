"""Shared fixtures and helpers for the ratchet test suite.

Everything here is offline and deterministic: CartPole-v1, small budgets, seeded runs. Expensive
things (worker pools, one finished refinement run) are session-scoped so the whole suite stays fast.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

# pytest-xdist's workers export COLUMNS=80, and a Rich console created at import time keeps it: let each
# test's own environment (CliRunner(env={"COLUMNS": ...})) decide the width, as in a serial run
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.ledger import Event, EventType, SQLiteLedger
from ratchet.ledger.projection import project
from ratchet.loop import LEDGER_FILE, start_run
from ratchet.policy import Candidate, load_policy
from ratchet.refiners import standin as standin_module
from ratchet.rollout import Episode
from ratchet.spec import load_spec
from ratchet.task import GymTask

DATA = Path(__file__).parent / "data"

#: Weights of the fixture's linear CartPole policy that balance the pole for all 500 steps.
GOOD_WEIGHTS = {"w_position": 0.1, "w_velocity": 0.5, "w_angle": 1.0, "w_angular_velocity": 0.5}


@pytest.fixture
def data_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/data/envs (``ratchet_test_envs:...`` env ids) importable here and in the workers this test starts (their
    env hosts make the envs): on ``sys.path`` and in front of ``PYTHONPATH``."""
    envs = str(DATA / "envs")
    monkeypatch.syspath_prepend(envs)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (envs, os.environ.get("PYTHONPATH")) if p))


def data_source(name: str) -> str:
    """Text of a policy fixture in tests/data."""
    return (DATA / name).read_text(encoding="utf-8")


def candidate_of(name: str, params: dict[str, float] | None = None) -> Candidate:
    """A candidate of a tests/data policy file (defaults when ``params`` is None)."""
    return load_policy(DATA / name).candidate(params)


def good_candidate() -> Candidate:
    return candidate_of("cartpole_linear.py", GOOD_WEIGHTS)


def zero_candidate() -> Candidate:
    return candidate_of("cartpole_linear.py")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def dump_toml(data: dict[str, Any]) -> str:
    """Tiny TOML writer for spec dicts (top-level scalars, then one table per section)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if isinstance(table, dict):
            lines.append(f"\n[{section}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def base_spec_dict() -> dict[str, Any]:
    """The spec in tests/data/cartpole.toml, as a dict."""
    return tomllib.loads((DATA / "cartpole.toml").read_text(encoding="utf-8"))


def make_spec_dir(directory: Path, policy: str = "cartpole_linear.py", **sections: dict[str, Any]) -> Path:
    """Write ``directory/ratchet.toml`` (tests/data/cartpole.toml updated with ``sections``) and
    ``directory/policy.py`` (a copy of a tests/data policy). Returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = base_spec_dict()
    for name, values in sections.items():
        if isinstance(values, dict):
            spec.setdefault(name, {}).update(values)
        else:
            spec[name] = values
    (directory / "ratchet.toml").write_text(dump_toml(spec), encoding="utf-8")
    shutil.copy(DATA / policy, directory / "policy.py")
    return directory


def read_events(run_dir: Path) -> list[Event]:
    """All events of a run directory's ledger."""
    ledger = SQLiteLedger(Path(run_dir) / LEDGER_FILE, create=False)
    try:
        return ledger.read()
    finally:
        ledger.close()


def events_of(events: list[Event], type: EventType) -> list[Event]:
    return [e for e in events if e.type is type]


def incumbent_test_episode(run_dir: Path) -> tuple[Any, list[dict[str, Any]]]:
    """``(state, episodes)``: a finished run's state and its incumbent's test episodes (what ``ratchet replay
    --seed`` replays by default). The incumbent's and the start's test evaluations are recorded in the order they
    complete, which the executor's scheduling decides: never take the first test evaluation for the incumbent's."""
    events = read_events(run_dir)
    st = project(events)
    for e in events_of(events, EventType.EPISODES_EVALUATED):
        if e.payload["candidate_id"] == st.incumbent_id and e.payload["split"] == "test":
            return st, e.payload["episodes"]
    raise AssertionError("no test evaluation of the incumbent")


def count_events(db_path: Path, type: str) -> int:
    """Count events of ``type`` in a ledger another process may be writing (0 while it is being created)."""
    if not db_path.is_file():
        return 0
    try:
        con = sqlite3.connect(str(db_path), timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM events WHERE type = ?", (type,)).fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


_VOLATILE = {"pid", "host", "wall_clock_s", "run_id", "versions", "policy_path", "events_before",
             "execution"}  # where episodes ran (pool size, backend) does not change what a run records


def normalized(events: list[Event]) -> list[tuple[str, str, Any]]:
    """Events without timestamps, pids, wall-clock and run ids: what two identical runs share."""

    def strip(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in _VOLATILE}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return [(e.type.value, e.key, strip(e.payload)) for e in events]


class LastFirst(ProcessExecutor):
    """Runs each call's jobs last given first and reports them so, as a schedule may (a candidate partly sent goes
    behind one with more work queued): a call's candidates complete in the reverse of the order given."""

    def run(self, task, jobs, on_episode=None, render_paths=None, **kw):
        n = len(jobs)
        back = None if on_episode is None else (lambda i, ep: on_episode(n - 1 - i, ep))
        paths = None if render_paths is None else list(reversed(render_paths))
        return list(reversed(super().run(task, list(reversed(jobs)), back, paths, **kw)))


def keyed_and_proposed(run_dir: Path) -> tuple[dict[str, tuple[str, Any]], list[str]]:
    """A run's :func:`normalized` events by key (an ``llm_call``'s without its ``seconds``; ``run_started`` left out)
    and the keys of its proposals and rejections in ledger order: what two runs whose answers came at different
    times must share."""
    events = normalized(read_events(run_dir))
    by_key = {key: (t, {k: v for k, v in p.items() if k != "seconds"} if t == EventType.LLM_CALL.value else p)
              for t, key, p in events if t != EventType.RUN_STARTED.value}
    in_order = [key for t, key, _ in events if t in (EventType.CANDIDATE_PROPOSED.value,
                                                      EventType.PROPOSAL_REJECTED.value)]
    return by_key, in_order


def comparable(events: list[Event]) -> dict[str, tuple[str, Any]]:
    """A run's events by key, without what differs between sessions (times, pids, resume markers, how long
    a training job took): what a resumed run shares with one that was never interrupted."""
    out = {}
    for t, key, payload in normalized([e for e in events if e.type is not EventType.RUN_RESUMED]):
        if t == EventType.TRAINING_FINISHED.value:
            payload = {k: v for k, v in payload.items() if k != "seconds"}
        out[key] = (t, payload)
    return out


class SimulatedKill(BaseException):
    """Stands in for kill -9: not an Exception, so the loop records no run_failed event."""


class RecordingExecutor:
    """Wraps a real executor; records every job it runs and can 'die' after N episodes."""

    def __init__(self, inner, die_after: int | None = None, max_calls: int | None = None) -> None:
        self.inner, self.die_after, self.max_calls = inner, die_after, max_calls
        self.jobs: list[tuple[str, int]] = []
        self.calls = 0
        self.episodes = 0

    @property
    def capabilities(self):
        return self.inner.capabilities

    def train(self, task, job, timeout_s=3600.0):
        return self.inner.train(task, job, timeout_s)

    def run(self, task, jobs: Sequence[Job], on_episode: Callable[[int, Episode], None] | None = None, **kw):
        self.calls += 1
        if self.max_calls is not None and self.calls > self.max_calls:
            raise SimulatedKill(f"runaway: {self.calls} executor calls")
        self.jobs += [(j.candidate.id, j.seed) for j in jobs]

        def cb(i: int, ep: Episode) -> None:
            if on_episode is not None:
                on_episode(i, ep)
            self.episodes += 1
            if self.die_after is not None and self.episodes >= self.die_after:
                raise SimulatedKill("killed")

        return self.inner.run(task, jobs, cb, **kw)

    def describe(self) -> dict:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


# -- PostgreSQL (opt-in: set RATCHET_TEST_POSTGRES_URL) ---------------------------------------------

POSTGRES_ENV = "RATCHET_TEST_POSTGRES_URL"
#: Prefix of every run id the tests write to a shared database (deleted again at the end of the session).
RUN_PREFIX = f"test{uuid.uuid4().hex[:6]}"


def unique_run_id(name: str) -> str:
    """A run id no other test (or earlier test session on the same database) uses."""
    return f"{RUN_PREFIX}-{name}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a PostgreSQL database the tests may write to; the test is skipped when none is given."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"needs PostgreSQL: set {POSTGRES_ENV}=postgresql://USER:PASSWORD@HOST:PORT/DB, or run the tests "
                    "under scripts/test-postgres.sh (starts a throwaway server and sets it)")
    yield url
    from sqlalchemy import create_engine, text

    from ratchet.ledger.sql import TABLE, database_url

    engine = create_engine(database_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {TABLE} WHERE run_id LIKE :p"), {"p": f"{RUN_PREFIX}-%"})
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_storage(request, tmp_path: Path) -> str:
    """A database URL for ``--storage``: a SQLite file, then PostgreSQL (skipped without one)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared' / 'ledgers.db'}"
    return request.getfixturevalue("postgres_url")


def interrupted_run(tmp_path: Path, storage: str | None, name: str, die_after: int = 15) -> str:
    """Start a small CartPole run in ``tmp_path/runs`` with ``storage`` and 'kill' it after ``die_after``
    episodes (mid-run, nothing recorded about the kill). Returns its run id."""
    spec = load_spec(make_spec_dir(tmp_path / "s", budget={"env_steps": 60_000, "episodes": 80}, test={"episodes": 5},
                                   gate={"validation_episodes": 5}, execution={"workers": 1}))
    run_id = unique_run_id(name)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", run_id, storage=storage,
                  executor=RecordingExecutor(ProcessExecutor(workers=1), die_after=die_after))
    return run_id


def killed_run(monkeypatch: pytest.MonkeyPatch, owner: type, name: str, dying: Any, spec: Any, runs: Path,
               run_id: str, executor: Any) -> Path:
    """Start ``spec``'s run with ``owner.name`` replaced by ``dying`` (which raises :class:`SimulatedKill` at the
    moment the test kills the run, like kill -9: nothing recorded about it), then put the original back. Returns the
    run directory, ready to resume."""
    original = owner.__dict__[name]
    monkeypatch.setattr(owner, name, dying)
    with pytest.raises(SimulatedKill):
        start_run(spec, runs, run_id, executor=executor)
    monkeypatch.setattr(owner, name, original)
    return Path(runs) / run_id


def password_to_env(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put a URL's password in PGPASSWORD, as a user whose run directory points to the database would."""
    from sqlalchemy.engine import make_url

    password = make_url(url).password
    if password:
        monkeypatch.setenv("PGPASSWORD", password)


@pytest.fixture(scope="session")
def cartpole_task() -> GymTask:
    return GymTask("CartPole-v1")


@pytest.fixture(scope="session")
def pool() -> ProcessExecutor:
    """A warm two-worker pool shared by tests whose policies cannot break a worker."""
    ex = ProcessExecutor(workers=2, episode_timeout_s=30)
    from ratchet.execution import Job

    ex.run(GymTask("CartPole-v1"), [Job(zero_candidate(), s) for s in (1, 2)])  # boot both workers
    yield ex
    ex.close()


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory):
    """One small, finished CartPole refinement (library ``start_run``), shared read-only by many tests.

    Returns ``(result, run_dir, spec_dir)``.
    """
    root = tmp_path_factory.mktemp("finished")
    spec_dir = make_spec_dir(root / "spec")
    spec = load_spec(spec_dir)
    result = start_run(spec, root / "runs", "cp-ref")
    return result, root / "runs" / "cp-ref", spec_dir


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory: pytest.TempPathFactory):
    """The same spec as ``finished_run``, run through ``ratchet run`` (CliRunner).

    Returns ``(click_result, run_dir)``.
    """
    from typer.testing import CliRunner

    from ratchet.cli import app

    root = tmp_path_factory.mktemp("cli")
    spec_dir = make_spec_dir(root / "spec")
    res = CliRunner().invoke(app, ["run", str(spec_dir), "--runs-dir", str(root / "runs"), "--run-id", "cp-cli"])
    return res, root / "runs" / "cp-cli"


def children_of(pid: int) -> set[int]:
    """The direct children of ``pid`` (all its threads' children), from Linux /proc."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(x) for x in (task / "children").read_text().split()}
        except (OSError, ValueError):
            pass
    return out


def run_then_kill_9(tmp_path: Path, spec_dir: Path, runs: Path, ready: Callable[[set[int]], bool], what: str,
                    timeout_s: float = 240, run_id: str = "k", extra: Sequence[str] = ()) -> set[int]:
    """Start ``ratchet run`` of ``spec_dir`` as ``run_id`` in a process (``extra``: more CLI options), wait until ``ready(pids)`` (``pids``: the
    run's direct children) holds, and ``kill -9`` it. Returns the children it had started (its workers, a
    trainer), which outlive it in their own sessions."""
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "run", str(spec_dir), "--runs-dir", str(runs),
                             "--run-id", run_id, "--no-report", *extra],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    children: set[int] = set()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            kids = children_of(proc.pid)
            children |= kids
            if ready(kids):
                break
            assert proc.poll() is None, f"run ended before it could be killed: {(tmp_path / 'run.log').read_text()}"
            assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
            time.sleep(0.005)
        children |= children_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    return children


# -- a stand-in chat-completions server (LLM refiner tests) -------------------------------------------------

#: An answer that applies to tests/data/cartpole_linear.py: the stand-in's default.
GOOD_EDIT = """Lean into the fall: weigh the pole's angular velocity by a new gain.
<<<<<<< SEARCH
    return 1 if z > 0 else 0
=======
    z = z + params["boost"] * observation[3]
    return 1 if z > 0 else 0
>>>>>>> REPLACE
<<<<<<< SEARCH
PARAMETERS = {
=======
PARAMETERS = {
    "boost": {"default": 0.5, "low": 0.0, "high": 2.0},
>>>>>>> REPLACE
"""


class Listener:
    """A TCP server on 127.0.0.1 that records who connected (and the first bytes each sent), then hangs up: a
    database server nobody should reach. ``port``; ``connections``: the first bytes of each connection."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                con, _ = self.sock.accept()
            except OSError:  # closed
                return
            with con:
                con.settimeout(5)
                try:
                    self.connections.append(con.recv(4096))
                except OSError:
                    self.connections.append(b"")

    def close(self) -> None:
        import socket

        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.sock.close()
        self.thread.join(10)


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


class StandIn(standin_module.StandIn):
    """The library's stand-in endpoint (:class:`ratchet.refiners.standin.StandIn`) on 127.0.0.1, answering
    ``GOOD_EDIT`` where the script and ``default`` give no text (the tests' policy is tests/data/cartpole_linear.py)."""

    def __init__(self, script=(), default=GOOD_EDIT, models=None, latency=0.0, respond=None, gather=0):
        super().__init__(script, default, models, latency, respond, gather, content=GOOD_EDIT)


@pytest.fixture
def standin():
    servers = []

    def make(script=(), default=GOOD_EDIT, models=None, latency=0.0, respond=None, gather=0):
        servers.append(StandIn(script, default, models, latency, respond, gather))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()
