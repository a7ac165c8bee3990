"""PPO fine-tuning (issue 10 §5): training overhead inside ratchet, and gated fine-tuning vs plain training.

``overhead``: env steps per second of one ``ppo`` training job in ratchet's sandboxed training process
(process start, imports, sandbox, weights in and out included) vs Stable-Baselines3's PPO alone on the
same settings in a fresh Python process (imports included, and learn() alone). Goal: time ratio ≤ 1.1.

``gated``: examples/lunar_lander_finetune refined by ratchet vs the same model.zip trained further by
plain SB3 PPO for the same env steps, on the run's test seeds; plain PPO's periodic checkpoints are
each evaluated on those seeds too. Goal: ratchet's final test mean ≥ plain PPO's, and never below the
start.

Usage: python benchmarks/finetune.py overhead [--env-steps N] [--write]
       python benchmarks/finetune.py gated [--seeds 0,1,2] [--budget N] [--test-episodes N] [--write]
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
    med = lambda i: float(np.median([row[i] for row in rows]))  # noqa: E731
    steps = rows[0][0]
    return (f"Command: `python benchmarks/finetune.py overhead --env-steps {args.env_steps} --repeats {args.repeats}"
            f"{' --write' if args.write else ''}` ({env_id}, MLP 64-64, n_steps {n_steps}, SB3 PPO defaults otherwise, "
            f"one torch thread; median of {args.repeats}).\n\nMachine: {machine()}\n\n"
            "| env steps | SB3 alone, fresh process (s) | SB3 learn() only (s) | ratchet training job (s) | "
            "env steps/s SB3 alone | env steps/s ratchet | time ratio vs SB3 process (goal ≤ 1.10) | vs learn() only |\n"
            "|---|---|---|---|---|---|---|---|\n"
            f"| {steps:,} | {med(1):.1f} | {med(2):.1f} | {med(3):.1f} | {steps / med(1):,.0f} | {steps / med(3):,.0f} | "
            f"{med(3) / med(1):.2f} | {med(3) / med(2):.2f} |\n")


_PLAIN = """
import json, sys
import numpy as np, torch, gymnasium as gym
from stable_baselines3 import PPO
torch.set_num_threads(1)
model_path, budget, every, test_seeds, seed = json.loads(sys.stdin.read())
def evaluate(model):
    env, out = gym.make("LunarLander-v3"), []
    for s in test_seeds:
        obs, _ = env.reset(seed=s); total, done = 0.0, False
        while not done:
            obs, r, te, tr, _ = env.step(model.predict(obs, deterministic=True)[0]); total += r; done = te or tr
        out.append(total)
    return float(np.mean(out))
model = PPO.load(model_path, env=gym.make("LunarLander-v3"), device="cpu", seed=seed)
rows = [(0, evaluate(model))]
while model.num_timesteps < budget:
    model.learn(min(every, budget - model.num_timesteps), reset_num_timesteps=False)
    rows.append((int(model.num_timesteps), evaluate(model)))
print(json.dumps(rows))
"""


def gated(args: argparse.Namespace) -> str:
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    lines = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        spec = load_spec(EXAMPLE, seed=seed, overrides=[f"budget.env_steps={args.budget}",
                                                         f"test.episodes={args.test_episodes}"])
        with tempfile.TemporaryDirectory() as runs:
            t0 = time.perf_counter()
            res = start_run(spec, runs, f"ft{seed}")
            ratchet_s = time.perf_counter() - t0
        test_seeds = [ep.seed for ep in res.test.episodes]
        out = subprocess.run([sys.executable, "-c", _PLAIN], capture_output=True, text=True, check=True,
                             input=json.dumps([str(EXAMPLE / "model.zip"), args.budget, args.every, test_seeds, seed]))
        plain = json.loads(out.stdout.strip().splitlines()[-1])
        start = res.baseline_test.mean
        worse = sum(1 for _, m in plain[1:] if m < start)
        lines.append(f"| {seed} | {start:.1f} | {res.test.mean:.1f} | {plain[-1][1]:.1f} | {worse} / {len(plain) - 1} | "
                     f"{', '.join(f'{m:.0f}' for _, m in plain[1:])} | {ratchet_s:.0f} |")
    return (f"Command: `python benchmarks/finetune.py gated --seeds {args.seeds} --budget {args.budget} --every {args.every} "
            f"--test-episodes {args.test_episodes}{' --write' if args.write else ''}` (examples/lunar_lander_finetune with "
            f"[budget] env_steps = {args.budget:,} and [test] episodes = {args.test_episodes}; plain: the same model.zip "
            f"trained on by SB3 PPO for the same env steps, its own hyperparameters, a checkpoint every {args.every:,} "
            "env steps; every test mean on the run's test seeds).\n\n"
            f"Machine: {machine()}\n\n"
            "| run seed | start: test mean | ratchet: test mean | plain PPO: final test mean | plain checkpoints worse "
            "than the start | plain checkpoints' test means | ratchet wall clock (s) |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["overhead", "gated"])
    ap.add_argument("--env-steps", type=int, default=20_480, help="overhead: env steps of training")
    ap.add_argument("--repeats", type=int, default=3, help="overhead: repeats (median)")
    ap.add_argument("--seeds", default="0,1,2", help="gated: run seeds")
    ap.add_argument("--budget", type=int, default=500_000, help="gated: env steps each side gets")
    ap.add_argument("--every", type=int, default=50_000, help="gated: env steps between plain PPO's checkpoints")
    ap.add_argument("--test-episodes", type=int, default=200)
    ap.add_argument("--write", action="store_true", help="Write the table into benchmarks/RESULTS.md.")
    args = ap.parse_args()
    body = overhead(args) if args.what == "overhead" else gated(args)
    print(body)
    if args.write:
        write_section("PPO training overhead" if args.what == "overhead" else "Gated fine-tuning vs plain PPO", body)


if __name__ == "__main__":
    main()
