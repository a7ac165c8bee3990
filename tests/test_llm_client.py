"""The LLM client holds its own boundary, and an endpoint that fails says so (issue 18, sections 3 and 4).

Each test plays a hostile or broken endpoint on 127.0.0.1 (the stand-in server of tests/conftest.py): a
redirect to another origin, a reply dripped one byte a second, a 100 MB reply, a refused key, nothing
listening, a model the server does not list. Everything is local and takes seconds.
"""

from __future__ import annotations

import json
import re
import socket
import time
import tracemalloc

import numpy as np
import pytest
from conftest import DATA, GOOD_EDIT, events_of, killed_run, read_events
from test_structural import SECRET, TASK_FACTS, WHOLE_FILE, structural_spec
from typer.testing import CliRunner

from ratchet.errors import ApiKeyNotSetError, EndpointError, PolicyError
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
    assert line.endswith(f"; once it is fixed, continue with `ratchet resume {tmp_path / 'runs' / 'ep'}`"), line
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
    server = standin([{"drip": 1.0, "drip_bytes": 90}] * 3)
    exchange, records = recording()
    r = refiner(server.url, exchange, timeout_s=2.0, retries=3)
    t0 = time.monotonic()
    assert r.propose(parent(), None, np.random.default_rng(0)) == []
    assert time.monotonic() - t0 < 45  # one byte a second used to hold a call for as long as the server liked (90 s)
    (body, info), = records
    assert body is None and info["timed_out"] and "timeout_s = 2 s" in info["error"]
    assert len(server.requests) == 1  # one deadline for the call: no retry fits after it


def test_no_request_outlasts_the_runs_wall_clock(standin):
    server = standin([{"delay": 60.0, "content": GOOD_EDIT}])
    exchange, records = recording()
    r = refiner(server.url, exchange, timeout_s=120.0)
    r.time_left = lambda: 0.5
    t0 = time.monotonic()
    assert r.propose(parent(), None, np.random.default_rng(0)) == []
    assert time.monotonic() - t0 < 30 and records == []  # cut by the run's clock (the answer takes 60 s): nothing recorded
    r.time_left = lambda: 0.0
    assert r.propose(parent(), None, np.random.default_rng(0)) == [] and len(server.requests) == 1


def test_wall_clock_budget_stops_a_run_that_waits_on_its_endpoint(tmp_path, standin, pool):
    server = standin(default={"delay": 600.0, "content": GOOD_EDIT})
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 1, "variants": 1, "timeout_s": 240}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 50_000, "wall_clock_s": 4})
    t0 = time.monotonic()
    result = start_run(spec, tmp_path / "runs", "wc", executor=pool)
    assert time.monotonic() - t0 < 120 and len(server.requests) >= 1  # not held for the request's 240 s
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
    with pytest.raises(EndpointError, match=r"3 requests in a row failed \(max_failures; a request fails once its "
                                            r"retries are spent\), the last: cannot reach .* connection refused .*"
                                            r"\(2 attempts\); start the server"):
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


@pytest.mark.parametrize("ahead", [0, 1])
def test_beside_other_refiners_the_run_goes_on_without_a_dead_endpoint(tmp_path, pool, ahead):
    llm = {"kind": "llm", "base_url": refused_url(), "model": "m", "proposals": 1, "variants": 1, "retries": 0,
           "check_endpoint": False, "ahead": ahead}
    spec = structural_spec(tmp_path / "s", [{"kind": "mutate", "programs": 2, "variants": 1}, llm],
                           budget={"env_steps": 15_000})
    said = []
    result = start_run(spec, tmp_path / "runs", "mix", executor=pool, progress=said.append)
    assert "llm endpoint" not in result.stop_reason
    retired = [info for info in said if info.get("retired")]  # the progress names it once, with why
    assert len(retired) == 1 and "connection refused" in retired[0]["retired"]["llm"]
    assert retired[0]["going_on"] == ["mutate"]
    events = read_events(tmp_path / "runs" / "mix")
    gens = events_of(events, EventType.GENERATION_FINISHED)
    stopped = [g for g in gens if g.payload.get("refiner_stopped")]
    assert stopped and "connection refused" in stopped[0].payload["refiner_stopped"]
    assert all(g.payload["refiner"] != "llm" for g in gens[gens.index(stopped[0]) + 1:])
    assert len(gens) > gens.index(stopped[0]) + 1


def test_an_unset_key_says_to_run_again_before_a_run_exists_and_to_resume_it_once_one_does(tmp_path, standin, pool,
                                                                                          monkeypatch):
    """new-user pass: an unset api_key_env said "export it and `ratchet resume` the run" where no run had been made
    (`ratchet resume` then found none), and a run its endpoint stopped said "`ratchet resume` continues a run this
    stopped" without naming it. Before a run exists the message says to run again; once it does, it names the run."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    server = standin(default=WHOLE_FILE)
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "api_key_env": KEY_ENV, "proposals": 1,
           "variants": 1, "retries": 0}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    with pytest.raises(ApiKeyNotSetError) as exc:  # the endpoint check, before the run exists
        start_run(spec, tmp_path / "runs", "k1", executor=pool)
    line = str(exc.value)
    assert f"environment variable {KEY_ENV} (api_key_env) is not set; export it and run again (`ratchet run" in line
    assert "resume" not in line and not (tmp_path / "runs" / "k1").exists(), line
    spec = structural_spec(tmp_path / "s2", [{**llm, "check_endpoint": False}], budget={"env_steps": 20_000})
    with pytest.raises(ApiKeyNotSetError) as exc:  # the run exists when the refiner needs the key
        start_run(spec, tmp_path / "runs", "k2", executor=pool)
    run_dir = tmp_path / "runs" / "k2"
    assert str(exc.value).endswith(f"is not set; export it; once it is fixed, continue with `ratchet resume "
                                   f"{run_dir}`"), str(exc.value)
    assert (run_dir / LEDGER_FILE).exists()
    # an endpoint that stops a running run (check_endpoint = false: nothing listening) names the run too
    spec = structural_spec(tmp_path / "s3", [{**llm, "base_url": refused_url(), "api_key_env": None,
                                              "check_endpoint": False, "proposals": 3, "concurrency": 1}],
                           budget={"env_steps": 20_000})
    with pytest.raises(EndpointError) as exc:
        start_run(spec, tmp_path / "runs", "k3", executor=pool)
    assert "3 requests in a row failed (max_failures; a request fails once its retries are spent)" in str(exc.value)
    assert str(exc.value).endswith(f"; once it is fixed, continue with `ratchet resume {tmp_path / 'runs' / 'k3'}`")


# -- checked at run start: reachable, the model listed ---------------------------------------------------

def test_an_unreachable_endpoint_is_one_line_before_any_episode(tmp_path):
    from ratchet.cli import app

    llm = {"kind": "llm", "base_url": refused_url(), "model": "m"}
    spec = structural_spec(tmp_path / "s", [llm])
    with pytest.raises(EndpointError, match=r"connection refused .*start the server or fix base_url") as exc:
        start_run(spec, tmp_path / "runs", "x")
    line = str(exc.value)  # the URL it tried once, base_url once (new-user pass: the URL came three times)
    assert line.count(llm["base_url"] + "/models") == 1 and line.count(llm["base_url"]) == 2, line
    assert line.endswith("then run again (`ratchet run …`): no run was started"), line
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
    server = standin(latency=1.0, gather=4)  # the four held until all four came in (60 s if they never do)
    r = refiner(server.url, proposals=4, concurrency=4)
    t0 = time.monotonic()
    assert len(r.propose(parent(), None, np.random.default_rng(0))) >= 1
    took = time.monotonic() - t0
    assert len(server.requests) == 4 and server.most_at_once == 4
    assert took < 30, took  # one after another the first waits 60 s for the other three
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
    server = standin(default={"status": 429}, latency=0.2, gather=4)
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

    run_dir = killed_run(monkeypatch, RunServices, "record", dying, spec, tmp_path / "runs", "k", pool)
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
    from conftest import keyed_and_proposed

    def run(name: str, flip: bool):
        def respond(body):
            slow = (body["seed"] % 5) / 10
            return {"content": BY_SEED[body["seed"] % 4], "delay": (0.4 - slow) if flip else slow}

        server = standin(respond=respond)
        llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 4, "variants": 1,
               "concurrency": 4, "budget_requests": 8, "retries": 0}
        spec = structural_spec(tmp_path / name, [llm], budget={"env_steps": 20_000})
        return keyed_and_proposed(start_run(spec, tmp_path / name / "runs", "r", executor=pool).run_dir)

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


# -- a pool of models, money as a budget, edits that land (issue 44) -------------------------------------

#: A diff whose SEARCH text is nowhere in the policy: the answer of a model whose edits never apply.
MISSES = "Tighten it.\n<<<<<<< SEARCH\n    return 2 if z > 0 else 0\n=======\n    return 1 if z >= 0 else 0\n>>>>>>> REPLACE\n"


def policy_in(body: dict) -> str:
    """The policy a request edits, as its prompt quotes it."""
    text = body["messages"][1]["content"]
    return text.split("## Current policy", 1)[1].split("## How the current policy", 1)[0]


def useful_edit(body: dict, first: bool = True) -> str:
    """An edit that applies to any policy the requests quote: GOOD_EDIT first (a big gain on CartPole; with
    ``first``), then a new term with a tunable gain of its own (named by the request's seed, so no two are alike)."""
    if first and '"boost"' not in policy_in(body):
        return GOOD_EDIT
    k = f"k{body['seed'] % 100_000}"
    return (f"Add a term.\n<<<<<<< SEARCH\n    return 1 if z > 0 else 0\n=======\n"
            f"    z = z + params[\"{k}\"] * observation[2]\n    return 1 if z > 0 else 0\n>>>>>>> REPLACE\n"
            f"<<<<<<< SEARCH\nPARAMETERS = {{\n=======\nPARAMETERS = {{\n"
            f"    \"{k}\": {{\"default\": 0.2, \"low\": 0.0, \"high\": 1.0}},\n>>>>>>> REPLACE\n")


def two_models(url: str) -> list[dict]:
    """A pool: an expensive model whose edits pay, and a cheap one whose edits never apply."""
    return [{"base_url": url, "model": "cheap-misses", "price_prompt": 0.15, "price_completion": 0.6},
            {"base_url": url, "model": "dear-useful", "price_prompt": 3.0, "price_completion": 15.0}]


def pool_respond(body: dict) -> dict:
    """The stand-in as the pool of :func:`two_models`: each answer by the model the request names."""
    return {"content": MISSES if body["model"] == "cheap-misses" else useful_edit(body),
            "usage": {"prompt_tokens": 2_000, "completion_tokens": 500}}


def pool_server(standin):
    return standin(respond=pool_respond)


def test_the_bandit_sends_most_requests_to_the_model_whose_edits_pay(tmp_path, standin, pool):
    """Two models on the stand-in: a cheap one whose diffs never apply and a dear one whose edits gain. Of the first 20
    requests, at least 80 % go to the useful one; every choice is in the ledger (the request's model)."""
    server = pool_server(standin)
    llm = {"kind": "llm", "models": two_models(server.url), "proposals": 2, "variants": 1, "concurrency": 2,
           "budget_requests": 20, "retries": 0, "check_endpoint": False, "on_unusable": "skip"}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 300_000})
    result = start_run(spec, tmp_path / "runs", "b", executor=pool)
    picks = [q["body"]["model"] for q in server.requests]
    assert len(picks) == 20, result.stop_reason
    share = picks.count("dear-useful") / len(picks)
    print(f"useful model's share of 20 requests: {share:.0%} ({picks})")
    assert share >= 0.8, picks
    calls = events_of(read_events(result.run_dir), EventType.LLM_CALL)
    assert [c.payload["model"] for c in calls if "pool_index" in c.payload] and len(calls) == 20
    assert sorted(c.payload["model"] for c in calls) == sorted(picks)


def test_a_money_budget_is_never_exceeded_and_shown_with_its_currency(tmp_path, standin, pool):
    """``[budget] money`` caps what the run's requests cost, with four in flight at once, each priced at its worst
    case before it is sent; the run stops on it, and ``show`` says the spend with its currency."""
    from ratchet.cli import app
    from ratchet.ledger.projection import llm_usage_of, llm_usage_text

    server = pool_server(standin)
    llm = {"kind": "llm", "models": two_models(server.url), "proposals": 4, "variants": 1, "concurrency": 4,
           "max_tokens": 600, "retries": 0, "check_endpoint": False, "currency": "EUR"}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 300_000, "money": 0.1, "currency": "EUR"})
    result = start_run(spec, tmp_path / "runs", "m", executor=pool)
    events = read_events(result.run_dir)
    spent = sum(c.payload["cost"] for c in events_of(events, EventType.LLM_CALL))
    assert result.stop_reason.startswith("money budget"), result.stop_reason
    assert 0.05 < spent <= 0.1 and len(server.requests) >= 4
    usage = llm_usage_of(events)["llm"]
    assert f"cost {spent:.4g} EUR" in llm_usage_text(usage)
    assert "models: " in llm_usage_text(usage)  # the pool's requests per model
    # once the dear model's worst case no longer fits, the rest is not spent on the one whose edits never applied
    assert usage["models"]["cheap-misses"] <= 4, usage["models"]
    got = CliRunner().invoke(app, ["show", str(result.run_dir)], env={"COLUMNS": "300"})
    assert got.exit_code == 0 and f"{spent:.4g} EUR" in got.output
    got = CliRunner().invoke(app, ["report", str(result.run_dir), "--no-videos", "-o", str(tmp_path / "r.html")])
    assert got.exit_code == 0 and f"{spent:.4g} EUR" in (tmp_path / "r.html").read_text()
    got = CliRunner().invoke(app, ["llm-log", str(result.run_dir), "--last", "1"])
    assert got.exit_code == 0 and re.search(r"cost [0-9.e-]+ EUR", got.output)
    with pytest.raises(Exception, match="set currency = \"USD\""):
        start_run(structural_spec(tmp_path / "s2", [llm], budget={"env_steps": 300_000, "money": 0.1}),
                  tmp_path / "runs", "m2", executor=pool)


# new-user pass: when [budget] money had no room left for the next request's worst case (its prompt longer than the
# last one's), the generation's line said "no contender finished its training episodes without an error"
def test_a_generation_no_request_was_affordable_for_says_so(tmp_path, standin, pool):
    server = standin(respond=lambda body: {"content": useful_edit(body, first=False),
                                           "usage": {"prompt_tokens": 0, "completion_tokens": 0}})
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 1, "variants": 1, "max_tokens": 100,
           "retries": 0, "check_endpoint": False, "price_prompt": 1.0}
    # the first prompt's worst case (about 4,000 tokens at 1 USD per million) fits 0.005 USD; the second's (the first
    # edit in its history: about 5,500) does not
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 300_000, "money": 0.005}, test={"episodes": 1})
    result = start_run(spec, tmp_path / "runs", "m", executor=pool)
    notes = [e.payload["gate_note"] for e in events_of(read_events(result.run_dir), EventType.GENERATION_FINISHED)]
    assert len(server.requests) == 1 and result.stop_reason.startswith("money budget"), result.stop_reason
    assert notes[-1].startswith("no contender: no request of llm was affordable (money budget: 0 of 0.005 USD "
                                "spent; the next request may cost "), notes
    assert not any("without an error" in n for n in notes)


def test_the_bandit_prefers_gain_per_money_and_explores_each_model_first():
    from ratchet.refiners.llm import ModelBandit

    b = ModelBandit(3, explore=1.0, priced=True)
    assert b.ranked() == [0, 1, 2]  # none asked yet: the pool's order
    for arm, gain, cost in [(0, 1.0, 1.0), (1, 1.0, 0.1), (2, 0.0, 0.01)]:
        b.sent[arm], b.scored[arm], b.gain[arm], b.cost[arm], b.paid[arm] = 1, 1, gain, cost, 1
    assert b.ranked()[0] == 1  # the same gain for a tenth of the money
    b.sent[1] = 50  # asked often, its bonus shrinks below the others'
    assert b.ranked()[0] != 1
    b.sent[1] = 1  # a model that gained nothing stands in for no other: only the best-ranked may go
    assert b.stand_ins() == [1, 0] and 2 not in b.stand_ins()


def test_a_pool_is_checked_when_the_spec_is_read():
    url = "http://localhost:11434/v1"
    with pytest.raises(ValueError, match="not both"):
        LLMSettings(base_url=url, model="m", models=[{"base_url": url, "model": "m"}])
    with pytest.raises(ValueError, match="models"):
        LLMSettings(base_url=url)
    with pytest.raises(ValueError, match="would be written to the run's ledger"):
        LLMSettings(models=[{"base_url": url + "?key=sk-1", "model": "m"}])
    s = LLMSettings(models=[{"base_url": url, "model": "a"}, {"base_url": url, "model": "b", "price_prompt": 2.0}],
                    price_prompt=1.0, api_key_env="K")
    assert [(m.model, m.price_prompt, m.api_key_env) for m in s.pool] == [("a", 1.0, "K"), ("b", 2.0, "K")]
    assert [m.model for m in LLMSettings(base_url=url, model="m").pool] == ["m"]


def whole_file(body: dict) -> str:
    """A whole policy file, its gain set by the request's seed (no two alike)."""
    return WHOLE_FILE.replace('"default": 1.0', f'"default": {1 + body["seed"] % 997 / 1000}')


def never_applies(body: dict) -> str:
    """A model whose diffs never apply, but which writes a whole file when asked for one, and a diff that applies
    when shown why its last one did not."""
    last = body["messages"][-1]["content"]
    if "whole new policy file" in last:
        return whole_file(body)
    if "could not be used" in last:
        return useful_edit(body, first=False)
    return MISSES


@pytest.mark.parametrize("mode", ["rewrite", "retry"])
def test_with_the_fallback_on_answers_whose_diffs_never_apply_become_candidates(standin, mode):
    """A model whose diffs never apply: each unusable answer is asked about once more (the failure quoted, and the
    whole file asked for with ``rewrite``), and at least 90 % of the answers become candidates (none does with
    ``skip``); the follow-ups count in budget_requests."""
    server = standin(respond=never_applies)
    r = refiner(server.url, proposals=10, concurrency=4, on_unusable=mode)
    out = r.propose(parent(), None, np.random.default_rng(0))
    firsts = [q for q in server.requests if len(q["body"]["messages"]) == 2]
    again = [q["body"]["messages"][-1]["content"] for q in server.requests if len(q["body"]["messages"]) == 4]
    print(f"{mode}: {len(out)} candidates of {len(firsts)} answers")
    assert len(firsts) == 10 and len(out) / len(firsts) >= 0.9
    assert len(again) == 10 and all("SEARCH block 1 does not match the policy" in m for m in again)
    assert r.spent.requests == 20
    server = standin(respond=never_applies)
    r = refiner(server.url, proposals=10, concurrency=4, on_unusable="skip")
    assert r.propose(parent(), None, np.random.default_rng(0)) == [] and len(server.requests) == 10
    server = standin(respond=never_applies)
    r = refiner(server.url, proposals=4, concurrency=4, on_unusable=mode, budget_requests=6)
    r.propose(parent(), None, np.random.default_rng(0))
    assert len(server.requests) == 6 and r.spent.requests == 6  # only two follow-ups fit the budget


#: An edit whose program raises at a line of its own code in every episode.
RAISES = ("Scale it.\n<<<<<<< SEARCH\n    return 1 if z > 0 else 0\n=======\n    return 1 if z > int(\"zero\") else 0\n"
          ">>>>>>> REPLACE\n")


def test_a_program_that_failed_on_a_line_of_its_code_is_sent_back_with_the_error_quoted(tmp_path, standin, pool):
    """An edit whose every episode raises ValueError: the next generation's request edits that program, its
    prompt quoting the error and the line that raised it; the repaired program is its child."""
    server = standin(respond=lambda body: useful_edit(body) if "## It fails" in body["messages"][1]["content"]
                     else RAISES)
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 1, "variants": 1, "concurrency": 1,
           "budget_requests": 2, "retries": 0, "check_endpoint": False}
    result = start_run(structural_spec(tmp_path / "s", [llm], budget={"env_steps": 100_000}), tmp_path / "runs", "r",
                       executor=pool)
    prompts = [q["body"]["messages"][1]["content"] for q in server.requests]
    assert len(prompts) == 2 and "## It fails" not in prompts[0]
    fails = prompts[1].split("## It fails", 1)[1]
    assert "policy raised ValueError: invalid literal" in fails and 'line 13: return 1 if z > int("zero") else 0' in fails
    proposed = [e.payload["candidate"] for e in events_of(read_events(result.run_dir), EventType.CANDIDATE_PROPOSED)]
    assert len(proposed) == 2 and proposed[1]["parent_id"] == proposed[0]["id"]


def test_a_pool_run_killed_with_requests_in_flight_resumes_to_the_same_choices(tmp_path, standin, monkeypatch, pool):
    """The bandit's choices come from recorded answers and evaluations only: a pool run killed right after its fifth
    answer is recorded (others in flight) resumes to the same requests, models included, as a run never killed."""
    from conftest import SimulatedKill

    from ratchet.services import RunServices

    def spec(name: str, url: str):
        llm = {"kind": "llm", "models": two_models(url), "proposals": 2, "variants": 1, "concurrency": 2,
               "budget_requests": 12, "retries": 0, "check_endpoint": False}
        return structural_spec(tmp_path / name, [llm], budget={"env_steps": 300_000})

    whole = start_run(spec("whole", pool_server(standin).url), tmp_path / "whole" / "runs", "r", executor=pool)
    record, recorded = RunServices.record, []

    def dying(self, type, key, payload):
        record(self, type, key, payload)
        if type is EventType.LLM_CALL:
            recorded.append(key)
            if len(recorded) == 5:
                raise SimulatedKill("killed with a request in flight")

    server = pool_server(standin)
    resumed = resume_run(killed_run(monkeypatch, RunServices, "record", dying, spec("killed", server.url),
                                    tmp_path / "killed" / "runs", "r", pool), executor=pool)

    def calls(run_dir):
        return sorted((e.key, e.payload["model"]) for e in events_of(read_events(run_dir), EventType.LLM_CALL))

    assert calls(whole.run_dir) == calls(resumed.run_dir) and len(calls(whole.run_dir)) >= 12
    assert len({m for _, m in calls(whole.run_dir)}) == 2


def test_a_models_concurrency_caps_its_share_of_a_wave(standin):
    """A model with ``concurrency = 1`` gets at most one request of each wave, whatever the bandit prefers."""
    server = standin()
    models = [{"base_url": server.url, "model": "one-at-a-time", "concurrency": 1},
              {"base_url": server.url, "model": "many"}]
    r = LLMRefiner(LLMSettings(models=models, proposals=8, variants=1, concurrency=4, backoff_s=0.0), TASK_FACTS,
                   sleep=lambda s: None)
    r.propose(parent(), None, np.random.default_rng(0))
    picks = [q["body"]["model"] for q in server.requests]
    assert len(picks) == 8 and picks[:4].count("one-at-a-time") == 1 and picks[4:].count("one-at-a-time") <= 1


def test_older_ledgers_resume_without_follow_ups_or_repairs(tmp_path):
    """A spec a ledger recorded before on_unusable and repair existed reads as the code then behaved: an unusable answer
    is recorded and left, a failed program is not sent back; a new spec records both settings."""
    from ratchet.loop import recorded_spec

    llm = {"kind": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    stored = structural_spec(tmp_path / "s", [llm]).to_dict()
    entry = recorded_spec(stored).refiner_entries()[0]
    assert (entry["on_unusable"], entry["repair"]) == ("retry", True)
    del stored["refiners"][0]["on_unusable"], stored["refiners"][0]["repair"]
    entry = recorded_spec(stored).refiner_entries()[0]
    assert (entry["on_unusable"], entry["repair"]) == ("skip", False)
