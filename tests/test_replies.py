"""Worker replies are validated field by field (ratchet.execution.replies)."""

from __future__ import annotations

import json

import pytest

from ratchet.execution.replies import BadReply, parse_episode_reply

GOOD = {"seed": 7, "episode_return": 500.0, "length": 500, "terminated": False, "truncated": True, "success": True,
        "error": None, "diagnostics": {"cause": "truncated", "final_observation": [0.1, -0.2, 0.0, 1.0],
                                       "final_reward": 1.0}}


def reply(**changes):
    ep = dict(GOOD)
    ep.update(changes)
    return [3, ep]


def parse(msg, step_limit=500):
    return parse_episode_reply(json.loads(json.dumps(msg)), 3, 7, step_limit)


def test_a_well_formed_reply_gives_its_episode():
    ep = parse(reply())
    assert (ep.seed, ep.episode_return, ep.length, ep.truncated, ep.success) == (7, 500.0, 500, True, True)
    assert ep.diagnostics == GOOD["diagnostics"]
    assert parse(reply(episode_return=12)).episode_return == 12.0  # an int return is a float
    errored = parse(reply(episode_return=float("nan"), length=3, terminated=False, truncated=False, success=False,
                          error="non-finite return", diagnostics={"cause": "error", "final_observation": None}))
    assert errored.error == "non-finite return"  # run_episode reports a non-finite return this way


@pytest.mark.parametrize("msg, reason", [
    (reply(episode_return=10**4000), "episode_return out of range"),
    (reply(episode_return=float("nan")), "non-finite episode_return"),
    (reply(episode_return=float("inf")), "non-finite episode_return"),
    (reply(episode_return=True), "episode_return of type bool"),
    (reply(episode_return="500"), "episode_return of type str"),
    (reply(error=12345, terminated=False, truncated=False, success=False), "error of type int"),
    (reply(error="x" * 501, terminated=False, truncated=False, success=False), "error of 501 characters"),
    (reply(length=-10**18), "length -1000000000000000000"),
    (reply(length=501), "length 501 (expected an int in 0..500)"),
    (reply(length=10**60), "length out of range"),
    (reply(length=499.0), "length 499.0"),
    (reply(length=True), "length True"),
    (reply(seed=8), "a reply for seed 8 (expected 7)"),
    (reply(seed="7"), "a reply for seed '7'"),
    ([4, GOOD], "does not match its job"),
    ([True, GOOD], "does not match its job"),
    ([3, GOOD, 1], "malformed"),
    ({"3": GOOD}, "malformed"),
    ([3, [1, 2]], "malformed"),
    (reply(promoted=True), "unknown ['promoted']"),
    ([3, {k: v for k, v in GOOD.items() if k != "diagnostics"}], "missing ['diagnostics']"),
    (reply(terminated=1), "terminated of type int"),
    (reply(success="yes"), "success of type str"),
    (reply(terminated=False, truncated=False), "neither errored, terminated nor was truncated"),
    (reply(error="boom", terminated=True, success=False), "errored episode that also terminated"),
    (reply(error="boom", terminated=False, truncated=False, success=True), "errored episode that also"),
    (reply(diagnostics=[]), "diagnostics of type list"),
    (reply(diagnostics={"note": "\x1b[2J"}), "unknown diagnostics ['note']"),
    (reply(diagnostics={"cause": "error"}), "cause 'error' (expected 'truncated')"),
    (reply(diagnostics={"final_observation": [0.5] * 65}), "final_observation is not a list of at most 64"),
    (reply(diagnostics={"final_observation": [float("nan")]}), "non-finite final_observation entry"),
    (reply(diagnostics={"final_observation": "0.5"}), "final_observation is not a list"),
    (reply(diagnostics={"final_reward": float("inf")}), "non-finite final_reward"),
    (reply(diagnostics={"final_reward": None}), "final_reward of type NoneType"),
])
def test_every_field_is_checked(msg, reason):
    with pytest.raises(BadReply) as info:
        parse(msg)
    assert reason in str(info.value), str(info.value)
    assert len(str(info.value)) < 300


def test_diagnostics_are_bounded_in_size():
    huge = reply(diagnostics={"cause": "truncated", "final_observation": None, "final_reward": 1.0})
    huge[1]["diagnostics"]["final_observation"] = [0.5] * 64
    parse(huge)  # 64 entries are fine
    with pytest.raises(BadReply, match="bytes of diagnostics"):
        parse_episode_reply(reply(diagnostics={"final_observation": [0.5] * (15 * 2**20 // 5)}), 3, 7, 500)


def test_length_without_a_time_limit_is_still_bounded():
    assert parse(reply(length=10**6), step_limit=None).length == 10**6
    with pytest.raises(BadReply, match="expected an int in 0..1000000000"):
        parse(reply(length=10**9 + 1), step_limit=None)


def test_error_text_is_cleaned():
    ep = parse(reply(error="policy raised ValueError: \x1b[2K\x1b[1A\ud800 fake", terminated=False, truncated=False,
                     success=False, diagnostics={"cause": "error"}))
    assert ep.error == "policy raised ValueError: \\x1b[2K\\x1b[1A\\ud800 fake"
    ep.error.encode("utf-8")


def test_decode_reply_turns_every_bad_body_into_bad_reply():
    from ratchet.execution.replies import decode_reply

    assert decode_reply(b'[1, {"a": null}]') == [1, {"a": None}]
    for body in (b"\x80\x81", b"{", b"this is not a pickle", b"[" * 200_000 + b"]" * 200_000):
        with pytest.raises(BadReply, match="not JSON"):
            decode_reply(body)
