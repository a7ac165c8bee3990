"""Train the starting model of this example: an under-trained Stable-Baselines3 PPO agent for LunarLander-v3.

300,000 env steps of PPO with SB3's default hyperparameters, seed 0, one torch thread: the agent
hovers and lands sometimes, and crashes or drifts off often. ratchet then refines it (``ratchet run .``).

    python train_start.py            # writes model.zip (about 140 KB), a few minutes on one core

Needs the ``rl`` extra: ``pip install 'policy-ratchet[rl]'``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import torch
from stable_baselines3 import PPO

ENV_STEPS = 300_000
SEED = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=ENV_STEPS, help="env steps of PPO training")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", default=str(Path(__file__).with_name("model.zip")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = PPO("MlpPolicy", gym.make("LunarLander-v3"), seed=args.seed, device="cpu", verbose=0)
    model.learn(args.env_steps)
    model.save(args.out)
    print(f"wrote {args.out} ({Path(args.out).stat().st_size:,} bytes) after {model.num_timesteps:,} env steps")


if __name__ == "__main__":
    main()
