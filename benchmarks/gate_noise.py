"""How small a difference the gate could see in finished runs: the paired spread of validation returns.

Usage: python benchmarks/gate_noise.py RUN_DIR [RUN_DIR ...] [--alpha 0.0125]

For every gate decision in the runs' ledgers, the contender's and the incumbent's validation returns on the
seeds both ran are paired; the script prints the number of gates, the median standard deviation of the paired
differences, the smallest mean difference a one-sided paired t-test at ``--alpha`` could pass with that spread
(``t(1 − alpha, n − 1) · sd / sqrt(n)``, n the median number of pairs), how many gates compared programs
that played every validation seed alike, and the largest mean difference among gates that did not promote.
"""

from __future__ import annotations

import argparse
import math
import statistics

from scipy import stats


def gate_pairs(run_dir: str) -> list[tuple[list[float], bool]]:
    """Paired validation differences (contender − incumbent, return units) of every gate decision of a run,
    each with whether the gate promoted."""
    from ratchet.ledger import EventType
    from ratchet.loop import open_ledger

    ledger = open_ledger(run_dir, readonly=True)
    try:
        events = ledger.read()
    finally:
        ledger.close()
    returns: dict[str, dict[int, float]] = {}
    for e in events:
        if e.type == EventType.EPISODES_EVALUATED and e.payload["split"] == "validation":
            returns.setdefault(e.payload["candidate_id"], {}).update(
                {ep["seed"]: ep["episode_return"] for ep in e.payload["episodes"]})
    out = []
    for e in events:
        if e.type == EventType.GATE_DECIDED:
            c, i = returns.get(e.payload["candidate_id"], {}), returns.get(e.payload["incumbent_id"], {})
            seeds = sorted(set(c) & set(i))
            if len(seeds) >= 2:
                out.append(([c[s] - i[s] for s in seeds], bool(e.payload["promoted"])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="Run directories.")
    ap.add_argument("--alpha", type=float, default=0.0125, help="One-sided level of the first gate decision.")
    args = ap.parse_args()
    gates = [g for run in args.runs for g in gate_pairs(run)]
    pairs = [d for d, _ in gates]
    spread = [statistics.stdev(d) for d in pairs if statistics.pstdev(d) > 0]
    alike = sum(1 for d in pairs if not any(d))
    if not spread:
        print(f"{len(pairs)} gates; no paired spread to measure")
        return
    sd = statistics.median(spread)
    n = int(statistics.median(len(d) for d in pairs))
    smallest = stats.t.ppf(1 - args.alpha, n - 1) * sd / math.sqrt(n)
    held = [statistics.fmean(d) for d, promoted in gates if not promoted]
    print(f"{len(pairs)} gates ({alike} between programs that played every validation seed alike); median paired sd "
          f"{sd:.1f} over {n} pairs; smallest passable mean difference at alpha {args.alpha:g}: {smallest:.1f}; "
          f"largest mean difference of a gate that did not promote: {max(held, default=math.nan):+.1f}")

if __name__ == "__main__":
    main()
