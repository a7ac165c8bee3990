"""Shared helpers for benchmark scripts: machine description and RESULTS.md sections."""

from __future__ import annotations

import os
import platform
import re
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> str:
    """One line describing this machine (CPU model, cores, memory, Python, OS)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    return (f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}, {platform.system()} "
            f"{platform.release()}; measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``## name`` of RESULTS.md with ``body``."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nMeasured numbers; rerun the command in each section to reproduce.\n"
    section = f"## {name}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    RESULTS.write_text(text.rstrip() + "\n")


def plain_episode(module, env, params, seed: int) -> tuple[float, int]:
    """One episode as a user's own loop runs it (no ratchet): ``reset`` if the policy has one, then ``step`` with
    its ``act`` until the episode ends, a Box action passed as an array of the space's dtype (as ratchet passes it).
    Returns (return, env steps); closes ``env``."""
    import gymnasium as gym
    import numpy as np

    from ratchet.policy import bind_spaces, materialize

    p = materialize(params)
    bind_spaces(module, env.observation_space, env.action_space)
    box = env.action_space.dtype if isinstance(env.action_space, gym.spaces.Box) else None
    if hasattr(module, "reset"):  # the policy's own per-episode state (else its module holds none)
        module.reset(p, seed)
    obs, _ = env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        action = module.act(obs, p)
        if box is not None:
            action = np.asarray(action, dtype=box)
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        steps += 1
        if terminated or truncated:
            break
    env.close()
    return total, steps


def key_values(text: str) -> dict[str, int | float | str]:
    """``"factor=4,optimism=0.5,unscreened=all"`` → ``{"factor": 4, "optimism": 0.5, "unscreened": "all"}``: spec keys
    given on a benchmark's command line (a number where the value reads as one, ``true``/``false`` as booleans, else
    the word)."""
    out: dict[str, int | float | str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, value = (x.strip() for x in item.partition("="))
        if value in ("true", "false"):
            out[key] = value == "true"
            continue
        try:
            out[key] = float(value) if "." in value else int(value)
        except ValueError:
            out[key] = value
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> set[int]:
    """``pid`` and every process below it, from Linux /proc (workers run in sessions of their own, unreaped)."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(x) for x in (task / "children").read_text().split() if int(x) not in out]
            except (OSError, ValueError):
                pass
    return out


def own_cpu(pid: int, reaped: bool = False) -> float | None:
    """CPU seconds (user + system) ``pid`` itself has used (with ``reaped``, also its children's that it has
    waited for), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / _TICK
