"""``ratchet dashboard``: the JSON the page reads equals the run's projection, a run being written gains generations
on the page without a reload (headless Chromium), the refusals of the correction page (token, Host, Origin,
malformed ids), database storage, and nothing is ever written to a ledger."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import read_events
from typer.testing import CliRunner

from ratchet.cli import app
from ratchet.dashboard import Dashboard, DashboardServer, RunPage, RunSource
from ratchet.errors import LedgerError, RunNotFoundError
from ratchet.ledger import EventType, SQLiteLedger
from ratchet.ledger.projection import project

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("RATCHET_TEST_ARTIFACTS", ROOT / "test-artifacts"))


def _get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, bytes]:
    """``(status, body)`` of a request with exactly these headers (``Host`` included when given)."""
    parts = urlsplit(url)
    con = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        con.putrequest(method, parts.path + (f"?{parts.query}" if parts.query else ""), skip_host="Host" in (headers or {}))
        for k, v in (headers or {}).items():
            con.putheader(k, v)
        con.endheaders()
        r = con.getresponse()
        return r.status, r.read()
    finally:
        con.close()


def _json(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def served(finished_run, tmp_path):
    """A runs folder holding a copy of the finished CartPole run (``done``), served; yields (server, runs dir)."""
    _, run_dir, _ = finished_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "done", ignore=shutil.ignore_patterns(".lock", "workers"))
    server = DashboardServer(runs)
    server.start()
    yield server, runs
    server.stop()


def test_runs_table_and_run_page_are_the_projection(served):
    server, runs = served
    state = project(read_events(runs / "done"))
    table = _json(server.url + "api/runs")
    assert table["where"] == str(runs) and table["unreadable"] == []
    (row,) = table["runs"]
    assert row["run_id"] == "done" and row["status"] == "finished" and row["task"] == "CartPole-v1"
    assert row["policy_kind"] == "program" and row["refiners"] == ["cmaes"]
    assert row["generations"] == state.generations and row["promotions"] == len(state.promotions)
    assert row["test"] == pytest.approx(state.test["mean"]) and row["start_test"] == pytest.approx(state.baseline_test["mean"])
    assert row["incumbent_validation"] == pytest.approx(state.incumbent_validation_mean)
    assert row["env_steps"] == state.env_steps and row["budget_env_steps"] == state.spec["budget"]["env_steps"]

    page = _json(server.url + "api/runs/done")
    gens = [e.payload for e in read_events(runs / "done") if e.type is EventType.GENERATION_FINISHED]
    assert page["n_generations"] == len(gens) == state.generations
    assert page["generations"]["best_train_mean"] == [g["best_train_mean"] for g in gens]
    assert page["generations"]["gate_note"] == [g["gate_note"] for g in gens]
    assert page["n_gates"] == len(state.gates) and [g["p_value"] for g in page["gates"]] == \
        [g["p_value"] for g in state.gates]
    assert [p["to"] for p in page["promotions"]] == [p["to"] for p in state.promotions]
    assert page["incumbent_id"] == state.incumbent_id and page["test"]["mean"] == pytest.approx(state.test["mean"])
    assert page["env_steps_breakdown"] == state.env_steps_breakdown
    assert page["structural"] is False  # cmaes changes numbers only: no lineage of programs to read
    changed = {c["name"] for p in page["promotions"] for c in p["changes"]}
    assert changed and changed <= set(state.candidates[state.incumbent_id]["params"])
    # a poll asks only for what it lacks
    later = _json(server.url + f"api/runs/done?gen_from={len(gens) - 1}&gate_from={len(state.gates)}")
    assert later["gen_from"] == len(gens) - 1 and later["generations"]["generation"] == [len(gens)]
    assert later["gates"] == []
    status, body = _get(server.url + "static/uPlot.iife.min.js")
    assert status == 200 and b"uPlot" in body  # bundled: no CDN


def test_refusals_are_one_line_and_nothing_is_written(served):
    server, runs = served
    ledger = runs / "done" / "ledger.sqlite"
    before = hashlib.sha256(ledger.read_bytes()).hexdigest()
    base = server.url.rstrip("/")
    host = urlsplit(server.url).netloc
    root = f"http://{host}"
    cases = [
        (root + "/wrong-token/api/runs", {}, 403, "forbidden: open the URL"),
        (root + "/api/runs", {}, 403, "forbidden"),
        (base + "/api/runs", {"Host": f"evil.example:{server.port}"}, 403, "unexpected Host"),
        (base + "/api/runs", {"Host": host, "Origin": "http://evil.example"}, 403, "another origin"),
        (base + "/api/runs/bad%24id", {}, 400, "malformed run id"),
        (base + "/api/runs/" + "a" * 300, {}, 400, "malformed run id"),
        (base + "/api/runs/nope", {}, 404, "no run 'nope'"),
        (base + "/api/runs/done?gen_from=-1", {}, 400, "gen_from must be"),
        (base + "/api/runs/done?gate_from=1e9", {}, 400, "gate_from must be"),
        (base + "/api/runs/done/gif/sideways/1", {}, 400, "before or after"),
        (base + "/api/runs/done/gif/after/7", {}, 404, "no GIF"),
        (base + "/api/runs/done/programs/x%24y", {}, 400, "malformed candidate id"),
        (base + "/api/runs/done/programs/x%2F..", {}, 404, "not found"),
        (base + "/api/runs/..%2F..%2Fetc", {}, 404, "not found"),
        (base + "/api/runs/done/programs/abc", {}, 404, "no changed program"),
    ]
    for url, headers, code, text in cases:
        status, body = _get(url, headers)
        line = body.decode()
        assert status == code, (url, status, line)
        assert text in line and line.count("\n") == 1 and "Traceback" not in line, (url, line)
    status, body = _get(base + "/api/runs", method="POST")
    assert status == 405 and b"only reads" in body
    status, _ = _get(base)  # /TOKEN → /TOKEN/
    assert status == 307
    status, _ = _get(base + "/api/runs", {"Host": host, "Origin": root})  # the page's own origin
    assert status == 200
    assert hashlib.sha256(ledger.read_bytes()).hexdigest() == before


def test_page_folds_incrementally_as_it_would_at_once(finished_run, tmp_path):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    half = tmp_path / "half" / "ledger.sqlite"
    whole = SQLiteLedger(run_dir / "ledger.sqlite", readonly=True)
    growing = SQLiteLedger(half)
    cut = next(i for i, e in enumerate(events) if e.type is EventType.GENERATION_FINISHED) + 1
    growing.append_many([(e.type, e.key, e.payload) for e in events[:cut]])
    page = RunPage("half")
    assert page.refresh(growing) and page.view()["n_generations"] == 1
    assert page.view()["status"] == "running"  # the writer (this process) is alive and nothing ended the run
    growing.append_many([(e.type, e.key, e.payload) for e in events[cut:]])
    assert page.refresh(growing) and not page.refresh(growing)  # nothing new the second time
    at_once = RunPage("whole")
    at_once.refresh(whole)
    a, b = page.view(), at_once.view()
    for view in (a, b):  # the copy's events were appended now: their times differ from the run's
        for key in ("last_activity", "run_id", "started_at"):
            view.pop(key)
        view["generations"].pop("time")
    assert a == b
    whole.close()
    growing.close()


def test_structural_runs_show_their_lineage_and_diffs(finished_run, tmp_path):
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    led = SQLiteLedger(tmp_path / "mut" / "ledger.sqlite")
    start = events[0].payload
    spec = {**start["spec"], "refiners": [{"kind": "mutate", "name": "mutate"}]}
    led.append(EventType.RUN_STARTED, "run_started", {**start, "spec": spec})
    led.append_many([(e.type, e.key, e.payload) for e in events[1:] if e.type is not EventType.RUN_FINISHED])
    source = start["policy_source"]
    child = {"id": "c0ffee000001", "source": source + "\nCHILD = 1\n", "params": {},
             "parent_id": start["start_candidate"]["id"], "refiner": "mutate"}
    grandchild = {**child, "id": "c0ffee000002", "parent_id": "c0ffee000001",
                  "source": child["source"].replace("CHILD = 1", "CHILD = 2")}
    for c in (child, grandchild):
        led.append(EventType.CANDIDATE_PROPOSED, f"proposed/9/{c['id']}", {"generation": 9, "candidate": c})
    led.close()
    dash = Dashboard(RunSource(tmp_path))
    try:
        assert dash.page("mut").view()["structural"] and not dash.page("mut").programs  # read apart, when asked
        lin = dash.lineage("mut")
        assert lin["total"] == 2 and [n["id"] for n in lin["nodes"]] == ["c0ffee000001", "c0ffee000002"]
        assert lin["nodes"][1]["parent_id"] == "c0ffee000001" and not any(n["promoted"] for n in lin["nodes"])
        assert dash.lineage("mut") == lin  # nothing read twice
        d = dash.program("mut", "c0ffee000002")
        assert "-CHILD = 1" in d["diff"] and "+CHILD = 2" in d["diff"]  # against its parent, not the start
        assert "+CHILD = 1" in dash.program("mut", "c0ffee000001")["diff"]
        with pytest.raises(RunNotFoundError):
            dash.program("mut", "nope")

    finally:
        dash.close()


def test_a_dead_writer_is_interrupted_and_a_damaged_run_does_not_hide_the_others(finished_run, tmp_path):
    _, run_dir, _ = finished_run
    events = [e for e in read_events(run_dir) if e.type is not EventType.RUN_FINISHED]
    dead = SQLiteLedger(tmp_path / "dead" / "ledger.sqlite")
    first = events[0]
    dead.append(first.type, first.key, {**first.payload, "pid": 2**22 + 12345})  # no such process
    dead.append_many([(e.type, e.key, e.payload) for e in events[1:]])
    dead.close()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "ledger.sqlite").write_bytes(b"not a database at all" * 100)
    dash = Dashboard(RunSource(tmp_path))
    try:
        table = dash.runs()
        assert [r["run_id"] for r in table["runs"]] == ["dead"]
        assert table["runs"][0]["status"] == "interrupted" and table["runs"][0]["test"] is None
        assert [u["run_id"] for u in table["unreadable"]] == ["broken"]
        assert dash.runs()["runs"] == table["runs"]  # cached rows, the same answer
    finally:
        dash.close()


def test_database_storage(finished_run, shared_storage):
    from ratchet.ledger.sql import SQLAlchemyLedger

    _, run_dir, _ = finished_run
    from conftest import unique_run_id

    run_id = unique_run_id("dash")
    led = SQLAlchemyLedger(shared_storage, run_id)
    led.append_many([(e.type, e.key, e.payload) for e in read_events(run_dir)])
    led.close()
    dash = Dashboard(RunSource("unused", shared_storage))
    try:
        # a row that takes longer than the dashboard's deadline to read (the shared database holds every test's
        # runs, on a loaded machine) is listed as unreadable for now and read on in the background: poll for it
        deadline, rows = time.monotonic() + 60, {}
        while run_id not in rows and time.monotonic() < deadline:
            rows = {r["run_id"]: r for r in dash.runs()["runs"]}
            if run_id not in rows:
                time.sleep(0.5)
        assert run_id in rows, dash.runs()["unreadable"]
        assert rows[run_id]["status"] == "finished" and rows[run_id]["task"] == "CartPole-v1"
        view = dash.page(run_id).view()
        assert view["n_generations"] == rows[run_id]["generations"] > 0
        assert dash.page(run_id).view(gen_from=view["n_generations"])["generations"]["generation"] == []
    finally:
        dash.close()


def test_a_planted_pointer_is_listed_and_never_connected_to(tmp_path, listener, monkeypatch):
    """A ``ledger.json`` in the runs folder naming a server: its row says where it points and that it was not opened;
    its page is one line; the dashboard never connects there (a poll every 3 s would send PGPASSWORD each time)."""
    monkeypatch.setenv("PGPASSWORD", "s3cret-pw")
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "ledger.json").write_text(json.dumps(
        {"storage": f"postgresql://someone@127.0.0.1:{listener.port}/ratchet", "run_id": "planted"}))
    dash = Dashboard(RunSource(tmp_path))
    try:
        for _ in range(2):
            table = dash.runs()
            assert table["runs"] == [] and [u["run_id"] for u in table["unreadable"]] == ["planted"]
            assert "127.0.0.1" in table["unreadable"][0]["error"] and "not opened" in table["unreadable"][0]["error"]
            with pytest.raises(LedgerError, match="not opened"):
                dash.page("planted")
    finally:
        dash.close()
    assert listener.connections == []


def test_a_ledger_holding_an_endless_view_is_an_answer_not_a_hang(tmp_path):
    """A run whose ``events`` is a recursive view: its row is unreadable and its page one line, at once (in a process
    of its own: the old read never returned, and the server then ignored SIGTERM and SIGINT)."""
    import sqlite3
    import subprocess
    import sys

    SQLiteLedger(tmp_path / "endless" / "ledger.sqlite").close()
    with sqlite3.connect(tmp_path / "endless" / "ledger.sqlite") as db:
        db.executescript("DROP TABLE events; CREATE VIEW events AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT "
                         "n + 1 FROM r) SELECT n AS seq, 'k' || n AS key, 'run_started' AS type, 0.0 AS time, '{}' AS "
                         "payload FROM r ORDER BY n DESC")
    db.close()
    code = ("import sys\nfrom ratchet.dashboard import Dashboard, RunSource\nfrom ratchet.errors import LedgerError\n"
            "dash = Dashboard(RunSource(sys.argv[1]))\n"
            "print(dash.runs()['unreadable'])\n"
            "try:\n"
            "    dash.page('endless')\n"
            "except LedgerError as exc:\n"
            "    print(exc)\n"
            "dash.close()\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    unreadable, page = out.stdout.splitlines()
    assert "'endless'" in unreadable and "not a ratchet ledger" in unreadable
    assert "is not a ratchet ledger: its view 'events'" in page


def test_a_lone_surrogate_in_a_ledger_is_shown_not_a_500(finished_run, tmp_path):
    """A lone surrogate (policy text in an old or hostile ledger: a gate note, a stop reason, an error) cannot be
    UTF-8: the page and the runs table still answer, with it replaced (the old answer: a 500 on every poll)."""
    import sqlite3

    _, run_dir, _ = finished_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "odd", ignore=shutil.ignore_patterns(".lock", "workers"))
    with sqlite3.connect(runs / "odd" / "ledger.sqlite") as con:
        for key, where in (("generation_finished", "gate_note"), ("run_finished", "stop_reason")):
            seq, payload = con.execute("SELECT seq, payload FROM events WHERE type = ? ORDER BY seq DESC LIMIT 1",
                                       (key,)).fetchone()
            text = json.dumps({**json.loads(payload), where: "odd \ud800 text"})  # JSON's own escape of U+D800
            con.execute("UPDATE events SET payload = ? WHERE seq = ?", (text, seq))
        started = json.loads(con.execute("SELECT payload FROM events WHERE key = 'run_started'").fetchone()[0])
        started["task"]["env_id"] = "odd \ud800 text"  # the runs table's task column
        con.execute("UPDATE events SET payload = ? WHERE key = 'run_started'", (json.dumps(started),))
    con.close()
    server = DashboardServer(runs)
    server.start()
    try:
        for path in ("api/runs/odd", "api/runs"):
            status, body = _get(server.url + path, {"Host": urlsplit(server.url).netloc})
            assert status == 200, body
            assert "odd ? text" in body.decode("utf-8")
    finally:
        server.stop()


def test_cli_refuses_bad_input_in_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = CliRunner().invoke(app, ["dashboard", "--runs-dir", str(f)])
    assert res.exit_code == 1 and "is a file" in res.output and res.output.count("\n") == 1
    res = CliRunner().invoke(app, ["dashboard", "--port", "70000"])
    assert res.exit_code == 2 and "65535" in res.output
    res = CliRunner().invoke(app, ["dashboard", "--storage", "mysql+nodriver://x/y"])
    assert res.exit_code == 1 and "error:" in res.output


def test_a_run_being_written_updates_in_a_headless_browser(finished_run, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for downloads
    _, run_dir, _ = finished_run
    events = read_events(run_dir)
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "done", ignore=shutil.ignore_patterns(".lock", "workers"))
    led = SQLiteLedger(runs / "live" / "ledger.sqlite")
    gens = [i for i, e in enumerate(events) if e.type is EventType.GENERATION_FINISHED]
    led.append_many([(e.type, e.key, e.payload) for e in events[:gens[0] + 1]])  # one generation so far
    server = DashboardServer(runs)
    server.start()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--window-size=1300,1800"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(driver), options=options)

    def wait(js: str, timeout: float = 120) -> None:  # a loaded machine's chromium is slow
        end = time.monotonic() + timeout
        while not browser.execute_script(f"return !!({js})"):
            assert time.monotonic() < end, f"page never satisfied {js}"
            time.sleep(0.05)

    try:
        browser.get(server.url)
        wait("document.querySelectorAll('#runs-table tr[data-run]').length === 2")
        assert "running" in browser.find_element(By.CSS_SELECTOR, "tr[data-run='live']").text
        browser.get(server.url + "#/run/live")
        wait("document.getElementById('n-gens') && document.getElementById('n-gens').textContent === '1'")
        browser.execute_script("window.__sameDocument = true")  # gone if the page reloads
        led.append_many([(e.type, e.key, e.payload) for e in events[gens[0] + 1:]])  # the run goes on, and ends
        n = len(gens)
        wait(f"document.getElementById('n-gens').textContent === '{n}'")
        wait("document.querySelector('.status').textContent === 'finished'")
        assert browser.execute_script("return window.__sameDocument === true")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#gens-table tr")) == n + 1
        assert len(browser.find_elements(By.CSS_SELECTOR, ".uplot")) == 2  # the curves (one refiner: no allocation)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard-run.png"))
        browser.get(server.url + "#/compare/done/live")
        wait("document.querySelectorAll('#side > div').length === 2")
        browser.save_screenshot(str(ARTIFACTS / "dashboard-compare.png"))
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        browser.quit()
        server.stop()
        led.close()
    assert (ARTIFACTS / "dashboard-run.png").stat().st_size > 10_000


def test_a_damaged_event_is_an_error_every_time_and_a_replaced_run_is_read_afresh(finished_run, tmp_path):
    import sqlite3

    _, run_dir, _ = finished_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / "r", ignore=shutil.ignore_patterns(".lock", "workers"))
    with sqlite3.connect(runs / "r" / "ledger.sqlite") as con:  # a list where a generation's summary should be
        con.execute("UPDATE events SET payload = '[1, 2]' WHERE seq = (SELECT max(seq) FROM events "
                    "WHERE type = 'generation_finished')")
    con.close()
    dash = Dashboard(RunSource(runs))
    try:
        for _ in range(2):  # never a partial page afterwards, as if the run had stopped there
            with pytest.raises(LedgerError, match="damaged at event"):
                dash.page("r")
        shutil.rmtree(runs / "r")  # another run under the same id
        shutil.copytree(run_dir, runs / "r", ignore=shutil.ignore_patterns(".lock", "workers"))
        view = dash.page("r").view()
        assert view["status"] == "finished" and view["n_generations"] == project(read_events(run_dir)).generations
    finally:
        dash.close()


def test_pids_no_process_can_have_are_not_running():
    from ratchet.processes import process_running

    assert not any(process_running(p) for p in (2**80, -1, 0, "123", None, True))
    assert process_running(os.getpid())


def test_gifs_are_never_read_through_a_link(served, tmp_path):
    server, runs = served
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "failure-after-1.gif").write_bytes(b"GIF89aSECRET")
    shutil.rmtree(runs / "done" / "videos", ignore_errors=True)
    (runs / "done" / "videos").symlink_to(secret)
    status, body = _get(server.url + "api/runs/done/gif/after/1")
    assert status == 404 and b"SECRET" not in body
    assert all(m["gif"] is None for m in _json(server.url + "api/runs/done")["failure_modes"]["after"])
    for bad in ("%C2%B2", "1" * 5000):
        assert _get(server.url + f"api/runs/done?gen_from={bad}")[0] == 400
        assert _get(server.url + f"api/runs/done/gif/after/{bad}")[0] == 400
