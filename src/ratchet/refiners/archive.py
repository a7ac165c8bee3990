"""An archive of diverse good programs, for structural refiners to draw parents from.

The gate keeps one incumbent — the run's result. A structural search that only ever edits the
incumbent throws away every mutant that was good in another way but not yet better; evolutionary
program search keeps a population instead. Two designs are followed here:

- MAP-Elites (Mouret & Clune 2015, "Illuminating search spaces by mapping elites", arXiv:1504.04909):
  the archive is a grid of cells indexed by a *behaviour descriptor*; each cell keeps only its best
  program (the *elite*), so the archive holds programs that are good in different ways, and a new
  program enters when its cell is empty or it beats that cell's elite.
- FunSearch's programs database (Romera-Paredes et al. 2023, "Mathematical discoveries from program
  search with large language models", Nature 625:468–475): parents are drawn by a softmax over the
  programs' scores with a temperature, so better programs are drawn more often while every program
  remains possible. (Its islands, which evolve apart and are reset from the best ones, are a coarser
  form of the same diversity; with the small budgets of a gated run one grid of cells does that job.)

:class:`Archive` is deliberately small and knows nothing of code or refiners: elites are
:class:`~ratchet.policy.Candidate` objects with a fitness (higher is better, in return units) and a
descriptor (a tuple of small ints). :func:`behaviour_descriptor` is the default descriptor of a
program's training evaluation; any callable giving a tuple may replace it.

Determinism: the archive holds no clock and no hash-ordered state. Its contents follow from the
sequence of :meth:`Archive.add` calls alone, and :meth:`Archive.sample` takes its randomness from the
``rng`` passed in; a refiner that feeds it only recorded training evaluations (as ``mutate`` does
through ``observe``) rebuilds it exactly when a run is resumed or replayed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ratchet.critic import Evaluation, is_failure
from ratchet.policy import Candidate

__all__ = ["Archive", "ArchiveSettings", "Elite", "behaviour_descriptor", "draw_parent", "offer_generation",
           "paired_gain"]


class ArchiveSettings(BaseModel):
    """The archive's settings, shared by the structural refiners' settings (``mutate``, ``llm``)."""

    model_config = ConfigDict(extra="forbid")

    archive: int = Field(8, ge=1, le=1000, description="Most programs in the archive of elites that parents are "
                                                       "drawn from (one per behaviour cell).",
                         json_schema_extra={"unit": "programs"})
    incumbent_share: float = Field(0.5, ge=0, le=1, description="Share of edited programs that start from the "
                                                               "incumbent; the rest start from an elite.")
    archive_temperature: float = Field(0.5, gt=0, le=100, description="Softmax temperature of drawing an elite, as a "
                                                                      "fraction of the spread of their fitness.")
    failed_parents: bool = Field(False, description="Whether a program some of whose training episodes failed "
                                                    "(raised, crashed, timed out, gave a non-finite action) may enter "
                                                    "the archive and so become a parent (scored by its mean return, "
                                                    "failed episodes included); false: never.")

    def new_archive(self) -> Archive:
        """An empty :class:`Archive` of these settings."""
        return Archive(self.archive, self.archive_temperature, self.failed_parents)


@dataclass(frozen=True)
class Elite:
    """One archive entry.

    Attributes:
        candidate: The program (source and parameter values).
        fitness: Estimated mean return (return units; higher is better), averaged over ``n`` estimates.
        descriptor: Its cell: a tuple of small ints (see :func:`behaviour_descriptor`).
        n: How many estimates ``fitness`` averages (a program evaluated again is re-estimated, not duplicated).
        generation: The generation of its latest estimate.
    """

    candidate: Candidate
    fitness: float
    descriptor: tuple[int, ...]
    n: int = 1
    generation: int = 0


class Archive:
    """A MAP-Elites grid of at most ``capacity`` elites, one per behaviour cell (see the module doc).

    Args:
        capacity: Most elites kept; past it the lowest-fitness elite goes (never a protected one).
        temperature: Softmax temperature of :meth:`sample`, as a fraction of the spread of the elites'
            fitness (FunSearch's score softmax made scale-free): small values draw the best elites almost
            always, large ones draw uniformly over cells.
        failed_parents: Whether :func:`offer_generation` offers a program some of whose episodes failed (raised,
            crashed, timed out); by default such a program never enters, so it is never drawn as a parent.

    Raises:
        ValueError: ``capacity`` < 1 or ``temperature`` <= 0.
    """

    def __init__(self, capacity: int = 8, temperature: float = 0.5, failed_parents: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"expected capacity >= 1, got {capacity}")
        if not temperature > 0:
            raise ValueError(f"expected temperature > 0, got {temperature}")
        self.capacity, self.temperature = int(capacity), float(temperature)
        self.failed_parents = bool(failed_parents)
        self._cells: dict[tuple[int, ...], Elite] = {}
        self._protected: str | None = None

    def __len__(self) -> int:
        return len(self._cells)

    def __contains__(self, candidate_id: object) -> bool:
        return any(e.candidate.id == candidate_id for e in self._cells.values())

    @property
    def elites(self) -> list[Elite]:
        """Every elite, best first (ties by candidate id, so the order never depends on insertion)."""
        return sorted(self._cells.values(), key=lambda e: (-e.fitness, e.candidate.id))

    def get(self, candidate_id: str) -> Elite | None:
        """The elite of this candidate, or None."""
        return next((e for e in self._cells.values() if e.candidate.id == candidate_id), None)

    def protect(self, candidate_id: str | None) -> None:
        """Never evict this candidate's elite for room (the incumbent); a better program of its own cell
        still replaces it, as in MAP-Elites."""
        self._protected = candidate_id

    def add(self, candidate: Candidate, fitness: float, descriptor: Sequence[int], generation: int = 0) -> bool:
        """Offer a program to the archive.

        A candidate already in the archive is re-estimated (its fitness becomes the mean of all its
        estimates; it keeps its cell). Otherwise it enters its cell when the cell is empty or its fitness
        is higher than the cell's elite's. Past ``capacity`` the lowest-fitness unprotected elite is evicted.

        Args:
            candidate: The program.
            fitness: Its estimated mean return; a non-finite value is refused.
            descriptor: Its behaviour cell (ints).
            generation: When it was estimated.

        Returns:
            Whether the archive changed (entered, replaced, or re-estimated).
        """
        if not math.isfinite(fitness):
            return False
        cell = tuple(int(d) for d in descriptor)
        for key, e in self._cells.items():
            if e.candidate.id == candidate.id:
                self._cells[key] = replace(e, fitness=(e.fitness * e.n + fitness) / (e.n + 1), n=e.n + 1,
                                           generation=generation)
                return True
        old = self._cells.get(cell)
        if old is not None and not fitness > old.fitness:
            return False
        self._cells[cell] = Elite(candidate, float(fitness), cell, 1, generation)
        while len(self._cells) > self.capacity:
            victims = [e for e in self.elites if e.candidate.id != self._protected]
            worst = victims[-1]
            del self._cells[worst.descriptor]
        return candidate.id in self

    def sample(self, rng: np.random.Generator, exclude: Sequence[str] = ()) -> Elite | None:
        """Draw one elite: probability ∝ ``exp((fitness − best) / (temperature × spread))``.

        Args:
            rng: Every random choice comes from it.
            exclude: Candidate ids not to draw.

        Returns:
            The elite, or None when no elite is left to draw.
        """
        skip = set(exclude)
        pool = [e for e in self.elites if e.candidate.id not in skip]
        if not pool:
            return None
        f = np.array([e.fitness for e in pool])
        spread = float(f.max() - f.min()) or 1.0
        w = np.exp((f - f.max()) / (self.temperature * spread))
        return pool[int(rng.choice(len(pool), p=w / w.sum()))]


def behaviour_descriptor(evaluation: Evaluation, reference: Evaluation | None = None, step_limit: int | None = None,
                         n_parameters: int = 0) -> tuple[int, int, int, int, int]:
    """A program's behaviour cell from its training episodes (what MAP-Elites calls the descriptor).

    Five coarse traits, each a small int, chosen to be readable on any task:

    - episode length: mean length over ``step_limit`` in quarters (0–3), or ``floor(log2(mean length))``
      capped at 15 without a limit;
    - how episodes end: the share terminated (not truncated) — 0 none, 1 some, 2 all;
    - failures: the share of failing episodes (:func:`ratchet.critic.is_failure`) — 0 none, 1 some, 2 all;
    - which failure it avoids: 1 when it beats ``reference`` (the incumbent on the same seeds) on the
      reference's worst seed, else 0 (0 without a reference): programs that repair the incumbent's
      worst episodes and programs that improve its good ones fall in different cells;
    - size: ``floor(log2(1 + n_parameters))``, so programs of different complexity do not crowd each
      other out (a common second axis in genetic-programming MAP-Elites).

    Args:
        evaluation: The program's training evaluation.
        reference: The incumbent's evaluation on the same seeds, or None.
        step_limit: The task's time limit (env steps), or None.
        n_parameters: How many parameters the program declares.

    Returns:
        The descriptor tuple.
    """
    eps = evaluation.episodes
    n = max(1, len(eps))
    mean_len = sum(e.length for e in eps) / n
    length = (min(3, int(4 * mean_len / step_limit)) if step_limit
              else min(15, int(math.log2(max(1.0, mean_len)))))

    def share(k: int) -> int:
        return 0 if k == 0 else (2 if k == len(eps) else 1)

    ending = share(sum(1 for e in eps if e.terminated))
    failing = share(sum(1 for e in eps if is_failure(e)))
    avoids = 0
    if reference is not None and reference.episodes:
        worst = min(reference.episodes, key=lambda e: (e.episode_return, e.seed))
        mine = {e.seed: e.episode_return for e in eps}
        avoids = int(worst.seed in mine and mine[worst.seed] > worst.episode_return)
    size = int(math.log2(1 + max(0, n_parameters)))
    return length, ending, failing, avoids, size


def paired_gain(evaluation: Evaluation, reference: Evaluation | None) -> float | None:
    """Mean return difference ``evaluation − reference`` over the seeds both ran (return units), or None
    when there is no reference or they share no seed."""
    if reference is None:
        return None
    ref = {e.seed: e.episode_return for e in reference.episodes}
    diffs = [e.episode_return - ref[e.seed] for e in evaluation.episodes if e.seed in ref]
    return float(np.mean(diffs)) if diffs else None


def draw_parent(archive: Archive, incumbent: Candidate, rng: np.random.Generator, incumbent_share: float) -> Candidate:
    """A structural refiner's parent: the incumbent with probability ``incumbent_share``, else an elite
    drawn by :meth:`Archive.sample` (the incumbent when the archive holds no other)."""
    if rng.random() < incumbent_share:
        return incumbent
    elite = archive.sample(rng, exclude=[incumbent.id])
    return incumbent if elite is None else elite.candidate


def offer_generation(archive: Archive, incumbent: Candidate, proposed: Sequence[Candidate],
                     evaluations: Sequence[Evaluation], generation: int,
                     step_limit: int | None = None) -> dict[str, float]:
    """Offer a generation's programs to the archive, scored against the incumbent on the same seeds.

    The incumbent's own evaluation (among ``evaluations``; the loop passes it with the proposals')
    re-estimates the incumbent: its fitness is the mean of its training means so far. A proposal's
    fitness is that estimate plus its :func:`paired_gain` over the incumbent on this generation's seeds —
    far less noisy than its own mean, because seeds change between generations and pairs do not. Without
    the incumbent's evaluation a proposal's fitness is its own mean. A proposal with a failed episode (an error:
    raised, crashed, timed out) is left out, so it never becomes a parent, unless the archive takes such programs
    (``failed_parents``); one without a finite mean always is. Descriptors come from :func:`behaviour_descriptor`.

    Returns:
        candidate id -> paired gain over the incumbent (return units), for the proposals that had one.
    """
    by_id = {e.candidate_id: e for e in evaluations}

    def clean(ev: Evaluation) -> bool:
        return not ev.n_errors and bool(np.isfinite(ev.mean))

    inc = by_id.get(incumbent.id)
    base = None
    if inc is not None and clean(inc):
        archive.add(incumbent, float(inc.mean), behaviour_descriptor(inc, None, step_limit, len(incumbent.params)),
                    generation)
        elite = archive.get(incumbent.id)
        base = elite.fitness if elite is not None else float(inc.mean)
    else:
        inc = None
    gains: dict[str, float] = {}
    for cand in proposed:
        ev = by_id.get(cand.id)
        if cand.id == incumbent.id or ev is None or not (clean(ev) or archive.failed_parents and np.isfinite(ev.mean)):
            continue
        gain = paired_gain(ev, inc)
        fitness = float(ev.mean) if gain is None or base is None else base + gain
        archive.add(cand, fitness, behaviour_descriptor(ev, inc, step_limit, len(cand.params)), generation)
        if gain is not None:
            gains[cand.id] = gain
    return gains
