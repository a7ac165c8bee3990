"""Small budgets with default settings: ``[budget] episodes = 128`` (training and validation together, as
coding-agent benchmarks allow) and nothing else set but the task and the policy.

For each env and run seed: promotions, where the env steps went (search / re-evaluation / validation /
unused, as shares of the steps used, unused as a share of what 128 worst-case episodes allow), and the
test mean before → after on 100 held-out seeds.

With ``--screen``: the generic linear policy (``examples/linear_generic``) on pendulum, acrobot, mountain car
continuous and lunar lander (issue 45's cases), each run twice — model-free, and with ``[model] screen = true`` (the
world model screens each generation's proposals) — and the screened run's gain over the model-free one, with the
screen's own account: its advantage over its controls (with ``--controls``; over the pairs of a kept candidate and a
control, (wins - losses) / pairs, and the mean margin, kept minus controls), its mean rank correlation with the real
training returns among the candidates that ran (biased low), and the proposals screened out.

Usage: python benchmarks/small_budget.py [--seeds 0,1,2] [--episodes 128] [--screen] [--envs a,b] [--controls 1]
       [--model "factor=4,unscreened=all"] [--write]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import key_values, machine, write_section

from ratchet.ledger.projection import project
from ratchet.loop import open_ledger, start_run
from ratchet.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name -> (folder holding policy.py, env id)
    "cartpole": (ROOT / "examples/cartpole", "CartPole-v1"),
    "mountain_car_continuous": (ROOT / "examples/mountain_car_continuous", "MountainCarContinuous-v0"),
    "acrobot": (ROOT / "benchmarks/small_budget/acrobot", "Acrobot-v1"),
}
GENERIC = ROOT / "examples/linear_generic"
SCREEN_CASES = {"pendulum": "Pendulum-v1", "acrobot": "Acrobot-v1",
                "mountain_car_continuous": "MountainCarContinuous-v0", "lunar_lander": "LunarLander-v3"}


def _run(name: str, folder: Path, env_id: str, seed: int, args: argparse.Namespace, screen: bool | None = None):
    data = {"name": name, "seed": seed, "task": {"env_id": env_id},
            "budget": {"episodes": args.episodes, "env_steps": None}, "test": {"episodes": args.test_episodes}}
    if screen is not None:
        data["model"] = {"screen": screen, **({"controls": args.controls} if screen and args.controls else {}),
                         **(key_values(args.model) if screen else {})}
    spec = spec_from_dict(data, folder)
    t0 = time.perf_counter()
    tag = "" if screen is None else ("-screen" if screen else "-free")
    result = start_run(spec, args.runs_dir, f"small-{name}{tag}-s{seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    return result, project(open_ledger(result.run_dir).read()), time.perf_counter() - t0, open_ledger(result.run_dir)


def _account(ledger) -> tuple[str, int, str]:
    """The screen's mean rank correlation over the generations it judged (among what ran), the proposals it screened
    out, and its advantage over its controls (``[model] controls``: (wins - losses) / pairs of a kept candidate and
    a control; its pairs; the mean margin, kept minus controls, in real training return; where it switched off)."""
    from ratchet.ledger.projection import world_model_account

    gens = [e.payload for e in ledger.read() if e.type.value == "generation_finished"]
    rhos = [g["screen_rank_correlation"] for g in gens if g.get("screen_rank_correlation") is not None
            and g.get("screen_kept", 0) < g.get("screen_proposed", 0)]
    wm = world_model_account(gens) or {}
    saved = int(wm.get("saved") or 0)
    margin = "–" if wm.get("margin") is None else f"{wm['margin']:+.1f}"
    adv = "–" if wm.get("advantage") is None else f"{wm['advantage']:+.2f} ({wm['pairs']} pairs; margin {margin})"
    adv += "" if wm.get("on", True) else ", switched off"
    return (f"{sum(rhos) / len(rhos):+.2f} ({len(rhos)})" if rhos else "–"), saved, adv


def screened(args: argparse.Namespace) -> None:
    rows = []
    envs = args.envs.split(",") if args.envs else list(SCREEN_CASES)
    for name in envs:
        for seed in [int(x) for x in args.seeds.split(",")]:
            free, _, wall_free, _ = _run(name, GENERIC, SCREEN_CASES[name], seed, args, screen=False)
            scr, st, wall_scr, ledger = _run(name, GENERIC, SCREEN_CASES[name], seed, args, screen=True)
            rho, saved, adv = _account(ledger)
            rows.append(f"| {name} | {seed} | {free.baseline_test.mean:.1f} | {free.test.mean:.1f} | {scr.test.mean:.1f} | "
                        f"{scr.test.mean - free.test.mean:+.1f} | {len(st.promotions)} | {adv} | {rho} | {saved} | "
                        f"{wall_free:.0f} / {wall_scr:.0f} s |")
            print(rows[-1], flush=True)
    table = ("| env | run seed | test mean: start | model-free | screened | gain | promotions (screened) | "
             "advantage over controls (pairs; margin) | rank correlation among those run, mean (generations) | "
             "proposals screened out | wall: free / screened |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(table)
    if args.write:
        write_section("Small budgets with a world-model screen", (
            f"Command: `python benchmarks/small_budget.py --screen --seeds {args.seeds} --episodes {args.episodes} "
            f"--test-episodes {args.test_episodes}{' --envs ' + args.envs if args.envs else ''} --write` — the generic "
            f"linear policy (`examples/linear_generic`), `[budget] episodes = {args.episodes}`, everything else "
            "default, run model-free and with `[model] screen = true` (its defaults: factor 2, so CMA-ES proposes 8 "
            "and 4 are run). Test means on held-out seeds; the screen's account from its `generation_finished` "
            "events.\n\n"
            f"Machine: {machine()} — shared with other work, so wall times are noisy.\n\n{table}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--test-episodes", type=int, default=100)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "benchmarks"))
    ap.add_argument("--screen", action="store_true", help="issue 45's cases, model-free against [model] screen")
    ap.add_argument("--envs", default="", help="with --screen: a comma-separated subset of " + ",".join(SCREEN_CASES))
    ap.add_argument("--controls", type=int, default=0, help="with --screen: [model] controls of the screened run")
    ap.add_argument("--model", default="", help="with --screen: further [model] keys of the screened run, "
                                                 "e.g. \"factor=4,optimism=0.5\"")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if args.screen:
        screened(args)
        return
    rows = []
    for name, (folder, env_id) in CASES.items():
        for seed in [int(x) for x in args.seeds.split(",")]:
            result, st, wall, _ = _run(name, folder, env_id, seed, args)
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
