"""Executor overhead: ratchet's process executor vs a plain Gymnasium loop, same policy, same seeds.

Goals (issue: ratchet v1): single-worker time ratio ≤ 1.10; two workers ≥ 1.7× single-worker throughput.

Usage: python benchmarks/overhead.py [--episodes N] [--repeats R]
Writes the table to benchmarks/RESULTS.md (section "Executor overhead").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.policy import load_policy
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
CASES = [("CartPole-v1", ROOT / "examples/cartpole/policy.py",
          {"w_position": 0.05, "w_velocity": 0.2, "w_angle": 0.9, "w_angular_velocity": 0.6}),  # a balancing linear policy (500-step episodes)
         ("LunarLander-v3", ROOT / "examples/lunar_lander/policy.py", None)]  # Gymnasium's heuristic


_PLAIN = """
import json, sys, time
import gymnasium as gym
from ratchet.policy import compile_policy
env_id, source, params, seeds = json.loads(sys.stdin.read())
module = compile_policy(source)
env = gym.make(env_id)
steps, total = 0, 0.0
env.reset(seed=10_000)  # warm-up, like the executor's warm-up batch
t0 = time.perf_counter()
for seed in seeds:
    obs, _ = env.reset(seed=seed)
    while True:
        obs, reward, terminated, truncated, _ = env.step(module.act(obs, params))
        total += float(reward)
        steps += 1
        if terminated or truncated:
            break
print(json.dumps([time.perf_counter() - t0, steps]))
"""


def plain_loop(env_id: str, source: str, params: dict, seeds: list[int]) -> tuple[float, int]:
    """The baseline: a plain gymnasium.make + reset(seed) + step loop calling the policy directly.

    It runs in a fresh Python process, as ratchet's workers do, so both sides pay the same
    process-placement luck (a fresh interpreter's speed on this machine varies by about ±5 %).
    """
    out = subprocess.run([sys.executable, "-c", _PLAIN], input=json.dumps([env_id, source, params, seeds]),
                         capture_output=True, text=True, check=True)
    elapsed, steps = json.loads(out.stdout.strip().splitlines()[-1])
    return elapsed, steps


def ratchet_run(env_id: str, cand, seeds: list[int], workers: int) -> tuple[float, int]:
    """ratchet's executor with ``workers`` processes, timed after a warm-up batch (worker start-up excluded)."""
    ex = ProcessExecutor(workers=workers, episode_timeout_s=600)
    task = GymTask(env_id)
    try:
        ex.run(task, [Job(cand, s) for s in range(10_000, 10_000 + 2 * workers)])  # warm-up: start workers
        t0 = time.perf_counter()
        eps = ex.run(task, [Job(cand, s) for s in seeds])
        return time.perf_counter() - t0, sum(e.length for e in eps)
    finally:
        ex.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="Interleaved repeats; the median is reported.")
    args = ap.parse_args()
    rows = []
    for env_id, path, params in CASES:
        program = load_policy(path)
        params = params or program.defaults
        cand = program.candidate(params)
        seeds = list(range(args.episodes))
        t_plain, t_one, t_two = [], [], []
        for _ in range(args.repeats):  # interleave so machine noise hits all three alike
            t, steps = plain_loop(env_id, program.source, params, seeds)
            t_plain.append(t)
            t, steps1 = ratchet_run(env_id, cand, seeds, 1)
            t_one.append(t)
            t, steps2 = ratchet_run(env_id, cand, seeds, 2)
            t_two.append(t)
            assert steps == steps1 == steps2, "executors disagree on episode lengths"
        p, o, w = statistics.median(t_plain), statistics.median(t_one), statistics.median(t_two)
        rows.append((env_id, args.episodes, steps, p, o, w, o / p, o / w))
        print(f"{env_id}: plain {p:.3f}s, 1 worker {o:.3f}s, 2 workers {w:.3f}s", flush=True)
    header = ("| env | episodes | env steps | plain loop (s) | ratchet 1 worker (s) | ratchet 2 workers (s) | "
              "1-worker time ratio (goal ≤ 1.10) | 2-worker speed-up (goal ≥ 1.7×) |\n|---|---|---|---|---|---|---|---|\n")
    table = header + "".join(
        f"| {e} | {n} | {s:,} | {p:.3f} | {o:.3f} | {w:.3f} | {r:.3f} | {sp:.2f}× |\n" for e, n, s, p, o, w, r, sp in rows)
    print(table)
    body = (f"Command: `python benchmarks/overhead.py --episodes {args.episodes} --repeats {args.repeats}` "
            f"(median of {args.repeats} interleaved repeats; worker start-up excluded by a warm-up batch; the plain loop "
            f"runs in a fresh Python process like a worker).\n\n"
            f"Machine: {machine()}\n\n{table}")
    write_section("Executor overhead", body)


if __name__ == "__main__":
    main()
