"""Run the cartpole example with the refiner kind in nudge.py (python examples/own_refiner/run.py)."""

import sys
from pathlib import Path

from ratchet import load_spec, start_run
from ratchet.refiners.registry import register_kind

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
register_kind("nudge", "nudge")
spec = load_spec(HERE.parent / "cartpole", overrides=['refiners=[{kind = "nudge", step = 0.3}]'])
result = start_run(spec, runs_dir="runs")
print(result.stop_reason, "|", result.baseline_test.mean, "->", result.test.mean)
