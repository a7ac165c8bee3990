"""Ledger append throughput: events per second on each store, one writer and 4 concurrent writers.

Each event is an evaluation like the loop records (one candidate's 100 episodes: seed, return, length,
flags, final observation), about 20 KB of JSON. Every append is a durable transaction (SQLite:
WAL + synchronous=FULL; PostgreSQL: default fsync/synchronous_commit). Writers are separate
processes started together; throughput = all events / (last writer done - first writer started).

Stores: SQLiteLedger (one file per run, the default), SQLAlchemyLedger on one SQLite file shared by
the runs, SQLAlchemyLedger on PostgreSQL (``--postgres URL``, default $RATCHET_TEST_POSTGRES_URL; e.g.
``scripts/test-postgres.sh python benchmarks/ledger.py``). Cases: 1 writer; 4 writers each on its own
run (one file each for SQLiteLedger, one shared database otherwise); 4 writers on the same run.

Usage: python benchmarks/ledger.py [--events N] [--repeats R] [--postgres URL] [--write]
With --write, the table goes to benchmarks/RESULTS.md (section "Ledger append throughput").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

SECTION = "Ledger append throughput"


def evaluation_payload(generation: int, n_episodes: int = 100) -> dict:
    """An ``episodes_evaluated`` payload as the loop writes it: one candidate on ``n_episodes`` seeds."""
    from ratchet.critic import Evaluation
    from ratchet.rollout import Episode

    episodes = tuple(Episode(seed=1_000_003 * i % 2**32, episode_return=123.456789 + i, length=200 + i,
                             terminated=i % 3 == 0, truncated=i % 3 != 0, success=i % 2 == 0,
                             diagnostics={"final_observation": [0.0123456789 * i, -0.5, 0.25 * i, 1e-3]})
                     for i in range(n_episodes))
    ev = Evaluation("c0ffee123456", "train", episodes)
    return {"candidate_id": "c0ffee123456", "split": "train", "generation": generation,
            "seeds": [e.seed for e in episodes], "summary": ev.summary(), "episodes": [e.to_dict() for e in episodes]}


def _worker(spec: dict) -> None:
    """One writer process: open the ledger, wait for the start signal, append, print its times."""
    from ratchet.ledger import EventType, SQLiteLedger
    from ratchet.ledger.sql import SQLAlchemyLedger

    if spec["url"] is None:
        led = SQLiteLedger(Path(spec["root"]) / spec["run"] / "ledger.sqlite")
    else:
        led = SQLAlchemyLedger(spec["url"], spec["run"])
    payload = evaluation_payload(0)
    print("ready", flush=True)
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.001)
    t0 = time.time()
    for i in range(spec["n"]):
        payload["generation"] = i
        _, created = led.append(EventType.EPISODES_EVALUATED, f"eval/{spec['writer']}/{i}", payload)
        assert created
    t1 = time.time()
    led.close()
    print(json.dumps([t0, t1]))


def measure(url: str | None, root: Path, writers: int, same_run: bool, n: int) -> float:
    """Events per second of ``writers`` processes appending ``n`` events each."""
    tag = uuid.uuid4().hex[:8]
    go = root / f"go-{tag}"
    runs = [f"bench-{tag}" if same_run else f"bench-{tag}-{w}" for w in range(writers)]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(
        {"url": url, "root": str(root), "run": runs[w], "writer": w, "n": n, "go": str(go)})],
        stdout=subprocess.PIPE, text=True) for w in range(writers)]
    for p in procs:  # every writer has imported ratchet and opened its ledger
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"a writer failed to start (exit {p.wait()})")
    go.touch()
    times = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"a writer failed (exit {p.returncode})")
        times.append(json.loads(out.strip().splitlines()[-1]))
    start, end = min(t0 for t0, _ in times), max(t1 for _, t1 in times)
    return writers * n / (end - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200, help="Events each writer appends.")
    ap.add_argument("--repeats", type=int, default=3, help="Interleaved repeats; median and range are reported.")
    ap.add_argument("--postgres", default=os.environ.get("RATCHET_TEST_POSTGRES_URL"),
                    help="PostgreSQL URL (default $RATCHET_TEST_POSTGRES_URL); PostgreSQL is skipped without one.")
    ap.add_argument("--write", action="store_true", help="Write the table to benchmarks/RESULTS.md.")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(json.loads(args.worker))
        return
    from _common import machine, write_section

    size = len(json.dumps(evaluation_payload(0), separators=(",", ":")))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ratchet-ledger-bench-") as tmp:
        root = Path(tmp)
        stores = [("SQLiteLedger (file per run)", None),
                  ("SQLAlchemyLedger, SQLite (one file)", f"sqlite:///{root / 'shared.db'}")]
        if args.postgres:
            stores.append((f"SQLAlchemyLedger, PostgreSQL {_server_version(args.postgres)}", args.postgres))
        else:
            print("no PostgreSQL URL (--postgres or RATCHET_TEST_POSTGRES_URL): PostgreSQL skipped", file=sys.stderr)
        cases = [(1, False, "1 writer"), (4, False, "4 writers, own runs"), (4, True, "4 writers, one run")]
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):  # interleave so machine noise hits every store alike
            for name, url in stores:
                for writers, same, label in cases:
                    rate = measure(url, root, writers, same, args.events)
                    results.setdefault((name, label), []).append(rate)
                    print(f"{name:40s} {label:20s} {rate:8.0f} events/s", file=sys.stderr, flush=True)
    header = "| store | " + " | ".join(label for _, _, label in cases) + " |\n|---|" + "---|" * len(cases) + "\n"
    table = header + "".join(
        f"| {name} | " + " | ".join(_cell(results[(name, label)]) for _, _, label in cases) + " |\n" for name, _ in stores)
    print(f"events/s, median (min–max) of {args.repeats}; {args.events} events per writer; {size / 1024:.1f} KiB of "
          "JSON each")
    print(table)
    if args.write:
        body = (f"Command: `scripts/test-postgres.sh .venv/bin/python benchmarks/ledger.py --events {args.events} "
                f"--repeats {args.repeats} --write` (a throwaway PostgreSQL server on the same machine and disk, "
                f"default settings). Events per second, all writers together: median (min–max) of {args.repeats} "
                f"interleaved repeats; each writer is a process appending {args.events} evaluation events of "
                f"{size / 1024:.1f} KiB (100 episodes) in durable transactions. \"Own runs\": each writer its own run "
                f"(SQLiteLedger: its own file; SQLAlchemyLedger: one database, so the writers contend for it). "
                f"\"One run\": all four append to the same run. Load average {load_before:.1f} before, "
                f"{os.getloadavg()[0]:.1f} after (other work on the machine widens the ranges).\n\n"
                f"Machine: {machine()}\n\n{table}")
        write_section(SECTION, body)


def _cell(rates: list[float]) -> str:
    return f"{statistics.median(rates):,.0f} ({min(rates):,.0f}–{max(rates):,.0f})"


def _server_version(url: str) -> str:
    from sqlalchemy import create_engine, text

    from ratchet.ledger.sql import database_url

    engine = create_engine(database_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(text("SHOW server_version")).scalar_one().split()[0]
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
