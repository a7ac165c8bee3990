"""``[planner] decide = "every"``: each generation's best contender goes to the gate when it looks better on the
training seeds and its validation fits the budget (:class:`EveryGeneration`)."""

from __future__ import annotations

from ratchet.deciders.base import Decider, Outcome, paired_sd
from ratchet.planner import Stop, StopKind
from ratchet.policy import Candidate
from ratchet.step import GenerationStep

__all__ = ["EveryGeneration"]


class EveryGeneration(Decider):
    """Screen the generation's best contender against the incumbent on the same training seeds, validate it when the
    budget allows, and let the gate decide. With ``[planner] final`` the candidates no gate decided stay on the
    shortlist for one final decision when the budget ends the search."""

    def observe(self, step: GenerationStep, longest: float) -> float:
        """As :meth:`Decider.observe` with ``[planner] final``; without it a gate reads the generation's best, so it is
        priced from the longest mean episode length of any evaluation so far."""
        if self.services.spec.planner.final:
            return super().observe(step, longest)
        self.shortlist.observe(step.generation, list(step.contenders), step.train, step.incumbent, step.recommended)
        return max([longest] + [e.env_steps / e.n for e in step.train.values() if e.n])

    def decide(self, step: GenerationStep) -> Outcome:
        """The gate's decision on the generation's best contender (:attr:`GenerationStep.best`), or why none was taken:
        no contender (an outside service failed, every proposal was refused, the refiner proposed nothing (e.g. no
        request was affordable), or every contender errored), it is not
        better on the training seeds, or its validation would not fit the budget (:meth:`~ratchet.planner.
        IncumbentPlanner.validation_hold`). A decided candidate leaves the shortlist."""
        best, inc_val = step.best, step.incumbent_validation
        if best is None:
            if step.failures:  # the refiner's outside service failed: say so, not "failed episodes"
                return Outcome(None, f"the LLM endpoint failed {len(step.failures)} request(s) this generation "
                                     f"(last: {step.failures[-1][:200]})", inc_val)
            if not step.train and step.refused:  # nothing ran: every proposal failed its checks
                return Outcome(None, f"no contender: all {step.refused} proposal(s) were refused before any episode "
                                     "ran (`ratchet show` counts them; an LLM's answers and why: `ratchet llm-log`)",
                               inc_val)
            if step.idle is not None:  # it proposed nothing (e.g. no request was affordable): say so, not "errors"
                return Outcome(None, f"no contender: {step.idle}", inc_val)
            return Outcome(None, "no contender finished its training episodes without an error", inc_val)
        note = self._hold(step, best)
        if note is not None:
            return Outcome(None, note, inc_val, best)
        decision, cand_val, inc_val = self.services.decide(step.generation, best, step.incumbent, inc_val)
        if decision is None:
            return Outcome(None, "validation cut short by the env-step budget", inc_val, best)
        self.shortlist.decide(best.id, decision.promoted, cand_val.mean, paired_sd(cand_val, inc_val))
        return Outcome(decision, decision.reason, inc_val, best, cand_val)

    def gated(self, step: GenerationStep) -> Candidate | None:
        """The generation's best contender when :meth:`decide` will validate it (it beats the incumbent on the training
        seeds and its validation fits the budget), else None."""
        best = step.best
        return best if best is not None and self._hold(step, best) is None else None

    def _hold(self, step: GenerationStep, best: Candidate) -> str | None:
        """Why ``best`` is not validated (one line: not better on the training seeds, or its validation would not fit
        the budget, :meth:`~ratchet.planner.IncumbentPlanner.validation_hold`), or None."""
        train, inc_val = step.train, step.incumbent_validation
        note = self.planner.screen(train[best.id], train[step.incumbent.id], inc_val.mean)
        if note is None:
            # the contender's own episode lengths are the best guess of its validation lengths
            cand_train = train[best.id]
            val_len = max(step.est_len, inc_val.env_steps / max(1, inc_val.n),
                          cand_train.env_steps / max(1, cand_train.n))
            env_steps, episodes = step.next_cost
            note = self.planner.validation_hold(self.services.usage, self.prices.validation_episodes, val_len,
                                                env_steps, self.prices.episode_price(val_len), episodes)
        return note

    def concludes(self, stop: Stop) -> bool:
        """With ``[planner] final``, when the env-step or episode budget ended the search (not the clock, a target,
        patience or an idle refiner: each of those says the run should end now)."""
        return self.services.spec.planner.final and stop.kind is StopKind.BUDGET
