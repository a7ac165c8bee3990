"""The prompts and answers of a run's LLM requests, read back from its ledger (``ratchet llm-log``).

Every request an LLM refiner makes is an ``llm_call`` event whose request (the chat messages) and reply
(the endpoint's raw body) are artifacts (see :meth:`ratchet.loop._Run.exchange`). :func:`llm_exchanges`
pairs them up with what became of each answer (a ``proposal_rejected`` event naming the call, or
``proposed``); :func:`format_exchange` prints one as plain text. Replies came from outside ratchet: they
are read as untrusted text (decoded with replacement, parsed defensively, cut to a size), never run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratchet.ledger.events import Event, EventType

__all__ = ["MAX_SHOWN_CHARS", "LLMExchange", "format_exchange", "llm_exchanges"]

#: Most characters of one message or answer kept (the rest is cut, saying how much).
MAX_SHOWN_CHARS = 100_000


@dataclass(frozen=True)
class LLMExchange:
    """One recorded LLM request and its reply.

    Attributes:
        key: The ``llm_call`` event's key (``llm/ARM/DIGEST``).
        refiner: The refiner's arm name.
        model: The model asked.
        time: Unix time (seconds) the call was recorded.
        messages: The request's chat messages, ``[{"role", "content"}, ...]``.
        answer: The reply's text (the chat completion's content, else the start of the raw body), or None
            when the request failed.
        error: Why the request failed (one line), or None.
        attempts: HTTP attempts made (retries included).
        prompt_tokens: Tokens of the prompt, as the endpoint counted them (or estimated).
        completion_tokens: Tokens of the answer.
        cost: Its price (the refiner's ``price_prompt``/``price_completion``, per million tokens).
        seconds: Seconds spent waiting on the endpoint.
        outcome: What became of the answer: ``"proposed"`` (its program was proposed), the reason its
            proposal was rejected, or the request's failure.
        currency: The cost's unit (the refiner's ``currency``), or None where not recorded.
    """

    key: str
    refiner: str
    model: str | None
    time: float
    messages: tuple[dict[str, str], ...]
    answer: str | None
    error: str | None
    attempts: int
    prompt_tokens: int
    completion_tokens: int
    cost: float
    seconds: float
    outcome: str
    currency: str | None = None


def _cut(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit:,} more characters]"


def _number(x: Any, kind: type = float) -> Any:
    return kind(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 1e18 else kind(0)  # NaN < 1e18 is False too


def _messages(data: bytes | None) -> tuple[dict[str, str], ...]:
    if data is None:
        return ()
    try:
        request = json.loads(data.decode("utf-8", errors="replace"))
        messages = request["messages"]
        return tuple({"role": str(m.get("role", "?"))[:40], "content": _cut(str(m.get("content", "")))}
                     for m in messages if isinstance(m, dict))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return ({"role": "?", "content": "(the recorded request is not a chat-completions request)"},)


def _answer(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    try:
        content = json.loads(text)["choices"][0]["message"]["content"]
        if isinstance(content, str):
            return _cut(content)
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        pass
    return "(not a chat completion; the reply's start:) " + _cut(text, 2000)


def llm_exchanges(events: list[Event], artifact: Callable[[str], bytes], last: int | None = None) -> list[LLMExchange]:
    """A run's LLM exchanges, oldest first.

    Args:
        events: The run's events (``ledger.read()``).
        artifact: Bytes of an artifact by digest (``ledger.get_artifact``).
        last: Only the last ``last`` exchanges (None: all).

    Returns:
        One :class:`LLMExchange` per ``llm_call`` event.

    Raises:
        ValueError: ``last`` is below 1.
    """
    if last is not None and last < 1:
        raise ValueError(f"expected last >= 1, got {last}")
    calls = [e for e in events if e.type is EventType.LLM_CALL]
    if last is not None:
        calls = calls[-last:]
    rejected: dict[str, str] = {}
    for e in events:
        if e.type is EventType.PROPOSAL_REJECTED and isinstance(e.payload.get("detail"), dict):
            call = e.payload["detail"].get("llm_call")
            if isinstance(call, str):
                rejected.setdefault(call, "rejected: " + " ".join(str(e.payload.get("reason", "")).split())[:500])

    def read(digest: Any) -> bytes | None:
        if not isinstance(digest, str):
            return None
        try:
            return artifact(digest)
        except Exception:  # noqa: BLE001 - a missing artifact shows as missing, never stops the log
            return None

    out = []
    for e in calls:
        p = e.payload
        body = read(p.get("response"))
        error = None if p.get("error") is None else " ".join(str(p["error"]).split())[:500]
        answer = None if body is None else _answer(body)
        if body is None and error is None and p.get("response") is not None:
            error = "the recorded reply is missing from the artifact store"
        outcome = rejected.get(e.key) or (f"request failed: {error}" if answer is None else "proposed")
        refiner, model = p.get("refiner"), p.get("model")
        out.append(LLMExchange(e.key, refiner if isinstance(refiner, str) else e.key.split("/")[1],
                               model if isinstance(model, str) else None,
                               e.time, _messages(read(p.get("request"))), answer, error,
                               _number(p.get("attempts"), int), _number(p.get("prompt_tokens"), int),
                               _number(p.get("completion_tokens"), int), _number(p.get("cost")),
                               _number(p.get("seconds")), outcome,
                               p["currency"] if isinstance(p.get("currency"), str) else None))
    return out


def format_exchange(x: LLMExchange, index: int | None = None) -> str:
    """One exchange as plain text: a header line (number, refiner, model, time, tokens, cost, seconds,
    attempts), each message under ``--- ROLE``, the answer under ``--- answer``, and its outcome."""
    import time

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(x.time))
    cost = f" · cost {x.cost:.4g}{' ' + x.currency if x.currency else ''}" if x.cost else ""
    head = (f"=== {'' if index is None else f'#{index} · '}{x.refiner} · {x.model or '?'} · {when} UTC · "
            f"{x.prompt_tokens + x.completion_tokens:,} tokens ({x.prompt_tokens:,} prompt + "
            f"{x.completion_tokens:,} answer){cost} · {x.seconds:.1f} s · {x.attempts} attempt"
            f"{'s' if x.attempts != 1 else ''} · {x.key}")
    parts = [head]
    for m in x.messages:
        parts.append(f"--- {m['role']}\n{m['content'].rstrip()}")
    parts.append("--- answer\n" + (x.answer.rstrip() if x.answer is not None else f"(none: {x.error})"))
    parts.append(f"--- outcome: {x.outcome}")
    return "\n".join(parts)
