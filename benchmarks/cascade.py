"""Cascade evaluation ([planner] cascade_episodes) on FunSearch's online bin packing (examples/bin_packing,
OR-style instances, CMA-ES): the final test score and the instances evaluated, with and without a cascade.

Usage: python benchmarks/cascade.py [--seeds 0 1] [--budget 600] [--cascade-budget 400] [--k 2] [--margin 1.0]
                                    [--out FILE]

Shrunk to fit a shared 2-core machine (the example's spec: 3,000+ instances, 100 validation, 100 test): budget
``--budget`` instances for the run without a cascade and ``--cascade-budget`` (default two thirds of it) with one,
``[planner] train_episodes = 10``, ``[gate] validation_episodes = 20``, 20 test instances, CMA-ES popsize 8, 2
sandboxed workers. The test instances are held out (never used for any choice). "training instances" counts the
episodes on training seeds (the generations' and the final decision's), "instances" every episode the budget
counts (training and validation; test excluded). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bin_packing"


def run_one(seed: int, budget: int, k: int, margin: float, runs_dir: Path) -> dict:
    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger import EventType
    from ratchet.loop import open_run, start_run
    from ratchet.spec import spec_from_dict

    data = tomllib.loads((EXAMPLE / "or_style.toml").read_text())
    data.update(seed=seed, budget={"episodes": budget}, test={"episodes": 20})
    data["planner"] = {"train_episodes": 10, "cascade_episodes": k, "cascade_margin": margin}
    data["gate"] = {"validation_episodes": 20, "max_share": 0.3}
    spec = spec_from_dict(data, EXAMPLE, "or_style.toml")
    run_id = f"s{seed}-b{budget}-k{k}"
    t0 = time.time()
    ex = ProcessExecutor(workers=2, episode_timeout_s=spec.execution.episode_timeout_s)
    try:
        result = start_run(spec, runs_dir, run_id=run_id, executor=ex)
    finally:
        ex.close()
    ledger, _ = open_run(run_id, runs_dir, readonly=True)
    try:
        events = list(ledger.read())
    finally:
        ledger.close()
    evals = [e.payload for e in events if e.type is EventType.EPISODES_EVALUATED]
    dropped = [e.payload for e in events if e.type is EventType.PROPOSAL_REJECTED
               and str(e.payload["reason"]).startswith("cascade:")]
    gens = [e.payload for e in events if e.type is EventType.GENERATION_FINISHED]
    return {"seed": seed, "budget": budget, "k": k, "margin": margin, "test_excess": -result.test.mean,
            "test_std": result.test.std, "start_excess": -result.baseline_test.mean,
            "train_instances": sum(len(p["seeds"]) for p in evals if p["split"] == "train"),
            "instances": sum(len(p["seeds"]) for p in evals if p["split"] != "test"),
            "generations": len(gens), "dropped": len(dropped),
            "contenders": sum(1 for e in events if e.type is EventType.CANDIDATE_PROPOSED and e.payload["generation"]),
            "promotions": sum(1 for e in events if e.type is EventType.INCUMBENT_CHANGED),
            "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--budget", type=int, default=600)
    ap.add_argument("--cascade-budget", type=int, default=None)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--margin", type=float, default=1.0)
    ap.add_argument("--out", default=None, help="Also write the rows as JSON here.")
    args = ap.parse_args()
    cascade_budget = args.cascade_budget or (2 * args.budget) // 3
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for budget, k in ((args.budget, 0), (cascade_budget, args.k)):
                rows.append(run_one(seed, budget, k, args.margin, Path(tmp)))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print("| run seed | cascade | budget (instances) | generations | contenders | dropped | training instances | "
          "instances (train + validation) | promotions | test excess % (20 held-out) | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cascade = f"k = {r['k']}, margin {r['margin']:g}" if r["k"] else "off"
        print(f"| {r['seed']} | {cascade} | {r['budget']} | "
              f"{r['generations']} | {r['contenders']} | {r['dropped']} | {r['train_instances']} | {r['instances']} | "
              f"{r['promotions']} | {r['test_excess']:.2f} ± {r['test_std']:.2f} | {r['wall_s']} |")
    for k in sorted({r["k"] for r in rows}):
        sel = [r for r in rows if r["k"] == k]
        print(f"\n{'cascade' if k else 'off'}: test excess % mean over run seeds "
              f"{statistics.mean(r['test_excess'] for r in sel):.2f}; training instances "
              f"{sum(r['train_instances'] for r in sel)}, instances {sum(r['instances'] for r in sel)}")


if __name__ == "__main__":
    main()
