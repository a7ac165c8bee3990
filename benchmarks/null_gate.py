"""False promotions on a null task: how often does a whole run promote a candidate that is not better?

Every candidate of benchmarks/null_task has the same expected return, so any promotion is a false one.
Runs N independent refinements (run seeds 0..N-1) per alpha-spending setting and reports the share of
runs with at least one promotion, with a 95 % Wilson interval. Goal (issue: critic and planner): at most
alpha = 0.05 with the default "harmonic" spending.

Usage: python benchmarks/null_gate.py [--runs 100] [--budget 30000] [--write]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import machine, write_section
from scipy.stats import binomtest

from ratchet.execution.process import ProcessExecutor
from ratchet.ledger.projection import project
from ratchet.loop import open_ledger, start_run
from ratchet.spec import load_spec

HERE = Path(__file__).resolve().parent


def null_runs(n_runs: int, budget: int, spending: str, executor: ProcessExecutor, runs_dir: Path,
              test: str = "t", first_seed: int = 0, decide: str = "every") -> tuple[int, int, int]:
    """Return (runs with a promotion, total gate decisions, total promotions); prints one line per run."""
    gate = {"test": test} if test == "t" else {"test": test, "validation_episodes": 100}
    base = load_spec(HERE / "null_task", overrides=[f"gate.{k}={v!r}".replace("'", '"') for k, v in gate.items()])
    promoted_runs = decisions = promotions = 0
    for seed in range(first_seed, first_seed + n_runs):
        spec = base.model_copy(update={
            "seed": seed,
            "budget": base.budget.model_copy(update={"env_steps": budget}),
            "gate": base.gate.model_copy(update={"spending": spending}),
            "planner": base.planner.model_copy(update={"decide": decide}),
        })
        result = start_run(spec, runs_dir, f"null-{test}-{spending}-{seed}", executor=executor)
        st = project(open_ledger(result.run_dir).read())
        decisions += len(st.gates)
        promotions += len(st.promotions)
        promoted_runs += bool(st.promotions)
        print(f"run seed {seed}: {len(st.gates)} decision(s), {len(st.promotions)} promotion(s)", flush=True)
    return promoted_runs, decisions, promotions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--budget", type=int, default=30_000, help="env steps per run")
    ap.add_argument("--tests", default="t", help="comma-separated [gate] test settings, e.g. t,betting")
    ap.add_argument("--spendings", default="harmonic,none", help="comma-separated [gate] spending settings")
    ap.add_argument("--first-seed", type=int, default=0, help="run seeds first..first+runs-1 (to split the runs "
                                                                 "across processes; add up the rows)")
    ap.add_argument("--decide", default="every", choices=("every", "powered", "end"), help="[planner] decide")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = []
    with ProcessExecutor(workers=2, episode_timeout_s=60) as ex, tempfile.TemporaryDirectory() as tmp:
        for test, spending in [(t, sp) for t in args.tests.split(",") for sp in args.spendings.split(",")]:
            t0 = time.perf_counter()
            k, decisions, promotions = null_runs(args.runs, args.budget, spending, ex, Path(tmp), test, args.first_seed,
                                                 args.decide)
            ci = binomtest(k, args.runs).proportion_ci(method="wilson")
            rows.append(f"| {test} | {spending} | {args.runs} | {decisions / args.runs:.1f} | {promotions} | "
                        f"{k} ({100 * k / args.runs:.1f} %) | {100 * ci.low:.1f}–{100 * ci.high:.1f} % | "
                        f"{'yes' if k / args.runs <= 0.05 else 'no'} | {time.perf_counter() - t0:.0f} |")
            print(rows[-1], flush=True)
    table = ("| test | alpha spending | runs | gate decisions per run | promotions (all false) | runs with any promotion | "
             "95 % Wilson CI | ≤ α = 0.05 | wall clock (s) |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    if args.write:
        write_section("Null gate (false promotions)",
                      f"Command: `python benchmarks/null_gate.py --runs {args.runs} --budget {args.budget} --tests "
                      f"{args.tests} --spendings {args.spendings}"
                      f"{f' --first-seed {args.first_seed}' if args.first_seed else ''} --write` (benchmarks/null_task: CartPole-v1 with a "
                      f"policy whose parameters change each episode's return but not its expectation; run seeds "
                      f"{args.first_seed}..{args.first_seed + args.runs - 1}; α = 0.05; t: paired t-test on 30 validation seeds; betting: the sequential "
                      f"betting test with a cap of 100 seeds and the bound from training returns).\n\n"
                      f"Machine: {machine()}\n\n{table}")


if __name__ == "__main__":
    main()
