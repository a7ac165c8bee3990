"""Run every example with its default settings and tabulate the results against its target.

Usage: python benchmarks/examples.py [--only NAME ...] [--runs-dir DIR] [--seed S]
Writes the table to benchmarks/RESULTS.md (section "Examples").
References: RL Baselines3 Zoo benchmark.md (single run per cell, mean ± std of episode return @ env steps),
as copied in the project's shared/reference/published-numbers.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.loop import start_run
from ratchet.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]

# name -> (target description, check(test_summary, env_steps) -> bool, env-step budget, published reference)
EXAMPLES = {
    "cartpole": ("mean 500.0 on 100 seeds", lambda s: s["n"] == 100 and s["mean"] >= 500.0, 50_000,
                 "PPO 500 ± 0 @100k; DQN 500 ± 0 @50k (Zoo)"),
    "lunar_lander": ("mean ≥ 270 and ≥ 97 % ≥ 200, on 200 seeds",
                     lambda s: s["n"] == 200 and s["mean"] >= 270 and s["success_rate"] >= 0.97, 1_000_000,
                     "PPO 242.1 ± 31.8 @1M (Zoo); heuristic ≈ 232"),
    "pendulum": ("mean ≥ −155 on 100 seeds", lambda s: s["n"] == 100 and s["mean"] >= -155, 300_000,
                 "SAC −157.0 ± 88.7 @20k; PPO −172.2 ± 104.2 @100k (Zoo)"),
    "bipedal_walker": ("mean ≥ 250 on 100 seeds", lambda s: s["n"] == 100 and s["mean"] >= 250, 3_000_000,
                       "PPO 287.9 ± 2.4 @5M; SAC 297.7 ± 33.1 @500k (Zoo)"),
    "mountain_car_continuous": ("mean ≥ 93 on 100 seeds", lambda s: s["n"] == 100 and s["mean"] >= 93, 100_000,
                                "SAC 94.7 ± 1.1 @50k; ARS 96.7 ± 0.8 @500k (Zoo)"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(EXAMPLES), help="Run only these examples.")
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "benchmarks"))
    ap.add_argument("--write", action="store_true", help="Write the table into benchmarks/RESULTS.md.")
    ap.add_argument("--seeds", default="0", help="Comma-separated run seeds (default: the spec's seed 0). With "
                                                 "several, the table has one row per (example, run seed).")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=JSON",
                    help="Override a spec setting, e.g. --set gate.spending='\"harmonic\"'.")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    overrides = []
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        overrides.append((section, name, json.loads(value)))  # applied per run below
    rows = []
    for name, seed in [(n, sd) for n in (args.only or list(EXAMPLES)) for sd in seeds]:
        target, check, budget, ref = EXAMPLES[name]
        spec = load_spec(ROOT / "examples" / name)
        spec = spec.model_copy(update={"seed": seed})
        for section, key, value in overrides:
            part = getattr(spec, section)
            spec = spec.model_copy(update={section: part.model_copy(update={key: value})})
        t0 = time.perf_counter()
        result = start_run(spec, args.runs_dir, f"{name}-s{seed}-{time.strftime('%Y%m%d-%H%M%S')}")
        wall = time.perf_counter() - t0
        from ratchet.ledger.projection import project
        from ratchet.loop import open_ledger

        state = project(open_ledger(result.run_dir).read())
        s, b = state.test, state.baseline_test
        met = check(s) and state.env_steps <= budget
        sr = lambda x: "–" if x["success_rate"] is None else f"{100 * x['success_rate']:.1f} %"
        paired = float((result.test.returns - result.baseline_test.returns).mean())
        rows.append(f"| {name} | {seed} | {b['mean']:.1f} ± {b['std']:.1f} ({sr(b)}) | {s['mean']:.1f} ± {s['std']:.1f} | {sr(s)} | {paired:+.1f} | "
                    f"{state.env_steps:,} / {budget:,} | {wall:.0f} | {len(state.promotions)} | {target} | "
                    f"{'yes' if met else 'NO'} | {ref} |")
        print(rows[-1], flush=True)
    table = ("| example | run seed | start: test mean ± std (success) | refined: test mean ± std | success | "
             "paired gain on test seeds | env steps used / budget | wall clock (s) | promotions | target on test seeds | "
             "met | published reference |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    if args.write:
        title = "Examples" if seeds == [0] else "Examples across run seeds"
        extra = "".join(f" --set {x}" for x in args.set) + (f" --only {' '.join(args.only)}" if args.only else "")
        if args.set:
            title += " with " + ", ".join(args.set)
        elif args.only:
            title += ": " + ", ".join(args.only)
        write_section(title, f"Command: `python benchmarks/examples.py --write{'' if seeds == [0] else ' --seeds ' + args.seeds}{extra}`"
                             f" (default settings of each example's ratchet.toml, 2 workers; the run seed also draws "
                             f"the validation and test seeds).\n\nMachine: {machine()}\n\n{table}")


if __name__ == "__main__":
    main()
