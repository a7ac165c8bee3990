"""Uniform vs weakness-focused training seeds at equal env-step budgets.

For each example and run seed, runs the example twice — ``[planner] weakness_share = 0`` (fresh
training seeds only) and ``= SHARE`` (that share drawn from seeds the incumbent failed on) — and
reports test mean, test failure rate (episodes below the task's success threshold) and env steps.
Goal (issue: critic and planner): weakness focus cuts the failure rate by ≥ 30 % relative without
lowering the mean.

Usage: python benchmarks/planner.py [--examples lunar_lander bipedal_walker] [--seeds 0,1,2] [--share 0.4] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.loop import start_run
from ratchet.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", nargs="+", default=["lunar_lander"])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--share", type=float, default=0.4)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "benchmarks-planner"))
    ap.add_argument("--budget", type=int, default=None, help="Override the env-step budget (both settings alike).")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, summary = [], []
    for name in args.examples:
        base = load_spec(ROOT / "examples" / name)
        agg: dict[float, list[tuple[float, float, int]]] = {0.0: [], args.share: []}
        for seed in seeds:
            for share in (0.0, args.share):
                spec = base.model_copy(update={"seed": seed, "planner": base.planner.model_copy(
                    update={"weakness_share": share})})
                if args.budget:
                    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"env_steps": args.budget})})
                t0 = time.perf_counter()
                r = start_run(spec, args.runs_dir, f"{name}-w{share:g}-s{seed}-{time.strftime('%H%M%S')}")
                fail = 1.0 - (r.test.success_rate or 0.0)
                from ratchet.ledger.projection import project
                from ratchet.loop import open_ledger

                steps = project(open_ledger(r.run_dir).read()).env_steps
                agg[share].append((r.test.mean, fail, steps))
                rows.append(f"| {name} | {seed} | {share:g} | {r.test.mean:.1f} ± {r.test.std:.1f} | "
                            f"{100 * fail:.1f} % | {steps:,} | {time.perf_counter() - t0:.0f} |")
                print(rows[-1], flush=True)
        m0 = statistics.mean(x[0] for x in agg[0.0])
        m1 = statistics.mean(x[0] for x in agg[args.share])
        f0 = statistics.mean(x[1] for x in agg[0.0])
        f1 = statistics.mean(x[1] for x in agg[args.share])
        rel = (f0 - f1) / f0 if f0 > 0 else 0.0
        met = rel >= 0.30 and m1 >= m0
        summary.append(f"| {name} | {len(seeds)} | {m0:.1f} → {m1:.1f} | {100 * f0:.2f} % → {100 * f1:.2f} % | "
                       f"{100 * rel:+.0f} % | {'yes' if met else 'no'} |")
    table = ("| example | run seed | weakness_share | test mean ± std | test failure rate | env steps | wall clock (s) |\n"
             "|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    table2 = ("| example | run seeds | mean test return (uniform → weakness) | failure rate (uniform → weakness) | "
              "relative cut in failures | goal met (≥ 30 % cut, mean not lower) |\n|---|---|---|---|---|---|\n"
              + "\n".join(summary))
    print(table)
    print(table2)
    if args.write:
        write_section("Planner: uniform vs weakness-focused training seeds: " + ", ".join(args.examples),
                      f"Command: `python benchmarks/planner.py --examples {' '.join(args.examples)} --seeds {args.seeds} "
                      f"--share {args.share:g}{f' --budget {args.budget}' if args.budget else ''} --write` (each "
                      f"example's default spec otherwise; same env-step budget for both settings).\n\n"
                      f"Machine: {machine()}\n\n{table2}\n\n{table}")


if __name__ == "__main__":
    main()
