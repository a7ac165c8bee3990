"""A person's correction round inside a finished run: recorded in its ledger, retrained, gated, resumable.

The person is scripted (CorrectionSession driven from code, no browser): the CartPole expert of
test_dagger takes over after a few student steps and flies to the end of the episode.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SimulatedKill, comparable, events_of, read_events
from test_dagger import EXPERT, _spec_dir
from typer.testing import CliRunner

from ratchet.cli import app
from ratchet.correct import CorrectionSession
from ratchet.correction_round import CorrectionRound
from ratchet.data import Dataset, run_dataset
from ratchet.execution.process import ProcessExecutor
from ratchet.ledger import EventType
from ratchet.ledger.artifacts import digest
from ratchet.ledger.projection import project
from ratchet.policies.mlp import load_weights
from ratchet.task import GymTask

runner = CliRunner()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished hg-dagger run (CartPole, 100 steps, a barely trained student): its run directory."""
    from ratchet.loop import start_run
    from ratchet.spec import load_spec

    root = tmp_path_factory.mktemp("round")
    start_run(load_spec(_spec_dir(root)), root / "runs", "dg")
    return root / "runs" / "dg"


def _copy(finished: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "dg"
    shutil.copytree(finished, run_dir)
    return run_dir


def _expert():
    from ratchet.policy import compile_policy

    module = compile_policy(EXPERT, "<expert>")
    return lambda obs: module.act(obs, {"w_angle": 1.0})


def play(rnd: CorrectionRound, episodes: int = 3, takeover_at: int | None = 3):
    """Play a round with a scripted person: the student flies until step ``takeover_at``, then the expert
    (through the key map: ← 0, → 1) until the episode ends; ``None``: the person never takes over."""
    expert = _expert()
    cand = rnd.candidate()
    session = CorrectionSession(GymTask.from_spec(rnd.state.spec["task"]),
                                load_weights(rnd.artifact(cand.artifacts["weights"])), rnd.seeds(episodes),
                                round_no=rnd.next_round)
    try:
        while not session.done:
            if takeover_at is not None and session.t >= takeover_at:
                session.step(["ArrowLeft" if expert(session.obs) == 0 else "ArrowRight"])
            else:
                session.step([], handback=True)
    finally:
        session.close()
    return cand, session.records, session.dataset(finished_only=True)


def test_round_is_recorded_retrained_gated_and_promoted(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    before = project(read_events(run_dir))
    with CorrectionRound(run_dir) as rnd:
        seeds = rnd.seeds(3)
        cand, records, data = play(rnd)
        assert cand.id == before.incumbent_id and [r["seed"] for r in records] == seeds
        n = rnd.record(cand, records, data)
        assert n == 1 and rnd.unfinished() == 1
        result = rnd.finish(updates=500)
    events = read_events(run_dir)
    new = events[len(read_events(finished)):]
    assert [e.type.value for e in new] == ["correction_recorded", "training_finished", "candidate_proposed",
                                           "episodes_evaluated", "gate_decided", "incumbent_changed",
                                           "episodes_evaluated", "correction_finished"]
    assert all(e.payload["correction_round"] == 1 for e in new[1:])
    rec = new[0].payload
    assert rec["who"] == "person" and rec["candidate_id"] == cand.id and rec["seeds"] == seeds
    for ep in rec["episodes"]:  # the student flew 3 steps, the person to the time limit
        assert ep["segments"] == [[0, 3, "student"], [3, 100, "person"]] and ep["person_steps"] == 97
        assert ep["length"] == 100 and ep["truncated"] and not ep["terminated"]
    assert rec["person_steps"] == 291 and rec["env_steps"] == 300
    # the data set is a content-addressed artifact, stored before the event naming it
    with CorrectionRound(run_dir) as rnd:
        blob = rnd.artifact(rec["dataset"])
    assert digest(blob) == rec["dataset"] and blob == data.to_bytes()
    person = Dataset.from_bytes(blob)
    assert len(person) == 291 and person.expert.all() and person.step.min() == 3
    # the training job: the person mode of the dagger trainer, from the incumbent, on its data + the person's
    job = new[1].payload
    assert job["trainer"] == "dagger" and job["settings"]["mode"] == "person" and job["env_steps"] == 0
    assert job["settings"]["updates"] == 500 and job["seeds"] == [] and job["error"] is None
    student_id = new[2].payload["candidate"]["id"]
    assert result["student_id"] == student_id and result["promoted"] and result["incumbent_id"] == student_id
    aggregate = run_dataset(run_dir, candidate=student_id)
    old = run_dataset(run_dir, candidate=cand.id)
    assert len(aggregate) == len(old) + 291 and int((aggregate.round == old.round.max() + 1).sum()) == 291
    # gated on the run's validation seeds, as the run's next decision
    gate = new[4].payload
    assert gate["candidate_id"] == student_id and gate["incumbent_id"] == cand.id and gate["promoted"]
    k = sum(bool(g["contested"]) for g in before.gates) + 1  # alpha spending: one more decision of the run
    assert f"α_{k} " in gate["reason"] and k >= 2
    val = new[3].payload
    assert val["split"] == "validation" and val["candidate_id"] == student_id
    assert val["seeds"] == project(read_events(finished)).evaluation(cand.id, "validation").seeds
    assert new[6].payload["split"] == "test" and new[6].payload["candidate_id"] == student_id
    # the projection: the incumbent follows the round; the round's env steps stay outside the run's budget
    st = project(events)
    assert st.status == "finished" and st.incumbent_id == student_id
    assert st.env_steps == before.env_steps and st.episodes == before.episodes
    assert st.test == result["test"] and st.test["n"] == 3
    assert st.correction_env_steps == {"person": 300, "validation": 400, "test": 300} == result["env_steps"]
    assert st.env_steps_breakdown["person"] == 300 and st.env_steps_breakdown["correction validation"] == 400
    [c] = st.corrections
    assert c["status"] == "finished" and c["promoted"] and c["person_steps"] == 291 and c["student_id"] == student_id
    # finishing again reads back: nothing appended
    with CorrectionRound(run_dir) as rnd:
        assert rnd.finish(1) == result and rnd.unfinished() is None and rnd.next_round == 2
        assert rnd.seeds(1)[0] not in seeds
    assert len(read_events(run_dir)) == len(events)

    # show, export and replay see the new incumbent
    shown = runner.invoke(app, ["show", str(run_dir), "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["incumbent"]["candidate_id"] == student_id and data["corrections"][0]["promoted"]
    text = runner.invoke(app, ["show", str(run_dir)]).output
    assert "correction round 1" in text and "person controlled 291 of 300" in text and "promoted" in text
    exported = runner.invoke(app, ["export", str(run_dir), "-o", str(tmp_path / "student.py")])
    assert exported.exit_code == 0, exported.output
    assert student_id in (tmp_path / "student.py").read_text()
    seed = val["seeds"][0]
    replayed = runner.invoke(app, ["replay", str(run_dir), "--seed", str(seed), "--candidate", student_id])
    assert replayed.exit_code == 0 and "match" in replayed.output, replayed.output
    report = runner.invoke(app, ["report", str(run_dir), "--no-videos", "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.output
    assert "Correction rounds" in (tmp_path / "r.html").read_text()
    resumed = runner.invoke(app, ["resume", str(run_dir)])
    assert resumed.exit_code == 1 and "already finished" in resumed.output


class _DyingPool(ProcessExecutor):
    """A pool that 'dies' (as under kill -9) after ``die_after`` episodes; training jobs run normally."""

    def __init__(self, die_after: int) -> None:
        super().__init__(workers=1)
        self.die_after, self.episodes, self.trained = die_after, 0, 0

    def train(self, task, job, timeout_s=3600.0):
        self.trained += 1
        return super().train(task, job, timeout_s)

    def run(self, task, jobs, on_episode=None, **kw):
        def cb(i, ep):
            if on_episode is not None:
                on_episode(i, ep)
            self.episodes += 1
            if self.episodes >= self.die_after:
                raise SimulatedKill("killed during the round's validation")

        return super().run(task, jobs, cb, **kw)


@pytest.fixture(scope="module")
def reference_round(finished, tmp_path_factory) -> Path:
    """The run after an uninterrupted round (the scripted person of :func:`play`, 500 updates)."""
    ref_dir = _copy(finished, tmp_path_factory.mktemp("ref"))
    with CorrectionRound(ref_dir) as rnd:
        rnd.finish(rnd.record(*play(rnd)), updates=500)
    return ref_dir


# killed in the student's validation, or in the new incumbent's test evaluation (after incumbent_changed)
@pytest.mark.parametrize("die_after", [2, 5])
def test_a_killed_round_resumes_from_the_ledger(finished, reference_round, tmp_path, die_after):
    run_dir = _copy(finished, tmp_path)
    pool = _DyingPool(die_after=die_after)
    try:
        with pytest.raises(SimulatedKill), CorrectionRound(run_dir, executor=pool) as rnd:
            rnd.finish(rnd.record(*play(rnd)), updates=500)
    finally:
        pool.close()
    assert pool.trained == 1
    events = read_events(run_dir)
    assert not events_of(events, EventType.CORRECTION_FINISHED) and events_of(events, EventType.TRAINING_FINISHED)
    promoted_before_kill = any(e.type is EventType.INCUMBENT_CHANGED and e.payload.get("correction_round") == 1
                               for e in events)
    assert promoted_before_kill == (die_after == 5)
    [c] = project(events).corrections
    assert c["status"] == "recorded" and c["retrain"]
    shown = runner.invoke(app, ["show", str(run_dir)]).output
    assert "not yet retrained and gated" in shown
    # a new round is refused until this one is finished; the person is not asked again
    refused = runner.invoke(app, ["correct", str(run_dir)])
    assert refused.exit_code == 1 and "--resume-round" in refused.output
    resumed = runner.invoke(app, ["resume", str(run_dir)])
    assert resumed.exit_code == 1 and "finishes its correction round" in resumed.output
    done = runner.invoke(app, ["correct", str(run_dir), "--resume-round", "--updates", "500"])
    assert done.exit_code == 0, done.output
    assert "promoted" in done.output
    # the same ledger as an uninterrupted round (the training job ran once, read back on resume)
    after = read_events(run_dir)
    assert comparable(after) == comparable(read_events(reference_round))
    assert len(events_of(after, EventType.TRAINING_FINISHED)) == len(events_of(events, EventType.TRAINING_FINISHED))
    again = runner.invoke(app, ["correct", str(run_dir), "--resume-round"])
    assert again.exit_code == 1 and "no unfinished correction round" in again.output


def test_no_takeover_retrains_nothing_and_keeps_the_incumbent(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    before = read_events(run_dir)
    with CorrectionRound(run_dir) as rnd:
        cand, records, data = play(rnd, episodes=1, takeover_at=None)
        assert len(data) == 0 and records[0]["segments"] == [[0, records[0]["length"], "student"]]
        result = rnd.finish(rnd.record(cand, records, data))
    assert result["student_id"] is None and not result["gated"] and "never took over" in result["reason"]
    new = [e.type.value for e in read_events(run_dir)[len(before):]]
    assert new == ["correction_recorded", "correction_finished"]  # the test evaluation was read back
    st = project(read_events(run_dir))
    assert st.incumbent_id == project(before).incumbent_id and st.test == project(before).test


def test_one_writer_at_a_time_and_clear_refusals(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    with CorrectionRound(run_dir):
        busy = runner.invoke(app, ["correct", str(run_dir)])
        assert busy.exit_code == 1 and "being written by another ratchet process" in busy.output
        assert len(busy.output.strip().splitlines()) == 1
    nothing = runner.invoke(app, ["correct", str(run_dir), "--resume-round"])
    assert nothing.exit_code == 1 and "no unfinished correction round" in nothing.output
    with CorrectionRound(run_dir) as rnd:
        cand, records, data = play(rnd, episodes=1)
        with pytest.raises(Exception, match="person steps"):
            rnd.record(cand, records, data.take(slice(0, 3)))
        with pytest.raises(Exception, match="no episode"):
            rnd.record(cand, [], data)
    assert not events_of(read_events(run_dir), EventType.CORRECTION_RECORDED)


def test_the_command_serves_records_and_later_finishes_the_round(finished, tmp_path):
    """`ratchet correct` end to end through its page's endpoint: a takeover with keys, --no-retrain and
    --output, then --resume-round retrains and gates the recorded round."""
    import re
    import subprocess
    import sys
    import urllib.request

    run_dir = _copy(finished, tmp_path)
    npz = tmp_path / "person.npz"
    proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "correct", str(run_dir), "--episodes", "1",
                             "--no-retrain", "-o", str(npz)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\S+/", line)
        assert url, line + proc.stdout.read()

        def step(**msg):
            req = urllib.request.Request(url.group(0) + "step", data=json.dumps(msg).encode(), method="POST")
            return json.loads(urllib.request.urlopen(req, timeout=60).read())

        t = 0
        while not step(**({"held": ["ArrowLeft" if t % 2 else "ArrowRight"]} if 2 <= t < 6
                          else {"held": [], "handback": True}))["done"]:
            t += 1
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, line + rest
    assert "correction round 1: 1 episode(s)" in rest and "4 under your control" in rest and "--resume-round" in rest
    [rec] = events_of(read_events(run_dir), EventType.CORRECTION_RECORDED)
    [kept] = events_of(read_events(run_dir), EventType.CORRECTION_EPISODE)  # kept as it ended
    assert kept.payload["episode"] == rec.payload["episodes"][0] and kept.payload["dataset"] == rec.payload["dataset"]
    ep = rec.payload["episodes"][0]
    assert ep["segments"] == [[0, 2, "student"], [2, 6, "person"], [6, ep["length"], "student"]]
    assert not rec.payload["retrain"] and digest(npz.read_bytes()) == rec.payload["dataset"]
    assert "recorded only (--no-retrain)" in runner.invoke(app, ["show", str(run_dir)]).output
    done = runner.invoke(app, ["correct", str(run_dir), "--resume-round", "--updates", "5"])
    assert done.exit_code == 0, done.output
    [c] = project(read_events(run_dir)).corrections
    assert c["status"] == "finished" and c["gated"] and c["person_steps"] == 4


def test_flags_and_output_are_checked_before_anything_is_played(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    for args, says in ((["--resume-round", "--no-retrain"], "drop --no-retrain"),
                       (["--resume-round", "-o", str(tmp_path / "p.npz")], "drop --output"),
                       (["--resume-round", "--episodes", "3", "--port", "0"], "drop --episodes, --port"),
                       (["--force"], "give -o/--output too"),
                       (["-o", str(tmp_path / "nowhere" / "p.npz")], "no folder"),
                       (["-o", str(tmp_path)], "is a folder"),
                       (["-o", str(tmp_path / "p.txt")], "a data set is written as .npz; give p.npz"),
                       (["-o", str(run_dir / "ledger.sqlite"), "--force"], "it is a run ledger"),
                       (["--storage", "foo://x"], "not a database URL")):
        r = runner.invoke(app, ["correct", str(run_dir), *args])
        assert r.exit_code == 1 and says in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)
    (tmp_path / "old.npz").write_bytes(b"x")
    r = runner.invoke(app, ["correct", str(run_dir), "-o", str(tmp_path / "old.npz")])
    assert r.exit_code == 1 and "pass --force" in r.output
    assert not events_of(read_events(run_dir), EventType.CORRECTION_RECORDED)


def test_no_new_round_while_one_is_unfinished_whatever_the_flags(finished, tmp_path):
    run_dir = _copy(finished, tmp_path)
    with CorrectionRound(run_dir) as rnd:
        cand, records, data = play(rnd, episodes=1)
        rnd.record(cand, records, data, retrain=False)
    for flags in ([], ["--no-retrain"]):
        r = runner.invoke(app, ["correct", str(run_dir), *flags])
        assert r.exit_code == 1 and "finish it first" in r.output and "--resume-round" in r.output, r.output


def test_a_failed_output_write_loses_nothing(finished, tmp_path, monkeypatch):
    """The round goes into the ledger before --output is written: a write that fails still leaves the round."""
    import ratchet.correct

    run_dir = _copy(finished, tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()

    class Server:
        def shutdown(self):
            pass

    def fake_serve(session, **kw):  # the person plays at once; meanwhile the output folder disappears
        while not session.done:
            session.step(["ArrowRight"] if session.t == 2 else [], handback=session.t != 2)
        shutil.rmtree(folder)
        return Server(), "http://127.0.0.1:1/token/"

    monkeypatch.setattr(ratchet.correct, "serve", fake_serve)
    r = runner.invoke(app, ["correct", str(run_dir), "--episodes", "1", "--no-retrain", "-o", str(folder / "p.npz")])
    assert r.exit_code == 1 and "cannot write" in r.output and "round 1 is recorded" in r.output, r.output
    [rec] = events_of(read_events(run_dir), EventType.CORRECTION_RECORDED)
    assert rec.payload["person_steps"] == 1


def test_a_port_in_use_suggests_port_0(finished, tmp_path):
    import socket

    run_dir = _copy(finished, tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = runner.invoke(app, ["correct", str(run_dir), "--port", str(s.getsockname()[1])])
    assert r.exit_code == 1 and "--port 0" in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_episodes_finished_before_a_kill_survive_and_resume_records_the_round(finished, tmp_path):
    """kill -9 while the person plays: the episodes that ended are in the ledger (correction_episode);
    --resume-round makes them the round and finishes it; a new round is refused until then."""
    run_dir = _copy(finished, tmp_path)
    with CorrectionRound(run_dir) as rnd:
        cand, records, data = play(rnd, episodes=2)
        for i, r in enumerate(records):
            mine = data.take(data.episode == i)
            assert rnd.record_episode(cand, r, mine) == i
        # the process dies here: no correction_recorded
    assert not events_of(read_events(run_dir), EventType.CORRECTION_RECORDED)
    refused = runner.invoke(app, ["correct", str(run_dir)])
    assert refused.exit_code == 1 and "2 finished episode(s) kept" in refused.output, refused.output
    done = runner.invoke(app, ["correct", str(run_dir), "--resume-round", "--updates", "5"])
    assert done.exit_code == 0 and "recorded from the 2 episode(s)" in done.output, done.output
    [rec] = events_of(read_events(run_dir), EventType.CORRECTION_RECORDED)
    assert rec.payload["episodes"] == [dict(r) for r in records] and rec.payload["person_steps"] == len(data)
    [c] = project(read_events(run_dir)).corrections
    assert c["status"] == "finished"
    with CorrectionRound(run_dir) as rnd:
        assert rnd.pending_episodes() == [] and rnd.next_round == 2
