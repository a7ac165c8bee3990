"""An ``llm`` refiner's requests sent ahead (``ahead``, issue 42): the next generation's requests are out while this
generation's episodes run, and nothing about that changes what a run proposes, what its budgets allow, or what a
run killed at any moment resumes to."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import GOOD_EDIT, children_of, comparable, events_of, killed_run, make_spec_dir, read_events
from test_llm_client import parent
from test_structural import TASK_FACTS, structural_spec

from ratchet.ledger import EventType
from ratchet.loop import start_run
from ratchet.refiners.llm import LLMRefiner, LLMSettings

CLI = [sys.executable, "-m", "ratchet.cli"]


def answer(body: dict) -> dict:
    """The stand-in's answer to a request: GOOD_EDIT with a default that depends on the request's seed (every answer
    its own program), by the request alone, whatever order the requests come in."""
    return {"content": GOOD_EDIT.replace('"default": 0.5', f'"default": {0.1 + (body["seed"] % 19) / 10:.1f}')}


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


class SlowExecutor:
    """Wraps the run's executor: every call first sleeps ``pause`` seconds (a slow evaluator), and each call's
    (start, end) is kept (``time.time()``)."""

    def __init__(self, inner, pause: float) -> None:
        self.inner, self.pause, self.calls = inner, pause, []

    @property
    def capabilities(self):
        return self.inner.capabilities

    def train(self, task, job, timeout_s=3600.0):
        return self.inner.train(task, job, timeout_s)

    def run(self, task, jobs, on_episode=None, **kw):
        t0 = time.time()
        try:
            time.sleep(self.pause)
            return self.inner.run(task, jobs, on_episode, **kw)
        finally:
            self.calls.append((t0, time.time()))

    def describe(self):
        return self.inner.describe()

    def close(self):
        pass


def _llm(url: str, **kw) -> dict:
    return {"kind": "llm", "base_url": url, "model": "m", "proposals": 2, "variants": 1, "concurrency": 2,
            "retries": 0, "on_unusable": "skip", "repair": False, **kw}


@pytest.mark.parametrize("ahead", [0, 1])
def test_with_ahead_the_next_generations_requests_are_out_while_this_generations_episodes_run(
        tmp_path, standin, pool, ahead):
    """Every executor call sleeps 0.5 s first and the stand-in takes 1 s to answer. With ``ahead = 0`` no request is
    out during any executor call (the workers wait for the answers); with ``ahead = 1`` the requests sent right
    after a generation's proposals are out while its episodes run."""
    arrived: list[float] = []

    def respond(body):
        arrived.append(time.time())
        return answer(body)

    latency = 1.0
    server = standin(respond=respond, latency=latency)
    spec = structural_spec(tmp_path / "s", [_llm(server.url, ahead=ahead, budget_requests=4)],
                           budget={"env_steps": 40_000})
    ex = SlowExecutor(pool, pause=0.5)
    start_run(spec, tmp_path / "runs", "r", executor=ex)
    overlapping = [t for t in arrived if any(a < t + latency and t < b for a, b in ex.calls)]
    assert len(arrived) == 4
    if ahead:
        assert len(overlapping) >= 2, (arrived, ex.calls)
    else:
        assert not overlapping, (arrived, ex.calls)


CMAES = {"kind": "cmaes", "popsize": 4}


@pytest.mark.parametrize("lag", [0, 2])
def test_the_same_spec_and_seed_give_the_same_ledger_whatever_the_answers_timing(tmp_path, standin, pool, lag):
    """Two runs with ``ahead = 1`` against endpoints giving the same answers at opposite speeds (what is fast in one
    is slow in the other, so an answer sent ahead is in before the next generation in one run and still out in the
    other): the same events under the same keys with the same payloads (but each request's seconds and the endpoint's
    address), and the same proposals in the same order. With ``lag`` beside ``cmaes``, the same generations go to the
    same refiners as well."""
    from conftest import keyed_and_proposed

    def run(name: str, flip: bool):
        def respond(body):
            slow = (body["seed"] % 5) / 5
            return {**answer(body), "delay": (0.8 - slow) if flip else slow}

        server = standin(respond=respond)
        spec = structural_spec(tmp_path / name, [_llm(server.url, ahead=1, lag=lag, budget_requests=8)]
                               + ([CMAES] if lag else []), budget={"env_steps": 30_000 + 20_000 * bool(lag)})
        return keyed_and_proposed(start_run(spec, tmp_path / name / "runs", "r", executor=pool).run_dir)

    (a, order_a), (b, order_b) = run("a", False), run("b", True)
    assert sum(t == EventType.LLM_CALL.value for t, _ in a.values()) == 8 and order_a
    assert a == b and order_a == order_b
    if lag:
        assert [p["refiner"] for t, p in a.values() if t == EventType.GENERATION_FINISHED.value][:5] == \
            ["cmaes", "cmaes", "llm", "cmaes", "llm"]


def _refiner_of_each_generation(events) -> list[str]:
    return [e.payload["refiner"] for e in events_of(events, EventType.GENERATION_FINISHED)]


def test_with_lag_the_answers_sent_ahead_are_taken_lag_generations_later_beside_another_refiners(
        tmp_path, standin, pool):
    """``ahead = 1, lag = 3`` beside ``cmaes``: the llm's wave sent after generation g is taken by generation g + 3,
    which the allocator gives the llm (``generation_planned`` says why), and the generations between go to cmaes while
    the wave is out (but at the end, when only the llm is left); every llm generation after the first takes a wave
    sent ahead and sends no request of its own,
    so requests keep going out until the budget is spent, each taken by a generation or recorded at the end. Without
    ``lag`` the same spec leaves the allocator free: the llm takes generations when its samples say so."""
    def run(name: str, lag: int):
        server = standin(respond=answer, latency=0.2)
        spec = structural_spec(tmp_path / name, [_llm(server.url, ahead=1, lag=lag, budget_requests=12), CMAES],
                               budget={"env_steps": 60_000})
        return read_events(start_run(spec, tmp_path / name / "runs", "r", executor=pool).run_dir), server

    events, server = run("lag", 3)
    by = _refiner_of_each_generation(events)
    llm_gens = [g for g, r in enumerate(by, start=1) if r == "llm"]
    # the last llm generation may come early: once cmaes's generation no longer fits the env-step budget, the llm is
    # the only refiner left and takes its wave before it is due
    assert llm_gens[:4] == [4, 7, 10, 13] and all(b - a == 3 for a, b in itertools.pairwise(llm_gens[:-1])), by
    planned = {e.payload["generation"]: e.payload for e in events_of(events, EventType.GENERATION_PLANNED)}
    assert all(planned[g]["reason"] == "its work prepared ahead is due at this generation" for g in llm_gens[:-1])
    calls = events_of(events, EventType.LLM_CALL)
    end = events_of(events, EventType.RUN_FINISHED)[0].payload
    unused = end.get("refiners_at_end", {}).get("llm", {}).get("unused_requests", 0)
    assert len(server.requests) == len(calls) == 2 * len(llm_gens) + unused, (len(calls), llm_gens, unused)
    assert planned[1]["arm"] == "cmaes"  # the llm sat out the first generation: its first wave went out then
    assert len(calls) == 12 or end["stop_kind"] == "budget"

    free = _refiner_of_each_generation(run("free", 0)[0])
    assert free != by  # the allocator's own choices: not every third generation


def test_lag_needs_ahead_and_an_llm_refiner_says_when_its_wave_is_due(standin):
    """``lag`` without ``ahead`` is refused (one line); with ``ahead = 1, lag = 2`` the llm sits out the first
    generation (``Turn.WAIT``: no wave is out yet, and one goes out at its prepare point instead of the workers
    waiting for it), the wave sent at the first generation's prepare point claims generation 3 (``Turn.DUE``) and
    keeps the llm out of generation 2 (``Turn.WAIT``); without ``lag`` the allocator is free (``Turn.FREE``)."""
    from pydantic import ValidationError

    from ratchet.refiners.base import Turn

    with pytest.raises(ValidationError, match="lag needs ahead"):
        LLMSettings(base_url="http://127.0.0.1:1/v1", model="m", lag=2)
    server = standin(respond=answer)
    settings = {"base_url": server.url, "model": "m", "proposals": 2, "variants": 1, "concurrency": 2, "ahead": 1}
    rng = np.random.default_rng(0)
    for lag, turns in ((2, [Turn.WAIT, Turn.DUE, Turn.DUE]), (0, [Turn.FREE] * 3)):
        r = LLMRefiner(LLMSettings(**settings, lag=lag), TASK_FACTS, None)
        assert r.turn(1) is (Turn.WAIT if lag else Turn.FREE)
        r.prepare(parent(), None, rng)  # generation 1's: a wave out, due at 1 + lag
        assert [r.turn(g) for g in (2, 3, 4)] == turns
        assert len(r.propose(parent(), None, rng)) == 2 and len(server.requests) == 2  # takes it
        r.finish()
        server.requests.clear()


def _held_calls(monkeypatch, release: threading.Event, first_free: bool = False) -> None:
    """Each request the refiner makes waits for ``release`` before it goes out (in the thread that sends it; the first
    one made goes at once with ``first_free``): its answer is in only once the test says so."""
    call, made = LLMRefiner._call, []

    def held(self, *args, **kw):
        with lock:
            first = first_free and not made
            made.append(1)
        if not first:
            assert release.wait(60)
        return call(self, *args, **kw)

    lock = threading.Lock()
    monkeypatch.setattr(LLMRefiner, "_call", held)


def test_with_lag_auto_a_wave_is_due_only_once_all_its_answers_are_in(standin, monkeypatch):
    """``lag = "auto"``: with no wave out the llm sits out (its first wave goes out at the prepare point); a wave out is
    ``Turn.WAIT`` however many generations pass while any of its answers is still out (one is in, the other held), and
    ``Turn.DUE`` at the first generation asked once both are in; that generation takes it without a request of its
    own."""
    from ratchet.refiners.base import Turn

    release = threading.Event()
    _held_calls(monkeypatch, release, first_free=True)
    server = standin(respond=answer)
    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", proposals=2, variants=1, concurrency=2, ahead=1,
                               lag="auto"), TASK_FACTS, None)
    rng = np.random.default_rng(0)
    assert r.turn(1) is Turn.WAIT
    r.prepare(parent(), None, rng)
    sent = r._ahead[0].sent
    deadline = time.monotonic() + 30
    while not any(x.done() for x in sent) and time.monotonic() < deadline:  # the first answer comes in
        time.sleep(0.01)
    assert sum(x.done() for x in sent) == 1
    assert [r.turn(g) for g in (2, 3, 50)] == [Turn.WAIT] * 3
    release.set()
    for x in sent:
        x.wait()
    assert r.turn(2) is Turn.DUE
    assert len(r.propose(parent(), None, rng)) == 2 and len(server.requests) == 2  # takes it, asks nothing more
    r.finish()


def test_a_run_with_lag_auto_killed_resumes_with_the_turns_it_recorded(tmp_path, standin, pool, monkeypatch):
    """``ahead = 1, lag = "auto"`` beside ``cmaes``, the llm's first wave held until the run is killed (like kill -9)
    at generation 3's prepare point with the wave's answers just in, none taken: generations 1 to 3 went to cmaes, each
    plan recording the llm's ``wait``. The resumed session finds those answers in the journal (in at once), yet replays
    generations 1 to 3 as recorded (asking the llm would say ``due``: it reads the turns back) and gives generation 4,
    the first planned with the answers in, to the llm, which takes the wave; every generation the llm took was planned
    after the answers it took had arrived, and no answer is asked for twice."""
    from conftest import SimulatedKill

    from ratchet.loop import resume_run

    release = threading.Event()
    _held_calls(monkeypatch, release)
    server = standin(respond=answer)
    spec = structural_spec(tmp_path / "s", [_llm(server.url, ahead=1, lag="auto", budget_requests=6), CMAES],
                           budget={"env_steps": 40_000})
    prepare = LLMRefiner.prepare

    def dying(self, *args):
        prepare(self, *args)
        if self._prepared == 3:
            release.set()
            for sent in self._ahead[0].sent:
                sent.wait()  # its answers are in (and journaled), not taken
            raise SimulatedKill("killed with a wave's answers in, not taken")

    run_dir = killed_run(monkeypatch, LLMRefiner, "prepare", dying, spec, tmp_path / "runs", "r", pool)
    before = {e.payload["generation"]: e.payload
              for e in events_of(read_events(run_dir), EventType.GENERATION_PLANNED)}
    assert [(before[g]["arm"], before[g]["turns"]) for g in (1, 2, 3)] == [("cmaes", {"llm": "wait"})] * 3
    resume_run(run_dir, executor=pool)
    events = read_events(run_dir)
    planned = {e.payload["generation"]: e for e in events_of(events, EventType.GENERATION_PLANNED)}
    finished = {e.payload["generation"]: e for e in events_of(events, EventType.GENERATION_FINISHED)}
    assert {g: planned[g].payload for g in before} == before
    assert [finished[g].payload["refiner"] for g in (1, 2, 3, 4)] == ["cmaes", "cmaes", "cmaes", "llm"]
    assert planned[4].payload["turns"] == {"llm": "due"}
    assert all(finished[g].payload["refiner"] == planned[g].payload["arm"] for g in finished)
    for g, plan in planned.items():  # a wave is taken only once all its answers are in (journaled when they came)
        if plan.payload.get("turns", {}).get("llm") == "due" and g in finished:
            taken = [e for e in events_of(events, EventType.LLM_CALL) if plan.seq < e.seq < finished[g].seq]
            journal = [run_dir / "received" / (hashlib.sha256(e.key.encode()).hexdigest()[:32] + ".json")
                       for e in taken]
            assert taken and all(j.stat().st_mtime <= plan.time + 0.05 for j in journal), g
    asked = [_digest(q["body"]) for q in server.requests]
    assert len(asked) == len(set(asked)) == len(events_of(events, EventType.LLM_CALL))


def test_waves_sent_ahead_never_put_more_than_concurrency_requests_in_flight(standin):
    """``ahead = 2`` with waves of 3 at ``concurrency = 4``: the second wave out takes only the room the first leaves,
    and a generation's fresh wave waits for room beside a wave still out, so the stand-in never has more than 4 requests
    at once (two full waves would be 6)."""
    server = standin(respond=answer, latency=1.0)
    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", proposals=3, variants=1, concurrency=4, ahead=2,
                               retries=0, on_unusable="skip", repair=False, budget_requests=40), TASK_FACTS, None)
    rng = np.random.default_rng(0)
    # out: A (3); A and B (1, the room left); A taken (B does not fit in what is left of the generation); B and C (3);
    # B taken, C does not fit in the 2 left: a fresh wave of 2 waits until at most 2 of C are out; C and D (1); two
    # waves out, none sent; C taken; D recorded by finish: 3 + 1 + 3 + 2 + 1 requests
    for step in ("prepare", "prepare", "propose", "prepare", "propose", "prepare", "prepare", "propose"):
        if step == "prepare":
            r.prepare(parent(), None, rng)
        else:
            r.propose(parent(), None, rng)
    r.finish()
    assert server.most_at_once <= 4 and len(server.requests) == 10, (server.most_at_once, len(server.requests))


def test_budgets_hold_with_waves_sent_ahead(standin):
    """Waves out ahead hold their worst case: their requests' HTTP attempts (retries included, capped at their share
    of what budget_requests leaves) and their tokens; no wave is sent past a budget, and the answers of waves no
    generation took are recorded at the end (``finish``)."""
    server = standin(default={"status": 429}, latency=0.1)
    s = {"model": "m", "variants": 1, "backoff_s": 0.0, "proposals": 2, "concurrency": 2, "retries": 3,
         "budget_requests": 7, "max_failures": 100, "ahead": 2}
    r = LLMRefiner(LLMSettings(base_url=server.url, **s), TASK_FACTS, None, sleep=lambda s: None)
    rng = np.random.default_rng(0)
    for _ in range(6):
        if r.idle_reason() is not None:
            break
        r.propose(parent(), None, rng)
        r.prepare(parent(), None, rng)
        assert r.spent.requests + r.spent.held_requests <= 7
    r.finish()
    assert len(server.requests) == r.spent.requests <= 7 and r.spent.held_requests == 0
    assert r.idle_reason().startswith("llm budget: 7 of 7 requests")

    server = standin(latency=0.1)  # answers of 120 tokens; each request's worst case is far more
    s = {**s, "retries": 0, "budget_requests": None, "budget_tokens": 60_000, "max_tokens": 4096}
    r = LLMRefiner(LLMSettings(base_url=server.url, **s), TASK_FACTS, None, sleep=lambda s: None)
    for _ in range(20):
        if r.idle_reason() is not None:
            break
        r.propose(parent(), None, rng)
        r.prepare(parent(), None, rng)
        assert r.spent.tokens + r.spent.held_tokens <= 60_000
    r.finish()
    assert r.spent.tokens <= 60_000 and r.spent.held_tokens == 0 and len(server.requests) >= 2


def test_answers_no_generation_took_are_recorded_when_the_run_ends(tmp_path, standin, pool):
    """A run that ends on its env-step budget with a wave still out ahead: its answers are awaited and recorded
    (``llm_call``) before ``run_finished``, which says how many made no candidates."""
    server = standin(respond=answer, latency=0.3)
    spec = structural_spec(tmp_path / "s", [_llm(server.url, ahead=1, budget_requests=100)],
                           budget={"env_steps": 6_000})
    events = read_events(start_run(spec, tmp_path / "runs", "r", executor=pool).run_dir)
    calls = events_of(events, EventType.LLM_CALL)
    end = events_of(events, EventType.RUN_FINISHED)[0]
    assert len(calls) == len(server.requests) and end.seq > max(e.seq for e in calls)
    assert end.payload["refiners_at_end"]["llm"]["unused_requests"] == 2
    proposed = {e.payload["candidate"]["id"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)}
    assert len(calls) == 2 * len(events_of(events, EventType.GENERATION_FINISHED)) + 2 and proposed


def test_prepare_changes_nothing_without_ahead(standin):
    """``ahead = 0`` (the default): prepare sends nothing and draws nothing."""
    server = standin()
    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", proposals=2, variants=1), TASK_FACTS, None)
    rng = np.random.default_rng(0)
    r.propose(parent(), None, rng)
    state = rng.bit_generator.state
    r.prepare(parent(), None, rng)
    assert rng.bit_generator.state == state and len(server.requests) == 2 and r.finish() == {}


def test_an_answer_received_ahead_is_never_asked_for_again_after_a_kill(tmp_path, standin, pool, monkeypatch):
    """The run dies (like kill -9) right after the answers of a wave sent ahead came in, before any generation took
    them (so no llm_call event records them): the resumed run records them from the journal (``received/``) and
    asks for none of them again."""
    from conftest import SimulatedKill

    server = standin(respond=answer)
    spec = structural_spec(tmp_path / "s", [_llm(server.url, ahead=1, budget_requests=6)],
                           budget={"env_steps": 30_000})
    prepare = LLMRefiner.prepare

    def dying(self, *args):
        prepare(self, *args)
        if self._ahead and self._generation == 2:
            for sent in self._ahead[-1].sent:
                sent._reply.result(timeout=30)  # its answer is in (and journaled)
            raise SimulatedKill("killed with answers received but not recorded")

    run_dir = killed_run(monkeypatch, LLMRefiner, "prepare", dying, spec, tmp_path / "runs", "k", pool)
    journaled = {json.loads(p.read_text())["key"] for p in (run_dir / "received").glob("*.json")}
    recorded = {e.key for e in events_of(read_events(run_dir), EventType.LLM_CALL)}
    assert len(journaled - recorded) == 2 and len(server.requests) == 6
    from ratchet.loop import resume_run

    resume_run(run_dir, executor=pool)
    asked = [_digest(q["body"]) for q in server.requests]
    assert len(asked) == len(set(asked)) == 6  # nothing asked twice
    calls = {e.key for e in events_of(read_events(run_dir), EventType.LLM_CALL)}
    assert journaled <= calls and len(calls) == 6


def test_a_run_with_lag_killed_while_its_wave_is_out_resumes_to_the_ledger_of_a_run_never_killed(
        tmp_path, standin, pool, monkeypatch):
    """``ahead = 1, lag = 3`` beside ``cmaes``, killed (like kill -9) at the prepare point of generation 5 (a cmaes
    generation, the llm's wave sent at generation 4 out and its answers in, not yet taken): the resumed run gives the
    same generations to the same refiners, asks for no answer it received, and ends with the ledger of the run never
    killed."""
    from conftest import SimulatedKill

    from ratchet.loop import resume_run
    from ratchet.refiners.base import Turn

    def spec(name: str, server):
        return structural_spec(tmp_path / name, [_llm(server.url, ahead=1, lag=3, budget_requests=10), CMAES],
                               budget={"env_steps": 40_000})

    server = standin(respond=answer)
    clean = read_events(start_run(spec("clean", server), tmp_path / "clean", "r", executor=pool).run_dir)
    server = standin(respond=answer)
    prepare = LLMRefiner.prepare

    def dying(self, *args):
        prepare(self, *args)
        if self._prepared == 5:
            assert self._ahead and self.turn(6) is Turn.WAIT
            for sent in self._ahead[-1].sent:
                sent._reply.result(timeout=30)  # its answers are in (and journaled)
            raise SimulatedKill("killed with a wave out")

    resume_run(killed_run(monkeypatch, LLMRefiner, "prepare", dying, spec("killed", server), tmp_path / "runs", "r",
                          pool), executor=pool)
    after = read_events(tmp_path / "runs" / "r")

    def same(events):  # run_started holds the spec, whose base_url names each run's own stand-in
        return {k: (t, {f: v for f, v in p.items() if f != "seconds"} if t == EventType.LLM_CALL.value else p)
                for k, (t, p) in comparable(events).items() if t != EventType.RUN_STARTED.value}

    assert _refiner_of_each_generation(after)[:7] == ["cmaes", "cmaes", "cmaes", "llm", "cmaes", "cmaes", "llm"]
    assert same(after) == same(clean)
    asked = [_digest(q["body"]) for q in server.requests]
    assert len(asked) == len(set(asked)) == len(events_of(after, EventType.LLM_CALL))


def _reap(pids: set[int]) -> None:
    """kill -9 what the killed run left (its workers exit on their own once their socket closes)."""
    deadline = time.monotonic() + 10
    for p in pids:
        while time.monotonic() < deadline and Path(f"/proc/{p}").exists():
            try:
                if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            except (OSError, IndexError):
                break
            time.sleep(0.05)
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _last_seq(db: Path) -> int:
    """The ledger's last event number (0 while it is being created), read while another process writes it."""
    import sqlite3

    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(con.execute("SELECT MAX(seq) FROM events").fetchone()[0] or 0)
        finally:
            con.close()
    except sqlite3.Error:
        return 0


@pytest.mark.timeout(900)
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_run_killed_at_20_random_moments_resumes_exactly_and_never_asks_again_for_an_answer_received(
        tmp_path, standin):
    """``ratchet run`` with ``ahead = 1``, killed with SIGKILL at 20 random moments (each life, the first ``run`` and
    then each ``resume``, is killed 0.05 to 0.6 s after it records its first event), then resumed to the end: the same
    ledger as the run never interrupted, and the stand-in was never asked again for a request whose answer had been
    received (each answer is journaled under the run's folder by the thread that receives it)."""
    arrivals: list[tuple[str, float]] = []

    def respond(body):
        arrivals.append((_digest(body), time.time()))
        return answer(body)

    server = standin(respond=respond, latency=0.5)
    llm = _llm(server.url, ahead=1, budget_requests=48, check_endpoint=False)
    spec_dir = make_spec_dir(tmp_path / "spec", budget={"env_steps": 300_000}, gate={"validation_episodes": 6},
                             test={"episodes": 4}, execution={"workers": 1})
    with open(spec_dir / "ratchet.toml", "a", encoding="utf-8") as f:  # TOML's values as JSON writes them
        f.write("\n[[refiners]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in llm.items()))
    clean = subprocess.run([*CLI, "run", str(spec_dir), "--runs-dir", str(tmp_path / "clean"), "--run-id", "k",
                            "--no-report"], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                           check=False)
    assert clean.returncode == 0, clean.stderr
    whole = read_events(tmp_path / "clean" / "k")
    arrivals.clear()

    runs, rnd, kills = tmp_path / "runs", random.Random(7), 0
    db = runs / "k" / "ledger.sqlite"
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    try:
        while kills < 20:
            cmd = ([*CLI, "run", str(spec_dir), "--runs-dir", str(runs), "--run-id", "k", "--no-report"]
                   if _last_seq(db) == 0 else [*CLI, "resume", "k", "--runs-dir", str(runs), "--no-report"])
            seen = _last_seq(db)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            kids: set[int] = set()
            deadline = None
            while proc.poll() is None and (deadline is None or time.monotonic() < deadline):
                kids |= children_of(proc.pid)
                if deadline is None and _last_seq(db) > seen:  # the life is under way: its kill comes at random
                    deadline = time.monotonic() + rnd.uniform(0.05, 0.6)
                time.sleep(0.01)
            if proc.poll() is not None:  # it finished before its kill
                assert proc.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]
                break
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
            kills += 1
            _reap(kids)
    finally:
        log.close()
    assert kills >= 20, f"the run finished after {kills} kills; make it longer"
    done = subprocess.run([*CLI, "resume", "k", "--runs-dir", str(runs), "--no-report"], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr

    after = read_events(runs / "k")

    def same(events):
        return {k: (t, {f: v for f, v in p.items() if f != "seconds"} if t == EventType.LLM_CALL.value else p)
                for k, (t, p) in comparable(events).items()}

    assert same(after) == same(whole)
    assert [e.payload["candidate"]["id"] for e in events_of(after, EventType.CANDIDATE_PROPOSED)] == \
        [e.payload["candidate"]["id"] for e in events_of(whole, EventType.CANDIDATE_PROPOSED)]
    # an answer received (journaled, or recorded) is never asked for again
    received: dict[str, float] = {}
    for e in events_of(after, EventType.LLM_CALL):
        received[e.key.split("/")[-1]] = e.time
    for path in (runs / "k" / "received").glob("*.json"):
        key = json.loads(path.read_text())["key"].split("/")[-1]
        received[key] = min(received.get(key, float("inf")), path.stat().st_mtime)
    again = [(d, t) for d, t in arrivals if d in received and t > received[d] + 0.2]
    assert not again, again
