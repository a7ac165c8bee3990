"""Evaluations spent on duplicates: the share of a run's proposal evaluations whose candidate is, in normal form,
one the run had already scored (issue 44, item 1).

Two runs per seed, on CartPole-v1 from the tests' linear policy (``tests/data/cartpole_linear.py``), gating every
generation, 2 sandboxed workers:

- ``mutate``: ``[[refiners]]`` a ``mutate`` refiner with its defaults;
- ``llm``: an ``llm`` refiner (2 requests per generation, its default 2 variants each) against the tests' stand-in
  endpoint (:class:`ratchet.refiners.standin.StandIn`, a real HTTP server on 127.0.0.1), answering each request with one of
  five whole-file rewrites picked by the request's seed: three different edits, and two of them again with other
  comments, docstrings and spacing (a model often proposes an edit it proposed before, or the same code written
  differently).

Counted from each run's ledger: every candidate proposed in a generation and evaluated on its training seeds; a
duplicate when its normal id (:func:`ratchet.proposals.normal_id`: the same program up to formatting, comments and
docstrings, with the same values; exact content for other kinds) equals that of a candidate recorded before it (the
starting policy, an earlier proposal). Rejected duplicates (``proposal_rejected`` with ``detail.duplicate_of``) cost
no episode and are shown apart.

``--ref GIT_REF`` also measures a git ref (its ``src`` exported to a temporary folder, the run made in a subprocess
with that ``src`` first on ``PYTHONPATH``); the counting always uses the working tree's :func:`normal_id`.

Usage: python benchmarks/duplicates.py [--seeds 0,1] [--env-steps 20000] [--ref REF] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICY = ROOT / "tests" / "data" / "cartpole_linear.py"

BASE = POLICY.read_text(encoding="utf-8")
EDIT_A = BASE.replace('    "w_angular_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},\n',
                      '    "w_angular_velocity": {"default": 0.0, "low": -1.0, "high": 1.0},\n'
                      '    "boost": {"default": 0.5, "low": 0.0, "high": 2.0},\n').replace(
    "    return 1 if z > 0 else 0", '    z = z + params["boost"] * observation[3]\n    return 1 if z > 0 else 0')
EDIT_B = BASE.replace("return 1 if z > 0 else 0", "return 1 if z + 0.1 * observation[2] > 0 else 0")
EDIT_C = BASE.replace("    z = (", "    lean = observation[2] + 0.5 * observation[3]\n    z = lean + (")
#: The same programs as EDIT_A and EDIT_B, written differently (comments, a docstring, spacing).
EDIT_A2 = EDIT_A.replace('    z = z + params["boost"] * observation[3]',
                         '    # push harder when the pole falls fast\n    z = z+params["boost"]*observation[3]')
EDIT_B2 = EDIT_B.replace("def act(observation, params):",
                         'def act(observation,  params):\n    """Push towards the side the pole leans to."""')
ANSWERS = [EDIT_A, EDIT_B, EDIT_A2, EDIT_C, EDIT_B2]


def spec_dict(kind: str, url: str | None, env_steps: int, seed: int) -> dict[str, Any]:
    refiner: dict[str, Any] = ({"kind": "mutate"} if kind == "mutate" else
                               {"kind": "llm", "base_url": url, "model": "stand-in", "proposals": 2, "retries": 0,
                                "budget_requests": 400})
    return {"name": f"dup-{kind}", "seed": seed, "policy": {"path": "policy.py"},
            "task": {"env_id": "CartPole-v1"}, "refiners": [refiner],
            "planner": {"train_episodes": 2}, "gate": {"validation_episodes": 8, "max_share": 0.6},
            "test": {"episodes": 5}, "budget": {"env_steps": env_steps},
            "execution": {"workers": 2, "episode_timeout_s": 30}}


def one_run(kind: str, seed: int, env_steps: int, out: Path) -> None:
    """Run one spec with the ``ratchet`` on ``sys.path`` (this process's), leaving its ledger in ``out``."""
    import importlib.util

    from ratchet.loop import start_run
    from ratchet.spec import spec_from_dict

    # the stand-in endpoint of this tree (standard library only), whatever ratchet a --ref run imports
    found = importlib.util.spec_from_file_location("_standin", ROOT / "src" / "ratchet" / "refiners" / "standin.py")
    assert found is not None and found.loader is not None
    standin = importlib.util.module_from_spec(found)
    found.loader.exec_module(standin)
    server = standin.StandIn(respond=lambda body: {"content": "Rewritten:\n```python\n" + ANSWERS[body["seed"] % 5] + "```\n"})
    try:
        d = spec_dict(kind, server.url, env_steps, seed)
        (out / "s").mkdir(parents=True)
        (out / "s" / "policy.py").write_text(BASE, encoding="utf-8")
        start_run(spec_from_dict(d, out / "s"), out / "runs", "r")
    finally:
        server.stop()


def count(run_dir: Path) -> dict[str, Any]:
    """Proposal evaluations and those spent on duplicates (normal form), from a run's ledger."""
    from ratchet.ledger import EventType
    from ratchet.ledger.sqlite import SQLiteLedger
    from ratchet.policy import Candidate
    from ratchet.proposals import normal_id

    events = SQLiteLedger(run_dir / "ledger.sqlite", readonly=True).read()
    source = next(e.payload["policy_source"] for e in events if e.type is EventType.RUN_STARTED)
    trained = {(e.payload["generation"], e.payload["candidate_id"]): len(e.payload["episodes"]) for e in events
               if e.type is EventType.EPISODES_EVALUATED and e.payload["split"] == "train"}
    seen: set[str] = set()
    n = dup = episodes = dup_episodes = 0
    for e in events:
        if e.type is not EventType.CANDIDATE_PROPOSED:
            continue
        d = dict(e.payload["candidate"])
        d["source"] = source if d["source"] is None else d["source"]
        cand, gen = Candidate.from_dict(d), e.payload["generation"]
        key = normal_id(cand)
        if (gen, cand.id) in trained:
            n += 1
            episodes += trained[(gen, cand.id)]
            if key in seen:
                dup += 1
                dup_episodes += trained[(gen, cand.id)]
        seen.add(key)
    rejected = sum(1 for e in events if e.type is EventType.PROPOSAL_REJECTED
                   and "duplicate_of" in e.payload.get("detail", {}))
    finished = next(e.payload for e in events if e.type is EventType.RUN_FINISHED)
    return {"evaluated": n, "duplicates": dup, "episodes": episodes, "dup_episodes": dup_episodes,
            "rejected": rejected, "generations": finished["generations"], "test": finished["test"]["mean"]}


def measure(code: str, src: Path, kind: str, seed: int, env_steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(src)}
        subprocess.run([sys.executable, __file__, "--one", kind, str(seed), str(env_steps), tmp], check=True, env=env,
                       cwd=ROOT)
        return {"code": code, "kind": kind, "seed": seed, **count(Path(tmp) / "runs" / "r")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--env-steps", type=int, default=20_000)
    ap.add_argument("--ref", help="a git ref to measure beside the working tree (e.g. the commit before a change)")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # internal: KIND SEED ENV_STEPS OUT
    args = ap.parse_args()
    if args.one:
        kind, seed, steps, out = args.one
        one_run(kind, int(seed), int(steps), Path(out))
        return
    sys.path.insert(0, str(ROOT / "src"))
    codes = [("working tree", ROOT / "src")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.ref:  # its src only, exported (no worktree registered)
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.ref, "src"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            codes.insert(0, (args.ref, Path(tmp) / "src"))
        for kind in ("mutate", "llm"):
            for seed in (int(s) for s in args.seeds.split(",")):
                for code, src in codes:
                    rows.append(measure(code, src, kind, seed, args.env_steps))
                    print(json.dumps(rows[-1]), flush=True)
    table = ("| code | refiner | seed | generations | proposals evaluated | of them duplicates (normal form) | "
             "training episodes on duplicates | duplicates rejected before any episode | test mean |\n"
             "|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        share = r["duplicates"] / r["evaluated"] if r["evaluated"] else 0.0
        table += (f"| {r['code']} | {r['kind']} | {r['seed']} | {r['generations']} | {r['evaluated']} | "
                  f"{r['duplicates']} ({100 * share:.0f} %) | {r['dup_episodes']} of {r['episodes']} | "
                  f"{r['rejected']} | {r['test']:.1f} |\n")
    print(table)
    if args.write:
        from _common import machine, write_section

        cmd = (f"python benchmarks/duplicates.py --seeds {args.seeds} --env-steps {args.env_steps}"
               + (f" --ref {args.ref}" if args.ref else ""))
        write_section("Evaluations spent on duplicates", (
            f"Command: `{cmd}` — CartPole-v1 from the tests' linear policy, a `mutate` run and an `llm` run against "
            "the tests' stand-in endpoint (five whole-file answers: three edits, two of them again written "
            f"differently), [budget] env_steps {args.env_steps:,}, 2 sandboxed workers, a gate every generation. A "
            "duplicate is a proposal evaluated on its training seeds whose normal form (the same program up to "
            "formatting, comments and docstrings, with the same values) the run had already recorded.\n\n"
            f"Machine: {machine()} (2 cores shared with other work: times are noisy, counts are not)\n\n{table}"))


if __name__ == "__main__":
    main()
