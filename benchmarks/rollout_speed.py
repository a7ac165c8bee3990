"""Rollouts at the speed of the environment: ratchet's executors side by side with a plain loop, in one process.

Variants, same policy and seeds, fresh environment per episode, interleaved repeats (median), worker start-up
excluded by a warm-up batch:

* **plain loop** — ``gymnasium.make`` + ``reset(seed)`` + ``step`` calling the policy directly, in a fresh Python
  process pinned to one CPU (what a user writes; no sandbox, no ratchet);
* **in-process worker** — ``[execution] trusted_rollouts = false``: policy and env in one sandboxed process;
* **trusted, one at a time** — ``lockstep_episodes = 1``: the env host sends each observation to the sandboxed
  policy process and waits for its action (one round trip per env step);
* **trusted, lockstep** — the default (``lockstep_episodes = 64``): one round trip per round of up to 64 episodes.

Returns must be identical in every variant. Also measured: 2 workers against 1 (trusted, lockstep), and an ``mlp``
64-64 policy's actions per second on LunarLander observations, one ``act`` per observation vs ``act_batch`` on
rounds of 32.

Goals (issue 21): trusted ≤ 1.10× the in-process worker on LunarLander-v3 and CartPole-v1; env-step rate ≥ 80 % of
the plain loop's on CartPole, LunarLander, BipedalWalker, HalfCheetah (1 worker, trusted); mlp batched ≥ 3× per
observation; 2 workers ≥ 1.9× one.

Usage: python benchmarks/rollout_speed.py [--repeats R] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import machine, write_section

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox, isolation
from ratchet.policy import load_policy
from ratchet.rollout import LOCKSTEP_EPISODES
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
GOOD_CARTPOLE = {"w_position": 0.1, "w_velocity": 0.5, "w_angle": 1.0, "w_angular_velocity": 1.0}
_CHEETAH_W = np.random.default_rng(0).normal(0, 0.1, size=(6, 17)).round(4).tolist()
CASES = {  # env id -> (policy file, params, episodes)
    "CartPole-v1": (ROOT / "examples/cartpole/policy.py", GOOD_CARTPOLE, 200),
    "LunarLander-v3": (ROOT / "examples/lunar_lander/policy.py", None, 100),
    "BipedalWalker-v3": (ROOT / "examples/bipedal_walker/policy.py", None, 10),
    "HalfCheetah-v5": (ROOT / "examples/half_cheetah_linear/policy.py", {"W": _CHEETAH_W}, 10),
}
VARIANTS = {"in-process worker": {"trusted_rollouts": False, "lockstep": 1},
            "trusted, one at a time": {"trusted_rollouts": True, "lockstep": 1},
            "trusted, lockstep": {"trusted_rollouts": True, "lockstep": LOCKSTEP_EPISODES}}

_PLAIN = """
import json, os, sys, time
sys.path.insert(0, BENCHMARKS)
import gymnasium as gym
from _common import plain_episode
from ratchet.policy import compile_policy
env_id, source, params, seeds, cpu = json.loads(sys.stdin.read())
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[cpu]})
module = compile_policy(source)
gym.make(env_id).reset(seed=10_000)  # warm-up, like the executors' warm-up batch
t0 = time.perf_counter()
steps, returns = 0, []
for seed in seeds:
    total, n = plain_episode(module, gym.make(env_id), params, seed)  # a fresh env per episode, as ratchet makes one
    steps += n
    returns.append(total)
print(json.dumps([time.perf_counter() - t0, steps, returns]))
""".replace("BENCHMARKS", repr(str(Path(__file__).resolve().parent)))


def plain_loop(env_id: str, source: str, params: dict, seeds: list[int]) -> tuple[float, int, list[float]]:
    out = subprocess.run([sys.executable, "-c", _PLAIN], input=json.dumps([env_id, source, params, seeds, 0]),
                         capture_output=True, text=True, check=True)
    elapsed, steps, returns = json.loads(out.stdout.strip().splitlines()[-1])
    return elapsed, steps, returns


def plain_pair(env_id: str, source: str, params: dict, seeds: list[int]) -> float:
    """Wall clock of the plain loop split over two processes at once, one per CPU (its halves of ``seeds``): what
    this machine's two CPUs give a plain loop, the ceiling of a 2-worker speed-up here (the slower half's loop)."""
    halves = [seeds[: len(seeds) // 2], seeds[len(seeds) // 2:]]
    procs = [subprocess.Popen([sys.executable, "-c", _PLAIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for _ in halves]
    for cpu, (proc, half) in enumerate(zip(procs, halves)):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps([env_id, source, params, half, cpu]))
        proc.stdin.close()
    # each process times its own loop (after its imports and warm-up, which the two do side by side)
    outs = []
    for proc in procs:
        assert proc.stdout is not None
        outs.append(proc.stdout.read())
        proc.wait()
    return max(json.loads(out.strip().splitlines()[-1])[0] for out in outs)


def executor_run(env_id: str, cand, seeds: list[int], workers: int, trusted_rollouts: bool,
                 lockstep: int) -> tuple[float, int, list[float]]:
    task = GymTask(env_id)
    every = os.sched_getaffinity(0)
    if workers == 1:  # everything on the CPU the plain loop uses, whatever the variant (this VM's CPUs differ in noise)
        os.sched_setaffinity(0, {min(every)})
    ex = ProcessExecutor(workers=workers, episode_timeout_s=600, sandbox=Sandbox(trusted_rollouts=trusted_rollouts),
                         lockstep=lockstep)
    try:
        ex.run(task, [Job(cand, s) for s in range(10_000, 10_000 + 2 * workers)])  # start the workers
        t0 = time.perf_counter()
        eps = ex.run(task, [Job(cand, s) for s in seeds])
        return time.perf_counter() - t0, sum(e.length for e in eps), [e.episode_return for e in eps]
    finally:
        ex.close()
        os.sched_setaffinity(0, every)


def mlp_rates(rounds: int = 300, width: int = 32) -> tuple[float, float]:
    """Actions per second of a 64-64 ``mlp`` policy on LunarLander observations: ``act`` per observation and
    ``act_batch`` on rounds of ``width`` (the policy process's side of a lockstep round)."""
    from ratchet.policies import mlp

    task = GymTask("LunarLander-v3")
    policy = mlp.MLPPolicy(mlp.load_weights(mlp.init_weights(*task.spaces(), hidden=[64, 64], seed=0).to_bytes()))
    env = task.make_env()
    obs = [env.reset(seed=s)[0] for s in range(width)]
    batch = np.stack(obs)
    t0 = time.perf_counter()
    for _ in range(rounds):
        for o in obs:
            policy.act(o, {})
    per_obs = rounds * width / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(rounds):
        policy.act_batch(batch, {})
    batched = rounds * width / (time.perf_counter() - t0)
    assert policy.act_batch(batch, {}).tolist() == [policy.act(o, {}) for o in obs]
    return per_obs, batched


def vector_env(n: int = 32, rounds: int = 3000) -> tuple[float, float, bool]:
    """Gymnasium's own vectorised CartPole (``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``)
    against ``n`` separate ``CartPole-v1`` environments stepped in turn, env alone (the same angle-sign action):
    µs per env step of each, and whether its first observations equal ``CartPole-v1``'s on the same seeds."""
    import gymnasium as gym

    vec = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    obs, _ = vec.reset(seed=0)
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    single = [e.reset(seed=i)[0] for i, e in enumerate(envs)]
    same = bool(np.array_equal(np.stack(single), obs))
    t0 = time.perf_counter()
    for _ in range(rounds):
        obs, *_ = vec.step((obs[:, 2] > 0).astype(np.int64))
    vec_us = 1e6 * (time.perf_counter() - t0) / (rounds * n)
    t0 = time.perf_counter()
    for _ in range(rounds // 10):
        for i, env in enumerate(envs):
            o, _, terminated, truncated, _ = env.step(int(single[i][2] > 0))
            single[i] = env.reset(seed=i)[0] if terminated or truncated else o
    sep_us = 1e6 * (time.perf_counter() - t0) / (rounds // 10 * n)
    return vec_us, sep_us, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a tenth of the episodes (a smoke test of the script)")
    ap.add_argument("--envs", default=",".join(CASES), help="comma-separated env ids")
    ap.add_argument("--write", action="store_true", help="write the tables into benchmarks/RESULTS.md")
    args = ap.parse_args()
    rows, scaling = [], []
    for env_id in args.envs.split(","):
        path, params, n = CASES[env_id]
        n = max(2, n // 10) if args.quick else n
        program = load_policy(path, dims=GymTask(env_id).dims())
        params = params or program.defaults
        cand = program.candidate(params)
        seeds = list(range(n))
        times: dict[str, list[float]] = {"plain loop": [], **{v: [] for v in VARIANTS}}
        returns: dict[str, list[float]] = {}
        steps = 0
        for r in range(args.repeats):
            order = list(times) if r % 2 == 0 else list(reversed(times))
            for name in order:
                if name == "plain loop":
                    dt, steps, rets = plain_loop(env_id, program.source, dict(cand.params), seeds)
                else:
                    dt, steps, rets = executor_run(env_id, cand, seeds, 1, **VARIANTS[name])
                times[name].append(dt)
                returns[name] = rets
                print(f"{env_id} repeat {r}: {name} {dt:.3f} s ({1e6 * dt / steps:.1f} µs/env step)", flush=True)
        assert len({json.dumps(v) for v in returns.values()}) == 1, f"{env_id}: variants disagree on returns"
        med = {k: statistics.median(v) for k, v in times.items()}
        vs_inproc = med["trusted, lockstep"] / med["in-process worker"]
        of_plain = med["plain loop"] / med["trusted, lockstep"]
        goal_inproc = "≤ 1.10 " + ("met" if vs_inproc <= 1.10 else "NOT met") if env_id in ("CartPole-v1", "LunarLander-v3") else "—"
        rows.append(f"| {env_id} | {n} | {steps:,} | " + " | ".join(
            f"{1e6 * med[k] / steps:.1f} ({steps / med[k] / 1000:.1f} k/s)" for k in times)
            + f" | {vs_inproc:.3f} ({goal_inproc}) | {of_plain:.0%} (≥ 80 % {'met' if of_plain >= 0.8 else 'NOT met'}) |")
        if env_id in ("CartPole-v1", "LunarLander-v3"):
            two, one, p1, p2 = [], [], [], []
            both = seeds + [s + 100_000 for s in seeds]
            for _ in range(args.repeats):
                one.append(executor_run(env_id, cand, both, 1, True, LOCKSTEP_EPISODES)[0])
                two.append(executor_run(env_id, cand, both, 2, True, LOCKSTEP_EPISODES)[0])
                p1.append(plain_loop(env_id, program.source, dict(cand.params), both)[0])
                p2.append(plain_pair(env_id, program.source, dict(cand.params), both))
            speed = statistics.median(one) / statistics.median(two)
            ceiling = statistics.median(p1) / statistics.median(p2)
            scaling.append(f"| {env_id} | {2 * n} | {statistics.median(one):.3f} | {statistics.median(two):.3f} | "
                           f"{speed:.2f}× (≥ 1.9× {'met' if speed >= 1.9 else 'NOT met'}) | {ceiling:.2f}× |")
    per_obs, batched = mlp_rates()
    vec_us, sep_us, same = vector_env()
    vec_line = (f"Gymnasium's vectorised CartPole (`make_vec`, `vector_entry_point`, 32 envs), env alone: {vec_us:.2f} µs "
                f"per env step against {sep_us:.2f} µs for 32 separate `CartPole-v1` envs ({sep_us / vec_us:.1f}× faster); "
                f"its episodes on the same seeds are {'the same' if same else 'NOT the same'} as `CartPole-v1`'s "
                "(one generator draws every sub-env's start; autoreset reuses envs), so ratchet does not offer it as a "
                "lockstep option: its returns would not be those `ratchet replay` reproduces one episode at a time.")
    columns = ["env", "episodes", "env steps", *(f"{k} (µs/env step)" for k in times),
               "trusted lockstep / in-process", "rate vs plain loop"]
    table = ("| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|\n" + "\n".join(rows) + "\n")
    table2 = ("| env | episodes | 1 worker (s) | 2 workers (s) | speed-up | the plain loop's own speed-up on 2 processes |\n"
              "|---|---|---|---|---|---|\n"
              + "\n".join(scaling) + "\n")
    mlp_line = (f"`mlp` 64-64 on LunarLander-v3 observations: {per_obs:,.0f} actions/s with `act` per observation, "
                f"{batched:,.0f} actions/s with `act_batch` on rounds of 32: **{batched / per_obs:.1f}×** "
                f"(≥ 3× {'met' if batched / per_obs >= 3 else 'NOT met'}); row for row the same actions.")
    print(table + "\n" + table2 + "\n" + mlp_line + "\n\n" + vec_line)
    if args.write:
        write_section("Rollout speed: lockstep batches", (
            f"Command: `python benchmarks/rollout_speed.py --repeats {args.repeats} --write` — 1 worker unless said, "
            f"median of {args.repeats} interleaved repeats, fresh executors each time, sandboxed (`{isolation()}`); "
            "with 1 worker every variant runs on the same CPU (the plain loop in a fresh process pinned to it; ratchet's "
            "driver, worker and env host confined to it). Returns identical in every variant, episode for episode.\n\n"
            f"Machine: {machine()}\n\n{table}\n{table2}\n{mlp_line}\n\n{vec_line}\n"))


if __name__ == "__main__":
    main()
