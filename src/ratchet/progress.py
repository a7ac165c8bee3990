"""Progress reporting for runs: the callback ``start_run(..., progress=...)`` takes, and a ready one.

After every generation the loop calls ``progress(info)`` with a dict (see :func:`progress_line` for the
keys it reads). :class:`ProgressPrinter` prints what ``ratchet run`` prints: a Rich bar on a terminal,
one line per generation otherwise.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["ProgressPrinter", "budget_fraction", "progress_line", "score_text"]


def budget_fraction(info: dict[str, Any]) -> float:
    """Share of the budget used (0–1): the largest of env steps, episodes and wall clock used."""
    usage, budget = info["usage"], info["budget"]
    fracs = []
    if budget.env_steps:
        fracs.append(usage.env_steps / budget.env_steps)
    if budget.episodes:
        fracs.append(usage.episodes / budget.episodes)
    if budget.wall_clock_s:
        fracs.append(usage.wall_clock_s / budget.wall_clock_s)
    return min(1.0, max(fracs)) if fracs else 0.0


def score_text(x: float, width: int = 0) -> str:
    """A score (a mean, a standard deviation) as text, right-aligned in ``width`` characters: two decimals at
    ordinary scales (``245.30``, ``-0.13``, ``0.00`` for zero), about four significant digits below 0.1 in size,
    where two decimals would lose them (``-0.000176``, ``1.2e-06``, ``0.01235``)."""
    if x != 0 and abs(x) < 0.1:  # also False for NaN
        return f"{x:{width}.4g}"
    return f"{x:{width}.2f}"


def progress_line(info: dict[str, Any], time_left: str = "") -> str:
    """One generation as one line: best training mean, incumbent validation mean, budget used (env steps,
    and episodes when the budget counts them), time left, and what the gate did and why.

    Args:
        info: The dict the loop passes to ``progress``: ``generation``, ``best_train_mean`` (or None),
            ``incumbent_validation_mean``, ``usage`` (:class:`ratchet.planner.Usage`), ``budget``
            (:class:`ratchet.spec.BudgetSpec`), ``promoted``, ``gated``, ``gate_note`` (one line), ``cost_unit``
            (what the env-step count counts; default ``"env steps"``), ``episode_unit`` (what the task calls its
            episodes; default ``"episodes"``: a task whose episodes are its cost unit shows one count); with
            ``n_refiners`` > 1, the generation's ``refiner`` is named after its number; ``failed_episodes`` (the
            generation's training episodes that raised, timed out or failed to load) is shown when above 0.
        time_left: Text such as ``"≈12 s left"``.
    """
    usage, budget = info["usage"], info["budget"]
    unit, per = info.get("cost_unit", "env steps"), info.get("episode_unit", "episodes")
    best = info.get("best_train_mean")
    if unit == per:  # every episode costs 1 (an evaluator without COST_UNIT): one count, against its budget
        n, cap = (usage.env_steps, budget.env_steps) if budget.env_steps else (usage.episodes, budget.episodes)
        used = f"{per} {n:,}" + (f"/{cap:,}" if cap else "")
    else:
        used = f"{unit} {usage.env_steps:,}" + (f"/{budget.env_steps:,}" if budget.env_steps else "")
        if budget.episodes:
            used += f" | {per} {usage.episodes:,}/{budget.episodes:,}"
    arm = f" {info['refiner']}" if info.get("n_refiners", 1) > 1 and info.get("refiner") else ""
    line = (f"gen {info['generation']:>3}{arm} | best train {'–' if best is None else score_text(best, 9)} | "
            f"incumbent val {score_text(info['incumbent_validation_mean'], 9)} | {used}")
    if info.get("failed_episodes"):  # candidates whose episodes raise or time out: `ratchet show` says which, and why
        line += f" | {info['failed_episodes']} {per} failed"
    if time_left:
        line += f" | {time_left}"
    note = info.get("gate_note")
    if info.get("promoted"):
        line += " | promoted"
    elif info.get("gated"):
        line += f" | rejected: {note}" if note else " | rejected"
    elif note:
        line += f" | no gate: {note}"
    return line


class ProgressPrinter:
    """A progress callback that prints like ``ratchet run``: a Rich bar on a terminal, one line per
    generation otherwise (to ``stderr`` by default).

    Example::

        from ratchet import ProgressPrinter, load_spec, start_run

        progress = ProgressPrinter()
        try:
            start_run(load_spec("examples/cartpole"), progress=progress)
        finally:
            progress.stop()

    A resumed run reads its recorded generations back before it runs new ones (``info["replayed"]``): they are
    shown as recorded, a line marks where this session's work begins, and the time left is estimated from the
    generations run since then only (the ones read back took no time). A ``no gate`` note the same as one already
    shown (``decide = "end"``'s, every generation) is not repeated: ``no gate: same as above`` (or ``same as gen N``).
    A refiner that stops taking generations while others go on (``info["retired"]``, ``{name: why}``, and
    ``info["going_on"]``, the names left) gets a line of its own after the generation's.

    Args:
        console: A ``rich.console.Console`` to print to; default one on ``stderr`` without markup.
        live: Show a live bar; default: when the console is a terminal.
    """

    def __init__(self, console: Any = None, live: bool | None = None) -> None:
        from rich.console import Console

        self.console = console or Console(file=sys.stderr, markup=False)
        self.t0 = time.monotonic()
        self._since = (self.t0, 0.0)  # (when, budget fraction) this session's own generations are counted from
        self._replayed: list[int] = []  # generations read back from the ledger, until the first one run now
        self._notes: dict[str, int] = {}  # "no gate" notes shown already: the generation that showed each
        self._last_note: str | None = None  # the previous generation's note
        self.live = self.console.is_terminal if live is None else live
        self.bar = None
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=self.console,
                                transient=False)
            self.task = self.bar.add_task("starting", total=1.0)
            self.bar.start()

    def __call__(self, info: dict[str, Any]) -> None:
        frac, now = budget_fraction(info), time.monotonic()
        if info.get("replayed"):  # read back from the ledger: the time left is estimated from what runs after it
            self._since = (now, frac)
            self._replayed.append(info["generation"])
            left = "recorded"
        else:
            if self._replayed:
                first, last = self._replayed[0], self._replayed[-1]
                gens = f"generation {first}" if first == last else f"generations {first}–{last}"
                self.console.print(f"── resumed here: {gens} above were recorded before and read back from the "
                                   "ledger; the run goes on from here ──", highlight=False, soft_wrap=True)
                self._replayed = []
            since, done = now - self._since[0], frac - self._since[1]
            left = (f"≈{since * (1 - frac) / done:.0f} s left" if done > 0.05 * (1 - self._since[1])
                    else "estimating time left")
        note = info.get("gate_note") if not info.get("gated") and not info.get("promoted") else None
        if note:
            if note in self._notes:
                said = "same as above" if note == self._last_note else f"same as gen {self._notes[note]}"
                info = {**info, "gate_note": said}
            self._notes.setdefault(note, info["generation"])
        self._last_note = note
        line = progress_line(info, left)
        if self.bar is not None:
            self.bar.update(self.task, completed=frac, description=line)
        else:
            self.console.print(line, highlight=False, soft_wrap=True)
        for name, why in (info.get("retired") or {}).items():
            self.console.print(f"{name} stopped: {why}; the run goes on with {', '.join(info['going_on'])}",
                               highlight=False, soft_wrap=True)

    def stop(self) -> None:
        """Stop the live bar (safe to call twice)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
