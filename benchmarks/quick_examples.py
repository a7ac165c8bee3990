"""One run of each quick example at its benchmarks/examples.py budget, printed as JSON lines: the incumbent, its
test mean, the stop reason and every generation's gate note. Run it in two checkouts (before and after a change)
to compare decisions side by side.

Usage: python benchmarks/quick_examples.py [--runs-dir DIR]   (from the checkout's root, with its src on the path)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from ratchet.ledger import SQLiteLedger
from ratchet.loop import start_run
from ratchet.spec import load_spec

QUICK = {"cartpole": 50_000, "mountain_car_continuous": 100_000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-dir", default=None, help="Where the runs go (default: a temporary folder).")
    args = ap.parse_args()
    runs = args.runs_dir or tempfile.mkdtemp(prefix="ratchet-quick-")
    for name, budget in QUICK.items():
        t0 = time.time()
        res = start_run(load_spec(f"examples/{name}", overrides=[f"budget.env_steps={budget}"]), runs_dir=runs,
                        run_id=name)
        events = SQLiteLedger(res.run_dir / "ledger.sqlite", create=False).read()
        notes = [e.payload["gate_note"] for e in events if e.type.value == "generation_finished"]
        print(json.dumps({"example": name, "env_steps": budget, "incumbent": res.incumbent.id,
                          "test_mean": res.test.mean, "stop": res.stop_reason, "gate_notes": notes,
                          "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
