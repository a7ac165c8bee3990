"""Recording one episode while it runs, in the process that steps the env (a worker, or the trusted env host):
frames for ``ratchet replay --video`` and the report's GIFs, a trace (:mod:`ratchet.trace`), or the episode's transitions
for a world model (:mod:`ratchet.worldmodel.transitions`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ratchet.rollout import Episode, run_episode
from ratchet.trace import TRACE_SUFFIX, record_trace
from ratchet.worldmodel.transitions import TRANSITIONS_SUFFIX, record_transitions

__all__ = ["record_episode"]


class _FrameRecorder:
    """Minimal env proxy that keeps ``env.render()`` after ``reset`` and every ``step``."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.frames: list[Any] = []
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
    (:func:`ratchet.trace.record_trace`; ``env`` is then made without a render mode), ``.npz`` its transitions
    (:func:`ratchet.worldmodel.transitions.record_transitions`; no render mode either).
    """
    if str(path).endswith(TRACE_SUFFIX):
        return record_trace(env, module, params, seed, task, path)
    if str(path).endswith(TRANSITIONS_SUFFIX):
        return record_transitions(env, module, params, seed, task, path)
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
