"""``[planner] decide = "exact"``: the decider of a deterministic task (``[task] deterministic = true``), which needs no
statistics (:class:`Exact`).

A deterministic score is the same on every seed and every time, so each distinct candidate is scored once (one
training episode, on the same training seed every generation: a candidate proposed again is read back from the
ledger, never run or charged again) and a promotion needs no test: the generation's best goes to the gate when its
score beats the incumbent's by more than ``[gate] tolerance`` (:meth:`~ratchet.gate.ExactGate.margin`), and is
promoted when one re-evaluation on a validation seed repeats that score exactly and still beats the incumbent's
(:class:`~ratchet.gate.ExactGate`). A re-evaluation that differs is recorded as a decision that did not promote,
``stopped_because = "not_deterministic"``, with both scores: the task is not deterministic, and ``ratchet show`` and
the report say so.
"""

from __future__ import annotations

from ratchet.critic import Evaluation
from ratchet.deciders.base import Decider, Outcome
from ratchet.gate import Decision
from ratchet.ledger import EventType
from ratchet.planner import Stop
from ratchet.services import _cut
from ratchet.step import GenerationStep

__all__ = ["NOT_DETERMINISTIC", "Exact"]

#: :attr:`~ratchet.gate.Decision.stopped_because` of a decision whose re-evaluation differed from the training score.
NOT_DETERMINISTIC = "not_deterministic"


class Exact(Decider):
    """Gate the generation's best contender when its one score beats the incumbent's by more than the tolerance,
    after an exact re-evaluation confirms it; no shortlist and no final decision (every strict improvement is
    decided when it is found)."""

    pairs_with_incumbent = False  # the incumbent's score is known exactly: it never runs again beside its contenders

    def observe(self, step: GenerationStep, longest: float) -> float:
        """The longest mean episode length (env steps) of any evaluation so far: what a gate is priced from. Nothing
        goes on the shortlist."""
        return max([longest] + [e.env_steps / e.n for e in step.train.values() if e.n])

    def decide(self, step: GenerationStep) -> Outcome:
        """The gate's decision on the generation's best contender, or why none was taken: no contender scored
        without an error, its score is not above the incumbent's by more than the tolerance, the budget cannot pay
        for its re-evaluation, or the re-evaluation differed (recorded: the task is not deterministic)."""
        best, inc_val, gen = step.best, step.incumbent_validation, step.generation
        if best is None:
            if step.failures:
                return Outcome(None, f"the LLM endpoint failed {len(step.failures)} request(s) this generation "
                                     f"(last: {step.failures[-1][:200]})", inc_val)
            if step.idle is not None:  # it proposed nothing (e.g. no request was affordable): say so, not "errors"
                return Outcome(None, f"no contender: {step.idle}", inc_val)
            return Outcome(None, "no contender scored without an error", inc_val)
        score, incumbent = step.train[best.id].mean, inc_val.mean
        gate = self.services.gate
        need = gate.margin(incumbent)
        if not score - incumbent > need:
            return Outcome(None, f"best score {score:.9g} is not above the incumbent's {incumbent:.9g} by more than "
                                 f"the tolerance {need:.3g}", inc_val, best)
        env_steps, episodes = step.next_cost
        length = max(step.est_len, step.train[best.id].env_steps / max(1, step.train[best.id].n))
        hold = self.planner.validation_hold(self.services.usage, self.prices.validation_episodes, length, env_steps,
                                            self.prices.episode_price(length), episodes)
        if hold is not None:
            return Outcome(None, hold, inc_val, best)
        again = self.services.evaluate([best], self.services.validation_seeds[:1], "validation", gen)[best.id]
        if _cut(again):
            return Outcome(None, "validation cut short by the env-step budget", inc_val, best)
        if again.n_errors or again.mean != score:
            return self._not_deterministic(step, score, again)
        decision, cand_val, inc_val = self.services.decide(gen, best, step.incumbent, inc_val)  # reads `again` back
        if decision is None:
            return Outcome(None, "validation cut short by the env-step budget", inc_val, best)
        return Outcome(decision, decision.reason, inc_val, best, cand_val)

    def _not_deterministic(self, step: GenerationStep, score: float, again: Evaluation) -> Outcome:
        """Record the decision on a contender whose re-evaluation did not repeat its training score: not promoted,
        ``stopped_because`` :data:`NOT_DETERMINISTIC`, both scores in its reason."""
        best, inc_val = step.best, step.incumbent_validation
        assert best is not None
        ep = again.episodes[0]
        second = (f"failed on re-evaluation ({' '.join(str(ep.error).split())[:200]})" if ep.error is not None
                  else f"scored {ep.episode_return!r} on re-evaluation")
        reason = (f"the task is not deterministic: candidate {best.id} scored {score!r} on its training seed and "
                  f"{second}; not promoted ([task] deterministic = true does not hold for this task)")
        decision = Decision(best.id, step.incumbent.id, False, 1.0, ep.episode_return - inc_val.mean, 1, "exact", 0.0,
                            reason, episodes_used=1, stopped_because=NOT_DETERMINISTIC)
        inc_part = Evaluation(inc_val.candidate_id, "validation", inc_val.episodes[:1])
        self.services.record(EventType.GATE_DECIDED, f"gate/{step.generation}/{best.id}",
                             {"generation": step.generation, **decision.to_dict(),
                              "critique": self.services.critic.critique(again, inc_part).to_dict(),
                              "candidate_validation": again.summary(), "incumbent_validation": inc_part.summary(),
                              "training_score": score, "env_steps": self.services.usage.env_steps})
        return Outcome(decision, reason, inc_val, best, again)

    def concludes(self, stop: Stop) -> bool:
        """Never: every strict improvement was decided when it was found, so there is nothing left to certify."""
        return False
