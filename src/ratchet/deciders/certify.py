"""Certifying the shortlist's best: confirmation on fresh training seeds, then the gate (:class:`Certifier`).

``[planner] decide = "powered"`` certifies the shortlist's best whenever a decision is likely to pass; every mode
(``"every"`` with ``[planner] final``, ``"powered"``, ``"end"``) certifies it once more when the budget ends the
search, with what the budget leaves spent on choosing well (successive halving).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ratchet.critic import Evaluation
from ratchet.deciders.base import Outcome, paired_sd
from ratchet.ledger import EventType
from ratchet.planner import Budget, IncumbentPlanner, Pricing
from ratchet.policy import Candidate
from ratchet.services import _cut
from ratchet.shortlist import Shortlist, gate_power

if TYPE_CHECKING:
    from ratchet.services import RunServices

__all__ = ["MAX_CONFIRM", "Certifier"]

#: Most seeds per candidate of the final confirmation (:meth:`Certifier.confirmation_size`).
MAX_CONFIRM = 1000
#: The final validation of n episodes is priced at n × (its candidate's mean episode length) × this, plus three
#: standard deviations of the sum of n lengths (:func:`_validation_price`), so the hard cap practically never cuts it.
_VALIDATION_MARGIN = 1.1


def _validation_price(n: int, length: float, length_sd: float, step_limit: int | None) -> float:
    """Env steps ``n`` validation episodes are priced at: ``n`` × ``length`` (mean episode length, env steps) ×
    :data:`_VALIDATION_MARGIN` plus 3 ``length_sd`` √n; and at least what the executor's hard cap needs to start the
    last of them, which it does only while the task's time limit ``step_limit`` still fits: ``n`` − 1 episodes'
    lengths, their 3 ``length_sd`` √n, and ``step_limit`` (short episodes under a long time limit, e.g. CartPole's).
    """
    spread = 3.0 * length_sd * math.sqrt(n)
    price = _VALIDATION_MARGIN * n * length + spread
    return max(price, (n - 1) * length + spread + step_limit) if step_limit and n > 0 else price


class Certifier:
    """Confirms the shortlist's best on fresh training seeds (paired with the incumbent, counted as re-evaluation)
    and sends the best confirmed to the gate.

    Args:
        services: The run's recorded services.
        planner: Holds a validation that would overspend ``[gate] max_share``.
        prices: What work costs against the budget.
        budget: The run's budget.
        shortlist: The best candidates no gate has decided yet; default an empty one.
    """

    def __init__(self, services: RunServices, planner: IncumbentPlanner, prices: Pricing, budget: Budget,
                 shortlist: Shortlist | None = None) -> None:
        self.services, self.planner, self.prices, self.budget = services, planner, prices, budget
        self.shortlist = shortlist if shortlist is not None else Shortlist()
        spec = services.spec
        self.confirm_episodes = spec.planner.confirm_seeds(spec.gate.validation_episodes)
        self._confirmed_seeds = 0  # confirmation seeds used so far (each round reads fresh training seeds)

    def certify(self, generation: int, incumbent: Candidate, inc_val: Evaluation, next_cost: tuple[float, int],
                est_len: float, final: bool = False) -> Outcome:
        """``[planner] decide = "powered"``: certify the shortlist's best (:class:`~ratchet.shortlist.Shortlist`) when
        a decision is likely to pass, and otherwise let the search go on.

        Three steps, each cheaper than the next is dear: (1) the leader's expected gain (shrunken training mean
        minus the incumbent's training mean) must give the gate ``[planner] power`` at the next decision's level on
        the validation seeds (normal approximation, :func:`~ratchet.shortlist.gate_power`), and validation must fit
        ``[gate] max_share``; (2) the ``confirm_top`` best are run with the incumbent on fresh training seeds, paired
        (counted as re-evaluation); (3) the best confirmed goes to the gate when its confirmed gain still gives that
        power. With ``final`` (the budget ends the search) only a positive confirmed gain is asked for, and the
        better half of those confirmed runs again on every seed the budget leaves once the validation is paid for
        (:meth:`confirmation_size`): successive halving (Z. Karnin, T. Koren and O. Somekh, "Almost optimal
        exploration in multi-armed bandits", ICML 2013), so the choice of what to certify gets the budget's rest.
        The gate's guarantee does not depend on how its candidate was chosen: confirmation reads training seeds
        only.

        Args:
            generation: The generation it decides in.
            incumbent: The incumbent.
            inc_val: The incumbent's validation evaluation.
            next_cost: (env steps, episodes) of the next generation and its kept gate, which a validation must leave
                room for (not with ``final``).
            est_len: The episode length (env steps) work is priced at.
            final: The budget ended the search: the final decision.

        Returns:
            The :class:`~ratchet.deciders.base.Outcome`: its candidate is the one gated (None when no gate ran; the
            note says why, in one line).
        """
        sl, want, n_val = self.shortlist, self.services.spec.planner.power, len(self.services.validation_seeds)
        top = sl.candidates(self.services.spec.planner.confirm_top)
        if not top:
            return Outcome(None, "no contender on the shortlist (none finished its training episodes without an error)",
                           inc_val)
        level = self.services.next_level()
        if not final:
            gain = sl.expected_gain(top[0])
            power = gate_power(gain, sl.spread(), n_val, level)
            if power < want:
                return Outcome(None, f"shortlist leader: expected gain {gain:+.2f}, power {power:.2f} < [planner] "
                                     f"power {want:g} at α {level:.3g} on {n_val} seeds; search goes on", inc_val)
            val_len = max(est_len, inc_val.env_steps / max(1, inc_val.n))
            hold = self.planner.validation_hold(self.services.usage, self.prices.validation_episodes, val_len,
                                                next_cost[0], self.prices.episode_price(val_len), next_cost[1])
            if hold is not None:
                return Outcome(None, hold, inc_val)
        entries = [e for e in top if e.against != incumbent.id]
        n_first = self.first_round(entries, inc_val) if final else self.confirm_episodes
        if n_first < 1:  # never start a round the budget cannot pay for: the executor's cap would cut it
            return Outcome(None, "the budget left cannot pay for a confirmation and the final validation", inc_val)
        cut = self.confirm(generation, entries, incumbent, inc_val, n_first)
        pool = list(top)
        while final and not cut:  # successive halving: the better half again, on what validation leaves of the budget
            survivors = sorted(pool, key=lambda e: -sl.expected_gain(e))[:max(2, (len(pool) + 1) // 2)]
            length = max([e.length for e in survivors] + [inc_val.env_steps / max(1, inc_val.n)])
            n_conf = self.confirmation_size(len(survivors) + 1, length, max(e.length_sd for e in survivors))
            if n_conf < self.confirm_episodes:  # what is left would not change the choice much
                break
            cut, pool = self.confirm(generation, survivors, incumbent, inc_val, n_conf), survivors
        if cut:
            return Outcome(None, "confirmation cut short by the env-step budget", inc_val)
        lead = max(pool, key=sl.expected_gain)  # of the last round's survivors: one left out earlier is noisier
        gain = sl.expected_gain(lead)
        power = gate_power(gain, lead.confirmed_sd if lead.confirmed_sd is not None else sl.spread(), n_val, level)
        if gain <= 0 or (not final and power < want):
            why = "no gain to certify" if gain <= 0 else "too little power to certify it"
            return Outcome(None, f"not gated, {why}: the best candidate's gain over the incumbent on fresh training "
                                 f"seeds {gain:+.2f} (power {power:.2f})" + ("" if final else "; search goes on"),
                           inc_val)
        cap = self.final_validation(lead.length, lead.length_sd) if final else None
        if cap is not None and cap < 2:
            return Outcome(None, "the env-step budget left cannot pay for the final validation", inc_val)
        decision, cand_val, inc_val = self.services.decide(generation, lead.candidate, incumbent, inc_val,
                                                           label="final" if final else None, cap=cap)
        if decision is None:
            return Outcome(None, "validation cut short by the env-step budget", inc_val)
        sl.decide(lead.candidate.id, decision.promoted, cand_val.mean, paired_sd(cand_val, inc_val))
        return Outcome(decision, decision.reason, inc_val, lead.candidate, cand_val)

    def confirm(self, generation: int, entries: Sequence[Any], incumbent: Candidate, inc_val: Evaluation,
                n: int) -> bool:
        """Run ``entries``' candidates and the incumbent on ``n`` fresh training seeds of the confirmation range
        (counted as re-evaluation) and record each entry's paired differences; True when the env-step cap cut it
        short."""
        if not entries or n < 1:
            return False
        start = 2_000_000_000 + self._confirmed_seeds
        self._confirmed_seeds += n
        ev = self.services.evaluate([e.candidate for e in entries] + [incumbent],
                                    self.services.splits.seeds("train", start, n), "train", generation)
        self.services.usage.reeval_env_steps += sum(x.env_steps for x in ev.values())
        if any(_cut(x) for x in ev.values()):
            return True
        for e in entries:
            self.shortlist.confirm(e, ev[e.candidate.id], ev[incumbent.id])
            lengths = [ep.length for ep in ev[e.candidate.id].episodes]
            e.length = float(np.mean(lengths))
            e.length_sd = float(np.std(lengths)) if len(lengths) > 1 else e.length
        return False

    def first_round(self, entries: Sequence[Any], inc_val: Evaluation) -> int:
        """Seeds per candidate for the final decision's first round of confirmation of ``entries`` (shortlist entries
        not yet confirmed against the incumbent, which runs with them): ``confirm_episodes`` while the episode budget
        leaves them with a validation (:meth:`_episode_room`) and the env steps left pay for the whole round (each
        candidate's episodes priced at its mean length, the incumbent's at its validation's, with a 10 % margin, and
        the time limit the executor's cap keeps free to start the last); else what the budget leaves once the final
        validation is paid for (:meth:`confirmation_size`; 0: none). With ``decide = "every"`` the search keeps no
        confirmation in reserve, so its last gate may leave less than a round; a smaller round is read at its real
        size."""
        runs, b = len(entries) + 1, self.budget.spec
        n = min(self.confirm_episodes, self._episode_room(runs))
        if b.env_steps is None or not entries or n < 1:
            return n
        inc_len = inc_val.env_steps / max(1, inc_val.n)
        price = _VALIDATION_MARGIN * n * (sum(e.length for e in entries) + inc_len) + (self.services.task.step_limit or 0)
        if price <= b.env_steps - self.services.usage.env_steps:
            return n
        length = max([e.length for e in entries] + [inc_len])
        return min(n, self.confirmation_size(runs, length, max(e.length_sd for e in entries)))

    def confirmation_size(self, runs: int, length: float, length_sd: float = 0.0) -> int:
        """Seeds per candidate for the final confirmation of ``runs`` candidates (the incumbent among them): what the
        budget leaves once one validation is paid for — env steps with every episode priced at ``length`` (env steps,
        the longest mean length of the episodes it reads) and a 10 % margin on the validation, and episodes — at most
        :data:`MAX_CONFIRM` (0 when nothing is left, and with no env-step or episode budget: a run bounded by its wall
        clock alone gets one round of confirmation). So the run ends with its budget spent on choosing well."""
        b, u, n_val = self.budget.spec, self.services.usage, len(self.services.validation_seeds)
        if b.env_steps is None and b.episodes is None:
            return 0
        n = MAX_CONFIRM
        if b.env_steps is not None:
            left = b.env_steps - u.env_steps - _validation_price(n_val, length, length_sd,
                                                                 self.services.task.step_limit)
            n = min(n, int(left // (runs * max(1.0, length))))
        return max(0, min(n, self._episode_room(runs)))

    def _episode_room(self, runs: int) -> int:
        """Seeds per candidate that ``runs`` candidates can each play with what ``[budget] episodes`` leaves once one
        validation is paid for (unbounded without an episode budget; may be negative)."""
        b, u = self.budget.spec, self.services.usage
        if b.episodes is None:
            return MAX_CONFIRM
        return (b.episodes - u.episodes - len(self.services.validation_seeds)) // runs

    def final_validation(self, length: float, length_sd: float = 0.0) -> int:
        """Validation seeds the final decision can afford: all of them unless the budget left is short (env steps: its
        episodes priced at ``length`` with a 10 % margin; episodes). Chosen before the candidate's first validation
        episode, so the gate's level holds."""
        b, u = self.budget.spec, self.services.usage
        n = len(self.services.validation_seeds)
        if b.episodes is not None:
            n = min(n, b.episodes - u.episodes)
        if b.env_steps is not None:
            step_limit = self.services.task.step_limit
            while n > 0 and _validation_price(n, length, length_sd, step_limit) > b.env_steps - u.env_steps:
                n -= 1
        return n

    def final_decision(self, generation: int, incumbent: Candidate, inc_val: Evaluation
                       ) -> tuple[Candidate, Evaluation]:
        """The budget ended the search (``decide = "powered"``, or ``"every"`` with ``[planner] final``): certify the
        shortlist's best confirmed candidate with the validation kept for it (:meth:`certify` with ``final``);
        recorded as the gate decision labelled ``final``, and as ``final_decision``. Returns the incumbent and its
        validation evaluation after it."""
        if not self.shortlist.entries:
            return incumbent, inc_val
        out = self.certify(generation, incumbent, inc_val, (0.0, 0), 1.0, final=True)
        self.services.record(EventType.FINAL_DECISION, "final_decision",
                             {"generation": generation, "gated": out.decision is not None, "note": out.note,
                              "promoted": bool(out.decision is not None and out.decision.promoted),
                              **({"candidate_id": out.candidate.id} if out.candidate is not None else {})})
        if out.promoted and out.candidate is not None and out.candidate_validation is not None:
            return out.candidate, out.candidate_validation
        return incumbent, out.incumbent_validation

