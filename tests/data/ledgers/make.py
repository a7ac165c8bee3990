"""Writes the ledgers of tests/test_legacy_ledgers.py with the ratchet of the commit checked out.

Usage, from a checkout of the commit the ledgers stand for (b1b2e9c, main before "Two contracts the loop
speaks"), with a venv where ratchet is installed:

    PYTHONPATH=src:tests python tests/data/ledgers/make.py OUT_DIR

For each case it leaves OUT_DIR/<case>/ (an interrupted run: the ledger as a kill -9 left it) and records in
OUT_DIR/expected.json what resuming it with that same commit gives (the resumed copy is thrown away).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from conftest import DATA, RecordingExecutor, SimulatedKill, make_spec_dir

from ratchet.execution.process import ProcessExecutor
from ratchet.loop import resume_run, start_run
from ratchet.spec import load_spec


def _dagger_spec(root: Path) -> Path:
    sys.path.insert(0, str(DATA.parent))
    from test_dagger import _spec_dir

    root.mkdir(parents=True, exist_ok=True)
    return _spec_dir(root, kind="dagger")


class _DieInJob(ProcessExecutor):
    def __init__(self, n: int) -> None:
        super().__init__(workers=1)
        self.n, self.jobs = n, 0

    def train(self, task, job, timeout_s=3600.0):
        self.jobs += 1
        if self.jobs == self.n:
            raise SimulatedKill("killed during a training job")
        return super().train(task, job, timeout_s)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    work = out / "_work"
    expected = {}
    cases = {
        "cmaes": (lambda: load_spec(make_spec_dir(work / "cmaes", budget={"env_steps": 30_000},
                                                  gate={"validation_episodes": 10}, test={"episodes": 10},
                                                  execution={"workers": 1})),
                  lambda: RecordingExecutor(ProcessExecutor(workers=1), die_after=120)),
        "dagger": (lambda: load_spec(_dagger_spec(work / "dagger")), lambda: _DieInJob(2)),
    }
    for name, (spec_of, killer) in cases.items():
        runs = out / name
        shutil.rmtree(runs, ignore_errors=True)
        ex = killer()
        try:
            start_run(spec_of(), runs, "legacy", executor=ex)
        except SimulatedKill:
            pass
        finally:
            (getattr(ex, "inner", ex)).close()
        copy = work / f"{name}-resumed"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(runs, copy)
        with ProcessExecutor(workers=1) as again:
            res = resume_run(copy / "legacy", executor=again)
        expected[name] = {"incumbent_id": res.incumbent.id, "stop_reason": res.stop_reason,
                          "test_mean": res.test.mean, "baseline_test_mean": res.baseline_test.mean}
    shutil.rmtree(work)
    (out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
