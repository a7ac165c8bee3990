"""A whole ratchet run against a plain ``multiprocessing`` loop of exactly the same episodes.

Runs an example (default ``lunar_lander``, its own spec and budget) with 2 sandboxed workers, then reads every
episode it ran from its ledger (training, validation and test: candidate and seed) and runs the same episodes in a
``multiprocessing.Pool`` of 2 plain processes (``gymnasium.make`` + ``reset(seed)`` + ``step`` calling the policy, no
sandbox, no ledger), checking each return equals the ledger's. The ratio of wall clocks is what ratchet costs on top
of the episodes themselves: sandbox, trusted env host, CMA-ES, planning, critique, gate, ledger, report.

Goal (issue 21): ratchet ≤ 1.05× the plain loop's wall clock at equal env steps, 2 workers, sandbox on.

Usage: python benchmarks/whole_run.py [--example lunar_lander] [--env-steps N] [--workers 2] [--set SECTION.KEY=VALUE]
       [--write]
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

from _common import machine, plain_episode, write_section

from ratchet.errors import RatchetError
from ratchet.ledger.events import EventType
from ratchet.ledger.sqlite import SQLiteLedger
from ratchet.loop import start_run
from ratchet.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
_MODULES: dict[str, object] = {}


def _episode(job: tuple[str, str, dict, int, int | None]) -> tuple[float, int]:
    """One plain episode in this pool process: (return, env steps)."""
    import gymnasium as gym

    from ratchet.policy import compile_policy

    env_id, source, params, seed, limit = job
    if source not in _MODULES:
        _MODULES[source] = compile_policy(source)
    return plain_episode(_MODULES[source], gym.make(env_id, **({"max_episode_steps": limit} if limit else {})), params,
                         seed)


def ledger_episodes(ledger_path: Path) -> list[tuple[tuple[str, str, dict, int, int | None], float]]:
    """Every episode the run executed, in ledger order: (plain job, recorded return)."""
    events = SQLiteLedger(ledger_path, readonly=True).read()
    started = next(e for e in events if e.type is EventType.RUN_STARTED).payload
    task, source = started["task"], started["policy_source"]
    start = started["start_candidate"]
    cands = {start["id"]: (start.get("source") or source, start["params"])}
    for e in events:
        if e.type is EventType.CANDIDATE_PROPOSED:
            c = e.payload["candidate"]
            cands[c["id"]] = (c["source"] or source, c["params"])
    out = []
    for e in events:
        if e.type is EventType.EPISODES_EVALUATED:
            src, params = cands[e.payload["candidate_id"]]
            for ep in e.payload["episodes"]:
                if ep["error"] is None:
                    out.append(((task["env_id"], src, params, ep["seed"], task.get("max_episode_steps")),
                                ep["episode_return"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--example", default="lunar_lander")
    ap.add_argument("--env-steps", type=int, default=None, help="default: the example's budget")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a spec setting, as `ratchet run --set` (e.g. execution.trusted_rollouts=false)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    try:
        spec = load_spec(ROOT / "examples" / args.example, args.set)
    except RatchetError as exc:  # a bad --set: one line
        ap.error(str(exc))
    update = {"execution": spec.execution.model_copy(update={"workers": args.workers})}
    if args.env_steps:
        update["budget"] = spec.budget.model_copy(update={"env_steps": args.env_steps})
    spec = spec.model_copy(update=update)
    with tempfile.TemporaryDirectory() as runs:
        t0 = time.perf_counter()
        result = start_run(spec, runs, "whole")
        ratchet_s = time.perf_counter() - t0
        episodes = ledger_episodes(Path(runs) / "whole" / "ledger.sqlite")
    jobs = [j for j, _ in episodes]
    ctx = multiprocessing.get_context("forkserver")
    t0 = time.perf_counter()
    with ctx.Pool(args.workers) as pool:
        got = pool.map(_episode, jobs, chunksize=8)
    plain_s = time.perf_counter() - t0
    assert [r for r, _ in got] == [r for _, r in episodes], "the plain loop's returns differ from the ledger's"
    steps = sum(n for _, n in got)
    ratio = ratchet_s / plain_s
    table = ("| quantity | ratchet run | plain multiprocessing loop |\n|---|---|---|\n"
             f"| episodes | {len(jobs):,} | {len(jobs):,} (the same, returns equal) |\n"
             f"| env steps | {steps:,} | {steps:,} |\n"
             f"| wall clock (s) | {ratchet_s:.1f} | {plain_s:.1f} |\n"
             f"| µs per env step | {1e6 * ratchet_s / steps:.1f} | {1e6 * plain_s / steps:.1f} |\n"
             f"| ratio | **{ratio:.3f}** (≤ 1.05 {'met' if ratio <= 1.05 else 'NOT met'}) | 1 |\n")
    line = f"test mean {result.baseline_test.mean:.1f} → {result.test.mean:.1f}"
    print(table + "\n" + line)
    if args.write:
        write_section(f"A whole run vs a plain multiprocessing loop ({args.example})", (
            f"Command: `python benchmarks/whole_run.py --example {args.example} --workers {args.workers}"
            f"{f' --env-steps {args.env_steps}' if args.env_steps else ''}"
            f"{''.join(f' --set {x}' for x in args.set)} --write` — the example's run (its spec, "
            f"{args.workers} sandboxed workers, trusted rollouts in lockstep, SQLite ledger, report), then every episode "
            f"it ran (training, validation, test; failed ones left out) in a `multiprocessing.Pool({args.workers})` of "
            "plain processes calling the policy directly.\n\n"
            f"Machine: {machine()}\n\n{table}\n{line}\n"))


if __name__ == "__main__":
    main()
