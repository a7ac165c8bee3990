"""ratchet on FunSearch's online bin packing, without an LLM: refinement runs of examples/bin_packing with
``cmaes``, ``mutate`` and both, on several run seeds; each run's incumbent, test mean, CPU and wall time go to a
JSON file that ``benchmarks/bin_packing.py --runs FILE`` turns into rows of its table (on the same 20 held-out
test instances as first fit and best fit).

Usage: python benchmarks/bin_packing_runs.py [--kinds or weibull] [--configs cmaes mutate both] [--seeds 0 1 2]
                                             [--budget or=3000 --budget weibull=2000] [--out FILE]

Every run uses the example's spec (examples/bin_packing/{or_style,weibull}.toml) with its ``[[refiners]]``
replaced by the configuration's, ``[budget] episodes`` (instances) set as given, 2 sandboxed workers with
trusted rollouts. CPU time is this process's and its finished children's (the workers: env hosts and sandboxed
policy processes), read with ``resource.getrusage`` around each run.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tomllib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bin_packing"
SPECS = {"or": "or_style.toml", "weibull": "weibull.toml"}
REFINERS = {
    "cmaes": [{"kind": "cmaes", "sigma0": 0.3, "popsize": 8}],
    "mutate": [{"kind": "mutate"}],
    "both": [{"kind": "cmaes", "sigma0": 0.3, "popsize": 8}, {"kind": "mutate"}],
}


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_one(kind: str, config: str, seed: int, budget: int, runs_dir: Path) -> dict:
    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger.projection import project
    from ratchet.loop import open_run, start_run
    from ratchet.spec import spec_from_dict

    data = tomllib.loads((EXAMPLE / SPECS[kind]).read_text())
    data.update(seed=seed, refiners=REFINERS[config], budget={"episodes": budget}, test={"episodes": 20})
    data.pop("refiner", None)
    spec = spec_from_dict(data, EXAMPLE, SPECS[kind])
    run_id = f"{kind}-{config}-s{seed}"
    cpu0, wall0 = _cpu_s(), time.time()
    ex = ProcessExecutor(workers=2, episode_timeout_s=spec.execution.episode_timeout_s)
    try:
        result = start_run(spec, runs_dir, run_id=run_id, executor=ex)
    finally:
        ex.close()
    cpu, wall = _cpu_s() - cpu0, time.time() - wall0
    ledger, _ = open_run(run_id, runs_dir, readonly=True)
    try:
        state = project(list(ledger.read()))
    finally:
        ledger.close()
    inc = result.incumbent
    return {"kind": kind, "config": config, "seed": seed, "budget_instances": budget, "run_id": run_id,
            "source": inc.source, "params": dict(inc.params), "start_test_mean": result.baseline_test.mean,
            "test_mean": result.test.mean, "test_n": result.test.n, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            "promotions": len(state.promotions), "generations": state.generations, "episodes": state.episodes,
            "stop_reason": result.stop_reason}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", nargs="+", default=["or", "weibull"], choices=sorted(SPECS))
    ap.add_argument("--configs", nargs="+", default=list(REFINERS), choices=list(REFINERS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--budget", action="append", default=[], metavar="KIND=N",
                    help="Instances per run (default or=3000, weibull=2000).")
    ap.add_argument("--runs-dir", default="benchmarks/bin_packing_runs")
    ap.add_argument("--out", default="benchmarks/bin_packing_runs.json")
    args = ap.parse_args()
    budgets = {"or": 3000, "weibull": 2000, **{k: int(v) for k, _, v in (b.partition("=") for b in args.budget)}}
    out = Path(args.out)
    done = json.loads(out.read_text()) if out.exists() else []
    have = {(r["kind"], r["config"], r["seed"]) for r in done}
    for kind in args.kinds:
        for config in args.configs:
            for seed in args.seeds:
                if (kind, config, seed) in have:
                    continue
                row = run_one(kind, config, seed, budgets[kind], Path(args.runs_dir))
                done.append(row)
                out.write_text(json.dumps(done, indent=1))
                print(f"{kind:8} {config:7} seed {seed}: test excess {-row['start_test_mean']:.2f} % -> "
                      f"{-row['test_mean']:.2f} % ({row['promotions']} promotions, {row['generations']} generations, "
                      f"{row['cpu_s']:.0f} CPU s, {row['wall_s']:.0f} s)", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
