"""The dashboard's web app (Starlette, ASGI) and its server (uvicorn).

Every request must carry the session's token as the first path segment (``/TOKEN/…``), a ``Host`` header naming the
address served (``127.0.0.1:PORT``, ``localhost:PORT``), and no ``Origin`` but the page's own: anything else is
refused with 403 and one line, so other pages in the browser (or a DNS-rebinding host) can read nothing. A malformed
run id or query value gets 400, an unknown run 404. The app only reads: ledgers are opened read-only.

Routes (below the token): ``/`` the page; ``/static/…`` its script, style and uPlot (bundled, no CDN);
``/api/runs`` the runs table; ``/api/runs/RUN?gen_from=N&gate_from=M`` a run's page (generations and gate
decisions from those indexes on); ``/api/runs/RUN/lineage`` the lineage of programs (runs whose refiners may change
code); ``/api/runs/RUN/programs/CANDIDATE`` a changed program's diff against its parent;
``/api/runs/RUN/gif/before|after/I`` a failure mode's example GIF (written by ``ratchet report``).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from importlib import resources
from pathlib import Path
from typing import Any

from ratchet.dashboard.views import RUN_ID, RunPage, RunSource, run_row
from ratchet.errors import LedgerError, RatchetError, RunNotFoundError
from ratchet.text import clean

__all__ = ["Dashboard", "DashboardServer", "create_app"]

_MAX_GIF_BYTES = 64 * 2**20
_MAX_PAGES = 32  # run pages kept folded in memory (the least recently viewed is dropped)
_ROW_DEADLINE_S = 5.0  # a runs table row not read by then is listed as unreadable for now
_SECURITY_HEADERS = [
    (b"content-security-policy", (b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                                 b"script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'")),
    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"), (b"cache-control", b"no-store")]


class Dashboard:
    """The data behind the page: the run source, the runs table's cached rows and the folded run pages.

    Args:
        source: Where the runs are.
    """

    def __init__(self, source: RunSource) -> None:
        self.source = source
        self._rows: dict[str, tuple[Any, dict[str, Any], Any]] = {}  # run -> ((newest seq, its time), row, liveness)
        self._pages: OrderedDict[str, RunPage] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ratchet-dashboard")
        self._reading: dict[str, Future[dict[str, Any]]] = {}  # run -> its row being read

    def runs(self) -> dict[str, Any]:
        """``{"where", "runs": [row, ...], "unreadable": [{"run_id", "error"}], "now"}`` (rows: :func:`run_row`).

        Rows are read in parallel; one that takes longer than :data:`_ROW_DEADLINE_S` (a locked ledger, a database
        that does not answer) is listed as unreadable for now and read on in the background, never twice at once.
        """
        ids = self.source.run_ids()
        futures = {}
        with self._lock:
            for run_id in ids:
                fut = self._reading.get(run_id)
                if fut is None or fut.done():
                    fut = self._reading[run_id] = self._pool.submit(self._row, run_id)
                futures[run_id] = fut
        wait(futures.values(), timeout=_ROW_DEADLINE_S)
        rows, bad = [], []
        for run_id, fut in futures.items():
            r = fut.result() if fut.done() else {"run_id": run_id, "error_reading": "still reading its ledger "
                                                   f"after {_ROW_DEADLINE_S:.0f} s (locked, or its database is slow)"}
            if "error_reading" in r:
                bad.append({"run_id": run_id, "error": r["error_reading"]})
            else:
                rows.append(r)
        with self._lock:
            for gone in set(self._rows) - set(ids):
                del self._rows[gone]
        return {"where": self.source.where, "runs": rows, "unreadable": bad, "now": time.time()}

    def _row(self, run_id: str) -> dict[str, Any]:
        """A runs table row, re-read only when the run has new events (its status is recomputed each time: a
        writer may die without writing anything); ``{"run_id", "error_reading"}`` when it cannot be read."""
        from ratchet.ledger.projection import RunState

        try:
            with self.source.open(run_id) as ledger:
                newest = ledger.tail()
                lease = ledger.read_lease()
                key = (newest.seq, newest.time) if newest else (0, None)  # another run under this id: another time
                with self._lock:
                    cached = self._rows.get(run_id)
                if cached is None or cached[0] != key:
                    row, liveness = run_row(ledger, run_id)
                    cached = (key, row, liveness)
                    with self._lock:
                        self._rows[run_id] = cached
            status = cached[2].status_now(lease)
            text = RunState(status=status, writer=lease.to_json() if lease is not None else None).status_text
        except Exception as exc:  # noqa: BLE001 - one damaged run must not hide the others
            return {"run_id": run_id, "error_reading": f"{type(exc).__name__}: {str(exc)[:200]}"}
        return {**cached[1], "status": status, "status_text": text}

    def page(self, run_id: str) -> RunPage:
        """The run's page, refreshed from its ledger.

        Raises:
            RunNotFoundError: no such run. LedgerError: its ledger is damaged or unreachable.
        """
        with self._lock:
            page = self._pages.get(run_id)
            if page is None:
                page = self._pages[run_id] = RunPage(run_id)
            self._pages.move_to_end(run_id)
            while len(self._pages) > _MAX_PAGES:
                self._pages.popitem(last=False)
        try:
            with self.source.open(run_id) as ledger:
                page.refresh(ledger)
        except RunNotFoundError:
            with self._lock:  # no such run (any more): keep no page for it
                if self._pages.get(run_id) is page:
                    del self._pages[run_id]
            raise
        return page

    def lineage(self, run_id: str) -> dict[str, Any]:
        """The run's lineage of programs (:meth:`RunPage.lineage`), its candidates read since the last call.

        Raises:
            RunNotFoundError: no such run. LedgerError: its ledger is damaged or unreachable.
        """
        page = self.page(run_id)
        with self.source.open(run_id) as ledger:
            return page.lineage(ledger)

    def program(self, run_id: str, candidate_id: str) -> dict[str, Any]:
        """A changed program's diff against its parent (:meth:`RunPage.diff`).

        Raises:
            RunNotFoundError: no such run or changed program. LedgerError: its ledger is damaged or unreachable.
        """
        page = self.page(run_id)
        with self.source.open(run_id) as ledger:
            page.lineage(ledger)
        try:
            return page.diff(candidate_id)
        except KeyError:
            raise RunNotFoundError(f"no changed program {candidate_id!r} in run {run_id!r}") from None

    def gif_url(self, run_id: str) -> Any:
        """``(tag, i) -> URL`` of a failure mode's example GIF when :meth:`gif` would serve it, else None."""
        videos = self._videos(run_id)

        def url(tag: str, i: int) -> str | None:
            if videos is None or not _regular(videos / f"failure-{tag}-{i}.gif"):
                return None
            return f"api/runs/{run_id}/gif/{tag}/{i}"

        return url

    def _videos(self, run_id: str) -> Path | None:
        """The run's ``videos`` folder when neither it nor the run directory is a link (GIFs are never read through
        one), else None."""
        run_dir = self.source.run_dir(run_id)
        if run_dir is None or run_dir.is_symlink() or (run_dir / "videos").is_symlink():
            return None
        return run_dir / "videos"

    def gif(self, run_id: str, tag: str, i: int) -> bytes:
        """A failure mode's example GIF, read as a regular file only (never a link, nor through one).

        Raises:
            RunNotFoundError: no such run or GIF.
        """
        from ratchet.safefile import read_bytes

        videos = self._videos(run_id)
        try:
            if videos is None:
                raise OSError
            return read_bytes(videos / f"failure-{tag}-{i}.gif", _MAX_GIF_BYTES)
        except OSError:
            raise RunNotFoundError(f"no GIF failure-{tag}-{i} for run {run_id!r}") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.source.close()


def _own_names() -> set[str]:
    """This machine's host name, fully qualified name and addresses (for ``Host`` headers when serving on every
    interface)."""
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return {n for n in names if n}


def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _static_dir() -> Path:
    return Path(str(resources.files("ratchet.dashboard") / "static"))


def create_app(dashboard: Dashboard, token: str, hosts: set[str]) -> Any:
    """The ASGI app serving ``dashboard`` under ``/TOKEN/`` to requests whose ``Host`` is in ``hosts``
    (``"127.0.0.1:PORT"``, …; see the module doc for what is refused)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    static = _static_dir()

    class JSON(JSONResponse):
        """A JSON answer that is always UTF-8: ledgers hold policy text, and a lone surrogate in it (an old or hostile
        ledger) is replaced, never a 500 on every poll."""

        def render(self, content: Any) -> bytes:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                              separators=(",", ":")).encode("utf-8", errors="replace")

    def _run_id(request: Request) -> str:
        run_id = request.path_params["run_id"]
        if not RUN_ID.fullmatch(run_id):
            raise HTTPException(400, "malformed run id: letters, digits, '.', '_' and '-' only, at most 200")
        return run_id

    def _int(request: Request, name: str) -> int:
        raw = request.query_params.get(name, "0")
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
            raise HTTPException(400, f"{name} must be a non-negative integer")
        return int(raw)

    def _call(fn: Any, *args: Any) -> Any:
        """``fn(*args)``, its errors as one-line answers (never a traceback on the terminal: a damaged run is
        polled every few seconds)."""
        try:
            return fn(*args)
        except RunNotFoundError as exc:
            raise HTTPException(404, str(exc)) from None
        except (LedgerError, RatchetError) as exc:
            raise HTTPException(500, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a malformed ledger the views did not foresee: that run's answer
            raise HTTPException(500, f"cannot show it: {type(exc).__name__}: {str(exc)[:200]}") from None

    def index(request: Request) -> Response:
        return FileResponse(static / "index.html", media_type="text/html; charset=utf-8")

    def runs(request: Request) -> Response:
        return JSON(_call(dashboard.runs))

    def run(request: Request) -> Response:
        run_id = _run_id(request)
        gen_from, gate_from = _int(request, "gen_from"), _int(request, "gate_from")
        page = _call(dashboard.page, run_id)
        return JSON(_call(page.view, gen_from, gate_from, dashboard.gif_url(run_id)))

    def lineage(request: Request) -> Response:
        return JSON(_call(dashboard.lineage, _run_id(request)))

    def program(request: Request) -> Response:
        run_id, cid = _run_id(request), request.path_params["candidate"]
        if not RUN_ID.fullmatch(cid):
            raise HTTPException(400, "malformed candidate id")
        return JSON(_call(dashboard.program, run_id, cid))

    def gif(request: Request) -> Response:
        run_id, tag, i = _run_id(request), request.path_params["tag"], request.path_params["i"]
        if tag not in ("before", "after"):
            raise HTTPException(400, "the GIF's tag is before or after")
        if not (i.isascii() and i.isdigit()) or len(i) > 4:
            raise HTTPException(400, "the GIF's number is a failure mode's rank: 1, 2, …")
        return Response(_call(dashboard.gif, run_id, tag, int(i)), media_type="image/gif")

    def error(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        if code == 404 and detail == "Not Found":  # no route: say what there is
            detail = "not found: the dashboard serves its page, static/… and api/runs[/RUN]"
        return PlainTextResponse(f"{clean(detail, 2000)}\n", status_code=code)  # text from a ledger: printable

    routes = [
        Route("/", index),
        Route("/api/runs", runs),
        Route("/api/runs/{run_id}", run),
        Route("/api/runs/{run_id}/lineage", lineage),
        Route("/api/runs/{run_id}/programs/{candidate}", program),
        Route("/api/runs/{run_id}/gif/{tag}/{i}", gif),
        Mount("/static", StaticFiles(directory=static), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: error, Exception: error})
    return _Guard(app, token, hosts, RedirectResponse)


class _Guard:
    """ASGI middleware: the token, ``Host`` and ``Origin`` checks (403 with one line), GET/HEAD only, the security
    headers; strips ``/TOKEN`` from the path before the app routes it."""

    def __init__(self, app: Any, token: str, hosts: set[str], redirect: Any) -> None:
        self.app, self.token, self.hosts, self.redirect = app, token.encode(), set(hosts), redirect
        self.origins = {f"http://{h}" for h in hosts}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: nothing to set up
            if scope["type"] == "lifespan":
                while True:
                    msg = await receive()
                    if msg["type"] == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif msg["type"] == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        refusal = None
        if headers.get("host", "") not in self.hosts:
            refusal = (403, "forbidden: unexpected Host header")
        elif "origin" in headers and headers["origin"] not in self.origins:
            refusal = (403, "forbidden: request from another origin")
        path: str = scope.get("path", "")
        prefix, slash, rest = path.lstrip("/").partition("/")
        if refusal is None and not secrets.compare_digest(prefix.encode(), self.token):
            refusal = (403, "forbidden: open the URL that ratchet dashboard printed (it holds the token)")
        if refusal is None and scope.get("method") not in ("GET", "HEAD"):
            refusal = (405, "method not allowed: the dashboard only reads")
        if refusal is not None:
            await _plain(send, *refusal)
            return
        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_SECURITY_HEADERS]}
            await send(message)

        if not slash:  # /TOKEN → /TOKEN/ (relative URLs on the page need the slash)
            await self.redirect(f"/{prefix}/", status_code=307)(scope, receive, send_with_headers)
            return

        await self.app({**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode()}, receive, send_with_headers)


async def _plain(send: Any, status: int, line: str) -> None:
    body = (line + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *_SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})


class DashboardServer:
    """The dashboard served over the runs in ``runs_dir`` (or the ``storage`` database) on ``host:port``.

    The socket is bound when the object is made, so :attr:`url` (with its token) is known before serving starts.

    Args:
        runs_dir: Folder holding run directories.
        storage: Database URL whose runs to list instead (``postgresql://…``, ``sqlite:///…``).
        host: Interface to listen on (default loopback only).
        port: 0 picks a free port.

    Attributes:
        url: The page's URL with its token: ``http://127.0.0.1:PORT/TOKEN/``.

    Raises:
        OSError: the port cannot be bound. RatchetError: a bad runs folder or storage URL.
    """

    def __init__(self, runs_dir: str | Path = "runs", storage: str | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        import uvicorn

        self.dashboard = Dashboard(RunSource(runs_dir, storage))
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may bind while TIME_WAIT lasts
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            self.dashboard.close()
            raise
        bound = self._sock.getsockname()[1]
        wildcard = host in ("", "0.0.0.0", "::")
        url_host = "127.0.0.1" if wildcard else host
        shown = f"[{url_host}]" if ":" in url_host else url_host
        names = {"127.0.0.1", "localhost", shown}
        if wildcard:  # every interface: this machine's names and addresses, as another machine's browser sends them
            names |= _own_names()
        hosts = {f"{n}:{bound}" for n in names}
        #: whether other machines can reach the page (plain HTTP: the URL's token is its only protection then)
        self.exposed = not (wildcard is False and host in ("127.0.0.1", "localhost", "::1"))
        self.token = secrets.token_urlsafe(18)
        self.port = bound
        self.url = f"http://{shown}:{bound}/{self.token}/"
        app = create_app(self.dashboard, self.token, hosts)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve until :meth:`stop` or Ctrl-C (uvicorn handles SIGINT/SIGTERM in the main thread)."""
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self.dashboard.close()
            self._sock.close()

    def start(self) -> None:
        """Serve from a daemon thread; returns once it accepts requests (at most 10 s)."""
        self._thread = threading.Thread(target=self.run, name="ratchet-dashboard", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving (and wait for the thread :meth:`start` made)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
