"""Games: exploitability of ratchet's incumbent after each promotion (Kuhn, Leduc poker) against CFR+ alone, and
Connect Four win rates against each minimax depth as first and second player.

Usage:
    python benchmarks/games.py poker [--games kuhn_poker leduc_poker] [--iterations 1000] [--algorithm pcfr+]
        [--checkpoint lower] [--seconds 120] [--write]
    python benchmarks/games.py connect_four --run RUN_DIR [--games-per-cell 50] [--write]

``poker``: a ratchet run of the ``cfr`` refiner (``--algorithm``, ``--iterations`` solver iterations per generation,
``--checkpoint`` proposed, one uninterrupted solver line, every checkpoint through the gate) on ``objective =
"exploitability"`` for ``--seconds`` of run time, and beside it OpenSpiel's CFR+ alone (its Python solver, and the
C++ ``pyspiel.CFRPlusSolver``) for the same wall clock (solver time only: its exploitability measurements are not
counted). Prints the incumbent's exploitability after each promotion with its generation, solver iterations and
seconds, and the solvers' exploitability at those seconds.

``connect_four``: reads a finished ``examples/connect_four`` run (``ratchet run examples/connect_four``) and plays its
final incumbent against random and minimax at depths 1-4 as first and as second player (``--games-per-cell``
games each, seeds of the test split), and against every earlier incumbent (the league) from both seats. Prints the
win / draw / loss table and the league check: no earlier incumbent may beat the final one (win more of their games,
both seats together, than it loses); those that win more than they lose from one seat are listed too.
Writes the tables into benchmarks/RESULTS.md (section "Games") with ``--write``.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _poker_run(game: str, refiner: dict, seconds: float, runs_dir: str) -> list[dict]:
    """A ratchet cfr run on ``game``; the incumbent after each promotion: generation, CFR iterations, seconds into
    the run, exploitability."""
    from ratchet.loop import start_run
    from ratchet.spec import spec_from_dict

    folder = Path(tempfile.mkdtemp(prefix=f"ratchet-{game}-"))
    import subprocess
    import sys

    subprocess.run([sys.executable, str(ROOT / "examples/kuhn_poker/make_policy.py"), game, str(folder / "policy.py")],
                   check=True)
    spec = spec_from_dict({"name": f"games-{game}", "seed": 0,
                           "task": {"kind": "game", "game": f"openspiel:{game}", "objective": "exploitability"},
                           "policy": {"path": "policy.py"},
                           "refiners": [{"kind": "cfr", **refiner}],
                           "planner": {"train_episodes": 1}, "gate": {"validation_episodes": 2, "max_share": 0.5},
                           "budget": {"wall_clock_s": seconds}, "test": {"episodes": 2},
                           "execution": {"workers": 1, "episode_timeout_s": 600}}, folder)
    run_id = f"{game}-{time.strftime('%H%M%S')}"
    start_run(spec, runs_dir, run_id)
    events = _events(Path(runs_dir) / run_id)
    t0 = events[0].time
    trained, at_generation = 0, {}
    for e in events:
        if e.type.value == "training_finished" and not e.payload["error"]:
            trained = e.payload["outputs"][0]["info"]["iteration"]
        if e.type.value == "generation_finished":
            at_generation[e.payload["generation"]] = trained
    start = next(e.payload for e in events if e.type.value == "episodes_evaluated" and e.payload["split"] == "validation")
    rows = [{"generation": 0, "iterations": 0, "seconds": 0.0, "exploitability": -start["summary"]["mean"]}]
    for e in events:
        if e.type.value == "incumbent_changed":
            g = e.payload["generation"]
            rows.append({"generation": g, "iterations": at_generation.get(g, trained), "seconds": e.time - t0,
                         "exploitability": -e.payload["validation_mean"]})
    return rows


def _events(run_dir: Path) -> list:
    from ratchet.ledger import SQLiteLedger
    from ratchet.loop import LEDGER_FILE

    ledger = SQLiteLedger(run_dir / LEDGER_FILE, create=False)
    try:
        return ledger.read()
    finally:
        ledger.close()


def _solver_curve(game_name: str, seconds: float, cpp: bool, times: list[float]) -> list[tuple[float, int, float]]:
    """CFR+ alone: (seconds, iterations, exploitability) at doubling iteration counts within ``seconds`` of solver
    time, and at each of ``times``: there, the average policy after the iteration that crosses that time (credited
    to it: the solver gets the benefit of the doubt)."""
    import pyspiel
    from open_spiel.python.algorithms import cfr, exploitability

    game = pyspiel.load_game(game_name)
    solver = pyspiel.CFRPlusSolver(game) if cpp else cfr.CFRPlusSolver(game)
    pending = sorted(t for t in times if 0 < t)
    out, it, spent, mark = [], 0, 0.0, 1
    while spent < seconds or pending:
        t = time.perf_counter()
        solver.evaluate_and_update_policy()
        spent += time.perf_counter() - t
        it += 1
        crossed = [x for x in pending if x <= spent]
        pending = [x for x in pending if x > spent]
        if it == mark or crossed:
            value = float(pyspiel.exploitability(game, solver.average_policy()) if cpp
                          else exploitability.exploitability(game, solver.average_policy()))
            out += [(x, it, value) for x in crossed]
            if it == mark:
                out.append((spent, it, value))
                mark *= 2
    return sorted(out)


def poker(args: argparse.Namespace) -> str:
    parts = []
    for game in args.games:
        refiner = {"iterations": args.iterations, "algorithm": args.algorithm, "checkpoint": args.checkpoint}
        rows = _poker_run(game, refiner, args.seconds, args.runs_dir)
        times = [r["seconds"] for r in rows] + [args.seconds]
        py = _solver_curve(game, args.seconds, False, times)
        cc = _solver_curve(game, args.seconds, True, times)

        def point(curve, s):
            done = [x for x in curve if x[0] <= s]
            return done[-1] if done else None

        def at(curve, s):
            p = point(curve, s)
            return f"{p[2]:.4g} ({p[1]} it)" if p else "–"

        lines = [(f"### {game}: ratchet cfr ({args.iterations} {args.algorithm} iterations per generation, "
                  f"checkpoint: {args.checkpoint}), {args.seconds:g} s of run time"),
                 "", (f"| promotion | generation | {args.algorithm} iterations | run time (s) | exploitability | "
                 "CFR+ alone (Python) at that time | CFR+ alone (C++) at that time |"), "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(rows):
            lines.append(f"| {i} | {r['generation']} | {r['iterations']} | {r['seconds']:.1f} | "
                         f"{r['exploitability']:.4g} | {at(py, r['seconds'])} | {at(cc, r['seconds'])} |")
        rises = sum(b["exploitability"] > a["exploitability"] for a, b in itertools.pairwise(rows))
        beaten = [r["exploitability"] <= p[2] for r in rows[1:] if (p := point(cc, r["seconds"]))]
        lines.append(f"\nRises from one promotion to the next: {rises}. Promotions at or below C++ CFR+ at that time: "
                     f"{sum(beaten)} of {len(beaten)}. Solver alone after {args.seconds:g} s: "
                     f"Python {at(py, args.seconds)}, C++ {at(cc, args.seconds)}.")
        parts.append("\n".join(lines))
        print(parts[-1], flush=True)
    return "\n\n".join(parts)


def connect_four(args: argparse.Namespace) -> str:
    """Every ``--run``'s table, one after the other."""
    return "\n\n".join(_connect_four_run(Path(run), args.games_per_cell) for run in args.run)


def _connect_four_run(run: Path, games_per_cell: int) -> str:
    from ratchet.execution import Job
    from ratchet.execution.process import ProcessExecutor
    from ratchet.planner import SeedSplits
    from ratchet.tasks import task_from_dict
    from ratchet.tasks.game import GameTask, Opponent

    events = _events(run)
    started = next(e.payload for e in events if e.type.value == "run_started")
    task = task_from_dict(started["task"])
    assert isinstance(task, GameTask)
    from ratchet.ledger.projection import project

    state = project(events)
    chain = [e.payload for e in events if e.type.value == "incumbent_changed"]
    final_id = state.incumbent_id
    earlier = [c["from"] for c in chain]
    candidate = state.candidate

    final = candidate(final_id)
    seeds = SeedSplits(int(started["spec"].get("seed", 0))).seeds("test", 10_000, games_per_cell)
    bots = [o for o in task.opponents if o.candidate_id is None]
    # named as the run's league names them (league1: the start policy)
    league = [Opponent(f"league{i + 1}", f"<{cid}>", candidate(cid).source, _plain(candidate(cid).params), cid)
              for i, cid in enumerate(earlier)]
    table = []
    ex = ProcessExecutor(episode_timeout_s=300)
    try:
        for opp in [*bots, *league]:
            for seat in (0, 1):
                single = GameTask(task.game, (opp,), {s: (opp.name,) for s in ("train", "validation", "test")},
                                  (seat,), task.illegal, task.max_moves)
                eps = ex.run(single, [Job(final, s) for s in seeds])
                r = np.array([e.episode_return for e in eps])
                table.append((opp.name, seat, int((r > 0).sum()), int((r == 0).sum()), int((r < 0).sum()),
                              sum(e.error is not None for e in eps)))
                print(f"{run.name}: against {opp.name} as {'first' if seat == 0 else 'second'} player: "
                      f"{table[-1][2]} W / {table[-1][3]} D / {table[-1][4]} L ({table[-1][5]} errored)", flush=True)
    finally:
        ex.close()
    title = (f"### Connect Four: the final incumbent {final_id} of `{run}` (run seed {started['spec'].get('seed', 0)}, "
             f"{len(chain)} promotion(s); league1 is the start policy)")
    lines = [title, "",
             "| opponent | candidate plays | wins | draws | losses | errored |", "|---|---|---|---|---|---|"]
    for name, seat, w, d, lo, err in table:
        lines.append(f"| {name} | {'first' if seat == 0 else 'second'} | {w} | {d} | {lo} | {err} |")
    net: dict[str, int] = {}
    for name, seat, w, d, lo, err in table:
        if name.startswith("league"):
            net[name] = net.get(name, 0) + w - lo
    beaten = sorted(name for name, v in net.items() if v < 0)
    by_seat = sorted({name for name, seat, w, d, lo, err in table if name.startswith("league") and lo > w})
    lines.append(f"\nEarlier incumbents that beat the final one (the final loses more games than it wins over both "
                 f"seats): {', '.join(beaten) or 'none'}. Those that win more games than they lose from one seat: "
                 f"{', '.join(by_seat) or 'none'}.")
    return "\n".join(lines)


def _plain(params) -> dict:
    """Parameter values as JSON-ready numbers and lists (an opponent's params)."""
    return {k: np.asarray(v).tolist() for k, v in params.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("poker")
    p.add_argument("--games", nargs="*", default=["kuhn_poker", "leduc_poker"])
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--algorithm", default="pcfr+", choices=["pcfr+", "cfr+", "dcfr", "cfr"])
    p.add_argument("--checkpoint", default="lower", choices=["lower", "average", "current"])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--runs-dir", default=str(ROOT / "runs" / "benchmarks"))
    p.add_argument("--write", action="store_true")
    c = sub.add_parser("connect_four")
    c.add_argument("--run", required=True, nargs="+", help="finished examples/connect_four run directories")
    c.add_argument("--games-per-cell", type=int, default=50)
    c.add_argument("--write", action="store_true")
    args = ap.parse_args()
    body = poker(args) if args.what == "poker" else connect_four(args)
    if args.write:
        import sys

        from _common import machine, write_section

        write_section(f"Games: {args.what}", f"Command: `python benchmarks/games.py {' '.join(sys.argv[1:])}`\n\n"
                                             f"Machine: {machine()}\n\n{body}")


if __name__ == "__main__":
    main()
