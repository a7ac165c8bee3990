"""ratchet.refiners.standin: the stand-in endpoint's default answers are edits the llm refiner takes, and its
failures are drawn from its seed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import DATA

from ratchet.refiners.llm import EditError, apply_edits, build_prompt, parse_answer
from ratchet.refiners.standin import StandIn, nudge_answer
from ratchet.refiners.structural import check_source

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def request(source: str, seed: int) -> dict:
    return {"model": "stand-in", "seed": seed, "messages": build_prompt({"env_id": "X"}, source, None, [])}


@pytest.mark.parametrize("path", [DATA / "cartpole_linear.py", EXAMPLES / "lunar_lander" / "policy.py",
                                  EXAMPLES / "mountain_car_structure" / "policy.py"])
def test_the_default_answer_moves_one_number_within_its_bounds_and_differs_by_seed(path):
    source = path.read_text(encoding="utf-8")
    before = check_source(source)
    programs = set()
    for seed in range(12):
        edited = apply_edits(source, parse_answer(nudge_answer(request(source, seed))))
        after = check_source(edited)  # passes the refiner's checks
        moved = [p.name for p in after.parameters if after.defaults[p.name] != before.defaults[p.name]]
        assert len(moved) == 1 and edited.count("\n") == source.count("\n")
        p = next(p for p in after.parameters if p.name == moved[0])
        assert p.low <= after.defaults[p.name] <= p.high
        programs.add(edited)
    assert len(programs) == 12  # a distinct edit per request
    assert nudge_answer(request(source, 3)) == nudge_answer(request(source, 3))  # the same request, the same answer
    assert nudge_answer(request(source, 3)) != nudge_answer(request(source, 3), seed=1)  # the server's seed counts


def test_a_program_without_parameters_gets_a_float_constant_moved():
    source = "PARAMETERS = {}\n\n\ndef act(observation, params):\n    return 1 if observation[2] > 0.05 else 0\n"
    edited = apply_edits(source, parse_answer(nudge_answer(request(source, 0))))
    assert edited != source and "observation[2] > 0.0" in edited
    check_source(edited)


def test_a_prompt_without_a_python_program_gets_no_edit():
    body = {"seed": 0, "messages": [{"role": "user", "content": "## Current program (a folder of files)\n..."}]}
    with pytest.raises(EditError):
        parse_answer(nudge_answer(body))
    with pytest.raises(EditError):  # no number to move
        parse_answer(nudge_answer(request("PARAMETERS = {}\n\n\ndef act(o, p):\n    return 0\n", 0)))


def test_fail_rate_answers_that_share_with_500_or_429_drawn_from_the_seed():
    def statuses(seed: int) -> list[int]:
        server = StandIn(fail_rate=0.5, seed=seed, content="ok")
        try:
            out = []
            for _ in range(40):
                req = urllib.request.Request(server.url + "/chat/completions",
                                             json.dumps({"model": "m", "messages": []}).encode())
                try:
                    with urllib.request.urlopen(req, timeout=30) as reply:
                        out.append(reply.status)
                except urllib.error.HTTPError as exc:
                    out.append(exc.code)
            return out
        finally:
            server.stop()

    first = statuses(5)
    assert set(first) == {200, 429, 500} and 8 <= first.count(200) <= 32
    assert statuses(5) == first  # one request after another: the same draws
