"""A person takes over from a student in the browser (HG-DAgger with a human expert).

:class:`CorrectionSession` plays episodes of an ``mlp`` student (NumPy weights: no policy code runs
here) and renders them; :func:`serve` puts a local web page in front of it (no internet, no CDN: one
inline HTML page). The person presses a mapped key to take over — every step while in control is the
person's action, labelled — and ``Enter`` to hand back. The session records who controlled which steps
(segments ``[start, end, "student"|"person"]``, end exclusive) and the person's steps as a
:class:`ratchet.data.Dataset` (``expert`` True, label = executed = the person's action).

``ratchet correct RUN`` plays a finished run's incumbent this way and makes it a round of the run:
:class:`ratchet.correction_round.CorrectionRound` records the episodes and the data set (an artifact) in
the run's ledger, retrains the student on the run's data plus the person's steps in a sandboxed training
job, lets the run's gate decide it against the incumbent, and evaluates the incumbent on the test split
again (HG-DAgger: M. Kelly et al., ICRA 2019). The data set also works outside a run: save
``session.dataset().to_bytes()`` (``--output``) and start a ``bc`` or ``hg-dagger`` refiner from it
(``demonstrations = "person.npz"``).

Key maps: Discrete action spaces only. LunarLander: ↑ main engine (2), ← left engine (1), → right engine
(3), no key held while in control: no-op (0). Any other Discrete(n): ← 0, → 1 (n = 2), or the digit keys;
such a space has no no-op, so while the person is in control and holds no key the episode waits (no env
step, nothing recorded) instead of recording an action the person never chose.

The page is served on loopback under a random per-session token path (``http://127.0.0.1:PORT/TOKEN/``);
requests without the token, with a ``Host`` other than ``127.0.0.1:PORT``/``localhost:PORT`` (DNS
rebinding) or with a foreign ``Origin`` are refused (403), so other pages in the person's browser cannot
drive the session.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from ratchet.errors import RatchetError

__all__ = ["CorrectionSession", "key_map_for", "parse_step", "serve"]

_LUNAR = {"ArrowUp": 2, "ArrowLeft": 1, "ArrowRight": 3}


def key_map_for(env_id: str, action_space: Any) -> tuple[dict[str, int], int | None]:
    """``(key -> action, action when no key is held)`` for a Discrete action space; the idle action is None
    when the space has no no-op (the episode then waits for a key while the person is in control).

    Raises:
        RatchetError: not a Discrete space.
    """
    n = getattr(action_space, "n", None)
    if n is None:
        raise RatchetError(f"browser takeover needs a Discrete action space, got {type(action_space).__name__}")
    if env_id.startswith("LunarLander"):
        return dict(_LUNAR), 0
    keys = {str(i): i for i in range(min(int(n), 10))}
    if int(n) == 2:
        keys.update({"ArrowLeft": 0, "ArrowRight": 1})
    return keys, None


class CorrectionSession:
    """Episodes of a student with a person able to take over (see the module doc).

    Args:
        task: The task (a :class:`~ratchet.task.GymTask`).
        student: The student network (:class:`~ratchet.policies.mlp.MLP`).
        seeds: Episode reset seeds, played in order.
        round_no: Recorded in the data set's ``round`` column.
    """

    def __init__(self, task: Any, student: Any, seeds: list[int], round_no: int = 1) -> None:
        self.task, self.student, self.seeds, self.round_no = task, student, list(seeds), round_no
        # frames are rendered off screen: no window, no sound (pygame's SDL otherwise complains on a terminal
        # without a desktop session, e.g. "XDG_RUNTIME_DIR is invalid or not set")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        self.env = task.make_env(render_mode="rgb_array")
        self.keys, self.idle_action = key_map_for(task.env_id, self.env.action_space)
        self.lock = threading.Lock()
        self.steps: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.episode = -1
        self.done = True
        self._next_episode()

    def _next_episode(self) -> None:
        self.episode += 1
        if self.episode >= len(self.seeds):
            self.done = True
            return
        self.obs, _ = self.env.reset(seed=int(self.seeds[self.episode]))
        self.done, self.t, self.ret, self.control = False, 0, 0.0, "student"
        self.who: list[str] = []

    def step(self, held: Sequence[str], pressed: Sequence[str] = (), handback: bool = False) -> dict[str, Any]:
        """One env step: the student's action or, from the first mapped key pressed until ``handback``, the
        person's: the first mapped key held, else the first pressed since the last step (a tap), else the
        idle action — or, where the key map has no idle action (no no-op), no step at all: the episode waits
        (the state says ``"waiting": True``) and nothing is recorded.

        Args:
            held: Keys held down now (``KeyboardEvent.key`` names).
            pressed: Keys pressed since the last step (even if already released).
            handback: Enter was pressed: the student flies again.
        """
        with self.lock:
            if self.done:
                return {"done": True, "episode": self.episode}
            if handback:
                self.control = "student"
            elif any(k in self.keys for k in [*held, *pressed]):
                self.control = "person"
            if self.control == "person":
                action = next((self.keys[k] for k in [*held, *pressed] if k in self.keys), self.idle_action)
                if action is None:  # no no-op: wait for the person's key rather than invent a label
                    return {"done": False, "episode": self.episode, "t": self.t, "control": "person",
                            "return": round(self.ret, 2), "waiting": True}
            else:
                action = int(self.student.act(self.obs))
            nxt, reward, terminated, truncated, _ = self.env.step(action)
            if self.control == "person":
                flat = np.asarray(self.obs, float).ravel()
                self.steps.append({"obs": flat, "next_obs": np.asarray(nxt, float).ravel(), "label": action,
                                   "executed": action, "reward": float(reward), "terminated": bool(terminated),
                                   "truncated": bool(truncated), "expert": True, "round": self.round_no,
                                   "episode": self.episode, "seed": int(self.seeds[self.episode]), "step": self.t})
            self.who.append(self.control)
            self.obs, self.t, self.ret = nxt, self.t + 1, self.ret + float(reward)
            state = {"done": False, "episode": self.episode, "t": self.t, "control": self.control,
                     "return": round(self.ret, 2), "waiting": False}
            if terminated or truncated:
                segs: list[list[Any]] = []
                for i, w in enumerate(self.who):
                    if segs and segs[-1][2] == w:
                        segs[-1][1] = i + 1
                    else:
                        segs.append([i, i + 1, w])
                self.records.append({"seed": int(self.seeds[self.episode]), "length": self.t, "return": self.ret,
                                     "terminated": bool(terminated), "truncated": bool(truncated),
                                     "segments": segs, "person_steps": sum(w == "person" for w in self.who)})
                self._next_episode()
            return state

    def frame_png(self) -> bytes:
        """The current frame as PNG bytes."""
        import imageio.v3 as iio

        with self.lock:
            img = self.env.render()
        return iio.imwrite("<bytes>", np.asarray(img), extension=".png")

    def dataset(self, finished_only: bool = False) -> Any:
        """The person's steps so far (:class:`ratchet.data.Dataset`); ``finished_only``: only those of the
        episodes played to the end (the ones in :attr:`records`)."""
        from ratchet.data import Dataset

        with self.lock:
            steps = [s for s in self.steps if not finished_only or s["episode"] < len(self.records)]
            return Dataset.from_steps(steps, "discrete", int(np.prod(self.env.observation_space.shape)),
                                      env_id=self.task.env_id)

    def episode_dataset(self, episode: int) -> Any:
        """The person's steps of one episode (:class:`ratchet.data.Dataset`; empty when the person never took
        over in it)."""
        from ratchet.data import Dataset

        with self.lock:
            steps = [s for s in self.steps if s["episode"] == episode]
            return Dataset.from_steps(steps, "discrete", int(np.prod(self.env.observation_space.shape)),
                                      env_id=self.task.env_id)

    def close(self) -> None:
        self.env.close()


_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>ratchet: take over</title>
<style>body{font-family:sans-serif;background:#111;color:#eee;text-align:center}img{max-width:90vw}
#s{font-size:1.2em;margin:8px}.person{color:#f84}.student{color:#8cf}</style></head><body>
<div id="s">loading…</div><img id="f" alt="episode"><p>KEYS — take over with a mapped key; Enter hands back.
IDLE</p>
<script>
const held=new Set(),pressed=new Set();let handback=false;
addEventListener('keydown',e=>{if(e.key==='Enter'){handback=true;}else{held.add(e.key);pressed.add(e.key);}e.preventDefault();});
addEventListener('keyup',e=>{held.delete(e.key);});
async function tick(){
  const body=JSON.stringify({held:[...held],pressed:[...pressed],handback});pressed.clear();handback=false;
  const r=await fetch('step',{method:'POST',body,headers:{'Content-Type':'application/json'}});
  if(!r.ok){document.getElementById('s').textContent='error: '+await r.text();return;}
  const s=await r.json();
  if(s.done){document.getElementById('s').textContent='done: thank you';return;}
  const el=document.getElementById('s');el.className=s.control;
  el.textContent=`episode ${s.episode} · step ${s.t} · ${s.control} in control · return ${s['return']}`
    +(s.waiting?' · waiting for your key':'');
  document.getElementById('f').src='data:image/png;base64,'+s.frame;
  setTimeout(tick,INTERVAL);
}
tick();
</script></body></html>"""


#: Largest /step body accepted (bytes); the page sends well under 1 KiB.
MAX_BODY = 4096
_MAX_KEYS, _MAX_KEY_LEN = 16, 32


def parse_step(body: bytes) -> tuple[list[str], list[str], bool]:
    """A ``/step`` request body: a JSON object with ``held`` and ``pressed`` (lists of at most 16 strings of
    at most 32 characters, default empty) and ``handback`` (a JSON bool, default false), nothing else.

    Raises:
        ValueError: anything else (one line, for the 400 answer).
    """
    if len(body) > MAX_BODY:
        raise ValueError(f"body too large (over {MAX_BODY} bytes)")
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("body is not JSON") from None
    if not isinstance(msg, dict):
        raise ValueError("body must be a JSON object {held, pressed, handback}")  # noqa: TRY004 - parse_step's contract: ValueError (400)
    extra = sorted(set(msg) - {"held", "pressed", "handback"})
    if extra:
        raise ValueError(f"unknown field(s) {', '.join(repr(k)[:40] for k in extra[:3])}")
    out: list[list[str]] = []
    for name in ("held", "pressed"):
        keys = msg.get(name, [])
        if not isinstance(keys, list) or len(keys) > _MAX_KEYS or \
                not all(isinstance(k, str) and len(k) <= _MAX_KEY_LEN for k in keys):
            raise ValueError(f"{name} must be a list of at most {_MAX_KEYS} strings of at most {_MAX_KEY_LEN} "
                             "characters")
        out.append(keys)
    handback = msg.get("handback", False)
    if not isinstance(handback, bool):
        raise ValueError("handback must be true or false")  # noqa: TRY004 - parse_step's contract: ValueError (400)
    return out[0], out[1], handback


class _QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that prints nothing when a request fails (broken pipe, reset, abandoned
    connection): the person's terminal shows only what ``ratchet correct`` says."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


def serve(session: CorrectionSession, host: str = "127.0.0.1", port: int = 0,
          interval_ms: int = 50) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``session`` on a local page (started in a background thread); returns ``(server, url)``, the URL
    with the session's random token path (``http://HOST:PORT/TOKEN/``). Stop it with ``server.shutdown()``.

    Requests are refused with 403 (one line) without the token, with a ``Host`` header other than
    ``127.0.0.1:PORT``, ``localhost:PORT`` or ``HOST:PORT``, or with an ``Origin`` other than the page's
    own; a bad ``/step`` body (see :func:`parse_step`) gets 400.

    Args:
        session: The session.
        host: Interface to listen on (default loopback only).
        port: 0 picks a free port.
        interval_ms: Time between steps the page asks for (one env step per request).

    Raises:
        OSError: the port cannot be bound (in use, not allowed).
    """
    keys = ", ".join(f"{k} → {v}" for k, v in session.keys.items())
    idle = ("Holding no key while in control: no-op." if session.idle_action is not None else
            "This task has no no-op: while you are in control and hold no key, the episode waits for you.")
    page = _PAGE.replace("KEYS", keys).replace("INTERVAL", str(int(interval_ms))).replace("IDLE", idle).encode()
    token = secrets.token_urlsafe(18)
    server = _QuietServer((host, port), BaseHTTPRequestHandler)
    bound = server.server_address[1]
    hosts = {f"127.0.0.1:{bound}", f"localhost:{bound}", f"{host}:{bound}"}
    origins = {f"http://{h}" for h in hosts}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: bytes, ctype: str, code: int = 200) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if code != 200:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, line: str) -> None:
            self.close_connection = True
            self._send(line.encode() + b"\n", "text/plain; charset=utf-8", code)

        def _allowed(self) -> str | None:
            """The path under the token, or None after answering 403."""
            if self.headers.get("Host", "") not in hosts:
                self._refuse(403, "forbidden: unexpected Host header")
                return None
            origin = self.headers.get("Origin")
            if origin is not None and origin not in origins:
                self._refuse(403, "forbidden: request from another origin")
                return None
            prefix, _, rest = self.path.partition("?")[0].lstrip("/").partition("/")
            if not secrets.compare_digest(prefix.encode(), token.encode()):
                self._refuse(403, "forbidden: open the URL that ratchet correct printed")
                return None
            return "/" + rest

        def do_GET(self) -> None:
            path = self._allowed()
            if path is None:
                return
            if path in ("/", "/index.html"):
                self._send(page, "text/html; charset=utf-8")
            else:
                self._refuse(404, "not found")

        def do_POST(self) -> None:
            path = self._allowed()
            if path is None:
                return
            if path != "/step":
                self._refuse(404, "not found")
                return
            try:
                n = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._refuse(411, "a Content-Length header is required")
                return
            if n < 0 or n > MAX_BODY:
                self._refuse(400, f"body too large (over {MAX_BODY} bytes)" if n > 0 else "bad Content-Length")
                return
            try:
                held, pressed, handback = parse_step(self.rfile.read(n))
            except ValueError as exc:
                self._refuse(400, str(exc))
                return
            try:
                state = session.step(held, pressed, handback)
                if not state["done"]:
                    state["frame"] = base64.b64encode(session.frame_png()).decode()
            except Exception as exc:  # noqa: BLE001 - the env or renderer failed: one line to the page, nothing on the terminal
                self._refuse(500, f"the episode failed: {type(exc).__name__}: {str(exc)[:200]}".replace("\n", " "))
                return
            self._send(json.dumps(state).encode(), "application/json")

    server.RequestHandlerClass = Handler
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url_host = "127.0.0.1" if host in ("", "0.0.0.0") else host
    return server, f"http://{url_host}:{bound}/{token}/"
