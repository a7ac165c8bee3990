"""Ray vs the process pool: episodes/s on the same evaluations, and Ray's per-task overhead.

Same policy (Gymnasium's LunarLander-v3 heuristic, examples/lunar_lander/policy.py), same seeds, on
ProcessExecutor(workers=2) and on RayExecutor over a local Ray with 2 CPUs at several batch sizes
(episodes per Ray task, 0 = the default), and a training generation's shape (14 candidates x 5 seeds)
with the default batch size; interleaved repeats, medians reported; every configuration's returns are
checked bit for bit against the process pool's. Worker start-up is excluded by a warm-up. Time is wall
clock; CPU time is summed over every process involved, which the load of other work on the machine
does not change.

Per-task overhead, for a capacity model:
* empty Ray tasks (Ray alone), and
* ratchet's whole task path (Ray + batch set-up + the sandboxed worker round trip): 1-episode tasks of a
  ~10-step CartPole episode on Ray minus the same episodes on the process pool, per task and CPU.
With ``o`` that overhead (CPU-seconds per task) and ``t`` the CPU-seconds of one episode, Ray's overhead
at ``b`` episodes per task is ``o / (b t)``; it stays under 5 % when a task holds at least ``20 o``
seconds of work, i.e. ``b ≥ o / (0.05 t)``.

Usage: python benchmarks/ray_throughput.py [--episodes N] [--repeats R] [--batches 1,5,25,100,0] [--write]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import time
from pathlib import Path

# Ray runs its workers at nice 15; on a machine shared with other work that would measure contention, not
# overhead, so unless told otherwise they run at the process pool's priority here.
os.environ.setdefault("RAY_worker_niceness", "0")

import ray  # after the environment above
from _common import machine, write_section

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.ray_executor import MIN_TASK_S, TASKS_PER_CPU, RayExecutor
from ratchet.policy import load_policy
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
CPUS = 2


def _noop() -> None:
    return None


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and all its live descendants: the driver,
    the process pool's workers, and a local Ray's GCS, raylet, Ray workers and their sandboxed workers."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        p = frontier.pop()
        for child in [c for c, pp in parent.items() if pp == p and c not in mine]:
            mine.add(child)
            frontier.append(child)
    return sum(cpu.get(p, 0.0) for p in mine)


def timed(run, *args) -> tuple[float, float, list[float]]:
    """(wall seconds, CPU seconds of the whole process tree, episode returns) of ``run(*args)``."""
    c0, t0 = tree_cpu_s(), time.perf_counter()
    eps = run(*args)
    t1, c1 = time.perf_counter(), tree_cpu_s()
    return t1 - t0, c1 - c0, [e.episode_return for e in eps] if eps else []


def empty_tasks(n: int = 2000) -> tuple[float, float]:
    """(wall ms, CPU ms of the process tree) per empty Ray task, all CPUs busy."""
    noop = ray.remote(_noop)
    ray.get([noop.remote() for _ in range(100)])  # warm-up
    wall, cpu, _ = timed(lambda: ray.get([noop.remote() for _ in range(n)]) and None)
    return wall / n * 1000, cpu / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5, help="Interleaved repeats (rotating order); medians reported.")
    ap.add_argument("--batches", default="1,5,25,100,0", help="Episodes per Ray task to measure (0 = the default).")
    ap.add_argument("--tiny", type=int, default=400, help="1-episode CartPole tasks for the per-task overhead.")
    ap.add_argument("--write", action="store_true", help="write the tables into benchmarks/RESULTS.md")
    args = ap.parse_args()
    n, batches = args.episodes, [int(b) for b in args.batches.split(",")]
    program = load_policy(ROOT / "examples/lunar_lander/policy.py")
    lander = program.candidate()
    # a training generation's shape: 14 candidates (x_gain varied) x 5 seeds, 70 episodes in one call
    generation = [Job(program.candidate({**lander.params, "x_gain": 0.3 + 0.04 * k}), s)
                  for k in range(14) for s in range(1000, 1005)]
    cartpole = load_policy(ROOT / "examples/cartpole/policy.py").candidate()  # all weights 0: ~10-step episodes
    task, tiny_task = GymTask("LunarLander-v3"), GymTask("CartPole-v1")
    jobs = [Job(lander, s) for s in range(n)]
    tiny = [Job(cartpole, s) for s in range(args.tiny)]
    load_before = os.getloadavg()[0]

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING)
    t_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    rx = RayExecutor(episode_timeout_s=600)  # joins the runtime above; probes the node
    t_probe = time.perf_counter() - t0
    px = ProcessExecutor(workers=CPUS, episode_timeout_s=600)

    def on_ray(batch: int, t: GymTask, js: list[Job]):
        rx.batch_episodes = batch
        return rx.run(t, js)

    configs = {"pool": (px.run, task, jobs), **{f"ray {b}": (on_ray, b, task, jobs) for b in batches},
               "gen pool": (px.run, task, generation), "gen ray": (on_ray, 0, task, generation),
               "tiny pool": (px.run, tiny_task, tiny), "tiny ray": (on_ray, 1, tiny_task, tiny)}
    wall: dict[str, list[float]] = {k: [] for k in configs}
    cpu: dict[str, list[float]] = {k: [] for k in configs}
    try:
        warm = [Job(lander, s) for s in range(10_000, 10_008)]
        px.run(task, warm)
        on_ray(1, task, warm)  # every Ray worker starts its sandboxed worker process
        reference = {id(js): [e.episode_return for e in px.run(t, js)] for t, js in
                     ((task, jobs), (task, generation), (tiny_task, tiny))}
        names = list(configs)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                run, *rest = configs[name]
                w, c, rets = timed(run, *rest)
                assert rets == reference[id(rest[-1])], f"{name}: returns differ from the process pool's"
                wall[name].append(w)
                cpu[name].append(c)
            print(f"repeat {r + 1}: " + ", ".join(f"{k} {wall[k][-1]:.2f}s" for k in names), flush=True)
        rx.batch_episodes = 0
        default_size = rx.batch_size(task.to_dict(), n)  # what batch_episodes = 0 chose (it learns episode times)
        gen_size = rx.batch_size(task.to_dict(), len(generation))
        noop_wall_ms, noop_cpu_ms = empty_tasks()
    finally:
        px.close()
        rx.close()
        t0 = time.perf_counter()
        ray.shutdown()
        t_shutdown = time.perf_counter() - t0
    load_after = os.getloadavg()[0]

    med = {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in configs}
    pool_wall, pool_cpu = med["pool"]
    rows = [(f"| process pool, {CPUS} workers | — | {pool_wall:.2f} | {n / pool_wall:.1f} | "
             f"{pool_cpu / n * 1000:.1f} | — | — |")]
    for b in batches:
        size = b or default_size
        w, c = med[f"ray {b}"]
        rows.append(f"| Ray, local {CPUS} CPUs | {size}{' (default)' if b == 0 else ''} | {w:.2f} | {n / w:.1f} | "
                    f"{c / n * 1000:.1f} | {(w / pool_wall - 1) * 100:+.1f} % | {(c / pool_cpu - 1) * 100:+.1f} % |")
    (gw_pool, gc_pool), (gw_ray, gc_ray), ng = med["gen pool"], med["gen ray"], len(generation)
    rows.append(f"| process pool, {CPUS} workers: a generation (14 candidates × 5 seeds) | — | {gw_pool:.2f} | "
                f"{ng / gw_pool:.1f} | {gc_pool / ng * 1000:.1f} | — | — |")
    rows.append(f"| Ray, local {CPUS} CPUs: the same generation | {gen_size} (default) | {gw_ray:.2f} | "
                f"{ng / gw_ray:.1f} | {gc_ray / ng * 1000:.1f} | {(gw_ray / gw_pool - 1) * 100:+.1f} % | "
                f"{(gc_ray / gc_pool - 1) * 100:+.1f} % |")
    table = ("| executor | episodes per Ray task | time (s) | episodes/s | CPU-ms per episode (all processes) | "
             "time vs pool | CPU vs pool |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    (tw_pool, tc_pool), (tw_ray, tc_ray) = med["tiny pool"], med["tiny ray"]
    o_cpu = (tc_ray - tc_pool) / args.tiny * 1000  # CPU-ms per task
    o_wall = (tw_ray - tw_pool) * CPUS / args.tiny * 1000  # wall-ms per task and CPU
    ep_ms = pool_cpu / n * 1000
    o = max(o_cpu, o_wall)
    model = (f"- empty Ray task: {noop_wall_ms:.2f} ms wall with {CPUS} CPUs busy, {noop_cpu_ms:.2f} CPU-ms "
             f"(Ray alone)\n"
             f"- ratchet's Ray task path (Ray + batch set-up + sandboxed worker round trip), from {args.tiny} "
             f"1-episode CartPole tasks on Ray vs the same episodes on the pool: **{o_cpu:.1f} CPU-ms per task**, "
             f"{o_wall:.1f} ms of wall clock per task and CPU ({tw_ray:.2f} s vs {tw_pool:.2f} s)\n"
             f"- one LunarLander-v3 heuristic episode: {ep_ms:.1f} CPU-ms\n"
             f"- Ray's overhead at b episodes of t CPU-ms per task ≈ o / (b t): under 5 % needs "
             f"**≥ {20 * o / 1000:.2f} s "
             f"of work per task** (o = {o:.1f} ms, the larger of the two); for LunarLander b ≥ "
             f"{max(1, math.ceil(o / (0.05 * ep_ms)))} episodes. Larger batches cost balance instead: with b = n / "
             f"{CPUS}, one slow task holds the whole call\n"
             f"- `batch_episodes = 0` picks about {TASKS_PER_CPU} tasks per CPU with at least {MIN_TASK_S:g} s of work "
             f"per task (from the episode times it has seen on the task), never fewer tasks than CPUs: "
             f"{default_size} here\n"
             f"- Ray workers at nice {os.environ['RAY_worker_niceness']} (Ray's default is 15; the pool's workers run "
             f"at 0)\n"
             f"- local Ray start-up {t_init:.1f} s, node probe {t_probe:.1f} s, shutdown {t_shutdown:.1f} s; "
             f"load average {load_before:.1f} before, {load_after:.1f} after (other work on the machine)")
    print(table)
    print(model)
    if args.write:
        body = (f"Command: `python benchmarks/ray_throughput.py --episodes {n} --repeats {args.repeats} "
                f"--batches {args.batches} --write` (LunarLander-v3 heuristic, seeds 0–{n - 1}; median of "
                f"{args.repeats} interleaved repeats in rotating order; start-up excluded by a warm-up; time is wall "
                f"clock, which other work on a shared machine blurs; CPU time, summed over every process involved, "
                f"is the overhead measure; every configuration's returns equal the process pool's bit "
                f"for bit).\n\nMachine: {machine()}\n\n{table}\nCapacity model:\n\n{model}\n")
        write_section("Ray vs process pool throughput", body)


if __name__ == "__main__":
    main()
