"""The run loop: plan → execute → critique → refine → gate, every step recorded in the ledger.

Resuming is replay: :func:`resume_run` runs the same deterministic loop again over the same ledger.
Every evaluation already recorded is read back instead of executed, and every event already
recorded is not appended twice (events are keyed), so a run killed at any point — even with
``kill -9`` — continues exactly where it stopped without recomputing or losing a completed
evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ratchet.critic import Critic, Evaluation
from ratchet.errors import EndpointError, LedgerError, RatchetError, WriterLeaseError
from ratchet.execution import BUDGET_SKIP, Executor, Job, executor_from_spec
from ratchet.execution.training import TrainingOutput, TrainingResult, accept
from ratchet.ledger import EventType, LedgerStore
from ratchet.ledger.lease import WriterLease
from ratchet.ledger.projection import active_seconds
from ratchet.ledger.rounds import unfinished_round
from ratchet.ledger.storage import LEDGER_FILE, POINTER_FILE, open_store, storage_url, write_pointer
from ratchet.planner import Budget, IncumbentPlanner, SeedSplits, Usage
from ratchet.policy import (
    SOURCE_KINDS,
    SPACE_KINDS,
    Candidate,
    PolicyProgram,
    load_policy,
    parse_policy,
    uses_task_dims,
)
from ratchet.refiners import Refiner, ThompsonAllocator
from ratchet.refiners.registry import RefinerContext, arm_names, refiner_kind
from ratchet.rollout import Episode
from ratchet.runs import lock_run_dir, new_run_id, open_for_writing, open_ledger, open_run
from ratchet.spec import RunSpec, spec_from_dict
from ratchet.tasks import Task, task_from_spec
from ratchet.text import clean

__all__ = ["LEDGER_FILE", "RunResult", "open_ledger", "open_run", "resume_run", "start_run"]

ProgressFn = Callable[[dict[str, Any]], None]


def candidates_per_generation(refiner: Refiner) -> int:
    """Evaluations a generation of ``refiner`` prices on the training seeds: its proposals, the incumbent, and
    the refiner's recommendation when it makes one (:attr:`GenerationCost.evaluations`)."""
    return refiner.generation_cost().evaluations


#: How the stop reason of a run whose starting policy failed every validation episode begins (the CLI exits 1).
BROKEN_START = "the starting policy failed all"


@dataclass(frozen=True)
class RunResult:
    """What a finished run returns.

    Attributes:
        run_dir: The run's directory (holds ``policy.py``, the report, and ``ledger.sqlite`` or, with a
            storage URL, the ``ledger.json`` pointer to the database).
        stop_reason: Why the loop stopped.
        incumbent: The final incumbent candidate.
        baseline_test: Test evaluation of the starting policy.
        test: Test evaluation of the final incumbent.
    """

    run_dir: Path
    stop_reason: str
    incumbent: Candidate
    baseline_test: Evaluation
    test: Evaluation


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("policy-ratchet", "gymnasium", "numpy", "cma", "scipy", "box2d"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def eval_key(split: str, candidate_id: str, seeds: Sequence[int]) -> str:
    """Ledger key of one candidate's evaluation on a seed list."""
    digest = hashlib.sha256(",".join(map(str, seeds)).encode()).hexdigest()[:12]
    return f"eval/{split}/{candidate_id}/{digest}"


class _Run:
    """One run's wiring. The loop in :meth:`run` holds no policy logic of its own."""

    def __init__(self, run_dir: Path, spec: RunSpec, program: PolicyProgram, ledger: LedgerStore,
                 executor: Executor, progress: ProgressFn | None, pricing: str | None = None,
                 start: Candidate | None = None, inputs: dict[str, str] | None = None, task: Task | None = None) -> None:
        self.run_dir, self.spec, self.program, self.ledger = run_dir, spec, program, ledger
        # files refiners read (path -> artifact digest); None: a new run, which reads them from base_dir
        self.inputs: dict[str, str] = dict(inputs or {})
        self._inputs_recorded = inputs is not None
        self.start = start or program.candidate()
        self._blobs: dict[str, bytes] = {}  # artifact bytes read or made this session, by digest
        self._checked: dict[str, Any] = {}  # new sources checked this session: digest -> program or reason
        self._training_seeds = 0
        self.executor, self.progress = executor, progress
        self.task = task if task is not None else task_from_spec(spec.task)
        self.splits = SeedSplits(spec.seed)
        self.budget = Budget(spec.budget)
        self.planner = IncumbentPlanner(self.splits, spec.planner.train_episodes, spec.gate.max_share, self.budget,
                                        spec.planner.gate_candidate, spec.planner.weakness_share,
                                        spec.planner.pool_size)
        self.refiners = self._build_refiners()
        names = list(self.refiners)
        self.allocator = ThompsonAllocator(names, spec.seed) if len(names) > 1 else None
        self.gate = spec.gate.build()
        # Where the executor enforces the env-step budget exactly, work is priced by the episode lengths
        # seen (with a margin) instead of the time limit, so the end of a budget is not left unused. The
        # choice is recorded when the run starts and kept on resume (the same decisions, whatever executor).
        self.caps_steps = bool(getattr(executor, "caps_env_steps", False))
        self.pricing = pricing or (spec.budget.pricing if self.caps_steps else "worst-case")
        self.price_limit = None if self.pricing == "observed" else self.task.step_limit
        self._margin = 1.25  # observed pricing: the mean episode length seen, plus this margin
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

    def _build_refiners(self) -> dict[str, Any]:
        """One refiner (or several: variants) per ``[[refiners]]`` table, from the kinds' registry."""
        entries = self.spec.refiner_entries()
        out: dict[str, Any] = {}
        for i, (entry, name) in enumerate(zip(entries, arm_names(entries))):
            kind = refiner_kind(entry["kind"])
            settings = kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")})
            ctx = RefinerContext(program=self.program, start=self.start, task=self.task, seed=self.spec.seed + 1000 * i,
                                 name=name, train=self.train, artifact=self.artifact,
                                 training_seeds=self.training_seeds, exchange=self.exchange,
                                 read_input=self.read_input, critique=self.critique_of, time_left=self.time_left)
            for ref in kind.build(settings, name, ctx):
                out[ref.name] = ref
        return out

    # -- artifacts and training jobs ------------------------------------------------------------
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
            runner = getattr(self.executor, "train", None)
            if runner is None:
                result = TrainingResult((), 0, f"executor {type(self.executor).__name__} cannot run training jobs")
            else:
                blobs = {h: self.artifact(h) for h in job.parent.artifacts.values()}
                from dataclasses import replace

                try:
                    result = runner(self.task, replace(job, artifacts=blobs), self.spec.execution.training_timeout_s)
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
            event = self.ledger.get(key)
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

    def exchange(self, key: str, request: Any, call: Callable[[], tuple[str | None, dict[str, Any]]]
                 ) -> tuple[str | None, dict[str, Any]]:
        """A refiner's request to an outside service (an LLM endpoint, say), made at most once per run: see
        :class:`~ratchet.refiners.registry.RefinerContext` ``exchange``. A resumed or replayed run reads
        the recorded reply and never calls the service again — except a failed request that the run
        stopped at (:meth:`stopped_at`): that one is made again and recorded as ``KEY~2`` (``~3``, ...), so a
        run stopped by a dead endpoint resumes once it works, and one that went on past a failure replays
        it as it was. Failed requests (no body) are counted for the generation's note. (The event type
        ``llm_call`` and the key prefix ``llm/`` are names from the first refiner that used this; they stay
        so older ledgers resume.)"""
        ekey = f"llm/{key}"
        event, n = self.ledger.get(ekey), 1
        while event is not None and (again := self.ledger.get(f"{ekey}~{n + 1}")) is not None:
            event, n = again, n + 1  # a failed request the run stopped at, tried again by a later session
        if event is not None and event.payload.get("response") is None and self.stopped_at(event):
            event, ekey = None, f"{ekey}~{n + 1}"
        if event is None:
            body, info = call()
            request_digest = self.store_artifact(json.dumps(request, sort_keys=True).encode())
            body_digest = None if body is None else self.store_artifact(body.encode("utf-8"))
            self.record(EventType.LLM_CALL, ekey, {**info, "request": request_digest, "response": body_digest})
            event = self.ledger.get(ekey)
        p = dict(event.payload)
        if p["response"] is None:
            self._failures.append(str(p.get("error") or "request failed"))
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
        return max(0.0, limit - (self._clock_offset + time.monotonic() - self._session_start))

    def others_available(self, arm: str, fits: Callable[[Any], bool]) -> bool:
        """Whether a refiner other than ``arm`` may still take generations (not idle, and its generation fits)."""
        return any(a != arm and r.idle_reason() is None and fits(r)
                   for a, r in self.refiners.items())

    def screen_proposals(self, arm: str, parent: Candidate, proposals: list[Candidate],
                         generation: int) -> list[Candidate]:
        """Check every proposal that carries new source before any episode runs, and record what failed
        — the refiner's own failed proposals (``take_rejections``) and those failing the checks here —
        as ``proposal_rejected`` events (the rejected source stored as an artifact). Returns the rest."""
        from ratchet.proposals import Rejection

        refiner = self.refiners[arm]
        rejected = list(refiner.take_rejections())
        kept = []
        for cand in proposals:
            reason = self.source_problem(cand, parent)
            if reason is None:
                kept.append(cand)
            else:
                rejected.append(Rejection(arm, cand.parent_id, reason, cand.source, {"candidate_id": cand.id}))
        for i, r in enumerate(rejected):
            self.record(EventType.PROPOSAL_REJECTED, f"rejected/{generation}/{arm}/{i}", {
                "generation": generation, "refiner": r.refiner, "parent_id": r.parent_id, "reason": r.reason,
                **self.stored_source(r.source), "detail": dict(r.detail)})
        return kept

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
        """Why a program candidate with source of its own may not run (None when it may): the source
        fails :func:`~ratchet.proposals.check_source`, or its values do not fit its ``PARAMETERS``."""
        if cand.kind not in SOURCE_KINDS or cand.source in (self.program.source, parent.source):
            return None
        from ratchet.errors import PolicyError
        from ratchet.proposals import check_source

        digest = hashlib.sha256(cand.source.encode()).hexdigest()
        if digest not in self._checked:
            try:
                dims = self.task.dims() if uses_task_dims(cand.source) else None
                self._checked[digest] = check_source(cand.source, dims=dims)
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
            u = np.asarray(p.to_unit(cand.params[p.name]), dtype=np.float64)
            if not np.all(np.isfinite(u)) or np.any(u < -1e-9) or np.any(u > 1 + 1e-9):
                return f"parameter {p.name!r} is outside its bounds [{p.low}, {p.high}]"
        return None

    # -- ledger helpers -------------------------------------------------------------------------
    def record(self, type: EventType, key: str, payload: dict[str, Any]) -> None:
        self.ledger.append(type, key, {**payload, **self.event_tag})

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
        key = f"proposed/{generation}/{cand.id}"
        if self._replaying and self.ledger.get(key) is None:
            raise LedgerError(f"resume diverged from the ledger at generation {generation} (candidate {cand.id} was "
                              "never proposed before); were package versions changed since the run started?")
        d = cand.to_dict()
        if d["source"] == self.program.source:
            d["source"] = None  # the run's policy source, stored once in run_started
        self.record(EventType.CANDIDATE_PROPOSED, key, {"generation": generation, "candidate": d})

    def evaluate(self, candidates: Sequence[Candidate], seeds: Sequence[int], split: str,
                 generation: int) -> dict[str, Evaluation]:
        """Execute (or read back from the ledger) each candidate's episodes on ``seeds``."""
        out: dict[str, Evaluation] = {}
        todo: list[Candidate] = []
        for cand in dict.fromkeys(candidates):  # unique, in order
            event = self.ledger.get(eval_key(split, cand.id, seeds))
            if event is not None:
                eps = tuple(Episode.from_dict(e) for e in event.payload["episodes"])
                out[cand.id] = Evaluation(cand.id, split, eps)
            else:
                todo.append(cand)
        jobs = [Job(c, s, {h: self.artifact(h) for h in c.artifacts.values()}) for c in todo for s in seeds]
        done: dict[str, dict[int, Episode]] = {c.id: {} for c in todo}

        def on_episode(i: int, ep: Episode) -> None:  # record each candidate as soon as it completes
            cand = jobs[i].candidate
            done[cand.id][i] = ep
            if len(done[cand.id]) == len(seeds):
                eps = tuple(done[cand.id][k] for k in sorted(done[cand.id]))
                ev = Evaluation(cand.id, split, eps)
                self.record(EventType.EPISODES_EVALUATED, eval_key(split, cand.id, seeds),
                            {"candidate_id": cand.id, "split": split, "generation": generation,
                             "seeds": list(seeds), "summary": ev.summary(),
                             "episodes": [e.to_dict() for e in eps]})
                out[cand.id] = ev

        cap = None
        if self.caps_steps and split != "test" and self.spec.budget.env_steps is not None:
            cap = max(0, self.spec.budget.env_steps - self.usage.env_steps)
        self.executor.run(self.task, jobs, on_episode, **({} if cap is None else {"max_env_steps": cap}))
        if split == "train":  # for the critique service: each candidate's latest training episodes
            self._latest_train.update({c.id: (c, out[c.id]) for c in candidates if c.id in out})
        # every env step of every episode counts, whatever ended it (terminated, truncated, error, timeout);
        # a candidate listed twice ran once
        for cand_id in dict.fromkeys(c.id for c in candidates):
            ev = out[cand_id]
            if split != "test":
                self.usage.env_steps += ev.env_steps
                self.usage.episodes += ev.n
                if split == "validation":
                    self.usage.validation_env_steps += ev.env_steps
        return out

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

    def spare_budget(self, n_candidates: int, est_len: float, reserve: tuple[float, int],
                     training: int) -> tuple[float, float]:
        """(env steps, episodes) of the budget left once this generation's episodes (as priced), its training
        jobs and a kept gate are paid for: what trace replays may spend (inf where there is no such budget)."""
        b, u = self.spec.budget, self.usage
        steps = math.inf if b.env_steps is None else (
            b.env_steps - u.env_steps - reserve[0] - training
            - self.planner.generation_cost(n_candidates, est_len, self.episode_price(est_len)))
        episodes = math.inf if b.episodes is None else (
            b.episodes - u.episodes - reserve[1] - n_candidates * self.spec.planner.train_episodes)
        return max(0.0, steps), max(0.0, episodes)

    def trace_worst(self, cand: Candidate, ev: Evaluation, n: int) -> list[Any]:
        """Traces of up to ``n`` of the evaluation's worst episodes (lowest return first): read back from
        ``episode_traced`` events, or replayed now (in the executor, on the trusted side) where the spare
        budget (:meth:`spare_budget`) pays for their recorded lengths and the executor records traces
        (``records_traces``). Each replay is charged to the usage once per session, as re-evaluation."""
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
                    if not getattr(self.executor, "records_traces", False) or ep.length > steps or episodes < 1:
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
                p = self.ledger.get(key).payload
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

    def choose_refiner(self, generation: int, fits: Callable[[Any], bool] = lambda r: True) -> str:
        """Which refiner configuration gets this generation (Thompson sampling when there are several);
        the choice and its reasons are recorded in the ledger. A refiner that is idle, or whose generation
        no longer ``fits`` the budget (a training job priced above what is left), sits out while another
        can go on, so a cheap refiner may spend what an expensive one leaves."""
        if self.allocator is None:
            return next(iter(self.refiners))
        available = [a for a, r in self.refiners.items()
                     if r.idle_reason() is None and fits(r)]
        if not available:
            return next(iter(self.refiners))
        arm, why = self.allocator.choose(generation, available)
        self.record(EventType.GENERATION_PLANNED, f"plan/{generation}", {"generation": generation, **why})
        return arm

    def report_progress(self, **info: Any) -> None:
        if self.progress is not None:
            self.progress({"usage": self.usage, "budget": self.spec.budget, **info})

    def gate_step(self, generation: int, best: Candidate | None, train: dict[str, Evaluation], incumbent: Candidate,
                  inc_val: Evaluation, next_cost: tuple[float, int],
                  est_len: float) -> tuple[Any, str, Evaluation | None, Evaluation]:
        """Screen the generation's best contender, validate it when the budget allows, and let the gate
        decide. Returns the decision (None when no gate ran), one line saying why no gate ran or the
        gate's verdict, the contender's validation evaluation (None when no gate ran), and the
        incumbent's validation evaluation (a sequential gate may extend it to more seeds)."""
        if best is None:
            if self._failures:  # the refiner's outside service failed: say so, not "failed episodes"
                return None, (f"the LLM endpoint failed {len(self._failures)} request(s) this generation "
                              f"(last: {self._failures[-1][:200]})"), None, inc_val
            return None, "no contender finished its training episodes without an error", None, inc_val
        inc_train = train[incumbent.id]
        note = self.planner.screen(train[best.id], inc_train, inc_val.mean)
        if note is None:
            # the contender's own episode lengths are the best guess of its validation lengths
            cand_train = train[best.id]
            val_len = max(est_len, inc_val.env_steps / max(1, inc_val.n), cand_train.env_steps / max(1, cand_train.n))
            note = self.planner.validation_hold(self.usage, self.validation_price(), val_len, next_cost[0],
                                                self.episode_price(val_len), next_cost[1])
        if note is not None:
            return None, note, None, inc_val
        decision, cand_val, inc_val = self.decide(generation, best, incumbent, inc_val)
        if decision is None:
            return None, "validation cut short by the env-step budget", None, inc_val
        return decision, decision.reason, cand_val, inc_val

    def decide(self, generation: int, best: Candidate, incumbent: Candidate, inc_val: Evaluation,
               label: str | int | None = None) -> tuple[Any, Evaluation, Evaluation]:
        """Validate ``best`` and let the gate decide it against ``incumbent`` as the run's next decision
        (alpha spending counts it), recording ``gate_decided`` and, when it promotes, ``incumbent_changed``
        (keys ``gate/LABEL/ID`` and ``incumbent/LABEL/ID``; ``label`` defaults to the generation).

        Returns:
            ``(decision, candidate validation, incumbent validation)``: the decision is None when the
            env-step budget cut validation short (nothing recorded); a sequential gate may have extended
            the incumbent's validation to more seeds.
        """
        label = generation if label is None else label
        decision, cand_val, inc_val = self.validate(generation, best, incumbent, inc_val)
        if decision is None:
            return None, cand_val, inc_val
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
        return decision, cand_val, inc_val

    def gate_reserve(self) -> tuple[float, int]:
        """(env steps, episodes) a generation must leave for its gate: one validation, its episodes priced at
        the longest mean episode length seen so far (a candidate worth gating tends to play long)."""
        n = self.validation_price()
        return n * self.episode_price(self._longest), n

    def episode_price(self, est_len: float) -> float | None:
        """Env steps one episode is priced at: the time limit with worst-case pricing; with observed pricing
        the mean length seen (``est_len``) plus a 25 % margin, never above the time limit. None when there
        is neither a limit nor an estimate to go by."""
        limit = self.task.step_limit
        if self.price_limit is not None:
            return float(self.price_limit)
        price = self._margin * est_len
        return float(min(price, limit)) if limit else price

    def broken_start(self, inc_val: Evaluation) -> str | None:
        """Why the run must not search at all: every validation episode of the starting policy ended in an
        error (a model for another env, an unsupported algorithm, an act() that raises), quoting the first."""
        if not inc_val.n or inc_val.n_errors < inc_val.n:
            return None
        first = next(e.error for e in inc_val.episodes if e.error is not None).strip().splitlines()[-1][:300]
        return (f"{BROKEN_START} {inc_val.n} of its validation episodes, so nothing was searched: "
                f"{first}; see the episodes with `ratchet evaluate --run {self.run_dir}`")

    def fit_training(self, refiner: Refiner, est_len: float, reserve: tuple[float, int]) -> bool:
        """Let a refiner whose generation no longer fits an env-step budget cut it to what is left after
        the generation's episodes and its gate (:meth:`Refiner.fit`, e.g. PPO's training job); True when it did."""
        limit = self.spec.budget.env_steps
        if limit is None:
            return False
        n_candidates = candidates_per_generation(refiner)
        rest = (limit - self.usage.env_steps - reserve[0]
                - self.planner.generation_cost(n_candidates, est_len, self.episode_price(est_len)))
        return rest > 0 and bool(refiner.fit(int(rest)))

    def no_room_message(self, n_candidates: int, est_len: float, first: bool, training: int = 0) -> str:
        """Why no further generation (``first``: not even one) fits the budget, in numbers, naming the
        budget that binds (``training``: env steps of the refiner's training jobs in a generation)."""
        what = "a single generation" if first else "another generation"
        episodes = n_candidates * self.spec.planner.train_episodes
        b, u = self.spec.budget, self.usage
        spent = "after " + ("validation" if first else "the generations so far")
        if b.episodes is not None and u.episodes + episodes + self.gate_reserve()[1] > b.episodes:
            return (f"budget: no room for {what} ({episodes} episodes: {n_candidates} candidates × "
                    f"{self.spec.planner.train_episodes} training episodes, and {self.gate_reserve()[1]} for its "
                    f"gate; {spent} used {u.episodes} of "
                    f"[budget] episodes = {b.episodes})" + ("; raise [budget] episodes or lower [refiner] popsize / "
                                                             "[planner] train_episodes" if first else ""))
        price = self.episode_price(est_len)
        cost = self.planner.generation_cost(n_candidates, est_len, price) + self.gate_reserve()[0] + training
        per = f"{price:,.0f} steps" + (" (the time limit)" if price == self.task.step_limit else "")
        trained = f", {training:,} of the refiner's training" if training else ""
        return (f"budget: no room for {what} (up to {cost:,.0f} env steps: {n_candidates} candidates × "
                f"{self.spec.planner.train_episodes} training episodes × {per}{trained}, and a validation kept for its gate; "
                f"{spent} used {u.env_steps:,} of "
                f"[budget] env_steps = {b.env_steps:,})" + ("; raise [budget] env_steps or lower [refiner] popsize / "
                                                            "[planner] train_episodes" if first else ""))

    def validation_price(self) -> int:
        """Validation episodes one gate is priced at (:meth:`~ratchet.gate.Gate.price`: all validation seeds
        for a fixed-n test, twice the seeds before a futility stop for a sequential one)."""
        return self.gate.price(len(self.validation_seeds))

    def validate(self, generation: int, best: Candidate, incumbent: Candidate,
                 inc_val: Evaluation) -> tuple[Any, Evaluation, Evaluation]:
        """Drive the gate's decision session (:meth:`~ratchet.gate.Gate.start`; a fixed-n test is one batch of
        every seed): run ``best`` on the next batch of validation seeds (the incumbent too, where its
        validation does not reach that far yet) until the gate decides. Returns the decision (None when the
        budget cut validation short), the candidate's validation evaluation on the seeds read, and the
        incumbent's (possibly extended) one."""
        session = self.gate.start(self._n_contested + 1, len(self.validation_seeds), lower_bound=self.lower_bound(),
                                  candidate_id=best.id, incumbent_id=incumbent.id, carry=self._carry)
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

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> RunResult:
        spec = self.spec
        baseline = self.start
        self.record_candidate(baseline, 0)
        incumbent = baseline
        n_first = self.gate.first_look(len(self.validation_seeds))  # a sequential gate extends it as decisions read
        inc_val = self.evaluate([incumbent], self.validation_seeds[:n_first], "validation", 0)[incumbent.id]
        est_len = max(1.0, inc_val.env_steps / max(1, inc_val.n))
        self._longest = est_len  # the longest mean episode length of any evaluation so far
        stale, generation, completed, stop = 0, 0, 0, self.broken_start(inc_val)
        critique = None  # the incumbent's latest training critique, handed to the refiner
        while stop is None:
            generation += 1
            replaying = self._replaying = self.ledger.get(f"generation/{generation}") is not None
            self.usage.wall_clock_s = self._clock_offset + time.monotonic() - self._session_start
            stop = self.budget.stop_reason(self.usage, inc_val.mean, stale, check_clock=not replaying)
            reserve = self.gate_reserve()

            def fits(r: Any) -> bool:  # the refiner's generation, its training job and a kept gate
                return self.planner.can_afford_generation(
                    self.usage, candidates_per_generation(r), est_len, self.episode_price(est_len),
                    (reserve[0] + r.generation_cost().training_env_steps, reserve[1]))

            arm = self.choose_refiner(generation, fits) if stop is None else next(iter(self.refiners))
            refiner = self.refiners[arm]
            if stop is None and not fits(refiner):
                self.fit_training(refiner, est_len, reserve)  # e.g. PPO cuts its job to the budget's rest
            cost = refiner.generation_cost()
            n_candidates, training = cost.evaluations, cost.training_env_steps
            if stop is None and not fits(refiner):
                stop = self.no_room_message(n_candidates, est_len, first=False, training=training)
                if generation == 1:  # nothing would happen at all: say why, in numbers
                    stop = self.no_room_message(n_candidates, est_len, first=True, training=training)
            idle = refiner.idle_reason()
            if stop is not None or idle is not None:
                stop = stop or idle
                break

            # plan
            plan = self.planner.plan(generation)
            self._spare = self.spare_budget(n_candidates, est_len, reserve, training)  # for trace replays
            # refine (propose) — from the incumbent and its latest critique
            recommended = refiner.recommend()
            if recommended is not None and recommended.source != incumbent.source:
                recommended = None  # for a program the incumbent no longer runs (a structural promotion since)
            self._failures, stopped = [], None  # the generation's failed requests to outside services
            try:
                proposed = refiner.propose(incumbent, critique, self.rng)
            except EndpointError as exc:  # its service is down: go on without it, or stop (resumable)
                if not self.others_available(arm, fits):
                    raise
                proposed, stopped = list(exc.proposals), str(exc)
            proposals = self.screen_proposals(arm, incumbent, proposed, generation)
            contenders = proposals + ([recommended] if recommended is not None else [])
            for cand in contenders:
                self.record_candidate(cand, generation)
            # execute
            train = self.evaluate(contenders + [incumbent], plan.train_seeds, "train", generation)
            gen_evals = list(train.values())
            self.usage.reeval_env_steps += sum(train[c].env_steps for c in {incumbent.id, getattr(recommended, "id", "")}
                                               if c in train)
            if any(_cut(e) for e in gen_evals):  # the executor's hard cap stopped it: judge nothing from it
                stop = "env-step budget used (the last generation was cut short by the cap; it was not judged)"
                break
            # the incumbent's evaluation on the same seeds comes last: a reference for paired comparisons
            refiner.observe([train[c.id] for c in proposals] + [train[incumbent.id]])
            for e in gen_evals:
                for ep in e.episodes:
                    if ep.error is None:
                        self._train_returns = [min(self._train_returns[0], ep.episode_return),
                                               max(self._train_returns[1], ep.episode_return)]
            if not any(e.env_steps for e in gen_evals):
                stop = ("every episode of the generation failed before its first env step; see why with "
                        f"`ratchet evaluate --run {self.run_dir}`")
            est_len = max(1.0, sum(e.env_steps for e in gen_evals) / max(1, sum(e.n for e in gen_evals)))
            self._longest = max([self._longest] + [e.env_steps / e.n for e in gen_evals if e.n])
            # critique
            inc_train = train[incumbent.id]
            critique = self.critic.critique(inc_train)
            threshold = self.task.success_threshold
            self.planner.observe_incumbent(inc_train, threshold if threshold is not None else inc_val.mean)
            best = self.planner.gate_candidate(contenders, recommended, train, incumbent)
            # gate
            reserve = self.gate_reserve()
            next_cost = (self.planner.generation_cost(n_candidates, est_len, self.episode_price(est_len)) + reserve[0]
                         + training,
                         n_candidates * spec.planner.train_episodes + reserve[1])
            decision, note, cand_val, inc_val = self.gate_step(generation, best, train, incumbent, inc_val, next_cost,
                                                               est_len)
            promoted = decision is not None and decision.promoted
            refiner.verdict(best.id if best is not None else None, promoted, note)
            if promoted:
                gain = cand_val.mean - inc_val.mean
                incumbent, inc_val = best, cand_val
            if self.allocator is not None:
                self.allocator.record(arm, gain if promoted else 0.0)
            stale = 0 if promoted else stale + 1
            summary = {"generation": generation, "train_seeds": list(plan.train_seeds),
                       "weak_seeds": list(plan.weak_seeds), "weakness_pool": len(self.planner.pool),
                       "best_train_mean": train[best.id].mean if best else None,
                       "incumbent_train_mean": inc_train.mean, "incumbent_id": incumbent.id,
                       "incumbent_validation_mean": inc_val.mean, "gated": decision is not None,
                       "gate_note": note,
                       "promoted": promoted, "refiner": arm, "population": cost.proposals,
                       "cost": dataclasses.asdict(cost),
                       **refiner.summary(),
                       "env_steps": self.usage.env_steps, "episodes": self.usage.episodes,
                       "validation_env_steps": self.usage.validation_env_steps,
                       "critique": critique.to_dict(), "endpoint_failures": len(self._failures),
                       **({"refiner_stopped": stopped} if stopped else {})}
            self.record(EventType.GENERATION_FINISHED, f"generation/{generation}", summary)
            if promoted:  # the next generation edits the new incumbent: hand the refiner its own critique
                critique = self.critic.critique(train[incumbent.id])
            self.report_progress(**summary, wall_clock_s=self.usage.wall_clock_s, n_refiners=len(self.refiners))
            completed = generation

        # final, report-only test evaluation (never used for selection)
        test = self.evaluate([incumbent, baseline], self.test_seeds, "test", completed)
        self.usage.wall_clock_s = self._clock_offset + time.monotonic() - self._session_start
        self.record(EventType.RUN_FINISHED, "run_finished",
                    {"stop_reason": stop, "generations": completed, "incumbent_id": incumbent.id,
                     "baseline_id": baseline.id, "incumbent_validation_mean": inc_val.mean,
                     "test": test[incumbent.id].summary(), "baseline_test": test[baseline.id].summary(),
                     "test_critique": self.critic.critique(test[incumbent.id], test[baseline.id]).to_dict(),
                     "baseline_test_critique": self.critic.critique(test[baseline.id]).to_dict(),
                     "env_steps": self.usage.env_steps, "episodes": self.usage.episodes,
                     "wall_clock_s": self.usage.wall_clock_s,
                     "env_steps_breakdown": self.usage.breakdown(spec.budget.env_steps)})
        return RunResult(self.run_dir, stop, incumbent, test[baseline.id], test[incumbent.id])


def _cut(evaluation: Evaluation) -> bool:
    """Whether the executor's env-step cap left some of the evaluation's episodes unrun."""
    return any(ep.error == BUDGET_SKIP for ep in evaluation.episodes)


def _drive(run: _Run, close_executor: bool, lock_fd: int, lease: WriterLease) -> RunResult:
    try:
        return run.run()
    except (KeyboardInterrupt, WriterLeaseError):  # a lost lease: another process writes the run now
        raise
    except Exception as exc:
        if not lease.lost:
            run.record(EventType.RUN_FAILED, f"run_failed/{time.time()}", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        lease.release()
        run.ledger.close()
        if close_executor:
            run.executor.close()
        os.close(lock_fd)


def start_run(spec: RunSpec, runs_dir: str | Path = "runs", run_id: str | None = None, *,
              executor: Executor | None = None, progress: ProgressFn | None = None,
              storage: str | None = None) -> RunResult:
    """Start a new run of ``spec`` in ``runs_dir/run_id`` and drive it to the end.

    Args:
        spec: Validated run spec.
        runs_dir: Folder that holds run directories.
        run_id: Directory name; default ``<spec.name>-<timestamp>-<hex>``.
        executor: Where episodes run; default a process pool per ``[execution]`` (closed at the end;
            an executor passed in stays open, so one pool can serve many runs).
        progress: Called after each generation with a dict: ``generation``, ``best_train_mean`` (None
            when no contender finished cleanly), ``incumbent_validation_mean``, ``incumbent_id``,
            ``gated``, ``promoted``, ``gate_note`` (why no gate ran, or the gate's verdict, one line),
            ``usage`` (:class:`ratchet.planner.Usage`: env steps, episodes, validation env steps,
            seconds), ``budget`` (the spec's ``[budget]``) and more (see the ``generation_finished``
            event). :class:`ratchet.progress.ProgressPrinter` prints it as ``ratchet run`` does.
        storage: Where the ledger goes: None for ``ledger.sqlite`` in the run directory, or a database
            URL (``postgresql://USER@HOST/DB``, ``sqlite:///PATH``) shared by many runs; the run directory
            then holds a ``ledger.json`` pointer to it (without the password).

    Returns:
        The :class:`RunResult`.

    Raises:
        SpecError: the spec is invalid (checked again here: ``model_copy`` skips validation), e.g. its
            budget cannot pay for the starting policy's first validation.
        PolicyError: the policy file is invalid.
        LedgerError: bad storage URL or unreachable database.
        RatchetError: the run directory or the database already holds this run (use :func:`resume_run`).
    """
    spec_from_dict(spec.to_dict(), spec.base_dir)
    task = task_from_spec(spec.task)
    spaces = task.spaces()  # the environment, made once with no policy code: setup problems fail here, in one line
    program, start, start_blobs = load_start(spec, task, spaces)
    run_id = run_id or new_run_id(spec.name)
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise RatchetError(f"run id {run_id!r} must be a plain name (letters, digits, '.', '_', '-'; no '/' or '..')")
    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        raise RatchetError(f"--runs-dir {runs_dir} is a file; give a folder for run directories")
    run_dir = Path(runs_dir) / run_id
    if (run_dir / LEDGER_FILE).exists() or (run_dir / POINTER_FILE).exists():
        raise RatchetError(f"run {run_id} already exists in {runs_dir}; pick another --run-id "
                           f"(or `ratchet resume {run_dir}` if it was interrupted)")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RatchetError(f"{run_dir} exists and is not a run directory; pick another --run-id or --runs-dir")
    url = storage_url(storage)
    check_refiners(spec)
    ledger = open_store(url, run_dir, run_id) if url else None  # a bad URL fails before any folder is made
    own_executor, lock_fd = executor is None, None
    try:
        if ledger is not None and ledger.get("run_started") is not None:
            raise RatchetError(f"{ledger.location} already exists; pick another --run-id "
                               f"(or `ratchet resume {run_id} --storage URL` if it was interrupted)")
        # an executor that cannot start (Ray unreachable, isolation required but missing) fails here,
        # before any run directory exists
        executor = executor or _executor_for(spec)
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            # atomic: of two runs racing for one id, one gets it; 0700: policy code (nobody) cannot read it
            run_dir.mkdir(mode=0o700, exist_ok=run_dir.is_dir())
            lock_fd = lock_run_dir(run_dir)
            if program.source:
                (run_dir / "policy.py").write_text(program.source, encoding="utf-8")
            if url:
                write_pointer(run_dir, url, run_id)
        except FileExistsError:
            raise RatchetError(f"run {run_id} already exists in {runs_dir}; pick another --run-id") from None
        except OSError as exc:
            raise RatchetError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    except BaseException:
        if ledger is not None:
            ledger.close()
        if own_executor and executor is not None:
            executor.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    ledger = ledger or open_store(None, run_dir, run_id)
    for data in start_blobs.values():  # before any event names them
        ledger.put_artifact(data)
    run = _Run(run_dir, spec, program, ledger, executor, progress, start=start, task=task)
    try:
        lease: WriterLease | None = WriterLease.acquire(ledger, run_id)
    except WriterLeaseError:  # another process took this run id between our checks and now
        lease = None
    created = lease is not None and ledger.append(EventType.RUN_STARTED, "run_started", {
        "run_id": run_id, "spec": spec.to_dict(), "policy_source": program.source, "policy_path": str(spec.policy_path),
        "task": run.task.to_dict(), "versions": _versions(), "pid": os.getpid(), "host": socket.gethostname(),
        "execution": _describe(run.executor), "pricing": run.pricing, "start_candidate": start.to_dict(),
        "inputs": dict(run.inputs),
        "seeds": {"validation": run.validation_seeds, "test": run.test_seeds,
                  "train": "fresh each generation: SeedSplits(run_seed).seeds('train', ...)"}})[1]
    if not created:  # another process started this run id between our checks and now
        if lease is not None:
            lease.release()
        if own_executor:
            executor.close()
        ledger.close()
        os.close(lock_fd)
        raise RatchetError(f"run {run_id} was started by another process just now; pick another --run-id")
    return _drive(run, close_executor=own_executor, lock_fd=lock_fd, lease=lease)


def _describe(executor: Executor) -> dict[str, Any]:
    describe = getattr(executor, "describe", None)  # optional: wrappers and custom executors may lack it
    try:
        return describe() if callable(describe) else {"backend": type(executor).__name__}
    except Exception:
        return {"backend": type(executor).__name__}


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # use fullmatch: "$" also matches before a final "\n"


def check_refiners(spec: RunSpec) -> None:
    """Each refiner kind's look at what it needs outside ratchet (an LLM endpoint: reachable, the key
    accepted, the model listed), before a new run spends anything (:attr:`RefinerKind.check`).

    Raises:
        RatchetError: one line saying what to fix (an :class:`~ratchet.errors.EndpointError` for an endpoint).
    """
    entries = spec.refiner_entries()
    for entry, name in zip(entries, arm_names(entries)):
        kind = refiner_kind(entry["kind"])
        if kind.check is not None:
            kind.check(kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")}), name)


def check_task(task: Task) -> dict[str, int]:
    """:meth:`Task.dims`: the task's sizes, made once with no policy code, so setup problems (a missing extra
    such as MuJoCo, bad ``env_kwargs``) fail a command up front in one line.

    Raises:
        TaskError: the environment cannot be made.
    """
    return task.dims()


def load_program(path: str | Path, task: Task, dims: dict[str, int] | None = None) -> PolicyProgram:
    """:func:`ratchet.policy.load_policy` for ``task``: array shapes written as ``"obs"``/``"act"`` are
    resolved from the task's spaces (the driver makes the env for that; it never runs policy code).

    Raises:
        PolicyError: the policy file is invalid.
        TaskError: the policy needs the task's sizes and its environment cannot be made.
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        source = ""  # load_policy says what is wrong
    if uses_task_dims(source) and dims is None:
        dims = task.dims()
    return load_policy(path, dims=dims if uses_task_dims(source) else None)


def load_start(spec: RunSpec, task: Task, spaces: tuple[Any, Any] | None = None
               ) -> tuple[PolicyProgram, Candidate, dict[str, bytes]]:
    """The run's starting point for ``[policy]`` of any kind: the program (empty for network kinds), the
    starting candidate and its artifacts' bytes by digest (see :func:`ratchet.policies.start.start_candidate`).

    Raises:
        PolicyError: the policy file or model is invalid.
        TaskError: the environment cannot be made (network kinds need its spaces).

    Args:
        spec: The run spec.
        task: Its task.
        spaces: The task's ``(observation_space, action_space)`` when already made (else made when needed).
    """
    from ratchet.policies.start import start_candidate
    from ratchet.policy import space_dims

    kind = spec.policy.kind
    if spaces is None and kind in SPACE_KINDS:
        spaces = task.spaces()
    dims = space_dims(*spaces) if spaces is not None else None
    program = load_program(spec.policy_path, task, dims) if kind in SOURCE_KINDS else None
    return start_candidate(spec.policy, spec.base_dir, spaces if kind in SPACE_KINDS else None, spec.seed, program)


def _executor_for(spec: RunSpec) -> Executor:
    return executor_from_spec(spec.execution)


def resume_run(run: str | Path, runs_dir: str | Path = "runs", *, executor: Executor | None = None,
               progress: ProgressFn | None = None, storage: str | None = None) -> RunResult:
    """Continue a run that was interrupted (Ctrl-C, crash, ``kill -9``).

    The spec and policy come from the ledger, not from files that may have changed since. A run
    found only in ``storage`` (started on another machine) gets a run directory ``runs_dir/RUN_ID``
    with a pointer to its database.

    Only one process writes a run at a time, on any machine: resuming takes the run's writer lease
    (:class:`~ratchet.ledger.lease.WriterLease`), which a live writer holds and renews. A writer that
    died on this host is noticed at once; one on another host (same ``--storage`` database) once its
    lease expired, ``$RATCHET_LEASE_TTL_S`` (default 60) seconds after its last heartbeat.

    Args:
        run: Run id or run directory.
        runs_dir: Folder that holds run directories.
        executor: As for :func:`start_run`.
        progress: As for :func:`start_run`.
        storage: Database URL to look the run up in (see :func:`open_run`).

    Raises:
        RunNotFoundError: no such run.
        WriterLeaseError: another live process is writing the run (here or on another machine).
        LedgerError: the run already finished or its ledger has no start event.
    """
    ledger, run_dir, lock_fd, lease = open_for_writing(run, runs_dir, storage=storage)
    try:
        events = ledger.read()
        started = ledger.get("run_started")
        if ledger.get("run_finished") is not None:
            hint = (f"`ratchet show {run} --storage URL`" if storage else f"`ratchet show {run_dir}`")
            if unfinished_round(events) is not None:
                hint += f"; `ratchet correct {run} --resume-round` finishes its correction round"
            raise LedgerError(f"run {started.payload['run_id']} already finished; {hint}")
        r, lock_fd = rebuild_run(ledger, run_dir, lock_fd, executor, progress, storage)
    except BaseException:
        lease.release()
        ledger.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    r._clock_offset = active_seconds(events)
    ledger.append(EventType.RUN_RESUMED, f"resumed/{time.time()}", {"pid": os.getpid(), "host": socket.gethostname(),
                                                                      "events_before": len(events)})
    return _drive(r, close_executor=executor is None, lock_fd=lock_fd, lease=lease)


def spec_of(ledger: LedgerStore) -> RunSpec:
    """The run's spec as its ``run_started`` event recorded it (not the file, which may have changed since)."""
    return spec_from_dict(ledger.get("run_started").payload["spec"], where="ledger spec")


def rebuild_run(ledger: LedgerStore, run_dir: Path, lock_fd: int | None, executor: Executor | None = None,
                progress: ProgressFn | None = None, storage: str | None = None) -> tuple[_Run, int]:
    """The run's wiring rebuilt from its ``run_started`` event (spec, policy, starting candidate, inputs), for
    a writer that holds the run (:func:`open_for_writing`). A run found only in ``storage`` (started on
    another machine) gets a run directory here with a pointer to its database, and its lock. Without an
    ``executor``, a process pool per the spec's ``[execution]`` is started (last: nothing leaks when an
    earlier step fails); the caller closes it.

    Returns:
        ``(run, lock_fd)``.

    Raises:
        SpecError, PolicyError: the recorded spec or policy no longer loads (package versions changed).
        RatchetError: the run directory cannot be created.
    """
    started = ledger.get("run_started")
    spec = spec_of(ledger)
    source = started.payload["policy_source"]
    task = task_from_spec(spec.task)
    if spec.policy.kind not in SOURCE_KINDS:  # a network: no program
        program = PolicyProgram("", ())
    else:
        dims = task.dims() if uses_task_dims(source) else None
        program = parse_policy(source, started.payload.get("policy_path", "<policy>"), dims=dims)
    if not run_dir.exists():  # found only in the database: give it a run directory here
        try:
            run_dir.mkdir(mode=0o700, parents=True)
            if program.source:
                (run_dir / "policy.py").write_text(program.source, encoding="utf-8")
            write_pointer(run_dir, storage, started.payload["run_id"])
        except OSError as exc:
            raise RatchetError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    if lock_fd is None:
        lock_fd = lock_run_dir(run_dir)
    start = (Candidate.from_dict(started.payload["start_candidate"]) if "start_candidate" in started.payload
             else program.candidate())
    return _Run(run_dir, spec, program, ledger, executor or _executor_for(spec), progress,
                pricing=started.payload.get("pricing", "worst-case"),
                start=start, inputs=started.payload.get("inputs", {}), task=task), lock_fd
