"""What the sandboxed policy process and the trusted env host say to each other.

The env host owns the environment, counts env steps and sums rewards; the policy process only maps
observations to actions. Messages from the env host are trusted (pickles: they carry observations of
any Gymnasium space, bit for bit). Messages from the policy process are **never unpickled**: each is a
one-byte tag and a small binary or JSON body, decoded by :func:`decode_reply` with strict checks, so
policy code can send the env host nothing but an action, an error text, or garbage that is recorded
as its failure.

Env host → policy (pickled tuples):
    ``("episode", source_key, source_or_None, params, seed, raw, (observation_space, action_space))``
    — load the policy, bind the spaces (:func:`ratchet.policy.bind_spaces`), seed, call ``reset``;
    ``("obs", observation)`` — return an action; ``("call", name, args)`` — return ``name(*args, params)``
    (evaluator tasks; the episode message then also names the functions the policy must define);
    ``("end",)`` — the episode is over;
    ``("retire",)`` — the next episode is another candidate's (the candidate's process exits).
Policy → env host (tagged bytes):
    ``R`` ready · ``K`` episode started · ``E`` + JSON ``{"kind", "text"}`` the policy failed ·
    ``i`` int64 · ``f`` float64 · ``b`` bool · ``a`` numeric array · ``o`` + JSON ``{"type", "repr"}``
    any other object · ``S`` + JSON ``{"strays": n}`` episode cleanup done. A ``call``'s answer may also
    be ``t`` (tuple) or ``l`` (list) + count + length-prefixed items, or ``m`` (dict) + count + (length-prefixed
    UTF-8 key, length-prefixed item) pairs, nested at most 8 deep (:func:`encode_value`).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from ratchet.rollout import Opaque, PolicyFailure, RolloutAborted

__all__ = ["ONE_AT_A_TIME", "BadReply", "Opaque", "PolicyFailure", "SlotFailure", "decode_actions", "decode_reply",
           "decode_round", "encode_action", "encode_actions", "encode_error", "encode_round", "encode_value"]

_I64 = struct.Struct("!q")
_F64 = struct.Struct("!d")
_ARRAY_KINDS = {"b", "i", "u", "f"}
_MAX_DIMS = 8
_MAX_TEXT = 2000
_MAX_DEPTH = 8
_MAX_ITEMS = 100_000
_U32 = struct.Struct("<I")
_MAX_WIDTH = 4096  # most episodes a policy process serves at once


class BadReply(Exception):
    """The policy process sent bytes that are not a valid reply."""


def encode_error(kind: str, text: str, start: bool = False) -> bytes:
    """Policy side: the ``E`` reply (``start``: the policy failed starting its episode, in a lockstep round)."""
    return b"E" + json.dumps({"kind": kind[:200], "text": text[:_MAX_TEXT], **({"start": True} if start else {})}).encode()


def encode_action(action: Any) -> bytes:
    """Policy side: an action as tagged bytes (exact: the env host rebuilds the same numbers)."""
    if type(action) is int and -2**63 <= action < 2**63:  # fast path
        return b"i" + _I64.pack(action)
    if isinstance(action, (bool, np.bool_)):
        return b"b" + (b"\x01" if action else b"\x00")
    if isinstance(action, (int, np.integer)):
        if -2**63 <= int(action) < 2**63:
            return b"i" + _I64.pack(int(action))
    elif isinstance(action, (float, np.floating)):
        return b"f" + _F64.pack(float(action))
    else:
        try:
            arr = np.asarray(action)
        except Exception:  # noqa: BLE001 - the action is policy output: its __array__ may raise anything
            arr = None
        if arr is not None and arr.dtype.kind in _ARRAY_KINDS and arr.ndim <= _MAX_DIMS:
            if arr.dtype.kind == "b":
                arr = arr.astype(np.uint8)
                kind = b"b"
            else:
                kind = arr.dtype.kind.encode()
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            head = kind + bytes([arr.dtype.itemsize, arr.ndim]) + struct.pack(f"<{arr.ndim}I", *arr.shape)
            return b"a" + head + arr.tobytes()
    try:
        text = repr(action)[:60]
    except Exception:  # noqa: BLE001 - the action is policy output: its __repr__ may raise anything
        text = "<unprintable>"
    return b"o" + json.dumps({"type": type(action).__name__[:100], "repr": text}).encode()


def encode_value(value: Any, depth: int = 0) -> bytes:
    """Policy side: the answer to a ``call``: as :func:`encode_action`, plus text (UTF-8; a ``source`` program's
    answer is its stdout) and tuples, lists and dicts with text keys of such values (nested at most 8 deep; deeper,
    or anything else, is an ``o`` reply)."""
    if type(value) is str:
        try:
            return b"s" + value.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: not text another process can read back
            pass
    if isinstance(value, (tuple, list)) and depth < _MAX_DEPTH and len(value) <= _MAX_ITEMS:
        parts = [encode_value(v, depth + 1) for v in value]
        return (b"t" if isinstance(value, tuple) else b"l") + _U32.pack(len(parts)) + b"".join(
            _U32.pack(len(p)) + p for p in parts)
    if isinstance(value, dict) and depth < _MAX_DEPTH and len(value) <= _MAX_ITEMS \
            and all(isinstance(k, str) for k in value):
        out = [b"m", _U32.pack(len(value))]
        for k, v in value.items():
            kb, vb = k.encode("utf-8", "replace")[:200], encode_value(v, depth + 1)
            out += [_U32.pack(len(kb)), kb, _U32.pack(len(vb)), vb]
        return b"".join(out)
    return encode_action(value)


def _take(body: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 4 > len(body):
        raise BadReply("an undecodable value")
    (n,) = _U32.unpack_from(body, pos)
    end = pos + 4 + n
    if end > len(body):
        raise BadReply("an undecodable value")
    return body[pos + 4:end], end


def _decode_value(msg: bytes, depth: int) -> Any:
    tag, body = msg[:1], msg[1:]
    if tag in (b"t", b"l", b"m"):
        if depth >= _MAX_DEPTH or len(body) < 4:
            raise BadReply("an undecodable value")
        (count,) = _U32.unpack_from(body)
        if count > _MAX_ITEMS:
            raise BadReply("an undecodable value")
        pos, items = 4, []
        keys: list[str] = []
        for _ in range(count):
            if tag == b"m":
                kb, pos = _take(body, pos)
                try:
                    keys.append(kb.decode("utf-8"))
                except UnicodeDecodeError:
                    raise BadReply("an undecodable value") from None
            item, pos = _take(body, pos)
            items.append(_decode_value(item, depth + 1))
        if pos != len(body):
            raise BadReply("an undecodable value")
        if tag == b"m":
            return dict(zip(keys, items))
        return tuple(items) if tag == b"t" else items
    if tag == b"s":
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadReply("undecodable text") from None
    return decode_reply(msg, "action")


def _json(body: bytes) -> dict[str, Any]:
    try:
        d = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadReply("a reply that is not JSON") from None
    if not isinstance(d, dict):
        raise BadReply("a malformed reply")
    return d


def _text(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise BadReply("a malformed reply")
    return v[:_MAX_TEXT]


def decode_reply(msg: bytes, expect: str) -> Any:
    """Env host side: decode one reply of the policy process, checking it is the kind expected.

    Args:
        msg: The message bytes.
        expect: ``"ready"``, ``"started"``, ``"action"``, ``"value"`` (a ``call``'s answer), ``"width"`` (a
            batch's start: the most episodes the policy serves at once), ``"end"`` or ``"retired"``.

    Returns:
        For ``"action"``: an int, float, bool, ``numpy.ndarray`` or :class:`Opaque`; for ``"value"`` also
        text and tuples, lists and dicts of those. For ``"end"``: the
        number of stray processes the policy process killed. Otherwise None.

    Raises:
        PolicyFailure: the policy reported its own failure (``E``).
        BadReply: anything else that is not the expected reply.
    """
    if expect == "action" and len(msg) == 9 and msg[0] == 0x69:  # fast path: b"i" + int64
        return _I64.unpack_from(msg, 1)[0]
    if not msg:
        raise BadReply("an empty reply")
    tag, body = msg[:1], msg[1:]
    if tag == b"E" and expect in ("started", "action", "value", "width"):
        d = _json(body)
        raise PolicyFailure(_text(d, "kind"), _text(d, "text"), d.get("start") is True)
    if expect == "ready" and msg == b"R":
        return None
    if (expect, msg) in (("started", b"K"), ("retired", b"X")):
        return None
    if expect == "width" and tag == b"W" and len(body) == 4:
        return max(1, min(_U32.unpack(body)[0], _MAX_WIDTH))
    if expect == "end" and tag == b"S":
        n = _json(body).get("strays")
        if type(n) is not int or not 0 <= n < 2**31:
            raise BadReply("a malformed reply")
        return n
    if expect == "value":
        return _decode_value(msg, 0)
    if expect != "action":
        raise BadReply(f"an unexpected reply (waiting for {expect})")
    if tag == b"i" and len(body) == 8:
        return _I64.unpack(body)[0]
    if tag == b"f" and len(body) == 8:
        return _F64.unpack(body)[0]
    if tag == b"b" and body in (b"\x00", b"\x01"):
        return body == b"\x01"
    if tag == b"a" and len(body) >= 3:
        return _decode_array(body)
    if tag == b"o":
        d = _json(body)
        return Opaque(_text(d, "type")[:100], _text(d, "repr")[:60])
    raise BadReply("an undecodable action")


def _decode_array(body: bytes) -> np.ndarray:
    kind, itemsize, ndim = chr(body[0]), body[1], body[2]
    if kind not in _ARRAY_KINDS or ndim > _MAX_DIMS or itemsize not in (1, 2, 4, 8):
        raise BadReply("an undecodable action")
    if kind == "f" and itemsize == 1:
        raise BadReply("an undecodable action")
    head = 3 + 4 * ndim
    if len(body) < head:
        raise BadReply("an undecodable action")
    shape = struct.unpack_from(f"<{ndim}I", body, 3)
    size = math.prod(shape)
    data = body[head:]
    if len(data) != size * itemsize:
        raise BadReply("an action whose size does not match its shape")
    dtype = np.dtype(f"<{'u' if kind == 'b' else kind}{itemsize}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    if kind == "b":
        return arr.astype(bool)
    return arr.astype(dtype.newbyteorder("="))


# -- lockstep batches ---------------------------------------------------------------------------------------
#
# Env host → policy, after a pickled ``("batch", source_key, source_or_None, params, raw, spaces, functions)``
# (answered ``W`` + u32 width, or ``E``): one round is ``B`` + u32 n_new + n_new × (u32 slot, i64 seed) + u32 n_done +
# n_done × u32 slot + u32 n + n × u32 slot + the n observations (``r`` + their raw bytes back to back when ``raw`` was
# announced, else ``p`` + a pickled list). New slots start an episode (fresh policy state, seeded, ``reset``) before
# the round's actions; done slots' episodes have ended (the policy drops their state).
# Policy → env host: ``A`` + an ``a`` array of n rows (one action each), or ``l`` + n length-prefixed items, each
# an action as :func:`encode_action` writes it or an ``E`` (that episode's failure); or ``E`` for all n; or ``U``
# (:data:`ONE_AT_A_TIME`): run the batch's unfinished episodes again one at a time.

_ROUND_HEAD = struct.Struct("<I")
_NEW_SLOT = struct.Struct("<Iq")


def encode_round(new: list[tuple[int, int]], done: list[int], slots: list[int], observations: list[Any],
                 raw: bool) -> bytes:
    """Env host side: one round's message (see above); ``raw``: every observation is an ``ndarray`` of the dtype
    and shape the batch announced."""
    import pickle

    parts = [b"B", _ROUND_HEAD.pack(len(new))]
    parts += [_NEW_SLOT.pack(s, seed) for s, seed in new]
    parts += [_ROUND_HEAD.pack(len(done)), np.asarray(done, dtype="<u4").tobytes()]
    parts.append(_ROUND_HEAD.pack(len(slots)))
    parts.append(np.asarray(slots, dtype="<u4").tobytes())
    if raw:
        parts.append(b"r")
        parts += [o.tobytes() for o in observations]
    else:
        parts.append(b"p" + pickle.dumps(list(observations), protocol=pickle.HIGHEST_PROTOCOL))
    return b"".join(parts)


def decode_round(data: bytes, raw: tuple[np.dtype, tuple[int, ...]] | None
                 ) -> tuple[list[tuple[int, int]], list[int], list[int], Any]:
    """Policy side: ``(new slots as (slot, seed), done slots, slots, observations)`` of a round message (from the
    trusted env host, so unpickling is safe); observations are an ``(n, *shape)`` array when raw, else a list."""
    import pickle

    (n_new,) = _ROUND_HEAD.unpack_from(data, 1)
    pos = 5
    new = [_NEW_SLOT.unpack_from(data, pos + 12 * i) for i in range(n_new)]
    pos += 12 * n_new
    (n_done,) = _ROUND_HEAD.unpack_from(data, pos)
    done = np.frombuffer(data, dtype="<u4", count=n_done, offset=pos + 4).tolist()
    pos += 4 + 4 * n_done
    (n,) = _ROUND_HEAD.unpack_from(data, pos)
    pos += 4
    slots = np.frombuffer(data, dtype="<u4", count=n, offset=pos).tolist()
    pos += 4 * n
    if data[pos:pos + 1] == b"r":
        assert raw is not None  # the env host sends raw observations only when it announced their dtype and shape
        obs: Any = np.frombuffer(data, raw[0], offset=pos + 1).reshape((n, *raw[1])).copy()
    else:
        obs = pickle.loads(data[pos + 1:])
    return [(int(s), int(seed)) for s, seed in new], done, slots, obs


#: Policy → env host, a round's answer: the batch's unfinished episodes must run again one at a time (policy code
#: changed the process-wide random generators while two or more of them were running, so its actions would not be
#: those of the episodes alone; :class:`ratchet.execution.worker._Batch`).
ONE_AT_A_TIME = b"U"


class SlotFailure:
    """Policy side: one episode's failure within a round (``encode_actions`` writes it as ``E``); ``start``: it
    failed starting (loading or ``reset``)."""

    def __init__(self, kind: str, text: str, start: bool = False) -> None:
        self.kind, self.text, self.start = kind, text, start


def encode_actions(actions: Any, n: int) -> bytes:
    """Policy side: the answer to a round of ``n`` observations: ``actions`` is a sequence of ``n`` actions (each
    maybe a :class:`SlotFailure`) or an array of ``n`` rows (``act_batch``'s answer). Actions that are all ints, or
    all arrays of one dtype and shape, travel as one array; anything else item by item. A sequence of the wrong
    length is the round's failure."""
    if isinstance(actions, np.ndarray) and actions.ndim >= 1 and actions.dtype.kind in _ARRAY_KINDS:
        return b"A" + encode_action(actions) if actions.shape[0] == n else _wrong_count(actions.shape[0], n)
    try:
        items = list(actions)
    except Exception:  # noqa: BLE001 - act_batch's answer is policy output: iterating it may raise anything
        return encode_error("policy act_batch() returned no sequence", f"got {type(actions).__name__}")
    if len(items) != n:
        return _wrong_count(len(items), n)
    if items and all(type(a) is int for a in items) and all(-2**63 <= a < 2**63 for a in items):
        return b"A" + encode_action(np.array(items, dtype=np.int64))
    first = items[0] if items else None
    if isinstance(first, np.ndarray) and first.dtype.kind in "iuf" and all(
            type(a) is np.ndarray and a.dtype == first.dtype and a.shape == first.shape for a in items):
        return b"A" + encode_action(np.stack(items))
    out = [b"Al", _U32.pack(n)]
    for a in items:
        p = encode_error(a.kind, a.text, a.start) if isinstance(a, SlotFailure) else encode_action(a)
        out += [_U32.pack(len(p)), p]
    return b"".join(out)


def _wrong_count(got: int, n: int) -> bytes:
    return encode_error("policy act_batch() returned the wrong number of actions", f"{got} for {n} observations")


def decode_actions(msg: bytes, n: int) -> list[Any]:
    """Env host side: the ``n`` answers of a round, each an action (as :func:`decode_reply` gives it), an
    :class:`Opaque`, or a :class:`PolicyFailure` (that episode's own failure).

    Raises:
        PolicyFailure: the policy failed for the whole round (``E``).
        RolloutAborted: ``"solo"``: the policy process answered :data:`ONE_AT_A_TIME`.
        BadReply: anything else that is not such an answer.
    """
    if msg == ONE_AT_A_TIME:
        raise RolloutAborted("solo", "policy code changed the global random generators with episodes side by side")
    if msg[:1] == b"E":
        decode_reply(msg, "action")  # raises PolicyFailure (or BadReply for a malformed one)
    if msg[:1] != b"A" or len(msg) < 2:
        raise BadReply("an unexpected reply (waiting for actions)")
    if msg[1:2] == b"a":
        arr = decode_reply(msg[1:], "action")
        if not isinstance(arr, np.ndarray) or arr.ndim < 1 or arr.shape[0] != n:
            raise BadReply("a batch of actions whose size does not match the round")
        # one number per episode as Python numbers, as each would arrive alone (``i``/``f``/``b``)
        return arr.tolist() if arr.ndim == 1 else list(arr)
    if msg[1:2] != b"l" or len(msg) < 6:
        raise BadReply("an undecodable batch of actions")
    (count,) = _U32.unpack_from(msg, 2)
    if count != n:
        raise BadReply("a batch of actions whose size does not match the round")
    body, pos, out = msg[2:], 4, []
    for _ in range(count):
        item, pos = _take(body, pos)
        try:
            out.append(decode_reply(item, "action"))
        except PolicyFailure as exc:
            out.append(exc)
    if pos != len(body):
        raise BadReply("an undecodable batch of actions")
    return out
