"""Metrics writers: each generation's scalars where people already look (TensorBoard), as outputs of the ledger.

The ledger is the run's record; a writer is an output made from it, the way Stable-Baselines3's logger writes
to TensorBoard beside stdout. :class:`ScalarProjection` folds ledger events into points (a step, a wall time,
named scalars); a :class:`MetricsWriter` writes them. With ``[logging] tensorboard = "tb/"`` in the spec, every
run writes event files to ``tb/RUN_ID/``, so TensorBoard shows runs side by side. The step of every point
(TensorBoard's ``global_step``) is the run's env steps used so far (the task's cost units), so curves align
with Stable-Baselines3's ``time/total_timesteps``.

Tags:

- per generation (``generation_finished``): ``validation/incumbent_mean``, ``train/best_mean`` and
  ``train/incumbent_mean`` (return units; absent when no contender finished cleanly), ``gate/gated`` and
  ``gate/promoted`` (0 or 1), ``budget/env_steps``, ``budget/validation_env_steps``, ``budget/episodes``,
  ``budget/wall_clock_s`` (seconds the run was running, from the ledger's event times) and ``run/generation``;
- per gate decision (``gate_decided``, at its own env steps): ``gate/p_value`` (one-sided, "candidate better"),
  ``gate/mean_diff`` (mean paired difference on the validation seeds, return units), ``gate/level`` (the
  significance level the decision was tested at) and ``gate/validation_episodes``;
- at the end (``run_finished``): ``test/mean`` (the refined incumbent), ``test/baseline_mean`` (the starting
  policy) and, for a task with a success threshold, ``test/success_rate`` and ``test/baseline_success_rate``.

A resumed run (``ratchet resume``) writes no point twice: the writer reads the ``(tag, step)`` pairs its folder
already holds and skips them. A writer that fails (disk full, a bad folder) never stops a run: it says so in one
line on stderr and is off for the rest of the session.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ratchet.errors import RatchetError, SpecError
from ratchet.ledger import Event, EventType, LedgerStore

__all__ = ["INSTALL_HINT", "MetricsTap", "MetricsWriter", "Point", "ScalarProjection", "TensorBoardWriter",
           "check_logging", "metrics_tap", "read_scalars", "write_run_scalars"]

#: What to run when tensorboardX is missing.
INSTALL_HINT = 'pip install "policy-ratchet[logging]"'



@dataclass(frozen=True)
class Point:
    """The scalars of one moment of a run.

    Attributes:
        step: The run's env steps used so far (the task's cost units): TensorBoard's ``global_step``.
        wall_time: Unix time (seconds) the ledger recorded the event at.
        scalars: Tag (``"validation/incumbent_mean"``) → value.
    """

    step: int
    wall_time: float
    scalars: dict[str, float] = field(hash=False)


class MetricsWriter(Protocol):
    """Where points go besides the ledger. A writer may raise on any failure; :class:`MetricsTap` turns that into
    one warning line and stops using it."""

    def write(self, point: Point) -> None:
        """Write one point (one generation's summary, one gate decision, the test means)."""

    def close(self) -> None:
        """Flush and release the writer's files."""


class ScalarProjection:
    """Folds a run's events, in ledger order, into :class:`Point` s (see the module's tags). The wall clock is the
    run's active time: the sum over its sessions (start or resume to the session's last event seen), so the
    downtime between a kill and a resume is not counted."""

    def __init__(self) -> None:
        self._before = 0.0  # seconds of the sessions that ended
        self._session: float | None = None
        self._last: float | None = None

    def feed(self, event: Event) -> Point | None:
        """The point ``event`` makes, or None (an event without scalars, or one of a correction round)."""
        p = event.payload
        if event.type in (EventType.RUN_STARTED, EventType.RUN_RESUMED):
            if self._session is not None and self._last is not None:
                self._before += self._last - self._session
            self._session = event.time
        self._last = event.time
        if "correction_round" in p:  # a person's correction round after the run: not the run's curve
            return None
        if event.type is EventType.GENERATION_FINISHED:
            gated, promoted = bool(p.get("gated")), bool(p.get("promoted"))
            values: dict[str, Any] = {
                "validation/incumbent_mean": p.get("incumbent_validation_mean"),
                "train/best_mean": p.get("best_train_mean"), "train/incumbent_mean": p.get("incumbent_train_mean"),
                "gate/gated": float(gated), "gate/promoted": float(promoted),
                "budget/env_steps": p.get("env_steps"), "budget/validation_env_steps": p.get("validation_env_steps"),
                "budget/episodes": p.get("episodes"), "budget/wall_clock_s": self.wall_clock_s(event.time),
                "run/generation": p.get("generation")}
        elif event.type is EventType.GATE_DECIDED:
            values = {"gate/p_value": p.get("p_value"), "gate/mean_diff": p.get("mean_diff"),
                      "gate/level": p.get("alpha"), "gate/validation_episodes": p.get("n")}
        elif event.type is EventType.RUN_FINISHED:
            test, base = p.get("test") or {}, p.get("baseline_test") or {}
            values = {"test/mean": test.get("mean"), "test/baseline_mean": base.get("mean"),
                      "test/success_rate": test.get("success_rate"),
                      "test/baseline_success_rate": base.get("success_rate")}
        else:
            return None
        step = p.get("env_steps")
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            return None
        scalars = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return Point(int(step), event.time, scalars) if scalars else None

    def wall_clock_s(self, now: float) -> float:
        """Seconds the run was running up to ``now`` (Unix time, in the session seen last)."""
        return self._before + (now - self._session if self._session is not None else 0.0)

    def points(self, events: Iterable[Event]) -> Iterator[Point]:
        """:meth:`feed` each event; the points they make, in order."""
        for ev in events:
            point = self.feed(ev)
            if point is not None:
                yield point


def check_logging(tensorboard: str | None, where: str = "spec") -> None:
    """Check before a run starts that ``[logging] tensorboard`` can be written: tensorboardX is installed and the
    folder is a folder that exists or can be made (its nearest existing parent a writable folder).

    Args:
        tensorboard: The resolved folder, or None (nothing to check).
        where: What to name in the message (the spec file).

    Raises:
        SpecError: one line saying what to fix.
    """
    if tensorboard is None:
        return
    if importlib.util.find_spec("tensorboardX") is None:
        raise SpecError(f"{where}: [logging] tensorboard needs tensorboardX, which is not installed; "
                        f"{INSTALL_HINT} (or remove [logging] tensorboard)")
    folder = Path(tensorboard)
    nearest = folder
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        what = "is a file" if nearest == folder else f"is under {nearest}, a file"
        raise SpecError(f"{where}: [logging] tensorboard: {folder} {what}; give a folder for TensorBoard's "
                        "event files")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise SpecError(f"{where}: [logging] tensorboard: cannot write in {nearest} (permission denied); give a "
                        "folder you can write to")


_HEADER = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def _records(data: bytes) -> Iterator[bytes]:
    """The records of TFRecord bytes (length (8) + its CRC (4) + data + its CRC (4)); a cut-off last record (a
    writer killed mid-write) ends them. CRCs are not checked: the records are only skipped when already written."""
    pos = 0
    while pos + 12 <= len(data):
        (n,) = _HEADER.unpack_from(data, pos)
        if pos + 12 + n + 4 > len(data):
            return
        yield data[pos + 12:pos + 12 + n]
        pos += 12 + n + 4


def read_scalars(folder: str | Path) -> list[tuple[str, int, float, float]]:
    """Every scalar in the TensorBoard event files of ``folder`` (not its subfolders), file by file in name
    order: ``(tag, step, value, wall_time)``. Unreadable files and damaged records are skipped.

    Raises:
        ModuleNotFoundError: tensorboardX is not installed.
    """
    from tensorboardX.proto.event_pb2 import Event as EventProto

    out = []
    for path in sorted(Path(folder).glob("*tfevents*")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for record in _records(data):
            ev = EventProto()
            try:
                ev.ParseFromString(record)
            except Exception:  # noqa: BLE001, S112 - a damaged record (protobuf's DecodeError) is skipped
                continue
            if ev.HasField("summary"):
                out += [(v.tag, int(ev.step), float(v.simple_value), float(ev.wall_time)) for v in ev.summary.value
                        if v.WhichOneof("value") == "simple_value"]
    return out


class TensorBoardWriter:
    """Writes points as TensorBoard scalars into one folder (a run's ``tb/RUN_ID``), with tensorboardX's
    record writer and protobuf definitions. Writes are synchronous and flushed point by point (a few scalars per
    generation), so a failure (disk full) is raised here, where it can be caught, and a run killed with
    ``kill -9`` loses no point it wrote. Each writer opens its own event file; ``(tag, step)`` pairs the folder's
    files already hold are skipped, so a resumed run or a second export writes no duplicate point.

    Raises (constructor):
        RatchetError: tensorboardX is not installed.
        OSError: the folder cannot be made.
    """

    def __init__(self, folder: str | Path) -> None:
        try:
            from tensorboardX.record_writer import RecordWriter  # imported here: tensorboardX is an optional extra
        except ModuleNotFoundError:
            raise RatchetError(f"tensorboardX is not installed; {INSTALL_HINT}") from None

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._written = {(tag, step) for tag, step, _, _ in read_scalars(self.folder)}
        self._record_writer = RecordWriter
        self._file: Any = None
        self.points_written = 0

    def _open(self) -> Any:
        from tensorboardX.proto.event_pb2 import Event as EventProto

        ns = time.time_ns()
        # TensorBoard reads a folder's files in name order, taken as the order they were written in: seconds, then
        # nanoseconds, so a resumed session's file sorts after the first one even within a second
        base = f"events.out.tfevents.{ns // 10**9:010d}.{ns % 10**9:09d}.{socket.gethostname()}.{os.getpid()}"
        path, n = self.folder / f"{base}.ratchet", 1
        while path.exists():  # never overwrite a file
            path, n = self.folder / f"{base}.{n}.ratchet", n + 1
        rw = self._record_writer(str(path))
        rw.write(EventProto(wall_time=ns / 1e9, file_version="brain.Event:2").SerializeToString())
        return rw

    def write(self, point: Point) -> None:
        """Write the point's scalars not written before at its step (one event per scalar), then flush."""
        from tensorboardX.proto.event_pb2 import Event as EventProto
        from tensorboardX.proto.summary_pb2 import Summary

        new = [(tag, v) for tag, v in point.scalars.items() if (tag, point.step) not in self._written]
        if not new:
            return
        if self._file is None:
            self._file = self._open()
        for tag, value in new:
            ev = EventProto(wall_time=point.wall_time, step=point.step,
                            summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))
            self._file.write(ev.SerializeToString())
            self._written.add((tag, point.step))
        self._file.flush()
        self.points_written += 1

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            file.close()


def _warn(message: str) -> None:
    print(f"ratchet: warning: {message}", file=sys.stderr, flush=True)


class MetricsTap:
    """A ``progress`` function (see :func:`ratchet.loop.start_run`) that first writes the run's new ledger events
    as points to its writers, then calls the ``progress`` it wraps. Reading the ledger (not the progress dict)
    makes a live run, a resumed one and ``ratchet export --tensorboard`` write the same points.

    A writer that raises is reported in one line on stderr and is off for the rest of the session; the run goes
    on (the ledger is the record).

    Args:
        ledger: The run's ledger, open for the tap's lifetime.
        writers: Zero-argument functions that open a writer (called at the first point, so a run that records no
            generation opens no file).
        progress: The progress function to call after writing, or None.
        names: What to call each writer in a warning (default ``"writer N"``).
    """

    def __init__(self, ledger: LedgerStore, writers: list[Callable[[], MetricsWriter]],
                 progress: Callable[[dict[str, Any]], None] | None = None, names: list[str] | None = None) -> None:
        self.ledger, self.progress = ledger, progress
        self._openers: list[Callable[[], MetricsWriter] | None] = list(writers)
        self._names = names or [f"writer {i + 1}" for i in range(len(writers))]
        self._writers: list[MetricsWriter | None] = [None] * len(writers)
        self._projection = ScalarProjection()
        self._seq = 0

    def __call__(self, info: dict[str, Any]) -> None:
        self.catch_up()
        if self.progress is not None:
            self.progress(info)

    @property
    def active(self) -> bool:
        """Whether any writer is still on."""
        return any(o is not None for o in self._openers)

    def _off(self, i: int, exc: BaseException) -> None:
        self._openers[i], w, self._writers[i] = None, self._writers[i], None
        why = str(exc) if isinstance(exc, RatchetError) else f"{type(exc).__name__}: {exc}"
        _warn(f"[logging] {self._names[i]}: {why}; it is off for the rest of this run "
              "(the ledger keeps every number: `ratchet export RUN --tensorboard DIR` writes them later)")
        if w is not None:
            try:
                w.close()
            except Exception:  # noqa: BLE001, S110 - it failed already; the warning said so
                pass

    def catch_up(self) -> None:
        """Write the points of the events recorded since the last call. Never raises for a writer's failure;
        a ledger that cannot be read leaves the points for the next call."""
        if not self.active:
            return
        try:
            events = self.ledger.read(self._seq)
        except Exception:  # noqa: BLE001 - an output must never stop the run; the next call tries again
            return
        for ev in events:
            self._seq = ev.seq
            point = self._projection.feed(ev)
            if point is None:
                continue
            for i, opener in enumerate(self._openers):
                if opener is None:
                    continue
                try:
                    writer = self._writers[i]
                    if writer is None:
                        writer = self._writers[i] = opener()
                    writer.write(point)
                except Exception as exc:  # noqa: BLE001 - disk full, a bad folder, a missing package: warn, go on
                    self._off(i, exc)

    def close(self) -> None:
        """Write what the ledger recorded since the last call (the run's test means), then close the writers."""
        self.catch_up()
        for i, w in enumerate(self._writers):
            if w is None:
                continue
            self._writers[i] = None
            try:
                w.close()
            except Exception as exc:  # noqa: BLE001
                _warn(f"[logging] {self._names[i]}: closing failed: {type(exc).__name__}: {exc}")


def metrics_tap(tensorboard: str | None, run_id: str, ledger: LedgerStore,
                progress: Callable[[dict[str, Any]], None] | None) -> MetricsTap | None:
    """The tap a run with ``[logging]`` writes its points through (None without one): TensorBoard event files in
    ``tensorboard/run_id``.

    Args:
        tensorboard: ``[logging] tensorboard``, resolved (absolute), or None.
        run_id: The run's id: the name of its subfolder.
        ledger: The run's ledger.
        progress: The progress function the tap wraps.
    """
    if tensorboard is None:
        return None
    folder = Path(tensorboard) / run_id
    return MetricsTap(ledger, [lambda: TensorBoardWriter(folder)], progress, names=[f"tensorboard ({folder})"])


def write_run_scalars(events: Iterable[Event], folder: str | Path) -> int:
    """Write a recorded run's points as TensorBoard scalars into ``folder`` (``ratchet export --tensorboard``):
    the same points the run wrote live with ``[logging] tensorboard``, skipping those already there.

    Returns:
        The number of points (moments with at least one new scalar) written.

    Raises:
        RatchetError: tensorboardX is not installed.
        OSError: the folder cannot be made or written.
    """
    writer = TensorBoardWriter(folder)
    try:
        for point in ScalarProjection().points(events):
            writer.write(point)
    finally:
        writer.close()
    return writer.points_written
