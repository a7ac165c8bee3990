"""Hostile policies are contained by the sandboxed executor: each is that candidate's failure with a
clear reason, the other candidates' episodes are unaffected, and the host is untouched."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest
from conftest import DATA, candidate_of, good_candidate

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox, SandboxError, isolation
from ratchet.policy import load_policy
from ratchet.task import GymTask

SEEDS = [1, 2, 3]
TIMEOUT_S = 3.0
needs_bwrap = pytest.mark.skipif(isolation() != "bwrap", reason="needs bubblewrap (apt-get install bubblewrap)")


def hostile(name: str, params: dict[str, float] | None = None):
    return load_policy(DATA / "hostile" / f"{name}.py").candidate(params)


@pytest.fixture(scope="module")
def sandboxed(request):
    os.environ["RATCHET_TEST_API_KEY"] = "sk-test-do-not-leak"  # set before workers start
    ex = ProcessExecutor(workers=2, episode_timeout_s=TIMEOUT_S, sandbox=Sandbox(memory_limit_mb=2048))
    request.addfinalizer(ex.close)
    yield ex
    os.environ.pop("RATCHET_TEST_API_KEY", None)


@pytest.fixture(scope="module")
def reference(sandboxed):
    """The good candidate's episodes on a clean run."""
    return [e.to_dict() for e in sandboxed.run(GymTask("CartPole-v1"), [Job(good_candidate(), s) for s in SEEDS])]


def _run_beside_good(ex, bad, reference):
    """Run the hostile candidate between two copies of a good one; the good ones must be unaffected."""
    good = good_candidate()
    jobs = [Job(good, s) for s in SEEDS] + [Job(bad, s) for s in SEEDS] + [Job(good, s) for s in SEEDS]
    eps = ex.run(GymTask("CartPole-v1"), jobs)
    assert [e.to_dict() for e in eps[:3]] == reference
    assert [e.to_dict() for e in eps[6:]] == reference
    bad_eps = eps[3:6]
    assert all(e.error for e in bad_eps), [e.error for e in bad_eps]
    assert all(e.success is False and not e.terminated and not e.truncated for e in bad_eps)
    return bad_eps


def _processes() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


def test_raising_policy_is_recorded(sandboxed, reference):
    eps = _run_beside_good(sandboxed, candidate_of("policy_raises.py"), reference)
    assert "ZeroDivisionError: policy bug on purpose" in eps[0].error


def test_nan_action_is_recorded(sandboxed, reference):
    eps = _run_beside_good(sandboxed, candidate_of("policy_nan.py"), reference)
    assert "non-finite" in eps[0].error


def test_infinite_loop_is_killed_by_the_timeout(sandboxed, reference):
    t0 = time.monotonic()
    eps = _run_beside_good(sandboxed, hostile("loops_forever"), reference)
    # the first episode's timeout, then its lockstep batch's others run again alone (the hang was the first one's
    # own) on the 2 workers at once, each timing out, until the candidate has failed twice; the rest are skipped
    assert all(e.error.startswith(("skipped: timeout", f"timeout after {TIMEOUT_S:g} s")) for e in eps)
    assert 1 <= sum(e.error.startswith("timeout") for e in eps) <= 3
    assert time.monotonic() - t0 < 4 * TIMEOUT_S + 30


def test_10_gb_allocation_hits_the_memory_limit(sandboxed, reference):
    eps = _run_beside_good(sandboxed, hostile("allocates_10gb"), reference)
    assert "MemoryError" in eps[0].error


def test_fork_bomb_is_bounded_and_cleaned_up(sandboxed, reference):
    before = _processes()
    eps = _run_beside_good(sandboxed, hostile("fork_bomb"), reference)
    assert "BlockingIOError" in eps[0].error or "left" in eps[0].error, eps[0].error
    deadline = time.monotonic() + 10
    while _processes() > before + 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes() <= before + 5  # the forks are gone from the host


@needs_bwrap
def test_socket_to_host_loopback_is_refused(sandboxed, reference):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        port = server.getsockname()[1]
        eps = _run_beside_good(sandboxed, hostile("opens_socket", {"port": float(port)}), reference)
        assert any(w in eps[0].error for w in ("ConnectionRefused", "unreachable", "timed out")), eps[0].error
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected
    finally:
        server.close()


def test_environment_secrets_never_reach_policy_code(sandboxed, reference):
    assert os.environ["RATCHET_TEST_API_KEY"]
    eps = _run_beside_good(sandboxed, hostile("reads_secret"), reference)
    assert "leaked {}" in eps[0].error
    assert "sk-test-do-not-leak" not in eps[0].error


@needs_bwrap
def test_writes_outside_the_worker_directory_fail(sandboxed, reference):
    tag = uuid.uuid4().int % 10**9
    target = f"/tmp/ratchet-escape-{tag}"
    eps = _run_beside_good(sandboxed, hostile("writes_outside", {"tag": float(tag)}), reference)
    assert "Read-only file system" in eps[0].error
    assert not os.path.exists(target)


def test_segfault_is_recorded_and_the_worker_replaced(sandboxed, reference):
    eps = _run_beside_good(sandboxed, candidate_of("policy_segfault.py"), reference)
    assert "worker died (killed by SIGSEGV" in eps[0].error


def test_workers_start_in_a_fresh_directory_with_a_scrubbed_environment(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nPARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}\n\n\n'
                     "def act(observation, params):\n"
                     "    raise RuntimeError(f\"cwd={os.getcwd()} files={os.listdir('.')} "
                     "env={sorted(os.environ)}\")\n")
    os.environ["RATCHET_TEST_TOKEN"] = "tok"
    try:
        with ProcessExecutor(workers=1, episode_timeout_s=30) as ex:
            (ep,) = ex.run(GymTask("CartPole-v1"), [Job(load_policy(probe).candidate(), 0)])
    finally:
        del os.environ["RATCHET_TEST_TOKEN"]
    assert "cwd=/tmp/ratchet-worker-" in ep.error or "cwd=" + os.path.realpath("/tmp") in ep.error
    assert "/candidate-1 files=[]" in ep.error  # a fresh, empty folder of this candidate's own, inside the worker's
    assert "RATCHET_TEST_TOKEN" not in ep.error and "HOME" in ep.error


def test_require_isolation_refuses_when_none_is_available(monkeypatch):
    isolation.cache_clear()
    monkeypatch.setenv("RATCHET_FORCE_ISOLATION", "none")
    try:
        with pytest.raises(SandboxError, match="require_isolation"):
            ProcessExecutor(workers=1, sandbox=Sandbox(require_isolation=True))
        with pytest.raises(SandboxError, match="conflicts"):
            ProcessExecutor(workers=1, sandbox=Sandbox(enabled=False, require_isolation=True))
    finally:
        monkeypatch.delenv("RATCHET_FORCE_ISOLATION")
        isolation.cache_clear()


def test_missing_isolation_is_said_once(monkeypatch, capsys):
    from ratchet.execution import sandbox as sandbox_module

    isolation.cache_clear()
    monkeypatch.setenv("RATCHET_FORCE_ISOLATION", "none")
    monkeypatch.setattr(sandbox_module, "_warned", set())
    try:
        Sandbox().check()
        Sandbox().check()
    finally:
        monkeypatch.delenv("RATCHET_FORCE_ISOLATION")
        isolation.cache_clear()
    err = capsys.readouterr().err
    assert err.count("ratchet: warning: policy code runs with the host's network") == 1
    assert "apt-get install bubblewrap" in err


@pytest.mark.parametrize("level", ["netns", "none"])
def test_fallback_isolation_levels_still_run_and_limit(monkeypatch, level, reference):
    """Without bubblewrap: a network namespace through unshare(2) (where allowed), else limits only."""
    isolation.cache_clear()
    monkeypatch.setenv("RATCHET_FORCE_ISOLATION", level)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        with ProcessExecutor(workers=1, episode_timeout_s=TIMEOUT_S) as ex:
            _run_beside_good(ex, hostile("allocates_10gb"), reference)
            sock = hostile("opens_socket", {"port": float(server.getsockname()[1])})
            (ep,) = ex.run(GymTask("CartPole-v1"), [Job(sock, 1)])
        server.setblocking(False)
        if level == "netns":
            assert ep.error and "unreachable" in ep.error  # a new namespace has no loopback up
            with pytest.raises(BlockingIOError):
                server.accept()
        else:
            server.accept()[0].close()  # it got through: ratchet warned (once) that it cannot stop this
    finally:
        server.close()
        monkeypatch.delenv("RATCHET_FORCE_ISOLATION")
        isolation.cache_clear()


@needs_bwrap
def test_files_in_the_callers_home_are_out_of_reach(sandboxed, reference):
    """~/.pgpass, ~/.ssh, cloud credentials: the home directory is replaced by an empty one, and as root
    policy code runs as nobody (root would read any root-owned file, and ignores RLIMIT_NPROC)."""
    home = os.path.realpath(os.path.expanduser("~"))
    if not (home == "/root" or home.startswith("/home/")):
        pytest.skip("the hostile policy looks in /root and /home/*")
    secret = os.path.join(home, f".ratchet-secret-{uuid.uuid4().hex}")
    with open(secret, "w") as f:
        f.write("hunter2")
    os.chmod(secret, 0o600)
    try:
        eps = _run_beside_good(sandboxed, hostile("reads_home_secret"), reference)
    finally:
        os.remove(secret)
    assert "found {}" in eps[0].error and "hunter2" not in eps[0].error
    if Sandbox().drop_to_uid() is not None:  # root, and nobody can read the installation
        assert "uid 65534" in eps[0].error


@pytest.mark.parametrize("mode, reason", [(0, "not JSON"), (1, "not JSON"), (2, "a reply of 2147483632 bytes"),
                                          (3, "a reply that stalled")])
def test_forged_messages_to_the_parent_are_contained(monkeypatch, reference, mode, reason):
    """Without trusted rollouts, policy code can write anything to its worker's socket: the parent never
    unpickles it (a pickle runs code), bounds its size, and does not wait forever for a message that
    never completes."""
    from ratchet.execution import process

    monkeypatch.setattr(process, "_REPLY_TIMEOUT_S", 2.0)
    tag = uuid.uuid4().int % 10**9
    with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(trusted_rollouts=False)) as ex:
        eps = _run_beside_good(ex, hostile("forges_replies", {"mode": float(mode), "tag": float(tag)}), reference)
    assert reason in eps[0].error and "interfered" in eps[0].error, eps[0].error
    assert not os.path.exists(f"/tmp/ratchet-pwned-{tag}")


@pytest.mark.parametrize("lockstep", [1, 32])
@pytest.mark.parametrize("mode, reason", [(0, "undecodable action"), (1, "undecodable action"),
                                          (2, "a message of 2,147,483,632 bytes"), (3, "timeout after 3 s")])
def test_forged_messages_to_the_env_host_are_contained(reference, mode, reason, lockstep):
    """With trusted rollouts the policy process holds only its pipes to the env host: whatever it writes
    there is decoded without unpickling, size-capped, and a message that never completes is a hang that
    the episode timeout ends (with the env steps taken so far) — one episode at a time or in lockstep."""
    tag = uuid.uuid4().int % 10**9
    if lockstep > 1 and mode < 2:  # a forged message arrives where the round's actions are awaited
        reason = "unexpected reply (waiting for actions)"
    with ProcessExecutor(workers=1, episode_timeout_s=3, lockstep=lockstep) as ex:
        eps = _run_beside_good(ex, hostile("forges_replies", {"mode": float(mode), "tag": float(tag)}), reference)
    assert reason in eps[0].error, eps[0].error
    assert mode == 3 or "interfered" in eps[0].error
    assert not os.path.exists(f"/tmp/ratchet-pwned-{tag}")


def test_a_policy_flooding_stderr_cannot_fill_the_disk(reference):
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        eps = ex.run(GymTask("CartPole-v1"), [Job(hostile("floods_stderr"), s) for s in range(5)]
                     + [Job(good_candidate(), s) for s in SEEDS])
        log = ex._workers[0].log_path
        assert os.path.getsize(log) < 16 * 2**20  # 50 MB were written
    assert all(e.error is None for e in eps)  # writing to stderr is allowed, just not kept
    assert [e.to_dict() for e in eps[5:]] == reference


def test_leftovers_of_killed_runs_are_swept(tmp_path, monkeypatch):
    """kill -9 gives a run no chance to remove its workers' directories; the next executor does it."""
    import subprocess
    import sys
    import tempfile

    from ratchet.execution.sandbox import sweep_leftovers

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
        stale, live = tmp_path / f"ratchet-worker-{dead}-abc", tmp_path / f"ratchet-worker-{os.getpid()}-abc"
        stale.mkdir()
        (stale / "worker.log").write_text("x")
        live.mkdir()
        assert sweep_leftovers() >= 1
        assert not stale.exists() and live.exists()
    finally:
        tempfile.tempdir = None


def test_policy_code_stays_root_without_capabilities_when_nobody_could_not_read_the_install(monkeypatch):
    """A checkout inside a 0700 folder (mktemp -d) is unreadable to nobody: dropping to nobody would break
    every import, so the worker stays root (capabilities dropped, home hidden) and ratchet says so."""
    import shutil
    import tempfile
    from pathlib import Path

    from ratchet.execution import sandbox as sandbox_module

    tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own tmp folders are 0700
    try:
        _check_readability(sandbox_module, tmp_path, monkeypatch)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _check_readability(sandbox_module, tmp_path, monkeypatch):
    private = tmp_path / "private"
    (private / "site").mkdir(parents=True)
    private.chmod(0o700)
    (tmp_path / "open" / "site").mkdir(parents=True)
    for d in (tmp_path, tmp_path / "open", tmp_path / "open" / "site"):
        d.chmod(0o755)
    assert sandbox_module._readable_by_others([str(tmp_path / "open" / "site")], None) is None
    assert sandbox_module._readable_by_others([str(private / "site")], None) == str(private)
    # folders inside the hidden home are recreated 0755, so they do not count
    assert sandbox_module._readable_by_others([str(private / "site")], str(private)) is None
    if os.geteuid() == 0 and isolation() == "bwrap":
        monkeypatch.setattr(sandbox_module, "_python_paths", lambda: [str(private / "site")])
        monkeypatch.setattr(sandbox_module, "_private_home", lambda: None)
        monkeypatch.setattr(sandbox_module, "_warned", set())
        assert Sandbox().drop_to_uid() is None
        Sandbox().check()


def test_trusted_rollouts_stop_a_policy_forging_its_return():
    """A policy that patches the env it runs beside forges its return when policy and env share a
    process; with trusted rollouts (the default) the env is out of its reach and the return is honest."""
    task, jobs = GymTask("CartPole-v1"), [Job(hostile("forges_return"), s) for s in SEEDS]
    with ProcessExecutor(workers=1, sandbox=Sandbox(trusted_rollouts=False)) as ex:
        forged = ex.run(task, jobs)
    with ProcessExecutor(workers=1) as ex:
        honest = ex.run(task, jobs)
    assert all(e.episode_return >= 1000 for e in forged)  # what the old design let through
    assert all(e.error is None and e.episode_return == e.length and e.length < 50 for e in honest)
    assert all(e.terminated for e in honest)  # always pushing left, the pole falls


def test_a_timed_out_episode_counts_its_true_env_steps():
    """The env host ends a hanging episode at the timeout and reports the env steps it took."""
    with ProcessExecutor(workers=1, episode_timeout_s=2) as ex:
        eps = ex.run(GymTask("CartPole-v1"), [Job(hostile("hangs_after_steps"), 1), Job(good_candidate(), 2)])
    assert "timeout after 2 s" in eps[0].error and eps[0].length == 40 and eps[0].episode_return == 40.0
    assert eps[1].error is None and eps[1].length == 500


@pytest.mark.parametrize("trusted", [False, True])
def test_a_candidate_cannot_sabotage_later_candidates_on_its_worker(reference, trusted):
    """Candidates share workers; with trusted rollouts each runs in a process forked from a zygote that
    never ran policy code, so a policy that patches the worker's modules affects only itself."""
    good = good_candidate()
    jobs = [Job(hostile("sabotages_later_candidates"), 1)] + [Job(good, s) for s in SEEDS]
    with ProcessExecutor(workers=1, sandbox=Sandbox(trusted_rollouts=trusted)) as ex:
        eps = ex.run(GymTask("CartPole-v1"), jobs)
    after = [e.to_dict() for e in eps[1:]]
    if trusted:
        assert after == reference
    else:  # what the old design let through: the good candidate's pole falls
        assert all(e["episode_return"] < 100 for e in after)


@pytest.fixture
def root_secret():
    """A root-only file at /tmp/ratchet-secret-<tag>; yields (tag, content)."""
    tag = uuid.uuid4().int % 10**9
    path = f"/tmp/ratchet-secret-{tag}"
    content = f"hunter2-{uuid.uuid4().hex}"
    with open(path, "w") as f:
        f.write(content)
    os.chmod(path, 0o600)
    yield tag, content
    os.remove(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [0, 1, 2, 3],
                         ids=["symlink-to-secret", "symlink-to-environ", "fifo", "dev-zero"])
def test_the_driver_never_follows_what_a_policy_plants_as_its_log(root_secret, mode, reference):
    """A dying worker's last log line is quoted in the failure reason; a policy that swapped the log
    for a link to a secret, a FIFO or /dev/zero gets no secret out, no hang and no memory blow-up. (With
    policy and env in one process: a trusted rollout's policy process under bubblewrap cannot reach its log.)"""
    tag, content = root_secret
    os.environ["RATCHET_TEST_API_KEY"] = "sk-test-do-not-leak"
    try:
        with ProcessExecutor(workers=1, episode_timeout_s=20, sandbox=Sandbox(trusted_rollouts=False)) as ex:
            eps = _run_beside_good(ex, hostile("plants_in_workdir", {"mode": float(mode), "tag": float(tag)}),
                                   reference)
    finally:
        os.environ.pop("RATCHET_TEST_API_KEY", None)
    assert "worker died (exit code 1" in eps[0].error, eps[0].error
    assert content not in eps[0].error and "sk-test" not in eps[0].error and "PATH=" not in eps[0].error


@needs_bwrap
@pytest.mark.parametrize("trusted", [False, True])
def test_a_render_left_as_a_symlink_is_refused(root_secret, tmp_path, trusted):
    """``replay --video`` copies the render out of the folder of the process that rendered it. With
    policy and env in one process a link planted there (to a private key, say) is refused, never moved
    out nor followed; with trusted rollouts the env host renders in a folder policy code cannot write."""
    tag, content = root_secret
    out = tmp_path / "out.gif"
    with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(trusted_rollouts=trusted)) as ex:
        ep = ex.run(GymTask("CartPole-v1"), [Job(hostile("fakes_render", {"tag": float(tag)}), 1)],
                    render_paths=[str(out)])[0]
    if trusted:
        assert ep.error is None and not out.is_symlink() and out.read_bytes()[:4] == b"GIF8"
        assert content.encode() not in out.read_bytes()
        return
    assert ep.error is not None and "symbolic link" in ep.error, ep.error
    assert not os.path.lexists(out)
    assert content not in ep.error


@pytest.mark.parametrize("mode, reason", [(0, "episode_return out of range"), (1, "error of type int"),
                                          (2, "length -1000000000000000000 (expected an int in 0..500)"),
                                          (3, "bytes of diagnostics")])
def test_forged_well_formed_replies_are_validated(reference, mode, reason):
    """With policy and env in one process (``trusted_rollouts = false``), policy code that walks up its
    stack to the job and writes a well-formed JSON reply with wrong values (a return no float holds, a
    non-text error, a negative length, 15 MiB of diagnostics) fails its candidate with a reason; the
    driver neither crashes nor records the values. (With trusted rollouts it cannot reach the driver.)"""
    with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(trusted_rollouts=False)) as ex:
        eps = _run_beside_good(ex, hostile("forges_episodes", {"mode": float(mode)}), reference)
    assert all(isinstance(e.error, str) and e.length == 0 for e in eps)
    assert reason in eps[0].error and "interfered" in eps[0].error, eps[0].error
    assert len(eps[0].error) < 600


@needs_bwrap
def test_policy_code_cannot_read_other_runs(reference):
    """Run directories are 0700 (policy code runs as nobody when ratchet is root) and, under bubblewrap,
    hidden from workers (they see an empty folder where the runs folder is)."""
    import shutil
    from pathlib import Path

    from ratchet.loop import lock_run_dir

    tag = uuid.uuid4().int % 10**9
    runs = Path(f"/tmp/ratchet-runs-{tag}")
    other = runs / "other-run"
    other.mkdir(parents=True)
    try:
        (other / "ledger.sqlite").write_text("ledger-secret")
        os.close(lock_run_dir(other))  # what start_run and resume_run do to a run directory
        mode = other.stat().st_mode & 0o777
        with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
            eps = _run_beside_good(ex, hostile("reads_other_runs", {"tag": float(tag)}), reference)
    finally:
        shutil.rmtree(runs)
    assert "ledger-secret" not in eps[0].error and "'.lock'" not in eps[0].error, eps[0].error
    assert mode == 0o700


def test_forged_replies_cannot_reach_the_driver_with_trusted_rollouts(reference):
    """The same forger under trusted rollouts finds no job on its stack and no socket to the driver:
    its episodes fail as its own errors, and nothing it would have forged is recorded."""
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        eps = _run_beside_good(ex, hostile("forges_episodes", {"mode": 0.0}), reference)
    assert all(e.error.startswith("policy raised RuntimeError: no job on the stack") for e in eps), eps[0].error
    assert all(e.episode_return == 0.0 and e.length == 0 for e in eps)


@needs_bwrap
@pytest.mark.timeout(120)
def test_a_candidate_leaves_no_files_for_the_next_on_its_worker(reference):
    """Each candidate of a worker gets a fresh folder: what one wrote in its folder, the worker's folder above it
    (``..``), ``/dev/shm`` or its home is gone before the next candidate starts on the same worker."""
    planter = hostile("leaves_files", {"mode": 0.0, "mb": 2.0})
    looker = hostile("leaves_files", {"mode": 1.0, "mb": 0.0})
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        eps = ex.run(GymTask("CartPole-v1"), [Job(planter, s) for s in SEEDS] + [Job(looker, 1)]
                     + [Job(good_candidate(), s) for s in SEEDS])
    assert all(e.error is None for e in eps[:3]), eps[0].error  # writing in its own folder is allowed
    assert "seen=[]" in eps[3].error and "here=[]" in eps[3].error, eps[3].error
    assert "PLANTED" not in eps[3].error and "big-" not in eps[3].error, eps[3].error
    assert "worker.log" not in eps[3].error  # the log the driver reads is out of its reach
    assert [e.to_dict() for e in eps[4:]] == reference


@needs_bwrap
@pytest.mark.timeout(120)
def test_what_a_candidate_writes_is_bounded_in_all(reference):
    """A candidate that writes more than ``disk_limit_mb`` in all (in files each far under the file-size limit)
    fails with the disk full, as its own failure; the candidates after it on the worker run as ever."""
    good = good_candidate()
    with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(disk_limit_mb=4)) as ex:
        eps = ex.run(GymTask("CartPole-v1"), [Job(hostile("leaves_files", {"mode": 0.0, "mb": 8.0}), 1)]
                     + [Job(good, s) for s in SEEDS])
    assert eps[0].error.startswith("policy raised OSError") and "No space left on device" in eps[0].error, eps[0].error
    assert [e.to_dict() for e in eps[1:]] == reference



def test_the_attempts_of_a_policy_that_dies_on_each_count_in_the_budget(tmp_path):
    """A policy process that dies mid-episode is run again on a fresh worker (``death_retries``): when it dies on
    every attempt (on purpose, as ``os._exit`` can), the steps the env host counted in each attempt were taken, so
    the episode's ``env_steps`` (what the run's budget adds up) counts them all; a worker's reply cannot claim them.
    (A retry that succeeds leaves no trace: ``test_worker_killed_from_outside_is_retried_without_trace``.)"""
    from ratchet.critic import Evaluation

    dies = tmp_path / "dies.py"
    dies.write_text('import os\nPARAMETERS = {"w": {"default": 0.0, "low": -1.0, "high": 1.0}}\n'
                    "_steps = [0]\n\n\n"
                    "def act(observation, params):\n"
                    "    _steps[0] += 1\n"
                    "    if _steps[0] == 30:\n"
                    "        os._exit(3)\n"
                    "    return int(observation[2] + observation[3] > 0)\n")
    with ProcessExecutor(workers=1, episode_timeout_s=30, death_retries=2) as ex:
        (ep,) = ex.run(GymTask("CartPole-v1"), [Job(load_policy(dies).candidate(), 0)])
    assert ep.error is not None and "died" in ep.error
    assert 25 <= ep.length <= 30  # the last attempt's steps before the death
    assert ep.diagnostics["lost_env_steps"] == 2 * ep.length  # the two attempts before it died at the same step
    assert Evaluation("c", "train", (ep,)).env_steps == 3 * ep.length
