"""Command-line interface: a thin Typer layer over the library.

Errors print one line (what is wrong and how to fix it) and exit 1; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from ratchet.errors import LedgerError, RatchetError, ReplayMismatchError, RunNotFoundError, TaskError
from ratchet.text import clean


class _LiteralHelp(TyperGroup):
    """The command group, whose help texts (docstrings and every option's help) print as written: Typer
    reads them as Rich markup, which ate "[task]" ("A ratchet.toml whose  to use") and "[[refiners]]"."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from rich.markup import escape

        for cmd in [self, *self.commands.values()]:  # built afresh by each `app` call
            if getattr(cmd, "_literal_help", False):  # escaping twice would show the backslashes
                continue
            cmd._literal_help = True  # type: ignore[attr-defined]
            cmd.help = escape(cmd.help) if cmd.help else cmd.help
            for param in cmd.params:
                if getattr(param, "help", None):
                    param.help = escape(param.help)  # type: ignore[attr-defined]  # an Option's (getattr above)


app = typer.Typer(help="ratchet: make an existing decision policy better, provably "
                       "(plan → execute → critique → refine → gate).", cls=_LiteralHelp,
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
# markup off: messages, stop reasons, run ids and paths print as they are ("[budget] env_steps" stays)
out = Console(markup=False)
err = Console(stderr=True, markup=False)
_state: dict[str, Any] = {"debug": False}

def _file_name(raw: str) -> Path:
    """An output file option's value (``-o``, ``--video``): a name ending in a path separator names a folder, which
    pathlib would silently turn into a file of that name.

    Raises:
        typer.BadParameter: ``raw`` ends with ``/`` (or ``\\``).
    """
    if raw.endswith(("/", "\\")):
        raise typer.BadParameter(f"{raw} names a folder; give a file name in it")
    return Path(raw)


RUNS_DIR_OPT = typer.Option("runs", "--runs-dir", metavar="DIR", help="Folder holding run directories.")
STORAGE_OPT = typer.Option(
    None, "--storage", envvar="RATCHET_STORAGE", metavar="URL",
    help="Keep ledgers in a database shared by many runs: postgresql://USER@HOST[:PORT]/DB (password from "
         "PGPASSWORD or ~/.pgpass, or in the URL) or sqlite:///PATH. Default: ledger.sqlite in each run "
         "directory. A run directory made with a URL points to its database; that pointer is followed only "
         "when this option names the same database. Runs without a directory here are looked up by id in it.")


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _state["debug"] = debug
    _state["started"] = time.monotonic()  # the command's own clock (the run's leaves out start-up and the report)


def _fail(exc: BaseException) -> None:
    if _state["debug"]:
        raise exc
    err.print(Text.assemble(("error:", "red"), f" {_safe(str(exc), 2000, multiline=True)}"), highlight=False,
              soft_wrap=True)
    raise typer.Exit(1)


def _safe(text: object, max_len: int | None = 500, multiline: bool = False) -> str:
    """Text for Rich: control characters and lone surrogates made visible (:func:`ratchet.text.clean`;
    error texts come from policy code, and old ledgers may hold them raw)."""
    return clean(text, max_len, multiline=multiline)  # the consoles print without markup


def _load_state(run: str, runs_dir: str, storage: str | None = None):
    """``(state, run_dir)`` of a run (see :func:`ratchet.loop.open_run`)."""
    from ratchet.loop import open_run

    ledger, run_dir = open_run(run, runs_dir, storage=storage, readonly=True)
    return _project(ledger, run), run_dir


def _project(ledger, run: str):
    """Read a ledger (then close it) and fold it into a run state."""
    from ratchet.ledger.projection import project

    try:
        events = ledger.read()
        read_lease = getattr(ledger, "read_lease", None)  # a custom store may keep no leases
        lease = read_lease() if callable(read_lease) and events else None
    finally:
        ledger.close()
    if not events:
        raise RunNotFoundError(f"run {run!r} has an empty ledger")
    try:
        return project(events, lease)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LedgerError(f"ledger {ledger.location} is damaged: an event lacks {exc}") from None


def _final_decision_text(fd: dict[str, Any]) -> str:
    """The ``final_decision`` event's payload in words: ``promoted …`` or the gate's note, and ``none (…)`` where no
    final gate ran (the budget left could not pay for one, or nothing was on the shortlist): the incumbent the search
    left stands, which need not be the start."""
    note = str(fd.get("note", ""))
    if fd.get("promoted"):
        return "promoted " + note
    return note if fd.get("gated", True) else f"none ({note}); the incumbent stands"


def _print_result(run_dir: Path, state) -> None:
    out.print(f"run {state.run_id} stopped: {_safe(state.stop_reason, 2000)}", highlight=False, soft_wrap=True)
    if state.final_decision:  # what the search's end decided (decide = "powered" / "end", or [planner] final)
        fd = state.final_decision
        out.print("final decision: " + _safe(_final_decision_text(fd), 500), highlight=False, soft_wrap=True)
    t = Table()
    t.add_column("policy")
    t.add_column("test mean", justify="right")
    t.add_column("std", justify="right")
    t.add_column("success", justify="right")
    t.add_column(state.episode_unit, justify="right")
    tests = [(label, s) for label, s in (("start", state.baseline_test), ("refined", state.test)) if s]
    start = state.baseline_test
    failed = (state.incumbent_id == state.baseline_id and start is not None and bool(start["n"])
              and start.get("n_errors", 0) == start["n"])  # nothing promoted and the start failed: nothing refined
    if failed:
        tests = tests[:1]
    show_errors = any(s.get("n_errors") for _, s in tests)
    if show_errors:  # an errored episode's return is only its partial return: say so
        t.add_column("errored", justify="right")
    for label, s in tests:
        sr = "–" if s["success_rate"] is None else f"{100 * s['success_rate']:.1f} %"
        every = bool(s["n"]) and s.get("n_errors", 0) == s["n"]  # no return to show: 0.00 would read as a score
        row = [label, "–" if every else f"{s['mean']:.2f}", "–" if every else f"{s['std']:.2f}", sr, str(s["n"])]
        t.add_row(*(row + [str(s.get("n_errors", 0))] if show_errors else row))
    if tests:
        out.print(t)
    else:  # a budget that bought no generation: nothing was searched, so no test episodes were spent
        out.print(f"test: none run (nothing was searched); test the starting policy with `ratchet evaluate --run "
                  f"{run_dir}`", highlight=False, soft_wrap=True)
    if failed:
        reasons = (state.episode_failures() or {}).get("reasons") or [{"reason": "?"}]
        out.print(f"refined: none (nothing was promoted, and the start failed all {start['n']} of its test "
                  f"{state.episode_unit}: {_safe(reasons[0]['reason'], 300)})", highlight=False, soft_wrap=True)
    if show_errors:
        out.print("(an errored episode's return counts what it earned before the error)", highlight=False,
                  soft_wrap=True)
    rule = _success_rule(state)
    if rule and any(s["success_rate"] is not None for _, s in tests):
        out.print(f"success: {rule}", highlight=False, soft_wrap=True)
    screen = state.screen_unused_text()  # [model] screen = true that screened nothing: say why
    if screen is not None:
        out.print(_safe(screen, 1000), highlight=False, soft_wrap=True)
    used = " · ".join(f"{word} {n:,}" for word, n in state.used())
    out.print(f"{used} · {state.wall_clock_s:.1f} s run time · promotions {len(state.promotions)}", soft_wrap=True)
    started = _state.get("started")
    took = f"; this command took {time.monotonic() - started:.1f} s" if started is not None else ""
    out.print(f"(run time: the run's generations, validation and test, on the clock [budget] wall_clock_s reads; "
              f"start-up and the report are outside it{took})", highlight=False, soft_wrap=True)
    from ratchet.advice import run_advice

    for line in run_advice(state) if state.status == "finished" else []:  # as `ratchet show` and the report
        out.print(f"advice: {_safe(line, 1000)}", highlight=False, soft_wrap=True)
    out.print(f"run directory: {run_dir}", highlight=False, soft_wrap=True)
    tensorboard = ((state.spec or {}).get("logging") or {}).get("tensorboard")  # [logging] tensorboard
    if isinstance(tensorboard, str):
        out.print(f"tensorboard: {Path(tensorboard) / state.run_id} (see it with `tensorboard --logdir "
                  f"{tensorboard}`; the viewer: pip install tensorboard)", highlight=False, soft_wrap=True)


def _success_rule(state) -> str | None:
    """What success means in a run, with the threshold's source; None where it has none."""
    from ratchet.tasks import success_rule_of

    return success_rule_of(state.task, state.spec.get("task"))


@app.command()
def run(spec: Path = typer.Argument(..., metavar="SPEC", help="A ratchet.toml file, or a folder that holds one."),
        runs_dir: str = RUNS_DIR_OPT,
        run_id: str | None = typer.Option(None, "--run-id", help="Name of the run directory (default: generated)."),
        report: bool = typer.Option(True, "--report/--no-report", help="Write report.html in the run directory."),
        storage: str | None = STORAGE_OPT,
        seed: int | None = typer.Option(None, "--seed", min=0, help="Run seed (draws the seed splits and the "
                                                                       "refiner's sampling); default the spec's."),
        overrides: list[str] = typer.Option([], "--set", metavar="SECTION.KEY=VALUE",
                                            help="Override a spec setting (repeatable), e.g. --set "
                                                 "gate.validation_episodes=100 --set budget.env_steps=20000; a [[refiners]] "
                                                 "table by its index from 0: --set refiners.0.env_steps=5000.")) -> None:
    """Refine the spec's policy until its budget or a stop rule ends the run."""
    from ratchet.loop import new_run_id, start_run
    from ratchet.spec import load_spec

    try:
        notes: list[str] = []
        s = load_spec(spec, overrides, seed, notes=notes)
    except RatchetError as exc:
        _fail(exc)
        return
    for note in notes:  # a setting written where older specs kept it, a [budget] money nothing draws on
        out.print(Text(note), soft_wrap=True)
    run_id = run_id or new_run_id(s.name)
    _with_progress(lambda progress: start_run(s, runs_dir, run_id, progress=progress, storage=storage),
                   str(Path(runs_dir) / run_id), report, storage)


def _with_progress(drive, resume_target: str, report: bool, storage: str | None) -> None:
    """Run ``drive(progress)`` with live progress, then print the result (and write the report).
    Ctrl-C leaves a resumable run and says how to resume it; while the run stops (its workers and ledger are
    closed, which takes a moment), a line printed at the press says so."""
    import signal
    import threading

    from ratchet.progress import ProgressPrinter

    progress = ProgressPrinter(err)
    finished = None  # the run directory once the run has finished (Ctrl-C while its report is written)
    pressed: list[bool] = []

    def stopping(signum: int, frame: Any) -> None:
        if not pressed:  # at once: closing the workers and the ledger comes before the line that says how to resume
            pressed.append(True)
            progress.stop()
            err.print("interrupted; stopping the run (closing its workers and ledger)…", highlight=False,
                      soft_wrap=True)
        raise KeyboardInterrupt

    # signal handlers are set in the main thread only; a run started with SIGINT ignored (`nohup`, a background job
    # of a non-interactive shell) keeps ignoring it
    main_thread = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    before = signal.signal(signal.SIGINT, stopping) if main_thread else None
    try:
        try:
            result = drive(progress)
        finally:
            if main_thread:
                signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)
        progress.stop()
        finished = result.run_dir
        _finish(result.run_dir, report, storage)
    except KeyboardInterrupt:
        progress.stop()
        if finished is not None:
            err.print(f"interrupted after the run finished; see it with `ratchet show {finished}` and write its "
                      f"report with `ratchet report {finished}`", highlight=False, soft_wrap=True)
        else:
            err.print(f"interrupted; continue with `ratchet resume {resume_target}`", highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    except RatchetError as exc:
        progress.stop()
        _fail(exc)


def _write_report(state, run_dir: Path, path: Path, videos: bool, run: str, runs_dir: str, storage: str | None) -> Path:
    from ratchet.report import render_report, report_candidates

    blobs = _artifacts_of(run, runs_dir, storage, report_candidates(state))  # networks: summaries, GIFs
    return render_report(state, run_dir, path, videos,
                         note=lambda text: err.print(f"note: {_safe(text)}", highlight=False, soft_wrap=True),
                         artifacts=blobs)


def _cannot_write(exc: OSError) -> str:
    """Why a file could not be written, in words: a refused file (:class:`ratchet.safefile.UnsafeFile`) with its name,
    else the system's reason (``No space left on device``)."""
    from ratchet.safefile import UnsafeFile

    return str(exc) if isinstance(exc, UnsafeFile) else str(exc.strerror or exc)


def _finish(run_dir: Path, report: bool, storage: str | None) -> None:
    """Write a finished run's report, then print its result: a report that cannot be written (a full disk) is one
    line after the result, saying how to write it later, and exit 1 (the run stays recorded and finished)."""
    state, _ = _load_state(str(run_dir), ".", storage)
    unwritten = None
    if report:
        try:
            path = _write_report(state, run_dir, run_dir / "report.html", True, str(run_dir), ".", storage)
        except OSError as exc:
            unwritten = RatchetError(f"the run finished, but its report cannot be written: {_cannot_write(exc)}; "
                                     f"write it later with `ratchet report {run_dir}`")
            unwritten.__cause__ = exc
        else:
            out.print(f"report: {path}", highlight=False, soft_wrap=True)
    _print_result(run_dir, state)
    from ratchet.loop import BROKEN_START
    from ratchet.planner import NO_GENERATION

    # [budget] wall_clock_s bought no generation, or no refiner could propose anything (e.g. no parameters)
    no_generation = state.stop_kind in ("clock", "idle") and not state.generations
    if unwritten is not None:
        _fail(unwritten)
    if no_generation or str(state.stop_reason or "").startswith((BROKEN_START, NO_GENERATION)):  # bad input: say so
        raise typer.Exit(1)


@app.command()
def resume(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."), runs_dir: str = RUNS_DIR_OPT,
           report: bool = typer.Option(True, "--report/--no-report", help="Write report.html when done."),
           storage: str | None = STORAGE_OPT) -> None:
    """Continue an interrupted run (even after kill -9) without redoing recorded evaluations."""
    from ratchet.loop import resume_run

    _with_progress(lambda progress: resume_run(run, runs_dir, progress=progress, storage=storage), run, report,
                   storage)


@app.command("runs")
def list_runs(runs_dir: str = RUNS_DIR_OPT, storage: str | None = STORAGE_OPT) -> None:
    """List the runs in --runs-dir, or with --storage the runs in that database."""
    from ratchet.errors import StorageNotNamedError
    from ratchet.ledger.storage import LEDGER_FILE, POINTER_FILE, storage_url

    try:
        url = storage_url(storage)
        if url is not None:
            from ratchet.ledger.sql import SQLAlchemyLedger, display_url
            from ratchet.ledger.sql import list_runs as runs_in

            where = display_url(url, password=True)
            runs = [(run_id, lambda run_id=run_id: _project(SQLAlchemyLedger(url, run_id, readonly=True), run_id))
                    for run_id, _ in runs_in(url)]
        else:
            root = Path(runs_dir)
            where = str(root)
            if root.exists() and not root.is_dir():
                raise RunNotFoundError(f"--runs-dir {root} is a file; runs live in the folder `ratchet run --runs-dir` used")
            dirs = sorted(p for p in root.iterdir() if (p / LEDGER_FILE).is_file() or (p / POINTER_FILE).is_file()) \
                if root.is_dir() else []
            runs = [(d.name, lambda d=d: _load_state(str(d), ".")[0]) for d in dirs]
    except RatchetError as exc:
        _fail(exc)
        return
    if not runs:
        out.print(f"no runs in {where}", highlight=False, soft_wrap=True)
        return
    rows: list[tuple[str, ...]] = []
    for name, load in runs:
        try:
            st = load()
        except StorageNotNamedError as exc:  # a pointer to a database this command does not name: never opened
            rows.append((name, f"in {_safe(exc.where, 200)} (not opened: pass --storage URL to open it)",
                         "", "", "", "", "", ""))
            continue
        except Exception as exc:  # noqa: BLE001 - one damaged run must not hide the others
            rows.append((name, f"unreadable: {_safe(str(exc), 80)}", "", "", "", "", "", ""))
            continue
        test = st.test or {}
        sr = test.get("success_rate")
        rows.append((st.run_id, st.status_text, st.task_name, str(st.generations),
                     " · ".join(f"{n:,} {word}" for word, n in st.used()[:1]), _num(st.incumbent_validation_mean),
                     _num(test.get("mean")),
                     "–" if sr is None else f"{100 * sr:.1f} %"))
    _print_runs(rows)


_RUNS_COLUMNS = ("run", "status", "task", "gens", "used", "incumbent val", "test mean", "test success")


def _print_runs(rows: list[tuple[str, ...]]) -> None:
    """One table row per run when the table fits the terminal; otherwise (a narrow terminal, a long run
    id) one block per run: the id on its own line, then its values, so nothing is squeezed away."""
    t = Table()
    for col in _RUNS_COLUMNS:
        t.add_column(col, justify="left" if col in ("run", "status", "env") else "right", no_wrap=True)
    for row in rows:
        t.add_row(*row)
    if Measurement.get(out, out.options.update_width(10**6), t).maximum <= out.width:  # its natural width
        out.print(t)
        return
    for row in rows:
        out.print(row[0], highlight=False, soft_wrap=True)
        labelled = [f"{col} {v}" for col, v in zip(_RUNS_COLUMNS, row) if v]
        for part in ([v for v in row[1:3] if v] + labelled[3:5], labelled[5:]):  # two lines of ≈ 60 characters
            if part:
                out.print("  " + " · ".join(part), highlight=False, soft_wrap=True)


def _num(x: Any) -> str:
    from ratchet.progress import score_text

    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else score_text(x)


@app.command()
def dashboard(runs_dir: str = RUNS_DIR_OPT,
              storage: str | None = typer.Option(
                  None, "--storage", envvar="RATCHET_STORAGE", metavar="URL",
                  help="List the runs kept in this database (postgresql://USER@HOST[:PORT]/DB or sqlite:///PATH) "
                       "instead of the run directories in --runs-dir."),
              host: str = typer.Option("127.0.0.1", "--host", metavar="HOST",
                                       help="Interface to listen on. The default serves this machine only; the URL's "
                                            "token is the page's only protection elsewhere."),
              port: int = typer.Option(0, "--port", min=0, max=65535, metavar="PORT",
                                       help="Port to listen on (0: a free one).")) -> None:
    """Serve a live, read-only web page over the runs' ledgers: every run, one run's curves and decisions, two runs
    side by side. Prints the URL (with its token) and serves until Ctrl-C."""
    try:
        from ratchet.dashboard import DashboardServer
    except ImportError as exc:
        _fail(RatchetError(f"the dashboard needs starlette and uvicorn ({exc}): pip install starlette uvicorn"))
        return
    try:
        server = DashboardServer(runs_dir, storage, host, port)
    except RatchetError as exc:
        _fail(exc)
        return
    except OSError as exc:
        _fail(RatchetError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host, or pick another "
                           "--port"))
        return
    out.print(f"ratchet dashboard over {server.dashboard.source.where}: {server.url}", highlight=False, soft_wrap=True)
    if storage is None and not Path(runs_dir).is_dir():
        err.print(f"warning: no folder {runs_dir} (yet): the page lists runs there once `ratchet run --runs-dir "
                  f"{runs_dir}` makes them; a typo? ", highlight=False, soft_wrap=True)
    if server.exposed:
        err.print(f"warning: --host {host} lets other machines reach the page over plain HTTP; the token in the URL is "
                  "its only protection (prefer the default 127.0.0.1 and an SSH tunnel: ssh -L PORT:127.0.0.1:PORT)",
                  highlight=False, soft_wrap=True)
    out.print("(read-only; Ctrl-C stops it)", highlight=False)
    server.run()


@app.command()
def show(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."), runs_dir: str = RUNS_DIR_OPT,
         as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
         storage: str | None = STORAGE_OPT) -> None:
    """Show a run's status, budget used, incumbent and test results."""
    from ratchet.loop import open_run

    try:
        ledger, run_dir = open_run(run, runs_dir, storage=storage, readonly=True)
        st = _project(ledger, run)
    except RatchetError as exc:
        _fail(exc)
        return
    data = st.to_json()
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    t = Table(show_header=False, title=f"run {st.run_id}")
    t.add_column("key")
    t.add_column("value")
    data["status"] = st.status_text
    for k in ("status", "task", "stop_reason", "generations", "used", "wall_clock_s", "promotions", "error"):
        if k == "used":  # in the task's words: env steps and episodes, an evaluator's cost unit and instances
            on_validation = f" ({st.validation_env_steps:,} {st.cost_unit} on validation)"
            t.add_row(k, " · ".join(f"{word} {n:,}" + (on_validation if word == st.cost_unit else "")
                                    for word, n in st.used()))
        elif data.get(k) is not None:
            t.add_row(k, _safe(data[k]))
    if data["execution"]:
        ex = data["execution"]
        t.add_row("execution", ", ".join(f"{k} {v}" for k, v in ex.items() if k != "backend") + f" ({ex['backend']})")
    t.add_row("incumbent", f"{data['incumbent']['candidate_id']} (validation mean {_num(data['incumbent']['validation_mean'])})")
    if data["incumbent"].get("params"):
        from ratchet.policy import describe_value  # arrays as one summary line each, not one row per element

        t.add_row("incumbent params", "\n".join(f"{k} {describe_value(v)}" for k, v in data["incumbent"]["params"].items()))
    if data["incumbent"]["artifacts"]:  # a network: one summary line per artifact, never its numbers
        from ratchet.policies import describe_artifact

        try:
            blobs = _artifacts_of(run, runs_dir, storage, [st.candidate(st.incumbent_id)])
        except RatchetError:
            blobs = {}
        t.add_row(f"incumbent {data['incumbent']['kind']}",
                  "\n".join(_safe(describe_artifact(role, blobs.get(h))) for role, h in data["incumbent"]["artifacts"].items()))
    rule = _success_rule(st)
    for k in ("baseline_test", "test"):
        s = data[k]
        if s:
            sr = "" if s["success_rate"] is None else f", success {100 * s['success_rate']:.1f} %"
            t.add_row(k, f"{_num(s['mean'])} ± {_num(s['std'])} on {s['n']} episodes{sr}")
    if rule and any(data[k] and data[k]["success_rate"] is not None for k in ("baseline_test", "test")):
        t.add_row("success", rule)
    if data["world_model"]:  # [model] screen: what the screen saved and how well it predicted
        from ratchet.ledger.projection import world_model_text

        t.add_row("world model", _safe(world_model_text(data["world_model"]), 1000))
    if data["league"]:  # a game's self-play league: who joined, and the meta-strategy training draws from
        last = data["league"][-1]
        member = {x.get("incumbent"): f"league{i + 1}" for i, x in enumerate(data["league"])}
        who = ", ".join(f"{name} {str(cid)[:12]}{' (start)' if i == 0 else ''}"
                        for i, (cid, name) in enumerate(member.items()))
        meta = ", ".join(f"{k} {v:.2f}" for k, v in (last.get("meta_strategy") or {}).items())
        t.add_row("league", _safe(f"{who} (the start and each promoted incumbent) joined the training opponents; "
                                  f"meta-strategy now {meta or 'uniform (no payoff table before a promotion)'}", 1000))
        if last.get("rows"):
            header = "row \\ column: " + " ".join(last["columns"])
            lines = [f"{member.get(r, str(r)[:12])}: " + " ".join(f"{x:+.2f}" for x in row)
                     for r, row in zip(last["rows"], last["table"])]
            t.add_row("league payoffs", _safe("\n".join([header, *lines]), 3000, multiline=True))
    if data["test_by_opponent"]:  # a game: the payoff row against each test opponent, worst first
        t.add_row("test by opponent", _safe("\n".join(
            f"{o['opponent']}: {_num(o['start_mean'])} → {_num(o['final_mean'])} "
            f"({o['wins']} W / {o['draws']} D / {o['losses']} L of {o['n']})" for o in data["test_by_opponent"]),
            2000, multiline=True))
    from ratchet.ledger.projection import llm_usage_text
    from ratchet.proposals import describe_value_changes

    for change in data["code_changes"]:  # structural promotions: the code's structure apart from its tuned values
        gen, structure = change["generation"], change.get("structure_diff")
        if structure is None:  # recorded by an older ratchet: one diff, numbers included
            t.add_row(f"code change, gen {gen}", _safe(change["diff"], 4000, multiline=True))
            continue
        t.add_row(f"code change, gen {gen}", _safe(structure or "(none: only tuned values changed)", 4000,
                                                   multiline=True))
        if describe_value_changes(change.get("value_changes")):
            t.add_row(f"tuned values, gen {gen}", _safe(describe_value_changes(change["value_changes"]), 2000,
                                                        multiline=True))
    for name, usage in data.get("llm_usage", {}).items():  # what each LLM refiner asked its endpoint and spent
        t.add_row(f"llm usage ({name})", _safe(llm_usage_text(usage) + f"\nprompts and answers: ratchet llm-log {run}",
                                               2000, multiline=True))
    if data["rejected_proposals"]:
        from ratchet.ledger.projection import rejection_counts_text

        t.add_row("rejected proposals", f"{data['rejected_proposals']} "
                                        f"({rejection_counts_text(data['rejected_proposal_reasons'])})")
    if data["endpoint_failures"]:  # requests that got no answer: the endpoint's outcome, not a proposal's
        t.add_row("endpoint failures", _safe(f"{data['endpoint_failures']} request(s) to the LLM endpoint got no "
                                             "answer: " + "; ".join(f"{r['reason']} (×{r['count']})"
                                                                    for r in data["endpoint_failure_reasons"]),
                                             1000))
    if data.get("final_decision"):  # what the budget's end decided (powered, or [planner] final)
        fd = data["final_decision"]
        t.add_row("final decision", _safe(_final_decision_text(fd), 500))
    if data.get("env_steps_breakdown"):
        outside = " (person and correction: outside the budget)" if data["corrections"] else ""
        t.add_row(f"{st.cost_unit} went to", " · ".join(f"{k} {v:,}" for k, v in data["env_steps_breakdown"].items()
                                                 if v is not None) + outside)
    for c in data["corrections"]:  # a person's rounds after the run finished (ratchet correct)
        if c["status"] == "finished":
            verdict = (f"student {c['student_id'] or '–'}: {'promoted' if c['promoted'] else 'not promoted'} — "
                       f"{c['reason']}")
        elif c["retrain"]:
            verdict = f"not yet retrained and gated: `ratchet correct {run} --resume-round`"
        else:
            verdict = f"recorded only (--no-retrain); `ratchet correct {run} --resume-round` retrains and gates it"
        t.add_row(f"correction round {c['round']}",
                  _safe(f"{c['who']} controlled {c['person_steps']:,} of {c['env_steps']:,} env steps in "
                        f"{c['episodes']} episode(s) of {c['candidate_id']}\n{verdict}", 1000, multiline=True))
    if data["failed_episodes"]:  # episodes that raised, timed out or failed to load: which candidates, and why
        from ratchet.ledger.projection import episode_failures_text

        t.add_row("failed episodes", _safe(episode_failures_text(data["failed_episodes"], run), 2000, multiline=True))
    from ratchet.advice import determinism_notes, run_advice

    for line in determinism_notes(st):  # a deterministic task's decisions, or a hint to declare one
        t.add_row("determinism", _safe(line, 1000))
    if st.status == "finished":
        for line in run_advice(st):
            t.add_row("advice", _safe(line, 1000))
    if data["test_worst_seeds"]:
        t.add_row("worst test seeds", ", ".join(map(str, data["test_worst_seeds"])) + "  (ratchet replay RUN --seed S)")
    if run_dir.is_dir():
        t.add_row("directory", str(run_dir))
    t.add_row("ledger", ledger.location)
    if (run_dir / "report.html").is_file():
        t.add_row("report", str(run_dir / "report.html"))
    out.print(t)


@app.command()
def report(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."), runs_dir: str = RUNS_DIR_OPT,
           output: Path | None = typer.Option(None, "-o", "--output", parser=_file_name, metavar="FILE",
                                              help="Output file (default RUN/report.html)."),
           videos: bool = typer.Option(True, "--videos/--no-videos",
                                       help="Render one GIF per top failure mode (re-runs those episodes)."),
           force: bool = typer.Option(False, "--force", help="Overwrite an existing --output file."),
           storage: str | None = STORAGE_OPT) -> None:
    """Write a self-contained HTML report (opens offline)."""
    try:
        st, run_dir = _load_state(run, runs_dir, storage)
        if output is not None:
            _check_output(output, force, "--output")
        try:
            if output is None:  # a run found only in the database gets its run directory here
                run_dir.mkdir(parents=True, exist_ok=True)
            path = _write_report(st, run_dir, output or run_dir / "report.html", videos, run, runs_dir, storage)
        except OSError as exc:
            raise RatchetError(f"cannot write the report: {_cannot_write(exc)}") from None
    except RatchetError as exc:
        _fail(exc)
        return
    out.print(f"report: {path}", highlight=False, soft_wrap=True)


@app.command()
def evaluate(policy: Path | None = typer.Argument(None, metavar="[POLICY]", help="Policy .py file (PARAMETERS + act), or a source policy's folder with --spec; or give --run."),
             env: str | None = typer.Option(None, "--env", help="Gymnasium env id, e.g. LunarLander-v3 "
                                                                   "(or take the task from --spec)."),
             spec_path: Path | None = typer.Option(None, "--spec", help="A ratchet.toml whose [task] to use: env "
                                                      "id, env_kwargs, max_episode_steps, action mode."),
             clip: bool = typer.Option(False, "--clip", help="With --env: clip actions into a Box action space "
                                                              "(as [task] action = \"clip\"); default an action "
                                                              "outside it ends the episode as an error."),
             seeds: str | None = typer.Option(None, "--seeds", help="Explicit seeds: '1,2,3', or a file of seeds "
                                                 "(commas or whitespace; '#' starts a comment); instead of "
                                                 "--seed/--episodes."),
             episodes: int = typer.Option(10, "--episodes", "-n", min=1, help="Number of episodes (at most 100000)."),
             seed: int = typer.Option(0, "--seed", min=0, help="First seed; episodes use seed, seed+1, …"),
             workers: int = typer.Option(0, "--workers", min=0, help="Worker processes (0 = one per core; at most 1024)."),
             timeout: float | None = typer.Option(None, "--timeout", min=0.001,
                                                  help="Per-episode timeout (seconds, at most 86400; default: the "
                                                       "spec's [execution] episode_timeout_s with --spec, else 60)."),
             run: str | None = typer.Option(None, "--run", help="Evaluate a run's candidate (any policy kind: "
                                               "program, mlp, sb3, residual, source) instead of a policy file; the task is "
                                               "the run's unless --env or --spec is given."),
             candidate: str | None = typer.Option(None, "--candidate", help="With --run: candidate id (or prefix); "
                                                     "default the incumbent."),
             runs_dir: str = RUNS_DIR_OPT, storage: str | None = STORAGE_OPT) -> None:
    """Evaluate a policy file with its default parameters, or a run's candidate (--run), and print a table."""
    from collections import Counter

    from ratchet.critic import Evaluation
    from ratchet.execution import Job, make_executor
    from ratchet.spec import MAX_EPISODES, MAX_TIMEOUT_S, MAX_WORKERS
    from ratchet.task import GymTask
    from ratchet.tasks import task_from_spec

    try:
        if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
            raise RatchetError(f"--timeout {timeout:g}: give a per-episode limit in seconds, at most {MAX_TIMEOUT_S:g}")
        if episodes > MAX_EPISODES:
            raise RatchetError(f"--episodes {episodes}: at most {MAX_EPISODES}; evaluate in several batches with --seed")
        if workers > MAX_WORKERS:
            raise RatchetError(f"--workers {workers}: at most {MAX_WORKERS}")
        if seed + episodes > 2**63:
            raise RatchetError(f"--seed {seed}: seeds must stay below 2**63; give a smaller --seed")
        if seeds is not None and (episodes != 10 or seed != 0):
            raise RatchetError("--seeds gives the seeds itself; leave out --episodes and --seed")
        seed_list = _parse_seeds(seeds) if seeds is not None else list(range(seed, seed + episodes))
        from ratchet.loop import load_program

        if (policy is None) == (run is None):
            raise RatchetError("give a policy file, or a run's candidate with --run RUN [--candidate ID] (one of the two)")
        if candidate is not None and run is None:
            raise RatchetError("--candidate picks a candidate of --run; give --run RUN too")
        if env is not None and spec_path is not None or (run is None and env is None and spec_path is None):
            raise RatchetError("give the environment with --env ID or a spec's [task] with --spec ratchet.toml "
                               "(one of the two)")
        if clip and env is None:
            raise RatchetError("--clip goes with --env; with --spec set [task] action = \"clip\" in the spec")
        if spec_path is not None:
            from ratchet.spec import load_spec

            loaded = load_spec(spec_path)
            task = task_from_spec(loaded.task)
            timeout = loaded.execution.episode_timeout_s if timeout is None else timeout
        elif env is not None:
            task = GymTask(env, action_mode="clip" if clip else "error")
        blobs: dict[str, bytes] = {}
        if run is not None:
            st, _ = _load_state(run, runs_dir, storage)
            cand = _candidate_of(st, candidate)
            blobs = _artifacts_of(run, runs_dir, storage, [cand])
            if env is None and spec_path is None:
                task = _task_of(st)
            label = f"candidate {cand.id} ({cand.kind}) of run {st.run_id}"
        else:
            assert policy is not None  # checked above: a policy file or --run
            from ratchet.policy import FOLDER_KINDS

            if spec_path is not None and loaded.policy.kind in FOLDER_KINDS:  # a folder, built as the spec says
                from ratchet.loop import load_start

                folder = loaded.policy.model_copy(update={"path": str(Path(policy).resolve())})
                cand = load_start(loaded.model_copy(update={"policy": folder}), task)[1]
            else:
                cand = load_program(policy, task).candidate()
            label = str(policy)
        task.dims()  # the env, made once with no policy code: setup problems fail here, in one line
        pools = task.seed_pools()
        if pools is not None:  # a data set: seeds are its instance numbers
            known = {s for pool in pools.values() for s in pool}
            outside = [s for s in seed_list if s not in known]
            if outside:
                raise RatchetError(f"seed {outside[0]} is not an instance of {task.name}'s data set (instance numbers "
                                   f"{min(known)}..{max(known)}); give seeds among them")
        ex = make_executor(workers, 60.0 if timeout is None else timeout)
        try:
            eps = ex.run(task, [Job(cand, s, blobs) for s in seed_list])
        finally:
            ex.close()
        fault = next((e for e in eps if e.diagnostics.get("fault")), None)
        if fault is not None:  # the evaluator's own failure: not a score of the policy
            raise TaskError(f"{fault.error} — the task's fault, not the policy's; nothing was scored")
    except RatchetError as exc:
        _fail(exc)
        return
    ev = Evaluation(cand.id, "evaluate", tuple(eps))
    title = f"{label} on {task.name}"
    t = Table(title=title, min_width=min(len(title), out.width))  # a narrow table would wrap its title
    scored = task.return_name == "score"  # an evaluator's: one call per instance, a score and its cost, no env endings
    # how the task labelled a failing episode (an evaluator's ``failure``): a column of its own, and counted below
    labels = Counter(str(e.diagnostics["failure"]) for e in eps if e.diagnostics.get("failure"))
    cols = (("instance", "score", "cost", "success", *(("failure",) if labels else ()), "error") if scored
            else ("seed", "return", "length", "terminated", "truncated", "success",
                  *(("failure",) if labels else ()), "error"))
    for col in cols:
        t.add_column(col, justify="right" if col in cols[:3] else "left")
    for e in eps[:50]:
        success = "–" if e.success is None else str(e.success)  # as run and show write "no success defined"
        endings = () if scored else (str(e.terminated), str(e.truncated))
        failure = (_safe(str(e.diagnostics.get("failure") or "")),) if labels else ()
        t.add_row(str(e.seed), f"{e.episode_return:.2f}", str(e.length), *endings, success, *failure,
                  _safe(e.error or ""))
    if len(eps) > 50:
        t.add_row("…", *[""] * (len(cols) - 2), f"{len(eps) - 50} more")
    out.print(t)
    s = ev.summary()
    sr = "" if s["success_rate"] is None else f" · success {100 * s['success_rate']:.1f} %"
    over = f"{s['n']} {'instances' if scored else 'episodes'}"
    out.print(f"mean {s['mean']:.2f} ± {s['std']:.2f} (std) over {over}{sr} · errors {s['n_errors']} · "
              f"{s['env_steps']:,} {task.cost_unit}", soft_wrap=True)
    if s["success_rate"] is not None and task.success_rule():
        out.print(f"success: {task.success_rule()}", highlight=False, soft_wrap=True)
    if labels:
        out.print("failures: " + ", ".join(f"{_safe(name)} {n}" for name, n in labels.most_common(10))
                  + (f", {len(labels) - 10} more labels" if len(labels) > 10 else ""), highlight=False, soft_wrap=True)
    if run is not None and seeds is None:  # the seeds above are this command's, which a user may take for the run's
        out.print(f"(seeds {seed_list[0]}..{seed_list[-1]} from --seed/--episodes, not the run's test seeds: `ratchet "
                  "show` gives the run's test mean)", highlight=False, soft_wrap=True)
    if s["n_errors"] == s["n"]:
        clipped = env is not None and " outside bounds " in str(eps[0].error)  # --clip is the --env way to say it
        _fail(RatchetError(f"every episode failed (first: {eps[0].error}); fix the policy"
                           + (" or pass --clip" if clipped else "") + " and evaluate again"))


_MAX_SEEDS_FILE_BYTES = 4 << 20  # 100,000 seeds (spec.MAX_EPISODES) of 19 digits and a separator: 2 MB


def _parse_seeds(text: str) -> list[int]:
    """``--seeds``: a comma/space separated list, or the name of a file holding one (a pipe too, ``<(seq 1 9)``; at
    most :data:`_MAX_SEEDS_FILE_BYTES` bytes read).

    Raises:
        RatchetError: not whole numbers in [0, 2**63), none, more than the episode limit, or a file larger than
            :data:`_MAX_SEEDS_FILE_BYTES` (``/dev/zero``).
    """
    from ratchet.spec import MAX_EPISODES

    source = text
    path = Path(text)
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError:  # a name too long to be a file's (a long list)
        is_dir = is_file = False
    if is_dir:
        raise RatchetError(f"--seeds {text} is a folder; give seeds like 1,2,3 or a file of them")
    # a file that exists, or a name that cannot be a list (no comma or space, not starting like a number)
    listed = all(ch.isdigit() or ch in ",+-" or ch.isspace() for ch in text)
    looks_listed = text[:1].isdigit() or text[:1] in "+-" or any(ch == "," or ch.isspace() for ch in text)
    if not listed and (is_file or not looks_listed):
        try:
            with path.open("rb") as f:  # a bounded read: /dev/zero or an endless pipe is refused, not read into memory
                raw = f.read(_MAX_SEEDS_FILE_BYTES + 1)
            if len(raw) > _MAX_SEEDS_FILE_BYTES:
                raise RatchetError(f"--seeds {text}: the seeds file is too large (over {_MAX_SEEDS_FILE_BYTES:,} "
                                   f"bytes; {MAX_EPISODES:,} seeds, the most evaluated, fit in half of that)")
            source = raw.decode("utf-8")
        except FileNotFoundError:
            raise RatchetError(f"--seeds {text}: no such file; give seeds like 1,2,3 or a file of them") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RatchetError(f"--seeds {text}: cannot read the file ({type(exc).__name__})") from None
        source = "\n".join(line.split("#", 1)[0] for line in source.splitlines())  # '#' starts a comment
    parts = [p for p in source.replace(",", " ").split() if p]
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            if p.lstrip("+-").isdigit():  # more digits than Python converts (4,300): far out of range
                raise RatchetError("--seeds: seeds must be in [0, 2**63)") from None
            raise RatchetError(f"--seeds: {p[:40]!r} is not a whole number; give seeds like 1,2,3 or a file of "
                               "them") from None
    if not out:
        raise RatchetError("--seeds: no seeds given; give seeds like 1,2,3 or a file of them")
    if len(out) > MAX_EPISODES:
        raise RatchetError(f"--seeds: {len(out)} seeds, at most {MAX_EPISODES}")
    if any(not 0 <= x < 2**63 for x in out):
        raise RatchetError("--seeds: seeds must be in [0, 2**63)")
    return out


@app.command()
def replay(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."),
           seed: int = typer.Option(..., "--seed", help="Seed of a recorded episode."),
           candidate: str | None = typer.Option(None, "--candidate", help="Candidate id (or prefix); default the incumbent."),
           video: Path | None = typer.Option(None, "--video", parser=_file_name, metavar="FILE",
                                              help="Also render the episode to a .gif or .mp4."),
           force: bool = typer.Option(False, "--force", help="Overwrite an existing --video file."),
           runs_dir: str = RUNS_DIR_OPT, storage: str | None = STORAGE_OPT) -> None:
    """Re-run one recorded episode and check its return against the ledger, bit for bit."""
    from ratchet.execution import REPLAY_MARGIN, Job, replay_timeout_s
    from ratchet.execution.process import ProcessExecutor

    try:
        st, _ = _load_state(run, runs_dir, storage)
        cand = _candidate_of(st, candidate)
        recorded, where = None, 0
        seen: list[int] = []
        for i, ev in enumerate(st.evaluations):
            if ev["candidate_id"] == cand.id:
                for e in ev["episodes"]:
                    seen.append(e["seed"])
                    if e["seed"] == seed:
                        recorded, where = e, i
        if recorded is None:
            hint = ", ".join(map(str, seen[:5])) or "none"
            raise RunNotFoundError(f"candidate {cand.id} has no recorded episode with seed {seed}; recorded seeds "
                                   f"include {hint}")
        task = _task_of(st, where)  # as it was then: a game's league may have grown since
        if video is not None:
            try:
                task.make_env(render_mode="rgb_array").close()
            except TaskError:  # an evaluator's instances, a game's board: no environment to render
                raise RatchetError(f"--video: {task.name} has no environment, so no frames to record; its episodes' "
                                   "diagnostics are in `ratchet critique` and the report") from None
            if video.suffix.lower() not in (".gif", ".mp4"):
                raise RatchetError(f"--video must end in .gif or .mp4, got {video.name}")
            _check_output(video, force, "--video")
            if video.suffix.lower() == ".mp4":
                try:
                    import imageio_ffmpeg  # noqa: F401
                except ImportError:
                    raise RatchetError(f"--video .mp4 needs ffmpeg: {_install_hint('video')}; or write a .gif") \
                        from None
            try:
                video.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                raise RatchetError(f"--video {video}: cannot create its folder") from None
            if video.is_dir():
                raise RatchetError(f"--video {video} is a folder; give a file name")
        blobs = _artifacts_of(run, runs_dir, storage, [cand])
        run_limit = float(st.spec["execution"]["episode_timeout_s"])
        limit = replay_timeout_s(run_limit)
        ex = ProcessExecutor(workers=1, episode_timeout_s=limit)
        err.print(f"replaying candidate {cand.id} on seed {seed} (at most {limit:g} s: {REPLAY_MARGIN:g}× the run's "
                  f"episode_timeout_s of {run_limit:g} s, for a slower replaying machine)", highlight=False,
                  soft_wrap=True)
        try:
            ep = ex.run(task, [Job(cand, seed, blobs)], render_paths=[str(video.resolve()) if video else None])[0]
        finally:
            ex.close()
        out.print(f"candidate {cand.id} seed {seed}: return {ep.episode_return!r} ({ep.length} {task.cost_unit}, "
                  f"terminated={ep.terminated}, truncated={ep.truncated}); ledger {recorded['episode_return']!r}",
                  soft_wrap=True)
        same = ep.episode_return == recorded["episode_return"] and ep.length == recorded["length"]
        if ep.error and not (recorded.get("error") and same):  # an error the ledger recorded too is a reproduction
            raise ReplayMismatchError(f"replay failed: {ep.error}")
        if not same:
            raise ReplayMismatchError(f"replay differs from the ledger: return {ep.episode_return!r} vs "
                                      f"{recorded['episode_return']!r}; check package versions against `ratchet show`")
        out.print(Text.assemble(("match", "green"), ": identical return and length"
                                + (f", and the recorded error again: {' '.join(str(ep.error).split())[:200]}"
                                   if ep.error else "")))
        if video is not None:
            out.print(f"video: {video}", highlight=False, soft_wrap=True)
    except RatchetError as exc:
        _fail(exc)


def _source_checkout() -> Path | None:
    """The root of the source checkout ratchet runs from (an editable install of a clone), or None when it
    runs from an installed package."""
    root = Path(__file__).resolve().parents[2]  # src/ratchet/cli.py -> the clone
    try:
        return root if 'name = "policy-ratchet"' in (root / "pyproject.toml").read_text(encoding="utf-8") else None
    except (OSError, UnicodeDecodeError):
        return None


def _install_hint(extra: str) -> str:
    """How to install one of ratchet's extras (``"video"``): in a source checkout ``pip install -e
    ".[video]"`` there, with the package-index command beside it; else the package-index command."""
    index = f"pip install 'policy-ratchet[{extra}]'"
    root = _source_checkout()
    return index if root is None else f"pip install -e \".[{extra}]\" in the source checkout {root} (installed " \
                                      f"from a package index: {index})"


def _head(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of the regular file ``path`` (not the whole file); b"" where it cannot be read."""
    try:
        with path.open("rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _check_output(path: Path, force: bool, what: str) -> None:
    """Refuse to clobber a ledger ever, or any existing file without --force."""
    from ratchet.ledger.storage import LEDGER_FILE, POINTER_FILE

    if path.is_dir():
        raise RatchetError(f"{what} {path} is a folder; give a file name")
    if path.name.startswith(LEDGER_FILE) or path.name == POINTER_FILE or (path.is_file() and _head(path, 15) == b"SQLite format 3"):
        raise RatchetError(f"refusing to overwrite {path}: it is a run ledger; choose another output file")
    if path.exists() and not force:
        raise RatchetError(f"{path} exists; pass --force to overwrite it")


def _candidate_of(state, candidate: str | None):
    """The candidate named by id or unique prefix (default the incumbent).

    Raises:
        RunNotFoundError: no unique match.
    """
    cid = candidate or state.incumbent_id
    try:
        return state.candidate(cid)
    except KeyError:
        raise RunNotFoundError(f"no unique candidate {cid!r} in run {state.run_id}; `ratchet show {state.run_id} --json` "
                               "gives the incumbent and baseline ids") from None


def _task_of(state, evaluation: int | None = None):
    """The run's task as it ran evaluation number ``evaluation`` (:meth:`RunState.task_for`), or as it is now (a game's
    league grows with the run)."""
    from ratchet.tasks import task_from_dict, task_from_spec

    if evaluation is None:
        task = state.task_versions[-1][1] if state.task_versions else state.task
    else:
        task = state.task_for(evaluation)
    return task_from_dict(task) if task else task_from_spec(state.spec["task"])


def _artifacts_of(run: str, runs_dir: str, storage: str | None, candidates) -> dict[str, bytes]:
    """The bytes of the candidates' artifacts, by digest, from the run's ledger (empty for plain programs)."""
    from ratchet.ledger.artifacts import candidate_artifacts
    from ratchet.loop import open_run

    candidates = list(candidates)
    if not any(c.artifacts for c in candidates):
        return {}
    ledger, _ = open_run(run, runs_dir, storage=storage, readonly=True)
    try:
        return candidate_artifacts(ledger, candidates)
    finally:
        ledger.close()


@app.command("llm-log")
def llm_log(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."),
            last: int | None = typer.Option(None, "--last", min=1, help="Only the last N requests."),
            runs_dir: str = RUNS_DIR_OPT, storage: str | None = STORAGE_OPT) -> None:
    """Print the prompts a run's LLM refiners sent and the answers they got, oldest first, each with its
    tokens, cost, seconds, attempts and what became of the answer."""
    from ratchet.ledger.llm_log import format_exchange, llm_exchanges
    from ratchet.loop import open_run

    try:
        ledger, _ = open_run(run, runs_dir, storage=storage, readonly=True)
        try:
            events = ledger.read()
            exchanges = llm_exchanges(events, ledger.get_artifact, last)
        finally:
            ledger.close()
    except RatchetError as exc:
        _fail(exc)
        return
    if not exchanges:
        out.print(f"run {_safe(run, 200)} made no LLM requests", highlight=False, soft_wrap=True)
        return
    total = sum(e.type.value == "llm_call" for e in events)
    for i, x in enumerate(exchanges, total - len(exchanges) + 1):  # the answers are untrusted text: made safe
        sys.stdout.write(clean(format_exchange(x, i), None, multiline=True) + "\n\n")


@app.command()
def standin(host: str = typer.Option("127.0.0.1", "--host", help="Address to serve on."),
            port: int = typer.Option(8808, "--port", min=0, max=65535,
                                     help="Port to serve on (0: any free one; the line printed names it)."),
            latency: float = typer.Option(0.0, "--latency", min=0.0, metavar="S", help="Seconds each answer takes."),
            fail_rate: float = typer.Option(0.0, "--fail-rate", min=0.0, max=1.0, metavar="P",
                                            help="Share of requests answered HTTP 500 or 429 instead (drawn from "
                                                 "--seed)."),
            seed: int = typer.Option(0, "--seed", help="Seed of the answers' edits and of the failures.")) -> None:
    """Serve a stand-in chat-completions endpoint, to try the llm refiner without a model or an API key: each
    answer moves one number of the program it was sent by a small random step (an edit, not an idea). Runs until
    Ctrl-C."""
    from ratchet.refiners.standin import MODEL, StandIn

    try:
        server = StandIn(models=[MODEL], latency=latency, host=host, port=port, fail_rate=fail_rate, seed=seed,
                         start=False)
    except OSError as exc:
        _fail(RatchetError(f"cannot serve on {host}:{port}: {exc.strerror or exc}; pick another port with --port "
                           "(0: any free one)"))
        return
    out.print(f'stand-in endpoint at {server.url}: in a [[refiners]] table with kind = "llm", set base_url = '
              f'"{server.url}" and model = "{MODEL}" (no api_key_env needed); Ctrl-C stops it',
              highlight=False, soft_wrap=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    out.print(f"stand-in stopped after {len(server.requests)} requests", highlight=False, soft_wrap=True)


@app.command("import")
def import_(tool: str = typer.Argument(..., metavar="TOOL", help="The tool the example comes from: openevolve (an "
                                                                 "OpenEvolve example folder)."),
            folder: str = typer.Argument(..., metavar="FOLDER", help="The example's folder."),
            evaluator: str = typer.Option("evaluator.py", "--evaluator", help="The evaluator file in FOLDER."),
            program: str | None = typer.Option(None, "--program", help="The program file in FOLDER; default "
                                               "initial_program.py, else the one .py file with an EVOLVE-BLOCK."),
            force: bool = typer.Option(False, "--force", help="Overwrite FOLDER/ratchet.toml.")) -> None:
    """Write FOLDER/ratchet.toml that runs another tool's example as it is (its files unchanged)."""
    from ratchet.spec import load_spec
    from ratchet.tasks.openevolve import spec_text

    target = Path(folder) / "ratchet.toml"
    try:
        if tool != "openevolve":
            raise RatchetError(f"ratchet import: unknown tool {tool!r}; known: openevolve (ShinkaEvolve's contract "
                               "is not supported yet)")
        if target.exists() and not force:
            raise RatchetError(f"{target} exists; give --force to overwrite it")
        text = spec_text(folder, evaluator, program)
        target.write_text(text, encoding="utf-8")
        load_spec(target)  # what was written runs
    except (RatchetError, OSError) as exc:
        _fail(exc)
        return
    out.print(f"wrote {target}\nrun it: ratchet run {target}", highlight=False, soft_wrap=True)


@app.command()
def critique(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."),
             candidate: str | None = typer.Option(None, "--candidate", help="Candidate id (or prefix); default the incumbent."),
             split: str = typer.Option("validation", "--split", help="validation, test, train or league (its latest evaluation)."),
             runs_dir: str = RUNS_DIR_OPT,
             as_json: bool = typer.Option(False, "--json", help="Print the structured critique as JSON."),
             storage: str | None = STORAGE_OPT) -> None:
    """Diagnose a candidate's episodes: intervals, failure modes, regressions vs the incumbent."""
    from rich.markdown import Markdown

    from ratchet.critic import Critic

    try:
        if split not in ("validation", "test", "train", "league"):
            raise RatchetError(f"--split must be validation, test, train or league (a game league's games before a "
                               f"promotion), got {split!r}")
        st, _ = _load_state(run, runs_dir, storage)
        cand = _candidate_of(st, candidate)
        ev = st.evaluation(cand.id, split)
        if ev is None:
            raise RunNotFoundError(f"candidate {cand.id} has no {split} evaluation in run {st.run_id}"
                                   + ("; the test split is evaluated only when a run finishes" if split == "test" else ""))
        reference = st.incumbent_id if cand.id != st.incumbent_id else st.baseline_id
        ref_ev = st.evaluation(reference, split) if reference and reference != cand.id else None
        if ref_ev is not None and ref_ev.seeds != ev.seeds:
            ref_ev = None
        crit = Critic.for_task(_task_of(st)).critique(ev, ref_ev)
    except RatchetError as exc:
        _fail(exc)
        return
    if as_json:
        sys.stdout.write(json.dumps(crit.to_dict(), indent=2) + "\n")
        return
    out.print(Markdown(clean(crit.text, None, multiline=True)))
    if ref_ev is not None:  # under the critique it qualifies (its regressions), not above its header
        out.print(f"(regressions: compared seed by seed with "
                  f"{'the incumbent' if reference == st.incumbent_id else 'the starting policy'} {reference})",
                  highlight=False, soft_wrap=True)


@app.command()
def export(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory."),
           output: Path | None = typer.Option(None, "-o", "--output", parser=_file_name, metavar="FILE",
                                              help="File to write: the policy .py (program), the model .zip (sb3); an "
                                                   "mlp writes STEM.py + STEM.npz, a residual STEM.py + "
                                                   "STEM_correction.npz + STEM_residual.py, a source policy the "
                                                   "folder OUT/."),
           candidate: str | None = typer.Option(None, "--candidate", help="Candidate id; default the incumbent."),
           runs_dir: str = RUNS_DIR_OPT,
           force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
           storage: str | None = STORAGE_OPT,
           tensorboard: Path | None = typer.Option(
               None, "--tensorboard", help="Write the run's scalars from its ledger (each generation, each gate "
                                           "decision, the test means) as TensorBoard event files in DIR/RUN_ID, as "
                                           "[logging] tensorboard does while a run goes; points already there are "
                                           "skipped. With or without -o.")) -> None:
    """Write the refined policy back in the form it came in: a policy file whose defaults are the refined
    values, an SB3 .zip, or a network's .npz with a standalone NumPy program (see ratchet.policies.export).
    With --tensorboard, write the run's scalars for TensorBoard (see ratchet.metrics)."""
    from ratchet.policies.export import export_candidate, export_paths

    if output is None:
        if tensorboard is None:
            _fail(RatchetError("give -o FILE (the refined policy), --tensorboard DIR (the run's scalars), or both"))
            return
        _export_scalars(run, runs_dir, storage, tensorboard)
        return
    try:
        st, _ = _load_state(run, runs_dir, storage)
        cand = _candidate_of(st, candidate)
        paths = export_paths(cand, output)
        for path in paths:
            _check_output(path, force, "--output")
        blobs = _artifacts_of(run, runs_dir, storage, [cand])
        val = st.evaluation(cand.id, "validation")
        score = f" (validation mean {val.mean:.2f} on {val.n} episodes)" if val is not None else ""
        header = f"Exported by ratchet from run {st.run_id}, candidate {cand.id}{score}."
        try:
            export_candidate(cand, blobs, output, header=header, task=_task_of(st).to_dict())
        except OSError as exc:
            raise RatchetError(f"cannot write {output}: {_cannot_write(exc)}; check the folder exists and is writable") from None
    except RatchetError as exc:
        _fail(exc)
        return
    for path in paths:
        out.print(f"wrote {path}", highlight=False, soft_wrap=True)
    if tensorboard is not None:
        _export_scalars(run, runs_dir, storage, tensorboard)


def _export_scalars(run: str, runs_dir: str, storage: str | None, folder: Path) -> None:
    """``ratchet export --tensorboard``: the run's scalars into ``folder/RUN_ID`` (:func:`ratchet.metrics.write_run_scalars`)."""
    from ratchet.loop import open_run
    from ratchet.metrics import write_run_scalars
    from ratchet.runs import started_event

    try:
        ledger, _ = open_run(run, runs_dir, storage=storage, readonly=True)
        try:
            events = ledger.read()
            run_id = started_event(ledger).payload["run_id"]
        finally:
            ledger.close()
        target = folder / run_id
        try:
            n = write_run_scalars(events, target)
        except OSError as exc:
            raise RatchetError(f"--tensorboard: cannot write {target}: {exc.strerror or exc}; give a folder you can "
                               "write to") from None
    except RatchetError as exc:
        _fail(exc)
        return
    what = f"{n} point{'s' if n != 1 else ''}" if n else "nothing new (every point is there already)"
    out.print(f"wrote {what} to {target} (tensorboard --logdir {folder})", highlight=False, soft_wrap=True)


_CORRECT_HELP = "\n\n".join((  # noqa: FLY002 - one paragraph per string: Typer keeps a docstring's line breaks
    "A person's correction round in a finished run (HG-DAgger with a person as the expert).",
    ("Serves a local page (127.0.0.1, under a random token path, no internet assets) that plays the incumbent on "
     "fresh training seeds, rendered live; a mapped key takes over (LunarLander: the arrow keys), Enter hands back. "
     "In a task with no no-op action (CartPole: ← 0, → 1) the episode waits while you are in control and hold no "
     "key."),
    ("When the episodes are done, or on Ctrl-C (the episodes played to the end are kept; the one being played is "
     "dropped), the round goes into the run's ledger: the person's data set as an artifact and who controlled which "
     "steps. It then ends with retraining (behaviour cloning on the run's data plus the person's steps) and the "
     "run's gate: a better student becomes the incumbent, and the incumbent is evaluated on the test split again."),
    ("Each episode goes into the ledger as it ends: a process killed while the person plays (kill -9, a crash) "
     "loses only the episode being played, and --resume-round records the round from the finished ones. Once "
     "recorded, a round killed at any point is finished by --resume-round without asking the person again. A new "
     "round is refused while an earlier one is not finished."),
    ("The run is held (as `ratchet resume` holds it) from start to end. The person's and the round's env steps are "
     "recorded apart from the run's budget.")))


@app.command(help=_CORRECT_HELP)
def correct(run: str = typer.Argument(..., metavar="RUN", help="Run id or run directory (a finished run whose incumbent is an mlp "
                                                "policy)."),
            episodes: int | None = typer.Option(None, "--episodes", min=1, max=1000,
                                                   help="Episodes to play (default 5)."),
            output: Path | None = typer.Option(None, "-o", "--output", parser=_file_name, metavar="FILE",
                                                  help="Also write the person's data set to this .npz file (the "
                                                       "ledger keeps it in any case); checked before anything is "
                                                       "played, written after the round is recorded."),
            force: bool = typer.Option(False, "--force", help="Overwrite an existing --output file."),
            port: int | None = typer.Option(None, "--port", min=0, max=65535,
                                               help="Local port; 0 (the default) picks a free one."),
            interval_ms: int | None = typer.Option(None, "--interval-ms", min=10, max=5000,
                                                      help="Time between env steps (default 50)."),
            candidate: str | None = typer.Option(None, "--candidate", help="Candidate id to play and retrain from; "
                                                                             "default the incumbent."),
            retrain: bool = typer.Option(True, "--retrain/--no-retrain",
                                         help="End the round with retraining and gating (--no-retrain: record the "
                                              "round only; --resume-round finishes it later)."),
            resume_round: bool = typer.Option(False, "--resume-round",
                                              help="Finish the run's newest correction round that was recorded but "
                                                   "not retrained and gated (after a crash or --no-retrain); plays "
                                                   "nothing, so it takes none of --no-retrain, --output, --force, "
                                                   "--candidate, --episodes, --port, --interval-ms."),
            updates: int | None = typer.Option(None, "--updates", min=1, max=10**7,
                                                  help="Gradient steps of behaviour cloning; default the run's "
                                                       "correction refiner's, else 2000."),
            runs_dir: str = RUNS_DIR_OPT, storage: str | None = STORAGE_OPT) -> None:
    """A person's correction round in a finished run (see ``_CORRECT_HELP``, the command's help)."""
    import time as _time

    from ratchet.correct import CorrectionSession, serve
    from ratchet.correction_round import CorrectionRound
    from ratchet.ledger.storage import storage_url
    from ratchet.policies.mlp import load_weights

    session = server = rnd = None
    try:
        try:
            url_ = storage_url(storage)
            if url_ is not None and url_.split(":", 1)[0].split("+", 1)[0] not in ("sqlite", "postgresql"):
                raise RatchetError(f"--storage {url_.split('://', 1)[0]}://…: not a database URL; expected "
                                   "postgresql://USER@HOST[:PORT]/DATABASE or sqlite:///PATH")
            if resume_round:
                given = [o for o, on in (("--no-retrain", not retrain), ("--output", output is not None),
                                         ("--force", force), ("--candidate", candidate is not None),
                                         ("--episodes", episodes is not None), ("--port", port is not None),
                                         ("--interval-ms", interval_ms is not None)) if on]
                if given:
                    raise RatchetError(f"--resume-round plays nothing and retrains the recorded round; drop "
                                       f"{', '.join(given)}")
            elif output is not None:
                _check_output_path(output, force)
            if force and output is None:
                raise RatchetError("--force overwrites the --output file; give -o/--output too, or drop --force")
            episodes, port, interval_ms = episodes or 5, port or 0, interval_ms or 50
            rnd = CorrectionRound(run, runs_dir, storage=storage)
            pending = rnd.unfinished()
            if resume_round:
                if pending is None:  # a session killed while the person played: its finished episodes
                    eps = len(rnd.pending_episodes())
                    pending = rnd.record_pending()
                    if pending is None:
                        raise RatchetError(f"run {rnd.state.run_id} has no unfinished correction round")
                    out.print(f"correction round {pending}: recorded from the {eps} episode(s) finished before the "
                              "session ended", highlight=False, soft_wrap=True)
                _finish_round(rnd, pending, updates, run)
                return
            if pending is not None:
                raise RatchetError(f"correction round {pending} of run {rnd.state.run_id} was recorded but not "
                                   f"retrained and gated; finish it first: `ratchet correct {run} --resume-round`")
            cut = rnd.pending_episodes()
            if cut:
                raise RatchetError(f"correction round {rnd.next_round} of run {rnd.state.run_id} ended early with "
                                   f"{len(cut)} finished episode(s) kept; record and finish it first: "
                                   f"`ratchet correct {run} --resume-round`")
            cand = rnd.candidate(candidate)
            student = load_weights(rnd.artifact(cand.artifacts["weights"]))
            session = CorrectionSession(_task_of(rnd.state), student, rnd.seeds(episodes), round_no=rnd.next_round)
            try:
                server, url = serve(session, port=port, interval_ms=interval_ms)
            except OSError as exc:
                import errno

                session.close()
                hint = "; pass --port 0 to pick a free one" if port and exc.errno == errno.EADDRINUSE else ""
                raise RatchetError(f"cannot serve the page on port {port}: {exc.strerror or exc}{hint}") from None
        except RatchetError as exc:
            _fail(exc)
            return
        out.print(f"open {url} — keys: " + ", ".join(f"{k} → {v}" for k, v in session.keys.items())
                  + "; Enter hands back; Ctrl-C ends early (the episode being played is dropped)",
                  highlight=False, soft_wrap=True)
        kept = 0  # episodes already in the ledger (correction_episode): a killed process keeps them

        def keep_finished() -> int:
            with session.lock:
                finished = list(session.records)
            if len(finished) > kept:  # counted in the ledger: an append cut short by Ctrl-C is not made twice
                for i in range(len(rnd.pending_episodes()), len(finished)):
                    rnd.record_episode(cand, finished[i], session.episode_dataset(i))
            return len(finished)

        try:
            while not session.done:
                _time.sleep(0.2)
                kept = keep_finished()
            _time.sleep(1.0)  # the page's next request learns that the episodes are done
        except KeyboardInterrupt:
            out.print("stopped early; the episode being played is dropped", highlight=False, soft_wrap=True)
        except RatchetError:
            pass  # the ledger refused an episode: tried once more below, then said in one line
        finally:
            server.shutdown()
        try:
            kept = keep_finished()
        except RatchetError as exc:
            session.close()
            _fail(exc)
            return
        data = session.dataset(finished_only=True)
        records = list(session.records)
        session.close()
        try:
            if not records:
                raise RatchetError("no episode was played to the end; nothing recorded")
            n = rnd.record(cand, records, data, retrain=retrain)  # the ledger first: a failed write loses nothing
            person = sum(r["person_steps"] for r in records)
            steps = sum(r["length"] for r in records)
            out.print(f"correction round {n}: {len(records)} episode(s), {steps:,} env steps, {person:,} under your "
                      f"control; recorded in the run's ledger", highlight=False, soft_wrap=True)
            if output is not None:
                try:
                    output.write_bytes(data.to_bytes())
                except OSError as exc:
                    then = "retrain and gate it" if retrain else "retrain and gate it later"
                    raise RatchetError(f"cannot write {output}: {exc.strerror or exc}; round {n} is recorded in the "
                                       f"run's ledger all the same ({then}: `ratchet correct {run} --resume-round`)"
                                       ) from None
                out.print(f"wrote {output}", highlight=False, soft_wrap=True)
            if retrain:
                _finish_round(rnd, n, updates, run)
            else:
                out.print(f"retrain and gate it later: `ratchet correct {run} --resume-round`", highlight=False,
                          soft_wrap=True)
        except RatchetError as exc:
            _fail(exc)
    except KeyboardInterrupt:
        err.print(f"interrupted; what was recorded stays; finish the round with `ratchet correct {run} "
                  "--resume-round`", highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    finally:
        if rnd is not None:
            rnd.close()


def _check_output_path(path: Path, force: bool) -> None:
    """``--output`` checked before the person plays: an ``.npz`` file name in an existing, writable folder, not a
    ledger, and (without ``--force``) not an existing file.

    Raises:
        RatchetError: any of these fails.
    """
    import os

    _check_output(path, force, "--output")
    if path.suffix.lower() != ".npz":  # what np.load and a [[refiners]] demonstrations setting read
        raise RatchetError(f"--output {path}: a data set is written as .npz; give {path.with_suffix('.npz').name}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise RatchetError(f"--output {path}: no folder {folder}; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise RatchetError(f"--output {path}: not writable here; choose another file")


def _finish_round(rnd, n: int, updates: int | None, run: str) -> None:
    """Retrain and gate correction round ``n`` and say what the gate decided."""
    out.print(f"correction round {n}: retraining and gating…", highlight=False, soft_wrap=True)
    p = rnd.finish(n, updates=updates)
    verdict = ("promoted: the new incumbent is " + p["incumbent_id"] if p["promoted"]
               else "the incumbent stays " + p["incumbent_id"])
    test = p["test"]
    out.print(f"correction round {n}: student {p['student_id'] or '–'}; {_safe(p['reason'])}; {verdict} (test mean "
              f"{_num(test['mean'])} on {test['n']} episodes); `ratchet show {run}`", highlight=False, soft_wrap=True)


def main() -> None:
    """Console-script entry point. SIGTERM (``kill``, ``timeout``, a scheduler's stop) is handled like
    Ctrl-C: the run stops cleanly, its workers are stopped, and ``ratchet resume`` continues it."""
    import signal

    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    # Typer's UsageError (its own vendored click in recent Typer, click's in older ones), found without a
    # private import: BadParameter derives from it
    usage_error: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    try:
        code = app(standalone_mode=False)
    except usage_error as exc:  # a bad option value, a missing argument: one line, like the rest
        command = f" {exc.ctx.info_name}" if exc.ctx is not None and exc.ctx.parent is not None else ""
        message = _safe(exc.format_message(), 500).rstrip(".")
        err.print(Text.assemble(("error:", "red"), f" {message}; see `ratchet{command} --help`"), highlight=False,
                  soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
