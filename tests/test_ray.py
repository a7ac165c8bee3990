"""ratchet.execution.ray_executor: Ray tasks give the process pool's episodes, exactly once.

One local Ray runtime (2 CPUs, started here, no external cluster) serves the whole file; starting it
takes a few seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path

import pytest
import test_execution as conformance
from conftest import candidate_of, events_of, good_candidate, make_spec_dir, read_events, zero_candidate
from test_loop import RecordingExecutor, SimulatedKill

from ratchet.errors import RatchetError
from ratchet.execution import Job, make_executor, ray_executor
from ratchet.execution.ray_executor import RayExecutor, default_batch_episodes
from ratchet.execution.sandbox import SandboxError
from ratchet.ledger import EventType
from ratchet.loop import resume_run, start_run
from ratchet.policy import load_policy
from ratchet.spec import load_spec
from ratchet.task import GymTask

ray = pytest.importorskip("ray", reason='Ray is not installed (pip install "policy-ratchet[ray]")')

LANDER = Path(__file__).resolve().parents[1] / "examples" / "lunar_lander" / "policy.py"


@pytest.fixture(scope="module")
def ray_runtime():
    """A local Ray with 2 CPUs; executors in this file join it (and so never shut it down). Ray gives its node a fixed
    30 s to start, which a loaded machine can use up: three tries."""
    for attempt in range(3):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
            break
        except Exception as exc:
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            ray.shutdown()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_pool(ray_runtime):
    ex = RayExecutor(episode_timeout_s=30)
    yield ex
    ex.close()


def _dicts(eps):
    return [e.to_dict() for e in eps]


# -- the process pool's conformance checks, on Ray -----------------------------------------------------

@pytest.mark.parametrize("check", [
    conformance.test_empty_job_list,
    conformance.test_same_candidate_and_seed_is_bit_identical,
    conformance.test_on_episode_called_once_per_job,
    conformance.test_terminated_and_truncated_recorded_separately,
    conformance.test_policy_exception_gives_errored_episode,
    conformance.test_policy_failing_to_load,
], ids=lambda f: f.__name__.removeprefix("test_"))
def test_process_pool_conformance_on_ray(check, ray_pool, cartpole_task):
    check(ray_pool, cartpole_task)


def test_task_settings_and_action_mode_reach_ray_workers(ray_pool):
    conformance.test_task_settings_reach_the_worker(ray_pool)
    conformance.test_clip_mode_in_worker(ray_pool)
    conformance.test_invalid_action_gives_errored_episode(ray_pool, "policy_out_of_range.py", "error",
                                                          "outside Discrete range")


# -- bit-identical to the process pool ---------------------------------------------------------------

@pytest.mark.parametrize("batch_episodes", [0, 1, 7])
def test_lunar_lander_returns_bit_identical_to_process_pool(ray_runtime, pool, batch_episodes):
    program = load_policy(LANDER)
    cands = [program.candidate(), program.candidate({**program.candidate().params, "angle_p": 0.8})]
    jobs = [Job(c, s) for c in cands for s in range(100, 110)]
    task = GymTask("LunarLander-v3")
    expected = pool.run(task, jobs)
    with RayExecutor(batch_episodes=batch_episodes, episode_timeout_s=30) as ex:
        got = ex.run(task, jobs)
    assert _dicts(got) == _dicts(expected)  # returns, lengths, terminated/truncated, final observations
    assert all(e.error is None for e in got) and len({e.episode_return for e in got}) == len(jobs)


def test_run_on_ray_records_the_same_evaluations_as_on_the_process_pool(ray_runtime, finished_run, tmp_path):
    ref_result, ref_dir, _ = finished_run  # tests/data/cartpole.toml on the process backend
    spec = load_spec(make_spec_dir(tmp_path / "spec", execution={"backend": "ray"}))
    result = start_run(spec, tmp_path / "runs", "cp-ray")

    assert spec.execution.backend == "ray"
    got, expected = _evaluations(tmp_path / "runs" / "cp-ray"), _evaluations(ref_dir)
    assert got == expected and len(got) > 5
    assert result.test.mean == ref_result.test.mean and result.incumbent.id == ref_result.incumbent.id
    assert ray.is_initialized()  # the run's executor joined this Ray and left it running


def test_run_killed_on_ray_resumes_without_recounting(ray_runtime, finished_run, tmp_path):
    ref_result, ref_dir, spec_dir = finished_run
    runs = tmp_path / "runs"
    with pytest.raises(SimulatedKill):  # raised inside on_episode, mid-evaluation
        start_run(load_spec(spec_dir), runs, "cp-ref", executor=RecordingExecutor(RayExecutor(), die_after=120))
    evaluated = events_of(read_events(runs / "cp-ref"), EventType.EPISODES_EVALUATED)
    recorded = {(e.payload["candidate_id"], s) for e in evaluated for s in e.payload["seeds"]}
    assert recorded
    resumer = RecordingExecutor(RayExecutor())
    result = resume_run("cp-ref", runs, executor=resumer)
    assert not recorded & set(resumer.jobs)  # nothing recorded ran again
    assert _evaluations(runs / "cp-ref") == _evaluations(ref_dir)  # nothing lost, nothing counted twice
    assert result.test.summary() == ref_result.test.summary()


def _evaluations(run_dir):
    """Each recorded evaluation's episodes by ledger key (keys are unique, so none is recorded twice)."""
    events = events_of(read_events(run_dir), EventType.EPISODES_EVALUATED)
    assert len({e.key for e in events}) == len(events)
    return {e.key: e.payload["episodes"] for e in events}


# -- worker death, hangs, crashes --------------------------------------------------------------------

def _kill_a_running_batch(raylet_pid: int, deadline_s: float = 60.0) -> int:
    """SIGKILL a Ray worker process of this runtime that has been running one batch for 0.3 s (a slow
    episode, not one about to finish); returns its pid."""
    end = time.monotonic() + deadline_s
    since: dict[int, float] = {}
    while time.monotonic() < end:
        busy = set()
        for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if title.startswith(b"ray::_run_batch") and ppid == raylet_pid:
                busy.add(pid)
                if time.monotonic() - since.setdefault(pid, time.monotonic()) >= 0.3:
                    os.kill(pid, signal.SIGKILL)
                    return pid
        since = {p: t for p, t in since.items() if p in busy}
        time.sleep(0.05)
    raise AssertionError("no Ray worker ran a batch")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds Ray's worker processes through /proc")
@pytest.mark.parametrize("max_retries", [3, 0])
def test_worker_death_is_retried_and_every_job_reported_once(ray_runtime, pool, cartpole_task, max_retries):
    # cartpole_slow.py episodes last about 2 s, so a batch is still running when its worker is killed
    jobs = [Job(candidate_of("cartpole_slow.py"), s) for s in (1, 2)] + [Job(good_candidate(), s) for s in (1, 2)]
    expected = pool.run(cartpole_task, jobs)
    raylet_pid = ray.get(ray.remote(lambda: os.getppid()).remote())
    calls: list[int] = []
    out: dict[str, list] = {}
    with RayExecutor(batch_episodes=1, episode_timeout_s=30, max_retries=max_retries) as ex:
        runner = threading.Thread(target=lambda: out.setdefault("eps", ex.run(cartpole_task, jobs,
                                                                              lambda i, _: calls.append(i))))
        runner.start()
        _kill_a_running_batch(raylet_pid)
        runner.join(120)
    assert not runner.is_alive()
    eps = out["eps"]
    assert sorted(calls) == list(range(len(jobs)))  # exactly once each
    if max_retries:
        assert _dicts(eps) == _dicts(expected)
    else:  # no retries: the killed batch's job is an errored episode, the others are intact
        failed = [i for i, e in enumerate(eps) if e.error is not None]
        assert len(failed) == 1 and eps[failed[0]].error.startswith("ray task failed after 0 retries: ")
        assert eps[failed[0]].seed == jobs[failed[0]].seed and eps[failed[0]].success is False
        assert [d for i, d in enumerate(_dicts(eps)) if i != failed[0]] == \
               [d for i, d in enumerate(_dicts(expected)) if i != failed[0]]


def test_hanging_and_crashing_policies_fail_only_their_episodes(ray_runtime, pool, cartpole_task):
    others = [Job(good_candidate(), s) for s in (1, 2)] + [Job(zero_candidate(), s) for s in (1, 2, 3)]
    expected = pool.run(cartpole_task, others)
    hang, crash = candidate_of("policy_sleeps.py"), candidate_of("policy_exits.py")
    jobs = [Job(hang, 8), Job(hang, 9)] + others + [Job(crash, 5), Job(crash, 6)]
    with RayExecutor(batch_episodes=5, episode_timeout_s=2.0) as ex:
        eps = ex.run(cartpole_task, jobs)
    # batches [hang, hang, others...] and [..., crash, crash]: within a batch a crashed candidate's other seeds are
    # skipped, as on one worker; a hang is the hanging episode's own, so the lockstep batch's other episode runs
    # again alone (and hangs too)
    assert eps[0].error == "timeout after 2 s on seed 8" and eps[1].error == "timeout after 2 s on seed 9"
    assert eps[-2].error.startswith("worker died (exit code 3) on seed 5")
    assert eps[-1].error.startswith("skipped: worker died")
    assert _dicts(eps[2:-2]) == _dicts(expected)


def test_errors_raised_by_a_batch_task(ray_pool, cartpole_task):
    def failing(exc):
        def body():
            raise exc
        return ray.remote(body).options(max_retries=0).remote()

    (ep,), failed = ray_pool._collect(failing(ValueError("bad\nsecond line")), [7], cartpole_task, deque())
    assert failed == {}  # a task that failed as a whole blames no candidate: its episodes are errored
    assert ep.error == "ray task failed: ValueError: bad" and ep.seed == 7 and ep.success is False
    # ratchet refusing to run policy code on a node (e.g. the sandbox cannot isolate it) stops the run
    with pytest.raises(SandboxError, match="no isolation"):
        ray_pool._collect(failing(SandboxError("no isolation")), [7], cartpole_task, deque())


# -- batching and set-up -----------------------------------------------------------------------------

def test_default_batch_size():
    assert default_batch_episodes(1, 2) == 1 and default_batch_episodes(200, 2) == 25  # 4 tasks per CPU
    assert default_batch_episodes(200, 2, episode_s=0.001) == 100  # ≥ 0.1 s per task, but every CPU busy
    assert default_batch_episodes(200, 2, episode_s=0.02) == 25 and default_batch_episodes(20, 2, 0.02) == 5


def test_make_executor_builds_a_ray_executor(ray_runtime):
    ex = make_executor(0, 5.0, backend="ray", batch_episodes=3)
    try:
        assert isinstance(ex, RayExecutor) and (ex.batch_episodes, ex.episode_timeout_s) == (3, 5.0)
        assert ex.cpus() == 2
    finally:
        ex.close()
    assert ray.is_initialized()  # it joined the runtime this file started, so it left it running


def test_missing_ray_is_one_line_with_the_install_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(RatchetError, match=r'pip install "policy-ratchet\[ray\]"'):
        make_executor(backend="ray")


def test_docs_ray_snippet_is_a_valid_spec():
    import re
    import tomllib

    from ratchet.spec import spec_from_dict

    page = (Path(__file__).resolve().parents[1] / "docs/how-to/ray.md").read_text(encoding="utf-8")
    (snippet,) = [b for b in re.findall(r"```toml\n(.*?)```", page, re.DOTALL) if 'backend = "ray"' in b]
    table = tomllib.loads(re.sub(r"^# ", "", snippet, flags=re.MULTILINE))["execution"]  # with the commented options
    spec = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "execution": table})
    assert (spec.execution.backend, spec.execution.address, spec.execution.batch_episodes) == ("ray", "auto", 0)


def test_ray_honours_max_env_steps(ray_pool):
    from ratchet.execution import BUDGET_SKIP

    jobs = [Job(good_candidate(), s) for s in range(8)]  # 500 steps each
    eps = ray_pool.run(GymTask("CartPole-v1"), jobs, max_env_steps=1700)
    assert sum(e.length for e in eps) <= 1700 and sum(e.error is None for e in eps) == 3
    assert all(e.error == BUDGET_SKIP and e.length == 0 for e in eps if e.error is not None)


def test_candidates_with_artifacts_and_training_jobs_on_ray(ray_pool, cartpole_task, pool):
    """A residual candidate's artifact bytes reach Ray workers (same episodes as the process pool), and a
    training job runs as a Ray task (a failing one is a result with an error, not an exception)."""
    import gymnasium as gym

    from ratchet.execution.training import TrainingJob
    from ratchet.policies.start import start_candidate
    from ratchet.policy import parse_policy
    from ratchet.spec import PolicySpec

    program = parse_policy('PARAMETERS = {"k": (0.5, 0.0, 2.0)}\n'
                           "def act(o, p):\n    return int(o[2] + p['k'] * o[3] > 0)\n")
    env = gym.make("CartPole-v1")
    _, cand, blobs = start_candidate(PolicySpec(kind="residual", hidden=[4]), ".",
                                     (env.observation_space, env.action_space), 0, program)
    jobs = [Job(cand, s, blobs) for s in (1, 2)]
    assert _dicts(ray_pool.run(cartpole_task, jobs)) == _dicts(pool.run(cartpole_task, jobs))
    res = ray_pool.train(cartpole_task, TrainingJob("no-such-trainer", cand, {}, (1,), 10, blobs), 60)
    assert res.outputs == () and "no-such-trainer" in res.error


def test_an_evaluator_task_runs_on_ray_as_on_the_process_pool(ray_pool, pool, tmp_path):
    """The evaluator's source travels with the task: Ray workers score the same instances the same way."""
    from test_evaluator_task import EVALUATOR, POLICY

    from ratchet.policy import Candidate
    from ratchet.tasks.evaluator import EvaluatorTask

    (tmp_path / "evaluate.py").write_text(EVALUATOR)
    task = EvaluatorTask.from_file(tmp_path / "evaluate.py")
    jobs = [Job(Candidate.create(POLICY, {"b": b, "w": 0.5}), s) for b in (0.0, 1.5) for s in range(0, 12, 3)]
    expected = pool.run(task, jobs)
    got = ray_pool.run(task, jobs)
    assert _dicts(got) == _dicts(expected)
    assert all(e.error is None and e.length == 3 for e in got)


# -- one queue, longest first, every CPU fed ---------------------------------------------------------

class _Submitted:
    """Records every Ray task the executor submits: its jobs ``[(candidate id, seed)]`` and how many episodes had
    been reported to ``on_episode`` (:meth:`seen`) when it was submitted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tasks: list[tuple[list[tuple[str, int]], int]] = []
        self.reported = 0
        real, tasks, me = ray_executor._remote_batch, self.tasks, self

        class Options:
            def __init__(self, remote):
                self._remote = remote

            def options(self, **kwargs):
                return Options(self._remote.options(**kwargs))

            def remote(self, task_ref, candidates, jobs, *args):
                tasks.append((list(jobs), me.reported))
                return self._remote.remote(task_ref, candidates, jobs, *args)

        monkeypatch.setattr(ray_executor, "_remote_batch", lambda ray_: Options(real(ray_)))

    def seen(self, i, ep):
        self.reported += 1


def test_one_queue_longest_first_keeps_every_cpu_fed(ray_runtime, pool, cartpole_task, monkeypatch):
    """A call's jobs wait in one queue across its candidates, the longest expected first (the latest episode seen on
    each seed), with two Ray tasks in flight per CPU: each task that finishes is replaced before its episodes are
    reported, so the short jobs go to the other CPU one after another while the long one runs. Before: every batch
    submitted up front, in the order given (the long job last). The episodes are the process pool's, in job order."""
    long, short = good_candidate(), zero_candidate()  # 500 env steps vs about 10
    jobs = [Job(short, s) for s in range(2, 10)] + [Job(long, 1)]
    expected = pool.run(cartpole_task, jobs)
    with RayExecutor(batch_episodes=1, episode_timeout_s=30) as ex:
        first = ex.run(cartpole_task, jobs)  # nothing seen yet: the order given
        sent = _Submitted(monkeypatch)
        again = ex.run(cartpole_task, jobs, sent.seen)
    assert _dicts(first) == _dicts(again) == _dicts(expected)
    order = [j for batch, _ in sent.tasks for j in batch]
    assert order[0] == (long.id, 1) and sorted(order) == sorted((j.candidate.id, j.seed) for j in jobs)
    # 4 tasks in flight (2 CPUs x 2), then one more as each finishes, submitted before that one is reported
    assert [reported for _, reported in sent.tasks] == [0, 0, 0, 0, 0, 1, 2, 3, 4]
    assert sent.reported == len(jobs)


def test_a_crashing_candidate_is_blamed_and_its_queued_jobs_skipped(ray_runtime, pool, cartpole_task):
    """A policy process that dies on every attempt fails its own candidate, whichever task it is in: the
    candidate's jobs still queued are skipped with that reason (as on the process pool), never run, also where a task
    would have taken one beside another candidate's job; the other candidates' episodes are the process pool's.
    Before: each task found the crash again."""
    crash, good = candidate_of("policy_exits.py"), good_candidate()
    jobs = [Job(crash, s) for s in range(5, 13)] + [Job(good, 1), Job(crash, 13), Job(good, 2), Job(crash, 14)]
    with RayExecutor(batch_episodes=2, episode_timeout_s=30) as ex:  # 4 tasks of two crashes in flight first
        eps = ex.run(cartpole_task, jobs)
    crashed = [e for j, e in zip(jobs, eps, strict=True) if j.candidate.id == crash.id]
    assert all(e.error is not None and e.success is False for e in crashed)
    died = [e for e in crashed if not e.error.startswith("skipped: ")]
    assert [(e.seed - 5) // 2 for e in died] == [0, 1, 2, 3]  # one of each task in flight (its other skipped)
    assert all(e.error.startswith(f"worker died (exit code 3) on seed {e.seed}") for e in died)
    assert all(e.error.startswith("skipped: worker died (exit code 3) on seed ") for e in crashed[-2:])  # never ran
    assert _dicts([eps[8], eps[10]]) == _dicts(pool.run(cartpole_task, [jobs[8], jobs[10]]))
