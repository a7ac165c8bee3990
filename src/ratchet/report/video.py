"""Render example episodes of a finished run to GIFs for its report. The frames are recorded where the env
runs (:mod:`ratchet.tasks.recording`); this module only asks an executor for them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["render_failure_examples"]


def render_failure_examples(state: Any, out_dir: str | Path, max_modes: int = 3,
                            timeout_s: float = 120.0, artifacts: Mapping[str, bytes] | None = None) -> dict[str, Path]:
    """Render one example episode (GIF) per top test-split failure mode, before and after.

    Reads the failure modes stored with the finished run (``ratchet critique`` computes the same)
    and re-runs each mode's first example seed with the starting policy ("before") or the final
    incumbent ("after") in a worker process.

    Args:
        artifacts: The bytes of those candidates' artifacts by digest (network policies need them).

    Returns:
        ``"<before|after>: <mode label>"`` -> GIF path, for the episodes that rendered.
    """
    from ratchet.execution import Job
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
        for i, mode in enumerate(crit.get("failure_modes", [])[:max_modes]):
            if mode["example_seeds"]:
                wanted.append((f"{tag}: {mode['label']}", state.candidate(cid), int(mode["example_seeds"][0]),
                               out_dir / f"failure-{tag}-{i + 1}.gif"))
    if not wanted:
        return {}
    ex = ProcessExecutor(workers=1, episode_timeout_s=timeout_s)
    try:
        blobs = artifacts or {}
        jobs = [Job(c, s, {h: blobs[h] for h in c.artifacts.values() if h in blobs}) for _, c, s, _ in wanted]
        eps = ex.run(task, jobs, render_paths=[str(p.resolve()) for *_, p in wanted])
    finally:
        ex.close()
    return {label: path for (label, _, _, path), ep in zip(wanted, eps) if ep.error is None and path.is_file()}
