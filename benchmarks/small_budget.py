"""Small budgets with default settings: ``[budget] episodes = 128`` (training and validation together, as
coding-agent benchmarks allow) and nothing else set but the task and the policy.

For each env and run seed: promotions, where the env steps went (search / re-evaluation / validation /
unused, as shares of the steps used, unused as a share of what 128 worst-case episodes allow), and the
test mean before → after on 100 held-out seeds.

Usage: python benchmarks/small_budget.py [--seeds 0,1,2] [--episodes 128] [--write]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import machine, write_section

from ratchet.ledger.projection import project
from ratchet.loop import open_ledger, start_run
from ratchet.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name -> (folder holding policy.py, env id)
    "cartpole": (ROOT / "examples/cartpole", "CartPole-v1"),
    "mountain_car_continuous": (ROOT / "examples/mountain_car_continuous", "MountainCarContinuous-v0"),
    "acrobot": (ROOT / "benchmarks/small_budget/acrobot", "Acrobot-v1"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "benchmarks"))
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = []
    for name, (folder, env_id) in CASES.items():
        for seed in [int(x) for x in args.seeds.split(",")]:
            spec = spec_from_dict({"name": name, "seed": seed, "task": {"env_id": env_id},
                                   "budget": {"episodes": args.episodes, "env_steps": None},
                                   "test": {"episodes": 100}}, folder)
            t0 = time.perf_counter()
            result = start_run(spec, args.runs_dir, f"small-{name}-s{seed}-{time.strftime('%Y%m%d-%H%M%S')}")
            wall = time.perf_counter() - t0
            st = project(open_ledger(result.run_dir).read())
            b = st.env_steps_breakdown or {}
            used = max(1, st.env_steps)
            gens = st.generation_log
            gated = sum(1 for g in gens if g.get("gated"))
            rows.append(f"| {name} | {seed} | {st.episodes} | {len(gens)} | {gated} | {len(st.promotions)} | "
                        f"{100 * b.get('search', 0) / used:.0f} / {100 * b.get('re-evaluation', 0) / used:.0f} / "
                        f"{100 * b.get('validation', 0) / used:.0f} % | {result.baseline_test.mean:.1f} → "
                        f"{result.test.mean:.1f} | {wall:.0f} s |")
            print(rows[-1], f"stop: {result.stop_reason}", flush=True)
    table = ("| env | run seed | episodes used | generations | gated | promotions | env steps: search / "
             "re-evaluation / validation | test mean (100 seeds) start → refined | wall |\n"
             "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(table)
    if args.write:
        write_section("Small budgets with default settings", (
            f"Command: `python benchmarks/small_budget.py --seeds {args.seeds} --episodes {args.episodes} --write` — "
            f"`[budget] episodes = {args.episodes}` and no other setting (the spec gives only the task and the "
            "policy: the examples' policy files, and an Acrobot program of our own in "
            "`benchmarks/small_budget/acrobot/`), so the defaults are sized to the budget "
            "(`RunSpec._size_to_a_small_budget`): 10 validation episodes, 2 training episodes per candidate, "
            "populations of 4 (+ the incumbent and the CMA-ES mean), validation share up to 0.5.\n\n"
            f"Machine: {machine()}\n\n{table}"))


if __name__ == "__main__":
    main()
