"""What a candidate costs the executor beyond its env steps: trusted rollouts against the in-process worker.

A run's executor calls run many candidates with a few episodes each (a CMA-ES lunar_lander run: about 1,200
candidates, 3–5 training episodes each). With ``[execution] trusted_rollouts = true`` (the default) each candidate
gets a process of its own, forked by the sandboxed policy process (its zygote) and retired once its episodes end
(``ratchet.execution.worker.policy_main``), so no candidate can touch a later one's episodes; in-process workers
load the candidate's policy module into the worker itself.

Measured, one worker, CartPole-v1, episodes kept short (a policy that pushes one way: about 10 env steps):

* **N candidates** — N distinct candidates (different parameters), one episode each;
* **one candidate** — one candidate, N episodes (its seeds), so the same env steps.

Per candidate: (N candidates − one candidate) ÷ N, in wall clock and in the worker processes' CPU seconds (read from
/proc: every process below this one, the forked candidates' counted by the zygote that reaped them). Interleaved
repeats, median. Wall clock depends on what else runs on the machine (each candidate switch is a chain of process
wake-ups: env host → candidate → zygote → env host → zygote → new candidate); CPU seconds less so.

Usage: python benchmarks/candidate_cost.py [--candidates N] [--repeats R] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from _common import machine, own_cpu, process_tree, write_section

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox
from ratchet.policy import load_policy
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "tests/data/cartpole_linear.py"
MODES = {"trusted rollouts (default)": True, "in-process worker": False}


def workers_cpu() -> float:
    """CPU seconds of every process below this one, their reaped children's included."""
    me = os.getpid()
    return sum(own_cpu(p, reaped=True) or 0.0 for p in process_tree(me) if p != me)


def measure(ex: ProcessExecutor, task: GymTask, jobs: list[Job]) -> tuple[float, float, int]:
    """(wall s, worker CPU s, env steps) of one executor call."""
    cpu0, t0 = workers_cpu(), time.perf_counter()
    episodes = ex.run(task, jobs)
    wall = time.perf_counter() - t0
    return wall, workers_cpu() - cpu0, sum(e.length for e in episodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    policy = load_policy(POLICY)
    n = args.candidates
    many = [policy.candidate({"w_position": 1.0 + i / n, "w_velocity": 0.0, "w_angle": 0.0,
                              "w_angular_velocity": 0.0}) for i in range(n)]
    task = GymTask("CartPole-v1")
    rows = []
    for mode, trusted in MODES.items():
        ex = ProcessExecutor(workers=1, episode_timeout_s=600, sandbox=Sandbox(trusted_rollouts=trusted))
        try:
            ex.run(task, [Job(many[0], s) for s in range(10_000, 10_004)])  # the worker started
            per: dict[str, list[tuple[float, float, int]]] = {"N candidates": [], "one candidate": []}
            for r in range(args.repeats):
                order = list(per) if r % 2 == 0 else list(reversed(per))
                for label in order:
                    jobs = ([Job(c, 7) for c in many] if label == "N candidates"
                            else [Job(many[0], 100 + i) for i in range(n)])
                    per[label].append(measure(ex, task, jobs))
                    print(f"{mode}, {label}, repeat {r}: {per[label][-1][0]:.2f} s wall, "
                          f"{per[label][-1][1]:.2f} s worker CPU, {per[label][-1][2]} env steps", flush=True)
        finally:
            ex.close()
        wall = {k: statistics.median(x[0] for x in v) for k, v in per.items()}
        cpu = {k: statistics.median(x[1] for x in v) for k, v in per.items()}
        steps = {k: v[0][2] for k, v in per.items()}
        rows.append((mode, n, steps, wall, cpu))
    lines = [f"Machine: {machine()}; load average before the run {os.getloadavg()[0]:.1f}.", "",
             f"Command: `python benchmarks/candidate_cost.py --candidates {n} --repeats {args.repeats}`", "",
             ("| executor | N | env steps: N candidates / one candidate | wall ms per candidate | "
              "worker CPU ms per candidate | wall s: N candidates / one candidate |"),
             "|---|---|---|---|---|---|"]
    for mode, n, steps, wall, cpu in rows:
        lines.append(f"| {mode} | {n} | {steps['N candidates']:,} / {steps['one candidate']:,} | "
                     f"{1e3 * (wall['N candidates'] - wall['one candidate']) / n:.2f} | "
                     f"{1e3 * (cpu['N candidates'] - cpu['one candidate']) / n:.2f} | "
                     f"{wall['N candidates']:.2f} / {wall['one candidate']:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.write:
        write_section("What a candidate costs the executor", table)


if __name__ == "__main__":
    main()
