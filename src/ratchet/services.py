"""The services a run's loop calls, each one recorded in the run's ledger: evaluating candidates on seeded
episodes, training jobs, requests to outside services (an LLM endpoint), screening proposed sources, the critique
of a candidate, and gate decisions. A resumed run calls the same services and reads what they recorded instead
of doing the work again; the loop (:mod:`ratchet.loop`) only decides what to ask for, in order."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import numpy as np

from ratchet.critic import Critic, Evaluation, by_opponent
from ratchet.errors import LedgerError
from ratchet.execution import BUDGET_SKIP, Executor, ExecutorCapabilities, Job, TrainingExecutor, capabilities_of
from ratchet.execution.training import TrainingOutput, TrainingResult, accept
from ratchet.ledger import Event, EventType, LedgerStore
from ratchet.ledger.events import RejectionKind
from ratchet.planner import SeedSplits, Usage
from ratchet.policy import FOLDER_KINDS, SOURCE_KINDS, Candidate, PolicyProgram, uses_task_dims
from ratchet.proposals import Rejection
from ratchet.refiners.registry import Reply, Sent, as_they_finish
from ratchet.rollout import Episode
from ratchet.spec import RunSpec
from ratchet.tasks import Task, task_from_spec
from ratchet.text import clean

__all__ = ["RunServices", "eval_key"]


def eval_key(split: str, candidate_id: str, seeds: Sequence[int]) -> str:
    """Ledger key of one candidate's evaluation on a seed list."""
    digest = hashlib.sha256(",".join(map(str, seeds)).encode()).hexdigest()[:12]
    return f"eval/{split}/{candidate_id}/{digest}"



def _journaled(path: Path, ekey: str) -> Reply | None:
    """The answer to request ``ekey`` that a session received and wrote to the journal at ``path`` (see
    :meth:`RunServices.exchange_ahead`), or None (none there, or one that cannot be read: the request is made again)."""
    from ratchet.safefile import read_bytes

    try:
        got = json.loads(read_bytes(path, 4 * 2**26))
    except (OSError, ValueError):
        return None
    if (not isinstance(got, dict) or got.get("key") != ekey or not isinstance(got.get("body"), str)
            or not isinstance(got.get("info"), dict)):
        return None
    return got["body"], got["info"]


#: :meth:`RunServices._loses_to_a_rival`'s answer when the env-step budget cut the league games short
_LEAGUE_CUT = "league games cut short by the env-step budget"


def _cut(evaluation: Evaluation) -> bool:
    """Whether the executor's env-step cap left some of the evaluation's episodes unrun."""
    return any(ep.error == BUDGET_SKIP for ep in evaluation.episodes)




#: Evaluations completing within this many seconds of each other are committed to the ledger together (one
#: ``fsync``): a crash loses at most this much finished work, and the driver keeps up with thousands of episodes
#: a second.
_GROUP_COMMIT_S = 0.05


class _Recording:
    """An evaluation's episodes that record their transitions: every chosen event key (in order), the render path of
    each job still to run (by job index), and the temporary folder that holds them."""

    def __init__(self, keys: list[str], paths: dict[int, str], folder: str | None) -> None:
        self.keys, self.paths, self.folder = keys, paths, folder

    def close(self) -> None:
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)


class RunServices:
    """A run's recorded services and the state they keep (usage, alpha spending, artifacts read); the loop
    subclasses it. Every method that does work first looks for its event in the ledger.
    """

    def __init__(self, run_dir: Path, spec: RunSpec, program: PolicyProgram, ledger: LedgerStore,
                 executor: Executor, pricing: str | None = None, start: Candidate | None = None,
                 inputs: dict[str, str] | None = None, task: Task | None = None) -> None:
        self.run_dir, self.spec, self.program, self.ledger = run_dir, spec, program, ledger
        # files refiners read (path -> artifact digest); None: a new run, which reads them from base_dir
        self.inputs: dict[str, str] = dict(inputs or {})
        self._inputs_recorded = inputs is not None
        self.start = start or program.candidate()
        self._blobs: dict[str, bytes] = {}  # artifact bytes read or made this session, by digest
        self._checked: dict[str, Any] = {}  # new sources checked this session: digest -> program or reason
        # every candidate recorded (the start, the contenders): normal id -> (candidate id, generation); a proposal
        # with the same normal id is a duplicate (screen_proposals). Rebuilt by replay on resume.
        self._scored: dict[str, tuple[str, int]] = {}
        self._training_seeds = 0
        self.executor = executor
        self.task = task if task is not None else task_from_spec(spec.task)
        self.splits = SeedSplits(spec.seed, self.task.seed_pools())
        self.gate = spec.gate.build()
        # what the executor declares it does beyond running episodes, read once (ExecutorCapabilities)
        self.capabilities: ExecutorCapabilities = capabilities_of(executor)
        # Where the executor enforces the env-step budget exactly, work is priced by the episode lengths
        # seen (with a margin) instead of the time limit, so the end of a budget is not left unused. The
        # choice is recorded when the run starts and kept on resume (the same decisions, whatever executor).
        self.caps_steps = self.capabilities.caps_env_steps
        self.pricing = pricing or (spec.budget.pricing if self.caps_steps else "worst-case")
        self.price_limit = None if self.pricing == "observed" else self.task.step_limit
        self._train_returns = [math.inf, -math.inf]  # lowest and highest training return seen (betting bound)
        self.critic = Critic.for_task(self.task, seed=spec.seed)
        self.rng = np.random.default_rng(spec.seed)
        self.usage = Usage()
        self.validation_seeds = self.splits.seeds("validation", 0, spec.gate.validation_episodes)
        self.test_seeds = self.splits.seeds("test", 0, spec.test.episodes)
        self._clock_offset = 0.0
        self._n_contested = 0  # gate decisions so far whose candidate beat the incumbent's mean (alpha spending)
        self._carry = 0.0  # the last decision's level when it promoted (fallback: ratchet.gate.fallback_level)
        self._replaying = False
        self._session_start = time.monotonic()
        self._failures: list[str] = []  # this generation's failed requests to outside services (exchange)
        self._last_work_seq: int | None = None  # see stopped_at
        self._session_seq = 0
        # the critique service (RefinerContext.critique): each candidate's latest training evaluation, the
        # traces read this session, and what the current generation leaves of the budget for trace replays
        self._latest_train: dict[str, tuple[Candidate, Evaluation]] = {}
        self._traces: dict[str, Any] = {}
        self._spare: tuple[float, float] = (math.inf, math.inf)
        self.event_tag: dict[str, Any] = {}  # merged into every payload recorded (a correction round's number)
        # a game's payoffs: each candidate's training payoff sum and episodes per opponent, and the incumbents so far
        # (the league's members: Task.after_promotion)
        self._payoffs: dict[str, dict[str, list[float]]] = {}
        self._incumbents: list[str] = [self.start.id]
        self._counted: set[str] = set()  # a deterministic task's evaluations charged to the usage (charged once)
        self._transitions: list[str] = []  # the world model's data set: artifact digests of recorded transitions, in order
        #: evaluations run ahead (:meth:`run_ahead`) and not read back yet: their env steps by evaluation key
        self.ahead: dict[str, int] = {}

    def artifact(self, name: str) -> bytes:
        """An artifact's bytes by digest (read from the ledger's store once per session)."""
        if name not in self._blobs:
            self._blobs[name] = self.ledger.get_artifact(name)
        return self._blobs[name]

    def read_input(self, path: str) -> bytes:
        """A file a refiner's settings name, relative to the spec's folder: read once when the run starts and
        kept as an artifact (its digest goes into ``run_started``); a resumed run reads the recorded bytes.

        Raises:
            PolicyError: the file cannot be read (a new run), or the ledger has no copy of it (a resumed run).
        """
        from ratchet.errors import PolicyError

        if path in self.inputs:
            return self.artifact(self.inputs[path])
        if self._inputs_recorded:
            raise PolicyError(f"the ledger holds no copy of {path}, which a refiner reads; was the run started by an "
                              "older ratchet?")
        try:
            data = (Path(self.spec.base_dir) / path).read_bytes()
        except OSError as exc:
            raise PolicyError(f"cannot read {path} (relative to the spec's folder {self.spec.base_dir}): "
                              f"{exc.strerror or exc}") from None
        self.inputs[path] = self.store_artifact(data)
        return data

    def store_artifact(self, data: bytes) -> str:
        name = self.ledger.put_artifact(data)
        self._blobs[name] = bytes(data)
        return name

    def training_seeds(self, n: int) -> list[int]:
        """``n`` fresh seeds of the training split for training jobs (a range of their own, far above the
        planner's per-generation training seeds; the same sequence when a run is replayed)."""
        start = 1_000_000_000 + self._training_seeds
        self._training_seeds += n
        return self.splits.seeds("train", start, n)

    def train(self, job: Any) -> Any:
        """Run a refiner's training job, or read its recorded result back (a resumed run never re-trains).

        The answer is checked against the trainer's declaration (``job.answer``,
        :func:`~ratchet.execution.training.accept`) before anything records or uses it: an answer that breaks
        it, or an executor that raises, is the job's recorded failure. The outputs' artifacts are stored
        before the ``training_finished`` event that names them; each output's ``info["artifacts"]`` gives
        their digests by role. The job's env-step allowance counts in the budget in full; a job that would
        exceed an env-step budget does not run. A recorded answer is checked again when read back, so an
        event recorded by an older ratchet that breaks the declaration is a failure, never a crash.
        """
        key = f"training/{job.key}"
        event = self.ledger.get(key)
        if event is None:
            b = self.spec.budget
            if job.env_steps and b.env_steps is not None and self.usage.env_steps + job.env_steps > b.env_steps:
                return TrainingResult((), 0, "the env-step budget has no room for this training job")
            if not self.capabilities.trains:
                result = TrainingResult((), 0, f"executor {type(self.executor).__name__} cannot run training jobs")
            else:
                blobs = {h: self.artifact(h) for h in job.parent.artifacts.values()}
                from dataclasses import replace

                trainer = cast(TrainingExecutor, self.executor)  # it declares capabilities.trains
                try:
                    result = trainer.train(self.task, replace(job, artifacts=blobs),
                                           self.spec.execution.training_timeout_s)
                except Exception as exc:  # noqa: BLE001 - the job's failure, not the run's
                    result = TrainingResult((), job.env_steps, f"the executor failed to run the training job: "
                                                               f"{type(exc).__name__}: {exc}"[:500])
                result = accept(job, result)
            outputs = []
            for out in result.outputs:
                digests = {role: self.store_artifact(data) for role, data in out.artifacts.items()}
                outputs.append({"artifacts": digests, "info": dict(out.info)})
            self.record(EventType.TRAINING_FINISHED, key, {
                "trainer": job.trainer, "parent_id": job.parent.id, "settings": dict(job.settings),
                "seeds": list(job.seeds), "env_steps": result.env_steps, "error": result.error,
                "seconds": result.seconds, "outputs": outputs})
            event = self.recorded(key)
        return self._recorded_training(job, event.payload)

    def _recorded_training(self, job: Any, p: Mapping[str, Any]) -> Any:
        """The result a ``training_finished`` payload records, checked against ``job.answer`` again; its env
        steps are charged to the usage."""
        steps = p.get("env_steps")
        steps = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else job.env_steps
        self.usage.env_steps += steps
        self.usage.training_env_steps += steps
        try:
            if p["error"] is not None:
                return TrainingResult((), steps, clean(str(p["error"]), 500), float(p.get("seconds", 0.0)))
            outs = tuple(TrainingOutput({role: self.artifact(h) for role, h in o["artifacts"].items()}, dict(o["info"]))
                         for o in p["outputs"])
            checked = accept(job, TrainingResult(outs, steps, None, float(p.get("seconds", 0.0))))
        except Exception as exc:  # noqa: BLE001 - a malformed event recorded by an older ratchet
            return TrainingResult((), steps, f"the recorded training answer cannot be read ({type(exc).__name__})")
        if checked.error is not None:
            return checked
        outs = tuple(TrainingOutput(o.artifacts, {**o.info, "artifacts": dict(r["artifacts"])})
                     for o, r in zip(checked.outputs, p["outputs"]))
        return TrainingResult(outs, steps, None, checked.seconds)

    def exchange(self, key: str, request: Any, call: Callable[[], Reply]) -> Reply:
        """A refiner's request to an outside service (an LLM endpoint, say), made at most once per run: see
        :class:`~ratchet.refiners.registry.RefinerContext` ``exchange``. A resumed or replayed run reads
        the recorded reply and never calls the service again — except a failed request that the run
        stopped at (:meth:`stopped_at`): that one is made again and recorded as ``KEY~2`` (``~3``, ...), so a
        run stopped by a dead endpoint resumes once it works, and one that went on past a failure replays
        it as it was. Failed requests (no body) are counted for the generation's note. (The event type
        ``llm_call`` and the key prefix ``llm/`` are names from the first refiner that used this; they stay
        so older ledgers resume.)"""
        return self.exchange_all([(key, request, call)])[0].result()

    def exchange_all(self, items: Sequence[tuple[str, Any, Callable[[], Reply]]]) -> list[Future[Reply]]:
        """Several requests as :meth:`exchange` makes one, at once: see
        :class:`~ratchet.refiners.registry.RefinerContext` ``exchange_all``. The ledger is read and written in
        this thread only: the calls not yet recorded run in threads of their own, and each reply is recorded here
        as it arrives (``llm_call`` events in the order the replies came); failed requests are counted for the
        generation's note in the order given."""
        out: list[Future[Reply]] = [Future() for _ in items]
        todo: list[tuple[int, str, Any, Callable[[], Reply]]] = []
        for i, (key, request, call) in enumerate(items):
            event, ekey = self._exchanged(key)
            if event is None:
                todo.append((i, ekey, request, call))
            else:
                out[i].set_result(self._recorded_reply(event))
        for j, done in as_they_finish([call for _, _, _, call in todo]):
            i, ekey, request, _ = todo[j]
            try:
                body, info = done.result()
            except Exception as exc:  # noqa: BLE001 - the caller's to judge (out of time, no key): nothing recorded
                out[i].set_exception(exc)
                continue
            request_digest = self.store_artifact(json.dumps(request, sort_keys=True).encode())
            body_digest = None if body is None else self.store_artifact(body.encode("utf-8"))
            self.record(EventType.LLM_CALL, ekey, {**info, "request": request_digest, "response": body_digest})
            out[i].set_result(self._recorded_reply(self.recorded(ekey)))
        for fut in out:
            if fut.exception() is None and fut.result()[0] is None:
                self._failures.append(str(fut.result()[1].get("error") or "request failed"))
        return out

    def _exchanged(self, key: str) -> tuple[Event | None, str]:
        """A request's recorded ``llm_call`` event (None: to be made) and its ledger key: ``llm/KEY``, or ``KEY~N``
        for a failed request the run stopped at, made again (see :meth:`exchange`)."""
        ekey = f"llm/{key}"
        event, n = self.ledger.get(ekey), 1
        while event is not None and (again := self.ledger.get(f"{ekey}~{n + 1}")) is not None:
            event, n = again, n + 1  # a failed request the run stopped at, tried again by a later session
        if event is not None and event.payload.get("response") is None and self.stopped_at(event):
            event, ekey = None, f"{ekey}~{n + 1}"
        return event, ekey

    def exchange_ahead(self, items: Sequence[tuple[str, Any, Callable[[], Reply]]]) -> list[Sent]:
        """Requests as :meth:`exchange` makes them, sent without waiting: see
        :class:`~ratchet.refiners.registry.RefinerContext` ``exchange_ahead``. A recorded reply comes back at once,
        and so does one an earlier session received (the journal ``run_dir/received/``); each other ``call`` runs in a
        thread of its own, which writes its answer (a body, not a failure) to the journal atomically as soon as it has
        it. Recording (``llm_call``, the failures counted for the generation's note) happens in :meth:`Sent.take`,
        called in the loop's thread: the ledger and the usage are never touched by those threads."""
        from ratchet.safefile import write_bytes

        out: list[Sent] = []
        for key, request, call in items:
            event, ekey = self._exchanged(key)
            reply: Future[Reply] = Future()
            if event is not None:
                reply.set_result(self._recorded_reply(event))
                out.append(Sent(reply, self._count_failure))
                continue
            journal = self.run_dir / "received" / (hashlib.sha256(ekey.encode()).hexdigest()[:32] + ".json")
            got = _journaled(journal, ekey)
            if got is not None:
                reply.set_result(got)
            else:
                def receive(call: Callable[[], Reply] = call, reply: Future[Reply] = reply, journal: Path = journal,
                            ekey: str = ekey) -> None:
                    try:
                        body, info = call()
                    except BaseException as exc:  # noqa: BLE001 - the caller's to judge when it takes the reply
                        reply.set_exception(exc)
                        return
                    if body is not None:
                        try:
                            write_bytes(journal, json.dumps({"key": ekey, "body": body, "info": info}).encode())
                        except (OSError, TypeError, ValueError):  # no journal: the answer is still taken from here
                            pass
                    reply.set_result((body, info))

                threading.Thread(target=receive, daemon=True, name="ratchet-ahead").start()
            out.append(Sent(reply, functools.partial(self._record_reply, ekey, request)))
        return out

    def _record_reply(self, ekey: str, request: Any, reply: Reply) -> Reply:
        """Record a reply as :meth:`exchange_all` does (``llm_call`` under ``ekey``, request and body as artifacts)
        and return it as recorded; a failure counts for the generation's note."""
        body, info = reply
        request_digest = self.store_artifact(json.dumps(request, sort_keys=True).encode())
        body_digest = None if body is None else self.store_artifact(body.encode("utf-8"))
        self.record(EventType.LLM_CALL, ekey, {**info, "request": request_digest, "response": body_digest})
        return self._count_failure(self._recorded_reply(self.recorded(ekey)))

    def _count_failure(self, reply: Reply) -> Reply:
        """``reply``, its failure (no body) counted for the generation's note."""
        if reply[0] is None:
            self._failures.append(str(reply[1].get("error") or "request failed"))
        return reply

    def _recorded_reply(self, event: Event) -> Reply:
        """The ``(body, record)`` an ``llm_call`` event records (the body read from its artifact; None when the
        request failed)."""
        p = dict(event.payload)
        return (None if p["response"] is None else self.artifact(p["response"]).decode("utf-8")), p

    def stopped_at(self, event: Any) -> bool:
        """Whether an earlier session stopped right after ``event`` (a recorded failed request): nothing but
        other requests, ``run_failed`` and ``run_resumed`` came after it. Such a failure is tried again (a
        resumed run whose endpoint works again goes on); one the run went on past is read back as recorded,
        so the run replays as it ran."""
        if self._last_work_seq is None:
            events = self.ledger.read()
            idle = (EventType.LLM_CALL, EventType.RUN_FAILED, EventType.RUN_RESUMED)
            self._last_work_seq = max([0] + [e.seq for e in events if e.type not in idle])
            self._session_seq = max([0] + [e.seq for e in events])
        return self._last_work_seq < event.seq <= self._session_seq

    def time_left(self) -> float | None:
        """Seconds of ``[budget] wall_clock_s`` left (None without that budget; 0 when spent)."""
        limit = self.spec.budget.wall_clock_s
        if limit is None:
            return None
        return max(0.0, limit - self.elapsed())

    def elapsed(self) -> float:
        """Seconds the run has been active: earlier sessions' (:meth:`continue_clock`) and this one's so far."""
        return self._clock_offset + time.monotonic() - self._session_start

    def continue_clock(self, seconds: float) -> None:
        """Count the run's wall clock on from ``seconds`` (what earlier sessions were active; a resumed run)."""
        self._clock_offset = seconds

    def tick_clock(self) -> None:
        """Bring the usage's wall clock (``usage.wall_clock_s``) up to :meth:`elapsed`."""
        self.usage.wall_clock_s = self.elapsed()

    def begin_generation(self, generation: int) -> bool:
        """Start ``generation``: the usage's wall clock brought up to date, and whether the ledger already holds the
        generation (a resumed run replays it: a candidate it never proposed is then a divergence,
        :meth:`record_candidates`). Returns that."""
        self._replaying = self.ledger.get(f"generation/{generation}") is not None
        self.tick_clock()
        return self._replaying

    def reserve_for_traces(self, spare: tuple[float, float]) -> None:
        """What trace replays (:meth:`trace_worst`) may spend in this generation: (env steps, episodes) of the budget
        its planned work leaves (:meth:`~ratchet.planner.Pricing.spare`)."""
        self._spare = spare

    def begin_requests(self) -> None:
        """Start counting the generation's failed requests to outside services (:meth:`exchange`)."""
        self._failures = []

    def failed_requests(self) -> tuple[str, ...]:
        """The errors of the requests to outside services that failed since :meth:`begin_requests`."""
        return tuple(self._failures)

    def see_training_returns(self, evaluations: Sequence[Evaluation]) -> None:
        """Widen the range of training returns seen (the betting gate's bound when no return range is set,
        :meth:`lower_bound`)."""
        for e in evaluations:
            for ep in e.episodes:
                if ep.error is None:
                    self._train_returns = [min(self._train_returns[0], ep.episode_return),
                                           max(self._train_returns[1], ep.episode_return)]

    def next_level(self) -> float:
        """The significance level the run's next contested decision is tested at (alpha spending, fallback rule)."""
        from ratchet.gate import fallback_level

        return fallback_level(self.gate.alpha, self._n_contested + 1, self.gate.spending, self._carry)

    def screen_proposals(self, arm: str, parent: Candidate, proposals: list[Candidate], generation: int,
                         screened: Sequence[Rejection] = ()) -> tuple[list[Candidate], dict[str, str]]:
        """Check every proposal before any episode runs — new source against the checks, and each one against what
        the run has already scored (:meth:`duplicate_problem`, with ``[planner] reject_duplicates``) — and record
        what failed — ``screened`` (the refiner's own failed proposals, :meth:`Refiner.take_rejections`) and those
        refused here — as ``proposal_rejected`` events (the rejected source stored as an artifact).

        Returns:
            ``(kept, refused)``: the proposals that may run, in order, and the reason (one line) each refused one
            was refused for, by candidate id (for :meth:`~ratchet.refiners.Refiner.refused`).
        """
        rejected = list(screened)
        kept: list[Candidate] = []
        refused: dict[str, str] = {}
        batch: dict[str, tuple[str, int]] = {}  # the normal ids of the proposals kept so far
        for cand in proposals:
            reason, detail = self.source_problem(cand, parent), {"candidate_id": cand.id}
            if reason is None and self.spec.planner.reject_duplicates:
                reason, other = self.duplicate_problem(cand, batch, generation)
                detail.update({"duplicate_of": other} if other is not None else {})
            if reason is None:
                kept.append(cand)
            else:
                refused.setdefault(cand.id, reason)
                kind = RejectionKind.DUPLICATE if "duplicate_of" in detail else RejectionKind.UNUSABLE
                rejected.append(Rejection(arm, cand.parent_id, reason, cand.source, detail, kind))
        for i, r in enumerate(rejected):
            self.record(EventType.PROPOSAL_REJECTED, f"rejected/{generation}/{arm}/{i}", {
                "generation": generation, "refiner": r.refiner, "parent_id": r.parent_id, "reason": r.reason,
                "kind": r.kind.value, **self.stored_source(r.source), "detail": dict(r.detail)})
        return kept, refused

    def duplicate_problem(self, cand: Candidate, batch: dict[str, tuple[str, int]], generation: int
                          ) -> tuple[str | None, str | None]:
        """Whether ``cand`` is a candidate the run has already scored (recorded, :meth:`record_candidates`) or kept in
        this ``batch``: the same content, or the same normal form (:func:`~ratchet.proposals.normal_id`: for Python,
        the same code up to formatting, comments and docstrings, with the same values). Adds a new one to ``batch``.

        Returns:
            ``(reason, candidate id of the one it duplicates)``, or ``(None, None)``.
        """
        from ratchet.proposals import normal_id

        key = normal_id(cand)
        seen = self._scored.get(key) or batch.get(key)
        if seen is None:
            batch[key] = (cand.id, generation)
            return None, None
        other, when = seen
        same = ("the same candidate as" if other == cand.id else
                "the same program (up to formatting, comments and docstrings) with the same values as")
        where = f"proposed in generation {when}" if when else "the starting policy"
        return f"duplicate: {same} candidate {other} ({where}); you proposed this already", other

    def stored_source(self, source: str | None) -> dict[str, Any]:
        """How a rejected source is kept: an artifact, or for one over
        :data:`~ratchet.proposals.MAX_SOURCE_CHARS` only its first 2,000 characters as the artifact, with its
        length and SHA-256 digest (``source_cut``), so an answer of any size cannot bloat the ledger."""
        from ratchet.proposals import MAX_SOURCE_CHARS

        if source is None:
            return {"source": None}
        if len(source) <= MAX_SOURCE_CHARS:
            return {"source": self.store_artifact(source.encode("utf-8"))}
        data = source.encode("utf-8", errors="replace")
        return {"source": self.store_artifact(source[:2000].encode("utf-8", errors="replace")),
                "source_cut": {"chars": len(source), "sha256": hashlib.sha256(data).hexdigest()}}

    def source_problem(self, cand: Candidate, parent: Candidate) -> str | None:
        """Why a candidate that carries a program may not run (None when it may): new source that fails
        :func:`~ratchet.proposals.check_source`, or values that do not fit its source's ``PARAMETERS`` (names
        and bounds, an int parameter's integer, a categorical one's choice; checked for every proposal, so a refiner that
        proposes out-of-bounds values is refused)."""
        if cand.kind not in SOURCE_KINDS | FOLDER_KINDS:
            return None
        from ratchet.errors import PolicyError
        from ratchet.policies import read_program
        from ratchet.proposals import check_source

        digest = hashlib.sha256(cand.source.encode()).hexdigest()
        if cand.source == self.program.source:
            self._checked.setdefault(digest, self.program)
        if digest not in self._checked:
            try:
                if cand.kind in FOLDER_KINDS:  # a folder: its marked regions must read
                    self._checked[digest] = read_program(cand.kind, cand.source)
                else:
                    dims = self.task.dims() if uses_task_dims(cand.source) else None
                    self._checked[digest] = check_source(cand.source, dims=dims, functions=self.task.functions)
            except PolicyError as exc:
                self._checked[digest] = str(exc)
        program = self._checked[digest]
        if isinstance(program, str):
            return program
        names = {p.name for p in program.parameters}
        if set(cand.params) != names:
            return (f"parameter values {sorted(cand.params)} do not match the source's PARAMETERS "
                    f"{sorted(names)}")
        for p in program.parameters:
            why = p.problem(cand.params[p.name])  # bounds, an int's type, a choice among its choices
            if why is not None:
                return f"parameter {p.name!r} {why}"
        return None

    def recorded(self, key: str) -> Event:
        """The event recorded under ``key`` (just appended, or read back).

        Raises:
            LedgerError: the ledger holds no such event (it lost an append).
        """
        event = self.ledger.get(key)
        if event is None:
            raise LedgerError(f"{self.ledger.location} holds no event {key!r} although it was just recorded")
        return event

    def record(self, type: EventType, key: str, payload: dict[str, Any]) -> None:
        self.ledger.append(type, key, {**payload, **self.event_tag})

    def record_many(self, events: Sequence[tuple[EventType, str, dict[str, Any]]]) -> None:
        """:meth:`record` each ``(type, key, payload)``, committed together where the store can (one ``fsync``)."""
        if events:
            self.ledger.append_many([(t, k, {**p, **self.event_tag}) for t, k, p in events])

    def restore(self, events: Sequence[Any]) -> None:
        """Take up where the loop left off, for work appended to the ledger after it (a correction round,
        :mod:`ratchet.correction_round`): the usage counters, the gate's alpha spending (contested decisions
        so far, the level a promotion passes on) and the range of training returns, from ``events``."""
        from ratchet.ledger.projection import project

        st = project(list(events))
        self._n_contested, self._carry, self._train_returns = 0, 0.0, [math.inf, -math.inf]
        self.usage.env_steps, self.usage.episodes = st.env_steps, st.episodes
        self.usage.validation_env_steps, self.usage.training_env_steps = st.validation_env_steps, st.training_env_steps
        for ev in events:
            p = ev.payload
            if ev.type is EventType.GATE_DECIDED:
                self._n_contested += bool(p.get("contested"))
                self._carry = float(p["alpha"]) if p["promoted"] else 0.0
            elif ev.type is EventType.EPISODES_EVALUATED and p["split"] == "train":
                returns = [e["episode_return"] for e in p["episodes"] if e["error"] is None]
                if returns:
                    self._train_returns = [min(self._train_returns[0], *returns),
                                           max(self._train_returns[1], *returns)]

    def record_candidate(self, cand: Candidate, generation: int) -> None:
        self.record_candidates([cand], generation)

    def record_candidates(self, cands: Sequence[Candidate], generation: int) -> None:
        """Record the proposal of ``cands`` in ``generation`` (one commit for all).

        Raises:
            LedgerError: a resumed run proposes a candidate its ledger never saw (it diverged).
        """
        from ratchet.proposals import normal_id

        events = []
        for cand in cands:
            key = f"proposed/{generation}/{cand.id}"
            if self._replaying and self.ledger.get(key) is None:
                raise LedgerError(f"resume diverged from the ledger at generation {generation} (candidate {cand.id} "
                                  "was never proposed before); were package versions changed since the run started?")
            self._scored.setdefault(normal_id(cand), (cand.id, generation))
            d = cand.to_dict()
            if d["source"] == self.program.source:
                d["source"] = None  # the run's policy source, stored once in run_started
            events.append((EventType.CANDIDATE_PROPOSED, key, {"generation": generation, "candidate": d}))
        self.record_many(events)

    def evaluate(self, candidates: Sequence[Candidate], seeds: Sequence[int], split: str,
                 generation: int) -> dict[str, Evaluation]:
        """Execute (or read back from the ledger) each candidate's episodes on ``seeds``."""
        out, todo = self._read_back(candidates, seeds, split)
        jobs = self._jobs(todo, seeds)
        recording = self._recording(candidates, seeds, split, jobs)
        try:
            ran, faults = self._execute([(todo, seeds, split, generation)], recording.paths)
        finally:
            recording.close()
        out.update(ran[0])
        for key in recording.keys:  # the data set grows in the same order on every replay
            event = self.ledger.get(key)
            if event is not None and event.payload.get("artifact"):
                self._transitions.append(event.payload["artifact"])
        if faults:
            from ratchet.errors import TaskError

            raise TaskError(f"{faults[0].error} — the task's fault, not the candidate's; if it was passing (a file, "
                            "a service), `ratchet resume` retries; else fix it and start a new run (a run keeps the "
                            "task it started with: its evaluator or opponents)")
        if split == "train":  # for the critique service: each candidate's latest training episodes
            self._latest_train.update({c.id: (c, out[c.id]) for c in candidates if c.id in out})
            for cand_id in dict.fromkeys(c.id for c in candidates):  # a game's payoff per opponent (league table)
                for row in by_opponent(out[cand_id]):
                    acc = self._payoffs.setdefault(cand_id, {}).setdefault(row["opponent"], [0.0, 0])
                    acc[0] += row["mean"] * row["n"]
                    acc[1] += row["n"]
        # every env step of every episode counts, whatever ended it (terminated, truncated, error, timeout);
        # a candidate listed twice ran once; on a deterministic task an evaluation read back (a candidate proposed
        # again) ran once too (a resumed run counts the same, in the same order)
        for cand_id in dict.fromkeys(c.id for c in candidates):
            ev = out[cand_id]
            if self.task.deterministic:
                key = eval_key(split, cand_id, seeds)
                if key in self._counted:
                    continue
                self._counted.add(key)
            if split != "test":
                self.usage.env_steps += ev.env_steps
                self.usage.episodes += ev.n
                if split in ("validation", "league"):  # a game league's games before a promotion certify too
                    self.usage.validation_env_steps += ev.env_steps
        return out

    def _read_back(self, candidates: Sequence[Candidate], seeds: Sequence[int], split: str
                   ) -> tuple[dict[str, Evaluation], list[Candidate]]:
        """The candidates' evaluations on ``seeds`` the ledger holds, by candidate id, and the (unique) candidates it
        does not hold yet, in order. An evaluation run ahead (:meth:`run_ahead`) is counted in the usage from here
        on (:attr:`ahead` no longer holds it)."""
        out: dict[str, Evaluation] = {}
        todo: list[Candidate] = []
        for cand in dict.fromkeys(candidates):  # unique, in order
            key = eval_key(split, cand.id, seeds)
            event = self.ledger.get(key)
            if event is not None:
                eps = tuple(Episode.from_dict(e) for e in event.payload["episodes"])
                out[cand.id] = Evaluation(cand.id, split, eps)
                self.ahead.pop(key, None)
            else:
                todo.append(cand)
        return out, todo

    def _jobs(self, candidates: Sequence[Candidate], seeds: Sequence[int]) -> list[Job]:
        return [Job(c, s, {h: self.artifact(h) for h in c.artifacts.values()}) for c in candidates for s in seeds]

    def _execute(self, groups: Sequence[tuple[Sequence[Candidate], Sequence[int], str, int]],
                 render: Mapping[int, str] | None = None) -> tuple[list[dict[str, Evaluation]], list[Episode]]:
        """Run every group's ``(candidates, seeds, split, generation)`` episodes in one executor call, each candidate's
        evaluation recorded under its group's key (:func:`eval_key`) soon after its last episode completes (committed
        together within :data:`_GROUP_COMMIT_S`, and on the way out, even interrupted). Evaluations are recorded in
        the call's order of candidates, never in the order they happened to complete: one that completes before an
        earlier one waits for it (on the way out, whatever completed is recorded, still in that order), so a run's
        ledger is the same event for event whatever the timing of its episodes. Nothing is counted in the usage
        here. ``render``: the transitions' file of a job (by job index, the groups' jobs in order) where it records
        them (:meth:`_recording`). The executor's env-step cap is what the budget leaves after the usage and the work
        run ahead (:attr:`ahead`).

        Returns:
            ``(evaluations, faults)``: each group's evaluations by candidate id (those whose episodes all completed
            with no task fault), and the episodes the task itself failed (never recorded).
        """
        jobs: list[Job] = []
        where: list[int] = []  # job index -> group index
        for g, (cands, seeds, _, _) in enumerate(groups):
            jobs += self._jobs(cands, seeds)
            where += [g] * (len(cands) * len(seeds))
        out: list[dict[str, Evaluation]] = [{} for _ in groups]
        done: dict[tuple[int, str], dict[int, Episode]] = {}
        faults: list[Episode] = []  # episodes the task itself failed (an evaluator that raised): never recorded
        unsaved: list[tuple[EventType, str, dict[str, Any]]] = []  # evaluations not yet committed
        since = [0.0]  # when the first of them completed
        order = list(dict.fromkeys((where[i], job.candidate.id) for i, job in enumerate(jobs)))  # the call's order
        ready: dict[tuple[int, str], list[tuple[EventType, str, dict[str, Any]]]] = {}  # complete, not yet released
        released = [0]  # how many of ``order`` went to ``unsaved``

        def on_episode(i: int, ep: Episode) -> None:  # record each candidate soon after it completes
            g, cand = where[i], jobs[i].candidate
            _, seeds, split, generation = groups[g]
            mine = done.setdefault((g, cand.id), {})
            mine[i] = ep
            if ep.diagnostics.get("fault"):
                faults.append(ep)
            if len(mine) < len(seeds):
                return
            # its episodes' transitions before the evaluation that ran them: a resumed run finds them together
            events = [self._transitions_event(cand, mine[k], render[k], generation)
                      for k in sorted(mine) if render and k in render]
            if not any(e.diagnostics.get("fault") for e in mine.values()):
                eps = tuple(mine[k] for k in sorted(mine))
                ev = Evaluation(cand.id, split, eps)
                events.append((EventType.EPISODES_EVALUATED, eval_key(split, cand.id, seeds),
                               {"candidate_id": cand.id, "split": split, "generation": generation,
                                "seeds": list(seeds), "summary": ev.summary(), "episodes": [e.to_dict() for e in eps]}))
                out[g][cand.id] = ev
            ready[(g, cand.id)] = events
            release()
            if unsaved and time.monotonic() - since[0] >= _GROUP_COMMIT_S:
                save()

        def release(everything: bool = False) -> None:  # the complete ones at the head of the call's order
            while released[0] < len(order) and (everything or order[released[0]] in ready):
                events = ready.pop(order[released[0]], [])
                if events and not unsaved:
                    since[0] = time.monotonic()
                unsaved.extend(events)
                released[0] += 1

        def save() -> None:  # one commit for the evaluations released within the last _GROUP_COMMIT_S
            self.record_many(unsaved)
            unsaved.clear()

        cap = None
        if self.caps_steps and any(split != "test" for _, _, split, _ in groups) and self.spec.budget.env_steps is not None:
            cap = max(0, self.spec.budget.env_steps - self.usage.env_steps - sum(self.ahead.values()))
        extra: dict[str, Any] = {} if cap is None else {"max_env_steps": cap}
        if render:
            extra["render_paths"] = [render.get(i) for i in range(len(jobs))]
        try:
            self.executor.run(self.task, jobs, on_episode, **extra)
        finally:
            release(everything=True)  # also when interrupted or capped: what completed is kept for the resume
            save()
        return out, faults

    def run_ahead(self, groups: Sequence[tuple[Sequence[Candidate], Sequence[int], str, int]]) -> None:
        """Run several evaluations in one executor call (``[planner] overlap_gate``: a validation beside the next
        generation's training episodes), each recorded under its own key as :meth:`evaluate` records it, and counted
        nowhere yet: the loop reads each back with :meth:`evaluate` (which counts it then) when its turn comes, so a
        run killed between the two reads them back on resume. What the ledger holds already is not run again. Until
        read back, their env steps are kept in :attr:`ahead` (the executor's env-step cap leaves room for nothing
        beyond them). A task fault leaves that evaluation unrecorded (the read-back runs it, and stops there)."""
        todo = []
        for cands, seeds, split, generation in groups:
            got, missing = self._read_back(cands, seeds, split)
            self.ahead.update({eval_key(split, cid, seeds): ev.env_steps for cid, ev in got.items()})
            todo.append((missing, seeds, split, generation))
        ran, _ = self._execute(todo)
        for (_, seeds, split, _), evs in zip(todo, ran):
            self.ahead.update({eval_key(split, cid, seeds): ev.env_steps for cid, ev in evs.items()})

    def _recording(self, candidates: Sequence[Candidate], seeds: Sequence[int], split: str,
                   jobs: Sequence[Job]) -> _Recording:
        """Which of an evaluation's episodes record their transitions for the world model (``[model] screen``): the
        first ``[model] record_episodes`` training episodes (candidates in order, then seeds), where the executor
        records on the trusted side (``capabilities.records_traces``); the render paths of those still to run."""
        model = self.spec.model
        if not model.screen or split != "train" or not self.capabilities.records_traces:
            return _Recording([], {}, None)
        wanted = [(c.id, s) for c in dict.fromkeys(candidates) for s in seeds][:model.record_episodes]
        keys = [f"transitions/{cid}/{seed}" for cid, seed in wanted]
        todo = {(j.candidate.id, j.seed): i for i, j in enumerate(jobs)}
        run = [todo[w] for w, key in zip(wanted, keys) if w in todo and self.ledger.get(key) is None]
        if not run:
            return _Recording(keys, {}, None)
        import tempfile

        from ratchet.worldmodel.transitions import TRANSITIONS_SUFFIX

        folder = tempfile.mkdtemp(prefix="ratchet-transitions-")
        return _Recording(keys, {i: str(Path(folder) / f"{i}{TRANSITIONS_SUFFIX}") for i in run}, folder)

    def _transitions_event(self, cand: Candidate, ep: Episode, path: str, generation: int
                           ) -> tuple[EventType, str, dict[str, Any]]:
        """Store one episode's transitions (written by the trusted env host; read as untrusted bytes all the same)
        and return the event that records them (``transitions_recorded``); a file that is missing or malformed is
        recorded as such."""
        from ratchet.worldmodel.transitions import Transitions, TransitionsError

        digest, rows, error = None, 0, None
        try:
            data = Path(path).read_bytes()
            rows = len(Transitions.from_bytes(data))
            digest = self.store_artifact(data) if rows else None
        except (OSError, TransitionsError) as exc:
            error = clean(str(exc), 300)
        return (EventType.TRANSITIONS_RECORDED, f"transitions/{cand.id}/{ep.seed}", {
            "candidate_id": cand.id, "seed": ep.seed, "generation": generation, "rows": rows, "artifact": digest,
            "error": error})

    def transitions(self) -> list[str]:
        """The world model's data set so far: artifact digests of recorded transitions, oldest first (the same list
        at the same point of a resumed run)."""
        return list(self._transitions)

    def evaluate_cascade(self, arm: str, contenders: Sequence[Candidate], incumbent: Candidate, seeds: Sequence[int],
                         generation: int) -> tuple[dict[str, Evaluation], dict[str, tuple[str, Evaluation]]]:
        """A generation's training evaluations in two stages (``[planner] cascade_episodes`` = k > 0): every contender
        and ``incumbent`` on the first k ``seeds``, then only the contenders the cascade keeps
        (:meth:`~ratchet.planner.IncumbentPlanner.cascade_drop`) and the incumbent on the rest, each stage recorded
        under its own evaluation key (:func:`eval_key` of its seeds), so a resumed run reads both back. Each dropped
        contender is recorded as ``proposal_rejected`` (key ``rejected/GEN/ARM/cascade/ID``; ``detail``: the stage's
        ``episodes`` and ``env_steps``, its ``mean`` and the ``threshold``). Nothing is dropped when the env-step cap
        cut the first stage short (the loop judges nothing from it).

        Returns:
            ``(train, dropped)``: every evaluation on all of ``seeds`` (the kept contenders' and the incumbent's; the
            first stage's only, when it was cut short), and the dropped contenders' ``(why, first-stage evaluation)``,
            by candidate id.
        """
        from ratchet.planner import IncumbentPlanner

        k, margin = self.spec.planner.cascade_episodes, self.spec.planner.cascade_margin
        first = self.evaluate([*contenders, incumbent], seeds[:k], "train", generation)
        if any(_cut(e) for e in first.values()):
            return first, {}
        reasons = {c.id: why for c in dict.fromkeys(contenders) if c.id != incumbent.id
                   and (why := IncumbentPlanner.cascade_drop(first[c.id], first[incumbent.id], margin)) is not None}
        parents = {c.id: c.parent_id for c in contenders}
        for cid, why in reasons.items():
            ev = first[cid]
            self.record(EventType.PROPOSAL_REJECTED, f"rejected/{generation}/{arm}/cascade/{cid}", {
                "generation": generation, "refiner": arm, "parent_id": parents[cid], "reason": why,
                "kind": RejectionKind.CASCADE.value, "source": None,
                "detail": {"candidate_id": cid, "stage": 1, "episodes": ev.n, "env_steps": ev.env_steps,
                           "mean": ev.mean, "threshold": first[incumbent.id].mean - margin * first[incumbent.id].std}})
        kept = [c for c in [*contenders, incumbent] if c.id not in reasons]
        rest = self.evaluate(kept, seeds[k:], "train", generation)
        train = {cid: Evaluation(cid, "train", first[cid].episodes + ev.episodes) for cid, ev in rest.items()}
        self._latest_train.update({c.id: (c, train[c.id]) for c in kept})  # the critique service reads all seeds
        return train, {cid: (why, first[cid]) for cid, why in reasons.items()}

    def critique_of(self, candidate_id: str, traces: int = 0, last_steps: int = 10) -> Any:
        """The critique of a candidate's latest training evaluation in this run, with traces of its worst
        episodes (see :class:`~ratchet.refiners.registry.RefinerContext` ``critique``), or None.

        Args:
            candidate_id: The candidate.
            traces: Most worst episodes to replay for their last steps (0: none).
            last_steps: Env steps each trace keeps (the last ones; at most :data:`ratchet.trace.MAX_STEPS`).
        """
        from dataclasses import replace

        from ratchet.trace import MAX_STEPS

        got = self._latest_train.get(candidate_id)
        if got is None:
            return None
        cand, ev = got
        crit = self.critic.critique(ev)
        if traces > 0 and last_steps > 0:
            found = self.trace_worst(cand, ev, min(int(traces), 10))
            if found:
                keep = min(int(last_steps), MAX_STEPS)
                crit = replace(crit, traces=tuple(replace(t, steps=t.steps[-keep:]) for t in found))
        return crit

    def trace_worst(self, cand: Candidate, ev: Evaluation, n: int) -> list[Any]:
        """Traces of up to ``n`` of the evaluation's worst episodes (lowest return first): read back from
        ``episode_traced`` events, or replayed now (in the executor, on the trusted side) where the spare
        budget (:meth:`spare_budget`) pays for their recorded lengths and the executor records traces
        (``capabilities.records_traces``). Each replay is charged to the usage once per session, as re-evaluation."""
        import shutil
        import tempfile

        from ratchet.trace import Trace, TraceError, read_trace

        worst = sorted((e for e in ev.episodes if e.error != BUDGET_SKIP), key=lambda e: (e.episode_return, e.seed))
        chosen, todo = [], []
        steps, episodes = self._spare
        for ep in worst[:n]:
            key = f"trace/{cand.id}/{ep.seed}"
            if key not in self._traces:  # first read this session: it spends its share (recorded or not), so a
                if self.ledger.get(key) is None:  # resumed run makes the same choices as the first
                    if not self.capabilities.records_traces or ep.length > steps or episodes < 1:
                        continue
                    todo.append(ep)
                steps, episodes = steps - ep.length, episodes - 1
            chosen.append(key)
        self._spare = (steps, episodes)
        if todo:
            folder = tempfile.mkdtemp(prefix="ratchet-trace-")
            try:
                paths = [str(Path(folder) / f"{i}.json") for i in range(len(todo))]
                jobs = [Job(cand, ep.seed, {h: self.artifact(h) for h in cand.artifacts.values()}) for ep in todo]
                replays = self.executor.run(self.task, jobs, render_paths=paths)
                for ep, replay, path in zip(todo, replays, paths):
                    try:
                        trace, error = read_trace(path).to_dict(), None
                    except TraceError as exc:
                        trace, error = None, str(exc)
                    self.record(EventType.EPISODE_TRACED, f"trace/{cand.id}/{ep.seed}", {
                        "candidate_id": cand.id, "seed": ep.seed, "env_steps": int(replay.length),
                        "matches": replay.episode_return == ep.episode_return and replay.length == ep.length,
                        "error": error or replay.error, "trace": trace})
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        out = []
        for key in chosen:
            if key not in self._traces:
                p = self.recorded(key).payload
                self.usage.env_steps += int(p["env_steps"])
                self.usage.episodes += 1
                self.usage.reeval_env_steps += int(p["env_steps"])
                try:
                    self._traces[key] = None if p.get("trace") is None else Trace.from_dict(p["trace"])
                except TraceError:
                    self._traces[key] = None
            if self._traces[key] is not None:
                out.append(self._traces[key])
        return out

    def decide(self, generation: int, best: Candidate, incumbent: Candidate, inc_val: Evaluation,
               label: str | int | None = None, cap: int | None = None) -> tuple[Any, Evaluation, Evaluation]:
        """Validate ``best`` and let the gate decide it against ``incumbent`` as the run's next decision
        (alpha spending counts it), recording ``gate_decided`` and, when it promotes, ``incumbent_changed``
        (keys ``gate/LABEL/ID`` and ``incumbent/LABEL/ID``; ``label`` defaults to the generation). ``cap``: the most
        validation seeds it reads (default all; chosen before any of the candidate's validation episodes is seen, so
        the test's level holds).

        Returns:
            ``(decision, candidate validation, incumbent validation)``: the decision is None when the
            env-step budget cut validation short (nothing recorded); a sequential gate may have extended
            the incumbent's validation to more seeds.
        """
        label = generation if label is None else label
        decision, cand_val, inc_val = self.validate(generation, best, incumbent, inc_val, cap)
        if decision is None:
            return None, cand_val, inc_val
        guard = self.spec.gate.worse_against_any
        if decision.promoted:  # the refusals that guard against strategy cycles (games); they never promote
            from dataclasses import replace

            from ratchet.gate import worse_against

            why = None if guard is None else worse_against(
                cand_val, Evaluation(inc_val.candidate_id, "validation", inc_val.episodes[:cand_val.n]), guard)
            why = why or self._loses_to_a_rival(generation, best)
            if why is _LEAGUE_CUT:  # as a validation the budget cut short: no decision
                return None, cand_val, inc_val
            if why is not None:
                decision = replace(decision, promoted=False, reason=why)
        self._n_contested += decision.contested
        self._carry = decision.alpha if decision.promoted else 0.0
        inc_part = Evaluation(inc_val.candidate_id, "validation", inc_val.episodes[:cand_val.n])
        self.record(EventType.GATE_DECIDED, f"gate/{label}/{best.id}",
                    {"generation": generation, **decision.to_dict(),
                     "critique": self.critic.critique(cand_val, inc_part).to_dict(),
                     "candidate_validation": cand_val.summary(), "incumbent_validation": inc_part.summary(),
                     "env_steps": self.usage.env_steps})
        if decision.promoted:
            structural = {}
            if best.source != incumbent.source:  # a structural promotion: the code diffs, for show and the report
                from ratchet.proposals import promotion_changes

                structural = promotion_changes(incumbent, best)
            self.record(EventType.INCUMBENT_CHANGED, f"incumbent/{label}/{best.id}",
                        {"generation": generation, "from": incumbent.id, "to": best.id,
                         "validation_mean": cand_val.mean, "previous_validation_mean": inc_part.mean,
                         "env_steps": self.usage.env_steps, "params": dict(best.params), **structural})
            self.task_after_incumbent(best, generation, label, incumbent)
        return decision, cand_val, inc_val

    def _loses_to_a_rival(self, generation: int, best: Candidate) -> str | None:
        """Why ``best``, which the gate would promote, is refused for losing to a rival (:meth:`Task.rival_seeds`: a
        game league's members, the run's incumbents so far) on average over its games against it, or None. The
        games are recorded as split ``"league"`` and charged as validation; :data:`_LEAGUE_CUT` when the env-step
        budget cut them short (the decision is then not taken, as for a validation cut short)."""
        rivals = {name: list(seeds) for name, seeds in self.task.rival_seeds().items() if seeds}
        if not rivals:
            return None
        ev = self.evaluate([best], [s for seeds in rivals.values() for s in seeds], "league", generation)[best.id]
        if _cut(ev):
            return _LEAGUE_CUT
        failed = [e for e in ev.episodes if e.error is not None]
        if failed:  # a game it crashed, hung or cheated in is lost, whatever payoff the executor wrote down
            return (f"failed {len(failed)} of its {ev.n} league games ([task] league_games): "
                    f"{' '.join(str(failed[0].error).split())[:200]}")
        returns = {e.seed: e.episode_return for e in ev.episodes}
        mean, name = min((float(np.mean([returns[s] for s in seeds])), name) for name, seeds in rivals.items())
        if mean >= 0:
            return None
        return (f"loses to {name} (an incumbent of this run): {mean:+.3f} on average over its {len(rivals[name])} "
                "league games ([task] league_games)")

    def task_after_incumbent(self, incumbent: Candidate, generation: int = 0, label: str | int = "start",
                             retired: Candidate | None = None) -> None:
        """Let the task grow with the incumbent (:meth:`Task.after_promotion`: a game's league takes it in; called
        when the run starts and after each promotion); a changed task is recorded (``task_updated``: its training
        pool, payoff table and meta-strategy) and runs every evaluation from then on."""
        if incumbent.id not in self._incumbents:
            self._incumbents.append(incumbent.id)
        payoffs = {cid: {opp: acc[0] / acc[1] for opp, acc in self._payoffs[cid].items() if acc[1]}
                   for cid in self._incumbents if cid in self._payoffs}
        updated, notes = self.task.after_promotion(incumbent, payoffs)
        if updated is self.task:
            return
        self.task = updated
        self.record(EventType.TASK_UPDATED, f"task/{label}/{incumbent.id}",
                    {"generation": generation, "retired": retired.id if retired else None, "incumbent": incumbent.id,
                     "task": updated.to_dict(), **notes})

    def validate(self, generation: int, best: Candidate, incumbent: Candidate,
                 inc_val: Evaluation, cap: int | None = None) -> tuple[Any, Evaluation, Evaluation]:
        """Drive the gate's decision session (:meth:`~ratchet.gate.Gate.start`; a fixed-n test is one batch of
        every seed): run ``best`` on the next batch of validation seeds (the incumbent too, where its
        validation does not reach that far yet) until the gate decides. Returns the decision (None when the
        budget cut validation short), the candidate's validation evaluation on the seeds read, and the
        incumbent's (possibly extended) one."""
        session = self.gate_session(best, incumbent, cap)
        parts: list[Evaluation] = []
        while (b := session.next_batch_size()) > 0:
            lo, hi = session.n, session.n + b
            inc_val = self.extend_validation(incumbent, inc_val, hi, generation)
            part = self.evaluate([best], self.validation_seeds[lo:hi], "validation", generation)[best.id]
            if _cut(part) or inc_val.n < hi:
                return None, part, inc_val
            parts.append(part)
            session.add_evaluations(part, Evaluation(incumbent.id, "validation", inc_val.episodes[lo:hi]))
        cand_val = Evaluation(best.id, "validation", tuple(e for p in parts for e in p.episodes))
        return session.decision(), cand_val, inc_val

    def gate_session(self, best: Candidate, incumbent: Candidate, cap: int | None = None) -> Any:
        """The gate's session (:meth:`~ratchet.gate.Gate.start`) of the run's next decision on ``best`` against
        ``incumbent``, reading at most ``cap`` validation seeds (default all); opening it changes nothing, so its first
        batch (``next_batch_size()``) is known before the decision is taken."""
        n = len(self.validation_seeds) if cap is None else max(1, min(cap, len(self.validation_seeds)))
        return self.gate.start(self._n_contested + 1, n, lower_bound=self.lower_bound(),
                               candidate_id=best.id, incumbent_id=incumbent.id, carry=self._carry)

    def extend_validation(self, cand: Candidate, val: Evaluation, upto: int, generation: int) -> Evaluation:
        """``val`` (``cand`` on the first validation seeds) extended to the first ``upto`` seeds. When the
        env-step budget cuts the extension short, ``val`` comes back unchanged."""
        if val.n >= upto:
            return val
        more = self.evaluate([cand], self.validation_seeds[val.n:upto], "validation", generation)[cand.id]
        if _cut(more):
            return val
        return Evaluation(cand.id, "validation", val.episodes + more.episodes)

    def lower_bound(self) -> float | None:
        """The betting gate's lower bound on a paired difference (return units) when ``[gate] return_range`` is
        not set: 1.5 times the spread of every training return seen so far (never validation returns), so a
        difference below it is far outside what the task has shown; the gate rejects a decision that sees
        one. A safeguard rather than a guarantee: declare ``return_range`` where the task's range is known."""
        if self.spec.gate.return_range is not None:
            return None
        lo, hi = self._train_returns
        if not lo < hi:
            return -max(1.0, abs(hi) if math.isfinite(hi) else 1.0)
        return -1.5 * (hi - lo)

    def validation_price(self) -> int:
        """Validation episodes one gate is priced at (:meth:`~ratchet.gate.Gate.price`: all validation seeds
        for a fixed-n test, twice the seeds before a futility stop for a sequential one)."""
        return self.gate.price(len(self.validation_seeds))
