"""Validating what a worker reports about an episode before the driver records it.

A worker runs policy code, and policy code can reach its worker's socket and write a well-formed
JSON reply with wrong values: a return of ``10**4000`` (no float holds it), an ``error`` that is not
text, a negative ``length`` (the env-step budget would never run out), megabytes of diagnostics.
:func:`parse_episode_reply` accepts only a reply that fits the episode schema exactly and turns it
into an :class:`~ratchet.rollout.Episode`; anything else raises :class:`BadReply`, which the executor
records as that candidate's failure.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ratchet.rollout import Episode
from ratchet.text import clean

__all__ = ["DIAGNOSTICS_KEYS", "EPISODE_KEYS", "BadReply", "decode_reply", "key_mismatch", "parse_episode_reply"]

#: The keys of an episode record (:meth:`Episode.to_dict`), all required, no others allowed.
EPISODE_KEYS = frozenset({"seed", "episode_return", "length", "terminated", "truncated", "success", "error",
                          "diagnostics"})
#: The diagnostics keys :func:`~ratchet.rollout.run_episode` and ``Episode.failed`` write (all optional), and
#: those of an evaluator task (:mod:`ratchet.tasks.evaluator`): its ``failure`` label and ``text``, named
#: ``scores``, the policy ``calls`` made, and ``fault`` (``"task"``: the task's own code failed, not the policy);
#: and those of a game (:mod:`ratchet.tasks.game`): the ``opponent``, the candidate's ``seat``, the ``outcome``, the
#: ``illegal_moves`` replaced and, when the opponent forfeited the game, why (``forfeit``).
DIAGNOSTICS_KEYS = frozenset({"final_observation", "final_reward", "cause", "failure", "text", "scores", "calls",
                              "fault", "opponent", "seat", "outcome", "illegal_moves", "forfeit"})

MAX_ERROR_CHARS = 500
MAX_OBSERVATION_ENTRIES = 64
MAX_DIAGNOSTICS_BYTES = 16 * 2**10
#: Upper bound on ``length`` when the task has no time limit (env steps).
NO_LIMIT_STEPS = 10**9
_MAX_INT_AS_FLOAT = 1e300


class BadReply(Exception):
    """A worker's reply is not a well-formed episode record for the job it was running; ``str(exc)``
    says what was wrong (e.g. ``"a reply with length -1000 (expected 0..500)"``)."""


def decode_reply(body: bytes) -> Any:
    """The JSON value of a reply's body (never a pickle: unpickling runs code).

    Raises:
        BadReply: ``body`` is not UTF-8 JSON, or nests so deeply that decoding it would exhaust the
            driver's stack (``json.loads`` raises RecursionError on ``"[" * 100_000``).
    """
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReply(f"a reply that is not JSON ({clean(str(exc), 80)})") from None
    except RecursionError:
        raise BadReply("a reply that is not JSON (nested too deeply)") from None


def key_mismatch(given: Any, known: Any, required: Any) -> str | None:
    """How the keys of an untrusted object differ from a schema's: ``"missing ['a']; unknown ['zz']"`` (unknown
    names made safe to print), or None when every ``required`` key is there and none is outside ``known``."""
    keys = set(given)
    missing, extra = sorted(set(required) - keys), sorted(map(str, keys - set(known)))
    if not missing and not extra:
        return None
    return "; ".join(part for part in (f"missing {missing}" if missing else "",
                                       f"unknown {clean(extra, 80)}" if extra else "") if part)


def _number(value: Any, name: str, finite: bool = True) -> float:
    """``value`` as a float: a float (finite unless ``finite`` is False) or an int of magnitude
    below 1e300; bools, huge ints, strings and everything else raise :class:`BadReply`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReply(f"a reply with {name} of type {type(value).__name__} (expected a number)")
    if isinstance(value, int):
        if not -_MAX_INT_AS_FLOAT < value < _MAX_INT_AS_FLOAT:
            raise BadReply(f"a reply with {name} out of range (an integer of {len(str(abs(value)))} digits)")
        return float(value)
    if finite and not math.isfinite(value):
        raise BadReply(f"a reply with a non-finite {name} ({value})")
    return float(value)


def _flag(value: Any, name: str, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise BadReply(f"a reply with {name} of type {type(value).__name__} (expected a bool"
                       f"{' or null' if allow_none else ''})")
    return value


def _diagnostics(value: Any, error: str | None, terminated: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReply(f"a reply with diagnostics of type {type(value).__name__} (expected an object)")
    extra = set(value) - DIAGNOSTICS_KEYS
    if extra:
        raise BadReply(f"a reply with unknown diagnostics {clean(sorted(map(str, extra)), 80)}")
    try:
        size = len(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        raise BadReply("a reply with diagnostics that are not JSON") from None
    if size > MAX_DIAGNOSTICS_BYTES:
        raise BadReply(f"a reply with {size} bytes of diagnostics (at most {MAX_DIAGNOSTICS_BYTES})")
    out: dict[str, Any] = {}
    if "cause" in value:
        cause = value["cause"]
        expected = "error" if error is not None else "terminated" if terminated else "truncated"
        if cause != expected:
            raise BadReply(f"a reply with diagnostics cause {clean(repr(cause), 40)} (expected {expected!r})")
        out["cause"] = cause
    if "final_observation" in value:
        obs = value["final_observation"]
        if obs is not None:
            if not isinstance(obs, list) or len(obs) > MAX_OBSERVATION_ENTRIES:
                raise BadReply(f"a reply whose final_observation is not a list of at most "
                               f"{MAX_OBSERVATION_ENTRIES} numbers")
            obs = [_number(x, "final_observation entry") for x in obs]
        out["final_observation"] = obs
    if "final_reward" in value:
        out["final_reward"] = _number(value["final_reward"], "final_reward")
    for key, limit in (("failure", 80), ("text", MAX_ERROR_CHARS), ("forfeit", 300)):
        if key in value:
            if not isinstance(value[key], str) or len(value[key]) > limit:
                raise BadReply(f"a reply whose {key} is not text of at most {limit} characters")
            out[key] = clean(value[key], limit)
    if "scores" in value:
        scores = value["scores"]
        if not isinstance(scores, dict) or len(scores) > 32 or not all(isinstance(k, str) and len(k) <= 40 for k in scores):
            raise BadReply("a reply whose scores are not at most 32 named numbers")
        out["scores"] = {clean(k, 40): _number(v, "score") for k, v in scores.items()}
    if "calls" in value:
        calls = value["calls"]
        if isinstance(calls, bool) or not isinstance(calls, int) or not 0 <= calls < 2**53:
            raise BadReply("a reply whose calls is not a count")
        out["calls"] = calls
    if "opponent" in value:
        if not isinstance(value["opponent"], str) or len(value["opponent"]) > 40:
            raise BadReply("a reply whose opponent is not a name of at most 40 characters")
        out["opponent"] = clean(value["opponent"], 40)
    if "outcome" in value:
        if value["outcome"] not in ("win", "draw", "loss"):
            raise BadReply("a reply whose outcome is not win, draw or loss")
        out["outcome"] = value["outcome"]
    for key, top in (("seat", 64), ("illegal_moves", 2**31)):
        if key in value:
            v = value[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < top:
                raise BadReply(f"a reply whose {key} is not a count below {top}")
            out[key] = v
    if "fault" in value:
        if value["fault"] != "task" or error is None:
            raise BadReply("a reply with a malformed fault")
        out["fault"] = "task"
    return out


def parse_episode_reply(msg: Any, job_id: int, seed: int, step_limit: int | None) -> Episode:
    """The episode in a worker's ``[job_id, episode_dict]`` reply, checked against the job it ran.

    The schema is strict: exactly the keys of :meth:`Episode.to_dict`; ``seed`` the job's seed;
    ``episode_return`` a finite number (an int only below 1e300 in magnitude; a non-finite float only
    in an errored episode, as :func:`~ratchet.rollout.run_episode` reports a non-finite return);
    ``length`` an int in ``[0, step_limit]`` (env steps); ``terminated``/``truncated`` bools, both
    False when ``error`` is set, at least one True when it is not; ``success`` a bool or null (never
    True with an error); ``error`` null or text of at most 500 characters; ``diagnostics`` only the
    known keys (:data:`DIAGNOSTICS_KEYS`), at most 64 finite observation entries, at most 16 KiB of
    JSON. Text is passed through :func:`ratchet.text.clean` (no escape sequences, no lone surrogates).

    Args:
        msg: The decoded JSON reply.
        job_id: The id of the job the worker was running.
        seed: That job's episode seed.
        step_limit: The task's time limit in env steps (:attr:`GymTask.step_limit`), or None for
            none (then ``length`` is bounded by 10**9).

    Returns:
        The validated :class:`~ratchet.rollout.Episode`.

    Raises:
        BadReply: the reply breaks the schema; the message says how.
    """
    if not isinstance(msg, list) or len(msg) != 2:
        raise BadReply("a malformed reply (expected [job_id, episode])")
    rid, ep = msg
    if isinstance(rid, bool) or not isinstance(rid, int) or rid != job_id:
        raise BadReply("a reply that does not match its job")
    if not isinstance(ep, dict):
        raise BadReply(f"a malformed reply (the episode is a {type(ep).__name__}, expected an object)")
    what = key_mismatch(ep, EPISODE_KEYS, EPISODE_KEYS)
    if what is not None:
        raise BadReply(f"a reply with the wrong keys ({what})")
    ep_seed = ep["seed"]
    if isinstance(ep_seed, bool) or not isinstance(ep_seed, int) or ep_seed != seed:
        raise BadReply(f"a reply for seed {clean(repr(ep_seed), 40)} (expected {seed})")
    error = ep["error"]
    if error is not None:
        if not isinstance(error, str):
            raise BadReply(f"a reply with error of type {type(error).__name__} (expected text or null)")
        if len(error) > MAX_ERROR_CHARS:
            raise BadReply(f"a reply with an error of {len(error)} characters (at most {MAX_ERROR_CHARS})")
        error = clean(error, MAX_ERROR_CHARS)
    episode_return = _number(ep["episode_return"], "episode_return", finite=error is None)
    limit = NO_LIMIT_STEPS if step_limit is None else int(step_limit)
    length = ep["length"]
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= limit:
        shown = clean(repr(length), 40) if not isinstance(length, int) or abs(length) < 10**40 else "out of range"
        raise BadReply(f"a reply with length {shown} (expected an int in 0..{limit})")
    terminated = _flag(ep["terminated"], "terminated")
    truncated = _flag(ep["truncated"], "truncated")
    success = _flag(ep["success"], "success", allow_none=True)
    if error is not None and (terminated or truncated or success):
        raise BadReply("a reply for an errored episode that also terminated, was truncated or succeeded")
    if error is None and not (terminated or truncated):
        raise BadReply("a reply for an episode that neither errored, terminated nor was truncated")
    diagnostics = _diagnostics(ep["diagnostics"], error, bool(terminated))
    return Episode(seed, episode_return, length, bool(terminated), bool(truncated), success, error, diagnostics)
