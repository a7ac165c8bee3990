"""CMA-ES refiner over a policy's declared parameters (pycma)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ratchet.critic import Critique, Evaluation
from ratchet.policy import FOLDER_KINDS, Candidate, PolicyProgram
from ratchet.refiners.base import GenerationCost, Refiner

__all__ = ["MIN_SIGMA0", "NO_FOLDER_PARAMETERS", "NO_PARAMETERS", "CMAESRefiner", "CMAESSettings"]

#: Why a ``cmaes`` refiner has nothing to search (its :meth:`CMAESRefiner.idle_reason`), with the fix.
NO_PARAMETERS = ("the policy declares no parameters for cmaes to search; declare them in its PARAMETERS "
                 "(name -> {\"default\", \"low\", \"high\"}) or use a refiner that edits the code (mutate, llm)")

#: :data:`NO_PARAMETERS` for a source folder (``[policy] kind = "source"``): its parameters are its marked regions' numbers.
NO_FOLDER_PARAMETERS = ("the source folder has no numbers in marked regions for cmaes to search; put the code to tune "
                        "between EVOLVE-BLOCK-START and EVOLVE-BLOCK-END comments (each number in them is a parameter; "
                        "a `ratchet:` comment on its line names it and sets its bounds, e.g. `// ratchet: gain 0..2`) "
                        "or use llm, which edits the files")

#: Smallest initial step size accepted (fraction of a parameter's range).
MIN_SIGMA0 = 1e-6


class CMAESSettings(BaseModel):
    """Settings of a ``cmaes`` refiner (``[refiner]``, or a ``[[refiners]]`` table with ``kind = "cmaes"``)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("sigma0_variants")
    @classmethod
    def _variants(cls, v: list[float]) -> list[float]:
        if any(not MIN_SIGMA0 <= x <= 1 for x in v) or len(set(v)) != len(v):
            raise ValueError(f"each variant must be a distinct step size in [{MIN_SIGMA0:g}, 1]")
        return v

    sigma0: float = Field(0.2, ge=MIN_SIGMA0, le=1, description="Initial step size, as a fraction of each parameter's range.",
                          json_schema_extra={"unit": "fraction of each parameter's range"})
    popsize: int | None = Field(None, ge=2, le=10_000, description="Candidates per generation; default pycma's 4 + 3 ln n.",
                                json_schema_extra={"unit": "candidates"})
    sigma0_variants: list[float] = Field(
        default_factory=list, description="Several CMA-ES configurations sharing the budget, one per initial "
                                          "step size; the planner allocates generations among them by Thompson "
                                          "sampling over the promotion gains each produced. Empty: one CMA-ES.",
                                         json_schema_extra={"unit": "fraction of each parameter's range"})
    restarts: Literal["none", "ipop", "local", "rescue"] = Field(
        "none", description="\"ipop\" (IPOP-CMA-ES): restart from the incumbent with a doubled population after "
                            "`stagnation` generations without a better best training score; \"local\": restart from "
                            "the incumbent with the same population after `stagnation` generations in which neither a "
                            "sample nor the distribution's mean beat the incumbent on the generation's training seeds "
                            "(the search has left the incumbent's basin and found nothing better); \"rescue\": as "
                            "\"local\", but only while nothing has been promoted (the incumbent is still the start), "
                            "so a search that once beat the start is never cut short.")
    stagnation: int = Field(10, ge=1, le=1_000_000, description="Generations without progress before a restart "
                                                                "(see `restarts`).",
                            json_schema_extra={"unit": "generations"})
    elitist: bool | None = Field(
        None, description="Elitist search: every generation's samples are drawn around the incumbent (the "
                          "distribution's mean moves back to it before each generation; its step size and covariance "
                          "keep adapting), and a step size that collapses restarts it there, so the search never loses "
                          "the best it has seen. Default: on for a [task] deterministic task, off otherwise.")
    follow: Literal["own", "incumbent"] = Field(
        "incumbent", description="On a promotion: \"own\" keeps the search on its own path (the distribution as it is); "
                           "\"incumbent\" moves the distribution's mean to the promoted candidate.")


class CMAESRefiner(Refiner):
    """Covariance Matrix Adaptation Evolution Strategy over the policy's parameters.

    Source: N. Hansen, "The CMA Evolution Strategy: A Tutorial" (arXiv:1604.00772); implementation:
    the ``cma`` package (pycma), ask/tell interface.

    The search runs in normalised coordinates: each parameter is mapped to ``[0, 1]`` within its
    bounds (in log space for ``scale="log"``), and pycma's bound handling keeps samples inside.
    Array parameters are flattened (C order) and concatenated with the scalars in declaration order,
    so CMA-ES searches one vector of ``sum(p.size)`` coordinates (:meth:`flatten`/:meth:`unflatten`).
    Above ``FULL_COVARIANCE_MAX`` coordinates the covariance is diagonal (sep-CMA-ES: R. Ros and
    N. Hansen, "A Simple Modification in CMA-ES Achieving Linear Time and Space Complexity", PPSN
    2008; pycma's ``CMA_diagonal``), since a full matrix costs O(n²) memory and O(n³) updates.
    Fitness is the negative mean training return; a candidate with any errored episode ranks last.

    Int and categorical parameters are searched on a relaxed, rounded space: each is one continuous coordinate whose
    rounding is the candidate's value (:meth:`ratchet.policy.Parameter.from_unit`: equal bins per integer or
    choice), and each sample is told the fitness of the candidate it rounds to (samples that round alike share a
    candidate, evaluated once). Their coordinates keep a least step size (:meth:`step_floor`), so the search never
    stops trying neighbouring integers and choices.

    On a promotion the distribution's mean moves to the promoted candidate by default (``follow="incumbent"``),
    keeping step size and covariance: when every generation is gated the mean would otherwise drift away from an
    incumbent that stays put, and most later samples lose to it. With ``follow="own"`` the search keeps its own
    path: the choice with ``[planner] decide = "powered"`` (:mod:`ratchet.shortlist`), where decisions are rare and
    the promoted candidate is usually several generations old, so moving the mean back to it would restart the
    walk from an older point.

    The search follows structural promotions too: when the parent's source is not the program this
    refiner searches (a ``mutate`` or ``llm`` refiner's candidate was promoted), it re-parses the parent's
    program and restarts CMA-ES from the parent's values over the new ``PARAMETERS`` (population and
    step size as configured; :attr:`n_programs` counts the programs searched).

    With ``restarts="ipop"`` the search restarts from the current incumbent with a doubled
    population when its best training score has not improved for ``stagnation`` generations (or its
    step size collapsed): IPOP-CMA-ES (A. Auger and N. Hansen, "A Restart CMA Evolution Strategy With
    Increasing Population Size", CEC 2005). With ``restarts="local"`` it restarts from the incumbent with the
    initial step size and the same population (a fresh sample stream) when neither a sample nor the distribution's
    mean (:meth:`recommend`, evaluated beside them) has beaten the incumbent on the generation's own training seeds
    for ``stagnation`` generations: the search left the incumbent's basin for a worse one (on BipedalWalker, a
    walker that stands still scores about 0 where the start's falls score about -100 and its walks 250, so a search
    whose first samples all fall can settle on standing still). The incumbent then runs on every generation's
    training seeds (``reference=True``). ``restarts="rescue"`` is ``"local"`` for as long as the incumbent is the
    start (the first parent) and no restart after the first promotion: it rescues a search that never found the
    start's basin without restarting one that is slowly refining a tuned incumbent (where its samples lose to the
    incumbent for many generations in a row as a matter of course); its reference runs stop with the first
    promotion.

    Args:
        program: The policy whose ``PARAMETERS`` are searched.
        sigma0: Initial step size in normalised units (fraction of each parameter's range), in (0, 1].
        popsize: Candidates per generation; None uses pycma's default ``4 + floor(3 ln n)``.
        seed: Seed for pycma's sampler (the run's seed makes the whole run reproducible).
        restarts: ``"none"``, ``"ipop"``, ``"local"`` or ``"rescue"`` (see above).
        stagnation: Generations without progress before a restart: without a better best training score
            (``"ipop"``), without a sample or mean that beat the incumbent on the same training seeds (``"local"``,
            ``"rescue"``).
        name: Name recorded as the candidates' refiner (default ``"cmaes"``).
        follow: ``"own"`` or ``"incumbent"`` (see above).
        elitist: Draw every generation around the incumbent (the parent): the mean moves back to it before each
            generation, so the search never loses the best it has seen; a step size below 1e-4 restarts it there with
            ``sigma0``. The default for a deterministic task (:attr:`ratchet.tasks.Task.deterministic`), where the
            incumbent's score is exact and a search that drifts away from it wastes evaluations.
        no_parameters: Why it has nothing to search when ``program`` declares no parameters (:meth:`idle_reason`):
            :data:`NO_PARAMETERS` for a policy file, :data:`NO_FOLDER_PARAMETERS` for a source folder.
    """

    name = "cmaes"

    #: Search dimension up to which the full covariance matrix is adapted.
    FULL_COVARIANCE_MAX = 1000

    def __init__(self, program: PolicyProgram, sigma0: float = 0.2, popsize: int | None = None, seed: int = 0,
                 restarts: str = "none", stagnation: int = 10, name: str | None = None,
                 follow: str = "incumbent", elitist: bool = False, no_parameters: str = NO_PARAMETERS) -> None:
        self.program = program
        self.no_parameters = no_parameters
        self.follow = follow
        self.elitist = elitist
        self.sigma0 = sigma0
        self.popsize = popsize
        self.seed = seed
        self.restarts = restarts
        self.stagnation = stagnation
        self.n_restarts = 0
        self.n_programs = 1
        self._popsize0 = popsize
        if name:
            self.name = name
        self._best = float("-inf")
        self._stale = 0
        self._restart_due = False
        self._es: Any = None  # a cma.CMAEvolutionStrategy once started (pycma is untyped)
        self._asked: list[tuple[str, np.ndarray]] = []  # (candidate id, sample) of the last population, in order
        self._parent_id: str | None = None
        self._start_id: str | None = None  # the first parent: "rescue" restarts only while it is the incumbent
        self._recommended_id: str | None = None  # the distribution mean evaluated with the current population
        self._parent: Candidate | None = None
        self._dropped: set[str] = set()  # samples the cascade dropped after its first stage (observe ranks them last)

    @property
    def dimension(self) -> int:
        """Length of the searched vector: the parameters' sizes summed (a scalar counts 1)."""
        return sum(p.size for p in self.program.parameters)

    def flatten(self, params: Mapping[str, Any]) -> list[float]:
        """Parameter values -> the searched vector in ``[0, 1]`` (declaration order, arrays in C order).

        Args:
            params: name -> float or nested sequence/array of the parameter's shape.

        Returns:
            ``dimension`` floats.
        """
        x: list[float] = []
        for p in self.program.parameters:
            u = p.to_unit(params[p.name])
            if p.is_array:
                x.extend(float(v) for v in u)
            else:
                x.append(u)
        return x

    def unflatten(self, x: Sequence[float] | np.ndarray) -> dict[str, Any]:
        """Inverse of :meth:`flatten` (coordinates clipped to ``[0, 1]``): name -> float, or nested
        tuples of floats for array parameters. Coordinates past ``dimension`` are ignored."""
        values: dict[str, Any] = {}
        i = 0
        for p in self.program.parameters:
            if p.is_array:
                values[p.name] = p.from_unit(np.asarray(x[i:i + p.size], dtype=np.float64))
            else:
                values[p.name] = p.from_unit(x[i])
            i += p.size
        return values

    def _start(self, parent: Candidate) -> None:
        import cma

        x0 = self.flatten(parent.params)
        seed = int(self.seed) + 7919 * self.n_restarts + 104_729 * (self.n_programs - 1)
        opts = {"bounds": [0.0, 1.0], "seed": seed % (2**31 - 1) + 1,
                "verbose": -9}
        if self.popsize:
            opts["popsize"] = int(self.popsize)
        if len(x0) > self.FULL_COVARIANCE_MAX:
            opts["CMA_diagonal"] = True
        if len(x0) == 1:  # pycma needs dimension >= 2; a dummy coordinate is harmless
            x0 = x0 + [0.5]
        floor = self.step_floor()
        if any(floor):  # int and categorical coordinates only: a float-only search runs as it always has
            opts["minstd"] = floor + [0.0] * (len(x0) - len(floor))
        self._es = cma.CMAEvolutionStrategy(x0, self.sigma0, opts)

    def step_floor(self) -> list[float]:
        """The least standard deviation of each searched coordinate (pycma's ``minstd``): 0 for a float; for an int
        or categorical parameter ``w / (2m + 1)``, where ``w`` is the width of one integer's (one choice's) bin in
        unit coordinates (:class:`~ratchet.policy.Parameter`; for a log-scaled int the bins' mean width) and ``m``
        the number of such coordinates. Without it a
        rounded coordinate freezes once the step size falls below its bin: the lower bound of the integer handling
        of N. Hansen, "A CMA-ES for Mixed-Integer Nonlinear Optimization" (INRIA RR-7751, 2011), as pycma's
        ``IntegerMixedFunction`` recommends it (about a third of the samples then change an integer)."""
        widths = []
        for p in self.program.parameters:
            if p.type == "int":
                widths.append(1.0 / (p.high - p.low + 1))  # for scale "log" the bins' mean width
            elif p.type == "categorical":
                widths.append(1.0 / len(p.choices))
            else:
                widths += [0.0] * p.size
        m = sum(1 for w in widths if w > 0)
        return [w / (2 * m + 1) for w in widths]

    def _candidate(self, x: np.ndarray, refiner: str) -> Candidate:
        # the parent's kind and artifacts are kept (a residual policy's correction stays as it is)
        p = self._parent
        return Candidate.create(p.source if p is not None else self.program.source, self.unflatten(x),
                                parent_id=self._parent_id, refiner=refiner, kind=p.kind if p is not None else "program",
                                artifacts=p.artifacts if p is not None else None)

    def idle_reason(self) -> str | None:
        """Why this refiner cannot propose anything (None when it can)."""
        return None if self.program.parameters else self.no_parameters

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """Ask pycma for one population (``popsize`` candidates) around the current distribution.

        ``parent`` seeds the distribution's mean on the first call; later calls continue the same
        search (CMA-ES keeps its own state).
        """
        if parent.kind == "program" and parent.source != self.program.source:
            self._follow_structure(parent)
        if not self.program.parameters:
            return []
        if self._restart_due and self.restarts == "rescue" and parent.id != self._start_id:
            self._restart_due = False  # a promotion came first: the search found a basin after all
        if self._es is None or self._restart_due:
            if self._restart_due:  # restart from the incumbent: IPOP-CMA-ES doubles the population
                self.n_restarts += 1
                if self.restarts == "ipop":
                    self.popsize = 2 * self.population_size
                self._restart_due, self._best, self._stale = False, float("-inf"), 0
            self._start(parent)
        elif self.elitist or (parent.id != self._parent_id and self.follow == "incumbent"):
            # a promotion: follow the new incumbent (elitist: every generation starts from it)
            x = np.clip(self.flatten(parent.params), 0.0, 1.0)
            self._es.mean = np.concatenate([x, self._es.mean[len(x):]])
        self._parent_id, self._parent = parent.id, parent
        if self._start_id is None:
            self._start_id = parent.id
        xs = self._es.ask()
        out = [self._candidate(np.asarray(x), self.name) for x in xs]
        self._asked = [(c.id, np.asarray(x)) for c, x in zip(out, xs)]  # each sample told its own candidate's fitness
        return out

    def _follow_structure(self, parent: Candidate) -> None:
        """Search the parent's own program from now on: a fresh CMA-ES over its ``PARAMETERS`` (started
        by :meth:`propose` from the parent's values)."""
        from ratchet.refiners.structural import program_of

        self.program = program_of(parent)
        self.n_programs += 1
        self.popsize = self._popsize0
        self._es, self._asked = None, []
        self._restart_due, self._best, self._stale = False, float("-inf"), 0

    def dropped(self, reasons: Mapping[str, str]) -> None:
        """The samples the cascade dropped after its first stage: :meth:`observe` ranks them below the rest."""
        self._dropped = set(reasons)

    def observe(self, evaluations: Sequence[Evaluation]) -> None:
        """Tell pycma the population's fitness (negative mean return). Other evaluations are ignored.

        The order pycma's update reads (it uses ranks only): the samples that ran every training seed by their mean;
        below all of them those the cascade dropped after its first stage (:meth:`dropped`), by their first-stage
        mean (it was on fewer, other seeds, and below the bar the others passed); below those, samples that failed an
        episode or have no evaluation."""
        if self._es is None or not self._asked:
            return
        by_id = {e.candidate_id: e for e in evaluations}
        fits = []
        for cid, _ in self._asked:
            ev = by_id.get(cid)
            fits.append(None if ev is None or ev.n_errors or not np.isfinite(ev.mean) else -ev.mean)
        dropped, self._dropped = self._dropped, set()
        ids = [cid for cid, _ in self._asked]
        finite = [f for cid, f in zip(ids, fits) if f is not None and cid not in dropped]  # ran every seed
        cut = [f for cid, f in zip(ids, fits) if f is not None and cid in dropped]
        if finite and cut:  # shift the dropped samples' fitness above (worse than) every other's, keeping their order
            shift = max(finite) - min(cut) + 1.0
            fits = [f + shift if f is not None and cid in dropped else f for cid, f in zip(ids, fits)]
        finite = finite or cut
        everything = [f for f in fits if f is not None]
        worst = (max(everything) + abs(max(everything)) + 1.0) if everything else 0.0
        self._es.tell([x for _, x in self._asked], [worst if f is None else f for f in fits])
        self._asked = []
        if self.elitist and self._es.sigma < 1e-4:  # collapsed around the incumbent: start again there
            self._restart_due = True
        if self.restarts != "none" and finite and self._rescuing:  # "rescue" after a promotion: never restart
            gen_best = -min(finite)
            if self.restarts == "ipop":
                progress = gen_best > self._best
                self._best = max(self._best, gen_best)
            else:  # "local" (and "rescue" before a promotion): did any sample, or the mean, beat the incumbent?
                inc = by_id.get(self._parent_id) if self._parent_id is not None else None
                mean = by_id.get(self._recommended_id) if self._recommended_id is not None else None
                if mean is not None and mean.candidate_id not in dropped and not mean.n_errors and np.isfinite(mean.mean):
                    gen_best = max(gen_best, mean.mean)
                progress = inc is None or inc.n_errors > 0 or not np.isfinite(inc.mean) or gen_best > inc.mean
            self._stale = 0 if progress else self._stale + 1
            if self._stale >= self.stagnation or self._es.sigma < 1e-4:
                self._restart_due = True
        self._recommended_id = None

    @property
    def _rescuing(self) -> bool:
        """Whether restarts may still happen: always unless ``restarts="rescue"``, which restarts only while the
        incumbent is still the start (the first parent)."""
        return self.restarts != "rescue" or self._parent_id == self._start_id

    def recommend(self) -> Candidate | None:
        """The CMA-ES distribution mean (pycma's ``xfavorite``), a lower-noise estimate than the best sample."""
        if self._es is None:
            return None
        cand = self._candidate(np.asarray(self._es.result.xfavorite), self.name + "-mean")
        self._recommended_id = cand.id  # its evaluation, beside the next population's, tells observe it is in a basin
        return cand

    @property
    def population_size(self) -> int:
        """Candidates per generation: pycma's population, or the configured/default size before it starts."""
        if self._es is not None:
            return int(self._es.popsize)
        n = max(2, self.dimension)
        return int(self.popsize or 4 + int(3 * np.log(n)))

    @property
    def sigma(self) -> float | None:
        """Current step size (normalised units), or None before the first generation."""
        return None if self._es is None else float(self._es.sigma)

    def proposes_without_verdict(self) -> bool:
        """With ``follow="own"``, ``restarts="none"`` and no elitist search: a promotion moves nothing (the samples come
        from the distribution's own path; the parent gives only their ``parent_id``), so the next population may be
        asked for before the gate's verdict on this one's contender."""
        return self.follow == "own" and self.restarts == "none" and not self.elitist

    def generation_cost(self) -> GenerationCost:
        """A population of samples plus the distribution mean (:meth:`recommend`); twice the population when an
        IPOP restart is due (the next :meth:`propose` restarts with it). CMA-ES ranks its samples by their own training
        means, so it needs no paired reference (``reference=False``) unless ``restarts="local"`` compares them
        with the incumbent (``"rescue"``: until the first promotion)."""
        ipop_due = self._restart_due and self.restarts == "ipop"
        return GenerationCost(proposals=self.population_size * (2 if ipop_due else 1), recommends=True,
                              reference=self.restarts in ("local", "rescue") and self._rescuing)

    def summary(self) -> dict[str, Any]:
        """``sigma`` (step size, normalised units; None before the first generation) and ``restarts`` (how many)."""
        return {"sigma": self.sigma, "restarts": self.n_restarts}


def _build(settings: CMAESSettings, name: str, ctx: Any) -> list[CMAESRefiner]:
    """One CMA-ES per step size (``sigma0_variants``), named ``NAME-s<sigma0>``; else one named ``NAME``."""
    s = settings
    variants = s.sigma0_variants or [s.sigma0]
    names = [f"{name}-s{v:g}" for v in variants] if s.sigma0_variants else [name]
    elitist = s.elitist if s.elitist is not None else ctx.task.deterministic
    why = NO_FOLDER_PARAMETERS if ctx.start.kind in FOLDER_KINDS else NO_PARAMETERS
    return [CMAESRefiner(ctx.program, v, s.popsize, seed=ctx.seed + i, restarts=s.restarts, stagnation=s.stagnation,
                         name=n, follow=s.follow, elitist=elitist, no_parameters=why) for i, (n, v) in enumerate(zip(names, variants))]


def _kinds() -> dict[str, Any]:
    from ratchet.refiners.registry import RefinerKind

    return {"cmaes": RefinerKind(CMAESSettings, ("program", "residual", "source"), _build,
                                 hint="cmaes searches a program's PARAMETERS",
                                 generation_size=lambda s: (s.popsize or 4) + 1)}  # pycma's least population, the mean


KINDS = _kinds()
