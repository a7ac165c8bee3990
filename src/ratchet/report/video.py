"""Render example episodes of a finished run to GIFs for its report. The frames are recorded where the env
runs (:mod:`ratchet.tasks.recording`); this module only asks an executor for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["render_failure_examples"]


def render_failure_examples(state: Any, out_dir: str | Path, max_modes: int = 3,
                            timeout_s: float | None = None, artifacts: Mapping[str, bytes] | None = None,
                            note: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Render one example episode (GIF) per top test-split failure mode, before and after.

    Reads the failure modes stored with the finished run (``ratchet critique`` computes the same)
    and re-runs each mode's first example seed whose recorded episode did not error (an episode the ledger
    records as timed out or failed would only fail again, with no GIF) with the starting policy ("before") or
    the final incumbent ("after") in a worker process.

    Args:
        timeout_s: Wall-clock limit of each replay (seconds); default the run's ``episode_timeout_s`` with the
            margin of :func:`ratchet.execution.replay_timeout_s`.
        artifacts: The bytes of those candidates' artifacts by digest (network policies need them).
        note: Told what is replayed and its time limit before it starts.

    Returns:
        ``"<before|after>: <mode label>"`` -> GIF path, for the episodes that rendered.
    """
    from ratchet.execution import Job, replay_timeout_s
    from ratchet.execution.process import ProcessExecutor
    from ratchet.tasks import task_from_dict, task_from_spec

    out_dir = Path(out_dir)
    task = task_from_dict(state.task) if state.task else task_from_spec(state.spec["task"])
    if task.spaces()[0] is None:  # an evaluator task: no environment, no frames
        return {}
    wanted: list[tuple[str, Any, int, Path]] = []
    for tag, crit, cid in (("before", state.baseline_test_critique, state.baseline_id),
                           ("after", state.test_critique, state.incumbent_id)):
        if not crit or not cid:
            continue
        recorded = state.evaluation(cid, "test")
        errored = {e.seed for e in recorded.episodes if e.error} if recorded is not None else set()
        for i, mode in enumerate(crit.get("failure_modes", [])[:max_modes]):
            seeds = [int(s) for s in mode["example_seeds"] if int(s) not in errored]
            if seeds:
                wanted.append((f"{tag}: {mode['label']}", state.candidate(cid), seeds[0],
                               out_dir / f"failure-{tag}-{i + 1}.gif"))
    if not wanted:
        return {}
    limit = replay_timeout_s(state.spec["execution"]["episode_timeout_s"]) if timeout_s is None else timeout_s
    if note is not None:
        note(f"replaying {len(wanted)} episode(s) for the failure-mode GIFs, at most {limit:g} s each "
             "(--no-videos skips them)")
    ex = ProcessExecutor(workers=1, episode_timeout_s=limit)
    try:
        blobs = artifacts or {}
        jobs = [Job(c, s, {h: blobs[h] for h in c.artifacts.values() if h in blobs}) for _, c, s, _ in wanted]
        eps = ex.run(task, jobs, render_paths=[str(p.resolve()) for *_, p in wanted])
    finally:
        ex.close()
    return {label: path for (label, _, _, path), ep in zip(wanted, eps) if ep.error is None and path.is_file()}
