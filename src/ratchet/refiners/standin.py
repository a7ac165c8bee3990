"""A stand-in chat-completions endpoint: the ``llm`` refiner tried without a model, a key or the network.

``ratchet standin`` serves :class:`StandIn` on 127.0.0.1: an HTTP server speaking the part of OpenAI's protocol the
``llm`` refiner uses (``POST .../chat/completions``, ``GET .../models``). By default each request's answer is
:func:`nudge_answer`: a SEARCH/REPLACE edit of the program in the prompt that moves one tunable number (a
``PARAMETERS`` default, else a float constant of the code) by a small step drawn from the request's ``seed`` and the
server's ``seed``, so every answer is a distinct program that passes the refiner's checks and runs its episodes.
It is not a model: its edits are random nudges, there to see the refiner's requests, the ledger's ``llm_call``
events, ``ratchet llm-log`` and the gate at work. ``latency`` (seconds per answer) and ``fail_rate`` (a share of
requests answered 500 or 429, drawn from ``seed``) make it behave like a slow or flaky endpoint.

ratchet's own tests and benchmarks use the same class from Python, with knobs of their own: ``script`` (answers in
order, and hostile replies: redirects, slow drips, oversized bodies), ``respond`` (an answer computed from each
request), ``gather`` (requests held until that many are in flight) and ``models`` (the model list served).
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["MODEL", "StandIn", "nudge_answer"]

#: The model name ``ratchet standin`` lists (any name is answered alike).
MODEL = "stand-in"

#: An answer: its text, or a dict of the reply's parts (see :class:`StandIn`).
Answer = str | dict[str, Any]
#: A number an answer may move: (its node, what it is, its value, low, high, whether an int).
_Number = tuple[ast.expr, str, float, float, float, bool]

_CURRENT = re.compile(r"^## Current policy[^\n]*\n(`{3,})python\n(.*?)\n\1$", re.MULTILINE | re.DOTALL)


def _program(body: dict[str, Any]) -> str | None:
    """The program a request edits: the ``## Current policy`` block of its last user message (None: none there)."""
    users = [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    found = _CURRENT.search(users[-1]) if users and isinstance(users[-1], str) else None
    return found.group(2) + "\n" if found else None


def _number(node: ast.expr | None) -> float | None:
    """A literal int or float (possibly negative), not a bool; else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _nudges(tree: ast.Module) -> list[_Number]:
    """The numbers :func:`nudge_answer` may move: ``(node, name, value, low, high, is_int)`` of each scalar
    ``PARAMETERS`` default with numeric bounds (not categorical, not an array)."""
    out: list[_Number] = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PARAMETERS"
                                                      for t in node.targets) and isinstance(node.value, ast.Dict)):
            continue
        for key, spec in zip(node.value.keys, node.value.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(spec, ast.Dict)):
                continue
            fields = {k.value: v for k, v in zip(spec.keys, spec.values, strict=True)
                      if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            kind = fields.get("type")
            is_int = isinstance(kind, ast.Constant) and kind.value == "int"
            if kind is not None and not is_int:
                continue
            value, low, high = (_number(fields.get(k)) for k in ("default", "low", "high"))
            if value is not None and low is not None and high is not None and low < high:
                out.append((fields["default"], key.value, value, low, high, is_int))
    return out


def _constants(tree: ast.Module) -> list[_Number]:
    """Non-zero float constants in the program's functions, each as :func:`_nudges` gives a number (bounds: the
    value's own order of magnitude), for a program without ``PARAMETERS`` to move."""
    out: list[_Number] = []
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Constant) and type(node.value) is float and node.value != 0.0:
                    half = abs(node.value) / 2
                    out.append((node, f"a constant of {fn.name}", node.value, node.value - half, node.value + half,
                                False))
    return out


def nudge_answer(body: dict[str, Any], seed: int = 0) -> str:
    """The stand-in's default answer to a chat-completions request: an edit of the program in its prompt that moves
    one number by a small random step.

    The number is one of the program's scalar ``PARAMETERS`` defaults, or, when it has none, one of its functions'
    non-zero float constants. The step is 2 % to 10 % of the parameter's range (at least 1 for an int parameter;
    a constant: 2 % to 10 % of its value), up or down, kept in the bounds. The choices are drawn from ``seed``, the
    request's own ``seed`` and its messages: the same request gets the same answer, and the requests of a run (each
    with its own seed) get distinct edits.

    Args:
        body: The request's JSON body (``messages`` as :func:`~ratchet.refiners.llm.build_prompt` writes them, and
            ``seed``).
        seed: The server's seed.

    Returns:
        The answer's text: a sentence, then one SEARCH/REPLACE block; or a sentence saying why there is no edit (no
        Python program in the prompt, as for a source folder, or no number to move), which the refiner records as an
        unusable answer.
    """
    source = _program(body)
    if source is None:
        return "The stand-in edits Python programs only, and finds none under '## Current policy' in this prompt."
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "The stand-in cannot read the program in this prompt."
    lines = source.splitlines()
    mixed = json.dumps([seed, body.get("seed"), body.get("messages")], sort_keys=True, default=str)
    rng = random.Random(hashlib.sha256(mixed.encode()).digest())
    numbers = [n for n in _nudges(tree) or _constants(tree)  # a line that is the program's only one like it
               if n[0].lineno == n[0].end_lineno and lines.count(lines[n[0].lineno - 1]) == 1]
    if not numbers:
        return "The stand-in finds no number to move in this program."
    node, name, value, low, high, is_int = rng.choice(numbers)
    step = rng.uniform(0.02, 0.1) * (high - low) * rng.choice((-1, 1))
    if is_int:
        step = max(1.0, round(abs(step))) * (1 if step > 0 else -1)
    new = min(high, max(low, value + step))
    if new == value:  # at a bound: the other way
        new = min(high, max(low, value - step))
    short = float(f"{new:.6g}")
    text = str(round(new)) if is_int else repr(short if low <= short <= high else new)
    line = lines[node.lineno - 1]
    raw = line.encode("utf-8")  # ast columns count UTF-8 bytes
    edited = (raw[:node.col_offset] + text.encode() + raw[node.end_col_offset or 0:]).decode("utf-8")
    return (f"Move {name} from {value:g} to {text} (a stand-in's random nudge, not a model's idea).\n"
            f"<<<<<<< SEARCH\n{line}\n=======\n{edited}\n>>>>>>> REPLACE\n")


class StandIn:
    """A real HTTP server speaking chat completions, started on construction in a thread of its own (or served in
    the caller's thread by :meth:`serve_forever` with ``start=False``).

    Each request's answer is ``respond(body)`` (a function of the request's JSON body, whatever order the requests
    come in) when ``respond`` is given; else the next item of ``script``, and once the script has run out,
    ``default``. An answer is its text, or a dict: ``{"status": 429}`` (``"message"``: the error's text),
    ``{"delay": 1.0, "content": ...}``, ``{"usage": {"prompt_tokens": ..., "completion_tokens": ...}}`` (default 100
    and 20; a string: that JSON text as it is), and hostile ones: ``{"redirect": URL}`` (a 302 there, or
    ``"status"``), ``{"drip": 1.0}`` (the reply one byte per that many seconds; ``"drip_bytes"``: only the first that
    many), ``{"size": N}`` (an answer of N characters, streamed without a length), ``{"echo_auth": True}`` (the
    Authorization header written into the answer). An answer that gives no text (a dict without ``content``, or a
    ``default`` of None) answers ``content``, and when that is None, :func:`nudge_answer` (its usage: a token per 4
    characters of the messages and of the answer, as a model's count would be, about).

    Every answer takes ``latency`` seconds more (a model's time to answer). With ``fail_rate``, that share of the
    requests (drawn from ``seed``, in the order they arrive) is answered 500 or 429 instead. With ``gather``, the
    first ``gather`` requests are held until that many have come in (or 60 s passed): a client that sends them at
    once has them all in flight at once, however late a loaded machine schedules its threads.

    Args:
        script: Answers to the first requests, in order.
        default: The answer once the script has run out.
        models: The model names ``GET .../models`` lists (None: that route answers 404).
        latency: Seconds each answer takes, on top of a ``delay`` of its own.
        respond: A function of a request's JSON body giving its answer (the script and ``default`` then unused).
        gather: Requests held until that many have come in (0: none).
        content: The text of an answer that gives none (None: :func:`nudge_answer`).
        host: The address to serve on (``"0.0.0.0"``: every address of this machine; the URL then names 127.0.0.1).
        port: The port to serve on (0: a free one, named in ``url``).
        fail_rate: Share of requests answered HTTP 500 or 429 instead, in [0, 1].
        seed: Seed of the failures and of :func:`nudge_answer`'s edits.
        start: Serve in a thread of its own at once; False: the caller calls :meth:`serve_forever`.

    Attributes:
        url: The API root to give as ``base_url`` (``http://HOST:PORT/v1``).
        requests: Every POST: ``{"path", "auth" (the Authorization header), "body"}``, in arrival order.
        gets: Every GET: ``{"path", "auth"}``; ``GET .../models`` lists ``models`` (404 when None).
        most_at_once: The most requests it answered at one time.

    Raises:
        OSError: the host and port cannot be bound (in use, or not an address of this machine).
    """

    def __init__(self, script: Iterable[Answer] = (), default: Answer | None = None,
                 models: Sequence[str] | None = None, latency: float = 0.0,
                 respond: Callable[[dict[str, Any]], Answer] | None = None, gather: int = 0, *,
                 content: str | None = None, host: str = "127.0.0.1", port: int = 0, fail_rate: float = 0.0,
                 seed: int = 0, start: bool = True) -> None:
        self.script, self.default, self.content, self.models = list(script), default, content, models
        self.requests: list[dict[str, Any]] = []
        self.gets: list[dict[str, Any]] = []
        self.latency, self.respond, self.fail_rate, self.seed = latency, respond, fail_rate, seed
        self.at_once, self.most_at_once = 0, 0
        self._failures = random.Random(seed)
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        handler = _handler(self, gather)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.url = f"http://{shown}:{self.server.server_address[1]}/v1"
        self.thread: threading.Thread | None = None
        if start:
            self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
            self.thread.start()

    def answer_for(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request (see the class doc), as a dict with its ``content``. Called under ``lock``."""
        if self.fail_rate and self._failures.random() < self.fail_rate:
            status = self._failures.choice((500, 429))
            return {"status": status, "message": f"stand-in: a random {status} (fail_rate {self.fail_rate:g})"}
        item = (self.respond(body) if self.respond is not None else
                self.script.pop(0) if self.script else self.default)
        item = dict(item) if isinstance(item, dict) else {"content": item}
        if item.get("content") is None and self.content is None:  # its tokens: about what a model would count
            item["content"] = nudge_answer(body, self.seed)
            item.setdefault("usage", {"prompt_tokens": len(json.dumps(body.get("messages"))) // 4,
                                      "completion_tokens": len(item["content"]) // 4})
        elif item.get("content") is None:
            item["content"] = self.content
        return item

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` (or KeyboardInterrupt, which it lets through)."""
        self.server.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self.thread is not None:
            self.server.shutdown()
        self.server.server_close()


def _handler(outer: StandIn, gather: int) -> type[BaseHTTPRequestHandler]:
    """The request handler class of ``outer``'s server."""

    class Handler(BaseHTTPRequestHandler):
        counted = False

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            outer.gets.append({"path": self.path, "auth": self.headers.get("Authorization")})
            found = outer.models is not None and self.path.endswith("/models")
            data = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models or ()]}
                              if found else {"error": {"message": "not found"}}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            except (TypeError, ValueError):
                self._send(400, json.dumps({"error": {"message": "expected a JSON body"}}).encode())
                return
            auth = self.headers.get("Authorization")
            with outer.lock:
                outer.requests.append({"path": self.path, "auth": auth, "body": body})
                item = outer.answer_for(body)
                outer.at_once += 1
                outer.most_at_once = max(outer.most_at_once, outer.at_once)
                self.counted = True
                outer.arrived.notify_all()
                outer.arrived.wait_for(lambda: len(outer.requests) >= gather, timeout=60)
            try:
                self.answer(item, body, auth)
            finally:
                self.uncount()

        def uncount(self) -> None:
            """The request stops counting as answered at once before its reply is sent: a client that retries
            the moment it reads a reply must not find its finished request still counted."""
            with outer.lock:
                if self.counted:
                    outer.at_once, self.counted = outer.at_once - 1, False

        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def answer(self, item: dict[str, Any], body: dict[str, Any], auth: str | None) -> None:
            if item.get("delay") or outer.latency:
                time.sleep(item.get("delay", 0.0) + outer.latency)
            self.uncount()
            status = item.get("status", 302 if item.get("redirect") else 200)
            content = item.get("content", "") + (f"\nAuthorization: {auth}" if item.get("echo_auth") else "")
            if status != 200 or item.get("redirect"):
                data = json.dumps({"error": {"message": item.get("message", "slow down")}}).encode()
            else:
                usage = item.get("usage", {"prompt_tokens": 100, "completion_tokens": 20})
                if isinstance(usage, dict):
                    usage = json.dumps({**usage, "total_tokens": sum(usage.values())})
                data = json.dumps({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": content}}],
                                   "usage": "USAGE"}).replace('"USAGE"', usage).encode()
            try:
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "0")
                if item.get("redirect"):
                    self.send_header("Location", item["redirect"])
                self.send_header("Content-Type", "application/json")
                if item.get("size"):  # no length: the client must stop reading by itself
                    self.end_headers()
                    self.wfile.write(b'{"choices": [{"message": {"role": "assistant", "content": "')
                    chunk = b"x" * 65_536
                    for _ in range(item["size"] // len(chunk)):
                        self.wfile.write(chunk)
                    self.wfile.write(b'"}}]}')
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if item.get("drip"):
                    for i in range(min(len(data), item.get("drip_bytes", len(data)))):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(item["drip"])
                    self.wfile.write(data[item.get("drip_bytes", len(data)):])
                    return
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                pass

    return Handler
