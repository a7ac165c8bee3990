"""ratchet.cli through Typer's CliRunner: every command, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import DATA, events_of, incumbent_test_episode, make_spec_dir, read_events
from typer.testing import CliRunner

from ratchet.cli import app
from ratchet.ledger import EventType
from ratchet.ledger.projection import project
from ratchet.policy import export_source, load_policy, parse_policy


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "250"})  # wide enough that Rich never elides table cells


def invoke(runner, *args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(res, *fragments: str) -> str:
    assert res.exit_code == 1, (res.exit_code, res.output)
    assert isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


# -- run ------------------------------------------------------------------------------------------

def test_run_prints_results_and_writes_report(cli_run):
    res, run_dir = cli_run
    assert res.exit_code == 0, res.output
    assert "test mean" in res.stdout and "start" in res.stdout and "refined" in res.stdout
    assert f"run directory: {run_dir}" in res.stdout
    assert re.search(r"gen +1 \|", res.stderr)  # one progress line per generation when not on a terminal
    assert (run_dir / "report.html").is_file()
    st = project(read_events(run_dir))
    assert st.status == "finished"
    assert st.final_decision and "final decision: " in res.stdout  # what the search's end decided, in one line


def _tiny_spec(directory):
    """A spec whose start already meets its target (any return): the run evaluates it and stops (about a second)."""
    directory.mkdir(parents=True)
    shutil.copy(DATA / "cartpole_linear.py", directory / "policy.py")
    (directory / "ratchet.toml").write_text('[task]\nenv_id = "CartPole-v1"\n[gate]\nvalidation_episodes = 3\n'
                                            '[budget]\ntarget = 0\n[test]\nepisodes = 3\n[execution]\nworkers = 1\n')
    return directory


def test_run_without_report(tmp_path, runner):
    spec_dir = _tiny_spec(tmp_path / "s")
    res = invoke(runner, "run", spec_dir / "ratchet.toml", "--runs-dir", tmp_path / "runs", "--run-id", "nr",
                 "--no-report")
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "runs" / "nr" / "report.html").exists()
    assert (tmp_path / "runs" / "nr" / "ledger.sqlite").is_file()


def test_a_run_with_nothing_to_refine_says_how_to_fix_it_and_exits_1(tmp_path, runner):
    """A policy without PARAMETERS and the default cmaes refiner: the start is evaluated and recorded, the run
    stops before any generation, and the stop names the fix (regression: exit 0, "policy declares no
    parameters")."""
    spec_dir = _tiny_spec(tmp_path / "s")
    shutil.copy(DATA / "policy_no_params.py", spec_dir / "policy.py")
    toml = spec_dir / "ratchet.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("target = 0", "env_steps = 5000"), encoding="utf-8")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "np", "--no-report")
    assert res.exit_code == 1, res.output
    assert "no parameters for cmaes to search; declare them in its PARAMETERS" in " ".join(res.stdout.split())
    assert project(read_events(tmp_path / "runs" / "np")).status == "finished"


def _file_size_limit(monkeypatch, module, name: str, limit: int) -> None:
    """``module.name`` (a function that writes files) runs under a file-size limit of ``limit`` bytes
    (``RLIMIT_FSIZE``: a write past it fails with EFBIG, as a full disk's fails with ENOSPC, part of it written)."""
    import resource

    real = getattr(module, name)

    def limited(*args, **kwargs):
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            return real(*args, **kwargs)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    monkeypatch.setattr(module, name, limited)


@pytest.mark.parametrize("command", ["run", "resume"])
def test_a_report_that_cannot_be_written_is_one_line_after_the_result(tmp_path, runner, monkeypatch, command):
    """A full disk while `ratchet run` (or `resume`) writes report.html: the run's result is printed, then one line
    that says how to write the report later, exit 1, and no partial report left (regression: a traceback before the
    result, and a truncated report.html)."""
    from ratchet.report import html

    if command == "run":
        run_dir = tmp_path / "runs" / "full"
        args: tuple = ("run", _tiny_spec(tmp_path / "s"), "--runs-dir", tmp_path / "runs", "--run-id", "full")
    else:
        from conftest import interrupted_run

        run_dir = tmp_path / "runs" / interrupted_run(tmp_path, None, "full")
        args = ("resume", run_dir)
    _file_size_limit(monkeypatch, html, "write_report", 1000)
    res = invoke(runner, *args)
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    assert "test mean" in res.stdout and f"run directory: {run_dir}" in res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the run finished, but its report cannot be written: File too large"), last
    assert last.endswith(f"write it later with `ratchet report {run_dir}`"), last
    assert not [p.name for p in run_dir.iterdir() if "report.html" in p.name]  # nor a temporary file
    assert project(read_events(run_dir)).status == "finished"


# -- show / runs / report ------------------------------------------------------------------------

def test_show_table(finished_run, runner):
    result, run_dir, _ = finished_run
    res = invoke(runner, "show", "cp-ref", "--runs-dir", run_dir.parent)
    assert res.exit_code == 0, res.output
    assert "finished" in res.stdout and result.incumbent.id in res.stdout
    assert "baseline_test" in res.stdout and "on 20 episodes" in res.stdout
    assert "execution" in res.stdout and "(process)" in res.stdout
    # a run directory works as well as an id
    assert invoke(runner, "show", run_dir).stdout == res.stdout


def test_show_json(finished_run, runner):
    result, run_dir, _ = finished_run
    res = invoke(runner, "show", run_dir, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in ("run_id", "status", "env_steps", "episodes", "wall_clock_s", "incumbent", "baseline_test", "test"):
        assert key in data
    assert data["run_id"] == "cp-ref" and data["status"] == "finished"
    assert data["env_steps"] == project(read_events(run_dir)).env_steps
    assert isinstance(data["episodes"], int) and data["wall_clock_s"] > 0
    assert data["incumbent"]["candidate_id"] == result.incumbent.id
    assert isinstance(data["incumbent"]["validation_mean"], float)
    # where it ran and how policy code was confined is part of the record
    assert data["execution"]["backend"] == "process" and data["execution"]["workers"] == 2
    assert data["execution"]["sandbox"].startswith(("bwrap;", "netns;", "none;"))
    for key, ev in (("baseline_test", result.baseline_test), ("test", result.test)):
        for k in ("mean", "std", "n", "success_rate"):
            assert data[key][k] == ev.summary()[k], (key, k)


def test_show_and_report_count_failed_episodes(tmp_path, runner):
    """Episodes that raise during a run are counted in `ratchet show` (and --json, and the report): how many, of how
    many candidates, the most frequent reasons without their seeds, and the critique command for the worst one."""
    spec_dir = _tiny_spec(tmp_path / "s")
    policy = spec_dir / "policy.py"
    policy.write_text(policy.read_text(encoding="utf-8").replace(
        "    z = (", '    if params["w_angle"] > 0.3:\n        raise RuntimeError("too steep")\n    z = ('), encoding="utf-8")
    toml = spec_dir / "ratchet.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("target = 0", "env_steps = 3000"), encoding="utf-8")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "fe")
    assert res.exit_code == 0, res.output
    st = project(read_events(tmp_path / "runs" / "fe"))
    failed = [(ev["candidate_id"], ep["error"]) for ev in st.evaluations for ep in ev["episodes"] if ep.get("error")]
    assert failed  # the search tried w_angle > 0.3
    assert re.search(r"^gen +\d+ \|.* \| \d+ episodes failed", res.stderr, re.MULTILINE)  # progress lines count them
    data = json.loads(invoke(runner, "show", "fe", "--runs-dir", tmp_path / "runs", "--json").stdout)["failed_episodes"]
    assert data["episodes"] == len(failed) and data["candidates"] == len({c for c, _ in failed})
    assert data["reasons"][0]["reason"] == "policy raised RuntimeError: too steep (policy line 12)"
    assert data["reasons"][0]["count"] == len(failed)
    worst = data["worst"]["candidate_id"]
    assert data["worst"]["episodes"] == max(sum(c == x for x, _ in failed) for c, _ in failed)
    out = " ".join(re.sub("[│┃]", " ", invoke(runner, "show", "fe", "--runs-dir", tmp_path / "runs").stdout).split())
    assert f"failed episodes {len(failed)} episode(s) of {data['candidates']} candidate(s) failed" in out
    assert f"{len(failed)} × policy raised RuntimeError: too steep" in out
    assert f"ratchet critique fe --candidate {worst}" in out
    html = (tmp_path / "runs" / "fe" / "report.html").read_text(encoding="utf-8")
    assert "Failed episodes" in html and f"ratchet critique fe --candidate {worst}" in html
    # a run without failed episodes has none
    assert project(read_events(tmp_path / "runs" / "fe")[:1]).episode_failures() is None


def test_progress_line_and_show_keep_small_scores_significant_digits():
    """Scores around 1e-3..1e-6 keep about four significant digits in the progress line and `ratchet show` (they all
    read -0.00 before); ordinary scales print as before."""
    from ratchet.planner import Usage
    from ratchet.progress import progress_line
    from ratchet.spec import BudgetSpec

    info = {"generation": 3, "best_train_mean": -0.000176, "incumbent_validation_mean": 1.2e-06, "usage": Usage(),
            "budget": BudgetSpec(env_steps=100), "gated": False, "gate_note": None}
    assert progress_line(info).startswith("gen   3 | best train -0.000176 | incumbent val   1.2e-06 | ")
    ordinary = progress_line({**info, "best_train_mean": 245.3, "incumbent_validation_mean": 0.0})
    assert ordinary.startswith("gen   3 | best train    245.30 | incumbent val      0.00 | ")
    assert progress_line({**info, "best_train_mean": -0.13}).startswith("gen   3 | best train     -0.13 | ")
    # ratchet show's numbers (the incumbent's validation mean, the test row's mean ± std)
    from ratchet.cli import _num

    assert _num(-0.000176) == "-0.000176" and _num(0.0004123) == "0.0004123" and _num(245.3) == "245.30"
    assert _num(-0.13) == "-0.13" and _num(0.0) == "0.00"


def test_runs_lists_runs_and_survives_a_broken_one(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "cp-ref")
    (runs / "broken").mkdir()
    (runs / "broken" / "ledger.sqlite").write_bytes(b"garbage" * 200)
    res = invoke(runner, "runs", "--runs-dir", runs)
    assert res.exit_code == 0, res.output
    assert "cp-ref" in res.stdout and "finished" in res.stdout
    assert "broken" in res.stdout and "unreadable" in res.stdout
    empty = invoke(runner, "runs", "--runs-dir", tmp_path / "none")
    assert empty.exit_code == 0 and "no runs in" in empty.stdout


def test_report_is_self_contained(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    out = tmp_path / "r" / "report.html"
    res = invoke(runner, "report", run_dir, "-o", out)
    assert res.exit_code == 0, res.output
    assert "report:" in res.stdout
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>")
    assert html.count("<img") >= 2 and "data:image/png;base64," in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.IGNORECASE)
    assert not re.search(r"<script[^>]+src", html, re.IGNORECASE) and not re.search(r"<link[^>]+href", html, re.IGNORECASE)
    assert "cp-ref" in html and "Lineage of promotions" in html


def test_report_of_an_unfinished_run(finished_run, runner, tmp_path):
    """A killed run (no test results yet) still gets a report."""
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    first_test = min(e.seq for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["split"] == "test")
    from ratchet.ledger import SQLiteLedger

    led = SQLiteLedger(tmp_path / "partial" / "ledger.sqlite")
    for e in events:
        if e.seq < first_test:
            led.append(e.type, e.key, e.payload)
    led.close()
    res = invoke(runner, "report", tmp_path / "partial")
    assert res.exit_code == 0, res.output
    assert "<img" in (tmp_path / "partial" / "report.html").read_text()


# -- evaluate ------------------------------------------------------------------------------------

def test_evaluate_prints_table_and_mean(runner, pool, cartpole_task):
    from ratchet.critic import Evaluation
    from ratchet.execution import Job

    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "-n", "5", "--seed", "10",
                 "--workers", "1")
    assert res.exit_code == 0, res.output
    cand = load_policy(DATA / "cartpole_linear.py").candidate()
    ev = Evaluation(cand.id, "x", tuple(pool.run(cartpole_task, [Job(cand, s) for s in range(10, 15)])))
    for s in range(10, 15):
        assert re.search(rf"│\s+{s} │", res.stdout), res.stdout
    assert f"mean {ev.mean:.2f} ± {ev.std:.2f} (std) over 5 episodes" in res.stdout
    assert "errors 0" in res.stdout and f"{ev.env_steps:,} env steps" in res.stdout


def test_evaluate_reports_policy_errors_in_the_table(runner):
    res = invoke(runner, "evaluate", DATA / "policy_raises.py", "--env", "CartPole-v1", "-n", "2", "--workers", "1")
    assert "errors 2" in res.stdout and "ZeroDivisionError" in res.stdout  # the table shows every episode
    line = assert_one_line_error(res, "every episode failed")  # and a policy that never works is a failed command
    assert "ZeroDivisionError: policy bug on purpose (policy line 13)" in line  # where in policy_raises.py


def test_an_env_that_raises_stops_the_run_as_the_tasks_fault_and_evaluate_says_so(runner, tmp_path, data_envs):
    """An env whose own step raises (its 5th of every episode) is the task's fault with trusted rollouts: the run
    stops on the start's first validation episode with one line naming the seed, the step and the env, nothing is
    recorded against the candidate; `evaluate` says the environment raised, not that the policy failed."""
    spec = make_spec_dir(tmp_path / "spec", task={"env_id": "ratchet_test_envs:RatchetStepRaises-v0"},
                         execution={"workers": 1})
    res = invoke(runner, "run", spec, "--runs-dir", tmp_path / "runs", "--no-report")
    line = assert_one_line_error(res, "after 4 steps: ratchet_test_envs:RatchetStepRaises-v0 raised RuntimeError in "
                                      "env.step(): env bug in step — the task's fault, not the candidate's")
    assert re.match(r"error: environment error on seed \d+ after", line) and "policy" not in line
    (run_dir,) = (tmp_path / "runs").iterdir()
    events = read_events(run_dir)
    assert not events_of(events, EventType.EPISODES_EVALUATED)  # nothing against the start
    (failed,) = events_of(events, EventType.RUN_FAILED)
    assert "environment error on seed" in failed.payload["error"]
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "ratchet_test_envs:RatchetResetRaises-v0",
                 "-n", "2", "--workers", "1")
    assert_one_line_error(res, "error: environment error on seed 0 at reset: ratchet_test_envs:RatchetResetRaises-v0 "
                               "raised ValueError in env.reset(): env bug in reset — the task's fault, not the "
                               "policy's; nothing was scored")


def test_an_action_outside_the_box_names_both_ways_to_clip_it(runner, tmp_path):
    """Pendulum's torque is in [-2, 2]; 2.5 ends every episode as an error whose message says how to clip it, and
    `evaluate --env` has a flag for that."""
    policy = tmp_path / "push.py"
    policy.write_text('PARAMETERS = {"k": {"default": 2.5, "low": 0.0, "high": 3.0}}\n\n\n'
                      'def act(observation, params):\n    return [params["k"]]\n', encoding="utf-8")
    res = invoke(runner, "evaluate", policy, "--env", "Pendulum-v1", "-n", "1", "--workers", "1")
    line = assert_one_line_error(res, "outside bounds")
    assert '[task] action = "clip"' in line and "pass --clip" in line
    res = invoke(runner, "evaluate", policy, "--env", "Pendulum-v1", "-n", "1", "--workers", "1", "--clip")
    assert res.exit_code == 0 and "errors 0" in res.stdout, res.output
    assert_one_line_error(invoke(runner, "evaluate", policy, "--spec", tmp_path, "--clip"), "--clip goes with --env")


# -- replay --------------------------------------------------------------------------------------

def test_replay_matches_the_ledger(finished_run, runner):
    _, run_dir, _ = finished_run
    _st, episodes = incumbent_test_episode(run_dir)
    for ep in episodes[:2]:
        res = invoke(runner, "replay", run_dir, "--seed", ep["seed"])
        assert res.exit_code == 0, res.output
        assert "match" in res.stdout
        # its time limit in one statement: the run's own limit and the replay margin (no 60 s floor)
        limit = _st.spec["execution"]["episode_timeout_s"]
        assert (f"at most {2 * limit:g} s: 2× the run's episode_timeout_s of {limit:g} s, for a slower replaying "
                "machine") in res.stderr
        assert f"return {ep['episode_return']!r}" in res.stdout and f"ledger {ep['episode_return']!r}" in res.stdout


def test_replaying_an_episode_that_errored_as_recorded_is_a_match(tmp_path, runner):
    """An episode the ledger recorded as errored, replayed to the same error, return and length, reproduces it."""
    import shutil

    from ratchet.loop import open_ledger

    d = tmp_path / "rz"
    d.mkdir()
    shutil.copy(DATA / "policy_raises.py", d / "policy.py")
    (d / "ratchet.toml").write_text('name = "rz"\n[task]\nenv_id = "CartPole-v1"\n[policy]\npath = "policy.py"\n'
                                    "[budget]\nenv_steps = 5000\n[gate]\nvalidation_episodes = 4\n[test]\n"
                                    "episodes = 4\n[execution]\nworkers = 1\n", encoding="utf-8")
    invoke(runner, "run", d, "--runs-dir", tmp_path / "runs", "--run-id", "rz", "--no-report")
    run_dir = tmp_path / "runs" / "rz"
    ledger = open_ledger(run_dir, readonly=True)
    seed = next(e for e in ledger.read() if e.payload.get("split") == "test").payload["episodes"][0]["seed"]
    ledger.close()
    res = invoke(runner, "replay", run_dir, "--seed", seed)
    assert res.exit_code == 0, res.output
    assert "match: identical return and length, and the recorded error again: policy raised" in res.stdout


def test_plain_lines_do_not_wrap_when_piped(finished_run):
    """Piped stdout (not a terminal, so Rich's 80 columns): a long result line stays one line."""
    import os
    import subprocess
    import sys

    _, run_dir, _ = finished_run
    _, episodes = incumbent_test_episode(run_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run([sys.executable, "-m", "ratchet.cli", "replay", str(run_dir), "--seed",
                           str(episodes[0]["seed"])], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("candidate "))
    assert len(line) > 80 and "truncated=" in line and f"ledger {episodes[0]['episode_return']!r}" in line, proc.stdout
    proc = subprocess.run([sys.executable, "-m", "ratchet.cli", "evaluate", str(DATA / "cartpole_linear.py"), "--env",
                           "CartPole-v1", "-n", "2", "--workers", "1"], capture_output=True, text=True,
                          env={**env, "COLUMNS": "40"}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^mean .* · errors 0 · [\d,]+ env steps$", proc.stdout, re.MULTILINE), proc.stdout


def test_replay_video_gif(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    base_val = next(e for e in st.evaluations if e["candidate_id"] == st.baseline_id and e["split"] == "validation")
    seed = base_val["episodes"][0]["seed"]  # the starting policy falls in ~10 steps: a short video
    gif = tmp_path / "out" / "x.gif"
    res = invoke(runner, "replay", run_dir, "--seed", seed, "--candidate", st.baseline_id[:8], "--video", gif)
    assert res.exit_code == 0, res.output
    assert "match" in res.stdout
    assert gif.is_file() and gif.read_bytes()[:4] == b"GIF8" and gif.stat().st_size > 1000


# -- export --------------------------------------------------------------------------------------

def test_export_writes_the_incumbent(finished_run, runner, tmp_path):
    result, run_dir, spec_dir = finished_run
    out = tmp_path / "refined.py"
    res = invoke(runner, "export", run_dir, "-o", out)
    assert res.exit_code == 0, res.output
    prog = parse_policy(out.read_text())
    assert prog.defaults == dict(result.incumbent.params)
    assert out.read_text().startswith(f"# Exported by ratchet from run cp-ref, candidate {result.incumbent.id}")
    original = load_policy(spec_dir / "policy.py")
    assert [(p.name, p.low, p.high) for p in prog.parameters] == [(p.name, p.low, p.high) for p in original.parameters]
    # below the header, the file is the original with only the default literals rewritten
    body = out.read_text().split("\n", 1)[1]
    assert body == export_source(original.source, result.incumbent.params)
    changed = [(a, b) for a, b in zip(original.source.splitlines(), body.splitlines()) if a != b]
    assert 1 <= len(changed) <= len(original.parameters)
    assert all('"default"' in a and '"default"' in b for a, b in changed)
    # refusing to overwrite, then --force
    again = invoke(runner, "export", run_dir, "-o", out)
    assert_one_line_error(again, "exists", "--force")
    forced = invoke(runner, "export", run_dir, "-o", out, "--candidate", project(read_events(run_dir)).baseline_id,
                    "--force")
    assert forced.exit_code == 0, forced.output
    assert parse_policy(out.read_text()).defaults == original.defaults


# regression (was a bug): cli.py export always writes the incumbent's validation mean into the header, even for
# --candidate <other id>, so an exported baseline claims the refined policy's score
def test_export_header_describes_the_exported_candidate(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    base_val = st.evaluation(st.baseline_id, "validation")
    out = tmp_path / "baseline.py"
    res = invoke(runner, "export", run_dir, "-o", out, "--candidate", st.baseline_id)
    assert res.exit_code == 0, res.output
    header = out.read_text().splitlines()[0]
    assert st.baseline_id in header
    assert f"{st.incumbent_validation_mean:.2f}" not in header
    assert f"{base_val.mean:.2f}" in header


# regression (was a bug): cli.py export writes with Path.write_text outside any error handling, so an output path in
# a missing folder ends in a FileNotFoundError traceback
def test_export_into_missing_folder_is_a_clean_error(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    res = invoke(runner, "export", run_dir, "-o", tmp_path / "no" / "such" / "dir.py")
    if res.exit_code == 0:  # creating the folder is fine too
        assert (tmp_path / "no" / "such" / "dir.py").is_file()
    else:
        assert_one_line_error(res)


def test_a_failed_export_leaves_nothing_and_a_retry_needs_no_force(finished_run, runner, tmp_path, monkeypatch):
    """A full disk while `ratchet export` writes: one line, exit 1, and no file left, so the retry (once there is
    room) writes it without --force (regression: a partial file, then "exists; pass --force")."""
    from ratchet.policies import export

    result, run_dir, _ = finished_run
    out = tmp_path / "refined.py"
    with monkeypatch.context() as m:
        _file_size_limit(m, export, "export_candidate", 100)
        assert_one_line_error(invoke(runner, "export", run_dir, "-o", out), f"cannot write {out}: File too large")
    assert os.listdir(tmp_path) == []  # nor a temporary file
    res = invoke(runner, "export", run_dir, "-o", out)
    assert res.exit_code == 0, res.output
    assert parse_policy(out.read_text()).defaults == dict(result.incumbent.params)


# -- bad input: one line, exit 1, no traceback ---------------------------------------------------

def test_run_missing_spec(runner, tmp_path):
    assert_one_line_error(invoke(runner, "run", tmp_path / "nope.toml", "--runs-dir", tmp_path), "spec not found")


def test_run_invalid_spec(runner, tmp_path):
    (tmp_path / "ratchet.toml").write_text('[task]\nenv_id = "CartPole-v1"\nbogus = 1\n')
    assert_one_line_error(invoke(runner, "run", tmp_path, "--runs-dir", tmp_path / "runs"), "unknown key", "bogus")


# regression (was a bug): cli.py _fail prints the message through Rich markup without escaping it, so section names
# such as [task] or [policy] in SpecError messages are swallowed as markup tags ('unknown key  bogus', 'missing 
# section')
@pytest.mark.parametrize("toml, fragment", [('[task]\nenv_id = "CartPole-v1"\nbogus = 1\n', "unknown key [task] bogus"),
                                            ('name = "x"\n', "missing [task] section")])
def test_error_messages_keep_section_names(runner, tmp_path, toml, fragment):
    (tmp_path / "ratchet.toml").write_text(toml)
    assert_one_line_error(invoke(runner, "run", tmp_path, "--runs-dir", tmp_path / "runs"), fragment)


def test_run_existing_run_id(finished_run, runner):
    _, run_dir, spec_dir = finished_run
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", run_dir.parent, "--run-id", "cp-ref"),
                          "already exists")


def test_run_broken_policy(runner, tmp_path):
    (tmp_path / "ratchet.toml").write_text('[task]\nenv_id = "CartPole-v1"\n')
    (tmp_path / "policy.py").write_text("PARAMETERS = {}\ndef act(o, p)\n  return 0\n")
    assert_one_line_error(invoke(runner, "run", tmp_path, "--runs-dir", tmp_path / "runs"), "syntax error", "policy.py:2")


def test_show_unknown_run(runner, tmp_path):
    assert_one_line_error(invoke(runner, "show", "ghost", "--runs-dir", tmp_path), "no run 'ghost'")
    assert_one_line_error(invoke(runner, "show", "ghost", "--runs-dir", tmp_path, "--json"), "no run")


def test_report_unknown_run(runner, tmp_path):
    assert_one_line_error(invoke(runner, "report", "ghost", "--runs-dir", tmp_path), "no run")


def test_resume_finished_run(finished_run, runner):
    _, run_dir, _ = finished_run
    assert_one_line_error(invoke(runner, "resume", run_dir), "already finished")


def test_resume_unknown_run(runner, tmp_path):
    assert_one_line_error(invoke(runner, "resume", "ghost", "--runs-dir", tmp_path), "no run")


def test_replay_unknown_seed(finished_run, runner):
    _, run_dir, _ = finished_run
    assert_one_line_error(invoke(runner, "replay", run_dir, "--seed", "1"), "no recorded episode with seed 1")


def test_replay_unknown_candidate(finished_run, runner):
    _, run_dir, _ = finished_run
    assert_one_line_error(invoke(runner, "replay", run_dir, "--seed", "1", "--candidate", "zzzz"),
                          "no unique candidate")


def test_replay_bad_video_suffix(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    _, episodes = incumbent_test_episode(run_dir)
    assert_one_line_error(invoke(runner, "replay", run_dir, "--seed", episodes[0]["seed"], "--video", tmp_path / "v.avi"),
                          ".gif or .mp4")


# regression (was a bug): in a clone the hint named only the package-index install, `pip install
# 'policy-ratchet[video]'`, which installs a second ratchet beside the checkout being run
def test_replay_mp4_without_ffmpeg_names_the_install_for_where_ratchet_runs(finished_run, runner, tmp_path,
                                                                            monkeypatch):
    import sys
    from pathlib import Path

    import ratchet.cli

    _, run_dir, _ = finished_run
    _, episodes = incumbent_test_episode(run_dir)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # `import imageio_ffmpeg` raises ImportError
    args = ("replay", run_dir, "--seed", episodes[0]["seed"], "--video", tmp_path / "v.mp4")
    clone = Path(ratchet.cli.__file__).resolve().parents[2]  # the tests run from the source checkout
    assert_one_line_error(invoke(runner, *args), "needs ffmpeg", f'pip install -e ".[video]" in the source checkout '
                          f"{clone}", "pip install 'policy-ratchet[video]'", "or write a .gif")
    monkeypatch.setattr(ratchet.cli, "_source_checkout", lambda: None)  # an installed package
    line = assert_one_line_error(invoke(runner, *args), "needs ffmpeg: pip install 'policy-ratchet[video]'")
    assert "-e" not in line and not (tmp_path / "v.mp4").exists()


def test_export_unknown_run(runner, tmp_path):
    assert_one_line_error(invoke(runner, "export", "ghost", "-o", tmp_path / "x.py", "--runs-dir", tmp_path), "no run")


def test_evaluate_unknown_env(runner):
    assert_one_line_error(invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPool-v1"),
                          "unknown Gymnasium env id", "CartPole-v1")


def test_evaluate_missing_policy(runner, tmp_path):
    assert_one_line_error(invoke(runner, "evaluate", tmp_path / "nope.py", "--env", "CartPole-v1"),
                          "policy file not found")


def test_debug_flag_shows_the_exception(runner, tmp_path):
    res = invoke(runner, "--debug", "show", "ghost", "--runs-dir", tmp_path)
    assert res.exit_code != 0
    from ratchet.errors import RunNotFoundError

    assert isinstance(res.exception, RunNotFoundError)


# -- critique -------------------------------------------------------------------------------------

def test_critique_prints_failure_modes_and_intervals(finished_run, runner):
    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    res = invoke(runner, "critique", run_dir, "--split", "test", "--candidate", st.baseline_id)
    assert res.exit_code == 0, res.output
    assert "95 % CI" in res.stdout and "failure modes" in res.stdout and "pole fell" in res.stdout
    assert "compared seed by seed with the incumbent" in res.stdout
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert lines[0].lstrip().startswith("Candidate ") and "compared seed by seed" in lines[-1]  # the header first


def test_critique_json_is_structured(finished_run, runner):
    _, run_dir, _ = finished_run
    res = invoke(runner, "critique", run_dir, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["split"] == "validation"
    assert {"stats", "mean_ci", "success_ci", "failure_modes", "regressions", "new_failures", "text"} <= set(data)


def test_critique_bad_split_and_unknown_candidate(finished_run, runner):
    _, run_dir, _ = finished_run
    assert_one_line_error(invoke(runner, "critique", run_dir, "--split", "holdout"), "--split must be")
    assert_one_line_error(invoke(runner, "critique", run_dir, "--candidate", "zzzz"), "no unique candidate")


def test_finished_run_stores_test_critiques(finished_run):
    _, run_dir, _ = finished_run
    fin = events_of(read_events(run_dir), EventType.RUN_FINISHED)[0].payload
    assert fin["baseline_test_critique"]["failure_modes"][0]["label"] in ("pole fell", "cart left the track")
    assert "text" in fin["test_critique"]


def test_bad_outputs_never_clobber_runs(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    assert_one_line_error(invoke(runner, "report", run_dir, "-o", run_dir / "ledger.sqlite", "--no-videos"), "run ledger")
    assert_one_line_error(invoke(runner, "export", run_dir, "-o", run_dir / "ledger.sqlite", "--force"), "run ledger")
    existing = tmp_path / "r.html"
    existing.write_text("keep me")
    assert_one_line_error(invoke(runner, "report", run_dir, "-o", existing, "--no-videos"), "--force")
    assert existing.read_text() == "keep me"
    assert project(read_events(run_dir)).status == "finished"


def test_run_ids_must_be_plain_names(runner, tmp_path):
    from conftest import make_spec_dir

    spec_dir = make_spec_dir(tmp_path / "s")
    for bad in ("../escaped", "a/b", "."):
        assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", bad),
                              "plain name")
    (tmp_path / "runs" / "proj").mkdir(parents=True)
    (tmp_path / "runs" / "proj" / "policy.py").write_text("# precious")
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "proj"),
                          "not a run directory")
    assert (tmp_path / "runs" / "proj" / "policy.py").read_text() == "# precious"


def test_damaged_ledger_is_one_line_and_left_untouched(finished_run, runner, tmp_path):
    import sqlite3

    _, run_dir, _ = finished_run
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    db = sqlite3.connect(broken / "ledger.sqlite")
    db.execute("UPDATE events SET payload = '{not json' WHERE seq = 3")
    db.commit()
    db.close()
    before = (broken / "ledger.sqlite").read_bytes()
    for cmd in (["show", broken], ["show", broken, "--json"], ["report", broken, "--no-videos", "-o", tmp_path / "x.html"],
                ["export", broken, "-o", tmp_path / "p.py"]):
        assert_one_line_error(invoke(runner, *cmd), "damaged")
    assert (broken / "ledger.sqlite").read_bytes() == before


def test_a_payload_nested_100000_deep_is_one_line_in_every_command(finished_run, runner, tmp_path):
    import sqlite3

    _, run_dir, _ = finished_run
    deep = tmp_path / "deep"
    shutil.copytree(run_dir, deep)
    with sqlite3.connect(deep / "ledger.sqlite") as db:
        seq = db.execute("SELECT max(seq) FROM events WHERE type = 'generation_finished'").fetchone()[0]
        db.execute("UPDATE events SET payload = ? WHERE seq = ?", ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", seq))
    db.close()
    for cmd in (["show", deep], ["show", deep, "--json"], ["critique", deep], ["llm-log", deep],
                ["report", deep, "--no-videos", "-o", tmp_path / "x.html"], ["replay", deep, "--seed", "1"],
                ["export", deep, "-o", tmp_path / "p.py"], ["runs", "--runs-dir", tmp_path]):
        res = invoke(runner, *cmd)
        if cmd[0] == "runs":
            assert res.exit_code == 0 and "unreadable" in res.stdout and "Traceback" not in res.output, res.output
        else:
            assert_one_line_error(res, f"damaged at event {seq}: its payload nests deeper than 100 levels")


def test_a_ledger_holding_an_endless_view_is_one_line_not_a_hang(tmp_path):
    """A ``ledger.sqlite`` whose ``events`` is a recursive view: ``runs`` lists it as unreadable and ``show`` says so in
    one line, at once (each in its own process: the old read never returned, and ignored SIGTERM)."""
    import sqlite3
    import subprocess
    import sys

    from ratchet.ledger import SQLiteLedger

    SQLiteLedger(tmp_path / "runs" / "endless" / "ledger.sqlite").close()
    with sqlite3.connect(tmp_path / "runs" / "endless" / "ledger.sqlite") as db:
        db.executescript("DROP TABLE events; CREATE VIEW events AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT "
                         "n + 1 FROM r) SELECT n AS seq, 'k' || n AS key, 'run_started' AS type, 0.0 AS time, '{}' AS "
                         "payload FROM r ORDER BY n DESC")
    db.close()

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "ratchet.cli", *map(str, args)], capture_output=True, text=True,
                              timeout=120, check=False, env={**os.environ, "COLUMNS": "250"})

    listed = cli("runs", "--runs-dir", tmp_path / "runs")
    assert listed.returncode == 0 and "endless" in listed.stdout and "unreadable" in listed.stdout, listed
    shown = cli("show", tmp_path / "runs" / "endless")
    lines = [ln for ln in shown.stderr.splitlines() if ln.strip()]
    assert shown.returncode == 1 and len(lines) == 1 and "is not a ratchet ledger: its view 'events'" in lines[0], shown


@pytest.mark.parametrize("run_id", ["../../escaped", "ABSOLUTE", 5, "a/b", None, "\ud800"])
def test_a_recorded_run_id_that_is_not_a_plain_name_never_becomes_a_path(finished_run, runner, tmp_path, run_id):
    """``export --tensorboard DIR`` writes DIR/RUN_ID: a ledger whose run_started names ``../../escaped``, an absolute
    path or a number is damaged, in one line, and nothing is written anywhere."""
    import sqlite3

    _, run_dir, _ = finished_run
    run_id = str(tmp_path / "absolute") if run_id == "ABSOLUTE" else run_id
    bad = tmp_path / "a" / "b" / "bad"
    shutil.copytree(run_dir, bad)
    with sqlite3.connect(bad / "ledger.sqlite") as db:
        payload = json.loads(db.execute("SELECT payload FROM events WHERE key = 'run_started'").fetchone()[0])
        db.execute("UPDATE events SET payload = ? WHERE key = 'run_started'", (json.dumps({**payload, "run_id": run_id}),))
    db.close()
    def files():  # (reading the ledger may add its own -wal and -shm)
        return sorted(p for p in tmp_path.rglob("*") if not p.name.startswith("ledger.sqlite"))

    before = files()
    assert_one_line_error(invoke(runner, "export", bad, "--tensorboard", tmp_path / "a" / "b" / "tb"),
                          "damaged at event 1: its run id", "is not a plain name")
    assert files() == before
    # every display of the run says so in one line (a lone surrogate was a UnicodeEncodeError traceback in show and
    # runs), and the other runs of its folder are still listed
    assert_one_line_error(invoke(runner, "show", bad), "damaged at event 1: its run id", "is not a plain name")
    shutil.copytree(run_dir, bad.parent / "good")
    listed = invoke(runner, "runs", "--runs-dir", bad.parent)
    assert listed.exit_code == 0 and "cp-ref" in listed.output and "unreadable" in listed.output, listed.output


def test_env_setup_problems_fail_up_front(runner, tmp_path):
    from conftest import make_spec_dir

    spec_dir = make_spec_dir(tmp_path / "s", task={"env_id": "CartPole-v1", "env_kwargs": {"bogus": 1}})
    line = assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs"), "cannot make CartPole-v1")
    assert "bogus" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# -- --storage: ledgers in a database ------------------------------------------------------------



def test_run_show_runs_with_storage(shared_storage, runner, tmp_path, monkeypatch):
    from conftest import password_to_env, unique_run_id
    from sqlalchemy.engine import make_url

    run_id, runs = unique_run_id("cli"), tmp_path / "runs"
    res = invoke(runner, "run", _tiny_spec(tmp_path / "s"), "--storage", shared_storage, "--runs-dir", runs,
                 "--run-id", run_id, "--no-report")
    assert res.exit_code == 0, res.output
    run_dir = runs / run_id
    assert f"run directory: {run_dir}" in res.stdout
    assert (run_dir / "ledger.json").is_file() and not (run_dir / "ledger.sqlite").exists()
    password = make_url(shared_storage).password
    if password:
        assert password not in (run_dir / "ledger.json").read_text() and password not in res.output

    # the run directory finds its ledger in the database the command names (a password comes from PGPASSWORD);
    # without --storage its pointer is not followed
    password_to_env(shared_storage, monkeypatch)
    shown = invoke(runner, "show", run_dir, "--json", "--storage", make_url(shared_storage).set(password=None)
                   .render_as_string(hide_password=False))
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["status"] == "finished"
    assert_one_line_error(invoke(runner, "show", run_dir), "not opened")

    # another machine: no run directory there, the run is looked up by id in the database
    nowhere = tmp_path / "nowhere"
    other = invoke(runner, "show", run_id, "--runs-dir", nowhere, "--storage", shared_storage)
    assert other.exit_code == 0, other.output
    assert "finished" in other.stdout and run_id in other.stdout
    listed = invoke(runner, "runs", "--storage", shared_storage)
    assert listed.exit_code == 0, listed.output
    assert run_id in listed.stdout and "finished" in listed.stdout
    crit = invoke(runner, "critique", run_id, "--runs-dir", nowhere, "--storage", shared_storage, "--split", "test",
                  "--json")
    assert crit.exit_code == 0, crit.output
    assert json.loads(crit.stdout)["split"] == "test"
    rep = invoke(runner, "report", run_id, "--runs-dir", nowhere, "--storage", shared_storage, "--no-videos")
    assert rep.exit_code == 0, rep.output
    assert (nowhere / run_id / "report.html").is_file()
    via_env = runner.invoke(app, ["show", run_id, "--runs-dir", str(tmp_path / "none")],
                            env={"COLUMNS": "250", "RATCHET_STORAGE": shared_storage})
    assert via_env.exit_code == 0, via_env.output


def test_resume_with_storage_through_the_run_directory(shared_storage, runner, tmp_path, monkeypatch):
    """An interrupted run whose ledger is in a database resumes from its run directory and RATCHET_STORAGE."""
    from conftest import interrupted_run, password_to_env

    from ratchet.loop import open_ledger

    run_id = interrupted_run(tmp_path, shared_storage, "resume")
    password_to_env(shared_storage, monkeypatch)
    run_dir = tmp_path / "runs" / run_id
    assert_one_line_error(invoke(runner, "resume", run_dir, "--no-report"), "not opened")
    monkeypatch.setenv("RATCHET_STORAGE", shared_storage)
    res = invoke(runner, "resume", run_dir, "--no-report")
    assert res.exit_code == 0, res.output
    assert f"run {run_id} stopped" in res.stdout
    events = open_ledger(run_dir, storage=shared_storage).read()
    assert project(events).status == "finished"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(events_of(events, EventType.RUN_RESUMED)) == 1


def test_a_planted_pointer_is_never_followed_to_a_database_the_command_does_not_name(runner, tmp_path, listener,
                                                                                      monkeypatch):
    """A ``ledger.json`` anyone could write in a runs folder names a server; ``runs`` and ``show`` list it without
    connecting (the password in PGPASSWORD stays here); naming that database with --storage is what opens it."""
    monkeypatch.setenv("PGPASSWORD", "s3cret-pw")
    url = f"postgresql://someone@127.0.0.1:{listener.port}/ratchet"
    runs = tmp_path / "runs"
    (runs / "planted").mkdir(parents=True)
    (runs / "planted" / "ledger.json").write_text(json.dumps({"storage": url, "run_id": "planted"}))
    listed = invoke(runner, "runs", "--runs-dir", runs)
    assert listed.exit_code == 0, listed.output
    assert "planted" in listed.stdout and "127.0.0.1" in listed.stdout and "not opened" in listed.stdout
    for args in (["show", runs / "planted"], ["show", "planted", "--runs-dir", runs], ["critique", runs / "planted"],
                 ["show", runs / "planted", "--storage", "postgresql://someone@127.0.0.1:1/other"]):
        assert_one_line_error(invoke(runner, *args), "not opened", "--storage")
    (runs / "climbs").mkdir()
    (runs / "climbs" / "ledger.json").write_text(json.dumps({"storage": url, "run_id": "../../x"}))
    assert_one_line_error(invoke(runner, "show", runs / "climbs", "--storage", url), "not a ledger pointer",
                          "not a plain name")
    assert listener.connections == []
    # the user names that database: now, and only now, it is connected to
    assert_one_line_error(invoke(runner, "show", runs / "planted", "--storage", url), "cannot open ledger database")
    assert listener.connections


@pytest.mark.parametrize("storage, fragment", [
    ("not a url", "not a database URL"),
    ("postgresql://ratchet:s3cret@127.0.0.1:1/ratchet", "cannot open ledger database"),
    ("mysql://ratchet@127.0.0.1/ratchet", "driver for mysql is not installed"),
    ("nosuchdb://x", "unknown database kind"),
])
def test_bad_storage_is_one_line(runner, tmp_path, storage, fragment):
    spec_dir = _tiny_spec(tmp_path / "s")
    for args in (["runs"], ["show", "x", "--runs-dir", tmp_path], ["run", spec_dir, "--runs-dir", tmp_path / "runs"]):
        line = assert_one_line_error(invoke(runner, *args, "--storage", storage), fragment)
        assert "s3cret" not in line
    assert not (tmp_path / "runs").exists()


def test_report_renders_failure_mode_gifs(finished_run, tmp_path):
    """The report's failure-mode GIFs are rendered by sandboxed workers and land in a folder that did not
    exist yet (regression: the sandbox's move out of the worker directory failed on a missing folder)."""
    from ratchet.report.video import render_failure_examples

    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    assert st.baseline_test_critique["failure_modes"]
    gifs = render_failure_examples(st, tmp_path / "new" / "videos", max_modes=1)
    assert gifs and all(p.read_bytes()[:4] == b"GIF8" for p in gifs.values())


def test_replay_video_is_not_overwritten_without_force(finished_run, runner, tmp_path):
    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    seed = st.evaluations[0]["episodes"][0]["seed"]
    cand = st.evaluations[0]["candidate_id"][:8]
    gif = tmp_path / "x.gif"
    gif.write_bytes(b"mine")
    assert_one_line_error(invoke(runner, "replay", run_dir, "--seed", seed, "--candidate", cand, "--video", gif),
                          "--force")
    assert gif.read_bytes() == b"mine"
    res = invoke(runner, "replay", run_dir, "--seed", seed, "--candidate", cand, "--video", gif, "--force")
    assert res.exit_code == 0, res.output
    assert gif.read_bytes()[:4] == b"GIF8"


# -- issue 8: budgets, bounds and small ones --------------------------------------------------------

def _spec_dir(tmp_path, toml: str):
    spec_dir = tmp_path / "s"
    spec_dir.mkdir(exist_ok=True)
    shutil.copy(DATA / "cartpole_linear.py", spec_dir / "policy.py")
    (spec_dir / "ratchet.toml").write_text('[task]\nenv_id = "CartPole-v1"\n' + toml, encoding="utf-8")
    return spec_dir


# regression (was a bug): these ran (30 validation episodes on a budget of 5, an unbounded CliffWalking run) or
# crashed later (OverflowError, a start-up that never ends, pycma's AssertionError after 50 generations)
@pytest.mark.parametrize("toml, fragments", [
    ("[gate]\nvalidation_episodes = 30\n[budget]\nepisodes = 5\n", ("[budget] episodes = 5", "first validation")),
    # issue 18 §6: it validated the start, spent the test episodes and exited 0 ("no room for a single generation")
    ("[budget]\nepisodes = 10\n", ("[budget] episodes = 10 cannot pay for a single generation", "= 28",
                                   "raise [budget] episodes to at least 28")),
    ("[execution]\nepisode_timeout_s = 1e7\n", ("[execution] episode_timeout_s", "≤ 86400")),
    ("[gate]\nvalidation_episodes = 2000000000\n", ("[gate] validation_episodes", "≤ 100000")),
    ("[test]\nepisodes = 1000000000\n", ("[test] episodes", "≤ 100000")),
    ("[refiner]\nsigma0 = 1e-300\n", ("[refiner] sigma0", "≥ 1e-06")),
    ('[gate]\ntest = "wilcoxon"\nvalidation_episodes = 6\n', ("[gate] validation_episodes = 6", "at least 7")),
    ("env_kwargs = { max_episode_steps = 20000 }\n", ("[task] env_kwargs", "[task] max_episode_steps")),
])
def test_run_refuses_unbounded_specs_in_one_line(tmp_path, runner, toml, fragments):
    spec_dir = _spec_dir(tmp_path, toml)  # env_kwargs lands under the [task] header _spec_dir writes
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs"), *fragments)
    assert not (tmp_path / "runs").exists()


def test_run_refuses_an_env_without_a_time_limit(tmp_path, runner):
    spec_dir = _spec_dir(tmp_path, "")
    (spec_dir / "ratchet.toml").write_text('[task]\nenv_id = "CliffWalking-v1"\n', encoding="utf-8")
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs"),
                          "CliffWalking-v1 has no time limit", "set [task] max_episode_steps")
    assert not (tmp_path / "runs").exists()


# regression (was a bug): --run-id $'nl\n' was accepted: the id check's "$" matches before a final newline
def test_run_refuses_a_run_id_with_a_newline(tmp_path, runner):
    spec_dir = _spec_dir(tmp_path, "")
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "nl\n"),
                          "must be a plain name")
    assert not (tmp_path / "runs").exists()


# regression (was a bug): `evaluate --timeout inf` raised OverflowError; huge --episodes hung
@pytest.mark.parametrize("args, fragment", [
    (("--timeout", "inf"), "--timeout inf"),
    (("--timeout", "1e7"), "at most 86400"),
    (("--episodes", "1000000000"), "--episodes 1000000000: at most 100000"),
])
def test_evaluate_bounds_its_numbers(runner, args, fragment):
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", *args)
    assert_one_line_error(res, fragment)


# regression (was a bug): Rich read "[budget]" and "[refiner]" in a stop reason as markup and dropped them
# ("raise  env_steps or lower  popsize"); new-user trial: with every episode priced at the time limit the run still
# validated the start and spent its test episodes before saying "no room for a single generation"
def test_an_env_step_budget_that_buys_no_generation_exits_1_and_says_which_budget_to_raise(tmp_path, runner):
    """A budget too small for a generation is refused before the run where its price is known up front (episodes
    priced at the time limit); where it waits on the episode lengths the start's validation measures, the run is
    recorded (finished, no test episodes spent on a search that never ran), the stop reason prints its brackets and
    names the budget to raise, and `ratchet run` exits 1 for scripts."""
    worst = _spec_dir(tmp_path, "[gate]\nvalidation_episodes = 3\n[budget]\nenv_steps = 1500\npricing = "
                                "\"worst-case\"\n[test]\nepisodes = 2\n[execution]\nworkers = 1\n")
    assert_one_line_error(invoke(runner, "run", worst, "--runs-dir", tmp_path / "runs", "--no-report"),
                          "no room for a single generation", "[budget] env_steps = 1,500, before the starting "
                          "policy's validation", "raise [budget] env_steps or lower the refiners' popsize")
    assert not any((tmp_path / "runs").iterdir())  # no episode ran, nothing was recorded
    # the zero policy's CartPole episodes last about 10 steps: 3 of them fit, a generation at their length does not
    spec_dir = _spec_dir(tmp_path, "max_episode_steps = 20\n[gate]\nvalidation_episodes = 3\n[budget]\n"
                                   "env_steps = 100\n[test]\nepisodes = 2\n[execution]\nworkers = 1\n")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "small", "--no-report")
    assert res.exit_code == 1, res.output
    assert "no room for a single generation" in res.stdout and "after validation used" in res.stdout
    assert "raise [budget] env_steps or lower the refiners' popsize" in res.stdout
    assert "test: none run (nothing was searched)" in res.stdout and "refined" not in res.stdout
    events = read_events(tmp_path / "runs" / "small")
    assert not events_of(events, EventType.GENERATION_FINISHED) and project(events).status == "finished"
    assert {e.payload["split"] for e in events_of(events, EventType.EPISODES_EVALUATED)} == {"validation"}
    show = invoke(runner, "show", tmp_path / "runs" / "small")
    assert show.exit_code == 0 and "[budget] env_steps" in show.stdout
    clock = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "clock", "--no-report",
                   "--set", "budget.env_steps=100000", "--set", "budget.wall_clock_s=0.001")
    assert clock.exit_code == 1 and "wall-clock budget used" in clock.stdout  # a wall clock that bought none, too


# new-user trial: `[model] screen = true` on a budget too small to screen ended with no word about the screen
def test_a_screen_that_screened_nothing_says_why_at_the_end_of_the_run(tmp_path, runner):
    spec_dir = _spec_dir(tmp_path, "[gate]\nvalidation_episodes = 4\n[budget]\nepisodes = 60\n[test]\nepisodes = 3\n"
                                   "[execution]\nworkers = 1\n[model]\nscreen = true\nmin_transitions = 100000\n")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "few", "--no-report")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if "screen unused" in ln]
    assert lines == [("screen unused: the run ended before its world model had [model] min_transitions = 100000 "
                     "transitions; no generation screened; [model] screen had no effect in this run")], res.stdout
    # a budget that bought no generation: the screen never had one to screen
    (tmp_path / "tiny").mkdir()
    tiny = _spec_dir(tmp_path / "tiny", "max_episode_steps = 20\n[gate]\nvalidation_episodes = 3\n[budget]\n"
                                        "env_steps = 100\n[test]\nepisodes = 2\n[execution]\nworkers = 1\n"
                                        "[model]\nscreen = true\n")
    res = invoke(runner, "run", tiny, "--runs-dir", tmp_path / "runs", "--run-id", "none", "--no-report")
    assert res.exit_code == 1 and "no room for a single generation" in res.stdout, res.output
    assert "screen unused: no generation ran; no generation screened" in res.stdout


# regression (was a bug): at 80 columns `ratchet runs` squeezed every column but the run id to nothing
def test_runs_fits_an_80_column_terminal(finished_run, tmp_path):
    _, run_dir, _ = finished_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "cp-ref")
    res = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["runs", "--runs-dir", str(runs)])
    assert res.exit_code == 0, res.output
    assert "cp-ref" in res.stdout and "finished" in res.stdout and "CartPole-v1" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


def test_runs_keeps_a_200_character_id_whole(monkeypatch):
    import io

    from rich.console import Console

    from ratchet import cli

    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buf, width=80, markup=False))
    long_id = "r" * 200
    cli._print_runs([(long_id, "finished", "CartPole-v1", "8", "46,390", "500.00", "499.00", "100.0 %")])
    text = buf.getvalue()
    assert long_id in text.replace("\n", "")
    for value in ("finished", "CartPole-v1", "46,390", "500.00", "499.00", "100.0 %"):
        assert value in text


# regression (was a bug): `ratchet resume` on a 0-byte ledger wrote a schema into it
def test_resume_refuses_an_empty_ledger_and_leaves_it_alone(tmp_path, runner):
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    ledger = tmp_path / "runs" / "empty" / "ledger.sqlite"
    ledger.write_bytes(b"")
    assert_one_line_error(invoke(runner, "resume", "empty", "--runs-dir", tmp_path / "runs"), "not a readable ratchet ledger")
    assert ledger.stat().st_size == 0


# -- text from policy code -------------------------------------------------------------------------

HOSTILE_TEXT = "\x1b[2K\x1b[1A\r[bold green]all episodes succeeded[/bold green]\x07"


def _assert_clean(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    text.encode("utf-8")  # no lone surrogate


def test_evaluate_shows_escape_sequences_and_surrogates_from_policy_errors_as_text(runner):
    """A policy raising with a terminal escape sequence or a lone surrogate gets a cleaned line in the
    table; ``evaluate`` neither crashes nor lets the policy rewrite the lines above."""
    res = invoke(runner, "evaluate", DATA / "hostile" / "raises_escapes.py", "--env", "CartPole-v1", "-n", "3",
                 "--seed", "0", "--workers", "1")
    assert res.exit_code == 0, (res.exit_code, res.output, res.exception)
    _assert_clean(res.output)
    assert "\\x1b[2K\\x1b[1A\\r[bold green]all episodes succeeded" in res.stdout  # shown, markup not applied
    assert "\\ud800" in res.stdout and "errors 2" in res.stdout


@pytest.fixture
def hostile_ledger_run(finished_run, tmp_path):
    """A copy of the finished run whose incumbent's latest validation episodes carry hostile error texts,
    as a ledger written before replies were validated could (one error is even an int)."""
    import sqlite3

    _, run_dir, _ = finished_run
    copy = tmp_path / "runs" / "cp-hostile"
    shutil.copytree(run_dir, copy)
    (copy / ".lock").unlink(missing_ok=True)
    st = project(read_events(copy))
    con = sqlite3.connect(copy / "ledger.sqlite")
    rows = con.execute("SELECT seq, payload FROM events WHERE type = ?",
                       (EventType.EPISODES_EVALUATED.value,)).fetchall()
    seq, payload = next((s, json.loads(p)) for s, p in reversed(rows)
                        if json.loads(p)["candidate_id"] == st.incumbent_id and json.loads(p)["split"] == "validation")
    for ep, error in zip(payload["episodes"], (HOSTILE_TEXT, "\ud800", 12345)):
        ep.update(error=error, terminated=False, truncated=False, success=False, diagnostics={"cause": "error"})
    con.execute("UPDATE events SET payload = ? WHERE seq = ?", (json.dumps(payload), seq))
    con.commit()
    con.close()
    return copy


def test_critique_of_a_ledger_with_hostile_error_texts(hostile_ledger_run, runner):
    res = invoke(runner, "critique", hostile_ledger_run)
    assert res.exit_code == 0, (res.exit_code, res.output, res.exception)
    _assert_clean(res.output)
    assert "\\x1b[2K" in res.stdout and "\\ud800" in res.stdout and "12345" in res.stdout


def test_report_of_a_ledger_with_hostile_texts_escapes_them(finished_run, tmp_path):
    """Failure-mode labels (error texts) reach the HTML report cleaned and HTML-escaped."""
    import dataclasses

    from ratchet.report.html import render_report

    _, run_dir, _ = finished_run
    st = project(read_events(run_dir))
    mode = {"label": "error: " + HOSTILE_TEXT + "\ud800<script>", "count": 1, "share": 1.0, "mean_return": 0.0,
            "example_seeds": [1], "description": "\x1b[31m<b>"}
    st = dataclasses.replace(st, test_critique={"failure_modes": [mode]})
    page = render_report(st)
    _assert_clean(page)
    assert "<script>" not in page and "\\x1b[2K" in page and "\\ud800&lt;script&gt;" in page


# -- issue 9 §5: repeat a spec without editing it; evaluate on explicit seeds -------------------------

def test_run_takes_a_seed_and_settings_without_editing_the_spec(tmp_path, runner):
    spec_dir = _spec_dir(tmp_path, "[budget]\nenv_steps = 3000\n[gate]\nvalidation_episodes = 3\n"
                                   "[test]\nepisodes = 2\n[execution]\nworkers = 1\n")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "r", "--no-report",
                 "--seed", "7", "--set", "refiner.popsize=3", "--set", "budget.env_steps=2500")
    assert res.exit_code == 0, res.output
    st = project(read_events(tmp_path / "runs" / "r"))
    assert st.spec["seed"] == 7 and st.spec["refiner"]["popsize"] == 3 and st.spec["budget"]["env_steps"] == 2500
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--set",
                                 "gate.validation_episodes=many"), "[gate] validation_episodes")
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--set", "oops"),
                          "write SECTION.KEY=VALUE")


def test_run_refuses_hidden_that_the_npz_network_does_not_have(tmp_path, runner):
    import gymnasium as gym

    from ratchet.policies.mlp import init_weights

    env = gym.make("CartPole-v1")
    spec_dir = _spec_dir(tmp_path, '[policy]\nkind = "mlp"\npath = "net.npz"\nhidden = [64, 64]\n')
    (spec_dir / "net.npz").write_bytes(init_weights(env.observation_space, env.action_space, hidden=(32, 32)).to_bytes())
    assert_one_line_error(invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--no-report"),
                          "[policy] hidden = [64, 64] does not match the network in net.npz (4-32-32-2 layers, tanh)",
                          "remove hidden/activation from [policy] or make them match")


def test_evaluate_on_explicit_seeds_with_a_specs_task(tmp_path, runner):
    spec_dir = _spec_dir(tmp_path, "max_episode_steps = 30\n")
    seeds_file = tmp_path / "seeds.txt"
    seeds_file.write_text("5 9\n11,", encoding="utf-8")
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--spec", spec_dir, "--seeds", str(seeds_file),
                 "--workers", "1")
    assert res.exit_code == 0, res.output
    rows = [ln.split("│") for ln in res.stdout.splitlines() if ln.count("│") > 3]
    assert [r[1].strip() for r in rows] == ["5", "9", "11"]
    balancer = tmp_path / "balancer.py"
    balancer.write_text('PARAMETERS = {"k": {"default": 0.5, "low": 0.0, "high": 1.0}}\n\n\n'
                        'def act(observation, params):\n'
                        '    return int(observation[2] + params["k"] * observation[3] > 0)\n', encoding="utf-8")
    res = invoke(runner, "evaluate", balancer, "--spec", spec_dir, "--seeds", "1,2", "--workers", "1")
    assert res.exit_code == 0 and "over 2 episodes" in res.stdout and "60 env steps" in res.stdout  # capped at 30
    assert_one_line_error(invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1",
                                 "--seeds", "1,x"), "'x' is not a whole number")
    assert_one_line_error(invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1",
                                 "--seeds", str(tmp_path / "missing.txt")), "missing.txt: no such file")
    assert_one_line_error(invoke(runner, "evaluate", DATA / "cartpole_linear.py"), "--env ID or", "--spec")


def test_evaluate_seeds_refuse_conflicts_and_folders(tmp_path, runner, monkeypatch):
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "--seeds", "1,2",
                 "--episodes", "5")
    assert_one_line_error(res, "leave out --episodes and --seed")
    assert_one_line_error(invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "--seeds",
                                 str(tmp_path)), "is a folder")
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("# held-out seeds\n3\n\n4  # the hard one\n", encoding="utf-8")
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "--seeds", str(seeds),
                 "--workers", "1")
    assert res.exit_code == 0 and "over 2 episodes" in res.stdout, res.output
    # told apart from a list by what the text can be, not by how a file name usually looks
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1",
                                 "--seeds", "heldout"), "--seeds heldout: no such file")
    (tmp_path / "7seeds").write_text("5 6 7\n", encoding="utf-8")
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "--seeds", "7seeds",
                 "--workers", "1")
    assert res.exit_code == 0 and "over 3 episodes" in res.stdout, res.output


def test_a_seeds_file_is_read_bounded(runner, tmp_path):
    """`evaluate --seeds /dev/zero` (or an endless pipe) is refused in one line after a bounded read (regression: it
    read until the memory ran out); a seed of more digits than Python converts is out of range, in one line
    (regression: a StopIteration traceback)."""
    from ratchet.cli import _MAX_SEEDS_FILE_BYTES

    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "--seeds", "/dev/zero")
    assert_one_line_error(res, "--seeds /dev/zero: the seeds file is too large", f"over {_MAX_SEEDS_FILE_BYTES:,} bytes")
    res = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "--seeds", "9" * 5000)
    assert_one_line_error(res, "--seeds: seeds must be in [0, 2**63)")


@pytest.mark.parametrize("args, fragment", [
    (["run", "examples/cartpole", "--seed", "-1"], "Invalid value for '--seed'"),
    (["evaluate", "examples/cartpole/policy.py", "--env", "CartPole-v1", "--episodes", "0"], "'--episodes'"),
    (["show"], "Missing argument 'RUN'"),
    (["bogus"], "No such command 'bogus'"),
    # pathlib drops a trailing separator: these wrote a file named "newdir" (the run is not even opened)
    (["export", "some-run", "-o", "newdir/"], "newdir/ names a folder; give a file name in it"),
    (["report", "some-run", "-o", "newdir/"], "newdir/ names a folder"),
    (["replay", "some-run", "--video", "clips/"], "clips/ names a folder"),
])
def test_usage_errors_are_one_line_too(args, fragment):
    """Checks Typer makes itself (ranges, missing arguments, unknown commands) end like every other bad input:
    one `error:` line and exit status 2, no box."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "ratchet.cli", *args], cwd=root, capture_output=True, text=True,
                         timeout=120, check=False)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0] and "--help" in lines[0]


def test_a_starting_policy_that_fails_every_validation_episode_stops_the_run_before_any_search(runner, tmp_path):
    """No generation, no training job: the stop reason quotes the policy's error and names the command that
    shows the episodes, and `ratchet run` exits 1 (the input is bad), with the run recorded as finished."""
    from conftest import make_spec_dir

    spec_dir = make_spec_dir(tmp_path / "s", budget={"env_steps": 5000}, gate={"validation_episodes": 4},
                             test={"episodes": 2})
    (spec_dir / "policy.py").write_text('PARAMETERS = {"k": {"default": 0.5, "low": 0.0, "high": 1.0}}\n\n'
                                        "def act(observation, params):\n"
                                        "    raise ValueError('boom: this policy cannot act')\n", encoding="utf-8")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "b", "--no-report")
    assert res.exit_code == 1, res.output
    assert "failed all 4 of its validation episodes" in res.output and "boom: this policy cannot act" in res.output
    assert "ratchet evaluate --run" in res.output
    start = next(ln for ln in res.stdout.splitlines() if "│ start" in ln)  # every test episode errored:
    assert start.split("│")[2].strip() == "–" and "0.00" not in start  # no return to show, not a score of 0.00
    # new-user trial: a "refined" row equal to the start was shown, as if something had been refined
    assert "│ refined" not in res.stdout
    assert ("refined: none (nothing was promoted, and the start failed all 2 of its test episodes: policy raised "
            "ValueError: boom: this policy cannot act") in res.stdout
    assert "(an errored episode's return counts what it earned before the error)" in res.stdout
    events = read_events(tmp_path / "runs" / "b")
    assert not events_of(events, EventType.GENERATION_FINISHED)
    assert project(events).status == "finished"


@pytest.mark.parametrize("damage", ["nan", "text"])
def test_an_mlp_npz_with_non_finite_weights_or_not_an_npz_is_refused_in_one_line(runner, tmp_path, damage):
    import io

    import gymnasium as gym
    import numpy as np
    from conftest import make_spec_dir

    from ratchet.policies import mlp

    spec_dir = make_spec_dir(tmp_path / "s", budget={"env_steps": 30_000})
    env = gym.make("CartPole-v1")
    arrays = dict(np.load(io.BytesIO(mlp.init_weights(env.observation_space, env.action_space, hidden=(4,)).to_bytes())))
    if damage == "nan":
        arrays["W0"] = arrays["W0"] * np.nan
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        (spec_dir / "net.npz").write_bytes(buf.getvalue())
    else:
        (spec_dir / "net.npz").write_text("hello", encoding="utf-8")
    toml = (spec_dir / "ratchet.toml").read_text(encoding="utf-8")
    (spec_dir / "ratchet.toml").write_text(toml.replace('[policy]\npath = "policy.py"',
                                                        '[policy]\nkind = "mlp"\npath = "net.npz"'), encoding="utf-8")
    res = invoke(runner, "run", spec_dir, "--runs-dir", tmp_path / "runs", "--run-id", "m")
    line = assert_one_line_error(res, "net.npz: not an mlp .npz written by `ratchet export`", "ratchet export RUN")
    assert "allow_pickle" not in line and not (tmp_path / "runs" / "m").exists()
    if damage == "nan":
        assert "NaN or infinite" in line


# -- help texts (issue 18 §6) ---------------------------------------------------------------------

def _help_sources():
    """``(command path, help text as written in cli.py)`` for the group and every command: docstrings and
    each option's and argument's help, read from the Typer app (never from the click commands it builds)."""
    import inspect

    def texts(path, info):
        own = info.help or inspect.getdoc(info.callback) or ""
        params = inspect.signature(info.callback).parameters.values()
        return [(path, own)] + [(path, p.default.help) for p in params if getattr(p.default, "help", None)]

    out = texts((), app.registered_callback) + [((), app.info.help)]
    for info in app.registered_commands:
        out += texts((info.name or info.callback.__name__.replace("_", "-"),), info)
    return out


# regression (was a bug): `ratchet evaluate --help` read "A ratchet.toml whose  to use" and `ratchet run --help`
# "a [] table": Typer read help texts as Rich markup, which ate "[task]" and "[[refiners]]"
def test_every_help_text_keeps_its_bracketed_words(runner):
    sources = _help_sources()
    assert {path for path, _ in sources} >= {(), ("run",), ("evaluate",), ("show",), ("critique",)}
    bracketed = [(path, word) for path, text in sources for word in re.findall(r"\[+[^\[\]\s]+\]+", text)]
    assert (("evaluate",), "[task]") in bracketed and (("run",), "[[refiners]]") in bracketed
    pages: dict[tuple[str, ...], str] = {}
    for path, word in bracketed:
        if path not in pages:
            res = invoke(runner, *path, "--help")
            assert res.exit_code == 0, res.output
            pages[path] = res.stdout
        assert word in pages[path], (path, word)
        assert "\\[" not in pages[path], path  # escaped, but the backslash never shows


# -- what a new user tripped on (issue 18 §6) ------------------------------------------------------

CARTPOLE_SUCCESS = "return ≥ 475 (CartPole-v1's registered reward_threshold)"


# regression: `run`, `show`, `critique`, `evaluate` and the report gave success rates without saying what success is
def test_every_success_rate_says_what_success_is_and_where_its_threshold_comes_from(cli_run, finished_run, runner,
                                                                                    tmp_path):
    res, _ = cli_run
    assert f"success: {CARTPOLE_SUCCESS}" in res.stdout.splitlines()
    _, run_dir, _ = finished_run
    show = invoke(runner, "show", run_dir)
    assert re.search(r"success +│ return ≥ 475 \(CartPole-v1's registered", show.stdout), show.stdout
    critique = invoke(runner, "critique", run_dir, "--split", "test")
    assert "success rate" in critique.stdout and "return ≥ 475 (CartPole-v1's registered" in critique.stdout
    assert "endings:" in critique.stdout and "time-outs (truncated)" in critique.stdout
    evaluate = invoke(runner, "evaluate", DATA / "cartpole_linear.py", "--env", "CartPole-v1", "-n", "2")
    assert f"success: {CARTPOLE_SUCCESS}" in evaluate.stdout.splitlines()
    out = tmp_path / "report.html"
    assert invoke(runner, "report", run_dir, "-o", out, "--no-videos").exit_code == 0
    html = out.read_text(encoding="utf-8")
    assert "<p>success: return ≥ 475 (CartPole-v1&#x27;s registered reward_threshold)</p>" in html


# regression: the summary's "2.0 s" was under half of the command's 5.9 s, with nothing saying what it leaves out
def test_the_run_summary_says_what_its_time_counts_and_what_the_command_took(cli_run):
    res, _ = cli_run
    summary = next(ln for ln in res.stdout.splitlines() if ln.startswith("env steps "))
    run_time = float(re.search(r"· ([\d.]+) s run time ·", summary).group(1))
    note = next(ln for ln in res.stdout.splitlines() if ln.startswith("(run time: "))
    assert "start-up and the report are outside it" in note and "[budget] wall_clock_s" in note
    assert float(re.search(r"this command took ([\d.]+) s\)$", note).group(1)) >= run_time


@pytest.fixture(scope="module")
def little_run(tmp_path_factory, runner):
    """A run whose gates validation keeps too dear for [gate] max_share: it promotes (next to) nothing."""
    root = tmp_path_factory.mktemp("little")
    spec_dir = _spec_dir(root, "[gate]\nvalidation_episodes = 10\nmax_share = 0.01\n[budget]\nenv_steps = 8000\n"
                               "[test]\nepisodes = 2\n[execution]\nworkers = 1\n")
    res = invoke(runner, "run", spec_dir, "--runs-dir", root / "runs", "--run-id", "little", "--no-report")
    assert res.exit_code == 0, res.output
    return res, root / "runs" / "little"


# regression: only `show` and the report said why a run promoted little; `ratchet run` ended without a word
def test_run_ends_with_the_advice_show_gives_when_it_promoted_little(little_run):
    from ratchet.advice import run_advice

    res, run_dir = little_run
    advice = run_advice(project(read_events(run_dir)))
    assert advice and any("max_share" in line for line in advice)
    assert [ln.removeprefix("advice: ") for ln in res.stdout.splitlines() if ln.startswith("advice: ")] == advice
    assert res.stdout.splitlines()[-1] == f"run directory: {run_dir}"


def test_ctrl_c_after_the_run_finished_does_not_ask_for_a_resume(monkeypatch, capsys, tmp_path):
    """Ctrl-C while the finished run's report is written: the run is done, so `ratchet resume` would only say
    "already finished"; the message points at `show` and `report` instead."""
    import types

    import typer

    from ratchet import cli

    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_finish", interrupted)
    with pytest.raises(typer.Exit) as exc:
        cli._with_progress(lambda progress: types.SimpleNamespace(run_dir=tmp_path / "r1"), str(tmp_path / "r1"),
                           True, None)
    assert exc.value.exit_code == 130
    text = capsys.readouterr().err
    assert "ratchet resume" not in text and f"ratchet report {tmp_path / 'r1'}" in text

    def stopped(progress):
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit):
        cli._with_progress(stopped, str(tmp_path / "r2"), True, None)
    assert f"ratchet resume {tmp_path / 'r2'}" in capsys.readouterr().err


def test_ctrl_c_says_the_run_is_stopping_at_once(capsys, tmp_path):
    """Ctrl-C during a run: a line says the run is stopping at the press, before the run's workers and ledger are
    closed (which takes a moment), then the usual line says how to resume it."""
    import signal
    import time

    import typer

    from ratchet import cli

    while_stopping: list[str] = []

    def drive(progress):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # the run, interrupted here
        finally:  # closing the workers and the ledger: what the person sees meanwhile
            while_stopping.append(capsys.readouterr().err)

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, whatever started pytest
    try:
        with pytest.raises(typer.Exit) as exc:
            cli._with_progress(drive, str(tmp_path / "r"), True, None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is the run's only
    finally:
        signal.signal(signal.SIGINT, outer)
    assert exc.value.exit_code == 130
    assert "interrupted; stopping the run" in while_stopping[0]
    assert f"interrupted; continue with `ratchet resume {tmp_path / 'r'}`" in capsys.readouterr().err


def _printed(monkeypatch, infos: list[dict], clock: list[float]) -> list[str]:
    """What ``ratchet run``'s progress printer (not live) prints for ``infos``, the i-th at ``clock[i]`` seconds."""
    from io import StringIO

    from rich.console import Console

    from ratchet import progress
    from ratchet.planner import Usage
    from ratchet.spec import BudgetSpec

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    buf = StringIO()
    printer = progress.ProgressPrinter(Console(file=buf, width=400, markup=False), live=False)
    for info, t in zip(infos, clock):
        now[0] = t
        printer({"best_train_mean": 1.0, "incumbent_validation_mean": 0.5, "gated": False, "promoted": False,
                 "usage": Usage(env_steps=int(info.pop("frac") * 1000)), "budget": BudgetSpec(env_steps=1000),
                 **info})
    return buf.getvalue().splitlines()


def test_a_resumed_run_marks_where_it_resumed_and_estimates_from_what_it_runs(monkeypatch):
    """The generations a resumed run reads back from its ledger take no time: they are shown as recorded, a line
    marks where this session's work begins, and the time left comes from the generations run since."""
    infos = [{"generation": 1, "frac": 0.5, "replayed": True}, {"generation": 2, "frac": 0.6, "replayed": True},
             {"generation": 3, "frac": 0.7, "replayed": False}, {"generation": 4, "frac": 0.8, "replayed": False}]
    lines = _printed(monkeypatch, infos, [0.1, 0.2, 10.2, 20.2])
    assert len(lines) == 5 and "recorded" in lines[0] and "recorded" in lines[1]
    assert lines[2].startswith("── resumed here: generations 1–2 above were recorded before"), lines[2]
    assert lines[3].startswith("gen   3") and "≈30 s left" in lines[3]  # 10 s for 0.1 of the budget, 0.3 left
    assert lines[4].startswith("gen   4") and "≈20 s left" in lines[4]
    fresh = _printed(monkeypatch, [{"generation": 1, "frac": 0.5}], [10.0])  # a run that never stopped: as ever
    assert len(fresh) == 1 and "≈10 s left" in fresh[0]


def test_a_no_gate_note_is_said_once(monkeypatch):
    """decide = "end" skips the gate every generation for the same reason: the first generation says it."""
    end = 'decide = "end": the gate decides when the search ends'
    infos = [{"generation": g, "frac": 0.1 * g, "gate_note": end} for g in (1, 2, 3)]
    infos.append({"generation": 4, "frac": 0.4, "gate_note": "not better on training seeds"})
    infos.append({"generation": 5, "frac": 0.5, "gate_note": end})
    lines = _printed(monkeypatch, infos, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert lines[0].endswith(f"| no gate: {end}"), lines[0]
    assert lines[1].endswith("| no gate: same as above") and lines[2].endswith("| no gate: same as above")
    assert lines[3].endswith("| no gate: not better on training seeds")
    assert lines[4].endswith("| no gate: same as gen 1"), lines[4]


def test_a_refiner_that_stops_while_others_go_on_says_so(monkeypatch):
    """A refiner taken out of the run (its endpoint down) gets one line: which, why, and that the run goes on."""
    why = "3 requests in a row failed, the last: cannot reach http://127.0.0.1:9/v1"
    infos = [{"generation": 1, "frac": 0.1, "refiner": "llm", "n_refiners": 2,
              "retired": {"llm": why}, "going_on": ["cmaes"]}, {"generation": 2, "frac": 0.2}]
    lines = _printed(monkeypatch, infos, [1.0, 2.0])
    assert len(lines) == 3 and lines[0].startswith("gen   1 llm")
    assert lines[1] == f"llm stopped: {why}; the run goes on with cmaes", lines[1]


def test_python_dash_m_ratchet_is_the_same_command_line():
    """``python -m ratchet`` works where the ``ratchet`` script is not on PATH: the same commands, the same one-line
    error and exit status for a bad option."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "ratchet", "--help"], capture_output=True, text=True, timeout=120,
                        check=False)
    assert ok.returncode == 0 and "run" in ok.stdout and "resume" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "ratchet", "show", "--no-such-option"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and len(bad.stderr.strip().splitlines()) == 1


def test_resuming_a_run_whose_folder_cannot_be_written_is_one_line(finished_run, runner, tmp_path, monkeypatch):
    """A read-only runs folder (a mount, another user's runs): `ratchet resume` says so in one line, no traceback."""
    import errno

    from ratchet import runs

    _, run_dir, _ = finished_run
    shutil.copytree(run_dir, tmp_path / run_dir.name)
    real_open = os.open

    def read_only(path, *args, **kw):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kw)

    monkeypatch.setattr(runs.os, "open", read_only)
    res = runner.invoke(app, ["resume", run_dir.name, "--runs-dir", str(tmp_path)])
    assert res.exit_code == 1, res.output
    assert res.output.strip().startswith(f"error: cannot write run {run_dir.name}: Read-only file system"), res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_show_counts_rejected_proposals_by_the_reasons_the_ledger_records(finished_run, runner, tmp_path):
    """`ratchet show` says why its proposals were rejected, counted from the proposal_rejected events (it listed
    every possible reason before, whatever the run recorded)."""
    from ratchet.ledger.events import EventType
    from ratchet.runs import open_run

    run_dir = tmp_path / "runs" / "cp-ref"
    shutil.copytree(finished_run[1], run_dir)
    ledger, _ = open_run(run_dir)
    try:
        for i, (reason, detail) in enumerate(
                [("duplicate: same source as candidate c1 (gen 1); you proposed this already", {"duplicate_of": "c1"})]
                * 6 + [("screened out by the world model (ranked below the candidates run)", {})] * 3):
            ledger.append(EventType.PROPOSAL_REJECTED, f"rejected/9/test/{i}", {
                "generation": 9, "refiner": "test", "parent_id": "c0", "reason": reason, "source": None,
                "detail": detail})
    finally:
        ledger.close()
    out = " ".join(re.sub("[│┃]", " ", invoke(runner, "show", run_dir).stdout).split())
    assert "rejected proposals 9 (6 duplicates, 3 screened out by the world model)" in out
    # the report's heading counts them the same way (it listed every possible reason, whatever the run recorded)
    from ratchet.report.html import render_report

    page = render_report(project(read_events(run_dir)))
    assert ("<summary>9 proposal(s) rejected before any episode or by the cascade (6 duplicates, 3 screened out by "
            "the world model)</summary>") in page


def test_report_replays_no_episode_the_ledger_records_as_timed_out_and_waits_the_runs_own_limit(
        tmp_path, runner, finished_run, monkeypatch):
    """The report's GIF replays skip episodes the ledger records as failed (a hanging policy's: each would only time
    out again, with no GIF) and wait the run's own episode_timeout_s with the replay margin, not 60 s or more
    whatever the run's limit (regression: a report of a run whose every episode timed out after 3 s took 2 min)."""
    from ratchet.execution.process import ProcessExecutor
    from ratchet.report.video import render_failure_examples
    from ratchet.rollout import Episode

    replays: list[tuple[float, list[int]]] = []

    def run(self, task, jobs, **kwargs):
        replays.append((self.episode_timeout_s, [j.seed for j in jobs]))
        return [Episode.failed(j.seed, "not replayed in this test", task=task) for j in jobs]

    d = tmp_path / "s"
    d.mkdir()
    shutil.copy(DATA / "policy_sleeps.py", d / "policy.py")
    (d / "ratchet.toml").write_text('[task]\nenv_id = "CartPole-v1"\n[gate]\nvalidation_episodes = 3\n[budget]\n'
                                    'target = 0\n[test]\nepisodes = 3\n[execution]\nworkers = 1\n'
                                    'episode_timeout_s = 1\n', encoding="utf-8")
    invoke(runner, "run", d, "--runs-dir", tmp_path / "runs", "--run-id", "hang", "--no-report")
    st = project(read_events(tmp_path / "runs" / "hang"))
    assert st.baseline_test_critique["failure_modes"]  # every test episode timed out (or was skipped after one did)
    monkeypatch.setattr(ProcessExecutor, "run", run)  # the replays, not the run
    res = invoke(runner, "report", "hang", "--runs-dir", tmp_path / "runs")
    assert res.exit_code == 0, res.output
    assert replays == []
    # an episode that finished is replayed with the run's limit and its margin
    st = project(read_events(finished_run[1]))
    st.spec["execution"]["episode_timeout_s"] = 3
    notes: list[str] = []
    render_failure_examples(st, tmp_path / "videos", max_modes=1, note=notes.append)
    assert [t for t, _ in replays] == [6.0] and "at most 6 s each" in notes[0]


def test_a_final_decision_that_gated_nothing_says_the_incumbent_stands() -> None:
    """A final decision the budget could not pay for read like a failure after a run that promoted: it says no final
    gate ran and the incumbent stands; a gate that ran keeps its note."""
    from ratchet.cli import _final_decision_text

    note = "the budget left cannot pay for a confirmation and the final validation"
    assert _final_decision_text({"gated": False, "promoted": False, "note": note}) == \
        f"none ({note}); the incumbent stands"
    assert _final_decision_text({"gated": True, "promoted": False, "note": "not significant: p = 0.36"}) == \
        "not significant: p = 0.36"
    assert _final_decision_text({"gated": True, "promoted": True, "note": "p = 0.001"}) == "promoted p = 0.001"


def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it(tmp_path):
    """A run started with SIGINT ignored (`nohup`, a background job of a non-interactive shell) does not take it over
    while it runs, and leaves it ignored."""
    import signal

    import typer

    from ratchet import cli
    from ratchet.errors import RatchetError

    seen: list[object] = []

    def drive(progress):
        seen.append(signal.getsignal(signal.SIGINT))
        raise RatchetError("stopped here")

    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(typer.Exit):
            cli._with_progress(drive, str(tmp_path / "r"), True, None)
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, outer)
    assert seen == [signal.SIG_IGN] and after is signal.SIG_IGN


def test_standin_prints_its_url_answers_an_edit_and_stops_on_ctrl_c(tmp_path):
    """`ratchet standin --port 0` prints one line naming base_url (and model), answers a chat-completions request
    built as the llm refiner builds it with an edit that applies to the program and changes it, and on Ctrl-C says
    it stopped and exits 0."""
    import signal
    import subprocess
    import sys
    import threading
    import urllib.request

    from ratchet.refiners.llm import apply_edits, build_prompt, parse_answer
    from ratchet.refiners.structural import check_source

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child's Ctrl-C as at a terminal, whatever
    try:                                                                # started pytest (a handler is not inherited)
        proc = subprocess.Popen([sys.executable, "-m", "ratchet", "standin", "--port", "0", "--seed", "3"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    finally:
        signal.signal(signal.SIGINT, outer)
    guard = threading.Timer(120, proc.kill)  # a hung server fails the test instead of hanging it
    guard.start()
    try:
        line = proc.stdout.readline()
        url = re.search(r'base_url = "(http://127\.0\.0\.1:\d+/v1)"', line).group(1)
        assert 'model = "stand-in"' in line and "api_key_env" in line and "Ctrl-C" in line
        with urllib.request.urlopen(url + "/models", timeout=30) as reply:
            assert [m["id"] for m in json.load(reply)["data"]] == ["stand-in"]
        source = (DATA / "cartpole_linear.py").read_text(encoding="utf-8")
        body = {"model": "stand-in", "seed": 7,
                "messages": build_prompt({"env_id": "CartPole-v1"}, source, None, [])}
        request = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            content = json.load(reply)["choices"][0]["message"]["content"]
        edited = apply_edits(source, parse_answer(content))
        assert edited != source and check_source(edited).defaults != check_source(source).defaults
        proc.send_signal(signal.SIGINT)
        rest, errors = proc.communicate(timeout=60)
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, errors
    assert rest.splitlines() == ["stand-in stopped after 1 requests"] and "Traceback" not in errors


def test_standin_on_a_port_in_use_is_one_line(runner):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert_one_line_error(invoke(runner, "standin", "--port", port), f"cannot serve on 127.0.0.1:{port}",
                              "--port")


def test_a_short_run_of_the_standin_example_proposes_llm_candidates_that_run_episodes(runner, tmp_path):
    """examples/cartpole/standin.toml (the docs' recipe) against the stand-in `ratchet standin` serves: every
    request is answered with an edit that becomes candidates (none refused, none a duplicate), and they run their
    training episodes."""
    from pathlib import Path

    from ratchet.refiners.standin import MODEL, StandIn

    server = StandIn(models=[MODEL])
    try:
        spec = Path(__file__).resolve().parents[1] / "examples" / "cartpole" / "standin.toml"
        res = invoke(runner, "run", spec, "--runs-dir", tmp_path / "runs", "--run-id", "si", "--no-report",
                     "--set", f"refiners.0.base_url={server.url}", "--set", "budget.env_steps=5000",
                     "--set", "gate.validation_episodes=5",
                     "--set", "test.episodes=5")
    finally:
        server.stop()
    assert res.exit_code == 0, res.output
    events = read_events(tmp_path / "runs" / "si")
    calls = events_of(events, EventType.LLM_CALL)
    assert len(calls) >= 2 and len(server.requests) == len(calls)
    proposed = {e.payload["candidate"]["id"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)
                if e.payload["candidate"]["refiner"] == "llm"}
    assert len(proposed) >= len(calls)  # each answer a new program (its variants besides)
    assert not events_of(events, EventType.PROPOSAL_REJECTED)
    trained = {e.payload["candidate_id"] for e in events_of(events, EventType.EPISODES_EVALUATED)
               if e.payload["split"] == "train" and e.payload["episodes"]}
    assert proposed <= trained
