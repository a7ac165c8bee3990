"""Determinism: recorded episodes replay bit for bit; the same spec and seed give the same ledger."""

from __future__ import annotations

from conftest import LastFirst, events_of, normalized, read_events

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.ledger import EventType
from ratchet.ledger.projection import project
from ratchet.loop import start_run
from ratchet.rollout import Episode
from ratchet.spec import load_spec
from ratchet.task import GymTask


def test_replay_equals_the_ledger(finished_run):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    st = project(events)
    task = GymTask.from_dict(events_of(events, EventType.RUN_STARTED)[0].payload["task"])
    jobs, recorded = [], []
    seen_splits = set()
    evals = [e.payload for e in events_of(events, EventType.EPISODES_EVALUATED)]
    for split in ("train", "validation", "test"):
        of_split = [p for p in evals if p["split"] == split]
        for p in {id(x): x for x in (of_split[0], of_split[-1])}.values():  # first and last of each split
            seen_splits.add(split)
            cand = st.candidate(p["candidate_id"])
            for ep in p["episodes"][:2]:
                jobs.append(Job(cand, ep["seed"]))
                recorded.append(ep)
    assert seen_splits == {"train", "validation", "test"}
    with ProcessExecutor(workers=2, episode_timeout_s=60) as ex:
        replayed = ex.run(task, jobs)
    assert len(replayed) == len(recorded) >= 6
    for ep, rec in zip(replayed, recorded):
        assert ep.to_dict() == rec  # return, length, flags and final observation, bit for bit
        assert ep == Episode.from_dict(rec)


def test_same_spec_same_seed_same_ledger(finished_run, cli_run):
    """``start_run`` (library) and ``ratchet run`` (CLI) of one spec record the same run."""
    res, cli_dir = cli_run
    assert res.exit_code == 0, res.output
    _, lib_dir, _ = finished_run
    a, b = read_events(lib_dir), read_events(cli_dir)
    assert normalized(a) == normalized(b)  # event for event, in order (evaluations in each call's order)
    ids = lambda evs: [e.payload["candidate"]["id"] for e in events_of(evs, EventType.CANDIDATE_PROPOSED)]
    assert ids(a) == ids(b)  # proposals are recorded in the same order
    returns = lambda evs: sorted((e.key, [x["episode_return"] for x in e.payload["episodes"]])
                                 for e in events_of(evs, EventType.EPISODES_EVALUATED))
    assert returns(a) == returns(b)
    # and the two runs really are separate runs
    assert project(a).run_id != project(b).run_id


def test_the_ledger_is_the_same_in_order_whatever_order_episodes_complete_in(finished_run, tmp_path):
    """Each executor call's evaluations are recorded in the call's order of candidates, not in the order they
    completed: a run whose every call completes backwards records the same events in the same order."""
    _, run_dir, spec_dir = finished_run
    with LastFirst(workers=1, episode_timeout_s=60) as ex:
        start_run(load_spec(spec_dir), tmp_path, "backwards", executor=ex)
    a, b = normalized(read_events(run_dir)), normalized(read_events(tmp_path / "backwards"))
    assert sum(t == EventType.EPISODES_EVALUATED.value for t, _, _ in a) > 3
    assert [(t, key) for t, key, _ in a] == [(t, key) for t, key, _ in b]
    assert a == b
