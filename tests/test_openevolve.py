"""OpenEvolve tasks (ratchet.tasks.openevolve): an OpenEvolve example's evaluator run in the sandbox beside the
program it scores; only its checked metrics cross back.

The vendored circle-packing example runs as published; an evaluator (or the program it runs) that crashes, hangs,
returns garbage metrics or floods its output is that candidate's recorded failure beside a good one that is
unaffected; the task survives the ledger (resume runs the stored evaluator)."""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest

from ratchet.errors import PolicyError, SpecError
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox
from ratchet.loop import start_run
from ratchet.policies.source import read_folder
from ratchet.policy import Candidate
from ratchet.spec import spec_from_dict
from ratchet.tasks import task_from_dict
from ratchet.tasks.evaluator import CandidateError
from ratchet.tasks.openevolve import MARKER, OpenEvolveTask, metrics_of

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openevolve_circle_packing"
RUN = ["sh", "-c", 'exec "$RATCHET_PYTHON" -']
TIMEOUT_S = 20.0

PROGRAM = """# EVOLVE-BLOCK-START
X = 1.5  # ratchet: x 0..4
# EVOLVE-BLOCK-END
"""

# an OpenEvolve-style evaluator: imports the program it is given and reports metrics; MODE picks a misbehaviour
EVALUATOR = """import importlib.util, os, sys, time
MODE = {mode!r}


def evaluate(program_path):
    print("lots of chatter on stdout, as OpenEvolve evaluators print")
    spec = importlib.util.spec_from_file_location("program", program_path)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    if MODE == "raise":
        raise RuntimeError("evaluator blew up")
    if MODE == "exit":
        os._exit(3)
    if MODE == "hang":
        time.sleep(1000)
    if MODE == "flood":
        big = b"9" * 65536
        while True:
            for fd in range(3, 8):
                try:
                    os.write(fd, big)
                except OSError:
                    pass
    if MODE == "nan":
        return {{"combined_score": float("nan")}}
    if MODE == "text":
        return {{"combined_score": "very high"}}
    if MODE == "missing":
        return {{"score": 1.0}}
    if MODE == "list":
        return [1.0, 2.0]
    return {{"combined_score": program.X, "validity": 1.0, "error": "text is dropped"}}
"""


def _example(directory: Path, mode: str = "good") -> tuple[OpenEvolveTask, Candidate]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "initial_program.py").write_text(PROGRAM)
    (directory / "evaluator.py").write_text(EVALUATOR.format(mode=mode))
    task = OpenEvolveTask.from_spec({"evaluator": str(directory / "evaluator.py")})
    program = read_folder(directory, [], RUN, list(task.functions), only=["initial_program.py"],
                          max_output_bytes=1 << 16)
    return task, Candidate.create(program.source, program.defaults, kind="source")


@pytest.fixture(scope="module")
def sandboxed(request):
    ex = ProcessExecutor(workers=2, episode_timeout_s=TIMEOUT_S, sandbox=Sandbox(memory_limit_mb=2048))
    request.addfinalizer(ex.close)
    return ex


def test_the_candidate_is_the_program_file_and_the_metrics_are_checked(tmp_path):
    task, cand = _example(tmp_path / "ex")
    from ratchet.policies.source import Folder

    assert sorted(Folder.from_source(cand.source).files) == ["initial_program.py"]  # not the evaluator
    assert cand.params == {"x": 1.5}
    again = task_from_dict(task.to_dict())  # the ledger's form runs the stored evaluator
    assert again.kind == "openevolve" and again.to_dict() == task.to_dict()
    assert metrics_of(f"junk\n{MARKER}\n" + '{"combined_score": 2.5, "v": 1, "e": "x", "b": true}', "combined_score") \
        == (2.5, {"v": 1.0})
    for bad in ("no marker", f"{MARKER}\nnot json", f"{MARKER}\n[1]", f"{MARKER}\n{{\"combined_score\": NaN}}",
                f"{MARKER}\n{{\"combined_score\": \"hi\"}}", f"{MARKER}\n{{}}", None):
        with pytest.raises(CandidateError):
            metrics_of(bad, "combined_score")


@pytest.mark.parametrize("mode, reason", [
    ("raise", "evaluator blew up"),
    ("exit", "exited with status 3"),
    ("hang", "timeout"),
    ("flood", "printed more than"),
    ("nan", "not a finite number"),
    ("text", "combined_score = 'very high', a str, not a number"),
    ("missing", "no number 'combined_score'"),
    ("list", "not a dict of metrics"),
])
def test_a_hostile_evaluator_or_program_is_the_candidates_recorded_failure(sandboxed, tmp_path, mode, reason):
    good_task, good = _example(tmp_path / "good")
    eps = sandboxed.run(good_task, [Job(good, 0)])
    assert eps[0].error is None and eps[0].episode_return == 1.5, eps[0].error
    assert eps[0].diagnostics["scores"] == {"combined_score": 1.5, "validity": 1.0}
    task, bad = _example(tmp_path / "bad", mode)
    eps = sandboxed.run(task, [Job(bad, 0)])
    assert eps[0].error and reason in eps[0].error, eps[0].error
    assert not eps[0].diagnostics.get("fault")  # the candidate's failure, never the task's: the run goes on
    eps = sandboxed.run(good_task, [Job(good, 1)])
    assert eps[0].error is None and eps[0].episode_return == 1.5


# new-user pass: `ratchet run` on a folder whose evaluate() raises stopped with "…the program exited with status 1: lots
# of chatter…\\nTraceback (most recent call last):\\n  File \"/tmp/ratchet-worker-…/ratchet-builds/…" cut before the
# exception; the line names it (type, message, where), on one line, with no sandbox path
@pytest.mark.parametrize("program, raised", [
    (PROGRAM, "the OpenEvolve evaluator raised RuntimeError: evaluator blew up (at evaluator.py:11 in evaluate)"),
    (PROGRAM.replace("X = 1.5", "X = 1.5 / 0"), ("the OpenEvolve evaluator raised ZeroDivisionError: float division by "
                                                "zero (at evaluator.py:9 in evaluate; initial_program.py:2 in <module>)")),
    (PROGRAM.replace("X = 1.5", "X = (1.5"), ("the OpenEvolve evaluator raised SyntaxError: '(' was never closed "
                                             "(initial_program.py, line 2) (at evaluator.py:9 in evaluate)")),
])
def test_a_start_whose_evaluator_raises_stops_naming_the_exception(tmp_path, program, raised):
    _example(tmp_path / "spec", "raise")
    (tmp_path / "spec" / "initial_program.py").write_text(program)
    d = {"name": "oe", "seed": 0, "task": {"kind": "openevolve", "evaluator": "evaluator.py"},
         "policy": {"kind": "source", "path": ".", "files": ["initial_program.py"], "run": RUN},
         "refiners": [{"kind": "cmaes", "popsize": 4}], "planner": {"train_episodes": 1},
         "gate": {"validation_episodes": 2}, "test": {"episodes": 1}, "execution": {"workers": 1}}
    result = start_run(spec_from_dict(d, tmp_path / "spec"), tmp_path / "runs", "r")
    assert f"so nothing was searched: {raised}; see the episodes" in result.stop_reason, result.stop_reason
    assert "\\n" not in result.stop_reason and "ratchet-builds" not in result.stop_reason


def test_the_spec_checks_openevolve_keys_in_one_line(tmp_path):
    with pytest.raises(SpecError, match="program and metric belong to OpenEvolve tasks"):
        spec_from_dict({"task": {"kind": "evaluator", "evaluator": "e.py", "metric": "m"}}, tmp_path)
    with pytest.raises(SpecError, match="needs evaluator"):
        spec_from_dict({"task": {"kind": "openevolve"}}, tmp_path)
    _example(tmp_path / "ex")
    with pytest.raises(PolicyError, match="files: missing.py not found"):
        read_folder(tmp_path / "ex", [], RUN, ["evaluate"], only=["missing.py"])


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_the_vendored_circle_packing_example_runs_as_published(tmp_path):
    """OpenEvolve's examples/circle_packing (evaluator.py, initial_program.py unchanged) under its ratchet.toml, on a
    tiny budget: the start program scores its published 0.9598 sum of radii (combined_score = sum / 2.635)."""
    data = tomllib.loads((EXAMPLE / "ratchet.toml").read_text())
    data["refiners"][0]["popsize"] = 2
    data["budget"] = {"episodes": 8}
    data["execution"] = {"workers": 2, "episode_timeout_s": 120.0}
    spec = spec_from_dict(data, EXAMPLE)
    result = start_run(spec, tmp_path / "runs", "r")
    assert result.incumbent is not None
    from conftest import read_events

    evals = [e for e in read_events(tmp_path / "runs" / "r") if e.type.value == "episodes_evaluated"]
    start = next(x for e in evals for x in e.payload["episodes"])
    assert start["error"] is None and abs(start["episode_return"] - 0.95979 / 2.635) < 1e-3
    assert os.path.exists(tmp_path / "runs" / "r")
    started = next(e for e in read_events(tmp_path / "runs" / "r") if e.type.value == "run_started")
    assert started.payload["task"]["deterministic"] is True  # the example declares it: one evaluation per program


def test_import_writes_a_spec_that_runs(tmp_path):
    """`ratchet import openevolve FOLDER` on the example's files as published writes a ratchet.toml that evaluates
    the program; a second import refuses to overwrite it, an unknown tool is one line."""
    from typer.testing import CliRunner

    from ratchet.cli import app

    folder = tmp_path / "circle_packing"
    folder.mkdir()
    for name in ("initial_program.py", "evaluator.py", "config_phase_1.yaml"):
        shutil.copy(EXAMPLE / name, folder / name)
    runner = CliRunner()
    res = runner.invoke(app, ["import", "openevolve", str(folder)])
    assert res.exit_code == 0, res.output
    assert 'kind = "openevolve"' in (folder / "ratchet.toml").read_text()
    res = runner.invoke(app, ["evaluate", str(folder), "--spec", str(folder / "ratchet.toml"), "--episodes", "1",
                              "--workers", "1"])
    assert res.exit_code == 0 and "errors 0" in res.output and "0.36" in res.output, res.output
    assert "instance" in res.output and "terminated" not in res.output  # an evaluator's table: scores, no env endings
    res = runner.invoke(app, ["import", "openevolve", str(folder)])
    assert res.exit_code == 1 and "give --force" in res.output
    res = runner.invoke(app, ["import", "shinka", str(folder)])
    assert res.exit_code == 1 and "unknown tool 'shinka'" in res.output
    (folder / "evaluator.py").write_text("def score(program_path):\n    return {}\n")
    res = runner.invoke(app, ["import", "openevolve", str(folder), "--force"])
    assert res.exit_code == 1 and "no top-level evaluate(program_path)" in res.output
    program = (folder / "initial_program.py").read_text()
    (folder / "initial_program.py").write_text(program.replace("EVOLVE-BLOCK-START", "start"))
    res = runner.invoke(app, ["import", "openevolve", str(folder), "--force"])
    assert res.exit_code == 1 and "no EVOLVE-BLOCK-START marker" in res.output
    (folder / "evaluator.py").unlink()
    res = runner.invoke(app, ["import", "openevolve", str(folder), "--force"])
    assert res.exit_code == 1 and "no evaluator.py" in res.output


HONEST = """import numpy as np

PARAMETERS = {"r": {"default": 0.08, "low": 0.01, "high": 0.5}}


def construct_packing(params):
    r = params["r"]
    centers = np.array([[(2 * i + 1) / 12, (2 * j + 1) / 10] for j in range(5) for i in range(6)][:26])
    return centers, np.full(26, min(r, 0.1 - 1e-9))
"""


@pytest.mark.parametrize("radius, result, code", [(0.08, "2.08", 0), (0.5, "a circle leaves the unit square", 1)])
def test_the_docs_split_evaluator_scores_a_packing_the_candidate_cannot_forge(tmp_path, radius, result, code):
    """The trusted evaluator docs/how-to/tasks/openevolve.md shows (the split that makes the score unforgeable)
    runs as written: it scores an honest packing, and a candidate that claims big circles is its failure."""
    from typer.testing import CliRunner

    from ratchet.cli import app

    page = (ROOT / "docs" / "how-to" / "tasks" / "openevolve.md").read_text()
    trusted = page.split("# evaluate.py: trusted")[1].split("\n", 1)[1].split("```")[0]
    (tmp_path / "evaluate.py").write_text(trusted)
    (tmp_path / "policy.py").write_text(HONEST.replace("min(r, 0.1 - 1e-9)", "min(r, 0.1 - 1e-9)" if radius < 0.5
                                                      else "0.5"))
    (tmp_path / "ratchet.toml").write_text('[task]\nkind = "evaluator"\nevaluator = "evaluate.py"\n')
    res = CliRunner().invoke(app, ["evaluate", str(tmp_path / "policy.py"), "--spec", str(tmp_path / "ratchet.toml"),
                                   "--episodes", "1", "--workers", "1"])
    assert res.exit_code == code and result in res.output, res.output


def test_a_killed_and_resumed_openevolve_run_replays_a_whole_one(tmp_path):
    """kill -9 mid-run and resume: the same candidates and scores as a whole run (the evaluator stored in the
    ledger runs after resume, not the file, which is changed here between the two)."""
    from test_refiner_contract import whole_and_resumed

    _example(tmp_path / "spec")
    (tmp_path / "spec" / "initial_program.py").write_text(PROGRAM.replace("X = 1.5", "X = 1.5 + 0 * 2"))
    d = {"name": "oe", "seed": 0, "task": {"kind": "openevolve", "evaluator": "evaluator.py"},
         "policy": {"kind": "source", "path": ".", "files": ["initial_program.py"], "run": RUN},
         "refiners": [{"kind": "cmaes", "popsize": 4}], "planner": {"train_episodes": 1},
         "gate": {"validation_episodes": 2, "max_share": 0.9, "spending": "none"}, "budget": {"episodes": 20},
         "test": {"episodes": 1}, "execution": {"workers": 1, "episode_timeout_s": 60}}
    spec = spec_from_dict(d, tmp_path / "spec")
    hostile = tmp_path / "spec" / "evaluator.py"  # changed before the resume: the ledger's copy runs
    whole, resumed, a, b = whole_and_resumed(spec, tmp_path, die_after=5,
                                             before_resume=lambda: hostile.write_text(EVALUATOR.format(mode="raise")))
    returns = [sorted((e.payload["candidate_id"], e.payload["split"], tuple(e.payload["seeds"]),
                       tuple(x["episode_return"] for x in e.payload["episodes"]))
                      for e in ev if e.type.value == "episodes_evaluated") for ev in (a, b)]
    assert returns[0] == returns[1] and len(returns[0]) > 3
    assert not any(x["error"] for e in b if e.type.value == "episodes_evaluated" for x in e.payload["episodes"])
    assert (resumed.incumbent.id, resumed.stop_reason) == (whole.incumbent.id, whole.stop_reason)
