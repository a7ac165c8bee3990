"""The driver alone: episodes per second a run's driver records, critiques and appends when episodes cost nothing.

A real run of the cartpole example (CMA-ES, planner, critic, gate, SQLite ledger) against an executor that answers
every job at once with a synthetic CartPole-like episode (its return a smooth function of the candidate's
parameters and the seed, 4-number final observations, ``terminated``/``truncated`` as CartPole ends them), so the
wall clock is the driver's own. With thousands of short episodes a second from the workers, this is the rate the
driver must keep up with.

Usage: python benchmarks/driver_rate.py [--env-steps N] [--profile] [--write]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.loop import start_run
from ratchet.rollout import Episode
from ratchet.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


class InstantExecutor:
    """Answers every job at once with a synthetic episode (no env, no worker): the driver's cost alone."""

    caps_env_steps = True

    def __init__(self) -> None:
        self.episodes, self.first, self.last = 0, None, None

    def run(self, task, jobs, on_episode=None, render_paths=None, *, max_env_steps=None):
        if self.first is None:
            self.first = time.perf_counter()
        out, spent = [], 0
        for i, job in enumerate(jobs):
            p = job.candidate.params
            quality = sum(float(v) for v in p.values() if isinstance(v, (int, float)))
            length = max(8, min(500, int(250 + 200 * math.tanh(quality) + (job.seed * 7919) % 61 - 30)))
            if max_env_steps is not None and spent + 500 > max_env_steps:
                ep = Episode.failed(job.seed, "skipped: env-step budget used", task=task)
            else:
                truncated = length == 500
                ep = Episode(job.seed, float(length), length, not truncated, truncated,
                             task.is_success(float(length), not truncated, truncated), None,
                             {"cause": "truncated" if truncated else "terminated",
                              "final_observation": [0.01 * (job.seed % 7), 0.1, 0.2 * quality, -0.05],
                              "final_reward": 1.0})
            spent += ep.length
            out.append(ep)
            if on_episode is not None:
                on_episode(i, ep)
        self.episodes += len(jobs)
        self.last = time.perf_counter()
        return out

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        return {"backend": "instant (benchmark)", "workers": 1, "sandbox": "none"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-steps", type=int, default=2_000_000)
    ap.add_argument("--profile", action="store_true", help="print the driver's 25 costliest functions")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    spec = load_spec(ROOT / "examples" / "cartpole")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"env_steps": args.env_steps, "target": None})})
    ex = InstantExecutor()
    with tempfile.TemporaryDirectory() as runs:
        t0 = time.perf_counter()
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
        start_run(spec, runs, "driver-rate", executor=ex)
        wall = time.perf_counter() - t0
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    loop_s = ex.last - ex.first
    rate = ex.episodes / loop_s
    line = (f"{ex.episodes:,} episodes in {loop_s:.2f} s from the first evaluation to the last (the whole run, start-up "
            f"and report included: {wall:.2f} s): **{rate:,.0f} episodes/s** of the driver alone ({1e6 / rate:.0f} µs "
            "per episode: planning, CMA-ES, critique, gate, ledger appends)")
    print(line)
    if args.write:
        write_section("The driver alone (cartpole)", (
            f"Command: `python benchmarks/driver_rate.py --env-steps {args.env_steps} --write` — the cartpole example's "
            "run (its spec, budget raised, no target) against an executor that answers each job at once with a "
            "synthetic episode, so the wall clock is the driver's: planner, CMA-ES, critic, gate, SQLite ledger.\n\n"
            f"Machine: {machine()}\n\n{line}\n"))


if __name__ == "__main__":
    main()
