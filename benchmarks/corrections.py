"""Learning from corrections on LunarLander-v3: HG-DAgger vs DAgger vs behaviour cloning alone, an
I3L-style protocol with a scripted "person" (no human).

Expert: ``examples/lunar_lander_dagger/expert.py`` — the refined LunarLander heuristic (incumbent of
``ratchet run examples/lunar_lander``, run seed 0) plus a state-based takeover rule (the scripted person).
Student: an ``mlp`` (64-64 tanh) first trained by behaviour cloning on a few expert episodes (round 0,
shared by the three methods of one run seed). Then four rounds of each method, each round retraining the
student (warm start, same number of gradient steps) on all the data so far:

- HG-DAgger: the student flies ``--episodes`` training episodes; the expert takes over when the rule fires
  and hands back after ``--handback`` calm steps; only takeover steps are labelled.
- DAgger: the student flies the same training episodes; the expert labels every visited state, and as many
  labels as HG-DAgger got in that round (same run seed) are kept, drawn uniformly from all of them.
- BC: the expert flies the same training episodes; as many labels as HG-DAgger got are kept, drawn uniformly.

After each round: the student's test success rate (return ≥ 200) on ``--test`` held-out seeds (disjoint
from training seeds); per round, expert-controlled steps per episode of the collection episodes. The
rounds call the refiners' own code (``ratchet.refiners.dagger.collect`` and ``behaviour_cloning``)
in-process: no sandbox and no gate, so every round's student is measured (``ratchet run
examples/lunar_lander_dagger`` runs the same rounds through the gate).

Usage: python benchmarks/corrections.py [--seeds 0,1,2] [--episodes 10] [--test 100] [--write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _common import machine, write_section

from ratchet.planner import SeedSplits
from ratchet.policies.mlp import init_weights
from ratchet.policy import load_policy
from ratchet.refiners.dagger import _Expert, behaviour_cloning, collect
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
EXPERT = ROOT / "examples/lunar_lander_dagger/expert.py"
METHODS = ("hg-dagger", "dagger", "bc")


def evaluate(task: GymTask, act, seeds: list[int]) -> tuple[float, float]:
    """(success rate, mean return) of ``act`` (observation -> action) on ``seeds``."""
    env = task.make_env()
    rets = []
    try:
        for s in seeds:
            obs, _ = env.reset(seed=s)
            ret = 0.0
            while True:
                obs, r, term, trunc, _ = env.step(act(obs))
                ret += float(r)
                if term or trunc:
                    break
            rets.append(ret)
    finally:
        env.close()
    rets_a = np.asarray(rets)
    return float((rets_a >= task.success_threshold).mean()), float(rets_a.mean())


def one_seed(run_seed: int, args: argparse.Namespace) -> dict:
    task = GymTask("LunarLander-v3", success_threshold=200)
    env = task.make_env()
    spaces = (env.observation_space, env.action_space)
    env.close()
    program = load_policy(EXPERT)
    expert = _Expert(program.source, program.defaults, *spaces)
    splits = SeedSplits(run_seed)
    test_seeds = splits.seeds("test", 0, args.test)
    out: dict = {"expert": evaluate(task, expert.act, test_seeds)}
    bc_kw = {"updates": args.updates, "batch_size": 256, "learning_rate": 1e-3}
    student = init_weights(*spaces, hidden=(64, 64), activation="tanh", seed=run_seed)
    demo, _, _ = collect(task, "bc", student, expert, splits.seeds("train", 0, args.initial), round_no=0)
    student0, _ = behaviour_cloning(student, demo, seed=run_seed, normalize=True, **bc_kw)
    out["round0"] = evaluate(task, student0.act, test_seeds) + (len(demo),)
    budgets: list[int] = []
    for method in METHODS:
        mlp, data, rows = student0, demo, []
        for k in range(1, args.rounds + 1):
            t0 = time.monotonic()
            # each round has its own training seeds (the same for every method of this run seed)
            seeds = splits.seeds("train", 1000 * k, args.episodes)
            first = int(data.episode.max()) + 1
            new, records, used = collect(task, method, mlp, expert, seeds, round_no=k, first_episode=first,
                                         handback_steps=args.handback)
            if method == "hg-dagger":
                budgets.append(len(new))
            elif len(new) > budgets[k - 1]:  # the same number of labels, from all the states visited
                keep = np.random.default_rng(run_seed * 100 + k).choice(len(new), budgets[k - 1], replace=False)
                new = new.take(np.sort(keep))
            data = data.concat(new)
            mlp, bc = behaviour_cloning(mlp, data, seed=run_seed * 100 + k, **bc_kw)
            success, mean = evaluate(task, mlp.act, test_seeds)
            rows.append({"round": k, "labels": len(new), "episodes": len(records), "env_steps": used,
                         "expert_steps_per_episode": float(np.mean([r["expert_steps"] for r in records])),
                         "success": success, "mean": mean, "accuracy": bc.get("accuracy"),
                         "seconds": time.monotonic() - t0})
            print(f"seed {run_seed} {method:9s} round {k}: labels {len(new):5d}, expert steps/episode "
                  f"{rows[-1]['expert_steps_per_episode']:7.1f}, test success {success:6.1%}, mean {mean:7.1f} "
                  f"({rows[-1]['seconds']:.0f} s)", file=sys.stderr, flush=True)
        out[method] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=10, help="HG-DAgger episodes per round")
    ap.add_argument("--initial", type=int, default=5, help="expert episodes of round 0")
    ap.add_argument("--test", type=int, default=100, help="test episodes after each round")
    ap.add_argument("--updates", type=int, default=2000, help="gradient steps of behaviour cloning per round")
    ap.add_argument("--handback", type=int, default=10)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    t0 = time.monotonic()
    results = {s: one_seed(s, args) for s in seeds}
    minutes = (time.monotonic() - t0) / 60
    exp = np.mean([results[s]["expert"][0] for s in seeds])
    r0 = np.mean([results[s]["round0"][0] for s in seeds])
    lines = [(f"Command: `python benchmarks/corrections.py --seeds {args.seeds} --episodes {args.episodes} "
              f"--initial {args.initial} --test {args.test} --updates {args.updates} --handback {args.handback}"
              f"{'' if args.rounds == 4 else f' --rounds {args.rounds}'} --write` ({minutes:.1f} min)."),
             "",
             f"Machine: {machine()}.",
             "",
             f"Expert test success (return ≥ 200, {args.test} test seeds per run seed): "
             + ", ".join(f"{results[s]['expert'][0]:.1%}" for s in seeds) + f" (mean {exp:.1%}; mean return "
             + ", ".join(f"{results[s]['expert'][1]:.1f}" for s in seeds) + "). "
             f"Round 0 (BC on {args.initial} expert episodes, "
             + ", ".join(str(results[s]["round0"][2]) for s in seeds) + " labels): test success "
             + ", ".join(f"{results[s]['round0'][0]:.1%}" for s in seeds) + f" (mean {r0:.1%}).",
             "",
             "Test success after each round, mean over run seeds (each run seed's values in brackets):",
             "",
             "| method | " + " | ".join(f"round {k}" for k in range(1, args.rounds + 1)) + " | labels (all rounds) |",
             "|---|" + "---|" * (args.rounds + 1)]
    for m in METHODS:
        cells = []
        for k in range(args.rounds):
            vals = [results[s][m][k]["success"] for s in seeds]
            cells.append(f"{np.mean(vals):.1%} ({', '.join(f'{v:.0%}' for v in vals)})")
        labels = [sum(r["labels"] for r in results[s][m]) for s in seeds]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {', '.join(map(str, labels))} |")
    lines += ["", ("Expert-controlled steps per episode of the collection episodes, mean over run seeds (HG-DAgger: "
              "takeover steps; DAgger: 0, the expert only labels; BC: every step):"), "",
              "| method | " + " | ".join(f"round {k}" for k in range(1, args.rounds + 1)) + " | change round 1 → "
              f"{args.rounds} |", "|---|" + "---|" * (args.rounds + 1)]
    for m in METHODS:
        per = [np.mean([results[s][m][k]["expert_steps_per_episode"] for s in seeds]) for k in range(args.rounds)]
        change = f"{(per[-1] - per[0]) / per[0]:+.0%}" if per[0] else "–"
        lines.append(f"| {m} | " + " | ".join(f"{v:.1f}" for v in per) + f" | {change} |")
    hg = [[results[s]["hg-dagger"][k] for k in range(args.rounds)] for s in seeds]
    best = [max(r["success"] for r in rows) for rows in hg]
    last = np.mean([rows[-1]["success"] for rows in hg])
    per = [np.mean([rows[k]["expert_steps_per_episode"] for rows in hg]) for k in range(args.rounds)]
    drop = (per[0] - per[-1]) / per[0] if per[0] else float("nan")
    lines += ["", (f"Goals: HG-DAgger's student reaches ≥ 90 % of the expert's test success within {args.rounds} "
              f"rounds: round-{args.rounds} success {last:.1%} = {last / exp:.0%} of the expert's {exp:.1%} "
              f"(best round per run seed: {', '.join(f'{b:.0%}' for b in best)}) — "
              f"{'met' if last >= 0.9 * exp else 'NOT met'}; expert-controlled steps per episode fall ≥ 70 % from "
              f"round 1 to {args.rounds}: {per[0]:.1f} → {per[-1]:.1f} ({drop:.0%} fewer) — "
              f"{'met' if drop >= 0.7 else 'NOT met'}.")]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("Learning from corrections: HG-DAgger vs DAgger vs BC on LunarLander-v3", text)


if __name__ == "__main__":
    main()
