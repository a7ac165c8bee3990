"""Structural search vs CMA-ES alone at equal env-step budgets: test mean ± std across run seeds.

Usage: python benchmarks/structural.py [--tasks NAME ...] [--configs NAME ...] [--seeds 0,1,2] [--budget-scale F]
[--write]
Each task starts from a program whose structure limits it (pendulum: the example's controller; acrobot: a
one-gain program; bipedal: the generic affine policy; mountain_car: a position-only controller, the example
examples/mountain_car_structure). Configurations: ``cmaes`` alone, and ``mutate`` +
``cmaes`` (the planner's Thompson allocator splits generations between them). ``benchmarks/llm.py`` adds an
``llm`` + ``cmaes`` configuration for anyone with an endpoint. Writes the table to benchmarks/RESULTS.md
(section "Structural search") with --write.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: name -> (env id, policy file, env-step budget, extra spec sections)
TASKS: dict[str, tuple[str, Path, int, dict[str, Any]]] = {
    "pendulum": ("Pendulum-v1", ROOT / "examples/pendulum/policy.py", 300_000, {"task": {"success_threshold": -200}}),
    "acrobot": ("Acrobot-v1", ROOT / "benchmarks/structural/acrobot.py", 200_000, {}),
    "bipedal": ("BipedalWalker-v3", ROOT / "examples/linear_generic/policy.py", 1_000_000, {}),
    # examples/mountain_car_structure: its ratchet.toml is this spec (mutate+cmaes)
    "mountain_car": ("MountainCar-v0", ROOT / "examples/mountain_car_structure/policy.py", 200_000, {}),
}

CMAES = {"kind": "cmaes", "sigma0": 0.2}
CONFIGS: dict[str, list[dict[str, Any]]] = {
    "cmaes": [CMAES],
    "mutate+cmaes": [{"kind": "mutate", "programs": 3, "variants": 3}, CMAES],
}


def spec_for(task: str, refiners: list[dict[str, Any]], seed: int, budget: int):
    from ratchet.spec import spec_from_dict

    env_id, policy, _, extra = TASKS[task]
    d: dict[str, Any] = {"name": f"structural-{task}", "seed": seed, "task": {"env_id": env_id},
                         "policy": {"path": policy.name}, "refiners": refiners,
                         "refiner": {"train_episodes": 3}, "gate": {"validation_episodes": 30, "max_share": 0.3},
                         "budget": {"env_steps": budget}, "test": {"episodes": 100}}
    for section, values in extra.items():
        d.setdefault(section, {}).update(values)
    return spec_from_dict(d, policy.parent)


def run_table(configs: dict[str, list[dict[str, Any]]], tasks: list[str], seeds: list[int], scale: float,
              runs_dir: str) -> str:
    """Run every (task, configuration, seed) and return the markdown table."""
    from ratchet.loop import start_run

    rows = []
    for task in tasks:
        budget = int(TASKS[task][2] * scale)
        for name, refiners in configs.items():
            means, promotions, t0 = [], [], time.perf_counter()
            for seed in seeds:
                spec = spec_for(task, refiners, seed, budget)
                result = start_run(spec, runs_dir, f"{task}-{name.replace('+', '-')}-s{seed}-{time.strftime('%H%M%S')}")
                means.append(result.test.mean)
                promotions.append(result.incumbent.source != spec.policy_path.read_text(encoding="utf-8"))
                print(f"{task} {name} seed {seed}: test mean {result.test.mean:.1f} "
                      f"(start {result.baseline_test.mean:.1f}; {result.stop_reason})", flush=True)
            std = statistics.stdev(means) if len(means) > 1 else 0.0
            rows.append(f"| {task} | {name} | {budget:,} | {statistics.mean(means):.1f} ± {std:.1f} | "
                        f"{', '.join(f'{m:.1f}' for m in means)} | {sum(promotions)}/{len(seeds)} | "
                        f"{time.perf_counter() - t0:.0f} |")
    return ("| task | refiners | env steps per run | test mean ± std across run seeds | per run seed | "
            "runs ending on new code | wall clock (s) |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows))


def main(extra_configs: dict[str, list[dict[str, Any]]] | None = None, section: str = "Structural search") -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="*", choices=sorted(TASKS), default=list(TASKS))
    ap.add_argument("--seeds", default="0,1,2", help="Comma-separated run seeds.")
    ap.add_argument("--configs", nargs="*", default=None,
                    help="Configurations to run (default: all), e.g. only mutate+cmaes where CMA-ES is unchanged.")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="Multiply every task's env-step budget.")
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "benchmarks"))
    ap.add_argument("--write", action="store_true", help="Write the table into benchmarks/RESULTS.md.")
    args, _ = ap.parse_known_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    configs = dict(CONFIGS, **(extra_configs or {}))
    if args.configs:
        unknown = sorted(set(args.configs) - set(configs))
        if unknown:
            ap.error(f"unknown configurations {unknown}; known: {', '.join(configs)}")
        configs = {k: v for k, v in configs.items() if k in args.configs}
    table = run_table(configs, args.tasks, seeds, args.budget_scale, args.runs_dir)
    print(table)
    if args.write:
        from _common import machine, write_section

        write_section(section, f"Command: `python benchmarks/{Path(__import__('sys').argv[0]).name} --write "
                               f"--seeds {args.seeds} --tasks {' '.join(args.tasks)}"
                               f"{'' if args.budget_scale == 1 else f' --budget-scale {args.budget_scale:g}'}`"
                               f"\n\nMachine: {machine()}\n\n{table}")


if __name__ == "__main__":
    main()
