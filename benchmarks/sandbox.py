"""Sandbox cost: the sandboxed process executor vs the same executor with ``sandbox = false``.

Same policy (Gymnasium's LunarLander-v3 heuristic, examples/lunar_lander/policy.py), same seeds,
interleaved repeats. Also times worker start-up (launcher + imports), which the sandbox lengthens.

Goal (issue 4): sandboxed / unsandboxed evaluation time ≤ 1.05.

Usage: python benchmarks/sandbox.py [--episodes N] [--repeats R] [--workers W] [--write]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox, isolation
from ratchet.policy import load_policy
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(sandbox: Sandbox, cand, seeds: list[int], workers: int) -> tuple[float, float, float, list[float]]:
    """(start-up seconds, evaluation seconds, driver CPU seconds, returns) for one fresh executor."""
    task = GymTask("LunarLander-v3")
    t0 = time.perf_counter()
    ex = ProcessExecutor(workers=workers, episode_timeout_s=600, sandbox=sandbox)
    try:
        ex.run(task, [Job(cand, s) for s in range(10_000, 10_000 + workers)])  # start the workers
        t1, c1 = time.perf_counter(), _cpu()
        eps = ex.run(task, [Job(cand, s) for s in seeds])
        t2, c2 = time.perf_counter(), _cpu()
    finally:
        ex.close()
    return t1 - t0, t2 - t1, c2 - c1, [e.episode_return for e in eps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    program = load_policy(ROOT / "examples/lunar_lander/policy.py")
    cand = program.candidate(program.defaults)
    seeds = list(range(args.episodes))
    on, off = Sandbox(), Sandbox(enabled=False)
    times: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    driver_cpu: dict[str, list[float]] = {"on": [], "off": []}
    returns = {}
    for r in range(args.repeats):  # interleaved, alternating which goes first
        for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
            start, ev, cpu, rets = timed(on if name == "on" else off, cand, seeds, args.workers)
            times[name].append((start, ev))
            driver_cpu[name].append(cpu / args.episodes)
            returns[name] = rets
            print(f"repeat {r}: sandbox {name}: start-up {start:.3f} s, evaluation {ev:.3f} s", flush=True)
    assert returns["on"] == returns["off"], "sandboxed and unsandboxed returns differ"
    med = {k: (statistics.median(s for s, _ in v), statistics.median(e for _, e in v)) for k, v in times.items()}
    ratio = med["on"][1] / med["off"][1]
    ratios = sorted(on_e / off_e for (_, on_e), (_, off_e) in zip(times["on"], times["off"]))
    cpu_ms = {k: 1000 * statistics.median(v) for k, v in driver_cpu.items()}
    table = ("| executor | worker start-up (s, median) | evaluation (s, median) | episodes/s | "
             "driver CPU per episode (ms) |\n|---|---|---|---|---|\n"
             f"| sandbox off | {med['off'][0]:.3f} | {med['off'][1]:.3f} | {args.episodes / med['off'][1]:.1f} | "
             f"{cpu_ms['off']:.2f} |\n"
             f"| sandbox on ({isolation()}) | {med['on'][0]:.3f} | {med['on'][1]:.3f} | "
             f"{args.episodes / med['on'][1]:.1f} | {cpu_ms['on']:.2f} |\n")
    verdict = "met" if ratio <= 1.05 else "NOT met"
    summary = (f"Time ratio sandboxed / unsandboxed (median evaluation times): **{ratio:.3f}** (goal ≤ 1.05: {verdict}); "
               f"per-repeat ratios {', '.join(f'{x:.3f}' for x in ratios)}. Returns identical on all {args.episodes} "
               "seeds.")
    print(table + "\n" + summary)
    if args.write:
        write_section("Sandbox cost", (
            f"Command: `python benchmarks/sandbox.py --episodes {args.episodes} --repeats {args.repeats} "
            f"--workers {args.workers} --write` — LunarLander-v3 heuristic, {args.workers} workers, "
            f"{args.repeats} interleaved repeats, fresh executors each time; start-up = launching the workers "
            "(launcher, imports, handshake) and one warm-up episode each.\n\n"
            f"Isolation on this machine: `{isolation()}` (bubblewrap: read-only filesystem but the worker's "
            "directory, new network/PID/IPC/UTS namespaces, capabilities dropped; rlimits on address space, CPU "
            "time, open files, file size; a pids cgroup as root; scrubbed environment).\n\n"
            f"Machine: {machine()}\n\n{table}\n{summary}\n"))


if __name__ == "__main__":
    main()
