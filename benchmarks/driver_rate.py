"""The driver alone: episodes per second a run's driver records, critiques and appends when episodes cost nothing.

A real run of the cartpole example (CMA-ES, planner, critic, gate, SQLite ledger) against an executor that answers
every job at once with a synthetic CartPole-like episode (its return a smooth function of the candidate's
parameters and the seed, 4-number final observations, ``terminated``/``truncated`` as CartPole ends them), so the
wall clock is the driver's own. With thousands of short episodes a second from the workers, this is the rate the
driver must keep up with.

Usage: python benchmarks/driver_rate.py [--env-steps N] [--repeats R] [--profile] [--write]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.execution import ExecutorCapabilities
from ratchet.loop import start_run
from ratchet.rollout import Episode
from ratchet.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


class InstantExecutor:
    """Answers every job at once with a synthetic episode (no env, no worker): the driver's cost alone."""

    capabilities = ExecutorCapabilities(caps_env_steps=True)  # honours max_env_steps (below)

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


def measure(spec, per_event: bool, profile: bool = False) -> tuple[int, float, float]:
    """(episodes, seconds from the first evaluation to the last, whole-run seconds) of one run; ``per_event``: every
    event committed on its own, as before evaluations were committed in groups."""
    from ratchet import services

    saved = services.RunServices.record_many, services._GROUP_COMMIT_S
    if per_event:
        def one_by_one(self, events):
            for t, k, p in events:
                self.record(t, k, p)

        services.RunServices.record_many, services._GROUP_COMMIT_S = one_by_one, 0.0
    ex = InstantExecutor()
    try:
        with tempfile.TemporaryDirectory() as runs:
            t0 = time.perf_counter()
            if profile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.enable()
            start_run(spec, runs, "driver-rate", executor=ex)
            wall = time.perf_counter() - t0
            if profile:
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    finally:
        services.RunServices.record_many, services._GROUP_COMMIT_S = saved
    return ex.episodes, ex.last - ex.first, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env-steps", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print the driver's 25 costliest functions (one run)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    spec = load_spec(ROOT / "examples" / "cartpole")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"env_steps": args.env_steps, "target": None})})
    if args.profile:
        measure(spec, False, profile=True)
        return
    rates: dict[bool, list[float]] = {True: [], False: []}
    episodes = 0
    for r in range(args.repeats):
        for per_event in ((False, True) if r % 2 == 0 else (True, False)):
            episodes, loop_s, _ = measure(spec, per_event)
            rates[per_event].append(episodes / loop_s)
            print(f"repeat {r}: {'per-event commits' if per_event else 'group commits'} {episodes / loop_s:,.0f} episodes/s",
                  flush=True)
    grouped, single = statistics.median(rates[False]), statistics.median(rates[True])
    line = (f"{episodes:,} episodes per run, median of {args.repeats}: **{grouped:,.0f} episodes/s** of the driver alone "
            f"({1e6 / grouped:.0f} µs per episode: planning, CMA-ES, critique, gate, ledger appends), against "
            f"{single:,.0f} episodes/s committing every event on its own (as before: one `fsync` each).")
    print(line)
    if args.write:
        write_section("The driver alone (cartpole)", (
            f"Command: `python benchmarks/driver_rate.py --env-steps {args.env_steps} --repeats {args.repeats} --write` — "
            "the cartpole example's run (its spec, budget raised, no target) against an executor that answers each job "
            "at once with a synthetic episode, so the time from the first evaluation to the last is the driver's: "
            "planner, CMA-ES, critic, gate, SQLite ledger (`synchronous=FULL`).\n\n"
            f"Machine: {machine()}\n\n{line}\n"))


if __name__ == "__main__":
    main()
