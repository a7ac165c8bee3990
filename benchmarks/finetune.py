"""PPO fine-tuning (issue 10 §5): training overhead inside ratchet, and gated fine-tuning vs plain training.

``overhead``: env steps per second of one ``ppo`` training job in ratchet's sandboxed training process
(process start, imports, sandbox, weights in and out included) vs Stable-Baselines3's PPO alone on the
same settings in a fresh Python process (imports included, and learn() alone). Goal: time ratio ≤ 1.1.

``gated``: examples/lunar_lander_finetune refined by ratchet vs the same model.zip trained further by
plain SB3 PPO for the same env steps, on the run's test seeds; plain PPO's periodic checkpoints are
each evaluated on those seeds too. Goal: ratchet's final test mean ≥ plain PPO's, and never below the
start.

``scratch`` (issue 10 §5, residual vs learning from scratch): SB3 PPO from scratch with RL Zoo's
LunarLanderContinuous hyperparameters on examples/lunar_lander_windy's env, evaluated every ``--every``
env steps on the windy run's test seeds (run seed 0, 200 seeds), up to ``--max-env-steps`` or
``--max-minutes``; and, with ``--cmaes``, CMA-ES on the heuristic's constants (the same example as a
``program`` policy) at ``--cmaes-budget`` env steps, the residual run's budget.

Usage: python benchmarks/finetune.py overhead [--env-steps N] [--write]
       python benchmarks/finetune.py gated [--seeds 0,1,2] [--budget N] [--test-episodes N]
                                     [--refiner-set KEY=VALUE ...] [--set SECTION.KEY=VALUE ...] [--write]
       python benchmarks/finetune.py scratch [--max-env-steps N] [--max-minutes M] [--every N] [--cmaes] [--write]
``--jsonl PATH`` appends each result as it arrives (a cut-off run keeps its numbers).
Needs the rl extra.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lunar_lander_finetune"

_SB3_ALONE = """
import json, sys, time
t0 = time.perf_counter()
import torch, gymnasium as gym
from stable_baselines3 import PPO
torch.set_num_threads(1)
env_id, steps, n_steps, hidden, seed = json.loads(sys.stdin.read())
model = PPO("MlpPolicy", gym.make(env_id), n_steps=n_steps, seed=seed, device="cpu",
            policy_kwargs={"net_arch": {"pi": hidden, "vf": [64, 64]}})
t1 = time.perf_counter()
model.learn(steps)
t2 = time.perf_counter()
print(json.dumps([t2 - t0, t2 - t1, model.num_timesteps]))
"""


def overhead(args: argparse.Namespace) -> str:
    from ratchet.execution.process import ProcessExecutor
    from ratchet.execution.training import TrainingJob
    from ratchet.ledger.artifacts import digest
    from ratchet.policies import mlp
    from ratchet.policy import Candidate
    from ratchet.refiners.ppo import PPOSettings
    from ratchet.task import GymTask

    env_id, hidden, n_steps, seed = "LunarLander-v3", [64, 64], 2048, 0
    task = GymTask(env_id)
    env = task.make_env()
    net = mlp.init_weights(env.observation_space, env.action_space, hidden=hidden, seed=seed).to_bytes()
    parent = Candidate.create("", {}, kind="mlp", artifacts={"weights": digest(net)})
    settings = PPOSettings(env_steps=args.env_steps, checkpoints=1, n_steps=n_steps, seeds=16)
    rows = []
    with ProcessExecutor(workers=1) as ex:
        for r in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", _SB3_ALONE], capture_output=True, text=True, check=True,
                                 input=json.dumps([env_id, settings.job_env_steps, n_steps, hidden, seed]))
            alone_total, alone_learn, steps = json.loads(out.stdout.strip().splitlines()[-1])
            job = TrainingJob("ppo", parent, {**settings.model_dump(mode="json"), "seed": seed},
                              tuple(range(16)), settings.job_env_steps, {digest(net): net})
            t0 = time.perf_counter()
            res = ex.train(task, job, 3600)
            ratchet_s = time.perf_counter() - t0
            assert res.error is None, res.error
            rows.append((steps, alone_total, alone_learn, ratchet_s))
    med = lambda i: float(np.median([row[i] for row in rows]))
    steps = rows[0][0]
    return (f"Command: `python benchmarks/finetune.py overhead --env-steps {args.env_steps} --repeats {args.repeats}"
            f"{' --write' if args.write else ''}` ({env_id}, MLP 64-64, n_steps {n_steps}, SB3 PPO defaults otherwise, "
            f"one torch thread; median of {args.repeats}).\n\nMachine: {machine()}\n\n"
            "| env steps | SB3 alone, fresh process (s) | SB3 learn() only (s) | ratchet training job (s) | "
            "env steps/s SB3 alone | env steps/s ratchet | time ratio vs SB3 process (goal ≤ 1.10) | vs learn() only |\n"
            "|---|---|---|---|---|---|---|---|\n"
            f"| {steps:,} | {med(1):.1f} | {med(2):.1f} | {med(3):.1f} | {steps / med(1):,.0f} | {steps / med(3):,.0f} | "
            f"{med(3) / med(1):.2f} | {med(3) / med(2):.2f} |\n")


_EVALUATE = """
def evaluate(model, env_id, env_kwargs, test_seeds):
    # Deterministic returns on test_seeds, all episodes stepped together (one batched forward pass a step).
    import numpy as np, gymnasium as gym
    envs = [gym.make(env_id, **env_kwargs) for _ in test_seeds]
    obs = [e.reset(seed=s)[0] for e, s in zip(envs, test_seeds)]
    totals, alive = [0.0] * len(envs), list(range(len(envs)))
    while alive:
        acts = model.predict(np.stack([obs[i] for i in alive]), deterministic=True)[0]
        still = []
        for i, a in zip(alive, acts):
            obs[i], r, te, tr, _ = envs[i].step(a)
            totals[i] += float(r)
            if not (te or tr):
                still.append(i)
        alive = still
    return totals
"""

_PLAIN = _EVALUATE + """
import json, sys
import numpy as np, torch, gymnasium as gym
from stable_baselines3 import PPO
torch.set_num_threads(1)
model_path, budget, every, test_seeds, seed = json.loads(sys.stdin.read())
score = lambda m: float(np.mean(evaluate(m, "LunarLander-v3", {}, test_seeds)))
model = PPO.load(model_path, env=gym.make("LunarLander-v3"), device="cpu", seed=seed)
done = model.num_timesteps  # the zip's own count (its 300 k env steps of training so far)
rows = [(0, score(model))]
print(json.dumps(rows[-1]), flush=True)
while model.num_timesteps - done < budget:
    model.learn(min(every, budget - (model.num_timesteps - done)), reset_num_timesteps=False)
    rows.append((int(model.num_timesteps - done), score(model)))
    print(json.dumps(rows[-1]), flush=True)
print(json.dumps(rows))
"""


def _spec(example: Path, seed: int, overrides: list[str], refiner_sets: list[str]):
    """The example's spec with ``--set`` overrides and ``--refiner-set`` ones on its first ``[[refiners]]`` table."""
    import tomllib

    from ratchet.spec import apply_overrides, spec_from_dict

    data = apply_overrides(tomllib.loads((example / "ratchet.toml").read_text()), overrides)
    data["seed"] = seed
    table = dict(data["refiners"][0])
    for item in refiner_sets:
        key, _, raw = item.partition("=")
        table[key.strip()] = tomllib.loads(f"v = {raw.strip()}")["v"]
    data["refiners"] = [table, *data["refiners"][1:]]
    return spec_from_dict(data, example.resolve(), str(example / "ratchet.toml"))


def _append(path: str | None, row: dict) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def gated(args: argparse.Namespace) -> str:
    records: list[dict] = []
    if args.from_jsonl:  # render the table of a run already made (its --jsonl file)
        records = [r for r in map(json.loads, Path(args.from_jsonl).read_text().splitlines()) if r["mode"] == "gated"]
    else:
        for seed in [int(s) for s in args.seeds.split(",")]:
            records += _gated_seed(args, seed)
    return _gated_table(args, records)


def _gated_seed(args: argparse.Namespace, seed: int) -> list[dict]:
    from ratchet.loop import start_run

    spec = _spec(EXAMPLE, seed, [f"budget.env_steps={args.budget}", f"test.episodes={args.test_episodes}", *args.set],
                 args.refiner_set)
    gens: list[dict] = []

    def progress(p: dict) -> None:
        gens.append({"promoted": bool(p.get("promoted")), "env_steps": p["usage"].env_steps,
                     "training_env_steps": p["usage"].training_env_steps})

    with tempfile.TemporaryDirectory() as runs:
        t0 = time.perf_counter()
        res = start_run(spec, runs, f"ft{seed}", progress=progress)
        ratchet_s = time.perf_counter() - t0
    used = gens[-1] if gens else {"env_steps": 0, "training_env_steps": 0}
    mine = {"mode": "gated", "side": "ratchet", "seed": seed, "start": res.baseline_test.mean, "final": res.test.mean,
            "promotions": sum(g["promoted"] for g in gens), "generations": len(gens), "stop": res.stop_reason,
            "seconds": ratchet_s, **used}
    _append(args.jsonl, mine)
    if args.side == "ratchet":
        return [mine]
    test_seeds = [ep.seed for ep in res.test.episodes]
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PLAIN], capture_output=True, text=True, check=True,
                         input=json.dumps([str(EXAMPLE / "model.zip"), args.budget, args.every, test_seeds, seed]))
    plain = json.loads(out.stdout.strip().splitlines()[-1])
    theirs = {"mode": "gated", "side": "plain", "seed": seed, "start_here": plain[0][1], "checkpoints": plain[1:],
              "seconds": time.perf_counter() - t0}
    _append(args.jsonl, theirs)
    return [mine, theirs]


def _gated_table(args: argparse.Namespace, records: list[dict]) -> str:
    lines, sums = [], []
    for r in (r for r in records if r["side"] == "ratchet"):
        p = next((q for q in records if q["side"] == "plain" and q["seed"] == r["seed"]), None)
        if p is None:  # a cut-off run: the plain side of this seed never finished
            continue
        cps, start = p["checkpoints"], r["start"]
        worse = sum(1 for _, m in cps if m < start)
        at = min(cps, key=lambda c: abs(c[0] - r["env_steps"]))  # plain's checkpoint nearest ratchet's env steps
        sums.append((start, r["final"], at[1], cps[-1][1], worse, len(cps)))
        lines.append(f"| {r['seed']} | {start:.1f} | {r['final']:.1f} | {r['promotions']} / {r['generations']} | "
                     f"{r['env_steps']:,} ({r['training_env_steps']:,}) | {at[1]:.1f} ({at[0]:,}) | {cps[-1][1]:.1f} "
                     f"({cps[-1][0]:,}) | {worse} / {len(cps)} | {', '.join(f'{m:.0f}' for _, m in cps)} | "
                     f"{r['seconds']:.0f} / {p['seconds']:.0f} |")
    if sums:
        m = np.mean(sums, axis=0)
        lines.append(f"| mean | {m[0]:.1f} | {m[1]:.1f} | | | {m[2]:.1f} | {m[3]:.1f} | "
                     f"{sum(x[4] for x in sums)} / {sum(x[5] for x in sums)} | | |")
    extra = "".join(f" --set {o}" for o in args.set) + "".join(f" --refiner-set {o}" for o in args.refiner_set)
    return (f"Command: `python benchmarks/finetune.py gated --seeds {args.seeds} --budget {args.budget} --every {args.every} "
            f"--test-episodes {args.test_episodes}{extra}{' --write' if args.write else ''}` (examples/lunar_lander_finetune "
            f"with [budget] env_steps = {args.budget:,} and [test] episodes = {args.test_episodes}"
            f"{' and ' + ', '.join(args.set + args.refiner_set) if extra else ''}; ratchet's budget counts its training, "
            "training-seed and validation episodes; plain: the same model.zip trained on by SB3 PPO for the same "
            f"number of env steps, all of them training, its own hyperparameters, a checkpoint every {args.every:,} "
            "env steps (whole rollouts of 2,048); every test mean on the run's test seeds, deterministic actions).\n\n"
            f"Machine: {machine()}\n\n"
            "| run seed | start: test mean | ratchet: test mean | ratchet promotions / generations | ratchet env steps "
            "used (of them PPO training) | plain PPO at about ratchet's env steps (its steps) | plain PPO: final "
            "(its steps) | plain checkpoints worse than the start | plain checkpoints' test means | wall clock ratchet "
            "/ plain (s) |\n|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


WINDY = ROOT / "examples" / "lunar_lander_windy"

_SCRATCH = _EVALUATE + """
import json, sys, time
import numpy as np, torch, gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
torch.set_num_threads(1)
env_id, env_kwargs, test_seeds, seed, every, max_steps, max_s = json.loads(sys.stdin.read())
t0 = time.perf_counter()
# RL Zoo (rl-baselines3-zoo hyperparams/ppo.yml, LunarLanderContinuous-v2): 16 envs, n_steps 1024, batch 64,
# gae_lambda 0.98, gamma 0.999, n_epochs 4, ent_coef 0.01, MlpPolicy, SB3 defaults otherwise; 1e6 env steps.
env = make_vec_env(env_id, n_envs=16, seed=seed, env_kwargs=env_kwargs)
model = PPO("MlpPolicy", env, n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4,
            ent_coef=0.01, seed=seed, device="cpu")
while model.num_timesteps < max_steps and time.perf_counter() - t0 < max_s:
    model.learn(every, reset_num_timesteps=False)
    t = evaluate(model, env_id, env_kwargs, test_seeds)
    print(json.dumps([int(model.num_timesteps), float(np.mean(t)), float(np.mean(np.asarray(t) >= 200)),
                      time.perf_counter() - t0]), flush=True)
"""


def scratch(args: argparse.Namespace) -> str:
    import tomllib

    from ratchet.loop import start_run
    from ratchet.planner import SeedSplits
    from ratchet.spec import spec_from_dict

    data = tomllib.loads((WINDY / "residual.toml").read_text())
    env_id, env_kwargs = data["task"]["env_id"], dict(data["task"]["env_kwargs"])
    data["test"] = {"episodes": args.test_episodes}  # 200, the windy run's
    test_seeds = SeedSplits(data["seed"]).seeds("test", 0, args.test_episodes)
    rows: list[list[float]] = []
    proc = subprocess.Popen([sys.executable, "-c", _SCRATCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps([env_id, env_kwargs, test_seeds, args.scratch_seed, args.every, args.max_env_steps,
                                 args.max_minutes * 60]))
    proc.stdin.close()
    for line in proc.stdout:
        row = json.loads(line)
        rows.append(row)
        _append(args.jsonl, {"mode": "scratch", "seed": args.scratch_seed, "env_steps": row[0], "test_mean": row[1],
                             "share_ge_200": row[2], "seconds": row[3]})
        print(f"scratch PPO: {row[0]:,} env steps: test mean {row[1]:.1f}, ≥ 200 {100 * row[2]:.1f} %, {row[3]:.0f} s",
              flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"scratch PPO failed (exit {proc.returncode})")
    reached = next((r[0] for r in rows if r[1] >= 250), None)
    cmaes_line = ""
    if args.cmaes:
        data.update({"name": "lunar_lander_windy_cmaes", "policy": {"kind": "program", "path": "policy.py"},
                     "refiners": [{"kind": "cmaes"}]})
        data["budget"] = {"env_steps": args.cmaes_budget}
        spec = spec_from_dict(data, WINDY.resolve(), str(WINDY / "residual.toml"))
        gens: list[bool] = []
        with tempfile.TemporaryDirectory() as runs:
            t0 = time.perf_counter()
            res = start_run(spec, runs, "cmaes", progress=lambda p: gens.append(bool(p.get("promoted"))))
            secs = time.perf_counter() - t0
        share = float(np.mean([ep.episode_return >= 200 for ep in res.test.episodes]))
        share0 = float(np.mean([ep.episode_return >= 200 for ep in res.baseline_test.episodes]))
        _append(args.jsonl, {"mode": "cmaes", "start": res.baseline_test.mean, "final": res.test.mean,
                             "share_ge_200": share, "promotions": sum(gens), "generations": len(gens),
                             "stop": res.stop_reason, "seconds": secs})
        cmaes_line = (f"| CMA-ES on the heuristic's 9 constants (program policy, [[refiners]] kind = \"cmaes\", run seed 0) | "
                      f"{args.cmaes_budget:,} (budget) | start {res.baseline_test.mean:.1f} ({100 * share0:.1f} % ≥ 200) → "
                      f"{res.test.mean:.1f} ({100 * share:.1f} % ≥ 200); {sum(gens)} promotion(s) in {len(gens)} "
                      f"generations; {secs:.0f} s |\n")
    best = max(rows, key=lambda r: r[1]) if rows else None
    table = "\n".join(f"| {r[0]:,} | {r[1]:.1f} | {100 * r[2]:.1f} % | {r[3]:.0f} |" for r in rows)
    return (f"Command: `python benchmarks/finetune.py scratch --max-env-steps {args.max_env_steps} --max-minutes "
            f"{args.max_minutes:g} --every {args.every}{' --cmaes --cmaes-budget ' + str(args.cmaes_budget) if args.cmaes else ''}"
            f"{' --write' if args.write else ''}` (SB3 PPO from scratch, RL Zoo's LunarLanderContinuous hyperparameters: "
            "16 envs, n_steps 1024, batch 64, gae_lambda 0.98, gamma 0.999, n_epochs 4, ent_coef 0.01, one torch thread, "
            f"seed {args.scratch_seed}; on examples/lunar_lander_windy's env, deterministic test returns on that run's "
            f"{len(test_seeds)} test seeds).\n\n"
            f"Machine: {machine()}\n\n"
            "| env steps | scratch PPO: test mean | ≥ 200 | wall clock (s) |\n|---|---|---|---|\n" + table + "\n\n"
            "| method | env steps to test mean ≥ 250 | result |\n|---|---|---|\n"
            f"| SB3 PPO from scratch | {f'{reached:,}' if reached else f'not reached by {rows[-1][0]:,}' if rows else '—'} | "
            f"best {best[1]:.1f} at {best[0]:,} |\n" if best else "") + cmaes_line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["overhead", "gated", "scratch"])
    ap.add_argument("--env-steps", type=int, default=20_480, help="overhead: env steps of training")
    ap.add_argument("--repeats", type=int, default=3, help="overhead: repeats (median)")
    ap.add_argument("--seeds", default="0,1,2", help="gated: run seeds")
    ap.add_argument("--budget", type=int, default=500_000, help="gated: env steps each side gets")
    ap.add_argument("--every", type=int, default=50_000, help="gated: env steps between plain PPO's checkpoints")
    ap.add_argument("--test-episodes", type=int, default=200)
    ap.add_argument("--set", action="append", default=[], help="gated: SECTION.KEY=VALUE on the example's spec")
    ap.add_argument("--refiner-set", action="append", default=[], help="gated: KEY=VALUE on its [[refiners]] table")
    ap.add_argument("--max-env-steps", type=int, default=5_000_000, help="scratch: PPO's bound")
    ap.add_argument("--max-minutes", type=float, default=60.0, help="scratch: stop PPO after the checkpoint past this")
    ap.add_argument("--scratch-seed", type=int, default=0)
    ap.add_argument("--cmaes", action="store_true", help="scratch: also run CMA-ES on the heuristic's constants")
    ap.add_argument("--cmaes-budget", type=int, default=431_551, help="scratch: CMA-ES's env-step budget")
    ap.add_argument("--jsonl", help="append each result to this JSON-lines file as it arrives")
    ap.add_argument("--from-jsonl", help="gated: print (and --write) the table of a --jsonl file instead of running")
    ap.add_argument("--side", choices=["both", "ratchet"], default="both",
                    help="gated: run both sides, or only ratchet's (e.g. to re-measure it after a change; the plain "
                         "side does not depend on ratchet's code)")
    ap.add_argument("--write", action="store_true", help="Write the table into benchmarks/RESULTS.md.")
    args = ap.parse_args()
    body = {"overhead": overhead, "gated": gated, "scratch": scratch}[args.what](args)
    print(body)
    if args.write:
        write_section({"overhead": "PPO training overhead", "gated": "Gated fine-tuning vs plain PPO",
                       "scratch": "Residual vs learning from scratch (windy lander)"}[args.what], body)


if __name__ == "__main__":
    main()
