"""Ledgers written before the loop spoke two contracts (main at b1b2e9c) resume and replay unchanged.

tests/data/ledgers/<case>/legacy is a run as kill -9 left it with that commit; expected.json is what
resuming it gave with that same commit (tests/data/ledgers/make.py wrote both)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import DATA, read_events
from typer.testing import CliRunner

from ratchet.cli import app
from ratchet.execution.process import ProcessExecutor
from ratchet.loop import resume_run

LEDGERS = DATA / "ledgers"
EXPECTED = json.loads((LEDGERS / "expected.json").read_text())


#: The cmaes ledger diverges at generation 2 on this machine at every commit back to before issue 22 (checked
#: 2026-12-02), with the package versions it recorded: CMA-ES samples are not bit-identical on another CPU (the
#: ledger was made on another machine). Marked until a ledger made here, or a tolerance for it, replaces it.
CPU_BOUND = {"cmaes"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(
    reason="CMA-ES sampling differs across CPUs; see CPU_BOUND", strict=False)) if c in CPU_BOUND else c
    for c in sorted(EXPECTED)])
def test_a_legacy_ledger_resumes_to_what_its_own_version_gave_and_replays(tmp_path, case):
    runs = tmp_path / "runs"
    shutil.copytree(LEDGERS / case, runs)
    with ProcessExecutor(workers=1) as ex:
        res = resume_run(runs / "legacy", executor=ex)
    want = EXPECTED[case]
    assert (res.incumbent.id, res.stop_reason, res.test.mean, res.baseline_test.mean) == \
        (want["incumbent_id"], want["stop_reason"], want["test_mean"], want["baseline_test_mean"])
    seed = next(e.payload["episodes"][0]["seed"] for e in read_events(runs / "legacy")
                if e.type.value == "episodes_evaluated" and e.payload["candidate_id"] == res.incumbent.id)
    out = CliRunner().invoke(app, ["replay", str(runs / "legacy"), "--seed", str(seed)])
    assert out.exit_code == 0 and "match" in out.output, out.output
