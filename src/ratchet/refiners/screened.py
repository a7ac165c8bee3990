"""A refiner whose proposals are screened in a learned world model before any is run (``[model] screen = true``).

:class:`ScreenedRefiner` wraps any refiner. Its inner refiner proposes ``factor`` times the candidates a generation
pays for (``[model] factor``; a small budget's CMA-ES population is sized so); a sandboxed job (trainer
``"worldmodel"``, :func:`train`) fits an ensemble on the run's recorded transitions and rolls every proposal out in
it, and only the best-ranked by imagined return plus an optimism bonus for the ensemble's disagreement are run.
This is the pre-selection scheme of metamodel-assisted evolution strategies (M. Emmerich, A. Giotis, M. Özdemir,
T. Bäck, K. Giannakoglou, "Metamodel-assisted evolution strategies", PPSN VII, 2002; H. Ulmer, F. Streichert,
A. Zell, "Evolution strategies assisted by Gaussian processes with improved pre-selection criterion", CEC 2003) with
the learned dynamics and ensemble uncertainty of PETS (K. Chua et al., NeurIPS 2018) and MBPO (M. Janner et al.,
NeurIPS 2019) as the metamodel.

**What the inner refiner is told.** CMA-ES asked for its whole population and its ``tell`` needs a fitness for every
sample it asked (pycma ranks them: only ranks matter). The inner refiner observes every proposal: those run with
their real training evaluations, those screened out with stand-in evaluations ranked below every real one, in the
model's order (the best-ranked of them first). So the ranking CMA-ES adapts from is the real one among what ran and
the model's below it; with ``factor = 2`` pycma's default parent number (half the population) takes exactly the
candidates that ran, so its mean moves on real returns only, while its active covariance update pushes away from
what the model ranked worst. Stand-ins are never recorded and never reach the gate or the planner.

**Trust.** The model is fitted on transitions recorded on the trusted side (:mod:`ratchet.worldmodel.transitions`),
but imagined rollouts run the proposals' policy code, so they run where policy code may run: the sandboxed training
job, never the driver. Its answer (imagined returns per proposal and member, the fitted model) is untrusted input,
checked against the trainer's declaration before it is recorded or used; a forged answer can only choose which
proposals run (it misleads the search at worst). The driver scores the returned model itself on held-out transitions
(:func:`ratchet.worldmodel.model.score`). The gate reads real validation episodes only.

**The screen's account.** ``[model] controls`` runs that many screened-out proposals, drawn at random, beside the
kept ones (the best-ranked). After the real episodes the kept ones' real training means are compared with the
controls': the screen's advantage (:meth:`~ratchet.worldmodel.screen.ScreenState.advantage`: over every pair of a
kept candidate and a control so far, (wins - losses) / pairs; 0 is a random pick) is what switches it off for the rest
of the run, when below ``[model] min_correlation`` after ``[model] window`` generations with controls; without
controls it stays on. The model's ranking of the candidates that ran (the kept ones, the controls and the inner
refiner's recommendation, which the job imagines but never ranks) is compared with their real training means too
(Spearman's rank correlation), but that range is mostly the model's best-ranked, which biases it low; it switches
nothing off (except in runs recorded with ``[model] judge = "kept"``, before controls judged the screen). Each
generation's ``generation_finished`` carries the account (:meth:`ScreenedRefiner.summary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ratchet.critic import Critique, Evaluation
from ratchet.ledger.events import RejectionKind
from ratchet.policy import Candidate
from ratchet.proposals import Rejection
from ratchet.refiners.base import GenerationCost, Refiner, Turn
from ratchet.rollout import Episode
from ratchet.worldmodel.screen import ScreenState, choose, horizon_for, optimistic, rank_correlation

__all__ = ["ScreenedRefiner", "screen_refiners", "train"]

#: The reason a proposal the screen kept from running is recorded with (``proposal_rejected``).
SCREENED_OUT = "screened out by the world model (ranked below the candidates run)"
#: The reason a proposal not run before the model could screen is recorded with (``[model] unscreened = "kept"``).
NOT_YET_SCREENED = "not run: the world model has too few transitions yet (as many run as in a screened generation)"
#: The trainer's name in :data:`ratchet.execution.training.TRAINERS`.
TRAINER = "worldmodel"
#: Most recorded episodes' transitions one job reads (the newest).
MAX_EPISODES_READ = 256
_HOLDOUT = 0.2


def screen_refiners(refiners: Sequence[Refiner], settings: Any, ctx: Any, unused: Sequence[str] = ()) -> list[Refiner]:
    """``refiners`` as they are without ``[model] screen``; else each wrapped in a :class:`ScreenedRefiner`.

    Args:
        refiners: The refiners one ``[[refiners]]`` table built.
        settings: The spec's ``[model]`` section (:class:`ratchet.spec.ModelSpec`).
        ctx: Their :class:`~ratchet.refiners.registry.RefinerContext`.
        unused: Why the run can record no transitions (:func:`ratchet.spec.screen_unused_reasons`); empty when it
            can.
    """
    if not settings.screen:
        return list(refiners)
    return [ScreenedRefiner(r, settings, ctx, unused) for r in refiners]


def _answer() -> Any:
    from ratchet.execution.training import InfoField, Role, TrainingAnswer
    from ratchet.worldmodel.model import WorldModel

    def returns_check(value: Any) -> None:
        if not all(isinstance(row, list) and row and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          and math.isfinite(x) for x in row) for row in value):
            raise ValueError("each entry must be a non-empty list of finite numbers (one per member)")
        if len({len(row) for row in value}) > 1:
            raise ValueError("every proposal must have as many numbers (members)")

    return TrainingAnswer(
        roles=(Role("world_model", max_bytes=64 << 20, check=WorldModel.from_bytes),),
        info=(InfoField("returns", "list", low=lambda job: len(job.settings["params"]),
                        high=lambda job: len(job.settings["params"]), check=returns_check),),
        max_info_bytes=8 << 20)


class ScreenedRefiner(Refiner):
    """A refiner whose proposals pass a world-model screen (see the module doc).

    Args:
        inner: The refiner that proposes (and is told every proposal's rank).
        settings: ``[model]`` (:class:`ratchet.spec.ModelSpec`).
        ctx: The inner refiner's :class:`~ratchet.refiners.registry.RefinerContext` (``train``, ``artifact`` and
            ``transitions``).
        unused: Why the run can record no transitions, so the screen never screens (each generation's account says
            so: ``screen_unused``); empty when it can.
    """

    def __init__(self, inner: Refiner, settings: Any, ctx: Any, unused: Sequence[str] = ()) -> None:
        self.inner, self.settings, self.ctx = inner, settings, ctx
        self.unused = "; ".join(unused)
        self.name = inner.name
        self.state = ScreenState(min_correlation=settings.min_correlation, window=settings.window,
                                 judge=settings.judge)
        self._rows: dict[str, int] = {}  # transitions per recorded artifact, read once
        self._kept: list[Candidate] = []
        self._controls: set[str] = set()  # the ids of this generation's controls (among the kept)
        self._out: list[tuple[Candidate, float]] = []  # screened out, best first, with their scores
        self._scores: dict[str, float] = {}
        self._recommended: Candidate | None = None  # the inner refiner's recommendation this generation
        self._rejections: list[Rejection] = []
        self._last: dict[str, Any] = {}
        self._fits = 0

    # ---- the data set ----------------------------------------------------------------------------------------
    def _data(self) -> tuple[list[str], int]:
        """The newest recorded transitions' digests (at most ``max_transitions`` rows) and their rows."""
        from ratchet.worldmodel.transitions import Transitions

        chosen, rows = [], 0
        for digest in reversed(self.ctx.transitions()[-MAX_EPISODES_READ:]):
            if digest not in self._rows:
                self._rows[digest] = len(Transitions.from_bytes(self.ctx.artifact(digest)))
            if rows >= self.settings.max_transitions:
                break
            chosen.append(digest)
            rows += self._rows[digest]
        return chosen[::-1], rows

    def _screening(self) -> bool:
        """Whether the next generation is screened: the screen is on and the data set is big enough."""
        return self.state.on and self.ctx.transitions is not None and self._data()[1] >= self.settings.min_transitions

    def _waiting(self) -> bool:
        """Whether the next generation runs only as many proposals as a screened one although nothing screens it
        yet (``[model] unscreened = "kept"``): the screen is on and transitions are recorded, but fewer than
        ``min_transitions`` — never in a run that can record none (:attr:`unused`): it would wait for ever."""
        return (self.settings.unscreened == "kept" and not self.unused and self.state.on
                and self.ctx.transitions is not None and not self._screening())

    # ---- the Refiner contract ------------------------------------------------------------------------------
    def generation_cost(self) -> GenerationCost:
        """The inner refiner's cost with only the candidates the screen keeps paid for (all of them while it does
        not screen, except before the model can screen with ``[model] unscreened = "kept"``)."""
        cost = self.inner.generation_cost()
        if not self._screening() and not self._waiting():
            return cost
        from dataclasses import replace

        return replace(cost, proposals=self._keep(cost.proposals))

    def _best(self, n: int) -> int:
        return min(n, max(1, math.ceil(n / self.settings.factor)))

    def _keep(self, n: int) -> int:
        """Of ``n`` proposals, how many run: the best ``1/factor`` and ``[model] controls`` of the rest."""
        best = self._best(n)
        return best + min(self.settings.controls, n - best)

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """The inner refiner's proposals, screened: the best ``1/factor`` by imagined return plus the optimism bonus.
        Unscreened (all of them) while the screen is off, the data set is small, the proposals are not one program's
        parameter values, or the model job failed (its error is in :meth:`summary`)."""
        proposed = self.inner.propose(parent, critique, rng)
        recommended, self._recommended = self._recommended, None
        self._kept, self._out, self._scores, self._rejections = list(proposed), [], {}, []
        self._controls = set()
        self._last = {"screen_on": self.state.on, "screen_proposed": len(proposed), "screen_kept": len(proposed),
                      "screen_saved": self.state.saved, **self._judged(),
                      **({"screen_unused": self.unused} if self.unused else {})}
        keep = self._keep(len(proposed))
        waiting = self._waiting()
        if (not self._screening() and not waiting) or keep >= len(proposed):
            return proposed
        if any(c.kind != "program" or c.artifacts or c.source != proposed[0].source for c in proposed):
            self._last["screen_note"] = "not screened: the proposals are not one program's parameter values"
            return proposed
        if waiting:  # the refiner's samples are independent draws: its first `keep` are a random pick
            self._kept, self._out = list(proposed[:keep]), [(c, -math.inf) for c in proposed[keep:]]
            self._rejections = [Rejection(self.name, parent.id, NOT_YET_SCREENED, detail={"candidate_id": c.id},
                                          kind=RejectionKind.NOT_SCREENED)
                                for c in proposed[keep:]]
            self.state.saved += len(self._out)
            self._last.update({"screen_kept": keep, "screen_saved": self.state.saved, "screen_waiting": True,
                               "screen_note": f"the model has too few transitions yet: the first {keep} of "
                                              f"{len(proposed)} proposals ran"})
            return self._kept
        digests, rows = self._data()
        also = [recommended] if (recommended is not None and recommended.kind == "program" and not recommended.artifacts
                                 and recommended.source == proposed[0].source) else []
        job = self._job([*proposed, *also], digests)
        result = self.ctx.train(job)
        if result.error is not None or not result.outputs:
            self._last["screen_note"] = f"not screened: {result.error or 'no answer'}"[:300]
            return proposed
        out = result.outputs[0]
        returns = np.asarray(out.info["returns"], np.float64)
        self._fit_account(out.info["artifacts"]["world_model"], digests, rows)
        scores = optimistic(returns, self.settings.optimism)
        order = choose(scores[:len(proposed)].tolist(), len(proposed))  # the recommendation is scored, never ranked
        ranked, best = {i: r + 1 for r, i in enumerate(order)}, self._best(len(proposed))
        if best < keep:  # controls: drawn from the rest at random, then the rest keeps the model's order
            drawn = np.random.default_rng([int(self.ctx.seed), self._fits]).choice(len(order) - best, keep - best,
                                                                                   replace=False)
            rest = order[best:]
            picked = [rest[i] for i in sorted(drawn.tolist())]
            order = order[:best] + picked + [i for i in rest if i not in picked]
        self._scores = {c.id: float(scores[len(proposed) + i]) for i, c in enumerate(also)}
        self._scores.update({proposed[i].id: float(scores[i]) for i in order})
        self._kept = [proposed[i] for i in order[:keep]]
        self._controls = {proposed[i].id for i in order[best:keep]}
        self._out = [(proposed[i], float(scores[i])) for i in order[keep:]]
        self._rejections = [Rejection(self.name, parent.id, SCREENED_OUT,
                                      detail={"candidate_id": proposed[i].id, "screen_score": float(scores[i]),
                                              "rank": ranked[i], "of": len(proposed)},
                                      kind=RejectionKind.SCREENED_OUT)
                            for i in order[keep:]]
        self.state.saved += len(self._out)
        self._last.update({"screen_kept": len(self._kept), "screen_saved": self.state.saved})
        return self._kept

    def _job(self, proposed: Sequence[Candidate], digests: Sequence[str]) -> Any:
        from ratchet.execution.training import TrainingJob
        from ratchet.policy import _thaw

        s = self.settings
        self._fits += 1
        carrier = Candidate.create(proposed[0].source, dict(proposed[0].params), kind="program",
                                   artifacts={f"t{i:04d}": d for i, d in enumerate(digests)})
        settings = {"params": [{k: _thaw(v) for k, v in c.params.items()} for c in proposed],
                    "members": s.members, "hidden": s.hidden, "updates": s.updates,
                    "horizon": s.horizon if s.horizon is not None else horizon_for(self.ctx.task.step_limit),
                    "starts": s.starts, "holdout": _HOLDOUT, "seed": int(self.ctx.seed) + self._fits,
                    "max_transitions": s.max_transitions}
        return TrainingJob(TRAINER, carrier, settings, (), 0, answer=_answer())

    def _fit_account(self, model_digest: str, digests: Sequence[str], rows: int) -> None:
        """The driver's own score of the returned model on the held-out transitions (never the job's word)."""
        from ratchet.worldmodel.model import WorldModel, WorldModelError, held_out, score

        try:
            model = WorldModel.from_bytes(self.ctx.artifact(model_digest))
            data = _joined([self.ctx.artifact(d) for d in digests], self.settings.max_transitions)
            hold, train_rows = held_out(len(data), _HOLDOUT, int(self.ctx.seed) + self._fits)
            fit = score(model, data, hold, len(train_rows))
        except (WorldModelError, ValueError) as exc:
            self._last["model_note"] = str(exc)[:200]
            return
        self._last.update({"model_rows": rows, "model_error": round(fit.holdout_error, 6),
                           "model_reward_error": round(fit.reward_error, 6),
                           "model_disagreement": round(fit.disagreement, 6)})

    def take_rejections(self) -> list[Rejection]:
        """The inner refiner's rejections, then the proposals the screen kept from running."""
        out, self._rejections = self.inner.take_rejections() + self._rejections, []
        return out

    def observe(self, evaluations: Sequence[Evaluation]) -> None:
        """Judge the screen on the real training means of what ran, then tell the inner refiner every proposal:
        stand-ins for the screened-out ones right after the real ones (see the module doc)."""
        evaluations = list(evaluations)
        if self._out and not self._scores:  # nothing screened yet (unscreened = "kept"): nothing to judge
            by_id = {e.candidate_id: e for e in evaluations}
            ran_means = [by_id[c.id].mean for c in self._kept if c.id in by_id and not by_id[c.id].n_errors
                         and math.isfinite(by_id[c.id].mean)]
            evaluations = self._told(evaluations, min(ran_means, default=0.0))
        elif self._out:
            by_id = {e.candidate_id: e for e in evaluations}
            ran = [(self._scores[cid], by_id[cid].mean) for cid in dict.fromkeys([*(c.id for c in self._kept),
                                                                                   *self._scores])
                   if cid in by_id and not by_id[cid].n_errors and math.isfinite(by_id[cid].mean)]
            rho = rank_correlation([p for p, _ in ran], [r for _, r in ran])
            real = {c.id: by_id[c.id].mean for c in self._kept if c.id in by_id and not by_id[c.id].n_errors
                    and math.isfinite(by_id[c.id].mean)}
            kept = [m for cid, m in real.items() if cid not in self._controls]
            controls = [m for cid, m in real.items() if cid in self._controls]
            self.state.judge_generation(len(self.state.correlations) + 1, rho, kept, controls)
            self._last.update({"screen_rank_correlation": None if rho is None else round(rho, 4),
                               "screen_on": self.state.on, **self._judged()})
            if kept and controls and self.state.judge == "controls":  # a run recorded before: its payload as it was
                self._last["screen_margin"] = round(float(np.mean(kept) - np.mean(controls)), 6)
            evaluations = self._told(evaluations, min(real.values(), default=0.0))  # the controls are among the kept
        self.inner.observe(evaluations)
        self._out = []

    def _told(self, evaluations: list[Evaluation], floor: float) -> list[Evaluation]:
        """``evaluations`` with a stand-in for each proposal not run right after the real ones: below ``floor`` (the
        lowest real training mean), in the order of :attr:`_out`."""
        stand_ins = [Evaluation(c.id, "train", (Episode(0, floor - 1.0 - i, 0, False, False),))
                     for i, (c, _) in enumerate(self._out)]
        n = len(self._kept)
        return evaluations[:n] + stand_ins + evaluations[n:]

    def _judged(self) -> dict[str, Any]:
        """The screen's advantage over its controls so far (see :class:`ScreenState`), for the ledger."""
        if self.state.judge != "controls":
            return {}
        adv = self.state.advantage()
        return {"screen_advantage": None if adv is None else round(adv, 4), "screen_pairs": self.state.pairs}

    def recommend(self) -> Candidate | None:
        """The inner refiner's recommendation (never screened: it is one candidate). The loop asks for it before
        :meth:`propose`, which has the job imagine it too, for the screen's account."""
        self._recommended = self.inner.recommend()
        return self._recommended

    def fit(self, room_env_steps: int) -> bool:
        """The inner refiner's :meth:`~ratchet.refiners.base.Refiner.fit`."""
        return self.inner.fit(room_env_steps)

    def idle_reason(self) -> str | None:
        """The inner refiner's."""
        return self.inner.idle_reason()

    def refused(self, reasons: Mapping[str, str]) -> None:
        """Passed to the inner refiner (proposals refused before any episode: duplicates, failed checks)."""
        self.inner.refused(reasons)

    def dropped(self, reasons: Mapping[str, str]) -> None:
        """Passed to the inner refiner (contenders the cascade dropped after its first stage)."""
        self.inner.dropped(reasons)

    def budget_spent(self) -> bool:
        """The inner refiner's."""
        return self.inner.budget_spent()

    def verdict(self, candidate_id: str | None, promoted: bool, note: str) -> None:
        """Passed to the inner refiner."""
        self.inner.verdict(candidate_id, promoted, note)

    def prepare(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> None:
        """Passed to the inner refiner."""
        self.inner.prepare(parent, critique, rng)

    def turn(self, generation: int) -> Turn:
        """The inner refiner's."""
        return self.inner.turn(generation)

    def finish(self) -> dict[str, Any]:
        """Passed to the inner refiner."""
        return self.inner.finish()

    def summary(self) -> dict[str, Any]:
        """The inner refiner's summary and the screen's account of the last generation: ``screen_on``,
        ``screen_proposed``/``screen_kept`` (candidates), ``screen_saved`` (proposals not run so far: screened out,
        or before the model could screen), ``screen_unused`` (only in a run that can record no transitions: why, in a
        few words; the screen never screens there), ``screen_waiting`` (True where the model had too few transitions and only
        the refiner's first proposals ran: ``[model] unscreened = "kept"``),
        ``screen_rank_correlation`` (Spearman, model vs real training means of what ran; None where it says
        nothing; biased low), ``screen_advantage`` (over the kept-versus-control pairs so far, (wins - losses) /
        pairs, -1 to 1; None before any; absent with ``judge = "kept"``), ``screen_pairs`` (those pairs),
        ``screen_margin`` (this generation's kept candidates' mean real training return minus the controls', in
        the task's return units; only where both ran), ``model_rows`` (transitions fitted on),
        ``model_error``/``model_reward_error`` (held-out mean squared error, in standard deviations of the predicted
        quantities) and ``model_disagreement`` (mean std across members, same units)."""
        return {**self.inner.summary(), **self._last}


def _joined(blobs: Sequence[bytes], limit: int) -> Any:
    from ratchet.worldmodel.transitions import Transitions

    parts = [Transitions.from_bytes(b) for b in blobs]
    data = parts[0]
    for p in parts[1:]:
        data = data.joined(p, limit)
    return data.tail(limit)


def train(task: Any, parent: Mapping[str, Any], settings: Mapping[str, Any], seeds: Sequence[int],
          env_steps: int) -> tuple[list[Any], int]:
    """Trainer ``"worldmodel"`` (see :mod:`ratchet.execution.training`), in the sandbox: fit the ensemble on the
    transitions (``parent["artifacts"]``, oldest first) and roll each proposal (``settings["params"]``, the parent's
    program) out in it from recorded start states.

    Returns:
        One output: artifact ``world_model`` (:meth:`~ratchet.worldmodel.model.WorldModel.to_bytes`), info
        ``returns`` (per proposal, the mean imagined return per member); no env steps.
    """
    from ratchet.execution.training import TrainingOutput
    from ratchet.policy import bind_spaces, compile_policy, materialize
    from ratchet.worldmodel.imagine import action_encoder, imagined_returns
    from ratchet.worldmodel.model import fit_model

    arts = parent["artifacts"]
    data = _joined([arts[k] for k in sorted(arts)], int(settings["max_transitions"]))
    model, _ = fit_model(data, members=int(settings["members"]), hidden=int(settings["hidden"]),
                         updates=int(settings["updates"]), holdout=float(settings["holdout"]),
                         seed=int(settings["seed"]))
    env = task.make_env()
    try:
        spaces = (env.observation_space, env.action_space)
    finally:
        env.close()
    module = compile_policy(parent["source"])
    bind_spaces(module, *spaces)
    starts = data.starts()
    pick = np.random.default_rng(int(settings["seed"])).permutation(len(starts))[:int(settings["starts"])]
    returns = imagined_returns(model, module.act, [materialize(p) for p in settings["params"]], starts[pick],
                               int(settings["horizon"]), action_encoder(spaces[1]))
    return [TrainingOutput({"world_model": model.to_bytes()}, {"returns": returns.tolist()})], 0
