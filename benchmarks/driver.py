"""Where a run's driver spends its time: executing episodes vs everything else (CMA-ES, critic,
gate, ledger appends), on a real example run. Input for docs/scaling.md's capacity model.

Usage: python benchmarks/driver.py [--example lunar_lander] [--env-steps N] [--workers W] [--write]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.execution import ExecutorCapabilities, executor_from_spec
from ratchet.ledger.sqlite import SQLiteLedger
from ratchet.loop import start_run
from ratchet.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class TimedExecutor:
    """Wraps an executor; sums wall-clock time spent inside ``run`` and counts jobs."""

    #: its run() passes no env-step cap on to the inner executor: work is priced at the time limit, as it always was
    capabilities = ExecutorCapabilities()

    def __init__(self, inner) -> None:
        self.inner, self.seconds, self.cpu, self.jobs, self.calls = inner, 0.0, 0.0, 0, 0

    def run(self, task, jobs, on_episode=None):
        t0, c0 = time.perf_counter(), _cpu()
        try:
            return self.inner.run(task, jobs, on_episode)
        finally:
            self.seconds += time.perf_counter() - t0
            self.cpu += _cpu() - c0
            self.jobs += len(jobs)
            self.calls += 1

    def close(self) -> None:
        self.inner.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="lunar_lander")
    ap.add_argument("--env-steps", type=int, default=300_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    spec = load_spec(ROOT / "examples" / args.example)
    spec = spec.model_copy(update={
        "budget": spec.budget.model_copy(update={"env_steps": args.env_steps}),
        "execution": spec.execution.model_copy(update={"workers": args.workers})})
    appends = {"n": 0, "s": 0.0}
    original = SQLiteLedger.append

    def timed_append(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            appends["n"] += 1
            appends["s"] += time.perf_counter() - t0

    SQLiteLedger.append = timed_append
    ex = TimedExecutor(executor_from_spec(spec.execution))
    try:
        with tempfile.TemporaryDirectory() as runs:
            cpu0, t0 = _cpu(), time.perf_counter()
            result = start_run(spec, runs, "driver", executor=ex)
            wall = time.perf_counter() - t0
            driver_cpu = _cpu() - cpu0
            recorded = SQLiteLedger(Path(runs) / "driver" / "ledger.sqlite", readonly=True).read()
            events = len(recorded)
            generations = sum(1 for e in recorded if e.type.value == "generation_finished")
    finally:
        SQLiteLedger.append = original
        ex.close()
    outside = wall - ex.seconds
    rows = [("run wall clock (s)", f"{wall:.1f}"),
            ("inside executor.run (s)", f"{ex.seconds:.1f} ({ex.seconds / wall:.1%})"),
            ("driver outside the executor (s)", f"{outside:.1f} ({outside / wall:.1%})"),
            ("ledger appends, during and between evaluations (s)", (f"{appends['s']:.2f} ({appends['n']} appends, "
                                            f"{1000 * appends['s'] / max(1, appends['n']):.2f} ms each)")),
            ("driver CPU, whole run (s)", (f"{driver_cpu:.2f}, of which {ex.cpu:.2f} inside executor.run "
                                           "(dispatching episodes, recording evaluations)")),
            ("episodes", f"{ex.jobs:,} in {ex.calls} executor calls"),
            ("events in the ledger", f"{events:,} ({events / ex.jobs:.2f} per episode)"),
            ("driver CPU per episode (ms)", (f"{1000 * driver_cpu / ex.jobs:.2f} (inside executor.run "
                                             f"{1000 * ex.cpu / ex.jobs:.2f})")),
            ("driver CPU per generation outside the executor (ms)",
             f"{1000 * (driver_cpu - ex.cpu) / max(1, generations):.1f} ({generations} generations)"),
            ("test mean", f"{result.baseline_test.mean:.1f} → {result.test.mean:.1f}")]
    table = "| quantity | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    print(table)
    if args.write:
        write_section(f"Driver time budget ({args.example})", (
            f"Command: `python benchmarks/driver.py --example {args.example} --env-steps {args.env_steps} "
            f"--workers {args.workers} --write` — one real run of the example with a shortened budget, default "
            "process backend (sandboxed), per-run SQLite ledger. \"Outside the executor\" is everything the driver "
            "does between evaluations: CMA-ES ask/tell, critic (bootstrap intervals), gate tests, planning and ledger "
            "appends.\n\n"
            f"Machine: {machine()}\n\n{table}"))


if __name__ == "__main__":
    main()
