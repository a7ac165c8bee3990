"""Trusted rollouts' cost: the env in a trusted env host (default) vs policy and env in one process.

Same policies, same seeds, one worker, fresh executors, interleaved repeats alternating which mode
goes first; both modes sandboxed. Returns must be identical episode for episode.

Goals (issue 8): trusted / in-process evaluation time ≤ 1.15 on LunarLander-v3 (the example's
heuristic) and ≤ 1.5 on CartPole-v1 (a linear policy), 1 worker.

Usage: python benchmarks/trusted_rollouts.py [--episodes N] [--repeats R] [--workers W] [--write]
"""

from __future__ import annotations

import argparse
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
GOOD_CARTPOLE = {"w_position": 0.1, "w_velocity": 0.5, "w_angle": 1.0, "w_angular_velocity": 1.0}
CASES = {  # env id -> (policy file, params, goal)
    "LunarLander-v3": (ROOT / "examples/lunar_lander/policy.py", None, 1.15),
    "CartPole-v1": (ROOT / "examples/cartpole/policy.py", GOOD_CARTPOLE, 1.5),
}


def timed(trusted: bool, env_id: str, cand, seeds: list[int], workers: int) -> tuple[float, int, list[float]]:
    """(evaluation seconds, env steps, returns) on a fresh, warmed-up executor."""
    task = GymTask(env_id)
    ex = ProcessExecutor(workers=workers, episode_timeout_s=600, sandbox=Sandbox(trusted_rollouts=trusted))
    try:
        ex.run(task, [Job(cand, s) for s in range(10_000, 10_000 + workers)])  # start the workers
        t = time.perf_counter()
        eps = ex.run(task, [Job(cand, s) for s in seeds])
        dt = time.perf_counter() - t
    finally:
        ex.close()
    return dt, sum(e.length for e in eps), [e.episode_return for e in eps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = ap.parse_args()
    seeds = list(range(args.episodes))
    rows, summaries = [], []
    for env_id, (path, params, goal) in CASES.items():
        program = load_policy(path)
        cand = program.candidate(params)
        times: dict[bool, list[float]] = {True: [], False: []}
        steps, returns = 0, {}
        for r in range(args.repeats):
            for trusted in ((True, False) if r % 2 == 0 else (False, True)):
                dt, steps, rets = timed(trusted, env_id, cand, seeds, args.workers)
                times[trusted].append(dt)
                returns[trusted] = rets
                print(f"{env_id} repeat {r}: {'trusted' if trusted else 'in-process'} {dt:.3f} s", flush=True)
        assert returns[True] == returns[False], f"{env_id}: trusted and in-process returns differ"
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med[True] / med[False]
        ratios = sorted(a / b for a, b in zip(times[True], times[False]))
        per_step = {k: 1e6 * v / steps for k, v in med.items()}
        rows.append(f"| {env_id} | {steps:,} | {med[False]:.3f} ({per_step[False]:.1f} µs/step) | "
                    f"{med[True]:.3f} ({per_step[True]:.1f} µs/step) | **{ratio:.3f}** | ≤ {goal} "
                    f"{'met' if ratio <= goal else 'NOT met'} | {', '.join(f'{x:.2f}' for x in ratios)} |")
        summaries.append(f"{env_id}: +{per_step[True] - per_step[False]:.1f} µs per env step")
    table = ("| env | env steps | in-process (s, median) | trusted (s, median) | ratio | goal | per-repeat ratios |\n"
             "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    summary = ("Cost of the process boundary: " + "; ".join(summaries) + f". Returns identical on all {args.episodes} "
               "seeds in both modes.")
    print(table + "\n" + summary)
    if args.write:
        write_section("Trusted rollouts cost", (
            f"Command: `python benchmarks/trusted_rollouts.py --episodes {args.episodes} --repeats {args.repeats} "
            f"--workers {args.workers} --write` — {args.workers} worker(s), {args.repeats} interleaved repeats, "
            f"fresh executors each time, both modes sandboxed (`{isolation()}`). *Trusted*: the env host steps "
            "the envs and sends the observations of up to `lockstep_episodes` (64) episodes per round to the "
            "sandboxed policy process over a pipe (raw bytes), which answers with their actions (tagged bytes, never "
            "unpickled); both processes are pinned to one CPU. "
            "*In-process*: `[execution] trusted_rollouts = false`, policy and env in one sandboxed process.\n\n"
            f"Machine: {machine()}\n\n{table}\n{summary}\n"))


if __name__ == "__main__":
    main()
