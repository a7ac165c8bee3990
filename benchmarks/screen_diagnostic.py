"""Does the world-model screen rank candidates as their real episodes do? An offline check (issue 45).

For one env and the generic linear policy (``examples/linear_generic``): draw ``--policies`` random parameter vectors
as CMA-ES's first generation would (around the all-zero start, step size 0.2 of each parameter's range), record the
transitions of ``--data-episodes`` episodes of other such draws (what a run has recorded when the screen first works),
fit the ensemble with the ``[model]`` defaults, and compare, over ALL the policies:

1. their imagined returns (the ``worldmodel`` trainer's own code: :func:`ratchet.refiners.screened.train`) with their
   real mean returns over ``--real-episodes`` seeds (Spearman);
2. the same through :class:`~ratchet.refiners.screened.ScreenedRefiner`'s path: the optimistic scores, which are kept,
   and the correlation its account computes among the kept ones only (range restriction).

With ``--ledger RUN_DIR`` (a screened run of the generic linear policy, e.g. one ``small_budget.py --screen`` made):
for each of its ``worldmodel`` jobs, the proposals (and the recommendation) it imagined, their imagined returns as
the job answered them, against real mean returns over ``--real-episodes`` fresh seeds, over all of them and among
the ones the screen kept.

Usage: python benchmarks/screen_diagnostic.py [--env Pendulum-v1] [--policies 20] [--seeds 0,1,2] [--horizon 200]
       python benchmarks/screen_diagnostic.py --ledger RUN_DIR --env Pendulum-v1 [--real-episodes 16]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from ratchet.policy import bind_spaces, compile_policy
from ratchet.spec import ModelSpec
from ratchet.tasks.gym import GymTask
from ratchet.worldmodel.screen import choose, horizon_for, optimistic, rank_correlation
from ratchet.worldmodel.transitions import Transitions, record_transitions

ROOT = Path(__file__).resolve().parents[1]


def _draw(rng: np.random.Generator, d_act: int, d_obs: int) -> dict:
    return {"W": np.clip(rng.normal(0, 2.0, (d_act, d_obs)), -5, 5), "b": np.clip(rng.normal(0, 0.4, d_act), -1, 1)}


def one(env_id: str, seed: int, args: argparse.Namespace) -> tuple[float | None, float | None, float | None]:
    from ratchet.refiners.screened import train

    task = GymTask(env_id)
    env = task.make_env()
    spaces = (env.observation_space, env.action_space)
    env.close()
    d_obs = int(np.prod(spaces[0].shape))
    d_act = int(getattr(spaces[1], "n", 0) or np.prod(spaces[1].shape))
    source = (ROOT / "examples/linear_generic/policy.py").read_text()
    module = compile_policy(source)
    bind_spaces(module, *spaces)
    rng = np.random.default_rng(seed)
    tmp = Path(tempfile.mkdtemp())
    arts = {}
    for i in range(args.data_episodes):
        p = _draw(rng, d_act, d_obs)
        record_transitions(task.make_env(), module, p, 10_000 + i, task, str(tmp / f"{i}.npz"))
        arts[f"t{i:04d}"] = (tmp / f"{i}.npz").read_bytes()
    rows = sum(len(Transitions.from_bytes(b)) for b in arts.values())
    policies = [_draw(rng, d_act, d_obs) for _ in range(args.policies)]
    real = []
    for p in policies:
        real.append(float(np.mean([record_transitions(task.make_env(), module, p, 20_000 + s, task,
                                                      str(tmp / "r.npz")).episode_return
                                   for s in range(args.real_episodes)])))
    m = ModelSpec()
    settings = {"params": [{k: v.tolist() for k, v in p.items()} for p in policies], "members": m.members,
                "hidden": m.hidden, "updates": m.updates, "horizon": args.horizon or m.horizon or horizon_for(task.step_limit), "starts": m.starts, "holdout": 0.2,
                "seed": seed + 1, "max_transitions": m.max_transitions}
    out, _ = train(task, {"source": source, "artifacts": arts}, settings, (), 0)
    imagined = np.asarray(out[0].info["returns"])
    rho_mean = rank_correlation(imagined.mean(1), real)
    scores = optimistic(imagined, m.optimism)
    rho_all = rank_correlation(scores, real)
    keep = len(policies) // m.factor
    kept = choose(scores.tolist(), keep)
    rho_kept = rank_correlation([scores[i] for i in kept], [real[i] for i in kept])
    best_real = sorted(range(len(real)), key=lambda i: -real[i])[:keep]
    print(f"{env_id} seed {seed}: {rows} transitions; Spearman over all {len(policies)}: imagined mean "
          f"{rho_mean:+.2f}, optimistic score {rho_all:+.2f}; among the {keep} kept (the account's measure) "
          f"{rho_kept if rho_kept is None else f'{rho_kept:+.2f}'}; kept ∩ real best {keep}: "
          f"{len(set(kept) & set(best_real))}; real mean of kept {np.mean([real[i] for i in kept]):.1f} vs all "
          f"{np.mean(real):.1f}", flush=True)
    return rho_mean, rho_all, rho_kept


def from_ledger(run_dir: str, env_id: str, episodes: int) -> None:
    from ratchet.loop import open_ledger
    from ratchet.policy import materialize
    from ratchet.spec import ModelSpec

    task = GymTask(env_id)
    env = task.make_env()
    spaces = (env.observation_space, env.action_space)
    env.close()
    module = compile_policy((ROOT / "examples/linear_generic/policy.py").read_text())
    bind_spaces(module, *spaces)
    tmp = Path(tempfile.mkdtemp())
    m = ModelSpec()
    alls, kepts, gains = [], [], []
    for e in open_ledger(run_dir).read():
        if e.type.value != "training_finished" or e.payload.get("trainer") != "worldmodel" or e.payload.get("error"):
            continue
        params = e.payload["settings"]["params"]
        imagined = np.asarray(e.payload["outputs"][0]["info"]["returns"])
        real = [float(np.mean([record_transitions(task.make_env(), module, materialize(p), 30_000 + s, task,
                                                  str(tmp / "r.npz")).episode_return for s in range(episodes)]))
                for p in params]
        scores = optimistic(imagined, m.optimism)
        n = len(params) - 1  # the proposals; the last one imagined is the recommendation (run, never ranked)
        kept = choose(scores[:n].tolist(), max(1, -(-n // m.factor)))
        ran = [*kept, n]
        rho_all, rho_ran = rank_correlation(scores, real), rank_correlation(scores[ran], [real[i] for i in ran])
        alls.append(rho_all)
        kepts.append(rho_ran)
        gains.append(float(np.mean([real[i] for i in kept]) - np.mean(real[:n])))
        print(f"job {len(alls)}: Spearman over all {len(params)}: {rho_all if rho_all is None else f'{rho_all:+.2f}'}; "
              f"over the {len(ran)} that ran: {rho_ran if rho_ran is None else f'{rho_ran:+.2f}'}; real mean of the kept "
              f"minus all proposals': {gains[-1]:+.1f}", flush=True)
    for name, vals in (("all imagined", alls), ("those that ran", kepts)):
        ok = [v for v in vals if v is not None]
        print(f"mean Spearman vs {episodes}-episode real means, {name}: " + (f"{np.mean(ok):+.2f} ({len(ok)})" if ok
                                                                             else "–"))
    print(f"mean real return of the kept minus that of all proposals: {np.mean(gains):+.1f} ({len(gains)} jobs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--policies", type=int, default=20)
    ap.add_argument("--data-episodes", type=int, default=4)
    ap.add_argument("--real-episodes", type=int, default=4)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--horizon", type=int, default=0, help="imagined steps (0: [model] horizon's default, the task's "
                                                           "step limit at most 1000)")
    ap.add_argument("--ledger", default="", help="a screened run's folder: re-judge its world-model jobs")
    args = ap.parse_args()
    if args.ledger:
        from_ledger(args.ledger, args.env, args.real_episodes)
        return
    res = [one(args.env, int(s), args) for s in args.seeds.split(",")]
    for name, k in (("imagined mean, all", 0), ("optimistic score, all", 1), ("among the kept", 2)):
        vals = [r[k] for r in res if r[k] is not None]
        print(f"mean Spearman, {name}: {np.mean(vals):+.2f} ({len(vals)})" if vals else f"{name}: –")


if __name__ == "__main__":
    main()
