"""ratchet.ledger: the SQLite event store and the run-state projection."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import re
import sqlite3
import subprocess
import sys

import pytest
from conftest import events_of, read_events

from ratchet.errors import LedgerError
from ratchet.ledger import Event, EventType, SQLiteLedger
from ratchet.ledger.projection import project


def rows(path) -> int:
    con = sqlite3.connect(str(path))
    try:
        return con.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        con.close()


def test_append_read_get(tmp_path):
    led = SQLiteLedger(tmp_path / "sub" / "ledger.sqlite")  # parent folder created
    e1, created1 = led.append(EventType.RUN_STARTED, "run_started", {"run_id": "r", "x": [1, 2.5, None]})
    e2, created2 = led.append(EventType.GENERATION_FINISHED, "generation/1", {"generation": 1})
    assert created1 and created2
    assert (e1.seq, e2.seq) == (1, 2) and e1.time <= e2.time
    assert isinstance(e1, Event) and e1.type is EventType.RUN_STARTED
    assert [e.key for e in led.read()] == ["run_started", "generation/1"]
    assert [e.key for e in led.read(from_seq=1)] == ["generation/1"]
    got = led.get("run_started")
    assert got == e1 and got.payload == {"run_id": "r", "x": [1, 2.5, None]}
    assert led.get("missing") is None
    led.close()


def test_append_is_idempotent_by_key(tmp_path):
    path = tmp_path / "ledger.sqlite"
    led = SQLiteLedger(path)
    first, created = led.append(EventType.INCUMBENT_CHANGED, "incumbent/3/abc", {"to": "abc", "v": 1})
    again, created_again = led.append(EventType.INCUMBENT_CHANGED, "incumbent/3/abc", {"to": "xyz", "v": 2})
    assert created is True and created_again is False
    assert again == first and again.payload == {"to": "abc", "v": 1}  # the stored event wins
    assert rows(path) == 1
    assert len(led.read()) == 1
    led.close()


def test_persistence_across_reopen(tmp_path):
    path = tmp_path / "ledger.sqlite"
    led = SQLiteLedger(path)
    for i in range(5):
        led.append(EventType.CANDIDATE_PROPOSED, f"proposed/1/{i}", {"i": i, "f": 0.1 * i})
    before = led.read()
    led.close()
    reopened = SQLiteLedger(path, create=False)
    assert reopened.read() == before
    assert [e.payload for e in reopened.read()] == [{"i": i, "f": 0.1 * i} for i in range(5)]
    e, created = reopened.append(EventType.CANDIDATE_PROPOSED, "proposed/1/5", {"i": 5})
    assert created and e.seq == 6
    reopened.close()


def _append_three_and_die(path):
    """A process that appends three events to the ledger at ``path`` and exits without closing it (no checkpoint:
    the events are in ``path``-wal)."""
    code = ("import os; from ratchet.ledger import SQLiteLedger, EventType; "
            f"led = SQLiteLedger({str(path)!r}); "
            "[led.append(EventType.GENERATION_FINISHED, f'generation/{i}', {'i': i}) for i in range(3)]; "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_appends_are_durable_without_close(tmp_path):
    # a process that appends and dies without closing loses nothing it had recorded
    path = tmp_path / "ledger.sqlite"
    _append_three_and_die(path)
    led = SQLiteLedger(path, create=False)
    assert [e.payload["i"] for e in led.read()] == [0, 1, 2]
    led.close()


def test_reopening_a_ledger_with_a_damaged_write_ahead_log_leaves_its_files_as_they_were(tmp_path):
    # a run killed before its first checkpoint keeps every event in ledger.sqlite-wal; a damaged log must not be
    # dropped by a resume that cannot read it (SQLite deletes a log that fails its checksums when it closes)
    path = tmp_path / "ledger.sqlite"
    _append_three_and_die(path)
    wal = tmp_path / "ledger.sqlite-wal"
    data = bytearray(wal.read_bytes())
    data[40] ^= 0xFF  # the log header's checksum no longer matches
    wal.write_bytes(bytes(data))
    with pytest.raises(LedgerError, match="not a readable ratchet ledger") as info:
        SQLiteLedger(path, create=False)
    del info
    gc.collect()  # any connection the failed open left behind is closed by now
    assert wal.read_bytes() == bytes(data)


def test_create_false_on_missing_file(tmp_path):
    with pytest.raises(LedgerError, match="no ledger"):
        SQLiteLedger(tmp_path / "nope.sqlite", create=False)
    assert not (tmp_path / "nope.sqlite").exists()


def test_garbage_file_is_a_ledger_error(tmp_path):
    bad = tmp_path / "ledger.sqlite"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="not a readable ratchet ledger"):
        SQLiteLedger(bad, create=False)


_ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
#: Files that are not ratchet's ledger although they hold an events table or view; each would hang, grow or run code
#: on a read or a write if it were queried.
_NOT_RATCHETS = {
    "recursive-view": f"DROP TABLE events; CREATE VIEW events AS {_ENDLESS} SELECT n AS seq, 'k' || n AS key, "
                      "'run_started' AS type, 0.0 AS time, '{}' AS payload FROM r ORDER BY n DESC",
    "generated-column": "DROP TABLE events; CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT "
                        "NULL UNIQUE, type TEXT NOT NULL, time REAL NOT NULL, payload TEXT GENERATED ALWAYS AS "
                        "(hex(zeroblob(1000000000))))",
    "view-as-lease": f"CREATE VIEW lease AS {_ENDLESS} SELECT 't' AS token, 'h' AS host, 1 AS pid, 0.0 AS heartbeat_at, "
                     "0.0 AS expires_at, 0 AS released FROM r ORDER BY n DESC",
    "trigger": f"CREATE TRIGGER t AFTER INSERT ON events BEGIN SELECT count(*) FROM ({_ENDLESS} SELECT n FROM r); END",
    "own-index": "CREATE INDEX i ON events(length(payload))",
}


def _not_ratchets(tmp_path, case: str):
    """A ledger file made by ratchet, then changed by ``_NOT_RATCHETS[case]``."""
    path = tmp_path / "ledger.sqlite"
    SQLiteLedger(path).close()
    with sqlite3.connect(path) as con:
        con.executescript(_NOT_RATCHETS[case])
    con.close()
    return path


def _each_line(code: str, path) -> list[str]:
    """The lines ``code`` prints, run in a fresh process on the ledger at ``path`` (``sys.argv[1]``): an unbounded read
    would never return, and would not let the test process go either."""
    out = subprocess.run([sys.executable, "-c", "import sys\nfrom ratchet.errors import LedgerError\n"
                          "from ratchet.ledger import SQLiteLedger\n" + code, str(path)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("case", sorted(_NOT_RATCHETS))
def test_a_file_whose_schema_is_not_ratchets_is_refused_before_any_read(tmp_path, case):
    path = _not_ratchets(tmp_path, case)
    before = path.read_bytes()
    lines = _each_line("for kw in ({'readonly': True}, {'create': False}):\n"
                       "    try:\n"
                       "        SQLiteLedger(sys.argv[1], **kw).read()\n"
                       "        print('opened')\n"
                       "    except LedgerError as exc:\n"
                       "        print(exc)\n", path)
    assert len(lines) == 2 and all(re.search("is not a ratchet ledger: its (view|table|trigger|index) '", line)
                                   for line in lines), lines
    assert path.read_bytes() == before


def test_every_read_is_bounded_by_the_files_size(tmp_path):
    """The schema check passed by (as by a file it missed): a read of an endless view still stops, in one line, after a
    bound proportional to the file's size."""
    lines = _each_line("SQLiteLedger._check_schema = lambda self: None\n"
                       "led = SQLiteLedger(sys.argv[1], readonly=True)\n"
                       "for read in (led.read, led.tail, lambda: led.get('k7')):\n"
                       "    try:\n"
                       "        read()\n"
                       "    except LedgerError as exc:\n"
                       "        print(exc)\n", _not_ratchets(tmp_path, "recursive-view"))
    assert len(lines) == 3 and all("is damaged: a read ran past" in line for line in lines), lines


def test_a_genuine_ledger_reads_well_within_the_bound(tmp_path):
    from ratchet.ledger import sqlite as store

    path = tmp_path / "ledger.sqlite"
    led = SQLiteLedger(path)
    led.append_many([(EventType.EPISODES_EVALUATED, f"e/{i}", {"returns": [float(i)] * 50}) for i in range(2000)])
    led.close()
    steps = []
    ro = SQLiteLedger(path, readonly=True)
    ro._db.set_progress_handler(lambda: steps.append(1) and 0, 1000)
    ro._bounded = contextlib.nullcontext  # count the steps instead
    assert len(ro.read()) == 2000 and len(ro.read(types=[EventType.GATE_DECIDED])) == 0
    ro.close()
    assert 1000 * len(steps) < path.stat().st_size  # under one step per byte: the bound allows 100
    assert store._STEPS_PER_BYTE >= 100


def test_nan_payloads_roundtrip(tmp_path):
    led = SQLiteLedger(tmp_path / "l.sqlite")
    led.append(EventType.GATE_DECIDED, "gate/1/x", {"mean_diff": float("nan")})
    assert math.isnan(led.get("gate/1/x").payload["mean_diff"])
    assert json.loads(led.get("gate/1/x").payload_json().replace("NaN", "null")) == {"mean_diff": None}
    led.close()


def test_event_types_roundtrip(tmp_path):
    led = SQLiteLedger(tmp_path / "l.sqlite")
    for t in EventType:
        led.append(t, f"k/{t.value}", {})
    assert [e.type for e in led.read()] == list(EventType)
    led.close()


# -- projection ------------------------------------------------------------------------------------

def test_projection_of_finished_run(finished_run):
    result, run_dir, _ = finished_run
    events = read_events(run_dir)
    st = project(events)
    assert st.status == "finished"
    assert st.run_id == "cp-ref"
    assert st.stop_reason == result.stop_reason
    evals = [e.payload for e in events_of(events, EventType.EPISODES_EVALUATED)]
    train_val = [p for p in evals if p["split"] != "test"]
    assert st.env_steps == sum(p["summary"]["env_steps"] for p in train_val)
    assert st.env_steps == sum(ep["length"] for p in train_val for ep in p["episodes"])
    assert st.episodes == sum(len(p["episodes"]) for p in train_val)
    assert st.validation_env_steps == sum(p["summary"]["env_steps"] for p in train_val if p["split"] == "validation")
    test_steps = sum(p["summary"]["env_steps"] for p in evals if p["split"] == "test")
    assert test_steps > 0
    finished = events_of(events, EventType.RUN_FINISHED)[0].payload
    assert finished["env_steps"] == st.env_steps and finished["episodes"] == st.episodes
    assert st.incumbent_id == result.incumbent.id and st.baseline_id == result.baseline_test.candidate_id
    assert st.test == result.test.summary() and st.baseline_test == result.baseline_test.summary()
    assert st.generations == len(events_of(events, EventType.GENERATION_FINISHED)) >= 1
    assert len(st.promotions) == len(events_of(events, EventType.INCUMBENT_CHANGED))
    assert st.incumbent_validation_mean == st.promotions[-1]["validation_mean"]
    assert st.candidate(st.incumbent_id) == result.incumbent
    assert st.candidate(st.incumbent_id[:6]).id == result.incumbent.id  # unique prefix
    assert st.evaluation(st.incumbent_id, "test").summary() == result.test.summary()
    assert st.wall_clock_s > 0


def test_projection_status_running_interrupted_failed(tmp_path):
    led = SQLiteLedger(tmp_path / "l.sqlite")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        led.append(EventType.RUN_STARTED, "run_started",
                   {"run_id": "r", "spec": {"task": {"env_id": "CartPole-v1"}}, "policy_source": "", "pid": proc.pid})
        assert project(led.read()).status == "running"
    finally:
        proc.kill()
        proc.wait()
    assert project(led.read()).status == "interrupted"
    led.append(EventType.RUN_FAILED, "run_failed/1", {"error": "ValueError: boom"})
    st = project(led.read())
    assert st.status == "failed" and st.error == "ValueError: boom"
    led.append(EventType.RUN_RESUMED, "resumed/1", {"pid": proc.pid})
    st = project(led.read())
    assert st.status == "interrupted" and st.error is None
    led.close()


def test_projection_of_no_events():
    st = project([])
    assert st.status == "unknown" and st.env_steps == 0


def test_a_rejections_recorded_kind_is_what_it_is_counted_as_and_old_events_are_read_from_their_words():
    """``proposal_rejected`` events record their ``kind`` (duplicate, cascade, screened out, …): counting reads it, not
    the reason's wording; events written before the field existed are classified from ``detail`` and ``reason``."""
    from ratchet.ledger.events import RejectionKind
    from ratchet.ledger.projection import rejection_counts_text

    def rejected(i, **p):
        return Event(i, EventType.PROPOSAL_REJECTED, f"rejected/1/x/{i}", 0.0,
                     {"generation": 1, "refiner": "x", "parent_id": None, "reason": "", "detail": {}, **p})

    events = [rejected(1, reason="duplicate: worded by an old ratchet", kind="unusable"),  # the kind wins
              rejected(2, reason="cascade: worded anyhow", kind="cascade"),
              rejected(3, reason="duplicate: same source as c1", detail={"duplicate_of": "c1"}),  # old: no kind
              rejected(4, reason="screened out by the world model (ranked below the candidates run)"),
              rejected(5, reason="syntax error at line 3", kind="no such kind"),  # unknown: read from the words
              rejected(6, reason="x", detail={"stage": 1})]
    assert [RejectionKind.of(e.payload) for e in events] == [
        RejectionKind.UNUSABLE, RejectionKind.CASCADE, RejectionKind.DUPLICATE, RejectionKind.SCREENED_OUT,
        RejectionKind.UNUSABLE, RejectionKind.CASCADE]
    counts = project(events).rejection_counts()
    assert rejection_counts_text(counts) == ("2 no usable new source, 2 dropped by the cascade after its first stage, "
                                             "1 duplicate, 1 screened out by the world model")


def test_failed_episodes_group_by_their_error_whatever_seed_it_names():
    """``show``'s failed-episode reasons group errors that differ only in the seed they name, written as the critique
    writes them (``critic.seedless``: ``seed N``)."""
    def evaluated(i, seeds, errors):
        eps = [{"seed": s, "episode_return": 0.0, "length": 0, "error": e} for s, e in zip(seeds, errors)]
        return Event(i, EventType.EPISODES_EVALUATED, f"eval/{i}", 0.0, {
            "candidate_id": f"c{i}", "split": "train", "generation": 1, "seeds": seeds, "episodes": eps,
            "summary": {"mean": 0.0, "n": len(seeds), "env_steps": 0}})

    st = project([evaluated(1, [11, 12], ["skipped: timeout after 3 s on seed 11", "skipped: timeout after 3 s on seed 12"]),
                  evaluated(2, [13], ["worker error: seed=13 would not reset"])])
    reasons = st.episode_failures()["reasons"]
    assert reasons == [{"reason": "skipped: timeout after 3 s on seed N", "count": 2},
                       {"reason": "worker error: seed=N would not reset", "count": 1}]
