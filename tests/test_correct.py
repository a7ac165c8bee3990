"""A person takes over in the browser: keys in a real headless Chromium -> takeover -> recorded segment."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request

import pytest

from ratchet.correct import CorrectionSession, key_map_for, serve
from ratchet.policies.mlp import init_weights
from ratchet.task import GymTask


def _session(steps: int = 60) -> CorrectionSession:
    task = GymTask("CartPole-v1", max_episode_steps=steps)
    env = task.make_env()
    try:  # hidden (8,), seed 2: a random network that happens to balance (no takeover needed)
        student = init_weights(env.observation_space, env.action_space, hidden=(8,), seed=2)
    finally:
        env.close()
    return CorrectionSession(task, student, [5])


def test_key_maps():
    from gymnasium import spaces

    assert key_map_for("LunarLander-v3", spaces.Discrete(4)) == ({"ArrowUp": 2, "ArrowLeft": 1, "ArrowRight": 3}, 0)
    keys, idle = key_map_for("CartPole-v1", spaces.Discrete(2))
    assert keys["ArrowLeft"] == 0 and idle is None  # no no-op: the episode waits for a key


def test_takeover_over_http_is_recorded():
    session = _session(20)
    server, url = serve(session)
    try:
        def step(**msg):
            req = urllib.request.Request(url + "step", data=json.dumps(msg).encode(), method="POST")
            return json.loads(urllib.request.urlopen(req, timeout=30).read())

        assert b"<img" in urllib.request.urlopen(url, timeout=30).read()
        assert step(held=[])["control"] == "student"
        for _ in range(3):
            assert step(held=["ArrowRight"], pressed=["ArrowRight"])["control"] == "person"
        assert step(held=[], handback=True)["control"] == "student"
        while not step(held=[])["done"]:
            pass
    finally:
        server.shutdown()
        session.close()
    rec = session.records[0]
    assert rec["segments"] == [[0, 1, "student"], [1, 4, "person"], [4, rec["length"], "student"]]
    assert rec["person_steps"] == 3
    data = session.dataset()
    assert len(data) == 3 and data.expert.all() and (data.label == 1).all() and data.step.tolist() == [1, 2, 3]


def test_keys_in_a_headless_browser_take_over():
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for downloads
    session = _session(400)
    server, url = serve(session, interval_ms=100)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(driver), options=options)

    def wait_for(text: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while text not in browser.find_element(By.ID, "s").text:
            assert time.monotonic() < end, f"page never showed {text!r}: {browser.find_element(By.ID, 's').text!r}"
            time.sleep(0.05)

    try:
        browser.get(url)
        wait_for("student in control")
        ActionChains(browser).key_down(Keys.ARROW_LEFT).perform()
        wait_for("person in control")
        time.sleep(0.5)
        ActionChains(browser).key_up(Keys.ARROW_LEFT).send_keys(Keys.ENTER).perform()
        wait_for("student in control")
    finally:
        browser.quit()
        server.shutdown()
    with session.lock:
        who = list(session.who) if session.records == [] else [w for s, e, w in session.records[0]["segments"]
                                                              for _ in range(e - s)]
    session.close()
    assert "person" in who and who[0] == "student"
    data = session.dataset()
    assert len(data) == who.count("person") and data.expert.all() and set(data.label.tolist()) <= {0}


def test_cartpole_waits_for_a_key_while_the_person_is_in_control():
    """No no-op in CartPole: holding no key while in control steps nothing and records nothing."""
    session = _session(20)
    try:
        assert session.idle_action is None
        session.step([], handback=True)
        session.step(["ArrowRight"])
        for _ in range(5):
            state = session.step([])
            assert state["waiting"] and state["control"] == "person" and state["t"] == 2
        assert len(session.steps) == 1 and session.steps[0]["label"] == 1
        assert session.step([], pressed=["ArrowLeft"])["t"] == 3  # a tap steps once
        assert session.step([], handback=True)["control"] == "student"
    finally:
        session.close()
    assert [s["label"] for s in session.steps] == [1, 0]


def _raw(url: str, body: bytes | None = None, headers: dict | None = None, path: str = "step"):
    """(status, body) of a request to the served page; errors too."""
    import urllib.error

    req = urllib.request.Request(url + path, data=body, method="POST" if body is not None else "GET",
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_step_endpoint_refuses_bad_bodies_with_one_line_and_prints_nothing(capfd):
    session = _session(20)
    server, url = serve(session)
    try:
        bad = [b"[1,2]", b'"hi"', b"null", b"{", b"[" * 3000 + b"]" * 3000, b'{"held": 5}', b'{"handback": "false"}',
               b'{"held": [[1]]}', b'{"pressed": ["' + b"x" * 33 + b'"]}',
               b'{"held": ' + json.dumps(["a"] * 17).encode() + b"}", b'{"handback": 1}', b'{"other": 1}', b"",
               b"\xff\xfe"]
        for body in bad:
            code, text = _raw(url, body)
            assert code == 400, (body[:40], code, text)
            assert text.count(b"\n") == 1 and b"<" not in text, text
        code, text = _raw(url, b'{"held": []}' + b" " * 5000)
        assert code == 400 and b"body too large" in text
        assert session.t == 0 and not session.steps  # nothing stepped
        code, text = _raw(url, json.dumps({"held": [], "handback": False}).encode())
        assert code == 200 and json.loads(text)["t"] == 1
        import socket  # an abandoned connection: a promised body that never comes
        port = int(url.split(":")[2].split("/")[0])
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST " + url.split(str(port))[1].encode() + b"step HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                      b"Content-Length: 100\r\n\r\n{" % port)
        time.sleep(0.3)
    finally:
        server.shutdown()
        session.close()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err + captured.out and not captured.err.strip(), captured.err[-2000:]


def test_page_needs_its_token_its_host_and_its_origin():
    session = _session(20)
    server, url = serve(session)
    try:
        base = url.rsplit("/", 2)[0] + "/"
        token = url.rsplit("/", 2)[1]
        assert len(token) >= 20 and url.startswith("http://127.0.0.1:")
        assert _raw(url, path="")[0] == 200
        assert _raw(base, path="")[0] == 403  # no token
        assert _raw(base, b'{"held": []}', path="step")[0] == 403
        assert _raw(base + "x" * len(token) + "/", b'{"held": []}')[0] == 403
        port = url.split(":")[2].split("/")[0]
        assert _raw(url, b'{"held": []}', {"Host": f"evil.example:{port}"})[0] == 403  # DNS rebinding
        assert _raw(url, b'{"held": []}', {"Origin": "http://evil.example"})[0] == 403
        assert _raw(url, b'{"held": []}', {"Origin": f"http://127.0.0.1:{port}"})[0] == 200
        assert _raw(url.replace("127.0.0.1", "localhost"), b'{"held": []}',
                    {"Origin": f"http://localhost:{port}"})[0] == 200
        assert session.t == 2
    finally:
        server.shutdown()
        session.close()
