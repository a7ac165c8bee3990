"""What ``ratchet dashboard`` shows, read from ledgers: a row per run and a run's page, kept up to date incrementally.

A run's page is folded from the events it needs only (:data:`PAGE_TYPES`: no episodes), read in the store with
``read(from_seq, types)``, so a ledger of 10,000 generations opens without parsing its episodes, and a poll reads
only what was appended since. A runs table row reads the run's few lifecycle events and the newest
``generation_finished`` (:meth:`~ratchet.ledger.LedgerStore.tail`), cached by the run's newest event.

Everything here reads; nothing writes a ledger (stores are opened read-only).
"""

from __future__ import annotations

import difflib
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ratchet.errors import LedgerError, RatchetError, RunNotFoundError
from ratchet.ledger import Event, EventType, LedgerStore
from ratchet.ledger.projection import (
    SCREEN_KEYS,
    live_status,
    llm_usage_text,
    project,
    used_counts,
    world_model_account,
    world_model_text,
)
from ratchet.ledger.storage import LEDGER_FILE, POINTER_FILE, RUN_ID, storage_url
from ratchet.policy import describe_value

__all__ = ["PAGE_TYPES", "RUN_ID", "Liveness", "RunPage", "RunSource", "run_row"]


#: The small events a run page keeps whole and folds with :func:`ratchet.ledger.projection.project`.
_KEPT = frozenset({EventType.RUN_STARTED, EventType.RUN_RESUMED, EventType.GATE_DECIDED, EventType.INCUMBENT_CHANGED,
                   EventType.FINAL_DECISION, EventType.TASK_UPDATED, EventType.RUN_FINISHED, EventType.RUN_FAILED,
                   EventType.CORRECTION_RECORDED, EventType.CORRECTION_FINISHED, EventType.LLM_CALL,
                   EventType.PROPOSAL_REJECTED})
#: Every event type a run page reads (episodes are never read: their summaries are in the generations). Candidates
#: are read apart, by :meth:`RunPage.lineage`, and only for runs whose refiners may change code.
PAGE_TYPES = _KEPT | {EventType.GENERATION_FINISHED, EventType.TRAINING_FINISHED}

#: What a runs table row reads besides the newest events.
_ROW_TYPES = frozenset({EventType.RUN_STARTED, EventType.RUN_RESUMED, EventType.RUN_FINISHED, EventType.RUN_FAILED,
                        EventType.INCUMBENT_CHANGED})
#: Per-generation columns of a run page (``generations`` in :meth:`RunPage.view`), from ``generation_finished``.
GEN_COLUMNS = ("generation", "time", "env_steps", "validation_env_steps", "training_env_steps", "episodes",
               "best_train_mean", "incumbent_train_mean", "incumbent_validation_mean", "gated", "promoted", "refiner",
               "gate_note")
_GATE_KEYS = ("generation", "candidate_id", "incumbent_id", "promoted", "n", "mean_diff", "p_value", "e_value",
              "alpha", "test", "reason", "episodes_used", "stopped_because", "correction_round")
_MAX_LINEAGE = 500  # programs shown in the lineage (the newest; every promoted one is kept)
_MAX_JOBS = 200  # training jobs listed (the newest; totals count them all)


def _num(x: Any) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _clean(obj: Any) -> Any:
    """``obj`` with every non-finite float made None, so that it is valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _policy_kind(spec: dict[str, Any]) -> str:
    policy = spec.get("policy")
    return str(policy.get("kind", "program")) if isinstance(policy, dict) else "program"


def _refiners(spec: dict[str, Any]) -> list[str]:
    """The refiner kinds of a run's spec (``[[refiners]]`` tables, else the single ``[refiner]``)."""
    many = spec.get("refiners") or []
    if many:
        return [str(r.get("name") or r.get("kind", "?")) for r in many if isinstance(r, dict)]
    one = spec.get("refiner") or {}
    return [str(one.get("kind", "cmaes"))] if isinstance(one, dict) else []


def _task_name(spec: dict[str, Any], task: dict[str, Any] | None) -> str:
    from ratchet.ledger.projection import RunState

    return RunState(spec=spec, task=task).task_name


def _holds_a_run(d: Path) -> bool:
    """Whether a folder is a run directory (a ledger file or a pointer); one we may not look into (another user's
    run: run directories are 0700) counts, so the table lists it as unreadable instead of failing."""
    try:
        return (d / LEDGER_FILE).is_file() or (d / POINTER_FILE).is_file()
    except OSError:
        return d.is_dir()


def _changes_code(kind: str) -> bool:
    """Whether refiner kind ``kind`` declares that it may change code (:attr:`RefinerKind.changes_code`); a kind
    not installed here may."""
    from ratchet.refiners.registry import refiner_kind

    try:
        return refiner_kind(kind).changes_code
    except (KeyError, ImportError):
        return True


def _used(st: Any, recorded: dict[str, Any]) -> list[list[Any]]:
    """What a run used in its task's words (:func:`~ratchet.ledger.projection.used_counts`), from the counts the loop
    recorded last (``run_finished``, else the newest ``generation_finished``): ``[[word, n], ...]``."""
    return [[w, n] for w, n in used_counts(st, _int(recorded.get("env_steps")), _int(recorded.get("episodes")))]


def _int(x: Any) -> int:
    """A recorded count read defensively: the int itself, else 0."""
    v = _num(x)
    return int(v) if v is not None else 0


class RunSource:
    """Where the runs are: a runs folder (run directories, each a ``ledger.sqlite`` or a pointer to a database), or
    a database URL shared by many runs (``--storage``). A pointer in the folder is never followed (no database is
    named): its run is listed as unreadable, saying where it points (:class:`~ratchet.errors.StorageNotNamedError`).

    Args:
        runs_dir: The runs folder (used when ``storage`` is None).
        storage: ``postgresql://…`` or ``sqlite:///…``; its runs are listed instead of the folder's.

    Raises:
        RatchetError: ``runs_dir`` is a file; the storage URL is bad or its database unreachable.
    """

    def __init__(self, runs_dir: str | Path = "runs", storage: str | None = None) -> None:
        self.root = Path(runs_dir)
        self.url = storage_url(storage)
        self._engine: Any = None
        self._ledgers: dict[str, LedgerStore] = {}  # database ledgers share one engine; kept open
        self._lock = threading.Lock()
        if self.url is not None:
            from ratchet.ledger.sql import display_url, shared_engine

            self.where = display_url(self.url, password=True)
            self._engine = shared_engine(self.url)
        else:
            if self.root.exists() and not self.root.is_dir():
                raise RatchetError(f"--runs-dir {self.root} is a file; give the folder `ratchet run --runs-dir` used")
            self.where = str(self.root)

    def run_ids(self) -> list[str]:
        """The runs there, by id (a folder's run directories by name; a database's runs oldest first)."""
        if self.url is not None:
            from ratchet.ledger.sql import list_runs

            return [r for r, _ in list_runs(self.url)]
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if RUN_ID.fullmatch(p.name) and _holds_a_run(p))

    def run_dir(self, run_id: str) -> Path | None:
        """The run's directory (GIFs, report), or None for a run kept only in a database."""
        d = self.root / run_id
        return d if self.url is None and d.is_dir() else None

    @contextmanager
    def open(self, run_id: str) -> Iterator[LedgerStore]:
        """The run's ledger, read-only, for the duration of a ``with`` block.

        Raises:
            RunNotFoundError: no such run (or a malformed id).
            LedgerError: the ledger is damaged or its database unreachable.
        """
        if not RUN_ID.fullmatch(run_id):
            raise RunNotFoundError(f"malformed run id {run_id[:60]!r}")
        if self.url is not None:
            with self._lock:
                ledger = self._ledgers.get(run_id)
            if ledger is None:
                from ratchet.ledger.sql import SQLAlchemyLedger

                ledger = SQLAlchemyLedger(self.url, run_id, readonly=True, engine=self._engine)
                with self._lock:
                    self._ledgers.setdefault(run_id, ledger)
            yield ledger
            return
        from ratchet.runs import open_run

        d = self.root / run_id
        if not ((d / LEDGER_FILE).is_file() or (d / POINTER_FILE).is_file()):
            raise RunNotFoundError(f"no run {run_id!r} in {self.where}")
        ledger, _ = open_run(str(d), self.root, readonly=True)  # the file (a pointer: StorageNotNamedError)
        try:
            yield ledger
        finally:
            ledger.close()

    def close(self) -> None:
        """Close the database connections."""
        for ledger in self._ledgers.values():
            ledger.close()
        if self._engine is not None:
            self._engine.dispose()


@dataclass(frozen=True)
class Liveness:
    """What a run's events say of its writer, for :func:`ratchet.ledger.projection.live_status`: the status the
    events give (``running`` until it finished or failed) and the last writer's ``pid`` and ``host``."""

    status: str
    pid: int | None
    host: str | None

    def status_now(self, lease: Any) -> str:
        """The run's status now, given its writer lease as just read (or None)."""
        return live_status(self.status, self.pid, self.host, lease)[0]


def run_row(ledger: LedgerStore, run_id: str) -> tuple[dict[str, Any], Liveness]:
    """One runs table row and the run's :class:`Liveness` (to recompute ``status`` without re-reading the run).

    The row: ``run_id``, ``status``/``status_text``, ``task``, ``policy_kind``, ``refiners``,
    ``start_validation``/``incumbent_validation`` (validation means), ``start_test``/``test`` (test means, once
    finished), ``env_steps``, ``budget_env_steps`` (None: no env-step budget), ``cost_unit``, ``used`` (what the
    run used, in its task's words: ``[[word, n], ...]``, :meth:`RunState.used`), ``generations``,
    ``promotions``, ``last_activity`` (Unix seconds of the newest event), ``seq`` (the newest event's).

    Raises:
        RunNotFoundError: the ledger has no run_started event. LedgerError: it is damaged or unreachable.
    """
    events = ledger.read(types=_ROW_TYPES)
    if not events or events[0].type is not EventType.RUN_STARTED:
        raise RunNotFoundError(f"run {run_id!r} has no run_started event")
    newest = ledger.tail()
    last_gen = ledger.tail([EventType.GENERATION_FINISHED])
    st = project(events, ledger.read_lease())
    writer = next(e.payload for e in reversed(events) if e.type in (EventType.RUN_STARTED, EventType.RUN_RESUMED))
    ended = next((e.type for e in reversed(events) if e.type in (EventType.RUN_FINISHED, EventType.RUN_FAILED,
                                                                  EventType.RUN_RESUMED)), None)
    ends = {EventType.RUN_FINISHED: "finished", EventType.RUN_FAILED: "failed"}
    liveness = Liveness(ends.get(ended, "running") if ended is not None else "running",
                        writer.get("pid"), writer.get("host"))
    g = last_gen.payload if last_gen is not None else {}
    inc_val = st.incumbent_validation_mean if st.promotions else _num(g.get("incumbent_validation_mean"))
    start_val = _num(st.promotions[0].get("previous_validation_mean")) if st.promotions else inc_val
    fin = next((e.payload for e in reversed(events) if e.type is EventType.RUN_FINISHED), None)
    if fin is not None:
        inc_val = _num(fin.get("incumbent_validation_mean"))
        start_val = start_val if st.promotions else inc_val
    budget = (st.spec.get("budget") or {}).get("env_steps")
    return _clean({
        "run_id": run_id, "status": st.status, "status_text": st.status_text,
        "task": str(st.task_name), "policy_kind": _policy_kind(st.spec),
        "refiners": _refiners(st.spec), "start_validation": start_val, "incumbent_validation": inc_val,
        "start_test": _num((st.baseline_test or {}).get("mean")), "test": _num((st.test or {}).get("mean")),
        "env_steps": _int((fin or g).get("env_steps")), "budget_env_steps": _num(budget),
        "cost_unit": st.cost_unit, "used": _used(st, fin or g),
        "generations": _int(fin.get("generations")) if fin else _int(g.get("generation")),
        "promotions": len(st.promotions), "last_activity": newest.time if newest else None,
        "seq": newest.seq if newest else 0, "error": st.error}), liveness


@dataclass
class RunPage:
    """One run's page, folded incrementally from its ledger (see the module doc): call :meth:`refresh` with the
    open ledger, then :meth:`view` for the JSON the page reads.

    ``gens`` holds :data:`GEN_COLUMNS` per generation; ``programs`` the candidates whose code differs from
    their run's starting program (structural refiners: ``mutate``, ``llm``), by id, with their source.
    """

    run_id: str
    seq: int = 0  # the newest event folded (of PAGE_TYPES)
    newest: int = 0  # the newest event of any type seen (episodes too)
    last_activity: float | None = None
    kept: list[Event] = field(default_factory=list)
    gens: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in GEN_COLUMNS})
    programs: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None
    training_env_steps: int = 0
    jobs: list[dict[str, Any]] = field(default_factory=list)
    job_totals: dict[str, dict[str, float]] = field(default_factory=dict)
    screen: list[dict[str, Any]] = field(default_factory=list)  # [model] screen: its account per generation
    structural: bool = False  # a refiner may change code: the page shows the lineage of programs
    candidates_seq: int = 0  # the newest candidate_proposed event folded (RunPage.lineage)
    identity: tuple[int, float] | None = None  # the folded ledger's run_started (seq, time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _state: Any = None

    def refresh(self, ledger: LedgerStore) -> bool:
        """Fold what was appended since the last call; returns whether anything was. A ledger that is no longer the
        one folded (another run now has this id: a different ``run_started``, or fewer events) is folded afresh.

        Raises:
            RunNotFoundError: no ``run_started`` event.
            LedgerError: the ledger is damaged or unreachable, or an event is malformed (every call says so again
                until it is mended; nothing after it is shown as if the run went on).
        """
        with self.lock:
            started = ledger.get("run_started")
            newest = ledger.tail()
            lease = ledger.read_lease()
            identity = (started.seq, started.time) if started is not None else None
            if self.identity is not None and (identity != self.identity or newest is None or newest.seq < self.newest):
                self._reset()
            self.identity = identity
            changed = newest is not None and newest.seq != self.newest
            if changed and newest is not None:
                if not self.kept and started is not None:  # the start: the starting program, code changes or not
                    try:
                        self._start(ledger, started)
                    except (KeyError, TypeError, ValueError, AttributeError) as exc:
                        self._reset()
                        raise LedgerError(f"the ledger of run {self.run_id!r} is damaged at its run_started event: "
                                          f"{type(exc).__name__}: {str(exc)[:100]}") from None
                for ev in ledger.read(self.seq, PAGE_TYPES):
                    self._fold_checked(ev)
                    self.seq = ev.seq
                self.newest, self.last_activity = newest.seq, newest.time  # only once everything before it folded
            if not self.kept:
                raise RunNotFoundError(f"run {self.run_id!r} has no run_started event")
            try:
                self._state = project(self.kept, lease)  # small events only: a few per generation at most
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise LedgerError(f"the ledger of run {self.run_id!r} is damaged: an event lacks or garbles "
                                  f"{str(exc)[:100]}") from None
            return changed

    def _reset(self) -> None:
        """Forget everything folded (the run id now names another ledger)."""
        fresh = RunPage(self.run_id)
        for f in fields(self):
            if f.name != "lock":
                setattr(self, f.name, getattr(fresh, f.name))

    def _fold_checked(self, ev: Event) -> None:
        try:
            self._fold(ev)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LedgerError(f"the ledger of run {self.run_id!r} is damaged at event {ev.seq} ({ev.type.value}): "
                              f"{type(exc).__name__}: {str(exc)[:100]}") from None

    def _start(self, ledger: LedgerStore, started: Event) -> None:
        """Fold the run's start: its ``run_started`` and starting candidate (for :meth:`_param_changes` and the
        projection's baseline), and whether a refiner may change code (:attr:`structural`)."""
        first = [started]
        self._fold_checked(first[0])
        self.seq = first[0].seq
        spec = first[0].payload.get("spec") or {}
        kinds = [str(r.get("kind")) for r in spec.get("refiners") or [] if isinstance(r, dict)] or \
            [str((spec.get("refiner") or {}).get("kind", "cmaes"))]
        self.structural = any(_changes_code(k) for k in kinds)
        start = first[0].payload.get("start_candidate") or {}
        proposed = ledger.get(f"proposed/0/{start.get('id')}") if start.get("id") else None
        if proposed is None and start.get("id"):  # the starting candidate as run_started recorded it
            proposed = Event(first[0].seq, EventType.CANDIDATE_PROPOSED, f"proposed/0/{start['id']}", first[0].time,
                             {"generation": 0, "candidate": start})
        if proposed is not None:
            self._fold_checked(proposed)

    def lineage(self, ledger: LedgerStore) -> dict[str, Any]:
        """The lineage of programs (:meth:`_lineage`), reading the candidates proposed since the last call (every
        candidate, once: the costly part of a long run's page, so the page asks for it apart).

        Raises:
            LedgerError: the ledger is damaged or unreachable.
        """
        with self.lock:
            for ev in ledger.read(self.candidates_seq, [EventType.CANDIDATE_PROPOSED]):
                if ev.payload.get("generation") != 0:
                    self._fold_checked(ev)
                self.candidates_seq = ev.seq
            st = self._state
            return _clean(self._lineage({p["to"] for p in st.promotions} if st else set(),
                                        st.baseline_id if st else None))

    def _fold(self, ev: Event) -> None:
        p = ev.payload
        if ev.type is EventType.GENERATION_FINISHED:
            if "screen_on" in p:  # [model] screen: its account, a few numbers per generation
                self.screen.append({k: p.get(k) for k in SCREEN_KEYS})
            row = {**p, "time": ev.time, "training_env_steps": self.training_env_steps}
            for col in GEN_COLUMNS:
                v = row.get(col)
                self.gens[col].append(_num(v) if col not in ("refiner", "gate_note", "gated", "promoted") else v)
        elif ev.type is EventType.CANDIDATE_PROPOSED:
            c = p.get("candidate") or {}
            if p.get("generation") == 0:
                if self.baseline is None:
                    self.baseline = c
                    self.kept.append(ev)
            elif isinstance(c.get("source"), str) and isinstance(c.get("id"), str):  # a changed program
                self.programs[c["id"]] = {"id": c["id"], "parent_id": c.get("parent_id"), "refiner": c.get("refiner"),
                                          "generation": p.get("generation"), "source": c["source"]}
        elif ev.type is EventType.TRAINING_FINISHED:
            if "correction_round" not in p:
                steps = p.get("env_steps")
                self.training_env_steps += int(steps) if isinstance(steps, int) and steps >= 0 else 0
            job = {"trainer": p.get("trainer"), "parent_id": p.get("parent_id"), "env_steps": p.get("env_steps"),
                   "seconds": _num(p.get("seconds")), "error": p.get("error"), "time": ev.time,
                   "outputs": len(p.get("outputs") or [])}
            self.jobs = [*self.jobs[-(_MAX_JOBS - 1):], job]
            t = self.job_totals.setdefault(str(p.get("trainer")), {"jobs": 0, "env_steps": 0, "seconds": 0.0,
                                                                    "errors": 0})
            t["jobs"] += 1
            t["env_steps"] += job["env_steps"] if isinstance(job["env_steps"], int) else 0
            t["seconds"] += job["seconds"] or 0.0
            t["errors"] += 1 if job["error"] else 0
        else:
            if ev.type is EventType.GATE_DECIDED:  # the gate's critique text is the report's, not the page's
                ev = Event(ev.seq, ev.type, ev.key, ev.time, {k: v for k, v in p.items() if k != "critique"})
            self.kept.append(ev)

    def view(self, gen_from: int = 0, gate_from: int = 0, gif: Callable[[str, int], str | None] | None = None
             ) -> dict[str, Any]:
        """The page's JSON: everything small in full, and the generations and gate decisions from index
        ``gen_from`` / ``gate_from`` on (a page that has the first ones asks for the rest only).

        Args:
            gif: ``(tag, i)`` -> the URL of failure mode ``i``'s example GIF (``tag`` ``before``/``after``), or None.
        """
        with self.lock:
            st = self._state
            data = st.to_json()
            wm = world_model_account(self.screen)
            n = len(self.gens["generation"])
            # the counts the loop recorded last: at the end (the final decision and the training after the last
            # generation included), else after the newest generation; the page folds no episodes to count them
            fin = next((e.payload for e in reversed(self.kept) if e.type is EventType.RUN_FINISHED), None)
            recorded = fin or ({"env_steps": self.gens["env_steps"][-1], "episodes": self.gens["episodes"][-1]}
                               if n else {})
            gen_from = max(0, min(gen_from, n))
            gates = [{k: g.get(k) for k in _GATE_KEYS if k in g} for g in st.gates[max(0, gate_from):]]
            return _clean({
                "run_id": self.run_id, "recorded_run_id": st.run_id, "seq": self.seq, "status": st.status, "status_text": st.status_text,
                "task": str(st.task_name), "policy_kind": _policy_kind(st.spec),
                "refiners": _refiners(st.spec), "spec": st.spec, "versions": st.versions, "execution": st.execution,
                "cost_unit": data["cost_unit"], "budget": st.spec.get("budget") or {},
                "env_steps": _int(recorded.get("env_steps")), "used": _used(st, recorded),
                "episode_unit": data["episode_unit"], "return_name": data["return_name"],
                "stop_reason": st.stop_reason, "error": st.error, "writer": st.writer,
                "started_at": st.started_at, "last_activity": self.last_activity,
                "baseline_id": st.baseline_id, "incumbent_id": st.incumbent_id,
                "incumbent_validation_mean": st.incumbent_validation_mean if st.promotions or not n
                else self.gens["incumbent_validation_mean"][-1],
                "baseline_test": data["baseline_test"], "test": data["test"],
                "env_steps_breakdown": st.env_steps_breakdown, "final_decision": st.final_decision,
                "n_generations": n, "gen_from": gen_from,
                "generations": {c: v[gen_from:] for c, v in self.gens.items()},
                "n_gates": len(st.gates), "gate_from": max(0, gate_from), "gates": gates,
                "promotions": self._param_changes(st),
                "code_changes": data["code_changes"],
                "structural": self.structural,
                "failure_modes": _failure_modes(st, gif),
                "test_by_opponent": data["test_by_opponent"], "league": data["league"][-1:],
                "llm_usage": {k: {**v, "text": llm_usage_text(v)} for k, v in st.llm_usage.items()},
                "rejected_proposals": len(st.rejected_proposals), "endpoint_failures": len(st.endpoint_failures),
                "world_model": None if wm is None else {**wm, "text": world_model_text(wm)},
                "training": {"totals": self.job_totals, "jobs": self.jobs[-50:]},
                "corrections": data["corrections"]})

    def _param_changes(self, st: Any) -> list[dict[str, Any]]:
        """Each promotion with its parameters before → after (arrays as one summary line each)."""
        before = dict((self.baseline or {}).get("params") or {})
        out = []
        for p in st.promotions:
            after = dict(p.get("params") or {})
            changes = []
            for k in sorted(set(before) | set(after)):
                a, b = before.get(k), after.get(k)
                if a != b:
                    changes.append({"name": k, "before": None if a is None else _describe(a),
                                    "after": None if b is None else _describe(b)})
            out.append({k: p.get(k) for k in ("generation", "from", "to", "validation_mean",
                                               "previous_validation_mean", "env_steps", "correction_round")}
                       | {"changes": changes, "code": bool(p.get("source_diff"))})
            before = after
        return out

    def _lineage(self, promoted: set[str], baseline_id: str | None) -> dict[str, Any]:
        """The programs (changed code) and their parents: ``nodes`` (id, parent_id, refiner, generation,
        promoted), the newest :data:`_MAX_LINEAGE` and every promoted one; ``total`` counts them all."""
        progs = list(self.programs.values())
        shown = [p for p in progs if p["id"] in promoted]
        shown += [p for p in progs[-_MAX_LINEAGE:] if p["id"] not in promoted]
        nodes = [{k: p[k] for k in ("id", "parent_id", "refiner", "generation")} | {"promoted": p["id"] in promoted}
                 for p in sorted(shown, key=lambda p: _num(p["generation"]) or 0)]
        return {"root": baseline_id, "nodes": nodes, "total": len(progs)}

    def diff(self, candidate_id: str) -> dict[str, Any]:
        """A changed program's code against its parent's (unified diff), as ShinkaEvolve's parent-vs-child view.

        Raises:
            KeyError: no changed program with this id in the run.
        """
        with self.lock:
            prog = self.programs[candidate_id]
            parent = self.programs.get(prog.get("parent_id") or "")
            start = self._state.policy_source if self._state is not None else ""
            old = parent["source"] if parent else str(start or "")
            lines = difflib.unified_diff(old.splitlines(), prog["source"].splitlines(),
                                         f"{(prog.get('parent_id') or 'start')}", candidate_id, lineterm="", n=3)
            return {"id": candidate_id, "parent_id": prog.get("parent_id"), "refiner": prog.get("refiner"),
                    "generation": prog.get("generation"), "diff": "\n".join(lines)}


def _describe(value: Any) -> str:
    try:
        return describe_value(value)
    except (TypeError, ValueError):
        return str(value)[:200]


def _failure_modes(st: Any, gif: Callable[[str, int], str | None] | None) -> dict[str, list[dict[str, Any]]]:
    """The test split's failure modes before (the starting policy) and after (the final incumbent), each with its
    example GIF's URL when the report rendered one (``RUN_DIR/videos/failure-<tag>-<i>.gif``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for tag, crit in (("before", st.baseline_test_critique), ("after", st.test_critique)):
        modes = []
        for i, m in enumerate((crit or {}).get("failure_modes", [])):
            if not isinstance(m, dict):
                continue
            seeds = m.get("example_seeds")
            modes.append({"label": str(m.get("label", "?")), "count": _num(m.get("count")), "share": _num(m.get("share")),
                          "mean_return": _num(m.get("mean_return")), "description": str(m.get("description") or ""),
                          "example_seeds": [str(x) for x in seeds] if isinstance(seeds, list) else [],
                          "gif": gif(tag, i + 1) if gif else None})
        out[tag] = modes
    return out
