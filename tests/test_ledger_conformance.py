"""One conformance suite for every ledger store (the LedgerStore contract).

Stores: ``SQLiteLedger`` (one file per run), ``SQLAlchemyLedger`` on a SQLite file shared by runs, and
``SQLAlchemyLedger`` on PostgreSQL (skipped unless RATCHET_TEST_POSTGRES_URL is set; scripts/test-postgres.sh
sets it). Includes several processes appending at once while another reads.
"""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import unique_run_id

from ratchet.errors import LedgerError, RatchetError
from ratchet.ledger import Event, EventType, SQLiteLedger
from ratchet.ledger.sql import TABLE, SQLAlchemyLedger


@dataclass
class Store:
    """One kind of store under test: opens a run's ledger, and can damage a stored row."""

    kind: str
    root: Path
    url: str | None  # None: SQLiteLedger files under root

    def run_id(self, name: str) -> str:
        return unique_run_id(name) if self.kind == "postgresql" else name

    def open(self, run_id: str, **kw):
        if self.url is None:
            return SQLiteLedger(self.root / run_id / "ledger.sqlite", **kw)
        return SQLAlchemyLedger(self.url, run_id, **kw)

    def with_events(self, name: str, n: int):
        """A new run holding ``n`` candidate_proposed events (payload ``{"i": i}``); returns (run id, open ledger)."""
        run_id = self.run_id(name)
        led = self.open(run_id)
        for i in range(n):
            led.append(EventType.CANDIDATE_PROPOSED, f"proposed/1/{i}", {"i": i})
        return run_id, led

    def damage(self, run_id: str, seq: int, payload: str = "{not json") -> None:
        """Overwrite one event's payload with ``payload`` (by default text that is not JSON, as disk damage or a bad
        hand edit would)."""
        if self.url is None:
            con = sqlite3.connect(self.root / run_id / "ledger.sqlite")
            with con:
                con.execute("UPDATE events SET payload = ? WHERE seq = ?", (payload, seq))
            con.close()
            return
        from sqlalchemy import create_engine, text

        from ratchet.ledger.sql import database_url

        engine = create_engine(database_url(self.url))
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {TABLE} SET payload = :p WHERE run_id = :r AND seq = :s"),
                         {"p": payload, "r": run_id, "s": seq})
        engine.dispose()


@pytest.fixture(params=["sqlite-file", "sqlalchemy-sqlite", "postgresql"])
def store(request, tmp_path) -> Store:
    if request.param == "sqlite-file":
        return Store("sqlite-file", tmp_path, None)
    if request.param == "sqlalchemy-sqlite":
        return Store("sqlalchemy-sqlite", tmp_path, f"sqlite:///{tmp_path / 'db' / 'ledgers.db'}")
    return Store("postgresql", tmp_path, request.getfixturevalue("postgres_url"))


PAYLOAD = {"run_id": "r", "x": [1, 2.5, None], "nested": {"a": {"b": [True, False]}}, "text": "αβγ \"quoted\" \n",
           "big": 2**53 + 1, "tiny": 5e-324}


def test_append_read_get(store):
    run = store.run_id("basic")
    led = store.open(run)
    e1, created1 = led.append(EventType.RUN_STARTED, "run_started", PAYLOAD)
    e2, created2 = led.append(EventType.GENERATION_FINISHED, "generation/1", {"generation": 1})
    assert created1 and created2
    assert (e1.seq, e2.seq) == (1, 2) and e1.time <= e2.time
    assert isinstance(e1, Event) and e1.type is EventType.RUN_STARTED
    assert [e.key for e in led.read()] == ["run_started", "generation/1"]
    assert led.read() == [e1, e2]
    got = led.get("run_started")
    assert got == e1 and got.payload == PAYLOAD
    assert led.get("missing") is None
    assert isinstance(led.location, str) and led.location
    led.close()


def test_append_is_idempotent_by_key(store):
    run = store.run_id("idem")
    led = store.open(run)
    first, created = led.append(EventType.INCUMBENT_CHANGED, "incumbent/3/abc", {"to": "abc", "v": 1})
    again, created_again = led.append(EventType.INCUMBENT_CHANGED, "incumbent/3/abc", {"to": "xyz", "v": 2})
    assert created is True and created_again is False
    assert again == first and again.payload == {"to": "abc", "v": 1}  # the stored event wins
    later, _ = led.append(EventType.GENERATION_FINISHED, "generation/1", {})
    assert later.seq == 2  # a refused duplicate leaves no gap
    assert [e.key for e in led.read()] == ["incumbent/3/abc", "generation/1"]
    led.close()


def test_order_and_read_from_seq(store):
    _, led = store.with_events("order", 10)
    events = led.read()
    assert [e.seq for e in events] == list(range(1, 11))
    assert [e.payload["i"] for e in events] == list(range(10))
    assert [e.seq for e in led.read(from_seq=7)] == [8, 9, 10]
    assert led.read(from_seq=10) == [] and led.read(from_seq=99) == []
    led.close()


def test_read_by_type_and_tail(store):
    run = store.run_id("types")
    led = store.open(run)
    assert led.tail() is None and led.tail([EventType.RUN_FINISHED]) is None
    for i in range(6):
        kind = EventType.GENERATION_FINISHED if i % 2 else EventType.CANDIDATE_PROPOSED
        led.append(kind, f"e/{i}", {"i": i})
    gens = led.read(types=[EventType.GENERATION_FINISHED])
    assert [e.payload["i"] for e in gens] == [1, 3, 5] and [e.seq for e in gens] == [2, 4, 6]
    assert [e.seq for e in led.read(from_seq=3, types={EventType.CANDIDATE_PROPOSED})] == [5]
    assert led.read(types=[]) == [] and len(led.read(types=None)) == 6
    assert led.tail().seq == 6 and led.tail([EventType.CANDIDATE_PROPOSED]).payload == {"i": 4}
    assert led.tail([EventType.RUN_FAILED]) is None
    led.close()


def test_persistence_across_reopen(store):
    run, led = store.with_events("reopen", 5)
    before = led.read()
    led.close()
    reopened = store.open(run, create=False)
    assert reopened.read() == before
    e, created = reopened.append(EventType.CANDIDATE_PROPOSED, "proposed/1/5", {"i": 5})
    assert created and e.seq == 6
    reopened.close()


def test_readonly_refuses_writes(store):
    run = store.run_id("ro")
    led = store.open(run)
    led.append(EventType.RUN_STARTED, "run_started", {"run_id": run})
    ro = store.open(run, readonly=True)
    with pytest.raises(LedgerError):
        ro.append(EventType.GENERATION_FINISHED, "generation/1", {})
    assert [e.key for e in ro.read()] == ["run_started"]
    assert ro.get("run_started") is not None
    ro.close()
    assert [e.key for e in led.read()] == ["run_started"]
    led.close()


def test_opening_a_missing_run_without_create_raises(store):
    run = store.run_id("ghost")
    store.open(store.run_id("other")).close()  # the database (or folder) exists, this run does not
    with pytest.raises(RatchetError):
        store.open(run, create=False)
    with pytest.raises(RatchetError):
        store.open(run, readonly=True)


def test_runs_are_isolated(store):
    a, b = store.run_id("iso-a"), store.run_id("iso-b")
    la, lb = store.open(a), store.open(b)
    la.append(EventType.RUN_STARTED, "run_started", {"run": "a"})
    lb.append(EventType.RUN_STARTED, "run_started", {"run": "b"})  # the same key in another run is another event
    la.append(EventType.GENERATION_FINISHED, "generation/1", {"run": "a"})
    assert [(e.seq, e.payload["run"]) for e in la.read()] == [(1, "a"), (2, "a")]
    assert [(e.seq, e.payload["run"]) for e in lb.read()] == [(1, "b")]
    assert lb.get("generation/1") is None
    la.close()
    lb.close()


def test_nan_and_every_event_type_roundtrip(store):
    run = store.run_id("types")
    led = store.open(run)
    for t in EventType:
        led.append(t, f"k/{t.value}", {"mean_diff": float("nan"), "inf": float("inf")})
    events = led.read()
    assert [e.type for e in events] == list(EventType)
    assert math.isnan(events[0].payload["mean_diff"]) and events[0].payload["inf"] == math.inf
    led.close()


def test_damaged_row_is_a_ledger_error(store):
    run, led = store.with_events("damaged", 3)
    led.close()
    store.damage(run, 2)
    ro = store.open(run, readonly=True)
    with pytest.raises(LedgerError, match="damaged"):
        ro.read()
    assert ro.get("proposed/1/0").payload == {"i": 0}
    ro.close()


def test_a_payload_nested_too_deep_is_one_line_naming_the_event(store):
    """A payload nested 100,000 deep (a hostile or damaged ledger) is refused before it is parsed: one LedgerError
    naming the event, from read and get alike, never a RecursionError; one nested as deep as ratchet allows,
    with brackets and escapes in its strings, reads back."""
    MAX_PAYLOAD_DEPTH = 100  # ratchet.ledger.events.MAX_PAYLOAD_DEPTH, the documented bound

    run, led = store.with_events("deep", 3)
    led.close()
    store.damage(run, 2, '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    deepest, levels = {"s": '[[{{ \\" ]]'}, 1
    while levels < MAX_PAYLOAD_DEPTH:  # objects and lists in turn, with brackets and escaped quotes in strings
        deepest, levels = ([deepest, '\\"{['] if levels % 2 else {"k[": deepest, "]": "}"}), levels + 1
    store.damage(run, 3, json.dumps(deepest))
    ro = store.open(run, readonly=True)
    try:
        for read in (ro.read, lambda: ro.get("proposed/1/1")):
            with pytest.raises(LedgerError, match=f"damaged at event 2: its payload nests deeper than "
                                                  f"{MAX_PAYLOAD_DEPTH} levels"):
                read()
        assert ro.get("proposed/1/2").payload == deepest
    finally:
        ro.close()


# -- several processes at once ---------------------------------------------------------------------

_WRITER = r"""
import json, os, sys, time
from pathlib import Path
from ratchet.ledger import EventType, SQLiteLedger
from ratchet.ledger.sql import SQLAlchemyLedger

a = json.loads(sys.argv[1])
def open_(run):
    if a["url"] is None:
        return SQLiteLedger(Path(a["root"]) / run / "ledger.sqlite")
    return SQLAlchemyLedger(a["url"], run)
own, shared = open_(a["own"]), open_(a["shared"])
go = Path(a["go"])
while not go.exists():
    time.sleep(0.002)
for i in range(a["n"]):
    body = {"writer": a["w"], "i": i, "returns": [float(i)] * 20}
    own.append(EventType.EPISODES_EVALUATED, f"w{a['w']}/{i}", body)
    shared.append(EventType.EPISODES_EVALUATED, f"w{a['w']}/{i}", body)
    if i == a["n"] // 2:  # a retried append (as on resume) changes nothing, even under contention
        shared.append(EventType.EPISODES_EVALUATED, f"w{a['w']}/0", {"dup": True})
os._exit(0)  # no close: every append is durable when it returns
"""


def test_concurrent_writers_and_a_reader(store, tmp_path):
    """4 processes append to their own runs and to one shared run at once while this process polls the
    shared run: every read is a gap-free prefix, a tail reader (``read(from_seq=last)``) misses nothing,
    and in the end no event is lost, duplicated or out of its writer's order."""
    writers, n = 4, 40
    shared = store.run_id("shared")
    own = [store.run_id(f"own{w}") for w in range(writers)]
    first = store.open(shared)
    first.append(EventType.RUN_STARTED, "run_started", {})
    reader = store.open(shared, readonly=True)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, json.dumps(
        {"url": store.url, "root": str(store.root), "own": own[w], "shared": shared, "w": w, "n": n, "go": str(go)})])
        for w in range(writers)]
    try:
        time.sleep(0.5)  # let the writers start and open their ledgers
        go.touch()
        tail: list[Event] = reader.read()
        polls = 0
        while True:
            done = all(p.poll() is not None for p in procs)
            snapshot = reader.read()
            assert [e.seq for e in snapshot] == list(range(1, len(snapshot) + 1))  # a prefix, no holes
            assert len(snapshot) >= len(tail)
            new = reader.read(from_seq=tail[-1].seq)
            assert [e.seq for e in new] == list(range(tail[-1].seq + 1, tail[-1].seq + 1 + len(new)))
            tail += new
            polls += 1
            if done:
                break
            time.sleep(0.01)
        assert all(p.wait(timeout=120) == 0 for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    events = reader.read()
    assert tail == events  # the tail reader saw every event exactly once
    assert polls >= 2
    assert [e.seq for e in events] == list(range(1, 1 + 1 + writers * n))
    keys = [e.key for e in events]
    assert len(set(keys)) == len(keys)
    for w in range(writers):
        mine = [e.payload["i"] for e in events if e.key.startswith(f"w{w}/")]
        assert mine == list(range(n)), w  # each writer's events in its own order
        led = store.open(own[w], readonly=True)
        assert [(e.seq, e.payload["i"]) for e in led.read()] == [(i + 1, i) for i in range(n)]
        led.close()
    assert not any(e.payload.get("dup") for e in events)
    reader.close()
    first.close()


@pytest.mark.parametrize("url, message", [
    ("sqlite://", "in-memory"), ("sqlite:///", "in-memory"), ("sqlite:///:memory:", "in-memory"),
    ("postgresql://u@h/db?password=TOPSECRET", "PGPASSWORD"), ("postgresql://u@h/db?sslpassword=TOPSECRET", "PGPASSWORD"),
    ("postgresql://u:TOP@SECRET@h/db", "%40"), ("sqlite:////tmp/db%00x", "NUL character"),
    ("postgresql://u:TOPSECRET@h/db\0", "NUL character")])
def test_storage_urls_that_would_lose_the_ledger_or_leak_a_password_are_refused(url, message):
    from ratchet.errors import LedgerError
    from ratchet.ledger.sql import database_url

    with pytest.raises(LedgerError, match=message) as info:
        database_url(url)
    assert "SECRET" not in str(info.value)


# -- the writer lease: one writer per run, across machines -----------------------------------------

def _holder(name: str, pid: int = 1):
    from ratchet.ledger.lease import LeaseHolder

    return LeaseHolder(f"token-{name}", f"host-{name}", pid)


def test_lease_acquire_refuse_expire_take_over_and_fence(store):
    """A live lease refuses others; once expired another holder takes it, and the first holder's appends
    (and heartbeats) fail from then on: it cannot interleave a single event."""
    from ratchet.errors import WriterLeaseError

    run = store.run_id("lease")
    a, b = store.open(run), store.open(run)
    ha, hb = _holder("a", 11), _holder("b", 22)
    assert a.read_lease() is None
    got = a.acquire_lease(ha, 30)
    assert got.holder == ha and not got.expired and 25 < got.expires_in_s <= 30 and got.heartbeat_age_s < 5
    a.append(EventType.RUN_STARTED, "run_started", {"by": "a"})
    refused = b.acquire_lease(hb, 30)
    assert refused.holder == ha and not refused.expired  # b learns who holds it
    assert a.acquire_lease(ha, 30).holder == ha  # re-acquiring one's own lease renews it
    assert a.renew_lease(ha, 0.3)  # the last heartbeat, with a short time-to-live
    time.sleep(0.4)
    stale = b.read_lease()
    assert stale.expired and stale.holder == ha and stale.heartbeat_age_s >= 0.3
    assert b.acquire_lease(hb, 30).holder == hb  # taken over
    assert not a.renew_lease(ha, 0.6)
    with pytest.raises(WriterLeaseError, match="lost the writer lease.*pid 22 on host host-b"):
        a.append(EventType.GENERATION_FINISHED, "generation/1", {"by": "a"})
    b.append(EventType.GENERATION_FINISHED, "generation/1", {"by": "b"})
    with pytest.raises(WriterLeaseError):  # and it stays stopped
        a.append(EventType.GENERATION_FINISHED, "generation/2", {"by": "a"})
    assert [(e.key, e.payload["by"]) for e in b.read()] == [("run_started", "a"), ("generation/1", "b")]
    a.close()
    b.close()


def test_lease_fence_without_a_heartbeat(store):
    """A writer whose lease was taken over is refused at its very next append, even before any heartbeat
    told it (the store checks the lease in the same statement as the insert)."""
    from ratchet.errors import WriterLeaseError

    run = store.run_id("fence")
    a, b = store.open(run), store.open(run)
    ha, hb = _holder("a"), _holder("b")
    a.acquire_lease(ha, 30)
    assert b.acquire_lease(hb, 30, take_over=ha.token).holder == hb  # (as for a dead pid on this host)
    with pytest.raises(WriterLeaseError):
        a.append(EventType.RUN_STARTED, "run_started", {})
    assert b.read() == []
    a.close()
    b.close()


def test_lease_release(store):
    """A released lease is free at once; it still names its last holder; releasing another's lease does nothing."""
    run = store.run_id("release")
    a, b = store.open(run), store.open(run)
    ha, hb = _holder("a"), _holder("b")
    a.acquire_lease(ha, 30)
    b.release_lease(hb)  # not b's: no effect
    assert b.acquire_lease(hb, 30).holder == ha
    a.release_lease(ha)
    info = b.read_lease()
    assert info.released and info.expired and info.holder == ha and info.expires_in_s == 0
    assert b.acquire_lease(hb, 30).holder == hb
    assert not b.read_lease().released
    a.append(EventType.RUN_STARTED, "run_started", {})  # a store that holds no lease appends unfenced
    a.close()
    b.close()


def test_lease_is_per_run_and_readable_read_only(store):
    a, b = store.run_id("lease-a"), store.run_id("lease-b")
    la, lb = store.open(a), store.open(b)
    la.append(EventType.RUN_STARTED, "run_started", {})
    lb.append(EventType.RUN_STARTED, "run_started", {})
    assert la.acquire_lease(_holder("a"), 30).holder.token == "token-a"
    assert lb.acquire_lease(_holder("b"), 30).holder.token == "token-b"  # another run: its own lease
    ro = store.open(a, readonly=True)
    assert ro.read_lease().holder.token == "token-a"
    with pytest.raises(LedgerError):
        ro.acquire_lease(_holder("c"), 30)
    for led in (ro, la, lb):
        led.close()


_RACER = r"""
import json, sys, time
from pathlib import Path
from ratchet.ledger import SQLiteLedger
from ratchet.ledger.lease import LeaseHolder
from ratchet.ledger.sql import SQLAlchemyLedger

a = json.loads(sys.argv[1])
if a["url"] is None:
    led = SQLiteLedger(Path(a["root"]) / a["run"] / "ledger.sqlite")
else:
    led = SQLAlchemyLedger(a["url"], a["run"])
go = Path(a["go"])
(go.parent / f"ready-{a['i']}").touch()
while not go.exists():
    time.sleep(0.002)
me = LeaseHolder(f"racer-{a['i']}", "h", a["i"])
print(json.dumps(led.acquire_lease(me, 30).holder.token == me.token))
"""


@pytest.mark.parametrize("expired_first", [False, True])
def test_lease_race_has_one_winner(store, tmp_path, expired_first):
    """3 processes race for a run's lease (absent, or expired): exactly one gets it."""
    run = store.run_id("race")
    led = store.open(run)
    led.append(EventType.RUN_STARTED, "run_started", {})
    if expired_first:
        led.acquire_lease(_holder("dead"), 0.01)
        time.sleep(0.05)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, json.dumps(
        {"url": store.url, "root": str(store.root), "run": run, "go": str(go), "i": i})], stdout=subprocess.PIPE,
        text=True) for i in range(3)]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{i}").exists() for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    won = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(won) == 1
    winner = won.index(True)
    assert led.read_lease().holder.token == f"racer-{winner}"
    led.close()


def test_artifacts_are_content_addressed_and_survive_reopen(store):
    run_id, led = store.with_events("artifacts", 1)
    blob = bytes(range(256)) * 1000
    name = led.put_artifact(blob)
    assert name == __import__("hashlib").sha256(blob).hexdigest()
    assert led.put_artifact(blob) == name  # idempotent
    assert led.get_artifact(name) == blob
    led.close()
    again = store.open(run_id, readonly=True)
    try:
        assert again.get_artifact(name) == blob
        with pytest.raises(LedgerError, match="missing"):
            again.get_artifact("0" * 64)
    finally:
        again.close()


def test_artifacts_read_only_empty_and_damaged(store):
    """Every store: a read-only ledger stores nothing, empty bytes are an artifact like any other, and bytes
    that no longer match their digest are a LedgerError, never returned."""
    run_id, led = store.with_events("artifacts-edge", 1)
    empty, blob = led.put_artifact(b""), led.put_artifact(b"weights" * 100)
    assert led.get_artifact(empty) == b""
    led.close()
    ro = store.open(run_id, readonly=True)
    try:
        with pytest.raises(LedgerError, match="read-only|readonly"):
            ro.put_artifact(b"new bytes")
    finally:
        ro.close()
    if store.url is None:
        con = sqlite3.connect(store.root / run_id / "ledger.sqlite")
        with con:
            con.execute("UPDATE artifacts SET data = ? WHERE hash = ?", (b"tampered", blob))
        con.close()
    else:
        from sqlalchemy import create_engine, text

        from ratchet.ledger.sql import ARTIFACTS_TABLE, database_url

        engine = create_engine(database_url(store.url))
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {ARTIFACTS_TABLE} SET data = :d WHERE hash = :h"), {"d": b"tampered", "h": blob})
        engine.dispose()
    again = store.open(run_id, readonly=True)
    try:
        with pytest.raises(LedgerError, match="damaged"):
            again.get_artifact(blob)
        assert again.get_artifact(empty) == b""
    finally:
        again.close()
