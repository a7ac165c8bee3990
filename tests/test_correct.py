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
    assert key_map_for("CartPole-v1", spaces.Discrete(2))[0]["ArrowLeft"] == 0


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
