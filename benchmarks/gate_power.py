"""Gate power and level by simulation: today's fixed-n t-test vs the sequential gates (numpy only, no env).

Paired differences d = δ·σ + σ·Z on each validation seed, with Z of mean 0 and variance 1 of three shapes:
"normal" (clipped at ±4), "crash" (left-skewed, like crash-or-land returns: 0.32σ better on 90 % of seeds, a
2.85σ loss on 10 %) and "bimodal" (±0.95σ). For each shape and cap on validation seeds (n_cap):

- level: runs of D decisions on a null task (δ = 0, so every promotion is false); the share of runs with any
  promotion, with a 95 % Wilson interval (goal: ≤ α = 0.05), and the mean validation episodes per decision;
- power: the chance that a candidate better by δ is promoted as the run's 1st and as its 10th tested decision
  (every earlier decision counted, the usual case when the planner only gates promising candidates), and the
  mean validation episodes of the 1st decision.

Methods: "t-fixed" = PairedTestGate(test="t", spending="harmonic"), today's gate, reading all n_cap seeds;
"group-t" and "betting" = SequentialGate(method=...) with "every" spending, batches of 10 seeds (4 at
n_cap ≤ 16), futility (t statistic ≤ --futility-t, default 0: mean difference ≤ 0, at a look) from 20 seeds on
(8 at n_cap ≤ 16); the betting gate's range puts the lower bound of d at −L·σ. The simulation mirrors
GateSession's rules (checked against it on a sample at start-up).

Usage: python benchmarks/gate_power.py [--runs 2000] [--decisions 20] [--power-runs 2000] [--caps 12 50 100 200]
       [--futility-t 0] [--write]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import machine, write_section
from scipy import special
from scipy.stats import binomtest

from ratchet.gate import SequentialGate, betting_log_capital, group_sequential_level, spending_level

ALPHA = 0.05
SHAPES = ("normal", "crash", "bimodal")
EFFECTS = (0.2, 0.4, 0.8)


def noise(rng: np.random.Generator, shape: str, size: tuple[int, ...]) -> np.ndarray:
    """Standardised paired-difference noise (mean 0, variance ≈ 1), bounded below by −4."""
    if shape == "normal":
        return np.clip(rng.standard_normal(size), -4, 4)
    if shape == "crash":
        crash = rng.random(size) < 0.1
        return np.where(crash, -2.85, 0.3167) + np.clip(0.316 * rng.standard_normal(size), -1, 1)
    if shape == "bimodal":
        return np.where(rng.random(size) < 0.5, -0.95, 0.95) + np.clip(0.3 * rng.standard_normal(size), -1, 1)
    raise ValueError(shape)


def design(cap: int) -> tuple[int, int]:
    """(batch, min_episodes) for a cap."""
    return (4, 8) if cap <= 16 else (10, 20)


def sequential(d: np.ndarray, levels: np.ndarray, method: str, cap: int, lower: float,
               futility_t: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised SequentialGate: d (m, cap), levels (m,) → (promoted, episodes used)."""
    m = d.shape[0]
    batch, min_eps = design(cap)
    looks = list(range(batch, cap, batch)) + [cap]
    promoted, used, alive = np.zeros(m, bool), np.full(m, cap), np.ones(m, bool)
    cs, css = np.cumsum(d, 1), np.cumsum(d * d, 1)
    if method == "betting":
        max_log_k = np.maximum.accumulate(betting_log_capital(d / -lower), axis=1)
    prev = 0
    for n in looks:
        mean = cs[:, n - 1] / n
        var = np.maximum(css[:, n - 1] - n * mean ** 2, 0) / (n - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(var > 0, mean / np.sqrt(var / n), np.sign(mean) * np.inf)
        t = np.nan_to_num(t, nan=0.0, posinf=np.inf, neginf=-np.inf)
        if method == "betting":
            crossed = max_log_k[:, n - 1] >= np.log(1 / levels)
        else:
            p = np.where(var > 0, special.stdtr(n - 1, -t), np.where(mean > 0, 0.0, 1.0))
            crossed = p < np.array([group_sequential_level(a, n, prev, cap) for a in levels])
        win = alive & crossed & (mean > 0)
        stop = win | (alive & (n >= cap)) | (alive & (n >= min_eps) & (t <= futility_t))
        promoted |= win
        used[alive & stop] = n
        alive &= ~stop
        prev = n
    return promoted, used


def fixed_t(d: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = d.shape[1]
    mean, sd = d.mean(1), d.std(1, ddof=1)
    p = special.stdtr(n - 1, -mean / (sd / np.sqrt(n)))
    return (p < levels) & (mean > 0), np.full(d.shape[0], n)


def simulate(rng: np.random.Generator, method: str, shape: str, delta: float, cap: int, runs: int, decisions: int,
             lower: float = -4.0, futility_t: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Runs of ``decisions`` decisions with true gain δ (σ units): (promoted, episodes), each (runs, decisions)."""
    promoted, used = np.zeros((runs, decisions), bool), np.zeros((runs, decisions), int)
    contested = np.zeros(runs, int)
    for k in range(decisions):
        d = delta + noise(rng, shape, (runs, cap))
        if method == "t-fixed":
            levels = ALPHA / (2 * (contested + 1) * (contested + 2))  # spending_level(.., "harmonic")
            promoted[:, k], used[:, k] = fixed_t(d, levels)
            contested += d.mean(1) > 0
        else:
            levels = np.full(runs, spending_level(ALPHA, k + 1, "every"))
            promoted[:, k], used[:, k] = sequential(d, levels, method, cap, lower, futility_t)
    return promoted, used


def self_check(futility_t: float) -> None:
    """The vectorised simulation agrees with GateSession decision by decision."""
    rng = np.random.default_rng(99)
    for method in ("betting", "group-t"):
        for cap in (12, 50):
            d = 0.5 + noise(rng, "crash", (100, cap))
            batch, min_eps = design(cap)
            gate = SequentialGate(ALPHA, method, batch, min_eps, return_range=(0.0, 4.0), futility_t=futility_t)
            got = sequential(d, np.full(100, spending_level(ALPHA, 3, "every")), method, cap, -4.0, futility_t)
            for i, row in enumerate(d):
                s = gate.start(3, cap)
                while (b := s.next_batch_size()) > 0:
                    s.add(row[s.n:s.n + b])
                dec = s.decision()
                if (dec.promoted, dec.episodes_used) != (got[0][i], got[1][i]):
                    raise SystemExit(f"simulation disagrees with GateSession: {method} cap {cap} row {i}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000, help="null runs per setting")
    ap.add_argument("--decisions", type=int, default=20, help="gate decisions per null run")
    ap.add_argument("--power-runs", type=int, default=2000, help="simulated decisions per effect size")
    ap.add_argument("--caps", type=int, nargs="+", default=[12, 50, 100, 200])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--futility-t", type=float, default=0.0, help="SequentialGate futility_t (0: mean ≤ 0)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    self_check(args.futility_t)
    rng = np.random.default_rng(args.seed)
    methods = [("t-fixed", "t-fixed", -4.0), ("group-t", "group-t", -4.0),
               ("betting L=4σ", "betting", -4.0), ("betting L=8σ", "betting", -8.0)]
    rows, t0 = [], time.perf_counter()
    for shape in SHAPES:
        for cap in args.caps:
            for name, method, lower in methods:
                prom, used = simulate(rng, method, shape, 0.0, cap, args.runs, args.decisions, lower, args.futility_t)
                k = int(prom.any(1).sum())
                ci = binomtest(k, args.runs).proportion_ci(method="wilson")
                cells = [shape, str(cap), name, f"{k / args.runs:.3f} ({ci.low:.3f}–{ci.high:.3f})",
                         "**no**" if ci.low > ALPHA else ("yes" if k / args.runs <= ALPHA else "within CI"),
                         f"{used.mean():.1f}"]
                for delta in EFFECTS:
                    p, u = simulate(rng, method, shape, delta, cap, args.power_runs, 10, lower, args.futility_t)
                    cells.append(f"{p[:, 0].mean():.2f} / {p[:, 9].mean():.2f} ({u[:, 0].mean():.0f})")
                rows.append("| " + " | ".join(cells) + " |")
                print(rows[-1], flush=True)
    head = ("| noise | n_cap | method | false-promotion rate per run (95 % Wilson CI) | ≤ α "
            "| episodes per null decision | "
            + " | ".join(f"power +{d}σ: 1st / 10th decision (episodes, 1st)" for d in EFFECTS)
            + " |\n|" + "---|" * (6 + len(EFFECTS)))
    table = head + "\n" + "\n".join(rows)
    print(table)
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.write:
        write_section("Gate power and level (simulation)",
                      f"Command: `python benchmarks/gate_power.py --runs {args.runs} --decisions {args.decisions} "
                      f"--power-runs {args.power_runs} --caps {' '.join(map(str, args.caps))}"
                      f"{f' --futility-t {args.futility_t:g}' if args.futility_t else ''} --write` "
                      f"(numpy simulation of paired differences in σ units, no env; α = 0.05; "
                      f"{args.runs} null runs of {args.decisions} decisions per row, {args.power_runs} decisions per "
                      "effect size; see the script's docstring for the noise shapes and settings).\n\n"
                      f"Machine: {machine()}\n\n{table}")


if __name__ == "__main__":
    main()
