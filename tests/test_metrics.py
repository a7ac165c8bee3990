"""ratchet.metrics: [logging] tensorboard writes each generation's scalars as TensorBoard event files, read back
here with tensorboardX's protobuf definitions and TFRecord framing, equal to the ledger's numbers; a resumed run
writes no point twice; a failing writer never stops a run; bad settings fail in one line."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import RecordingExecutor, SimulatedKill, events_of, make_spec_dir, read_events
from typer.testing import CliRunner

from ratchet.cli import app
from ratchet.errors import SpecError
from ratchet.execution.process import ProcessExecutor
from ratchet.ledger import EventType
from ratchet.ledger.projection import active_seconds
from ratchet.loop import resume_run, start_run
from ratchet.metrics import MetricsTap, Point, TensorBoardWriter, write_run_scalars
from ratchet.spec import load_spec

pytest.importorskip("tensorboardX")

#: A small CartPole run: a few generations, two of them gated, in a few seconds.
SMALL = {"budget": {"env_steps": 12_000}, "gate": {"validation_episodes": 8}, "test": {"episodes": 10}}


def tfrecords(path: Path) -> list[bytes]:
    """The records of one event file (TFRecord: length (8) + masked CRC (4) + data + masked CRC (4)), CRCs checked;
    a cut-off last record (a writer killed mid-write) ends them, as it does for TensorBoard."""
    from tensorboardX.record_writer import masked_crc32c

    data, pos, out = path.read_bytes(), 0, []
    while pos + 12 <= len(data) and pos + 16 + struct.unpack("<Q", data[pos:pos + 8])[0] <= len(data):
        header = data[pos:pos + 8]
        (n,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked_crc32c(header)
        body = data[pos + 12:pos + 12 + n]
        assert struct.unpack("<I", data[pos + 12 + n:pos + 16 + n])[0] == masked_crc32c(body)
        out.append(body)
        pos += 16 + n
    return out


def scalars(folder: Path) -> list[tuple[str, int, float, float]]:
    """``(tag, step, value, wall_time)`` of every scalar in a folder's event files, in file then record order."""
    from tensorboardX.proto.event_pb2 import Event

    out = []
    files = sorted(folder.glob("*tfevents*"))
    assert files, f"no event file in {folder}"
    for path in files:
        records = tfrecords(path)
        first = Event.FromString(records[0])
        assert first.file_version == "brain.Event:2"
        for rec in records[1:]:
            ev = Event.FromString(rec)
            out += [(v.tag, ev.step, v.simple_value, ev.wall_time) for v in ev.summary.value]
    return out


def by_tag(points: list[tuple[str, int, float, float]]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for tag, step, value, _ in points:
        assert step not in out.setdefault(tag, {}), f"duplicate point {tag} @ {step}"
        out[tag][step] = value
    return out


def f32(x: float) -> float:
    """What a TensorBoard scalar (a float32 simple_value) holds of ``x``."""
    return float(np.float32(x))


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory):
    """One small run with ``[logging] tensorboard = "tb"``: ``(result, spec_dir, events)``."""
    root = tmp_path_factory.mktemp("tb")
    spec_dir = make_spec_dir(root / "spec", logging={"tensorboard": "tb"}, **SMALL)
    result = start_run(load_spec(spec_dir), root / "runs", "tbrun")
    return result, spec_dir, read_events(result.run_dir)


def test_scalars_equal_the_ledgers_numbers(tb_run):
    result, spec_dir, events = tb_run
    folder = spec_dir / "tb" / "tbrun"  # relative to the spec file's folder, one subfolder per run id
    got = by_tag(scalars(folder))
    gens = events_of(events, EventType.GENERATION_FINISHED)
    assert len(gens) >= 2
    for g in gens:
        p, step = g.payload, g.payload["env_steps"]
        i = next(k for k, e in enumerate(events) if e.seq == g.seq)
        want = {"validation/incumbent_mean": p["incumbent_validation_mean"], "train/best_mean": p["best_train_mean"],
                "train/incumbent_mean": p["incumbent_train_mean"], "gate/gated": float(p["gated"]),
                "gate/promoted": float(p["promoted"]), "budget/env_steps": p["env_steps"],
                "budget/validation_env_steps": p["validation_env_steps"], "budget/episodes": p["episodes"],
                "run/generation": p["generation"], "budget/wall_clock_s": active_seconds(events[:i + 1])}
        for tag, value in want.items():
            if value is not None:
                assert got[tag][step] == pytest.approx(f32(value), rel=1e-6), (tag, step)
    assert set(got["run/generation"]) == {g.payload["env_steps"] for g in gens}  # one point per generation
    gates = events_of(events, EventType.GATE_DECIDED)
    assert gates, "the small run should gate at least once"
    for d in gates:
        step = d.payload["env_steps"]
        assert got["gate/p_value"][step] == f32(d.payload["p_value"])
        assert got["gate/mean_diff"][step] == f32(d.payload["mean_diff"])
        assert got["gate/level"][step] == f32(d.payload["alpha"])
    assert sum(got["gate/promoted"].values()) == len(events_of(events, EventType.INCUMBENT_CHANGED))
    (fin,) = events_of(events, EventType.RUN_FINISHED)
    assert got["test/mean"] == {fin.payload["env_steps"]: f32(result.test.mean)}
    assert got["test/baseline_mean"] == {fin.payload["env_steps"]: f32(result.baseline_test.mean)}
    # wall times are the ledger's event times (TensorBoard's relative axis is the run's)
    times = {e.time for e in events}
    assert all(w in times for _, _, _, w in scalars(folder))


def test_export_writes_the_same_points_and_nothing_twice(tb_run, tmp_path):
    result, spec_dir, _ = tb_run
    runner = CliRunner()
    res = runner.invoke(app, ["export", str(result.run_dir), "--tensorboard", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "tbrun" in res.output
    assert scalars(tmp_path / "out" / "tbrun") == scalars(spec_dir / "tb" / "tbrun")
    again = runner.invoke(app, ["export", str(result.run_dir), "--tensorboard", str(tmp_path / "out")])
    assert again.exit_code == 0 and "nothing new" in again.output
    assert len(list((tmp_path / "out" / "tbrun").glob("*tfevents*"))) == 1
    bad = runner.invoke(app, ["export", str(result.run_dir), "--tensorboard", str(spec_dir / "ratchet.toml")])
    assert bad.exit_code == 1 and len(bad.stderr.strip().splitlines()) == 1 and "cannot write" in bad.stderr
    neither = runner.invoke(app, ["export", str(result.run_dir)])
    assert neither.exit_code == 1 and "--tensorboard" in neither.stderr


def test_a_killed_and_resumed_run_writes_no_point_twice(tmp_path):
    spec_dir = make_spec_dir(tmp_path / "s", logging={"tensorboard": "tb"}, **SMALL)
    runs, folder = tmp_path / "runs", spec_dir / "tb" / "k"
    with pytest.raises(SimulatedKill):
        start_run(load_spec(spec_dir), runs, "k",
                  executor=RecordingExecutor(ProcessExecutor(workers=1, episode_timeout_s=30), die_after=70))
    before = scalars(folder)
    assert any(tag == "run/generation" for tag, *_ in before)  # the kill came after a recorded generation
    assert not any(tag.startswith("test/") for tag, *_ in before)
    # a kill -9 in the middle of a write: the file ends in a cut-off record, and its last points are lost
    (path,) = folder.glob("*tfevents*")
    path.write_bytes(path.read_bytes()[:-30])
    kept = scalars(folder)
    assert len(kept) == len(before) - 1
    result = resume_run("k", runs, executor=ProcessExecutor(workers=1, episode_timeout_s=30))
    files = sorted(folder.glob("*tfevents*"))
    assert len(files) == 2  # the resumed session's own file; the first one is never rewritten
    got = by_tag(scalars(folder))  # no (tag, step) twice
    events = read_events(result.run_dir)
    assert set(got["run/generation"]) == {g.payload["env_steps"] for g in events_of(events, EventType.GENERATION_FINISHED)}
    assert got["test/mean"] == {events[-1].payload["env_steps"]: f32(result.test.mean)}
    # everything the ledger holds is there, once: what an export of the finished run writes
    write_run_scalars(events, tmp_path / "export")
    assert by_tag(scalars(tmp_path / "export")) == got
    assert scalars(folder)[:len(kept)] == kept  # what the first session wrote stays as it was
    for i, e in enumerate(events):  # the wall clock counts both sessions, not the time between them
        if e.type is EventType.GENERATION_FINISHED:
            assert got["budget/wall_clock_s"][e.payload["env_steps"]] == pytest.approx(active_seconds(events[:i + 1]),
                                                                                       rel=1e-6)


class _FailingWriter:
    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.points = fail_at, []

    def write(self, point: Point) -> None:
        if len(self.points) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.points.append(point)

    def close(self) -> None:
        pass


class _Ledger:
    def __init__(self, events) -> None:
        self.events = events

    def read(self, from_seq: int = 0):
        return [e for e in self.events if e.seq > from_seq]


def test_a_failing_writer_warns_once_and_the_run_goes_on(tb_run, capsys):
    _, _, events = tb_run
    writer, seen = _FailingWriter(fail_at=2), []
    tap = MetricsTap(_Ledger(events), [lambda: writer], seen.append, names=["tensorboard (tb/x)"])
    for i in range(3):
        tap({"generation": i})
    tap.close()
    assert seen == [{"generation": i} for i in range(3)]  # the progress it wraps is always called
    assert len(writer.points) == 2 and not tap.active
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ratchet: warning: [logging] tensorboard (tb/x): OSError")
    assert "No space left on device" in err[0] and "--tensorboard" in err[0]

    def cannot_open():
        raise RuntimeError("bad folder")

    tap = MetricsTap(_Ledger(events), [cannot_open], None)
    tap({})
    tap.close()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_run_whose_folder_turns_bad_finishes(tmp_path, capfd):
    """The run's subfolder cannot be made (a file took its name): one warning, the run ends as without it."""
    spec_dir = make_spec_dir(tmp_path / "s", logging={"tensorboard": "tb"}, budget={"env_steps": 6000},
                             gate={"validation_episodes": 8}, test={"episodes": 5})
    (spec_dir / "tb").mkdir()
    (spec_dir / "tb" / "bad").write_text("not a folder")
    result = start_run(load_spec(spec_dir), tmp_path / "runs", "bad")
    assert result.stop_reason and events_of(read_events(result.run_dir), EventType.RUN_FINISHED)
    warnings = [ln for ln in capfd.readouterr().err.splitlines() if "warning: [logging]" in ln]
    assert len(warnings) == 1, warnings


def test_tensorboard_path_is_relative_to_the_spec_file(tmp_path):
    spec = load_spec(make_spec_dir(tmp_path / "s", logging={"tensorboard": "logs/tb"}))
    assert spec.logging.tensorboard == str((tmp_path / "s" / "logs" / "tb").resolve())
    assert spec.to_dict()["logging"] == {"tensorboard": spec.logging.tensorboard}  # the ledger keeps it absolute
    assert load_spec(make_spec_dir(tmp_path / "n")).logging.tensorboard is None


def test_bad_logging_settings_fail_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match=r"unknown key \[logging\] mlflow; allowed keys here: tensorboard"):
        load_spec(make_spec_dir(tmp_path / "a", logging={"mlflow": "x"}))
    d = make_spec_dir(tmp_path / "b", logging={"tensorboard": "ratchet.toml"})
    with pytest.raises(SpecError, match=r"\[logging\] tensorboard: .*ratchet.toml is a file; give a folder") as e:
        load_spec(d)
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match=r"--set 'logging.tensorboard=policy.py/x'.*is under .*policy.py, a file"):
        load_spec(make_spec_dir(tmp_path / "c"), ["logging.tensorboard=policy.py/x"])
    with pytest.raises(SpecError, match=r"\[logging\] tensorboard: .*at least 1 character"):
        load_spec(make_spec_dir(tmp_path / "d", logging={"tensorboard": ""}))

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboardX" else real(name, *a))
    with pytest.raises(SpecError, match=r'needs tensorboardX.*pip install "policy-ratchet\[logging\]"'):
        load_spec(make_spec_dir(tmp_path / "e", logging={"tensorboard": "tb"}))
    spec = load_spec(make_spec_dir(tmp_path / "f"))
    spec = spec.model_copy(update={"logging": spec.logging.model_copy(update={"tensorboard": str(tmp_path / "tb")})})
    with pytest.raises(SpecError, match="policy-ratchet"):
        start_run(spec, tmp_path / "runs")  # library users get the same line, before a run directory exists
    assert not (tmp_path / "runs").exists()


def test_writer_skips_what_its_folder_holds(tmp_path):
    w = TensorBoardWriter(tmp_path)
    w.write(Point(10, 1.0, {"a": 1.0, "b": 2.0}))
    w.close()
    w = TensorBoardWriter(tmp_path)
    w.write(Point(10, 2.0, {"a": 5.0, "c": 3.0}))
    w.write(Point(20, 2.0, {"a": 4.0}))
    w.close()
    assert by_tag(scalars(tmp_path)) == {"a": {10: 1.0, 20: 4.0}, "b": {10: 2.0}, "c": {10: 3.0}}


def test_a_resumed_run_without_tensorboardx_warns_and_goes_on(tb_run, tmp_path, monkeypatch, capsys):
    """Resuming on a machine without the [logging] extra: the writer is off with the install line, the run goes on."""
    import sys

    _, _, events = tb_run
    monkeypatch.setitem(sys.modules, "tensorboardX.record_writer", None)  # import fails as if not installed
    tap = MetricsTap(_Ledger(events), [lambda: TensorBoardWriter(tmp_path / "tb")], None, names=["tensorboard"])
    tap({})
    tap.close()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert 'tensorboardX is not installed; pip install "policy-ratchet[logging]"' in line
