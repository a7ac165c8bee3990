"""Refiner kinds as plug-ins: each ``[[refiners]]`` table names a kind, registered here.

A kind is a module exposing ``KINDS: dict[str, RefinerKind]``: a pydantic model of its settings (the
table's keys other than ``kind`` and ``name``), the policy kinds it can refine, and
``build(settings, name, context) -> list[Refiner]`` (several when one table expands into variants, e.g.
CMA-ES step sizes; each a :class:`~ratchet.refiners.base.Refiner`). The loop knows nothing else of a kind:
adding one touches its own module, its name here, and its tests. Modules are imported on first use, so the
``ppo`` kind pulls in PyTorch only for runs that use it.

Kinds outside ratchet register with :func:`register_kind` (in the process that runs and resumes the run),
or through the ``ratchet.refiners`` entry-point group of an installed package (``name = "module"``).
"""

from __future__ import annotations

import importlib
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["KIND_MODULES", "RefinerContext", "RefinerKind", "Sent", "as_they_finish", "known_kinds", "refiner_kind",
           "register_kind"]

T = TypeVar("T")

#: What an outside service's call returns: the reply's text (None when it failed) and JSON-ready facts.
Reply = tuple[str | None, dict[str, Any]]

#: Refiner kind -> the module that defines it.
KIND_MODULES: dict[str, str] = {
    "cmaes": "ratchet.refiners.cmaes",
    "ppo": "ratchet.refiners.ppo",
    "residual": "ratchet.refiners.ppo",
    "mutate": "ratchet.refiners.mutate",
    "llm": "ratchet.refiners.llm",
    "dagger": "ratchet.refiners.dagger",
    "hg-dagger": "ratchet.refiners.dagger",
    "bc": "ratchet.refiners.dagger",
    "cfr": "ratchet.refiners.cfr",
}


@dataclass(frozen=True)
class RefinerContext:
    """What the loop lends a refiner (everything else it learns from ``propose``/``observe``).

    Attributes:
        program: The run's policy program (its ``PARAMETERS``; empty for network policies).
        start: The run's starting candidate.
        task: The task.
        seed: A seed for this refiner (the run seed plus its position among the run's refiners).
        name: The refiner's arm name (recorded as its candidates' ``refiner``).
        train: Runs a training job (:class:`ratchet.execution.training.TrainingJob`) in the sandbox, or
            reads its recorded result back on resume; returns a
            :class:`~ratchet.execution.training.TrainingResult` whose outputs' artifacts are already in
            the run's artifact store (their digests in ``TrainingOutput.info["artifacts"]``).
        artifact: Bytes of an artifact by digest.
        training_seeds: ``training_seeds(n)``: ``n`` fresh seeds of the training split for a training job.
        exchange: ``exchange(key, request, call) -> (body, record)``: a request to an outside service (an
            LLM endpoint) made once per run. The first time, ``call()`` runs and returns ``(body, info)``
            (the reply's text or None, and JSON-ready facts such as token counts and an error); the request
            (JSON-ready, never a secret) and the body are stored as artifacts and an ``llm_call`` event
            keyed by ``key`` records them with ``info``. Afterwards, and on resume, the recorded body and
            record come back without calling. None where the loop offers no such service.
        exchange_all: ``exchange_all([(key, request, call), …]) -> [Future, …]``: several such requests at once.
            Those already recorded come back as recorded; the ``call`` of each other runs in its own thread, all
            at the same time, and each reply is recorded (in the calling thread) as soon as it arrives, so a run
            killed while others are still out never asks for it again. Returns one done
            :class:`~concurrent.futures.Future` per item, in the order given: ``.result()`` is ``(body, record)``
            as ``exchange`` returns it, or raises what that ``call`` raised (nothing is recorded for it). The
            ``llm_call`` events follow the order the replies came in; everything else a refiner does with them
            should follow the order given. None where the loop offers no such service.
        read_input: ``read_input(path) -> bytes``: a file the refiner's settings name (e.g. an expert
            policy), relative to the spec's folder. The loop stores its bytes as an artifact when the run
            starts and records the digest in ``run_started``, so a resumed run reads the same bytes from
            the ledger, never the file again. None where the caller offers no files.
        critique: ``critique(candidate_id, traces=0, last_steps=10) -> Critique | None``: the
            :class:`~ratchet.critic.Critique` of that candidate's latest training evaluation in this run (the
            episodes it ran on a generation's training seeds; None when it ran none), so a refiner editing
            a parent other than the incumbent (an archive elite) reads that parent's own failures. With
            ``traces`` > 0, up to that many of its worst episodes (lowest return first) are replayed on the
            trusted side and their last ``last_steps`` env steps come as ``Critique.traces``
            (:class:`ratchet.trace.Trace`). Replays are recorded (``episode_traced`` events: a resumed run
            reads them back), count in the env-step and episode budgets (as re-evaluation), and run only
            out of what the current generation and its gate leave of those budgets, and only where the
            executor records traces; otherwise the critique comes without them. None where the loop offers
            no such service.
        time_left: ``time_left() -> float | None``: seconds of the run's ``[budget] wall_clock_s`` left (None
            without that budget), so a refiner waiting on an outside service stops when the run must.
        money: The run's ``[budget] money`` (a :class:`Purse` every refiner that pays for requests shares), or
            None without that budget.
        exchange_ahead: ``exchange_ahead([(key, request, call), …]) -> [Sent, …]``: such requests sent without
            waiting (an ``llm`` refiner's ``ahead``), one :class:`Sent` per item in the order given. Those recorded come
            back as recorded, and so does an answer an earlier session received but did not record (each answer is
            written to a journal under the run's folder, ``received/``, by the thread that receives it, so a kill -9
            never loses one: it is recorded from there, never asked for again). The ``call`` of each other runs in a
            thread of its own that only waits on the service; its ``llm_call`` event is recorded when the refiner
            takes it (:meth:`Sent.take`, in the loop's thread), so the events follow the order the refiner takes
            them. None where the loop offers no such service.
        transitions: ``transitions() -> [digest, …]``: the artifacts of the transitions recorded so far on the trusted
            side for the world model (``[model] screen``; :mod:`ratchet.worldmodel.transitions`), oldest first; None
            where the loop records none.
    """

    program: Any
    start: Any
    task: Any
    seed: int
    name: str
    train: Callable[[Any], Any]
    artifact: Callable[[str], bytes]
    training_seeds: Callable[[int], list[int]]
    exchange: Callable[[str, Mapping[str, Any], Callable[[], Reply]], Reply] | None = None
    read_input: Callable[[str], bytes] | None = None
    critique: Callable[..., Any] | None = None
    time_left: Callable[[], float | None] | None = None
    exchange_all: Callable[[Sequence[tuple[str, Mapping[str, Any], Callable[[], Reply]]]],
                           list[Future[Reply]]] | None = None
    transitions: Callable[[], list[str]] | None = None
    money: Purse | None = None
    exchange_ahead: Callable[[Sequence[tuple[str, Mapping[str, Any], Callable[[], Reply]]]], list[Sent]] | None = None


class Sent:
    """A request sent without waiting for its reply (:class:`RefinerContext` ``exchange_ahead``).

    Args:
        reply: What the call returns once it is in: ``(body, info)``, or the exception it raised.
        record: Turns that into ``(body, record)`` as ``exchange`` returns it, recording it (run once, by
            :meth:`take`; default: as it is, for a reply already recorded or no ledger at all).
    """

    def __init__(self, reply: Future[Reply], record: Callable[[Reply], Reply] | None = None) -> None:
        self._reply, self._record = reply, record
        self._taken: Reply | None = None

    def done(self) -> bool:
        """Whether the reply is in (taking it will not wait)."""
        return self._reply.done()

    def wait(self) -> None:
        """Wait until the reply is in (without taking it)."""
        self._reply.exception()  # blocks until the reply (or what the call raised) is in; raises nothing

    def take(self) -> Reply:
        """Wait for the reply, record it the first time (in the calling thread: the loop's), and return ``(body,
        record)`` as ``exchange`` does; raises what the call raised (nothing recorded)."""
        if self._taken is None:
            got = self._reply.result()
            self._taken = got if self._record is None else self._record(got)
        return self._taken


@dataclass
class Purse:
    """The run's money budget (``[budget] money``, in ``currency``), shared by the refiners that pay for requests:
    ``spent`` is what their answered requests cost, ``held`` the worst case of those in flight. A refiner sends a
    request only when :meth:`has_room` for its worst case, holds that while it is out, then pays what it cost; a
    resumed run replays the same payments from the recorded requests, so the purse comes back as it was."""

    cap: float
    currency: str = "USD"
    spent: float = 0.0
    held: float = 0.0

    def has_room(self, price: float) -> bool:
        """Whether a request that may cost ``price`` (money) fits beside what is spent and held."""
        return self.spent + self.held + price <= self.cap

    def text(self) -> str:
        """What is spent of the cap, with the currency (for idle reasons)."""
        return f"{self.spent:.4g} of {self.cap:g} {self.currency} spent"


@dataclass(frozen=True)
class RefinerKind:
    """A registered refiner kind (see the module doc)."""

    settings: type[BaseModel]
    policy_kinds: tuple[str, ...]
    #: ``build(settings, name, context) -> [Refiner, …]``: the refiners of one ``[[refiners]]`` table.
    build: Callable[[Any, str, RefinerContext], list[Any]]
    #: One line shown when the kind is used with a policy kind it cannot refine.
    hint: str = ""
    #: ``files(settings) -> [path, …]``: files the settings name, relative to the spec (checked when the
    #: spec is loaded; read through :attr:`RefinerContext.read_input`).
    files: Callable[[Any], list[str]] | None = None
    #: ``check(settings, name)``: a quick look at what the kind needs outside ratchet (an LLM endpoint), made
    #: when a new run starts, before any episode (not on resume); raises a
    #: :class:`~ratchet.errors.RatchetError` with one line saying what to fix.
    check: Callable[[Any, str], None] | None = None
    #: Whether the kind's candidates may carry source that differs from their parent's (``mutate``, ``llm``): a
    #: run with such a kind has a lineage of programs (``ratchet dashboard`` reads its candidates to draw it).
    changes_code: bool = False
    #: ``pays(settings) -> bool``: whether a table's requests are priced in money, so that ``[budget] money`` limits
    #: them (an ``llm`` table with prices); None: the kind never pays.
    pays: Callable[[Any], bool] | None = None
    #: ``generation_size(settings) -> int``: the fewest candidates a generation of a table evaluates on its training
    #: seeds besides the incumbent (its proposals and its recommendation), as the loop prices one before it runs
    #: (:meth:`Refiner.generation_cost`): what the spec counts to refuse up front a ``[budget] episodes`` too small
    #: for a single generation. None: 1.
    generation_size: Callable[[Any], int] | None = None
    #: Settings added to the kind since ledgers were first written, each with the value that behaves as the code
    #: before it did: a spec a ledger recorded without the setting is read with that value, so it resumes and
    #: replays as it ran (a new spec gets the setting's default).
    recorded_defaults: Mapping[str, Any] = field(default_factory=dict)


def as_they_finish(calls: Sequence[Callable[[], T]]) -> Iterator[tuple[int, Future[T]]]:
    """Start every call in its own thread at once and give ``(index, done future)`` for each as it finishes
    (``.result()`` returns what the call returned or raises what it raised). The threads are daemons: a caller
    that stops reading (an interrupt) leaves the rest to end on their own."""
    done: queue.SimpleQueue[tuple[int, Future[T]]] = queue.SimpleQueue()

    def run(i: int, call: Callable[[], T]) -> None:
        fut: Future[T] = Future()
        try:
            fut.set_result(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which decides
            fut.set_exception(exc)
        done.put((i, fut))

    for i, call in enumerate(calls):
        threading.Thread(target=run, args=(i, call), daemon=True, name=f"ratchet-call-{i}").start()
    for _ in calls:
        yield done.get()


def register_kind(kind: str, module: str) -> None:
    """Register refiner kind ``kind``, defined in ``KINDS[kind]`` of ``module`` (imported on first use).

    Raises:
        ValueError: ``kind`` is already registered to another module.
    """
    if KIND_MODULES.get(kind, module) != module:
        raise ValueError(f"refiner kind {kind!r} is already registered to {KIND_MODULES[kind]}")
    KIND_MODULES[kind] = module


def _entry_points() -> None:
    """Kinds that installed packages declare in the ``ratchet.refiners`` entry-point group."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="ratchet.refiners"):
        KIND_MODULES.setdefault(ep.name, ep.value)


def known_kinds() -> list[str]:
    """Every registered kind, those of installed packages included."""
    _entry_points()
    return list(KIND_MODULES)


def refiner_kind(kind: str) -> RefinerKind:
    """The registered kind.

    Raises:
        KeyError: unknown kind (the message lists the known ones), or its module does not define it.
    """
    if kind not in KIND_MODULES:
        _entry_points()
    if kind not in KIND_MODULES:
        raise KeyError(f"unknown refiner kind {kind!r}; known: {', '.join(KIND_MODULES)}")
    kinds = getattr(importlib.import_module(KIND_MODULES[kind]), "KINDS", {})
    if kind not in kinds:
        raise KeyError(f"refiner kind {kind!r}: module {KIND_MODULES[kind]} defines no KINDS[{kind!r}]")
    return kinds[kind]


def arm_names(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Default arm names: the ``name`` given, else the kind, numbered when a kind repeats."""
    kinds = [e["kind"] for e in entries]
    out = []
    for i, e in enumerate(entries):
        if e.get("name"):
            out.append(e["name"])
        else:
            n = kinds[:i].count(e["kind"])
            out.append(e["kind"] if kinds.count(e["kind"]) == 1 else f"{e['kind']}-{n + 1}")
    return out
