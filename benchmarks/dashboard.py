"""How fast ``ratchet dashboard`` opens a long run and a large runs folder (issue 24's goals: a synthetic ledger of
10,000 generations opens its run page in ≤ 2 s; a runs folder of 500 runs lists in ≤ 2 s).

The ledgers are made from a real CartPole run (made first, a few seconds): its events are the templates, copied
generation by generation (same payload shapes and sizes: candidates, episodes, generation summaries, a gate every
25 generations, a promotion every 500). The page times are measured in headless Chromium (Debian's chromium and
chromium-driver, through Selenium): from navigation until the page shows the run's generation count (run page) or
all rows (runs table); the server's JSON answer alone is timed too, cold (a fresh server) and warm (a poll).

    python benchmarks/dashboard.py [--generations 10000] [--runs 500] [--write]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_section

ROOT = Path(__file__).resolve().parents[1]


def template_run(root: Path) -> Path:
    """A real, finished CartPole run (about 5 s) whose events serve as templates."""
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    spec = load_spec(ROOT / "examples/cartpole")
    start_run(spec, root, run_id="template")
    return root / "template" / "ledger.sqlite"


def synthetic_run(template: Path, out: Path, generations: int, structural: bool = False) -> int:
    """Write ``out`` (a run directory's ledger): the template's start, then ``generations`` generations copied from
    its first one; returns the number of events written. ``structural``: the run's spec names a ``mutate`` refiner
    (a refiner that may change code), so the page reads every candidate for the lineage of programs."""
    from ratchet.ledger import EventType, SQLiteLedger

    src = SQLiteLedger(template, readonly=True)
    events = src.read()
    src.close()
    first_gen = next(i for i, e in enumerate(events) if e.type is EventType.GENERATION_FINISHED)
    start = [e for e in events[:first_gen] if e.payload.get("generation", 0) == 0 or e.type is EventType.RUN_STARTED]
    gen_events = [e for e in events[:first_gen + 1] if e not in start]
    gate = next(e for e in events if e.type is EventType.GATE_DECIDED)
    promo = next(e for e in events if e.type is EventType.INCUMBENT_CHANGED)
    finished = next(e for e in events if e.type is EventType.RUN_FINISHED)
    out.parent.mkdir(parents=True, exist_ok=True)
    led = SQLiteLedger(out)
    if structural:
        first = start[0].payload
        start[0] = type(start[0])(start[0].seq, start[0].type, start[0].key, start[0].time,
                                  {**first, "spec": {**first["spec"], "refiners": [{"kind": "mutate", "name": "mutate"}]}})
    led.append_many([(e.type, e.key, e.payload) for e in start])
    n, batch, steps = len(start), [], 0
    for g in range(1, generations + 1):
        for e in gen_events:
            p = dict(e.payload)
            if "generation" in p:
                p["generation"] = g
            if e.type is EventType.GENERATION_FINISHED:
                steps += 600
                p.update(env_steps=steps, gated=g % 25 == 0, promoted=g % 500 == 0,
                         best_train_mean=100 + 400 * g / generations, incumbent_validation_mean=10 + 490 * (g // 500) * 500 / generations)
            batch.append((e.type, f"{e.key}#{g}", p))
        if g % 25 == 0:
            batch.append((EventType.GATE_DECIDED, f"gate/{g}", {**gate.payload, "generation": g, "promoted": g % 500 == 0}))
        if g % 500 == 0:
            batch.append((EventType.INCUMBENT_CHANGED, f"incumbent/{g}", {**promo.payload, "generation": g}))
        if len(batch) > 5000:
            led.append_many(batch)
            n, batch = n + len(batch), []
    batch.append((EventType.RUN_FINISHED, "run_finished", {**finished.payload, "generations": generations}))
    led.append_many(batch)
    n += len(batch)
    led.close()
    return n


def fetch(url: str) -> tuple[float, int]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.perf_counter() - t, len(body)


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


def page_time(b, url: str, ready: str, timeout: float = 60.0) -> float:
    """Seconds from navigation until the JavaScript expression ``ready`` is true."""
    b.get("about:blank")
    t = time.perf_counter()
    b.get(url)
    while time.perf_counter() - t < timeout:
        if b.execute_script(f"return !!({ready})"):
            return time.perf_counter() - t
        time.sleep(0.01)
    raise TimeoutError(f"page not ready after {timeout} s: {ready}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--runs-generations", type=int, default=50, help="generations of each run in the runs folder")
    ap.add_argument("--repeats", type=int, default=3, help="fresh servers per measurement (the table: medians)")
    ap.add_argument("--write", action="store_true", help="write the table to benchmarks/RESULTS.md")
    args = ap.parse_args()

    from ratchet.dashboard import DashboardServer

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        template = template_run(tmp_path / "template-runs")
        long_dir, many_dir = tmp_path / "long", tmp_path / "many"
        t = time.perf_counter()
        n_events = synthetic_run(template, long_dir / "long-run" / "ledger.sqlite", args.generations)
        synthetic_run(template, long_dir / "long-mutate" / "ledger.sqlite", args.generations, structural=True)
        size = (long_dir / "long-run" / "ledger.sqlite").stat().st_size
        print(f"long run: {args.generations:,} generations, {n_events:,} events, {size / 2**20:.0f} MiB "
              f"(made in {time.perf_counter() - t:.0f} s)")
        one = tmp_path / "one" / "ledger.sqlite"
        synthetic_run(template, one, args.runs_generations)
        for i in range(args.runs):
            d = many_dir / f"run-{i:04d}"
            d.mkdir(parents=True)
            shutil.copyfile(one, d / "ledger.sqlite")
        with sqlite3.connect(one) as con:
            per_run = con.execute("SELECT count(*) FROM events").fetchone()[0]
        print(f"runs folder: {args.runs} runs of {args.runs_generations} generations ({per_run:,} events each)")

        rows = []
        b = browser()
        try:
            for what, runs_dir, api, frag, ready in [
                    (f"run page, {args.generations:,} generations", long_dir, "api/runs/long-run", "#/run/long-run",
                     (f"document.getElementById('n-gens') && document.getElementById('n-gens').textContent === "
                     f"'{args.generations}'")),
                    ((f"run page, {args.generations:,} generations, a refiner that may change code (the page and its "
                      "lineage of programs: every candidate read)"), long_dir, "api/runs/long-mutate/lineage", "#/run/long-mutate",
                     (f"document.getElementById('n-gens') && document.getElementById('n-gens').textContent === "
                      f"'{args.generations}' && document.querySelector('#sec-lineage h2')")),
                    (f"runs table, {args.runs} runs", many_dir, "api/runs", "#/",
                     f"document.querySelectorAll('#runs-table tr[data-run]').length === {args.runs}")]:
                runs_ = []
                for _ in range(args.repeats):  # a fresh server each time: nothing cached
                    server = DashboardServer(runs_dir)
                    server.start()
                    try:
                        cold, nbytes = fetch(server.url + api)
                        warm, _ = fetch(server.url + api)
                    finally:
                        server.stop()
                    server = DashboardServer(runs_dir)
                    server.start()
                    try:
                        page_cold = page_time(b, server.url + frag, ready)
                        page_warm = page_time(b, server.url + frag, ready)
                    finally:
                        server.stop()
                    runs_.append((cold, warm, page_cold, page_warm))
                cold, warm, page_cold, page_warm = (statistics.median(x) for x in zip(*runs_))
                spread = (min(r[2] for r in runs_), max(r[2] for r in runs_))
                rows.append((what, cold, warm, nbytes, page_cold, page_warm, spread))
                print(f"{what}: JSON cold {cold:.2f} s, warm {warm:.2f} s ({nbytes / 2**20:.1f} MiB); "
                      f"page in Chromium cold {page_cold:.2f} s ({spread[0]:.2f}–{spread[1]:.2f}), warm {page_warm:.2f} s")
        finally:
            b.quit()

    table = [("| what | JSON, fresh server (s) | JSON, next poll (s) | JSON size | page in Chromium, fresh server (s; "
              "min–max) | page again (s) | goal | met |"), "|---|---|---|---|---|---|---|---|"]
    for what, cold, warm, nbytes, page_cold, page_warm, (lo, hi) in rows:
        table.append(f"| {what} | {cold:.2f} | {warm:.2f} | {nbytes / 2**20:.1f} MiB | {page_cold:.2f} ({lo:.2f}–{hi:.2f}) "
                     f"| {page_warm:.2f} | ≤ 2 s | {'yes' if page_cold <= 2 else 'no'} |")
    print("\n".join(table))
    if args.write:
        write_section("Dashboard: a long run and a large runs folder", "\n".join([
            (f"Command: `python benchmarks/dashboard.py --generations {args.generations} --runs {args.runs} "
             f"--repeats {args.repeats} --write` (medians of {args.repeats} fresh servers; synthetic ledgers copied from a real CartPole run's events: {n_events:,} events, {size / 2**20:.0f} MiB "
            f"for the long run; each of the {args.runs} runs has {args.runs_generations} generations, {per_run:,} "
            "events). \"Page\": headless Chromium from navigation until the page shows the run's generation count or "
            "every row; \"fresh server\": nothing cached."),
            "", f"Machine: {machine()}", "", *table]))


if __name__ == "__main__":
    main()
