"""Probe, outside ratchet: SB3 PPO on a residual correction of the windy lander heuristic, evaluated
deterministically on 100 fixed seeds (5000-5099) every --every env steps. It asks whether PPO can improve the
heuristic at all with settings ratchet's residual refiner does not try (fresh seeds every episode, a critic
warm-up with the actor frozen: Silver et al., "Residual Policy Learning", 2018). Not ratchet's code path: no
gate, no ledger; the env wrapper here is this probe's own.

Usage: python benchmarks/residual_probe.py [--params JSON] [--steps N] [--every N] [--warmup N] [--lr X] [--log-std X]
"""
import argparse
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "lunar_lander_windy"))
from policy import PARAMETERS, act
from stable_baselines3 import PPO

p = argparse.ArgumentParser()
p.add_argument("--params", default="{}")
p.add_argument("--steps", type=int, default=300_000)
p.add_argument("--every", type=int, default=50_000)
p.add_argument("--warmup", type=int, default=0)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--log-std", type=float, default=-1.5)
p.add_argument("--n-steps", type=int, default=2048)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--gamma", type=float, default=0.999)
p.add_argument("--lam", type=float, default=0.98)
p.add_argument("--eval", type=int, default=100)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()
torch.set_num_threads(1)
params = {k: v["default"] for k, v in PARAMETERS.items()}; params.update(json.loads(a.params))
KW = {"continuous": True, "enable_wind": True, "wind_power": 20.0, "turbulence_power": 2.0}

class Resid(gym.Wrapper):
    def __init__(s, e):
        super().__init__(e); s.action_space = gym.spaces.Box(-2, 2, (2,), np.float32); s.i = 0
    def reset(s, seed=None, options=None):
        s.i += 1; s.o, info = s.env.reset(seed=10_000_000 + a.seed * 1_000_000 + s.i); return s.o, info
    def step(s, c):
        b = act(s.o, params); x = np.clip(b + c, -1, 1).astype(np.float32)
        s.o, r, te, tr, info = s.env.step(x); return s.o, r, te, tr, info

def evaluate(model):
    env = gym.make("LunarLander-v3", **KW); rets = []
    for i in range(a.eval):
        o, _ = env.reset(seed=5000 + i); R = 0; done = False
        while not done:
            b = act(o, params)
            c = model.predict(o, deterministic=True)[0] if model is not None else 0
            o, r, te, tr, _ = env.step(np.clip(b + c, -1, 1).astype(np.float32)); R += r; done = te or tr
        rets.append(R)
    rets = np.array(rets); return rets.mean(), (rets >= 200).mean(), (rets < 0).mean()

t0 = time.time()
print("base", *np.round(evaluate(None), 3), flush=True)
env = gym.make("LunarLander-v3", **KW); env = Resid(env)
model = PPO("MlpPolicy", env, n_steps=a.n_steps, batch_size=a.batch, n_epochs=a.epochs, gamma=a.gamma, gae_lambda=a.lam,
            learning_rate=a.lr, seed=a.seed, device="cpu", policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]},
                                                                       "activation_fn": torch.nn.Tanh,
                                                                       "log_std_init": a.log_std})
with torch.no_grad():
    model.policy.action_net.weight.zero_(); model.policy.action_net.bias.zero_()
actor = list(model.policy.mlp_extractor.policy_net.parameters()) + list(model.policy.action_net.parameters()) + [model.policy.log_std]
if a.warmup:
    for q in actor: q.requires_grad_(False)
    model.learn(a.warmup, reset_num_timesteps=False)
    for q in actor: q.requires_grad_(True)
    print("warmup done", a.warmup, "vf explained", model.logger.name_to_value.get("train/explained_variance"), flush=True)
done = 0
while done < a.steps:
    model.learn(a.every, reset_num_timesteps=False); done += a.every
    m, s200, crash = evaluate(model)
    print(f"{done:>8} mean {m:7.1f} >=200 {s200:.2f} crash {crash:.2f} t {time.time()-t0:.0f}s", flush=True)
