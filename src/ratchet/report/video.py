"""Render one episode to a GIF or MP4 (``ratchet replay --video``). Runs inside a worker process."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ratchet.rollout import Episode, run_episode

__all__ = ["record_episode"]


class _FrameRecorder:
    """Minimal env proxy that keeps ``env.render()`` after ``reset`` and every ``step``."""

    def __init__(self, env: Any) -> None:
        self.env, self.frames = env, []
        self.action_space = env.action_space

    def reset(self, **kwargs: Any) -> Any:
        out = self.env.reset(**kwargs)
        self.frames.append(self.env.render())
        return out

    def step(self, action: Any) -> Any:
        out = self.env.step(action)
        self.frames.append(self.env.render())
        return out


def record_episode(env: Any, module: Any, params: Mapping[str, float], seed: int, task: Any,
                   path: str, fps: int = 30) -> Episode:
    """Run one episode with ``env`` (made with ``render_mode="rgb_array"``) and write its frames.

    The episode runs through :func:`~ratchet.rollout.run_episode`, so its return equals a normal
    run's. ``path`` ending in ``.gif`` writes a GIF; ``.mp4`` needs ``imageio-ffmpeg``
    (``pip install 'policy-ratchet[video]'``); ``.json`` writes the episode's trace instead
    (:func:`ratchet.trace.record_trace`; ``env`` is then made without a render mode).
    """
    from ratchet.trace import TRACE_SUFFIX, record_trace

    if str(path).endswith(TRACE_SUFFIX):
        return record_trace(env, module, params, seed, task, path)
    import imageio.v2 as imageio

    rec = _FrameRecorder(env)
    ep = run_episode(rec, module.act, getattr(module, "reset", None), params, seed, task)
    frames = [f for f in rec.frames if f is not None]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".gif":  # every 2nd frame at half resolution keeps GIFs small
        small = [f[::2, ::2] for f in frames[::2][:300]]
        imageio.mimsave(out, small, duration=1000 * 2 / fps, loop=0)
    else:
        imageio.mimsave(out, frames, fps=fps)
    return ep


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
    from ratchet.task import GymTask

    out_dir = Path(out_dir)
    task = GymTask.from_spec(state.spec["task"])
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
