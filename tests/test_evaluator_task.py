"""Evaluator tasks (:mod:`ratchet.tasks.evaluator`): a trusted evaluator scores a policy's functions on problem
instances made from seeds (or read from a data set), through the same loop, gate, ledger, sandbox, resume and
replay as an environment; a hostile candidate is a recorded failure, an evaluator that raises stops the run in
one line naming the instance."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import LastFirst, SimulatedKill, incumbent_test_episode, read_events
from test_refiner_contract import Dying

from ratchet.errors import PolicyError, SpecError, TaskError
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.protocol import decode_reply, encode_value
from ratchet.loop import resume_run, start_run
from ratchet.planner import SeedSplits
from ratchet.policy import Candidate, parse_policy
from ratchet.spec import load_spec, spec_from_dict
from ratchet.tasks import task_from_dict
from ratchet.tasks.evaluator import EvaluatorTask, split_of

#: Guess a hidden target (2.0) from three hints: the candidate's guess(hint, pair, params) is called three times
#: per instance; each call costs one "hint". A guess more than 1 away is the labelled failure "far off".
EVALUATOR = '''
import numpy as np
from ratchet.tasks.evaluator import CandidateError

FUNCTIONS = {"guess": "guess(hint, pair, params) -> float: the hidden target's estimate"}
DESCRIPTION = "Guess a hidden number from hints."
COST_UNIT = "hints"
MAX_COST = 3

def make_instance(seed):
    rng = np.random.default_rng(seed)
    return {"hints": rng.normal(size=3), "target": 2.0}

def evaluate(instance, policy):
    errors = []
    for h in instance["hints"]:
        g = policy.guess(float(h), np.array([h, -h]))
        if not isinstance(g, (int, float)):
            raise CandidateError(f"guess returned {type(g).__name__}, expected a number")
        errors.append(abs(g - instance["target"]))
    mean = float(np.mean(errors))
    out = {"score": -mean, "cost": 3, "diagnostics": {"mean_error": mean}}
    if mean > 1:
        out.update(failure="far off", text=f"mean error {mean:.2f} on hints {np.round(instance['hints'], 2).tolist()}")
    return out
'''

POLICY = '''
PARAMETERS = {"b": {"default": 0.0, "low": -5.0, "high": 5.0}, "w": {"default": 0.5, "low": -2.0, "high": 2.0}}

def guess(hint, pair, params):
    return params["b"] + params["w"] * 0.1 * hint
'''


def _spec_dir(tmp_path: Path, evaluator: str = EVALUATOR, source: str = POLICY, **over: dict) -> Path:
    d = tmp_path / "spec"
    d.mkdir(parents=True, exist_ok=True)
    (d / "evaluate.py").write_text(evaluator)
    (d / "policy.py").write_text(source)
    (d / "data.txt").write_text("the test instances' answers")
    sections = {"task": {"kind": "evaluator", "evaluator": "evaluate.py"}, "policy": {"path": "policy.py"},
                "refiners": [{"kind": "cmaes", "popsize": 4, "sigma0": 0.5}], "planner": {"train_episodes": 3},
                "gate": {"validation_episodes": 12, "max_share": 0.9, "spending": "none"},
                "budget": {"episodes": 160}, "test": {"episodes": 6},
                "execution": {"workers": 1, "episode_timeout_s": 20}, **over}
    lines = ["seed = 3"]
    for name, table in sections.items():
        rows = table if isinstance(table, list) else [table]
        for row in rows:
            lines.append(f"[[{name}]]" if isinstance(table, list) else f"[{name}]")
            lines += [f"{k} = {_toml(v)}" for k, v in row.items()]
    (d / "ratchet.toml").write_text("\n".join(lines) + "\n")
    return d


def _toml(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    return json.dumps(v)


def test_an_evaluator_run_keeps_the_splits_promotes_and_counts_its_cost_unit(tmp_path: Path) -> None:
    spec = load_spec(_spec_dir(tmp_path))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        result = start_run(spec, tmp_path / "runs", run_id="ev", executor=ex)
    finally:
        ex.close()
    assert result.test.mean > result.baseline_test.mean + 1  # from about -2 (guessing 0) to near 0
    events = read_events(tmp_path / "runs" / "ev")
    evals = [e.payload for e in events if e.type.value == "episodes_evaluated"]
    for ev in evals:  # every split draws its own seeds, and each instance costs its MAX_COST of 3 hints
        assert {split_of(s) for s in ev["seeds"]} == {ev["split"]}
        assert all(ep["length"] == 3 and ep["diagnostics"]["calls"] == 3 for ep in ev["episodes"])
    started = next(e for e in events if e.type.value == "run_started").payload
    assert started["task"]["kind"] == "evaluator" and "def evaluate" in started["task"]["source"]
    baseline = next(ev for ev in evals if ev["split"] == "validation")
    assert all(ep["diagnostics"]["failure"] == "far off" for ep in baseline["episodes"])  # the start guesses ~0
    gated = [e.payload for e in events if e.type.value == "gate_decided"]
    assert any(g["promoted"] for g in gated)
    train = sum(ev["summary"]["n"] for ev in evals if ev["split"] != "test")
    assert train <= 160 and sum(ev["summary"]["env_steps"] for ev in evals if ev["split"] != "test") == 3 * train


def test_failure_modes_come_from_the_evaluators_labels_and_reach_the_critique(tmp_path: Path) -> None:
    from ratchet.critic import Critic, Evaluation

    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    cand = Candidate.create(POLICY, {"b": 0.0, "w": 0.5})
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        eps = ex.run(task, [Job(cand, s) for s in (0, 3, 6)])
    finally:
        ex.close()
    crit = Critic.for_task(task).critique(Evaluation(cand.id, "train", tuple(eps)))
    assert [(m.label, m.count) for m in crit.failure_modes] == [("far off", 3)]  # a label fails an instance
    assert crit.failure_modes[0].description.startswith("mean error")  # described by the worst one's text
    assert crit.stats["success_rate"] is None  # without SUCCESS the task still defines no success
    assert all(e.diagnostics["failure"] == "far off" and "mean error" in e.diagnostics["text"] for e in eps)
    assert all(e.diagnostics["scores"]["mean_error"] > 1 for e in eps)
    successful = EvaluatorTask.from_file(_write(tmp_path / "s", EVALUATOR + '\nSUCCESS = "every guess within 1"\n'))
    assert successful.is_success(0.0, False, False) is False and "SUCCESS" in successful.success_rule()
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        eps = ex.run(successful, [Job(cand, s) for s in (0, 3, 6)])
    finally:
        ex.close()
    crit = Critic.for_task(successful).critique(Evaluation(cand.id, "train", tuple(eps)))
    assert [(m.label, m.count) for m in crit.failure_modes] == [("far off", 3)]
    assert "far off" in crit.text


def _write(d: Path, source: str, name: str = "evaluate.py") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(source)
    return d / name


def test_a_killed_evaluator_run_resumes_to_the_same_decisions_and_replays_bit_for_bit(tmp_path: Path) -> None:
    spec = load_spec(_spec_dir(tmp_path))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        start_run(spec, tmp_path / "a", run_id="r", executor=ex)
    finally:
        ex.close()
    dying = Dying(die_after=40)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "b", run_id="r", executor=dying)
    dying.close()
    (tmp_path / "spec" / "evaluate.py").write_text(EVALUATOR.replace("2.0}", "-3.0}"))  # resume keeps the recorded one
    ex = LastFirst(workers=1, episode_timeout_s=20)  # the start's test episodes complete before the incumbent's
    try:
        resume_run("r", tmp_path / "b", executor=ex)
    finally:
        ex.close()

    def decisions(run_dir):
        return [(e.type.value, e.payload.get("candidate_id"), e.payload.get("promoted"))
                for e in read_events(run_dir) if e.type.value in ("gate_decided", "candidate_promoted")]

    assert decisions(tmp_path / "a" / "r") == decisions(tmp_path / "b" / "r")
    from typer.testing import CliRunner

    from ratchet.cli import app

    st, episodes = incumbent_test_episode(tmp_path / "b" / "r")  # what replay replays by default
    def tested(run_dir):
        return [e.payload["candidate_id"] for e in read_events(run_dir)
                if e.type.value == "episodes_evaluated" and e.payload["split"] == "test"]

    assert tested(tmp_path / "b" / "r") == tested(tmp_path / "a" / "r")  # recorded in the call's order, whatever
    assert set(tested(tmp_path / "a" / "r")) == {st.baseline_id, st.incumbent_id}  # completed first
    worst = min(episodes, key=lambda e: e["episode_return"])
    res = CliRunner().invoke(app, ["replay", "r", "--runs-dir", str(tmp_path / "b"), "--seed", str(worst["seed"])])
    assert res.exit_code == 0 and "match: identical return and length" in res.output, res.output
    assert f"candidate {st.incumbent_id} seed {worst['seed']}: return {worst['episode_return']!r}" in res.output
    assert "(3 hints" in res.output


HOSTILE = {
    "raises": "def guess(h, pair, params):\n    return 1 / 0\n",
    "nan": "def guess(h, pair, params):\n    return float('nan')\n",
    "a string": "def guess(h, pair, params):\n    return 'two'\n",
    "nan in an array": "import numpy as np\ndef guess(h, pair, params):\n    return np.array([np.nan, 1.0])\n",
    "reads the evaluator's folder": ("def guess(h, pair, params):\n    import os\n"
                                     "    return float(len(open(os.environ.get('DATA', '/nonexistent')).read()))\n"),
    "walks the frames": ("import sys\ndef guess(h, pair, params):\n    f = sys._getframe()\n"
                         "    while f.f_back is not None:\n        f = f.f_back\n"
                         "    f.f_globals['__builtins__']['abs'] = lambda x: 0.0\n    return 2.5\n"),
    "hangs": "def guess(h, pair, params):\n    while True:\n        pass\n",
}


@pytest.mark.parametrize("how", list(HOSTILE))
def test_a_hostile_candidate_fails_its_instances_and_is_recorded(tmp_path: Path, how: str) -> None:
    import tempfile

    from ratchet.execution.sandbox import isolation

    if how == "reads the evaluator's folder":  # a folder anyone may read: only the sandbox's hiding keeps it out
        if isolation() != "bwrap":
            pytest.skip("hiding the evaluator's folder needs bubblewrap")
        tmp_path = Path(tempfile.mkdtemp(prefix="ratchet-evaluator-", dir="/tmp"))
        tmp_path.chmod(0o755)
    d = _spec_dir(tmp_path)
    for f in (d, *d.iterdir()):
        f.chmod(0o755)
    task = EvaluatorTask.from_file(d / "evaluate.py")
    source = "PARAMETERS = {}\n" + HOSTILE[how].replace("/nonexistent", str(d / "data.txt"))
    ex = ProcessExecutor(workers=1, episode_timeout_s=3)
    try:
        eps = ex.run(task, [Job(Candidate.create(source, {}), s) for s in (0, 3)])
        honest = ex.run(task, [Job(Candidate.create(POLICY, {"b": 2.0, "w": 0.0}), 0)])[0]
    finally:
        ex.close()
    if how == "walks the frames":  # the frames it walks are its own process's: the score is the evaluator's
        assert all(e.error is None and e.episode_return == pytest.approx(-0.5) for e in eps)
    else:
        assert all(e.error and e.episode_return == 0.0 and e.length == 0 for e in eps), [e.error for e in eps]
        assert {"raises": "ZeroDivisionError", "nan": "returned nan", "a string": "returned str",
                "nan in an array": "non-finite", "hangs": "timeout",
                "reads the evaluator's folder": "No such file"}[how] in eps[0].error
    assert honest.error is None and honest.episode_return == 0.0  # the evaluator is untouched


def test_an_evaluator_that_raises_stops_the_run_in_one_line_naming_the_instance(tmp_path: Path) -> None:
    broken = EVALUATOR.replace('    errors = []', '    if instance["hints"][0] > 0:\n        raise KeyError("bins")\n'
                               '    errors = []')
    spec = load_spec(_spec_dir(tmp_path, broken))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    with pytest.raises(TaskError, match=r"evaluator error on instance \d+: evaluate raised KeyError: 'bins' — the "
                                        r"task's fault, not the candidate's") as info:
        try:
            start_run(spec, tmp_path / "runs", run_id="bad", executor=ex)
        finally:
            ex.close()
    assert "\n" not in str(info.value)


#: An evaluator whose make_instance raises on instances 1, 4, 7, ...: before the candidate is started.
MAKE_RAISES = EVALUATOR.replace("def make_instance(seed):\n", "def make_instance(seed):\n    if seed % 3 == 1:\n"
                                "        raise ValueError('mk bug')\n")


def test_an_evaluator_whose_make_instance_raises_is_the_tasks_fault_naming_the_instance(tmp_path: Path) -> None:
    # make_instance fails before the candidate is started: the task's fault, one line naming the instance, as when
    # evaluate raises; not the candidate's "worker died (exit code 0)" (the env host asked a policy process that had
    # started nothing to end the episode, and it exited). The instances after it on that pair are scored: another
    # candidate's (nothing was started, so nothing is retired) and this one's (its source travels with its first
    # start, not its first job)
    from typer.testing import CliRunner

    from ratchet.cli import app

    task = EvaluatorTask.from_file(_write(tmp_path / "mk", MAKE_RAISES))
    a, b = (Candidate.create(POLICY, {"b": v, "w": 0.0}) for v in (2.0, 1.5))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20, death_retries=0)  # a pair lost on the way is not hidden
    try:
        eps = [ex.run(task, [Job(c, seed)])[0] for c, seed in ((a, 1), (b, 3), (b, 4), (a, 0), (a, 6))]  # in turn
    finally:
        ex.close()
    for e, seed in ((eps[0], 1), (eps[2], 4)):
        assert e.diagnostics.get("fault") == "task" and e.error == (
            f"evaluator error on instance {seed}: make_instance raised ValueError: mk bug"), e.error
    assert [e.error for e in (eps[1], eps[3], eps[4])] == [None, None, None]
    assert [eps[1].episode_return, eps[3].episode_return, eps[4].episode_return] == [-0.5, 0.0, 0.0]
    spec = load_spec(_spec_dir(tmp_path / "run", MAKE_RAISES))
    with pytest.raises(TaskError, match=r"evaluator error on instance \d+: make_instance raised ValueError: mk bug — "
                                        r"the task's fault, not the candidate's") as info:
        start_run(spec, tmp_path / "runs", run_id="mk")
    assert "\n" not in str(info.value)
    d = _spec_dir(tmp_path / "cli", MAKE_RAISES)
    res = CliRunner().invoke(app, ["evaluate", str(d / "policy.py"), "--spec", str(d), "--seeds", "1,0",
                                   "--workers", "1"])
    assert res.exit_code == 1 and "evaluator error on instance 1: make_instance raised ValueError: mk bug — the " \
        "task's fault" in res.output, res.output


def test_data_set_instances_keep_their_splits_and_held_out_sizes_are_checked(tmp_path: Path) -> None:
    data_set = EVALUATOR.replace("def make_instance(seed):", "INSTANCES = 30\n\ndef make_instance(seed):\n"
                                 "    assert 0 <= seed < 30\n")
    task = EvaluatorTask.from_file(_write(tmp_path / "ds", data_set))
    pools = task.seed_pools()
    assert pools == {s: tuple(range(c, 30, 3)) for c, s in enumerate(("train", "validation", "test"))}
    huge = data_set.replace("INSTANCES = 30", "INSTANCES = 10**7")  # every run would shuffle ten million numbers
    with pytest.raises(TaskError, match=r"INSTANCES = 10,000,000: at most 1,000,000 .* leave out INSTANCES"):
        EvaluatorTask.from_file(_write(tmp_path / "huge", huge))
    splits = SeedSplits(7, pools)
    assert sorted(splits.seeds("validation", 0, 10)) == list(range(1, 30, 3))
    assert len(set(splits.seeds("train", 0, 25))) == 10  # training draws repeat once the pool is used
    with pytest.raises(TaskError, match=r"\[gate\] validation_episodes = 12 but the data set has 10 validation "
                                        r"instances; set \[gate\] validation_episodes to at most 10"):
        splits.check_sizes(12, 5)
    spec = load_spec(_spec_dir(tmp_path, data_set))
    with pytest.raises(TaskError, match="validation_episodes = 12"):
        start_run(spec, tmp_path / "runs", run_id="ds")
    assert not (tmp_path / "runs" / "ds").exists()


@pytest.mark.parametrize(("change", "message"), [
    (("FUNCTIONS = {", "FUNCTIONS_ = {"), "define FUNCTIONS"),
    (('"guess(hint, pair, params)', '"guess hint'), "must start with the signature"),
    (("MAX_COST = 3", ""), "needs MAX_COST"),
    (("def evaluate(", "def score("), "define evaluate()"),
    (("import numpy as np", "import numpy as np\n1 / 0"), "fails to load: ZeroDivisionError"),
])
def test_a_malformed_evaluator_is_refused_at_load_in_one_line(tmp_path: Path, change, message) -> None:
    d = _spec_dir(tmp_path, EVALUATOR.replace(*change))
    with pytest.raises(SpecError, match=message) as info:
        load_spec(d)
    assert "\n" not in str(info.value)


def test_the_policy_contract_is_the_evaluators_functions(tmp_path: Path) -> None:
    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    assert task.functions == {"guess": 3} and task.cost_unit == "hints" and task.step_limit == 3
    with pytest.raises(PolicyError, match=r"no top-level function guess\(x1, x2, params\)"):
        parse_policy("PARAMETERS = {}\ndef act(o, params):\n    return 0\n", functions=task.functions)
    with pytest.raises(PolicyError, match="guess must take 3 arguments"):
        parse_policy("PARAMETERS = {}\ndef guess(h, params):\n    return 0\n", functions=task.functions)
    parse_policy(POLICY, functions=task.functions)
    assert "guess(hint, pair, params)" in task.describe()
    spec = load_spec(_spec_dir(tmp_path, source=POLICY.replace("def guess", "def gues")))
    with pytest.raises(PolicyError, match="no top-level function guess"):
        start_run(spec, tmp_path / "runs", run_id="p")
    with pytest.raises(SpecError, match="env_id, max_episode_steps"):
        spec_from_dict({"task": {"kind": "evaluator", "evaluator": "evaluate.py", "env_id": "CartPole-v1",
                                 "max_episode_steps": 9}, "policy": {"path": "policy.py"}}, tmp_path / "spec")
    residual = load_spec(_spec_dir(tmp_path, policy={"kind": "residual", "path": "policy.py"}))
    with pytest.raises(PolicyError, match="calls guess\\(\\); use kind = \"program\""):
        start_run(residual, tmp_path / "runs", run_id="m")


def test_call_answers_cross_the_boundary_as_numbers_arrays_and_structures_of_them() -> None:
    import numpy as np

    from ratchet.rollout import Opaque

    value = {"a": (1, 2.5, True), "b": [np.arange(3, dtype=np.int16), {"c": np.ones((2, 2))}]}
    back = decode_reply(encode_value(value), "value")
    assert back["a"] == (1, 2.5, True) and back["b"][0].dtype == np.int16 and back["b"][1]["c"].shape == (2, 2)
    assert isinstance(decode_reply(encode_value(object()), "value"), Opaque)
    assert isinstance(decode_reply(encode_value({1: 2}), "value"), Opaque)  # non-text keys: opaque
    deep: list = []
    for _ in range(20):
        deep = [deep]
    assert isinstance(decode_reply(encode_value(deep), "value")[0][0][0][0][0][0][0][0], Opaque)
    from ratchet.execution.protocol import BadReply

    for forged in (b"t\xff\xff\xff\xff", b"t\x01\x00\x00\x00\x09\x00\x00\x00i", b"m\x01\x00\x00\x00\x02\x00\x00\x00\xff\xfe"):
        with pytest.raises(BadReply):
            decode_reply(forged, "value")


def test_ratchet_evaluate_and_the_report_work_on_an_evaluator_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ratchet.cli import app

    d = _spec_dir(tmp_path)
    wide = CliRunner(env={"COLUMNS": "250"})  # the table's title holds the policy's path: no wrapping in it
    res = wide.invoke(app, ["evaluate", str(d / "policy.py"), "--spec", str(d), "-n", "4", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "12 hints" in res.output and "on evaluate" in res.output
    header = next(ln for ln in res.output.splitlines() if "instance" in ln and "score" in ln)  # not gym's columns
    assert "cost" in header and "terminated" not in header and "over 4 instances" in res.output
    # the evaluator's failure labels: a column, and a count per label (the start policy guesses about 0: far off)
    assert "failure" in header and sum("far off" in ln for ln in res.output.splitlines()) == 5
    assert "failures: far off 4" in res.output
    res = CliRunner().invoke(app, ["run", str(d), "--runs-dir", str(tmp_path / "runs"), "--run-id", "c",
                                   "--set", "budget.episodes=60"])
    assert res.exit_code == 0, res.output
    assert "hints" in res.output
    show = CliRunner().invoke(app, ["show", "c", "--runs-dir", str(tmp_path / "runs")])
    assert show.exit_code == 0 and "hints went to" in show.output
    assert (tmp_path / "runs" / "c" / "report.html").is_file()
    export = CliRunner().invoke(app, ["export", "c", "--runs-dir", str(tmp_path / "runs"), "-o", str(tmp_path / "out.py")])
    assert export.exit_code == 0, export.output
    parse_policy((tmp_path / "out.py").read_text(), functions={"guess": 3})


def test_evaluator_source_is_checked_against_its_digest(tmp_path: Path) -> None:
    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    d = task.to_dict()
    assert task_from_dict(d) == task
    with pytest.raises(TaskError, match="does not match its SHA-256"):
        task_from_dict({**d, "source": d["source"] + "\n# changed\n"})
    assert textwrap.dedent(task_from_dict(d).source) == d["source"]


#: An LLM's answer for POLICY: a whole new file whose guess uses the hint's sign too (a new tunable number).
LLM_EDIT = """Use the hint's sign as well.
```python
PARAMETERS = {"b": {"default": 0.0, "low": -5.0, "high": 5.0}, "w": {"default": 0.5, "low": -2.0, "high": 2.0},
              "s": {"default": 0.0, "low": -1.0, "high": 1.0}}

def guess(hint, pair, params):
    return params["b"] + params["w"] * 0.1 * hint + params["s"] * (1.0 if hint > 0 else -1.0)
```
"""


def test_the_llm_refiner_edits_an_evaluator_tasks_functions_from_its_description_and_critique(tmp_path, standin):
    server = standin(default=LLM_EDIT)
    d = _spec_dir(tmp_path, EVALUATOR + '\nSUCCESS = "every guess within 1 of the target"\n',
                  refiners=[{"kind": "llm", "base_url": server.url, "model": "stand-in", "proposals": 1,
                             "variants": 2, "retries": 0}], budget={"episodes": 60})
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        start_run(load_spec(d), tmp_path / "runs", run_id="llm", executor=ex)
    finally:
        ex.close()
    system, user = (m["content"] for m in server.requests[0]["body"]["messages"])
    assert "heuristic programs" in system and "Gymnasium" not in system + user
    assert "Guess a hidden number from hints." in user and "guess(hint, pair, params)" in user
    later = server.requests[-1]["body"]["messages"][1]["content"]
    assert "far off" in later, later  # the critique: failing training instances, by the evaluator's label
    proposed = [e.payload["candidate"] for e in read_events(tmp_path / "runs" / "llm")
                if e.type.value == "candidate_proposed" and e.payload["candidate"]["refiner"] == "llm"]
    assert proposed and all("s" in c["params"] for c in proposed)


def test_a_screen_on_an_evaluator_task_is_noted_at_start_and_shown_as_having_no_effect(tmp_path: Path) -> None:
    """An evaluator records no transitions (no environment stepped): `[model] screen = true` gets one note at the start
    saying it has no effect and why, decided from the task's declared ``records_transitions``; `ratchet show` (and
    its --json, and the report) then says the screen was unused, with the same reason, not that it is on and
    screened 0 generations."""
    from typer.testing import CliRunner

    from ratchet.cli import app

    d = _spec_dir(tmp_path, model={"screen": True})
    notes: list[str] = []
    load_spec(d, notes=notes)
    assert len(notes) == 1 and "[model] screen has no effect" in notes[0], notes
    assert "the task (evaluator) records no transitions" in notes[0] and "trusted_rollouts" not in notes[0]
    res = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["run", str(d), "--runs-dir", str(tmp_path / "runs"),
                                                         "--run-id", "scr", "--set", "budget.episodes=60"])
    assert res.stdout.startswith("note: [model] screen has no effect in this run"), res.stdout
    show = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["show", str(tmp_path / "runs" / "scr")])
    line = " ".join(next(ln for ln in show.stdout.splitlines() if "world model" in ln).strip("│ ").split())
    assert "screen unused: the task (evaluator) records no transitions" in line and "screen on" not in line, line
    data = json.loads(CliRunner().invoke(app, ["show", str(tmp_path / "runs" / "scr"), "--json"]).stdout)
    assert data["world_model"]["unused"].startswith("the task (evaluator) records no transitions")
    report = (tmp_path / "runs" / "scr" / "report.html").read_text()
    assert "screen unused: the task (evaluator) records no transitions" in report and "screen on:" not in report


def test_a_screen_that_can_never_screen_runs_every_proposal_even_with_unscreened_kept(tmp_path: Path) -> None:
    """`[model] unscreened = "kept"` runs only a screened generation's share of the proposals while the model waits for
    transitions; on a task that records none it would wait for ever, so every proposal runs, as without the screen."""
    spec = load_spec(_spec_dir(tmp_path, model={"screen": True, "unscreened": "kept"}, budget={"episodes": 60}))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        start_run(spec, tmp_path / "runs", run_id="kept", executor=ex)
    finally:
        ex.close()
    events = read_events(tmp_path / "runs" / "kept")
    assert not [e for e in events if e.type.value == "proposal_rejected"]
    gens = [e.payload for e in events if e.type.value == "generation_finished"]
    assert gens and all(not g.get("screen_waiting") for g in gens)


def test_an_evaluator_may_define_dataclasses(tmp_path: Path) -> None:
    source = "from __future__ import annotations\nfrom dataclasses import dataclass\n\n@dataclass\nclass Inst:\n" \
             "    hints: list\n\n" + EVALUATOR
    task = EvaluatorTask.from_file(_write(tmp_path / "dc", source))
    assert task.functions == {"guess": 3}


def test_mutate_and_cmaes_together_refine_an_evaluator_tasks_program(tmp_path: Path) -> None:
    spec = load_spec(_spec_dir(tmp_path, refiners=[{"kind": "cmaes", "popsize": 4, "sigma0": 0.5},
                                                   {"kind": "mutate", "programs": 2, "variants": 2}],
                               budget={"episodes": 200}))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        result = start_run(spec, tmp_path / "runs", run_id="mu", executor=ex)
    finally:
        ex.close()
    events = read_events(tmp_path / "runs" / "mu")
    mutants = [e.payload["candidate"] for e in events if e.type.value == "candidate_proposed"
               and e.payload["candidate"]["refiner"].startswith("mutate")]
    assert mutants and all("def guess" in (c["source"] or "def guess") for c in mutants)
    assert result.test.mean > result.baseline_test.mean


@pytest.mark.parametrize("name", ["or_style.toml", "weibull.toml"])
def test_the_bin_packing_examples_mutate_table_uncommented_refines_priority(tmp_path: Path, name: str) -> None:
    # the examples' comment says mutate works on evaluator tasks: their commented table, uncommented, loads and its
    # refiner proposes checked rewrites of priority() (no act() needed)
    import shutil

    import numpy as np

    from ratchet.proposals import check_source
    from ratchet.refiners.mutate import MutateSettings, MutationRefiner, _Space
    from ratchet.tasks import task_from_spec

    example = Path(__file__).parent.parent / "examples" / "bin_packing"
    text = (example / name).read_text(encoding="utf-8")
    assert '# kind = "mutate"' in text and "works on evaluator tasks" in text
    for f in ("evaluate.py", "policy.py"):
        shutil.copy(example / f, tmp_path / f)
    (tmp_path / name).write_text(text.replace("# [[refiners]]", "[[refiners]]").replace('# kind = "mutate"',
                                                                                       'kind = "mutate"'))
    spec = load_spec(tmp_path / name)
    assert [r["kind"] for r in spec.refiners] == ["cmaes", "mutate"]
    task = task_from_spec(spec.task)
    start = Candidate.create((example / "policy.py").read_text(encoding="utf-8"), {})
    refiner = MutationRefiner(_Space(None, None), MutateSettings(**{k: v for k, v in spec.refiners[1].items() if k != "kind"}),
                              functions=task.functions)
    proposed = refiner.propose(start, None, np.random.default_rng(0))
    assert proposed and all(check_source(c.source, functions=task.functions) for c in proposed)


def test_task_options_reach_the_evaluator_as_OPTIONS_and_are_stored_with_the_task(tmp_path: Path) -> None:
    source = EVALUATOR.replace('"target": 2.0}', '"target": float(OPTIONS.get("target", 2.0))}')
    d = _spec_dir(tmp_path, source, task={"kind": "evaluator", "evaluator": "evaluate.py", "options": {"target": -1.0}})
    spec = load_spec(d)
    task = EvaluatorTask.from_spec(spec.task)
    assert task.options == {"target": -1.0} and task_from_dict(task.to_dict()) == task
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        ep = ex.run(task, [Job(Candidate.create(POLICY, {"b": -1.0, "w": 0.0}), 0)])[0]
    finally:
        ex.close()
    assert ep.episode_return == 0.0  # the guess -1 is exact for target -1
    with pytest.raises(SpecError, match="options belong to evaluator tasks"):
        spec_from_dict({"task": {"env_id": "CartPole-v1", "options": {"a": 1}}})


def test_a_slow_evaluator_is_cut_at_the_instance_timeout_and_blamed_not_the_candidate(tmp_path: Path) -> None:
    slow = EVALUATOR.replace("    errors = []", "    import time\n    time.sleep(120)\n    errors = []")
    task = EvaluatorTask.from_file(_write(tmp_path / "slow", slow))
    ex = ProcessExecutor(workers=1, episode_timeout_s=1)
    try:
        t0 = __import__("time").monotonic()
        eps = ex.run(task, [Job(Candidate.create(POLICY, {"b": 2.0, "w": 0.0}), s) for s in (0, 3)])
        took = __import__("time").monotonic() - t0
    finally:
        ex.close()
    assert took < 60  # cut at 1 s (and worker start-ups, slow on a loaded machine), never the evaluator's 120 s
    assert all(e.diagnostics.get("fault") == "task" and "the evaluator's own code ran" in e.error for e in eps)
    spec = load_spec(_spec_dir(tmp_path, slow, execution={"workers": 1, "episode_timeout_s": 1}))
    with pytest.raises(TaskError, match="evaluator's own code ran .* raise \\[execution\\] episode_timeout_s"):
        start_run(spec, tmp_path / "runs", run_id="slow")


def test_a_make_instance_that_hangs_is_cut_at_the_instance_timeout_and_blamed_not_the_candidate(tmp_path: Path) -> None:
    # the evaluator's own code ran out its clock before the candidate was started: the task's fault, as a hanging
    # evaluate is (it was "make_instance raised RolloutAborted", then the candidate's "worker died (exit code 0)")
    hangs = EVALUATOR.replace("def make_instance(seed):\n", "def make_instance(seed):\n    if seed % 3 == 1:\n"
                              "        import time\n        time.sleep(120)\n")
    task = EvaluatorTask.from_file(_write(tmp_path / "hang", hangs))
    ex = ProcessExecutor(workers=1, episode_timeout_s=1)
    try:
        eps = ex.run(task, [Job(Candidate.create(POLICY, {"b": 2.0, "w": 0.0}), s) for s in (1, 0)])
    finally:
        ex.close()
    assert eps[0].diagnostics.get("fault") == "task" and eps[0].error.startswith(
        "evaluator error on instance 1: the evaluator's own code ran"), eps[0].error
    assert eps[1].error is None and eps[1].episode_return == 0.0
    spec = load_spec(_spec_dir(tmp_path, hangs, execution={"workers": 1, "episode_timeout_s": 1}))
    with pytest.raises(TaskError, match=r"evaluator error on instance \d+: the evaluator's own code ran .* the task's "
                                        r"fault, not the candidate's") as info:
        start_run(spec, tmp_path / "runs", run_id="hang")
    assert "\n" not in str(info.value)


#: Candidates whose start is slow: loading the module, or its reset(), takes a minute.
SLOW_STARTS = {"module": "import time\ntime.sleep(120)\n",
               "reset": "import time\ndef reset(params, seed):\n    time.sleep(120)\n"}


def test_time_is_charged_to_whoever_used_it_and_a_slow_start_is_the_candidates_failure(tmp_path: Path) -> None:
    # each side has the instance's limit: a candidate's slow module load or reset is its own timeout (never the
    # evaluator's fault, which would stop the run for good), and an instance where both sides take most of the limit
    # is scored (margins of seconds: a loaded machine may leave a process unscheduled for a second or two)
    import time

    slowish = EVALUATOR.replace("    errors = []", "    import time\n    time.sleep(3.6)\n    errors = []")
    task = EvaluatorTask.from_file(_write(tmp_path / "slowish", slowish))
    slow_starts = [Candidate.create("PARAMETERS = {}\n" + code + "def guess(h, pair, params):\n    return 2.0\n", {})
                   for code in SLOW_STARTS.values()]
    thinks = Candidate.create("PARAMETERS = {}\nimport time\ndef guess(h, pair, params):\n    time.sleep(1.2)\n"
                              "    return 2.0\n", {})
    ex = ProcessExecutor(workers=1, episode_timeout_s=6)
    try:
        t0 = time.monotonic()
        eps = ex.run(task, [Job(c, s) for c in slow_starts for s in (0, 3)] + [Job(thinks, 0)])
        took = time.monotonic() - t0
    finally:
        ex.close()
    assert took < 90  # two 6 s timeouts, 7.2 s and start-ups; one slow start let run takes 120 s
    for e in eps[:4]:  # the candidate's failure (its second instance skipped), not the task's
        assert e.error and "timeout after 6 s" in e.error and not e.diagnostics.get("fault"), e.error
    assert eps[4].error is None and eps[4].episode_return == 0.0  # 3.6 s of its own and 3.6 s of answers: scored


#: A candidate that leaves four processes spinning on the CPU it shares with the evaluator's process (each in a session
#: of its own, so the scheduler weighs each as much as the evaluator), to run the evaluator's clock out for it.
SPINNER = '''PARAMETERS = {}
import os

def guess(h, pair, params):
    if not os.environ.get("SPUN"):
        os.environ["SPUN"] = "1"
        for _ in range(4):
            if os.fork() == 0:
                os.setsid()
                while True:
                    pass
    return 2.0
'''


def test_a_candidate_cannot_run_the_evaluators_clock_out_by_taking_its_cpu(tmp_path: Path) -> None:
    # the evaluator's own code needs 1 s of CPU after the candidate's first answer; the candidate's processes leave it
    # a fifth of the CPU (5 s of wall clock, past the 3 s limit): the time it waited for the CPU is not its own
    busy = EVALUATOR.replace("    mean = float(np.mean(errors))", "    import time\n    t0 = time.thread_time()\n"
                             "    while time.thread_time() - t0 < 1.0:\n        pass\n    mean = float(np.mean(errors))")
    task = EvaluatorTask.from_file(_write(tmp_path / "busy", busy))
    ex = ProcessExecutor(workers=1, episode_timeout_s=3)
    try:
        (ep,) = ex.run(task, [Job(Candidate.create(SPINNER, {}), 0)])
    finally:
        ex.close()
    assert ep.error and not ep.diagnostics.get("fault"), ep.error  # the candidate's failure (it left processes)


#: A candidate that keeps the seed it is started with and answers with it: different instances would tell apart.
SEED_RECORDER = '''PARAMETERS = {}
import random
SEEN = [-1]

def reset(params, seed):
    SEEN[0] = seed

def guess(h, pair, params):
    return float(SEEN[0] % 1000) + random.random()
'''


@pytest.mark.parametrize("trusted", [True, False])
def test_a_candidate_gets_no_instance_seed_to_make_the_instance_from(tmp_path: Path, trusted: bool) -> None:
    from ratchet.execution.sandbox import Sandbox

    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    ex = ProcessExecutor(workers=1, episode_timeout_s=20, sandbox=Sandbox(trusted_rollouts=trusted))
    try:
        eps = ex.run(task, [Job(Candidate.create(SEED_RECORDER, {}), s) for s in (0, 3, 7)])
    finally:
        ex.close()
    assert all(e.error is None for e in eps), [e.error for e in eps]
    assert len({e.episode_return for e in eps}) == 1  # the same seed (and random draws) on every instance


#: How an evaluator's own process dies on instance 1 (make_instance runs there), and whether that is certainly its
#: own doing (a crash, an exit) or may have come from outside (SIGKILL: the OOM killer, a user).
CRASHES = {"segfault": ("os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV"),
           "exits": ("os._exit(3)", "exit code 3"), "killed": ("os.kill(os.getpid(), signal.SIGKILL)", None)}


@pytest.mark.parametrize("how", list(CRASHES))
def test_an_evaluator_that_kills_its_own_process_is_the_tasks_fault_naming_it(tmp_path: Path, how: str) -> None:
    from ratchet.execution.sandbox import isolation

    if isolation() != "bwrap":  # elsewhere policy code could signal the env host itself: a death stays uncertain
        pytest.skip("telling the evaluator's death from the candidate's needs bubblewrap")
    code, said = CRASHES[how]
    crashes = EVALUATOR.replace("def make_instance(seed):\n", "def make_instance(seed):\n    import os, signal\n"
                                f"    if seed % 3 == 1:\n        {code}\n")
    task = EvaluatorTask.from_file(_write(tmp_path / "crash", crashes))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        eps = ex.run(task, [Job(Candidate.create(POLICY, {"b": 2.0, "w": 0.0}), s) for s in (0, 1, 3)])
    finally:
        ex.close()
    if said is None:  # uncertain: the candidate's failure, as any death
        assert "died" in eps[1].error and not eps[1].diagnostics.get("fault")
        return
    assert eps[1].diagnostics.get("fault") == "task" and eps[1].error == (
        f"evaluator {task.path} on instance 1: the process running it died ({said})")
    assert [e.error for e in (eps[0], eps[2])] == [None, None]  # the candidate's other instances are scored
    spec = load_spec(_spec_dir(tmp_path / "run", crashes))
    with pytest.raises(TaskError, match=r"evaluate\.py on instance \d+: the process running it died .* the task's "
                                        r"fault, not the candidate's") as info:
        start_run(spec, tmp_path / "runs", run_id="crash")
    assert "\n" not in str(info.value)


def test_an_env_host_that_dies_while_the_candidate_is_asked_is_the_candidates_failure(tmp_path: Path) -> None:
    import os
    import signal
    import threading
    import time

    from ratchet.execution.envhost import PHASE_FILE
    from ratchet.execution.sandbox import isolation

    if isolation() != "bwrap":
        pytest.skip("needs bubblewrap (elsewhere every env host death is the candidate's)")
    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    waits = Candidate.create("PARAMETERS = {}\nimport time\ndef guess(h, pair, params):\n    time.sleep(30)\n"
                             "    return 2.0\n", {})
    ex = ProcessExecutor(workers=1, episode_timeout_s=60, death_retries=0)
    killed = []

    def crash_it_while_the_candidate_is_asked() -> None:  # the same signal as a crash, from outside, in phase P
        end = time.monotonic() + 60
        while time.monotonic() < end and not killed:
            for w in list(ex._workers):
                try:
                    phase = (Path(w.hostdir) / PHASE_FILE).read_bytes()[:1]
                except OSError:
                    continue
                if phase == b"P":
                    os.kill(w.host.pid, signal.SIGSEGV)
                    killed.append(w)
            time.sleep(0.05)

    thread = threading.Thread(target=crash_it_while_the_candidate_is_asked, daemon=True)
    thread.start()
    try:
        (ep,) = ex.run(task, [Job(waits, 0)])
    finally:
        thread.join()
        ex.close()
    assert killed and "died" in ep.error and not ep.diagnostics.get("fault"), ep.error


def test_the_cli_refuses_what_an_evaluator_task_cannot_do_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ratchet.cli import app

    d = _spec_dir(tmp_path, EVALUATOR.replace('    errors = []', '    if instance["hints"][0] > 0:\n'
                                              '        raise KeyError("bins")\n    errors = []'))
    res = CliRunner().invoke(app, ["evaluate", str(d / "policy.py"), "--spec", str(d), "-n", "6", "--workers", "1"])
    assert res.exit_code == 1 and "evaluate raised KeyError: 'bins' — the task's fault" in res.output
    data_set = EVALUATOR.replace("def make_instance(seed):", "INSTANCES = 30\n\ndef make_instance(seed):")
    d2 = _spec_dir(tmp_path / "ds", data_set, gate={"validation_episodes": 6}, test={"episodes": 3})
    res = CliRunner().invoke(app, ["evaluate", str(d2 / "policy.py"), "--spec", str(d2), "--seeds", "3,45"])
    assert res.exit_code == 1 and "seed 45 is not an instance of" in res.output
    with pytest.raises(SpecError, match="keep one rule for success"):
        load_spec(_spec_dir(tmp_path / "two", EVALUATOR + '\nSUCCESS = "x"\n',
                            task={"kind": "evaluator", "evaluator": "evaluate.py", "success_threshold": 0.5}))
    d3 = _spec_dir(tmp_path / "ok")
    run = CliRunner().invoke(app, ["run", str(d3), "--runs-dir", str(tmp_path / "runs"), "--run-id", "v",
                                   "--set", "budget.episodes=60", "--no-report"])
    assert run.exit_code == 0, run.output
    seed = next(e.payload["seeds"][0] for e in read_events(tmp_path / "runs" / "v") if e.type.value == "episodes_evaluated")
    res = CliRunner().invoke(app, ["replay", "v", "--runs-dir", str(tmp_path / "runs"), "--seed", str(seed),
                                   "--video", str(tmp_path / "x.gif")])
    assert res.exit_code == 1 and "no frames to record" in res.output and not (tmp_path / "x.gif").exists()


#: Candidate A takes over its process's channel and never retires: it answers every later message itself.
HIJACKER = '''PARAMETERS = {}
import sys, pickle

def guess(h, pair, params):
    from ratchet.execution.protocol import encode_value
    chan = sys._getframe(1).f_locals.get("chan")
    chan.send(encode_value(2.0))
    while True:
        msg = pickle.loads(chan.recv()[1:])
        reply = {"call": encode_value(2.0), "episode": b"K", "end": b'S{"strays": 0}', "retire": b"X"}[msg[0]]
        chan.send(reply)
'''
#: Candidate A leaves a module (and a file) behind for the next candidate's imports and reads.
PLANTER = '''PARAMETERS = {}
import os

def guess(h, pair, params):
    for d in (".", "..", os.environ.get("HOME", ".")):
        try:
            with open(os.path.join(d, "statistics.py"), "w") as f:
                f.write("def fmean(xs):\\n    return 2.0\\n")
        except OSError:
            pass
    return 0.0
'''
HONEST_IMPORTS = '''PARAMETERS = {}
import statistics

def guess(h, pair, params):
    return statistics.fmean([h, -h]) + 0.5 * h
'''


@pytest.mark.parametrize("attacker", ["hijacker", "planter"])
def test_a_candidate_cannot_answer_for_or_plant_code_in_the_next_candidate(tmp_path: Path, attacker: str) -> None:
    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    a = Candidate.create(HIJACKER if attacker == "hijacker" else PLANTER, {})
    b = Candidate.create(HONEST_IMPORTS, {})
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        alone = ex.run(task, [Job(b, s) for s in (0, 3, 6)])
        ex.close()
        ex = ProcessExecutor(workers=1, episode_timeout_s=20)
        after = ex.run(task, [Job(a, s) for s in (0, 3)] + [Job(b, s) for s in (0, 3, 6)])
    finally:
        ex.close()
    assert all(e.error is None for e in alone) and len({e.episode_return for e in alone}) == 3
    assert [e.to_dict() for e in after[2:]] == [e.to_dict() for e in alone]  # B's own scores, not A's forgeries


def test_answers_that_overflow_and_arguments_that_cannot_cross_are_blamed_rightly(tmp_path: Path) -> None:
    from ratchet.tasks.evaluator import as_array

    task = EvaluatorTask.from_file(_spec_dir(tmp_path) / "evaluate.py")
    huge = Candidate.create("PARAMETERS = {}\ndef guess(h, pair, params):\n    return 1.7e308\n", {})
    passes_object = EVALUATOR.replace("g = policy.guess(float(h), np.array([h, -h]))",
                                      "g = policy.guess(float(h), object())")
    exits = EVALUATOR.replace("    errors = []", "    raise SystemExit('bye')\n    errors = []")
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        (big,) = ex.run(task, [Job(huge, 0)])
        (obj,) = ex.run(EvaluatorTask.from_file(_write(tmp_path / "o", passes_object)), [Job(huge, 0)])
        (bye,) = ex.run(EvaluatorTask.from_file(_write(tmp_path / "x", exits)), [Job(huge, 0)])
    finally:
        ex.close()
    assert "beyond ±1e+12" in big.error and not big.diagnostics.get("fault")  # the candidate's failure
    assert obj.diagnostics.get("fault") == "task" and "was passed a object" in obj.error
    assert bye.diagnostics.get("fault") == "task" and "SystemExit: bye" in bye.error
    with pytest.raises(CandidateError_, match=r"shape \(3,\), expected \(2,\)"):
        as_array([1, 2, 3], (2,), "scores")
    with pytest.raises(CandidateError_, match="not a numeric array"):
        as_array([1.0, [2.0], 3.0], None, "scores")
    with pytest.raises(TaskError, match="fails to load: SystemExit"):
        EvaluatorTask.from_file(_write(tmp_path / "imp", "import sys\nsys.exit('no')\n" + EVALUATOR))


from ratchet.tasks.evaluator import CandidateError as CandidateError_


def test_an_evaluator_run_counts_its_instances_once_in_its_own_words(tmp_path: Path) -> None:
    """Without COST_UNIT every instance costs 1, one the candidate failed too: the run counts its instances with one
    number, and `run`, `show`, the dashboard (runs table and run page) and the critique say instances and scores, not
    episodes, returns and time-outs (it counted "instances 2,850", "episodes 2,940" and 2,840 on the dashboard)."""
    from typer.testing import CliRunner

    from ratchet.cli import app
    from ratchet.dashboard import RunPage
    from ratchet.dashboard.views import run_row
    from ratchet.ledger.projection import project
    from ratchet.ledger.sqlite import SQLiteLedger

    plain = EVALUATOR.replace('COST_UNIT = "hints"\nMAX_COST = 3\n', "").replace('"cost": 3, ', "")
    fails = POLICY.replace("    return params", "    if params[\"w\"] > 0.9:\n        raise ValueError(\"w\")\n"
                                                "    return params")
    d = _spec_dir(tmp_path, plain, fails, refiners=[{"kind": "cmaes", "popsize": 4, "sigma0": 1.0}])
    runner = CliRunner(env={"COLUMNS": "250"})
    res = runner.invoke(app, ["run", str(d), "--runs-dir", str(tmp_path / "runs"), "--run-id", "n",
                              "--set", "budget.episodes=80", "--no-report"])
    assert res.exit_code == 0, res.output
    st = project(read_events(tmp_path / "runs" / "n"))
    failed = [ep for ev in st.evaluations for ep in ev["episodes"] if ep["error"]]
    assert failed and all(ep["length"] == 1 for ep in failed)  # a failed instance costs its 1 as well
    assert st.env_steps == st.episodes and st.used() == [("instances", st.episodes)]
    summary = next(ln for ln in res.stdout.splitlines() if " s run time · " in ln)
    assert summary.startswith(f"instances {st.episodes:,} · ") and "episodes" not in summary, summary
    assert all("episodes" not in ln for ln in res.stderr.splitlines() if ln.startswith("gen ")), res.stderr
    show = runner.invoke(app, ["show", "n", "--runs-dir", str(tmp_path / "runs")])
    assert f"instances {st.episodes:,} (" in show.stdout and "env_steps" not in show.stdout, show.stdout
    ledger = SQLiteLedger(tmp_path / "runs" / "n" / "ledger.sqlite", readonly=True)
    try:
        row, _ = run_row(ledger, "n")
        page = RunPage("n")
        page.refresh(ledger)
        view = page.view()
    finally:
        ledger.close()
    assert row["used"] == view["used"] == [["instances", st.episodes]]
    assert (view["episode_unit"], view["return_name"]) == ("instances", "score")
    critique = runner.invoke(app, ["critique", "n", "--runs-dir", str(tmp_path / "runs")])
    assert "mean score" in critique.stdout and "instances)" in critique.stdout, critique.stdout
    assert "mean return" not in critique.stdout and "time-outs" not in critique.stdout


def test_an_answer_of_another_type_than_declared_is_the_candidates_failure_never_the_tasks(tmp_path: Path) -> None:
    """An evaluator that trusts its declared return type (``float(policy.f(x))`` for ``f(x, params) -> float``) must
    not make a candidate's list answer the task's fault (a run stopped for good: its resume reruns the candidate):
    the answer is checked against FUNCTIONS' ``-> float`` first, and is the candidate's recorded failure."""
    trusting = '''
FUNCTIONS = {"f": "f(x, params) -> float: a number"}
def make_instance(seed):
    return seed % 7
def evaluate(instance, policy):
    return -abs(float(policy.f(instance)) - 1.0)
'''
    listy = '''
PARAMETERS = {"a": {"default": 0.0, "low": -1.0, "high": 1.0}}
def f(x, params):
    return [params["a"]] if params["a"] > 0.4 else params["a"]
'''
    task = EvaluatorTask.from_file(_write(tmp_path / "t", trusting))
    prog = parse_policy(listy, functions=task.functions)
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        good, bad = ex.run(task, [Job(prog.candidate({"a": 0.2}), 0), Job(prog.candidate({"a": 0.9}), 0)])
    finally:
        ex.close()
    assert good.error is None and good.episode_return == pytest.approx(-0.8)
    assert bad.error and "f() returned a list; FUNCTIONS declares -> float" in bad.error
    assert not bad.diagnostics.get("fault")


def test_evaluate_with_a_spec_takes_its_episode_timeout(tmp_path: Path) -> None:
    """``ratchet evaluate --spec`` uses the spec's ``[execution] episode_timeout_s`` unless ``--timeout`` is given
    (it used 60 s whatever the spec said)."""
    import time

    from typer.testing import CliRunner

    from ratchet.cli import app

    hangs = POLICY.replace("    return params", "    import time\n    time.sleep(120)\n    return params")
    d = _spec_dir(tmp_path, source=hangs, execution={"workers": 1, "episode_timeout_s": 2})
    t0 = time.monotonic()
    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["evaluate", str(d / "policy.py"), "--spec", str(d), "-n", "1"])
    assert time.monotonic() - t0 < 40
    assert "timeout after 2 s on seed 0" in res.output and "every episode failed" in res.output, res.output


#: One fixed problem (issue 43): the score depends on the candidate alone, so the task may be declared deterministic.
DETERMINISTIC = '''
FUNCTIONS = {"value": "value(x, params) -> float: a number"}

def make_instance(seed):
    return 1.0

def evaluate(x, policy):
    return -(float(policy.value(x)) - 2.0) ** 2
'''

ONE_NUMBER = '''
PARAMETERS = {"b": {"default": 0.0, "low": -5.0, "high": 5.0}}

def value(x, params):
    return params["b"] * x
'''


def _deterministic_dir(tmp_path: Path, evaluator: str = DETERMINISTIC, declared: bool = True, **over: dict) -> Path:
    task = {"kind": "evaluator", "evaluator": "evaluate.py", **({"deterministic": True} if declared else {})}
    sections = {"task": task, "planner": {}, "gate": {"validation_episodes": 4, "max_share": 0.9},
                "test": {}, **over}
    return _spec_dir(tmp_path, evaluator, ONE_NUMBER, **sections)


def _show(run: str, runs: Path) -> str:
    from typer.testing import CliRunner

    from ratchet.cli import app

    res = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["show", run, "--runs-dir", str(runs)])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_a_deterministic_task_scores_each_distinct_candidate_once_and_promotes_only_strict_gains(
        tmp_path: Path, monkeypatch) -> None:
    """Issue 43: with [task] deterministic = true each candidate is scored once, on one instance (no repeats on the
    same training instance, no 12 identical validation instances); a candidate proposed again is read back from the
    ledger, never run or charged again; each promotion is a strict gain confirmed by one exact re-evaluation; show
    says no statistics were needed."""
    from conftest import RecordingExecutor
    from test_refiner_contract import PLUGIN

    from ratchet.refiners import registry

    monkeypatch.syspath_prepend(str(PLUGIN))  # nudge: b ± 0.25 around the incumbent each round, three rounds
    monkeypatch.setattr(registry, "KIND_MODULES", dict(registry.KIND_MODULES))
    registry.register_kind("nudge", "nudge")
    spec = load_spec(_deterministic_dir(tmp_path, refiners=[{"kind": "nudge", "step": 0.25}]))
    ex = RecordingExecutor(ProcessExecutor(workers=1, episode_timeout_s=20))
    try:
        start_run(spec, tmp_path / "runs", run_id="d", executor=ex)
    finally:
        ex.inner.close()
    events = read_events(tmp_path / "runs" / "d")
    evals = [e.payload for e in events if e.type.value == "episodes_evaluated"]
    assert all(ev["summary"]["n"] == 1 for ev in evals)  # one instance per evaluation, whatever the split
    assert len({s for ev in evals if ev["split"] == "train" for s in ev["seeds"]}) == 1  # the same one each time
    assert len(ex.jobs) == len(set(ex.jobs)) == len(evals)  # nothing ran twice
    ids = {e.payload["candidate"]["params"]["b"]: e.payload["candidate"]["id"]
           for e in events if e.type.value == "candidate_proposed"}
    proposed = [e.key for e in events if e.type.value == "candidate_proposed" and e.key.endswith(ids[0.25])]
    assert proposed == [f"proposed/1/{ids[0.25]}"]  # proposed again in round 3: refused as a duplicate, never run
    again = [e.payload for e in events if e.type.value == "proposal_rejected"
             and e.payload["detail"].get("candidate_id") == ids[0.25]]
    assert [r["generation"] for r in again] == [3] and again[0]["detail"]["duplicate_of"]
    assert sum(ev["candidate_id"] == ids[0.25] and ev["split"] == "train" for ev in evals) == 1
    assert [(g["test"], g["promoted"], g["n"]) for g in (e.payload for e in events if e.type.value == "gate_decided")] \
        == [("exact", True, 1)] * 3  # b 0 → 0.25 → 0.5 → 0.75: each a strict gain
    last = [e.payload for e in events if e.type.value == "generation_finished"][-1]
    assert last["episodes"] == sum(ev["summary"]["n"] for ev in evals if ev["split"] != "test")  # counted once
    assert "no statistics were needed" in _show("d", tmp_path / "runs")
    from ratchet.ledger.projection import project
    from ratchet.report.html import render_report

    assert "no statistics were needed" in render_report(project(events))  # the report says it too


def test_a_deterministic_run_killed_and_resumed_writes_the_ledger_of_one_that_was_not(tmp_path: Path) -> None:
    """Exact decisions and the elitist CMA-ES resume exactly: kill -9 (simulated) mid-run, resume, same events."""
    from conftest import comparable

    spec = load_spec(_deterministic_dir(tmp_path, refiners=[{"kind": "cmaes", "popsize": 4, "sigma0": 0.3}],
                                        budget={"episodes": 40}))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        whole = start_run(spec, tmp_path / "a", run_id="r", executor=ex)
    finally:
        ex.close()
    dying = Dying(die_after=17)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "b", run_id="r", executor=dying)
    dying.close()
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        resumed = resume_run("r", tmp_path / "b", executor=ex)
    finally:
        ex.close()
    assert resumed.incumbent == whole.incumbent and whole.test.mean > -0.5  # from -4 (b = 0) towards 0 (b = 2)
    assert comparable(read_events(tmp_path / "b" / "r")) == comparable(read_events(tmp_path / "a" / "r"))


NOISY = DETERMINISTIC.replace("return -(float(policy.value(x)) - 2.0) ** 2",
                              "import numpy as np\n    return -(float(policy.value(x)) - 2.0) ** 2 "
                              "+ float(np.random.default_rng().normal(0.0, 100.0))")


def test_a_task_declared_deterministic_whose_re_evaluation_differs_is_said_so_and_not_promoted(tmp_path: Path) -> None:
    """A re-evaluation that does not repeat the training score is recorded (not promoted, the two scores in the
    reason), and show says clearly that the task is not deterministic."""
    spec = load_spec(_deterministic_dir(tmp_path, NOISY, refiners=[{"kind": "cmaes", "popsize": 4, "sigma0": 0.3}],
                                        budget={"episodes": 40}))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        start_run(spec, tmp_path / "runs", run_id="n", executor=ex)
    finally:
        ex.close()
    events = read_events(tmp_path / "runs" / "n")
    refused = [e.payload for e in events if e.type.value == "gate_decided"]
    assert refused and all(g["stopped_because"] == "not_deterministic" and not g["promoted"] for g in refused)
    assert f"candidate {refused[0]['candidate_id']} scored {refused[0]['training_score']!r}" in refused[0]["reason"]
    assert not [e for e in events if e.type.value == "incumbent_changed"]
    shown = _show("n", tmp_path / "runs")
    assert "the task is not deterministic: candidate" in shown and "on re-evaluation" in shown
    assert "validation_episodes" not in shown  # no advice to buy statistical power for what needs none
    from ratchet.advice import run_advice  # the end-of-run summary's advice, as show's: what to change
    from ratchet.ledger.projection import project

    advice = run_advice(project(events))
    assert advice[0].startswith(f"the task was declared deterministic but is not: {len(refused)} re-evaluation(s)")
    assert "remove [task] deterministic = true" in advice[0] and "\n" not in advice[0]


def test_scores_that_look_deterministic_get_a_hint_to_declare_it(tmp_path: Path) -> None:
    """A task not declared deterministic whose candidates score the same on every instance and every evaluation:
    show says so, and how to declare it."""
    spec = load_spec(_deterministic_dir(tmp_path, declared=False, planner={"train_episodes": 2},
                                        refiners=[{"kind": "cmaes", "popsize": 4, "sigma0": 0.3}],
                                        budget={"episodes": 40}, test={"episodes": 2}))
    ex = ProcessExecutor(workers=1, episode_timeout_s=20)
    try:
        start_run(spec, tmp_path / "runs", run_id="h", executor=ex)
    finally:
        ex.close()
    shown = _show("h", tmp_path / "runs")
    assert "scores look deterministic" in shown and "declare [task] deterministic = true" in shown
