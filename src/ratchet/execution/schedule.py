"""How executors order and size the work of one call: the same rule on every backend (the process pool, Ray).

Each job is expected to take as many env steps as the latest clean episode seen on its seed (:class:`Lengths`); the
jobs not yet sent wait in one queue across the call's candidates (:class:`JobQueue`), longest expected first; and a
message (or Ray task) takes the jobs at the head of the queue that fit a worker's fair share of the work left, else
about half of it (:func:`fit`), so messages shrink as the queue empties. On the process pool a message to a worker
begins where :meth:`JobQueue.head_for` says: at the jobs of the candidate whose process the worker holds (a further
message of it starts no process), else at a candidate on fewer workers than its share of the call's work asks for
(:attr:`JobQueue.quota`), so a call of fewer candidates than workers starts each candidate's process on about as many
workers as it needs, not on one more worker for each message it is cut into. The work left counts what the messages
running have done by now (:func:`remaining`: their time so far over the seconds an env step is measured to take,
:attr:`Lengths.step_s`), so the end of a call is not sized as if the long episodes running had not started. Only the
order and size of the messages depend on it, never a result.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratchet.execution import Job

__all__ = ["JobQueue", "Lengths", "fit", "remaining", "shares"]


class Lengths:
    """The env steps of the latest clean episode seen on each seed of one task (at most ``limit`` seeds, the oldest
    dropped): what a job on that seed is expected to take. Used only for the order and size of the messages
    an executor sends; never for any result."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.steps: dict[int, int] = {}
        self.total = 0
        self._seconds = self._stepped = 0.0  # the messages timed (decayed sums: recent ones weigh most)

    @property
    def step_s(self) -> float | None:
        """Seconds of wall clock one env step of this task takes on a worker, as measured by :meth:`timed` (a message's
        start folded in); None before any was timed."""
        return self._seconds / self._stepped if self._stepped else None

    def timed(self, seconds: float, steps: int) -> None:
        """A message of ``steps`` env steps in all took ``seconds`` of wall clock on its worker, from when it could
        start (sent to an idle worker, or the one before it ended) to its last reply."""
        if steps > 0 and seconds >= 0:
            self._seconds = 0.9 * self._seconds + seconds
            self._stepped = 0.9 * self._stepped + steps

    def expect(self, seed: int) -> int:
        """Env steps (≥ 1) a job on ``seed`` is expected to take: its latest episode's, else the mean of those seen
        (1 when none is: every job alike)."""
        if seed in self.steps:
            return max(1, self.steps[seed])
        return max(1, round(self.total / len(self.steps))) if self.steps else 1

    def record(self, seed: int, steps: int) -> bool:
        """Remember ``steps`` for ``seed``; whether it was new or changed."""
        old = self.steps.pop(seed, None)
        if old is not None:
            self.total -= old
        elif len(self.steps) >= self.limit:
            self.total -= self.steps.pop(next(iter(self.steps)))
        self.steps[seed] = steps
        self.total += steps
        return old != steps


class JobQueue:
    """The jobs of one executor's ``run`` call not yet sent, in the order they go, and the env steps they are expected
    to take in all (:attr:`work`; each job's expectation is ``expect[job]``, from ``lengths``).

    The jobs go longest expected first (:meth:`longest_first`) unless an env-step cap may bind (``cap`` below the
    jobs' worst case, ``len(jobs) × step_limit``): which jobs the cap skips then depends on the order alone, so they
    keep the order given (the same jobs skip the same, whatever ran before).

    Args:
        jobs: The call's jobs (indices into it are what the queue holds).
        lengths: The task's expected lengths (:class:`Lengths`), updated by :meth:`finished`.
        cap: The call's env-step cap, or None.
        step_limit: The task's time limit in env steps (needed with ``cap``).
        workers: How many workers share the jobs (see :meth:`longest_first` and :attr:`quota`).

    Attributes:
        quota: Per candidate id, on how many workers its process is worth starting (≥ 1): the workers in proportion to
            the env steps its jobs are expected to take, of the call's (rounded), as the call starts.
    """

    def __init__(self, jobs: Sequence[Job], lengths: Lengths, cap: int | None = None,
                 step_limit: int | None = None, workers: int = 1) -> None:
        self.jobs, self.lengths, self.workers = jobs, lengths, max(1, workers)
        self.reorder = cap is None or step_limit is None or len(jobs) * step_limit <= cap
        self.expect = [lengths.expect(job.seed) for job in jobs]
        self._jobs: deque[int] = deque(range(len(jobs)))
        self.work = sum(self.expect)
        self.learned = 0  # seeds whose expectation changed since the queue was last ordered
        self.long: set[int] = set()  # the jobs longest_first put first, each alone in its message
        self.queued: dict[str, int] = {}  # per candidate id, its jobs queued
        work: dict[str, int] = {}
        for i, job in enumerate(jobs):
            self.queued[job.candidate.id] = self.queued.get(job.candidate.id, 0) + 1
            work[job.candidate.id] = work.get(job.candidate.id, 0) + self.expect[i]
        self.quota = {cid: max(1, round(self.workers * w / self.work)) for cid, w in work.items()}
        if self.reorder and lengths.steps:
            self.longest_first()

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[int]:
        return iter(self._jobs)

    def __getitem__(self, k: int) -> int:
        return self._jobs[k]

    def popleft(self) -> int:
        return self.pop(0)

    def pop(self, k: int) -> int:
        """Take the job ``k``-th in the queue (0: the head) out of it."""
        i = self._jobs[k]
        del self._jobs[k]
        self.work -= self.expect[i]
        self.queued[self.jobs[i].candidate.id] -= 1
        return i

    def extendleft(self, jobs: Iterable[int]) -> None:
        jobs = list(jobs)
        self._jobs.extendleft(jobs)
        self.work += sum(self.expect[i] for i in jobs)
        for i in jobs:
            self.queued[self.jobs[i].candidate.id] += 1

    def head_for(self, mine: str | None, spread: Mapping[str, int]) -> int:
        """Where in the queue the next message to a worker begins (0: the head): at the first queued job of ``mine``
        (the candidate whose process the worker holds: a further message of it starts none; its own jobs are queued
        longest first), else at the head where its job is one that goes first and alone (:meth:`longest_first`), else
        at the first job of a candidate whose process fewer workers hold (``spread``: candidate id → workers) than its
        :attr:`quota`, else at the head. At the head all the same where the queue keeps the order given (an env-step
        cap may bind: which jobs it skips depends on that order). Only the order of the messages depends on it, never
        a result."""
        if not self.reorder or not self._jobs:
            return 0
        if mine is not None and self.queued.get(mine):
            wanted = {mine}
        elif self._jobs[0] in self.long:
            return 0
        else:
            wanted = {cid for cid, n in self.queued.items() if n and spread.get(cid, 0) < self.quota.get(cid, 1)}
        if not wanted or self.jobs[self._jobs[0]].candidate.id in wanted:
            return 0
        return next(k for k, i in enumerate(self._jobs) if self.jobs[i].candidate.id in wanted)

    def finished(self, i: int, steps: int, clean: bool) -> None:
        """Job ``i`` finished after ``steps`` env steps; a ``clean`` one (no error) teaches its seed's length."""
        if clean and self.lengths.record(self.jobs[i].seed, steps) and self.reorder:
            self.learned += 1

    def relearn(self) -> None:
        """Order the queue again by what was learned, once lengths changed for a 64th of it (and the order may
        change)."""
        if self._jobs and self.learned and self.learned >= len(self._jobs) // 64:
            self.longest_first()
            self.learned = 0

    def longest_first(self) -> None:
        """Expect each queued job's seed to take what :attr:`lengths` says and order the queue longest first, in
        powers of two of the env steps expected. First the jobs expected to take more than about half a worker's share
        of the queue's work (``work / (2 workers - 1)``: such a job goes alone in its message all the same), whichever
        candidate they are of; then the others, each candidate's together (for lockstep batches: one process per
        message), a job on a seed never seen first (it may be the longest: lengths are heavy-tailed, and the sooner
        it runs the sooner its length is known), the candidates by their first job so ordered, then by the work their
        jobs hold (so a candidate's last jobs, one of them long, do not wait behind another's many short ones).
        Candidates or jobs expected alike keep their order."""
        work: dict[str, int] = {}
        top: dict[str, int] = {}
        size: dict[int, int] = {}  # each job's power of two (of env steps expected); a seed never seen: above all
        for i in self._jobs:
            seed = self.jobs[i].seed
            self.expect[i] = self.lengths.expect(seed)
            size[i] = self.expect[i].bit_length() if seed in self.lengths.steps else 64
            cid = self.jobs[i].candidate.id
            work[cid] = work.get(cid, 0) + self.expect[i]
        self.work = sum(work.values())
        alone = self.work / (2 * self.workers - 1)  # a job expected above this goes alone in its message (fit)
        self.long = long = {i for i in self._jobs if size[i] < 64 and self.expect[i] > alone}
        for i in self._jobs:
            if i not in long:
                cid = self.jobs[i].candidate.id
                top[cid] = max(top.get(cid, 0), size[i])
        rank = {g: k for k, g in enumerate(sorted(work, key=lambda g: (-top.get(g, 0), -work[g])))}  # stable sort
        self._jobs = deque(sorted(self._jobs, key=lambda i: (0, -size[i], rank[self.jobs[i].candidate.id]) if i in long
                                  else (1, rank[self.jobs[i].candidate.id], -size[i])))


def remaining(held: float, running: float, elapsed_s: float, step_s: float | None) -> float:
    """Expected env steps a worker has left: those of the jobs it ``held`` (its running message's and any queued behind
    it), less what the ``running`` message's jobs (expected env steps) have done in the ``elapsed_s`` seconds since it
    started, at ``step_s`` seconds an env step (nothing done where that is not measured yet; never more than
    ``running``)."""
    if not step_s or elapsed_s <= 0:
        return held
    return held - min(running, elapsed_s / step_s)


def shares(left: float, workers: int, mine: float = 0.0) -> tuple[float, float]:
    """A worker's fair share of the work ``left`` (the queued jobs' and those every worker holds, expected env steps)
    and about half of it: ``left`` split into ``workers`` parts and into ``2 workers - 1`` (the whole of it with one
    worker), less ``mine`` (what the worker holds)."""
    return left / workers - mine, left / (2 * workers - 1) - mine


def fit(run: Sequence[int], fair: float, half: float) -> int:
    """How many of the jobs at the head of the queue go in the next message: all of ``run`` (their expected env steps,
    in queue order) where they fit ``fair`` (a worker's fair share of the work left), else the longest prefix that
    fits ``half`` (about half of it); at least one."""
    size, work = len(run), sum(run)
    while size > 1 and work > fair:  # too much for one worker: what fits half its share (at least one)
        size, work = size - 1, work - run[size - 1]
    if size < len(run):
        while size > 1 and work > half:
            size, work = size - 1, work - run[size - 1]
    return size
