"""Waiting on the model: an ``llm`` run against a local stand-in endpoint that answers in a fixed time, at
``concurrency = 1`` (one request after another) and ``concurrency = 4`` (a generation's requests at once), and with
``ahead = 0`` (a generation's requests answered before its episodes) or ``ahead = 1`` (the next generation's requests
out while this generation's episodes run).

With ``--ahead A:L`` the ``llm`` refiner also has ``lag = L``: the wave sent after generation g is taken by
generation g + L, which the allocator gives the ``llm``, the other refiner taking the generations between; with
``--ahead A:auto`` (``lag = "auto"``) by the first generation that starts once all the wave's answers are in.

The endpoint is the stand-in server ``ratchet standin`` serves and the tests use
(:class:`ratchet.refiners.standin.StandIn`): a real HTTP server on 127.0.0.1 speaking chat completions, answering every request after ``--latency`` seconds with an edit of the program
it was sent (the side engines' threshold scaled by a factor drawn from the request's seed, so every answer is a new
program that passes its checks and keeps its parent's values). The run is the ``lunar_lander`` example with ``[[refiners]]`` an ``llm`` (``--proposals`` requests per generation, one
variant each, ``--requests`` in all; with ``--cmaes`` a ``cmaes`` refiner beside it), 2 sandboxed workers, gating
every generation.

Reported per concurrency, from the run's ledger and a wrapper around its executor:

- wall clock of the whole run (start-up, validation of the starting policy, the search, the test evaluation);
- the requests' own seconds (each out from its arrival at the stand-in for ``--latency``, summed; their ``llm_call``
  events are recorded when the refiner takes the answers), the wall clock with at least one request out, and the
  requests in flight on average over that time and over the whole run (summed seconds ÷ that time);
- the workers' busy share: worker-seconds with an episode to run ÷ (workers × wall clock), where a call to the
  executor with ``r`` episodes left keeps ``min(workers, r)`` workers busy (each episode's end is reported).

Issue 42's goal: with the stand-in answering in 10 s, an ``llm`` + ``cmaes`` run keeps the workers busy ≥ 80 % of
its wall clock with ≥ 3 requests in flight on average at a concurrency of 4 (``--latency 10 --cmaes --concurrency 4
--ahead 0,1:2``). Each row also gives the final incumbent's test mean (report only).

Usage: python benchmarks/llm_overlap.py [--latency 2] [--proposals 4] [--requests 12] [--cmaes] [--ahead 0,1,1:2]
[--seed N] [--write]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from _common import machine, write_section

from ratchet.execution import executor_from_spec
from ratchet.ledger.events import EventType
from ratchet.ledger.sqlite import SQLiteLedger
from ratchet.loop import start_run
from ratchet.refiners.standin import StandIn
from ratchet.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = ROOT / "examples" / "lunar_lander"


class TimedExecutor:
    """Wraps the run's executor: counts worker-seconds with an episode to run (see the module doc)."""

    def __init__(self, inner: Any, workers: int) -> None:
        self.inner, self.workers, self.busy = inner, workers, 0.0

    @property
    def capabilities(self) -> Any:
        return self.inner.capabilities

    def train(self, task: Any, job: Any, timeout_s: float = 3600.0) -> Any:
        return self.inner.train(task, job, timeout_s)

    def run(self, task: Any, jobs: Any, on_episode: Any = None, **kw: Any) -> Any:
        left, last = len(jobs), time.monotonic()

        def done(i: int, ep: Any) -> None:
            nonlocal left, last
            now = time.monotonic()
            self.busy += min(self.workers, left) * (now - last)
            left, last = left - 1, now
            if on_episode is not None:
                on_episode(i, ep)

        try:
            return self.inner.run(task, jobs, done, **kw)
        finally:
            self.busy += min(self.workers, left) * (time.monotonic() - last)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


def answer(arrivals: list[float]) -> Any:
    """The stand-in's answer to a request: an edit of the program it was sent (SEARCH/REPLACE) that scales the
    side engines' threshold by a factor from 0.9 to 1.1 drawn from the request's seed, so every answer is a new program
    that keeps the parent's values; each request's arrival (``time.monotonic()``) is appended to ``arrivals``."""
    def respond(body: dict[str, Any]) -> dict[str, Any]:
        arrivals.append(time.monotonic())
        factor = 1 + (body["seed"] % 1999 - 999) / 10_000
        return {"content": ("Scale the side engines' threshold.\n<<<<<<< SEARCH\n    if angle_todo < -side_thr:\n"
                            f"=======\n    side_thr = side_thr * {factor:.4f}\n    if angle_todo < -side_thr:\n"
                            ">>>>>>> REPLACE\n"),
                "usage": {"prompt_tokens": 2000, "completion_tokens": 500}}
    return respond


def one_run(concurrency: int, ahead: int, lag: int | str, args: argparse.Namespace) -> dict[str, Any]:
    arrivals: list[float] = []
    server = StandIn(latency=args.latency, respond=answer(arrivals))
    try:
        d = tomllib.loads((EXAMPLE / "ratchet.toml").read_text(encoding="utf-8"))
        llm = {"kind": "llm", "base_url": server.url, "model": "stand-in", "proposals": args.proposals,
               "variants": 1, "concurrency": concurrency, "budget_requests": args.requests, "retries": 0,
               "ahead": ahead, "lag": lag}
        d["refiners"] = [llm] + ([{"kind": "cmaes", "popsize": 6}] if args.cmaes else [])
        d.pop("refiner", None)
        d["planner"] = {"train_episodes": args.train_episodes, "decide": "every"}
        d["gate"] = {"validation_episodes": 30}
        d["test"] = {"episodes": 20}
        d["budget"] = {"env_steps": args.env_steps}
        d["execution"] = {"workers": args.workers}
        if args.seed is not None:
            d["seed"] = args.seed
        spec = spec_from_dict(d, EXAMPLE)
        with tempfile.TemporaryDirectory() as runs:
            ex = TimedExecutor(executor_from_spec(spec.execution), args.workers)  # as `ratchet run` makes it
            t0 = time.monotonic()
            try:
                result = start_run(spec, runs, "r", executor=ex)
                wall = time.monotonic() - t0
            finally:
                ex.close()
            events = SQLiteLedger(Path(runs) / "r" / "ledger.sqlite", readonly=True).read()
    finally:
        server.stop()
    calls = [e for e in events if e.type is EventType.LLM_CALL]
    # each request is out from its arrival at the stand-in for its latency (an llm_call event is recorded when the
    # refiner takes the answer, which for a request sent ahead can be long after it came in)
    spans = sorted((a, a + args.latency) for a in arrivals)
    out_s, end = 0.0, float("-inf")
    for a, b in spans:  # the wall clock with at least one request out: the union of the requests' spans
        out_s += max(0.0, b - max(a, end))
        end = max(end, b)
    seconds = sum(b - a for a, b in spans)
    gens = [e for e in events if e.type is EventType.GENERATION_FINISHED]
    end = next(e.payload for e in events if e.type is EventType.RUN_FINISHED)
    return {"concurrency": concurrency, "ahead": ahead, "lag": lag, "wall": wall, "test": result.test.mean,
            "unused": sum(f.get("unused_requests", 0) for f in end.get("refiners_at_end", {}).values()), "requests": len(calls), "seconds": seconds, "out": out_s,
            "in_flight_out": seconds / out_s if out_s else 0.0, "in_flight": seconds / wall,
            "busy": ex.busy / (args.workers * wall), "generations": len(gens),
            "llm_generations": sum(1 for g in gens if g.payload["refiner"] == "llm"),
            "episodes": sum(len(e.payload["episodes"]) for e in events if e.type is EventType.EPISODES_EVALUATED),
            "env_steps": next(e.payload["env_steps"] for e in events if e.type is EventType.RUN_FINISHED),
            "stop": result.stop_reason}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=2.0, help="Seconds the stand-in takes to answer each request.")
    ap.add_argument("--proposals", type=int, default=4, help="Requests per generation.")
    ap.add_argument("--requests", type=int, default=12, help="The llm refiner's budget_requests.")
    ap.add_argument("--cmaes", action="store_true", help="A cmaes refiner beside the llm one.")
    ap.add_argument("--env-steps", type=int, default=400_000, help="[budget] env_steps.")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--train-episodes", type=int, default=5, help="[planner] train_episodes (episodes per candidate "
                                                                   "per generation).")
    ap.add_argument("--concurrency", default="1,4", help="Comma-separated concurrency settings to compare.")
    ap.add_argument("--ahead", default="0", help="Comma-separated ahead settings to compare (each with every "
                                                  "concurrency), each A or A:L (ahead A, lag L generations, or "
                                                  "auto).")
    ap.add_argument("--seed", type=int, default=None, help="The run's seed (default: the example's).")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    modes: list[tuple[int, int | str]] = []
    for a in args.ahead.split(","):
        lag = a.split(":")[1] if ":" in a else "0"
        modes.append((int(a.split(":")[0]), lag if lag == "auto" else int(lag)))
    rows = [one_run(int(c), a, lag, args) for c in args.concurrency.split(",") for a, lag in modes]
    table = ("| concurrency | ahead | lag | wall clock (s) | generations (llm) | episodes | env steps (budget used) | requests "
             "(answered after the last generation) | requests' seconds (sum) | wall clock with a request out (s) | in "
             "flight on average (while out / whole run) | workers busy | test mean |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        table += (f"| {r['concurrency']} | {r['ahead']} | {r['lag']} | {r['wall']:.1f} | {r['generations']} ({r['llm_generations']}) "
                  f"| {r['episodes']:,} | {r['env_steps']:,} of {args.env_steps:,} | {r['requests']} ({r['unused']}) | "
                  f"{r['seconds']:.1f} | {r['out']:.1f} | "
                  f"{r['in_flight_out']:.2f} / {r['in_flight']:.2f} | {100 * r['busy']:.0f} % | {r['test']:.1f} |\n")
    stops = "; ".join(f"concurrency {r['concurrency']}, ahead {r['ahead']}: {r['stop']}" for r in rows)
    print(table + "\nStopped: " + stops)
    if args.write:
        cmd = (f"python benchmarks/llm_overlap.py --latency {args.latency:g} --proposals {args.proposals} "
               f"--requests {args.requests}{' --cmaes' if args.cmaes else ''} --env-steps {args.env_steps} "
               f"--workers {args.workers} --train-episodes {args.train_episodes} --concurrency {args.concurrency} "
               f"--ahead {args.ahead}{'' if args.seed is None else f' --seed {args.seed}'} --write")
        write_section(f"Waiting on the model: LLM requests in flight (stand-in answering in {args.latency:g} s"
                      f"{', llm + cmaes' if args.cmaes else ''}{', ahead ' + args.ahead if args.ahead != '0' else ''})", (
            f"Command: `{cmd}` — the lunar_lander example with an `llm` refiner"
            f"{' beside a `cmaes` one' if args.cmaes else ''} ({args.proposals} requests per generation, one variant "
            f"each, budget_requests {args.requests}, {args.train_episodes} training episodes per candidate) against the tests' stand-in endpoint answering every request in "
            f"{args.latency:g} s, {args.workers} sandboxed workers, a gate every generation.\n\n"
            f"Machine: {machine()}\n\n{table}\nStopped: {stops}\n"))


if __name__ == "__main__":
    main()
