"""A pool of models, money as a budget, and edits that land (issue 44), against the tests' stand-in endpoint.

The endpoint is the stand-in server the tests use (:class:`ratchet.refiners.standin.StandIn`: a real HTTP server on
127.0.0.1 speaking chat completions), answering as the tests of ``tests/test_llm_client.py`` script it; the run is the tests'
CartPole fixture (``tests/data/cartpole_linear.py``, all weights 0) with one ``llm`` refiner, 2 sandboxed workers.

- *bandit*: a pool of two models, a cheap one (0.15 / 0.6 per million tokens) whose diffs never apply and a dear one
  (3 / 15) whose edits gain; 2 requests per generation, 2 at once, 20 in all: the share of them the useful model got,
  and what they cost.
- *money*: the same pool, 4 requests at once, ``[budget] money = 0.1``: what the run spent, its largest single
  request's cost, and why it stopped (the cap is never exceeded).
- *fallback*: a model whose diffs never apply (it writes a whole file when asked for one, and a diff that applies
  when shown why its last one did not), 20 requests at ``on_unusable`` = skip, retry, rewrite: the share of answers
  that became candidates, and the HTTP requests that took.

Usage: python benchmarks/llm_pool.py [--seeds 0,1,2,3,4] [--write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import machine, write_section

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import events_of, read_events
from test_llm_client import never_applies, parent, pool_respond, two_models
from test_structural import TASK_FACTS, structural_spec

from ratchet.ledger import EventType
from ratchet.loop import start_run
from ratchet.refiners.llm import LLMRefiner, LLMSettings
from ratchet.refiners.standin import StandIn


def bandit(seed: int, folder: Path) -> dict:
    server = StandIn(respond=pool_respond)
    try:
        llm = {"kind": "llm", "models": two_models(server.url), "proposals": 2, "variants": 1, "concurrency": 2,
               "budget_requests": 20, "retries": 0, "check_endpoint": False, "on_unusable": "skip"}
        start_run(structural_spec(folder / "b", [llm], budget={"env_steps": 300_000}, seed=seed), folder / "runs", "b")
        picks = [q["body"]["model"] for q in server.requests]
    finally:
        server.stop()
    events = read_events(folder / "runs" / "b")
    cost = sum(c.payload["cost"] for c in events_of(events, EventType.LLM_CALL))
    return {"requests": len(picks), "useful": picks.count("dear-useful"), "cost": cost}


def money(seed: int, folder: Path) -> dict:
    server = StandIn(respond=pool_respond)
    try:
        llm = {"kind": "llm", "models": two_models(server.url), "proposals": 4, "variants": 1, "concurrency": 4,
               "max_tokens": 600, "retries": 0, "check_endpoint": False}
        result = start_run(structural_spec(folder / "m", [llm], budget={"env_steps": 300_000, "money": 0.1},
                                           seed=seed), folder / "runs", "m")
    finally:
        server.stop()
    costs = [c.payload["cost"] for c in events_of(read_events(result.run_dir), EventType.LLM_CALL)]
    return {"requests": len(costs), "spent": sum(costs), "largest": max(costs), "stop": result.stop_reason}


def fallback(seed: int, mode: str) -> dict:
    server = StandIn(respond=never_applies)
    try:
        r = LLMRefiner(LLMSettings(base_url=server.url, model="m", proposals=20, variants=1, concurrency=4,
                                   on_unusable=mode, backoff_s=0.0), TASK_FACTS, sleep=lambda s: None)
        out = r.propose(parent(), None, np.random.default_rng(seed))
        answers = sum(len(q["body"]["messages"]) == 2 for q in server.requests)
        return {"answers": answers, "candidates": len(out), "http": len(server.requests)}
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3,4", help="Comma-separated run seeds.")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        b = [bandit(s, Path(tmp) / f"b{s}") for s in seeds]
        m = [money(s, Path(tmp) / f"m{s}") for s in seeds]
    f = {mode: [fallback(s, mode) for s in seeds] for mode in ("skip", "retry", "rewrite")}
    table = "| run seed | bandit: useful model's requests of 20 | their cost (USD) | money: spent of 0.1 USD (requests) " \
            "| largest request (USD) | stopped |\n|---|---|---|---|---|---|\n"
    for s, x, y in zip(seeds, b, m):
        table += (f"| {s} | {x['useful']} of {x['requests']} ({100 * x['useful'] / x['requests']:.0f} %) | "
                  f"{x['cost']:.4f} | {y['spent']:.4f} ({y['requests']}) | {y['largest']:.4f} | {y['stop'][:60]} |\n")
    table += "\n| on_unusable | answers that became candidates (all seeds) | HTTP requests per answer |\n|---|---|---|\n"
    for mode, rows in f.items():
        answers, cands, http = (sum(r[k] for r in rows) for k in ("answers", "candidates", "http"))
        table += f"| {mode} | {cands} of {answers} ({100 * cands / answers:.0f} %) | {http / answers:.2f} |\n"
    print(table)
    if args.write:
        write_section("A pool of models, a money budget and edits that land (stand-in endpoint)", (
            f"Command: `python benchmarks/llm_pool.py --seeds {args.seeds} --write` — the tests' CartPole fixture "
            "with one `llm` refiner against the tests' stand-in endpoint (see the script's doc for the three "
            "scenarios); 2 cores shared with other work.\n\n"
            f"Machine: {machine()}\n\n{table}"))


if __name__ == "__main__":
    main()
