"""Reports of runs: a self-contained HTML file (:mod:`ratchet.report.html`) with failure-mode GIFs
(:mod:`ratchet.report.video`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["render_report", "report_candidates", "write_run_report"]


def report_candidates(state: Any) -> list[Any]:
    """The candidates a report shows and re-runs (the starting policy and the final incumbent), whose
    artifacts :func:`render_report` needs."""
    ids = dict.fromkeys(c for c in (state.baseline_id, state.incumbent_id) if c)
    return [state.candidate(c) for c in ids]


def render_report(state: Any, run_dir: Path, path: Path, videos: bool = True,
                  note: Callable[[str], None] | None = None, artifacts: Mapping[str, bytes] | None = None) -> Path:
    """Write the HTML report of a projected run state (``ratchet.ledger.projection.project``) to ``path``.

    With ``videos`` and a finished run, one example episode per top test failure mode is re-run in a
    worker and embedded as a GIF (into ``run_dir/videos``; ``note`` is told what it replays and its time limit
    first); when rendering fails the report is written without them and ``note`` is told why.

    Args:
        artifacts: The bytes of the :func:`report_candidates`' artifacts by digest
            (:func:`ratchet.ledger.artifacts.candidate_artifacts`): network policies are summarised from
            them and re-run with them. Not needed for plain programs.
    """
    from ratchet.report.html import write_report
    from ratchet.report.video import render_failure_examples

    gifs = {}
    if videos and state.status == "finished":
        try:
            gifs = render_failure_examples(state, Path(run_dir) / "videos", artifacts=artifacts, note=note)
        except Exception as exc:  # noqa: BLE001 - rendering needs pygame; the report is still useful without GIFs
            if note is not None:
                note(f"failure-mode GIFs skipped ({type(exc).__name__}: {exc})")
    return write_report(state, Path(path), gifs, artifacts)


def write_run_report(run: str | Path, runs_dir: str | Path = "runs", output: str | Path | None = None, *,
                     videos: bool = True, storage: str | None = None) -> Path:
    """Write a run's HTML report, as ``ratchet report`` does (it opens offline).

    Args:
        run: Run id or run directory.
        runs_dir: Folder that holds run directories.
        output: The HTML file to write; default ``RUN_DIR/report.html`` (overwritten).
        videos: Embed one GIF per top failure mode (re-runs those episodes in a sandboxed worker).
        storage: Database URL for runs kept in a database.

    Returns:
        The path written.

    Raises:
        RunNotFoundError: no such run.
        LedgerError: its ledger is damaged or unreachable.
    """
    from ratchet.ledger.artifacts import candidate_artifacts
    from ratchet.ledger.projection import project
    from ratchet.runs import open_run

    ledger, run_dir = open_run(run, runs_dir, storage=storage, readonly=True)
    try:
        state = project(ledger.read())
        blobs = candidate_artifacts(ledger, report_candidates(state))
    finally:
        ledger.close()
    if output is None:
        run_dir.mkdir(parents=True, exist_ok=True)
    return render_report(state, run_dir, Path(output) if output is not None else run_dir / "report.html", videos,
                         artifacts=blobs)
