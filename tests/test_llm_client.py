"""The LLM client holds its own boundary, and an endpoint that fails says so (issue 18, sections 3 and 4).

Each test plays a hostile or broken endpoint on 127.0.0.1 (the stand-in server of tests/conftest.py): a
redirect to another origin, a reply dripped one byte a second, a 100 MB reply, a refused key, nothing
listening, a model the server does not list. Everything is local and takes seconds.
"""

from __future__ import annotations

import json
import socket
import time
import tracemalloc

import numpy as np
import pytest
from conftest import DATA, GOOD_EDIT, events_of, read_events
from test_structural import SECRET, TASK_FACTS, WHOLE_FILE, structural_spec
from typer.testing import CliRunner

from ratchet.errors import EndpointError, PolicyError
from ratchet.ledger import EventType
from ratchet.loop import LEDGER_FILE, resume_run, start_run
from ratchet.policy import load_policy
from ratchet.proposals import check_source
from ratchet.refiners.llm import LLMRefiner, LLMSettings, check_endpoint, prompt_bound

KEY_ENV = "RATCHET_TEST_KEY"


def parent():
    return load_policy(DATA / "cartpole_linear.py").candidate()


def recording():
    """An exchange that calls every time and keeps each ``(body, record)``, as the loop's records them."""
    records: list[tuple[str | None, dict]] = []

    def exchange(key, request, call):
        body, info = call()
        records.append((body, info))
        return body, info

    return exchange, records


def refiner(url: str, exchange=None, **settings) -> LLMRefiner:
    s = {"model": "m", "proposals": 1, "variants": 1, "backoff_s": 0.0, **settings}
    return LLMRefiner(LLMSettings(base_url=url, **s), TASK_FACTS, exchange, sleep=lambda s: None)


def refused_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


# -- the key stays with the endpoint it was meant for ------------------------------------------------------

def test_a_redirect_to_another_origin_never_carries_the_key(standin, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    other = standin(default={"echo_auth": True})
    server = standin([{"redirect": other.url + "/chat/completions"}])
    exchange, records = recording()
    r = refiner(server.url, exchange, api_key_env=KEY_ENV, retries=3)
    with pytest.raises(EndpointError, match="another server"):
        r.propose(parent(), None, np.random.default_rng(0))
    assert other.requests == [] and other.gets == []  # never followed: the second server saw nothing
    assert len(server.requests) == 1  # a redirect elsewhere is permanent: not retried
    (body, info), = records
    assert body is None and info["status"] == 302 and info["permanent"] and SECRET not in json.dumps(info)
    assert r.idle_reason().startswith("llm endpoint (llm)") and "base_url" in r.idle_reason()


def test_a_same_origin_redirect_that_keeps_the_method_is_followed(standin, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    server = standin([{"redirect": "/v2/chat/completions", "status": 307}])
    r = refiner(server.url, api_key_env=KEY_ENV)
    assert len(r.propose(parent(), None, np.random.default_rng(0))) == 1
    assert [q["path"] for q in server.requests] == ["/v1/chat/completions", "/v2/chat/completions"]
    assert all(q["auth"] == f"Bearer {SECRET}" for q in server.requests)


def test_a_reply_echoing_the_key_is_stored_without_it(standin, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    server = standin([{"echo_auth": True, "content": GOOD_EDIT}, {"status": 400, "message": f"bad key {SECRET}"}])
    exchange, records = recording()
    r = refiner(server.url, exchange, api_key_env=KEY_ENV, proposals=2, concurrency=1)  # the script's order
    r.propose(parent(), None, np.random.default_rng(0))
    assert SECRET not in json.dumps(records) and "Bearer ***" in records[0][0]
    assert records[1][1]["message"] == "bad key ***"


@pytest.mark.parametrize("first", [{"redirect": "OTHER"}, {"status": 401, "message": "invalid api key"}])
def test_a_run_stopped_by_its_endpoint_names_it_keeps_no_key_and_resumes_once_it_works(
        tmp_path, standin, monkeypatch, pool, first):
    monkeypatch.setenv(KEY_ENV, SECRET)
    other = standin(default={"echo_auth": True})
    server = standin([{**first, "redirect": other.url + "/chat/completions"} if "redirect" in first else first],
                     default=WHOLE_FILE)
    llm = {"kind": "llm", "base_url": server.url, "model": "stand-in", "api_key_env": KEY_ENV, "proposals": 2,
           "variants": 1, "budget_requests": 3, "retries": 2, "backoff_s": 0.0, "concurrency": 1}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    with pytest.raises(EndpointError) as exc:
        start_run(spec, tmp_path / "runs", "ep", executor=pool)
    line = str(exc.value)
    assert "\n" not in line and line.startswith("llm endpoint (llm)")
    assert ("another server" in line) if "redirect" in first else ("HTTP 401" in line and "invalid api key" in line
                                                                   and KEY_ENV in line)
    assert len(server.requests) == 1 and other.requests == [] and other.gets == []  # stopped at once
    run_dir = tmp_path / "runs" / "ep"
    events = read_events(run_dir)
    (call,) = events_of(events, EventType.LLM_CALL)
    assert call.payload["response"] is None and call.payload["attempts"] == 1
    assert call.payload["status"] == (302 if "redirect" in first else 401)
    assert not events_of(events, EventType.PROPOSAL_REJECTED)  # an endpoint failure, not a failed proposal
    from ratchet.cli import app

    shown = CliRunner().invoke(app, ["show", str(run_dir), "--json"])
    data = json.loads(shown.stdout)
    assert data["status"] == "failed" and data["endpoint_failures"] == 1 and data["rejected_proposals"] == 0
    # the endpoint works again: the failure the run stopped at is tried again, and the run goes on
    result = resume_run(run_dir, executor=pool)
    assert result.stop_reason.startswith("llm budget: 3 of 3 requests")
    calls = events_of(read_events(run_dir), EventType.LLM_CALL)
    assert calls[0].key + "~2" == calls[1].key and calls[1].payload["error"] is None
    assert other.requests == [] and other.gets == []
    for f in run_dir.rglob("*"):  # the key is nowhere: events, artifacts, report
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f


# -- timeout_s is a deadline; the run's wall clock bounds it ---------------------------------------------

def test_a_dripping_endpoint_is_cut_at_timeout_s(standin):
    server = standin([{"drip": 1.0, "drip_bytes": 12}] * 3)
    exchange, records = recording()
    r = refiner(server.url, exchange, timeout_s=2.0, retries=3)
    t0 = time.monotonic()
    assert r.propose(parent(), None, np.random.default_rng(0)) == []
    assert time.monotonic() - t0 < 3.5  # one byte a second used to hold a call for as long as the server liked
    (body, info), = records
    assert body is None and info["timed_out"] and "timeout_s = 2 s" in info["error"]


def test_no_request_outlasts_the_runs_wall_clock(standin):
    server = standin([{"delay": 3.0, "content": GOOD_EDIT}])
    exchange, records = recording()
    r = refiner(server.url, exchange, timeout_s=60.0)
    r.time_left = lambda: 0.5
    t0 = time.monotonic()
    assert r.propose(parent(), None, np.random.default_rng(0)) == []
    assert time.monotonic() - t0 < 2.0 and records == []  # cut by the run's clock: nothing recorded
    r.time_left = lambda: 0.0
    assert r.propose(parent(), None, np.random.default_rng(0)) == [] and len(server.requests) == 1


def test_wall_clock_budget_stops_a_run_that_waits_on_its_endpoint(tmp_path, standin, pool):
    server = standin(default={"delay": 30.0, "content": GOOD_EDIT})
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 1, "variants": 1, "timeout_s": 120}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 50_000, "wall_clock_s": 4})
    t0 = time.monotonic()
    result = start_run(spec, tmp_path / "runs", "wc", executor=pool)
    assert time.monotonic() - t0 < 15 and len(server.requests) >= 1
    assert "wall" in result.stop_reason


# -- the reply's size is capped --------------------------------------------------------------------------

@pytest.mark.parametrize("item", [{"size": 100 * 2**20}, {"content": "x" * 300_000}], ids=["streamed", "declared"])
def test_an_oversized_reply_is_refused_without_reading_it_all(standin, item):
    server = standin([item])
    exchange, records = recording()
    r = refiner(server.url, exchange, max_tokens=1024, retries=2)
    tracemalloc.start()
    try:
        assert r.propose(parent(), None, np.random.default_rng(0)) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # a 100 MB reply used to be read (and stored) whole
    (body, info), = records
    assert body is None and "98,304 bytes" in info["error"] and "max_response_bytes" in info["error"]
    assert len(server.requests) == 1  # not retried: the same request would get the same answer


def test_an_over_long_program_is_stored_only_as_its_head_and_digest(tmp_path, standin, pool):
    import hashlib

    long_file = WHOLE_FILE.replace("Rewritten:\n```python\n", "Rewritten:\n```python\n" + "# pad\n" * 50_000)
    server = standin([{"size": 100 * 2**20}, long_file], default=GOOD_EDIT)
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 2, "variants": 1, "budget_requests": 2,
           "max_response_bytes": 2 * 2**20}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    start_run(spec, tmp_path / "runs", "big", executor=pool)
    run_dir = tmp_path / "runs" / "big"
    assert (run_dir / LEDGER_FILE).stat().st_size < 2 * 2**20
    (rejected,) = events_of(read_events(run_dir), EventType.PROPOSAL_REJECTED)
    program = long_file.split("```python\n")[1].split("```")[0]
    assert "characters, more than the 200,000 allowed" in rejected.payload["reason"]
    assert rejected.payload["source_cut"] == {"chars": len(program),
                                              "sha256": hashlib.sha256(program.encode()).hexdigest()}


# -- an endpoint that fails says so ------------------------------------------------------------------------

def test_a_refused_key_stops_the_refiner_at_once_with_what_to_fix(standin, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    server = standin(default={"status": 401, "message": "Incorrect API key provided"})
    r = refiner(server.url, api_key_env=KEY_ENV, proposals=3, retries=3, concurrency=1)
    with pytest.raises(EndpointError) as exc:
        r.propose(parent(), None, np.random.default_rng(0))
    assert len(server.requests) == 1  # a 401 is never retried
    assert "HTTP 401" in str(exc.value) and "Incorrect API key" in str(exc.value) and KEY_ENV in str(exc.value)
    assert r.idle_reason() == str(exc.value) and r.spent.requests == 1


def test_failures_in_a_row_retire_the_refiner(standin):
    exchange, records = recording()
    r = refiner(refused_url(), exchange, proposals=5, retries=1, concurrency=1)
    with pytest.raises(EndpointError, match="3 requests in a row failed, the last: cannot reach .* connection "
                                            "refused .*start the server"):
        r.propose(parent(), None, np.random.default_rng(0))
    assert len(records) == 3 and all(info["attempts"] == 2 and info["status"] is None for _, info in records)
    assert r.spent.requests == 6 and r.take_rejections() == []  # attempts count; failures are not proposals
    # a success in between starts the count again
    server = standin([{"status": 503}, {"status": 503}, GOOD_EDIT, {"status": 503}, {"status": 503}])
    r = refiner(server.url, proposals=5, retries=0, concurrency=1)
    assert len(r.propose(parent(), None, np.random.default_rng(0))) == 1 and r.spent.failed == 4


def test_a_failing_endpoint_is_named_in_the_progress_line_show_and_the_report(tmp_path, standin, pool):
    from ratchet.cli import app
    from ratchet.progress import progress_line

    server = standin([{"status": 503, "message": "model overloaded"}] * 2, default=GOOD_EDIT)
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 2, "variants": 1, "retries": 0,
           "budget_requests": 4, "max_failures": 3}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    lines = []
    start_run(spec, tmp_path / "runs", "fl", executor=pool, progress=lambda info: lines.append(progress_line(info)))
    assert "no gate: the LLM endpoint failed 2 request(s) this generation (last: HTTP 503" in lines[0]
    assert "model overloaded" in lines[0] and "finished its training episodes" not in lines[0]
    run_dir = tmp_path / "runs" / "fl"
    shown = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["show", str(run_dir)])
    assert "endpoint failures" in shown.stdout and "HTTP 503" in shown.stdout
    assert "failed its checks" not in shown.stdout
    CliRunner().invoke(app, ["report", str(run_dir), "--no-videos"])
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "request(s) to the LLM endpoint failed" in html and "model overloaded" in html


def test_beside_other_refiners_the_run_goes_on_without_a_dead_endpoint(tmp_path, pool):
    llm = {"kind": "llm", "base_url": refused_url(), "model": "m", "proposals": 1, "variants": 1, "retries": 0,
           "check_endpoint": False}
    spec = structural_spec(tmp_path / "s", [{"kind": "mutate", "programs": 2, "variants": 1}, llm],
                           budget={"env_steps": 15_000})
    result = start_run(spec, tmp_path / "runs", "mix", executor=pool)
    assert "llm endpoint" not in result.stop_reason
    events = read_events(tmp_path / "runs" / "mix")
    gens = events_of(events, EventType.GENERATION_FINISHED)
    stopped = [g for g in gens if g.payload.get("refiner_stopped")]
    assert stopped and "connection refused" in stopped[0].payload["refiner_stopped"]
    assert all(g.payload["refiner"] != "llm" for g in gens[gens.index(stopped[0]) + 1:])
    assert len(gens) > gens.index(stopped[0]) + 1


# -- checked at run start: reachable, the model listed ---------------------------------------------------

def test_an_unreachable_endpoint_is_one_line_before_any_episode(tmp_path):
    from ratchet.cli import app

    llm = {"kind": "llm", "base_url": refused_url(), "model": "m"}
    spec = structural_spec(tmp_path / "s", [llm])
    with pytest.raises(EndpointError, match=r"connection refused .*start the server or fix base_url"):
        start_run(spec, tmp_path / "runs", "x")
    assert not (tmp_path / "runs" / "x").exists()  # nothing made, nothing ran
    (tmp_path / "s" / "ratchet.toml").write_text((DATA / "cartpole.toml").read_text(encoding="utf-8")
                                               + f'\n[[refiners]]\nkind = "llm"\nbase_url = "{llm["base_url"]}"\n'
                                               'model = "m"\n', encoding="utf-8")
    res = CliRunner().invoke(app, ["run", str(tmp_path / "s"), "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 1 and "connection refused" in res.output


def test_a_model_the_endpoint_does_not_list_is_one_line_before_any_episode(tmp_path, standin, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    server = standin(models=["llama3:latest", "qwen2.5-coder:7b"])
    spec = structural_spec(tmp_path / "s", [{"kind": "llm", "base_url": server.url, "model": "gpt-4o",
                                             "api_key_env": KEY_ENV}])
    with pytest.raises(EndpointError) as exc:
        start_run(spec, tmp_path / "runs", "x")
    assert "'gpt-4o'" in str(exc.value) and "'qwen2.5-coder:7b'" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "runs" / "x").exists() and server.requests == []
    assert server.gets == [{"path": "/v1/models", "auth": f"Bearer {SECRET}"}]
    check_endpoint(LLMSettings(base_url=server.url, model="llama3"))  # Ollama's name:latest counts as name
    # skippable (offline, or a server that serves names it does not list): the run then starts
    spec = structural_spec(tmp_path / "s2", [{"kind": "llm", "base_url": server.url, "model": "gpt-4o",
                                              "check_endpoint": False, "budget_requests": 1}])
    assert start_run(spec, tmp_path / "runs", "y").stop_reason.startswith("llm budget")


# -- budgets ---------------------------------------------------------------------------------------------

def test_budget_requests_counts_attempts_and_has_a_default(standin):
    assert LLMSettings(base_url="http://localhost:11434/v1", model="m").budget_requests == 200
    server = standin([{"status": 429}] * 5)
    r = refiner(server.url, proposals=3, retries=5, budget_requests=3, concurrency=1)
    assert r.propose(parent(), None, np.random.default_rng(0)) == []
    assert len(server.requests) == 3 and r.spent.requests == 3  # the retries stopped where the budget did
    assert r.idle_reason().startswith("llm budget: 3 of 3 requests")


def test_a_refiner_out_of_its_budget_retires_and_the_run_ends_on_what_ended_it(tmp_path, standin, pool):
    """Issue 44, item 5: beside cmaes, an llm refiner whose budget_requests is spent retires and cmaes goes on until
    the env-step budget ends the run: the stop says so (not the llm's budget), and the final decision follows, as
    it does for the same spec without llm. A lone llm refiner whose budget is spent ends its run on a budget too."""
    server = standin()
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 1, "variants": 1, "budget_requests": 1,
           "retries": 0, "concurrency": 1}
    spec = structural_spec(tmp_path / "s", [llm, {"kind": "cmaes", "popsize": 4}], budget={"env_steps": 20_000})
    events = read_events(start_run(spec, tmp_path / "runs", "both", executor=pool).run_dir)
    finished = events_of(events, EventType.RUN_FINISHED)[0].payload
    assert len(server.requests) == 1
    gens = [e.payload["refiner"] for e in events_of(events, EventType.GENERATION_FINISHED)]
    assert gens.count("llm") == 1 and gens[-2:] == ["cmaes", "cmaes"]  # cmaes went on after the llm retired
    assert finished["stop_kind"] == "budget" and finished["stop_reason"].startswith("budget: no room")
    assert "llm budget" not in finished["stop_reason"]
    assert len(events_of(events, EventType.FINAL_DECISION)) == 1
    alone = structural_spec(tmp_path / "a", [llm], budget={"env_steps": 20_000})
    events = read_events(start_run(alone, tmp_path / "runs", "alone", executor=pool).run_dir)
    finished = events_of(events, EventType.RUN_FINISHED)[0].payload
    assert finished["stop_kind"] == "budget" and finished["stop_reason"].startswith("llm budget: 1 of 1 requests")


@pytest.mark.parametrize("budget", [{"budget_tokens": 12_000},
                                    {"budget_cost": 0.06, "price_prompt": 2.0, "price_completion": 10.0}])
@pytest.mark.parametrize("concurrency, prompt_tokens", [(1, 3_000), (4, 2_000)])
def test_token_and_cost_budgets_are_never_exceeded(standin, budget, concurrency, prompt_tokens):
    """One request at a time, each is priced with what those before it used (even an endpoint counting more prompt
    tokens than the prompt has bytes stays within the budget here); several in flight, each is priced at its worst
    case (its prompt's bound and max_tokens) before it is sent, beside the others' worst cases."""
    heavy = {"content": GOOD_EDIT, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1_000}}
    server = standin(default=heavy)
    r = refiner(server.url, proposals=10, max_tokens=1_000, concurrency=concurrency, **budget)
    r.propose(parent(), None, np.random.default_rng(0))
    assert 1 <= len(server.requests) < 10
    if "budget_tokens" in budget:
        assert r.spent.tokens <= budget["budget_tokens"] and "the next request may take" in r.idle_reason()
    else:
        assert r.spent.cost <= budget["budget_cost"] and "the next request may cost" in r.idle_reason()
    request = server.requests[-1]["body"]
    assert prompt_bound(request) >= len(request["messages"][1]["content"])


@pytest.mark.parametrize("usage", ['{"prompt_tokens": 100, "completion_tokens": "many"}',
                                   '{"prompt_tokens": 100, "completion_tokens": 1e400}',
                                   '{"prompt_tokens": "100", "completion_tokens": 20}',
                                   '{"prompt_tokens": -5000, "completion_tokens": 20}',
                                   '{"prompt_tokens": 1' + "0" * 400 + ', "completion_tokens": 20}',
                                   '{"prompt_tokens": true, "completion_tokens": 20}', '"lots"', "[1, 2]"])
def test_a_reply_whose_usage_is_not_counts_is_estimated_never_a_crash(standin, usage):
    """``usage`` is the endpoint's word: what is not a count from 0 to a billion is no count, and the request's
    tokens and cost are estimated from its characters (as for a reply without ``usage``); the answer is used."""
    server = standin([{"content": GOOD_EDIT, "usage": usage}])
    exchange, records = recording()
    r = refiner(server.url, exchange, price_prompt=2.0, price_completion=10.0)
    proposed = r.propose(parent(), None, np.random.default_rng(0))
    assert len(proposed) == 1 and not r.take_rejections()
    (_, info), = records
    assert info["tokens_estimated"] is True
    assert 0 < info["prompt_tokens"] < 10**6 and 0 < info["completion_tokens"] < 10**6
    assert 0 < r.spent.tokens < 10**6 and 0 < r.spent.cost < 1.0


# -- the static source check is a filter; its chains to os are closed ------------------------------------

@pytest.mark.parametrize("line", ["SECRET = random._os.popen('id').read()",
                                  "SECRET = typing.sys.modules",
                                  "SECRET = np.matrixlib.defmatrix.sys.modules",
                                  "r = random\nSECRET = r._os",
                                  "SECRET = getattr(random, '_' + 'os')"])
def test_module_attribute_chains_to_os_are_refused(line):
    source = ("import random\nimport typing\nimport numpy as np\n" + line
              + "\nPARAMETERS = {}\n\n\ndef act(observation, params):\n    return 0\n")
    with pytest.raises(PolicyError):
        check_source(source)


def test_imports_of_private_or_foreign_module_names_are_refused():
    for imp in ("from random import _os", "from typing import sys"):
        with pytest.raises(PolicyError):
            check_source(imp + "\nPARAMETERS = {}\n\n\ndef act(observation, params):\n    return 0\n")
    check_source("import numpy as np\nfrom math import pi\nW = np.linalg.norm(np.ones(2)) * pi\nPARAMETERS = {}\n\n\n"
                 "def act(observation, params):\n    return int(np.clip(observation[2] * W, 0, 1))\n")


# -- several requests in flight (issue 42) ---------------------------------------------------------------

def chat_reply(content: str) -> str:
    """A chat-completions body answering ``content``."""
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": 100, "completion_tokens": 20}})


#: Answers chosen by a request's own ``seed`` (never by the order requests come in): two edits, a rewrite and one
#: that cannot be used.
BY_SEED = [GOOD_EDIT, GOOD_EDIT.replace('"default": 0.5', '"default": 1.5'), WHOLE_FILE,
           "No idea.\n<<<<<<< SEARCH\n    return 1 if z > 0 else 0\n"]


def test_concurrency_sends_a_generations_requests_at_once(standin):
    """With a model that takes 1 s to answer, 4 requests at a concurrency of 4 take about 1 s, not 4; never more
    than ``concurrency`` are in flight."""
    server = standin(latency=1.0)
    r = refiner(server.url, proposals=4, concurrency=4)
    t0 = time.monotonic()
    assert len(r.propose(parent(), None, np.random.default_rng(0))) >= 1
    took = time.monotonic() - t0
    assert len(server.requests) == 4 and server.most_at_once == 4
    assert took < 3.0, took  # one after another they take at least 4 s
    server = standin()
    r = refiner(server.url, proposals=6, concurrency=2)
    r.propose(parent(), None, np.random.default_rng(0))
    assert len(server.requests) == 6 and server.most_at_once <= 2


def test_what_is_proposed_never_depends_on_which_answer_came_first():
    """The same answers finishing in opposite orders give the same proposals, rejections and history: a wave's
    answers are read in the order its requests were built."""
    import threading

    def run(descending: bool):
        turn = threading.Condition()
        seeds: list[int] = []
        done: list[int] = []
        barrier = threading.Barrier(4, timeout=20)

        def exchange(key, request, call):  # answers by seed; the wave's requests finish in seed order (or reversed)
            with turn:
                seeds.append(request["seed"])
            barrier.wait()  # all four are in flight
            with turn:
                rank = sorted(seeds, reverse=descending).index(request["seed"])
                assert turn.wait_for(lambda: len(done) == rank, timeout=20)
                done.append(request["seed"])
                turn.notify_all()
            return chat_reply(BY_SEED[request["seed"] % 4]), {"attempts": 1, "prompt_tokens": 100,
                                                              "completion_tokens": 20, "error": None}

        r = refiner("http://127.0.0.1:9/v1", exchange, proposals=4, concurrency=4, variants=2)
        props = r.propose(parent(), None, np.random.default_rng(0))
        return ([c.id for c in props], [x.reason for x in r.take_rejections()],
                [(a.summary, a.verdict, a.ids) for a in r.history]), done

    (first, order_a), (second, order_b) = run(False), run(True)
    assert order_a == list(reversed(order_b)) and order_a != order_b  # the answers did finish in opposite orders
    assert first == second and first[0]


def test_budget_requests_holds_with_requests_in_flight(standin):
    """Each request in flight has its attempts (retries included) reserved from budget_requests before it is sent:
    5 attempts for 4 requests that each would retry 3 times are shared 2, 1, 1, 1; a wave never holds more requests
    than the budget has attempts left."""
    server = standin(default={"status": 429}, latency=0.2)
    r = refiner(server.url, proposals=4, concurrency=4, retries=3, budget_requests=5, max_failures=10)
    assert r.propose(parent(), None, np.random.default_rng(0)) == []
    assert server.most_at_once == 4 and len(server.requests) == 5 and r.spent.requests == 5
    assert r.idle_reason().startswith("llm budget: 5 of 5 requests")
    server = standin(latency=0.2)
    r = refiner(server.url, proposals=4, concurrency=4, budget_requests=3)
    assert len(r.propose(parent(), None, np.random.default_rng(0))) >= 1
    assert len(server.requests) == 3 and r.spent.requests == 3
    assert r.propose(parent(), None, np.random.default_rng(1)) == [] and len(server.requests) == 3


def test_a_refused_key_stops_the_refiner_after_its_wave(standin, monkeypatch):
    """Several requests in flight all meet the refused key: the refiner stops after that wave, not before the next
    request (check_endpoint, at the run's start, catches a refused key before any request)."""
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    server = standin(default={"status": 401, "message": "Incorrect API key provided"})
    r = refiner(server.url, api_key_env=KEY_ENV, proposals=6, retries=3, concurrency=3)
    with pytest.raises(EndpointError, match="HTTP 401"):
        r.propose(parent(), None, np.random.default_rng(0))
    assert len(server.requests) == 3 and r.spent.requests == 3


def _request_digest(body: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]


def test_a_run_killed_with_requests_in_flight_never_asks_again_for_an_answer_it_received(
        tmp_path, standin, monkeypatch, pool):
    """Four requests go out at once; the run dies (like kill -9) right after the third answer is recorded, the fourth
    still in flight. Resuming asks only for the fourth again: every answer recorded is read back."""
    from conftest import SimulatedKill

    from ratchet.services import RunServices

    arrivals = []

    def respond(body):
        arrivals.append(body["seed"])
        return {"content": BY_SEED[body["seed"] % 4], **({"delay": 3.0} if len(arrivals) == 4 else {})}

    server = standin(respond=respond, latency=0.1)
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 4, "variants": 1, "concurrency": 4,
           "budget_requests": 8, "retries": 0}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    record, recorded = RunServices.record, []

    def dying(self, type, key, payload):
        record(self, type, key, payload)
        if type is EventType.LLM_CALL:
            recorded.append(key)
            if len(recorded) == 3:
                raise SimulatedKill("killed with a request in flight")

    monkeypatch.setattr(RunServices, "record", dying)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "k", executor=pool)
    monkeypatch.setattr(RunServices, "record", record)
    run_dir = tmp_path / "runs" / "k"
    before = events_of(read_events(run_dir), EventType.LLM_CALL)
    assert len(before) == 3 and len(server.requests) == 4
    result = resume_run(run_dir, executor=pool)
    assert result.stop_reason.startswith("llm budget: 8 of 8 requests")
    asked: dict[str, int] = {}
    for q in server.requests:
        asked[_request_digest(q["body"])] = asked.get(_request_digest(q["body"]), 0) + 1
    assert all(asked[e.key.split("/")[-1]] == 1 for e in before)  # no answer received is asked for again
    assert sorted(asked.values()) == [1] * 7 + [2]  # only the one in flight when the run died
    calls = events_of(read_events(run_dir), EventType.LLM_CALL)
    assert len(calls) == 8 and len({e.key for e in calls}) == 8


def test_the_ledger_does_not_depend_on_which_answer_came_first(tmp_path, standin, pool):
    """Two runs of one spec against endpoints giving the same answers, one answering a wave's requests in the
    opposite order of the other: the same events with the same payloads (but each request's seconds, and the
    endpoint's address in run_started), and the same proposals in the same order. (The ledger's order of events
    that finish at their own pace — each wave's llm_call events, recorded as the answers come, and the candidates'
    evaluations — is the timing's.)"""
    from conftest import normalized

    def run(name: str, flip: bool):
        def respond(body):
            slow = (body["seed"] % 5) / 10
            return {"content": BY_SEED[body["seed"] % 4], "delay": (0.4 - slow) if flip else slow}

        server = standin(respond=respond)
        llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 4, "variants": 1,
               "concurrency": 4, "budget_requests": 8, "retries": 0}
        spec = structural_spec(tmp_path / name, [llm], budget={"env_steps": 20_000})
        events = normalized(read_events(start_run(spec, tmp_path / name / "runs", "r", executor=pool).run_dir))
        by_key = {key: (t, {k: v for k, v in p.items() if k != "seconds"} if t == EventType.LLM_CALL.value else p)
                  for t, key, p in events if t != EventType.RUN_STARTED.value}
        in_order = [key for t, key, _ in events if t in (EventType.CANDIDATE_PROPOSED.value,
                                                          EventType.PROPOSAL_REJECTED.value)]
        return by_key, in_order

    (a, order_a), (b, order_b) = run("a", False), run("b", True)
    assert sum(t == EventType.LLM_CALL.value for t, _ in a.values()) == 8 and order_a
    assert a == b and order_a == order_b


def test_concurrency_is_a_checked_setting_and_older_ledgers_keep_one_request_at_a_time(tmp_path):
    from ratchet.errors import SpecError
    from ratchet.loop import recorded_spec

    llm = {"kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    spec = structural_spec(tmp_path / "s", [llm])
    assert spec.refiner_entries()[0]["concurrency"] == 4
    with pytest.raises(SpecError, match=r"^\S.*concurrency: Input should be greater than or equal to 1$"):
        structural_spec(tmp_path / "s", [{**llm, "concurrency": 0}])
    stored = spec.to_dict()
    assert recorded_spec(stored).refiner_entries()[0]["concurrency"] == 4
    del stored["refiners"][0]["concurrency"]  # a ledger written before the setting: one request at a time
    assert recorded_spec(stored).refiner_entries()[0]["concurrency"] == 1
