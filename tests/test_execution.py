"""ratchet.execution: the process-pool executor (determinism, crash isolation, timeouts)."""

from __future__ import annotations

import time

import pytest
from conftest import GOOD_WEIGHTS, candidate_of, good_candidate, zero_candidate

from ratchet.execution import Job, make_executor
from ratchet.execution.process import ProcessExecutor
from ratchet.task import GymTask

SEEDS = [3, 17, 42, 1001, 65536, 2**31 + 5]


def _mixed_candidate():
    # a mediocre controller: episodes of very different lengths, so worker scheduling varies
    return candidate_of("cartpole_linear.py", {"w_position": 0.0, "w_velocity": 0.1, "w_angle": 0.6,
                                               "w_angular_velocity": 0.05})


def _jobs(cands, seeds=SEEDS):
    return [Job(c, s) for c in cands for s in seeds]


def test_make_executor_defaults():
    ex = make_executor(0, 5.0)
    try:
        assert isinstance(ex, ProcessExecutor) and ex.n_workers >= 1 and ex.episode_timeout_s == 5.0
    finally:
        ex.close()


def test_empty_job_list(pool, cartpole_task):
    assert pool.run(cartpole_task, []) == []


def test_same_candidate_and_seed_is_bit_identical(pool, cartpole_task):
    cands = [_mixed_candidate(), good_candidate(), zero_candidate()]
    first = pool.run(cartpole_task, _jobs(cands))
    second = pool.run(cartpole_task, list(reversed(_jobs(cands))))[::-1]
    assert [e.to_dict() for e in first] == [e.to_dict() for e in second]
    assert [e.seed for e in first] == SEEDS * 3
    assert all(e.error is None for e in first)
    with ProcessExecutor(workers=1, episode_timeout_s=30) as single:
        third = single.run(cartpole_task, _jobs(cands))
    assert [e.to_dict() for e in third] == [e.to_dict() for e in first]
    # not all the same episode: the seed matters
    assert len({e.episode_return for e in first[:len(SEEDS)]}) > 1


def test_on_episode_called_once_per_job(pool, cartpole_task):
    calls = []
    jobs = _jobs([good_candidate(), zero_candidate()], SEEDS[:3])
    eps = pool.run(cartpole_task, jobs, lambda i, ep: calls.append((i, ep)))
    assert sorted(i for i, _ in calls) == list(range(len(jobs)))
    assert all(eps[i] == ep for i, ep in calls)


def test_terminated_and_truncated_recorded_separately(pool, cartpole_task):
    good, zero = pool.run(cartpole_task, [Job(good_candidate(), 7), Job(zero_candidate(), 7)])
    assert (good.episode_return, good.length, good.terminated, good.truncated) == (500.0, 500, False, True)
    assert good.success is True and good.diagnostics["cause"] == "truncated"
    assert zero.terminated is True and zero.truncated is False and zero.length < 30
    assert zero.success is False and zero.diagnostics["cause"] == "terminated"


def test_task_settings_reach_the_worker(pool):
    short = GymTask("CartPole-v1", max_episode_steps=25, success_threshold=20)
    (ep,) = pool.run(short, [Job(good_candidate(), 7)])
    assert (ep.length, ep.truncated, ep.success) == (25, True, True)


def test_policy_exception_gives_errored_episode(pool, cartpole_task):
    eps = pool.run(cartpole_task, [Job(candidate_of("policy_raises.py"), s) for s in (1, 2)] + [Job(good_candidate(), 1)])
    for ep in eps[:2]:
        assert ep.error.startswith("policy raised ZeroDivisionError") and ep.length == 2
        assert ep.terminated is False and ep.truncated is False and ep.success is False
    assert eps[2].error is None and eps[2].episode_return == 500.0


@pytest.mark.parametrize("policy, mode, fragment", [
    ("policy_nan.py", "error", "non-finite"),
    ("policy_nan.py", "clip", "non-finite"),
    ("policy_out_of_range.py", "error", "outside Discrete range"),
])
def test_invalid_action_gives_errored_episode(pool, policy, mode, fragment):
    (ep,) = pool.run(GymTask("CartPole-v1", action_mode=mode), [Job(candidate_of(policy), 4)])
    assert ep.error.startswith("invalid action") and fragment in ep.error
    assert ep.length == 0


def test_clip_mode_in_worker(pool):
    (ep,) = pool.run(GymTask("CartPole-v1", action_mode="clip"), [Job(candidate_of("policy_out_of_range.py"), 4)])
    assert ep.error is None and ep.terminated


def test_policy_failing_to_load(pool, cartpole_task):
    eps = pool.run(cartpole_task, [Job(candidate_of("policy_import_error.py"), s) for s in (1, 2)]
                   + [Job(good_candidate(), 2)])
    for ep in eps[:2]:
        assert ep.error.startswith("policy failed to load: RuntimeError: broken at import")
        assert ep.length == 0
    assert eps[2].error is None and eps[2].episode_return == 500.0


@pytest.mark.parametrize("line", ['raise SystemExit("top-level boom")', "raise KeyboardInterrupt('top-level boom')"])
def test_policy_raising_base_exception_at_load_is_its_load_failure(pool, cartpole_task, tmp_path, line):
    """A SystemExit (or other BaseException) from the policy's top-level code is its load failure, with its message,
    not a dead worker; one raised in act() is the episode's error."""
    from ratchet.policy import load_policy

    path = tmp_path / "m_top.py"
    path.write_text(f"PARAMETERS = {{}}\n{line}\n\n\ndef act(observation, params):\n    return 0\n")
    act = tmp_path / "m_act.py"
    act.write_text('PARAMETERS = {}\n\n\ndef act(observation, params):\n    raise SystemExit("act boom")\n')
    eps = pool.run(cartpole_task, [Job(load_policy(path).candidate(), s) for s in (1, 2)]
                   + [Job(load_policy(act).candidate(), 1), Job(good_candidate(), 2)])
    for ep in eps[:2]:
        assert ep.error is not None and ep.error.startswith("policy failed to load: ") and "top-level boom" in ep.error
    assert eps[2].error is not None and eps[2].error.startswith("policy raised SystemExit") and "act boom" in eps[2].error
    assert eps[3].error is None and eps[3].episode_return == 500.0


@pytest.mark.parametrize("policy, code", [("policy_exits.py", "exit code 3"), ("policy_segfault.py", "killed by SIGSEGV")])
def test_worker_death_is_isolated(cartpole_task, policy, code):
    reference = [Job(good_candidate(), s) for s in SEEDS[:3]] + [Job(_mixed_candidate(), s) for s in SEEDS[:3]]
    with ProcessExecutor(workers=2, episode_timeout_s=30) as ex:
        expected = ex.run(cartpole_task, reference)  # also boots both workers
        bad = candidate_of(policy)
        eps = ex.run(cartpole_task, [Job(bad, s) for s in (5, 6, 7)] + reference)
        bad_eps, rest = eps[:3], eps[3:]
        # each seed's worker died (a death is retried once, on a fresh worker) or, once the candidate
        # had failed on another seed, was skipped; never silently fine
        assert any(ep.error.startswith("worker died") and code in ep.error for ep in bad_eps)
        for ep in bad_eps:
            assert ep.error is not None and ("worker died" in ep.error or ep.error.startswith("skipped: worker died"))
        assert [e.to_dict() for e in rest] == [e.to_dict() for e in expected]
        # the pool keeps working afterwards
        again = ex.run(cartpole_task, reference)
        assert [e.to_dict() for e in again] == [e.to_dict() for e in expected]
        assert len(ex._workers) <= 2


def test_timeout_kills_only_the_hanging_candidate(cartpole_task):
    others = [Job(good_candidate(), s) for s in SEEDS[:2]] + [Job(zero_candidate(), s) for s in SEEDS[:4]]
    with ProcessExecutor(workers=2, episode_timeout_s=30) as warm:
        expected = warm.run(cartpole_task, others)
    with ProcessExecutor(workers=2, episode_timeout_s=3.0) as ex:  # a fresh pool: start-up is not episode time
        hang = candidate_of("policy_sleeps.py")
        # worker A hangs on seed 8 while worker B runs the other candidates, then hangs on seed 9;
        # seed 10 is still queued when seed 8 times out, so it is skipped without running
        jobs = [Job(hang, 8)] + others + [Job(hang, 9), Job(hang, 10)]
        t0 = time.monotonic()
        eps = ex.run(cartpole_task, jobs)
        elapsed = time.monotonic() - t0
        assert eps[0].error == "timeout after 3 s on seed 8"
        assert eps[0].length == 0 and eps[0].terminated is False and eps[0].truncated is False
        hang_errors = [eps[0].error, eps[-2].error, eps[-1].error]
        assert all("timeout after 3 s" in e for e in hang_errors)
        assert eps[-1].error.startswith("skipped: timeout")  # one hanging candidate costs one timeout per worker
        assert 0.9 < elapsed < 60  # bounded: seconds, not a hang (how fast is a benchmark's question)
        assert [e.to_dict() for e in eps[1:-2]] == [e.to_dict() for e in expected]
        # and the pool keeps working: the replacement workers run healthy episodes within the same 3 s limit
        after = ex.run(cartpole_task, others)
        assert [e.to_dict() for e in after] == [e.to_dict() for e in expected]


def test_short_timeout_does_not_count_worker_start_up(cartpole_task):
    # regression: a worker's start-up (Python + gymnasium imports, about 1 s) used to count against the
    # first episode's timeout, so a healthy policy timed out on a fresh pool
    with ProcessExecutor(workers=2, episode_timeout_s=1.0) as ex:
        eps = ex.run(cartpole_task, [Job(zero_candidate(), s) for s in range(4)])
    assert [e.error for e in eps] == [None] * 4


def test_close_is_idempotent(cartpole_task):
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    (ep,) = ex.run(cartpole_task, [Job(zero_candidate(), 1)])
    procs = [w.proc for w in ex._workers]
    ex.close()
    ex.close()
    assert all(p.poll() is not None for p in procs)
    assert ep.error is None
    # a closed executor starts fresh workers when used again
    (again,) = ex.run(cartpole_task, [Job(zero_candidate(), 1)])
    assert again == ep
    ex.close()


def test_good_weights_constant_matches_fixture():
    assert set(GOOD_WEIGHTS) == set(good_candidate().params)


def test_episode_does_not_depend_on_earlier_episodes_in_the_worker():
    """BipedalWalker-v3 keeps its Box2D world across reset(); the worker makes a fresh env per
    episode, so a seed's return is the same whatever ran before it in that worker."""
    from pathlib import Path

    from ratchet.execution import Job
    from ratchet.execution.process import ProcessExecutor
    from ratchet.policy import load_policy
    from ratchet.task import GymTask

    policy = Path(__file__).resolve().parents[1] / "examples" / "bipedal_walker" / "policy.py"
    cand = load_policy(policy).candidate()
    task = GymTask("BipedalWalker-v3", max_episode_steps=600)
    with ProcessExecutor(workers=1) as ex:
        eps = ex.run(task, [Job(cand, s) for s in (0, 0, 0, 1, 0)])
    returns = [e.episode_return for e in eps]
    # with one env reused across resets the third run of seed 0 returned -25.3 instead of 108.3
    assert returns[0] == returns[1] == returns[2] == returns[4]


def test_worker_killed_from_outside_is_retried_without_trace(cartpole_task):
    """A worker SIGKILLed mid-episode by something else (OOM killer, operator, fault injection): the
    episode runs again on a fresh worker and the result is the same as an undisturbed run."""
    import os
    import signal
    import threading

    slow = candidate_of("cartpole_slow.py")
    jobs = [Job(slow, s) for s in (11, 12)]
    with ProcessExecutor(workers=1, episode_timeout_s=60) as ex:
        clean = ex.run(cartpole_task, jobs)
        victim = ex._workers[0].proc.pid
        killer = threading.Timer(0.5, lambda: os.killpg(victim, signal.SIGKILL))
        killer.start()
        disturbed = ex.run(cartpole_task, jobs)
        killer.join()
        assert ex._workers[0].proc.pid != victim  # it was replaced
    assert all(e.error is None for e in clean) and clean[0].length > 100
    assert [e.to_dict() for e in disturbed] == [e.to_dict() for e in clean]


def test_worker_that_dies_every_time_fails_after_one_retry(cartpole_task):
    with ProcessExecutor(workers=1, episode_timeout_s=30, death_retries=1) as ex:
        (ep,) = ex.run(cartpole_task, [Job(candidate_of("policy_exits.py"), 5)])
    assert ep.error.startswith("worker died (exit code 3")


def test_max_env_steps_is_a_hard_cap(pool, cartpole_task):
    """An episode starts only when its worst case (the time limit) fits beside every running one; the rest
    are recorded as skipped, with 0 env steps, so the cap is never exceeded."""
    from ratchet.execution import BUDGET_SKIP

    jobs = [Job(good_candidate(), s) for s in range(8)]  # 500 steps each
    eps = pool.run(cartpole_task, jobs, max_env_steps=1700)
    ran = [e for e in eps if e.error is None]
    assert sum(e.length for e in eps) <= 1700 and len(ran) == 3
    assert all(e.error == BUDGET_SKIP and e.length == 0 for e in eps if e.error is not None)
    assert [e.seed for e in eps] == list(range(8))


class _Sent:
    """Records the job ids of every message the executor sends its workers, in order (``[(kind, [ids])]``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from multiprocessing.connection import Connection

        from ratchet.execution import process

        self.messages: list[tuple[str, list[int]]] = []
        sent = self.messages

        class Recording(Connection):
            def send(self, obj):
                if isinstance(obj, tuple):
                    sent.append((obj[0], list(obj[1]) if obj[0] == "batch" else [obj[1]]))
                return super().send(obj)

        monkeypatch.setattr(process, "Connection", Recording)


def test_jobs_go_longest_expected_first(cartpole_task, monkeypatch):
    """The executor expects a job to take as many env steps as the latest episode it saw on its seed: the jobs
    go longest first, unless an env-step cap that may bind asks for the order given (which jobs it skips then
    depends on that order alone); the episodes are the same either way."""
    sent = _Sent(monkeypatch)
    jobs = [Job(_mixed_candidate(), s) for s in range(12)]
    with ProcessExecutor(workers=1, episode_timeout_s=30, lockstep=1) as ex:
        first = ex.run(cartpole_task, jobs)
        assert [i for _, ids in sent.messages for i in ids] == list(range(12))  # nothing seen yet: as given
        length = {e.seed: e.length for e in first}
        assert len({n.bit_length() for n in length.values()}) > 1  # lengths of more than one power of two
        sent.messages.clear()
        again = ex.run(cartpole_task, jobs)
        order = [jobs[i].seed for _, ids in sent.messages for i in ids]
        buckets = [length[s].bit_length() for s in order]
        assert buckets == sorted(buckets, reverse=True) and order != list(range(12))
        assert [e.to_dict() for e in again] == [e.to_dict() for e in first]
        sent.messages.clear()
        capped = ex.run(cartpole_task, jobs, max_env_steps=12 * 500 - 1)  # all twelve at the time limit: over it
        assert [i for _, ids in sent.messages for i in ids] == list(range(12))
        assert [e.to_dict() for e in capped] == [e.to_dict() for e in first]


def test_reordered_jobs_keep_each_candidate_together(cartpole_task, monkeypatch):
    """Longest first orders the candidates by the work their jobs hold and each candidate's jobs by theirs, never the
    jobs of several candidates by seed: a candidate's jobs stay together for one lockstep message (one process)."""
    sent = _Sent(monkeypatch)
    with ProcessExecutor(workers=1, episode_timeout_s=30) as ex:
        ex.run(cartpole_task, [Job(_mixed_candidate(), s) for s in range(12)])  # lengths of two powers of two
        sent.messages.clear()
        two = [_mixed_candidate(), good_candidate()]
        jobs = _jobs(two, list(range(12)))
        ex.run(cartpole_task, jobs)
    assert [[jobs[i].candidate.id for i in ids] for _, ids in sent.messages] == [[c.id] * 12 for c in two]


def test_a_candidate_partly_sent_may_finish_after_one_given_behind_it():
    """Longest first ranks the candidates by the work their queued jobs hold: once some of the first candidate's jobs
    are sent and their lengths learned, a candidate given after it with more work queued goes first. So the
    evaluations of one call complete (and are recorded) in an order the messages' sizes decide, not the order given:
    a run's test evaluations of the incumbent and the start may be recorded either way (read them by candidate)."""
    from ratchet.execution.schedule import JobQueue, Lengths

    first, second = good_candidate(), zero_candidate()
    jobs = [Job(c, s) for c in (first, second) for s in range(6)]
    lengths = Lengths()
    lengths.record(100, 3)  # seen before: every job is expected to take 3 env steps
    queue = JobQueue(jobs, lengths)
    assert [jobs[i].candidate.id for i in queue] == [first.id] * 6 + [second.id] * 6  # alike: as given
    for _ in range(3):  # a message of half the first candidate's jobs, run and learned
        i = queue.popleft()
        queue.finished(i, 3, True)
    queue.relearn()
    assert [jobs[i].candidate.id for i in queue] == [second.id] * 6 + [first.id] * 3


def test_messages_leave_work_queued_for_the_first_worker_free(cartpole_task, monkeypatch):
    """A candidate's jobs that do not fit a worker's fair share of the work left go in messages of about half of it,
    the rest staying queued for whichever worker frees up first (not split between the workers up front, where the
    end of a heavy-tailed mix leaves the other workers waiting on one long message); a candidate's jobs that fit it
    go whole (splitting them would start the candidate's process on another worker for nothing)."""
    sent = _Sent(monkeypatch)
    with ProcessExecutor(workers=2, episode_timeout_s=30) as ex:
        eps = ex.run(cartpole_task, [Job(good_candidate(), s) for s in range(12)])
        sizes = [len(ids) for kind, ids in sent.messages if kind == "batch"]
        assert sum(sizes) == 12 and max(sizes) <= 4 and len(sizes) > 2, sizes  # 12 / (2 × 2 - 1) = 4; before: 6 + 6
        sent.messages.clear()
        four = [_mixed_candidate(), good_candidate(), zero_candidate(), candidate_of("cartpole_linear.py", {**GOOD_WEIGHTS, "w_angle": 0.8})]
        eps += ex.run(cartpole_task, _jobs(four, SEEDS[:3]))
        assert [len(ids) for kind, ids in sent.messages] == [3, 3, 3, 3]  # each candidate whole: 3 of 6 per worker
    assert all(e.error is None for e in eps)


def test_work_left_counts_what_running_messages_did():
    """The work a worker has left is its jobs' expected env steps less what its running message did since it started,
    at the seconds per env step measured on finished messages (never more than that message's own jobs); nothing is
    taken off before a message was timed."""
    from ratchet.execution.schedule import Lengths, remaining

    lengths = Lengths()
    assert lengths.step_s is None and remaining(150, 100, 0.5, lengths.step_s) == 150
    lengths.timed(1.0, 100)
    assert lengths.step_s == pytest.approx(0.01)
    assert remaining(150, 100, 0.5, lengths.step_s) == pytest.approx(100)  # half the running message done
    assert remaining(150, 100, 5.0, lengths.step_s) == pytest.approx(50)  # at most all of it: the queued 50 are left


def test_long_jobs_of_every_candidate_go_first(cartpole_task, monkeypatch):
    """A job expected to take more than about half a worker's share of the call's work goes alone in its message all
    the same, so such jobs go first whichever candidate they are of: the first message to each of four workers holds
    one of the two candidates' four long jobs (before, the second candidate's waited behind the first's short ones, and
    a worker could end the call with two long jobs while another idled)."""
    import json

    from ratchet.execution.schedule import Lengths

    sent = _Sent(monkeypatch)
    two = [zero_candidate(), _mixed_candidate()]
    jobs = _jobs(two, list(range(6)))
    with ProcessExecutor(workers=4, episode_timeout_s=30) as ex:
        ex._ensure_workers(4)
        lengths = ex._lengths.setdefault(json.dumps(cartpole_task.to_dict(), sort_keys=True), Lengths())
        for seed, steps in enumerate([400, 400, 10, 10, 10, 10]):  # expected: seeds 0 and 1 long, the rest short
            lengths.record(seed, steps)
        eps = ex.run(cartpole_task, jobs)
    first = sent.messages[:4]
    assert sorted(i for _, ids in first for i in ids) == [0, 1, 6, 7], first  # each candidate's seeds 0 and 1, alone
    assert all(e.error is None for e in eps)


def test_a_split_candidates_last_part_is_not_taken_whole(cartpole_task, monkeypatch):
    """A candidate's jobs go whole in one message only while none of them went out yet (splitting them then would
    start its process on another worker for nothing): once it is split, its last part goes in messages of about half
    a worker's share, not whole because it fits a full share (where a heavy-tailed last part held the call's end)."""
    import json

    from ratchet.execution.schedule import Lengths

    sent = _Sent(monkeypatch)
    jobs = [Job(_mixed_candidate(), 1000)] + [Job(zero_candidate(), s) for s in range(40)]
    with ProcessExecutor(workers=3, episode_timeout_s=30) as ex:
        ex._ensure_workers(3)
        lengths = ex._lengths.setdefault(json.dumps(cartpole_task.to_dict(), sort_keys=True), Lengths())
        lengths.record(1000, 400)  # expected: one job of 400 env steps, 40 of 10 (800 in all)
        for seed in range(40):
            lengths.record(seed, 10)
        eps = ex.run(cartpole_task, jobs)
    # the long job alone; 16 of the 40 (their 400 are over a share, 800 / 3: about half of it, 800 / 5); then the 24
    # left fit a share but the candidate is split already: about half a share again (before: all 24)
    assert [len(ids) for _, ids in sent.messages[:3]] == [1, 16, 16], sent.messages[:3]
    assert all(e.error is None for e in eps)


def test_a_message_begins_at_the_workers_own_candidate_else_one_on_too_few_workers():
    """Where a message to a worker begins: at the jobs of the candidate whose process the worker holds (a further
    message of it starts no process), else at a candidate on fewer workers than its share of the call's work asks for
    (its quota), else at the head; a long job at the head goes first to a worker without jobs of its own candidate
    queued; at the head all the same under an env-step cap that may bind (the order given decides which jobs it
    skips)."""
    from ratchet.execution.schedule import JobQueue, Lengths

    a, b = good_candidate(), zero_candidate()
    jobs = [Job(c, s) for c in (a, b) for s in range(4)]
    lengths = Lengths()
    for s in range(4):
        lengths.record(s, 10)
    queue = JobQueue(jobs, lengths, workers=4)
    assert queue.quota == {a.id: 2, b.id: 2}  # half the work each: two of the four workers each
    assert queue.head_for(None, {}) == 0  # the head's candidate is on no worker yet
    assert queue.head_for(None, {a.id: 2}) == 4  # a is on its two workers: b's first job
    assert queue.head_for(None, {a.id: 2, b.id: 2}) == 0  # every candidate on its share: the head
    assert queue.head_for(b.id, {a.id: 1, b.id: 3}) == 4  # the worker holds b's process: b's jobs, no new process
    assert queue.head_for(a.id, {a.id: 1}) == 0
    queue.pop(4)
    assert [jobs[i].candidate.id for i in queue] == [a.id] * 4 + [b.id] * 3
    assert queue.queued == {a.id: 4, b.id: 3} and queue.work == 70
    capped = JobQueue(jobs, lengths, cap=700, step_limit=100, workers=4)  # 8 jobs × 100 may exceed 700: as given
    assert capped.head_for(None, {a.id: 2}) == 0 and capped.head_for(b.id, {}) == 0
    lengths.record(0, 400)  # the jobs on seed 0 are long: they go first and alone, a's on one of a's workers
    long = JobQueue(jobs, lengths, workers=4)
    assert [long[0], long[1]] == [0, 4] and long.head_for(None, {a.id: 2}) == 0
    assert long.head_for(b.id, {a.id: 2}) == 1  # the worker holds b's process: b's own job on seed 0


def test_a_worker_keeps_its_candidate_while_it_has_jobs_queued(cartpole_task, monkeypatch):
    """Two candidates of four jobs each on four workers, in messages of one job (four do not fit a worker's share):
    each candidate's process starts on two workers, its share of the work; a worker that frees up takes its own
    candidate's next job while one is queued (no new process), not the head of the queue (before: the short
    candidate's second freed worker got the long one's job, a second process of it); the episodes are one worker's."""
    import json

    from ratchet.execution.schedule import Lengths

    sent = _Sent(monkeypatch)
    short, long = zero_candidate(), good_candidate()  # CartPole falls within about 10 steps; held for 500
    jobs = _jobs([short, long], SEEDS[:4])
    with ProcessExecutor(workers=4, episode_timeout_s=30) as ex:
        ex._ensure_workers(4)
        lengths = ex._lengths.setdefault(json.dumps(cartpole_task.to_dict(), sort_keys=True), Lengths())
        for seed in SEEDS[:4]:
            lengths.record(seed, 10)  # every job expected alike: 40 of a share of 20
        eps = ex.run(cartpole_task, jobs)
    cand = [[jobs[i].candidate.id for i in ids] for _, ids in sent.messages]
    assert sorted(cand[:4]) == sorted([[short.id]] * 2 + [[long.id]] * 2), cand  # two workers each
    assert cand[4:6] == [[short.id]] * 2, cand  # the short one's workers free first: its last two jobs are theirs
    with ProcessExecutor(workers=1, episode_timeout_s=30) as ex:
        assert [e.to_dict() for e in ex.run(cartpole_task, jobs)] == [e.to_dict() for e in eps]
