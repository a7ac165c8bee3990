"""The run loop: plan → execute → critique → refine → gate, every step recorded in the ledger.

Resuming is replay: :func:`resume_run` runs the same deterministic loop again over the same ledger.
Every evaluation already recorded is read back instead of executed, and every event already
recorded is not appended twice (events are keyed), so a run killed at any point — even with
``kill -9`` — continues exactly where it stopped without recomputing or losing a completed
evaluation.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import platform
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ratchet.critic import Evaluation
from ratchet.errors import EndpointError, LedgerError, RatchetError, WriterLeaseError
from ratchet.execution import Executor, executor_from_spec
from ratchet.ledger import EventType, LedgerStore
from ratchet.ledger.lease import WriterLease
from ratchet.ledger.projection import active_seconds
from ratchet.ledger.rounds import unfinished_round
from ratchet.ledger.storage import LEDGER_FILE, POINTER_FILE, is_run_id, open_store, storage_url, write_pointer
from ratchet.metrics import check_logging, metrics_tap
from ratchet.planner import Budget, IncumbentPlanner, Pricing, SeedSplits, Stop, StopKind
from ratchet.policy import (
    SOURCE_KINDS,
    SPACE_KINDS,
    Candidate,
    PolicyProgram,
    load_policy,
    parse_policy,
    uses_task_dims,
)
from ratchet.refiners import GenerationCost, Refiner, ThompsonAllocator
from ratchet.refiners.registry import RefinerContext, arm_names, refiner_kind
from ratchet.runs import lock_run_dir, new_run_id, open_for_writing, open_ledger, open_run, started_event
from ratchet.services import RunServices, _cut, eval_key
from ratchet.shortlist import Shortlist, gate_power
from ratchet.spec import RunSpec, spec_from_dict
from ratchet.tasks import Task, task_from_dict, task_from_spec

__all__ = ["LEDGER_FILE", "RunResult", "eval_key", "open_ledger", "open_run", "resume_run", "start_run"]

ProgressFn = Callable[[dict[str, Any]], None]



#: Most seeds per candidate of the final confirmation (``_Run.confirmation_size``).
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


def _diff_sd(cand_val: Evaluation, inc_val: Evaluation) -> float | None:
    """Standard deviation of a decision's paired validation differences (return units); None after an error or
    with fewer than 2 pairs."""
    if cand_val.n_errors or cand_val.n < 2:
        return None
    return float((cand_val.returns - inc_val.returns[:cand_val.n]).std(ddof=1))


#: How the stop reason of a run whose starting policy failed every validation episode begins (the CLI exits 1).
BROKEN_START = "the starting policy failed all"


@dataclass(frozen=True)
class RunResult:
    """What a finished run returns.

    Attributes:
        run_dir: The run's directory (holds ``policy.py``, the report, and ``ledger.sqlite`` or, with a
            storage URL, the ``ledger.json`` pointer to the database).
        stop_reason: Why the loop stopped.
        incumbent: The final incumbent candidate.
        baseline_test: Test evaluation of the starting policy.
        test: Test evaluation of the final incumbent.
    """

    run_dir: Path
    stop_reason: str
    incumbent: Candidate
    baseline_test: Evaluation
    test: Evaluation


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("policy-ratchet", "gymnasium", "numpy", "cma", "scipy", "box2d"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


class _Run(RunServices):
    """One run's loop over its recorded services (:class:`~ratchet.services.RunServices`): :meth:`run` reads
    plan → execute → critique → refine → gate, and prices work with :class:`~ratchet.planner.Pricing`; it holds
    no policy logic of its own."""

    def __init__(self, run_dir: Path, spec: RunSpec, program: PolicyProgram, ledger: LedgerStore,
                 executor: Executor, progress: ProgressFn | None, pricing: str | None = None,
                 start: Candidate | None = None, inputs: dict[str, str] | None = None, task: Task | None = None) -> None:
        super().__init__(run_dir, spec, program, ledger, executor, pricing, start, inputs, task)
        self.progress = progress
        self.budget = Budget(spec.budget)
        self.planner = IncumbentPlanner(self.splits, spec.planner.train_episodes, spec.gate.max_share, self.budget,
                                        spec.planner.gate_candidate, spec.planner.weakness_share,
                                        spec.planner.pool_size)
        self.planner.unit = self.task.cost_unit
        self.powered = spec.planner.decide in ("powered", "end")  # the shortlist decides (with a final decision)
        self.end_only = spec.planner.decide == "end"  # ... and only once, when the budget ends the search
        self.shortlist = Shortlist()
        self.confirm_episodes = spec.planner.confirm_seeds(spec.gate.validation_episodes)
        self._confirmed_seeds = 0  # confirmation seeds used so far (each round reads fresh training seeds)
        self._trained: set[str] = set()  # candidates with a training evaluation (a new one is search, not re-evaluation)
        confirmation = spec.planner.confirmation_reserve(spec.gate.validation_episodes)
        self.prices = Pricing(spec.budget, self.usage, self.planner, self.task.step_limit, self.price_limit,
                              self.validation_price(), spec.planner.train_episodes,
                              reference=not self.powered or spec.planner.weakness_share > 0,
                              confirmation_episodes=confirmation)
        self.refiners = self._build_refiners()
        names = list(self.refiners)
        self.allocator = ThompsonAllocator(names, spec.seed) if len(names) > 1 else None

    def _build_refiners(self) -> dict[str, Any]:
        """One refiner (or several: variants) per ``[[refiners]]`` table, from the kinds' registry."""
        entries = self.spec.refiner_entries()
        out: dict[str, Any] = {}
        for i, (entry, name) in enumerate(zip(entries, arm_names(entries))):
            kind = refiner_kind(entry["kind"])
            settings = kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")})
            ctx = RefinerContext(program=self.program, start=self.start, task=self.task, seed=self.spec.seed + 1000 * i,
                                 name=name, train=self.train, artifact=self.artifact,
                                 training_seeds=self.training_seeds, exchange=self.exchange,
                                 read_input=self.read_input, critique=self.critique_of, time_left=self.time_left)
            for ref in kind.build(settings, name, ctx):
                out[ref.name] = ref
        return out

    def choose_and_price(self, generation: int, est_len: float, stop: Stop | None
                         ) -> tuple[str, GenerationCost, tuple[float, int], Stop | None]:
        """Which refiner takes this generation (:meth:`choose_refiner`), what its generation costs (cut to the
        budget's rest where it can be, :meth:`~ratchet.planner.Pricing.fit`) and the gate it must leave room for;
        with why the run stops here instead (``stop`` already set, no room left, or the refiner is idle).

        Returns:
            ``(arm, cost, reserve, stop)``: ``reserve`` is (env steps, episodes) kept for the gate.
        """
        reserve = self.prices.gate_reserve(self._longest)

        def fits(r: Refiner) -> bool:  # the refiner's generation, its training jobs and a kept gate
            return self.prices.fits(r, est_len, reserve)

        arm = self.choose_refiner(generation, fits) if stop is None else next(iter(self.refiners))
        refiner = self.refiners[arm]
        if stop is None and not fits(refiner):
            self.prices.fit(refiner, est_len, reserve)  # e.g. PPO cuts its job to the budget's rest
        cost = refiner.generation_cost()
        idle = refiner.idle_reason()
        stop = stop or (Stop(StopKind.IDLE, idle) if idle is not None else None)
        if stop is None and not fits(refiner):  # on the first generation, nothing would happen at all: say so
            stop = self.prices.no_room_message(self.prices.evaluations(cost), est_len, self._longest, first=generation == 1,
                                               training=cost.training_env_steps)
        return arm, cost, reserve, stop

    def see_training_returns(self, evaluations: Sequence[Evaluation]) -> None:
        """Widen the range of training returns seen (the betting gate's bound when no return range is set)."""
        for e in evaluations:
            for ep in e.episodes:
                if ep.error is None:
                    self._train_returns = [min(self._train_returns[0], ep.episode_return),
                                           max(self._train_returns[1], ep.episode_return)]

    def others_available(self, arm: str, est_len: float, reserve: tuple[float, int]) -> bool:
        """Whether a refiner other than ``arm`` may still take generations (not idle, and its generation and
        ``reserve`` fit the budget, episodes priced from ``est_len`` env steps)."""
        return any(a != arm and r.idle_reason() is None and self.prices.fits(r, est_len, reserve)
                   for a, r in self.refiners.items())

    def choose_refiner(self, generation: int, fits: Callable[[Any], bool] = lambda r: True) -> str:
        """Which refiner configuration gets this generation (Thompson sampling when there are several);
        the choice and its reasons are recorded in the ledger. A refiner that is idle, or whose generation
        no longer ``fits`` the budget (a training job priced above what is left), sits out while another
        can go on, so a cheap refiner may spend what an expensive one leaves."""
        if self.allocator is None:
            return next(iter(self.refiners))
        available = [a for a, r in self.refiners.items()
                     if r.idle_reason() is None and fits(r)]
        if not available:
            return next(iter(self.refiners))
        arm, why = self.allocator.choose(generation, available)
        self.record(EventType.GENERATION_PLANNED, f"plan/{generation}", {"generation": generation, **why})
        return arm

    def report_progress(self, **info: Any) -> None:
        if self.progress is not None:
            self.progress({"usage": self.usage, "budget": self.spec.budget, "cost_unit": self.task.cost_unit, **info})

    def gate_step(self, generation: int, best: Candidate | None, train: dict[str, Evaluation], incumbent: Candidate,
                  inc_val: Evaluation, next_cost: tuple[float, int],
                  est_len: float) -> tuple[Any, str, Evaluation | None, Evaluation]:
        """Screen the generation's best contender, validate it when the budget allows, and let the gate
        decide. Returns the decision (None when no gate ran), one line saying why no gate ran or the
        gate's verdict, the contender's validation evaluation (None when no gate ran), and the
        incumbent's validation evaluation (a sequential gate may extend it to more seeds)."""
        if best is None:
            if self._failures:  # the refiner's outside service failed: say so, not "failed episodes"
                return None, (f"the LLM endpoint failed {len(self._failures)} request(s) this generation "
                              f"(last: {self._failures[-1][:200]})"), None, inc_val
            if not train and self._refused:  # nothing ran: every proposal failed its checks
                refused = (f"no contender: all {self._refused} proposal(s) were refused before any episode ran "
                           "(`ratchet show` counts them; an LLM's answers and why: `ratchet llm-log`)")
                return None, refused, None, inc_val
            return None, "no contender finished its training episodes without an error", None, inc_val
        inc_train = train[incumbent.id]
        note = self.planner.screen(train[best.id], inc_train, inc_val.mean)
        if note is None:
            # the contender's own episode lengths are the best guess of its validation lengths
            cand_train = train[best.id]
            val_len = max(est_len, inc_val.env_steps / max(1, inc_val.n), cand_train.env_steps / max(1, cand_train.n))
            note = self.planner.validation_hold(self.usage, self.prices.validation_episodes, val_len, next_cost[0],
                                                self.prices.episode_price(val_len), next_cost[1])
        if note is not None:
            return None, note, None, inc_val
        decision, cand_val, inc_val = self.decide(generation, best, incumbent, inc_val)
        if decision is None:
            return None, "validation cut short by the env-step budget", None, inc_val
        return decision, decision.reason, cand_val, inc_val

    def next_level(self) -> float:
        """The significance level the run's next contested decision is tested at (alpha spending, fallback rule)."""
        from ratchet.gate import fallback_level

        return fallback_level(self.gate.alpha, self._n_contested + 1, self.gate.spending, self._carry)

    def certify(self, generation: int, incumbent: Candidate, inc_val: Evaluation, next_cost: tuple[float, int],
                est_len: float, final: bool = False
                ) -> tuple[Any, str, Evaluation | None, Evaluation, Candidate | None]:
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

        Returns:
            ``(decision, note, candidate validation, incumbent validation, gated candidate)``: the decision, the
            candidate's validation and the candidate are None when no gate ran; ``note`` says why, in one line.
        """
        sl, want, n_val = self.shortlist, self.spec.planner.power, len(self.validation_seeds)
        top = sl.candidates(self.spec.planner.confirm_top)
        if not top:
            return None, "no contender on the shortlist (none finished its training episodes without an error)", \
                None, inc_val, None
        level = self.next_level()
        if not final:
            gain = sl.expected_gain(top[0])
            power = gate_power(gain, sl.spread(), n_val, level)
            if power < want:
                return None, (f"shortlist leader: expected gain {gain:+.2f}, power {power:.2f} < [planner] power "
                              f"{want:g} at α {level:.3g} on {n_val} seeds; search goes on"), None, inc_val, None
            val_len = max(est_len, inc_val.env_steps / max(1, inc_val.n))
            hold = self.planner.validation_hold(self.usage, self.prices.validation_episodes, val_len, next_cost[0],
                                                self.prices.episode_price(val_len), next_cost[1])
            if hold is not None:
                return None, hold, None, inc_val, None
        entries = [e for e in top if e.against != incumbent.id]
        n_first = min(self.confirm_episodes, self._episode_room(len(entries) + 1)) if final else self.confirm_episodes
        if n_first < 1:  # an episode budget has no hard cap in the executor: never run past it
            return None, "the episode budget left cannot pay for a confirmation", None, inc_val, None
        cut = self.confirm(generation, entries, incumbent, inc_val, n_first)
        pool = list(top)
        while final and not cut:  # successive halving: the better half again, on what the budget leaves after validation
            survivors = sorted(pool, key=lambda e: -sl.expected_gain(e))[:max(2, (len(pool) + 1) // 2)]
            length = max([e.length for e in survivors] + [inc_val.env_steps / max(1, inc_val.n)])
            n_conf = self.confirmation_size(len(survivors) + 1, length, max(e.length_sd for e in survivors))
            if n_conf < self.confirm_episodes:  # what is left would not change the choice much
                break
            cut, pool = self.confirm(generation, survivors, incumbent, inc_val, n_conf), survivors
        if cut:
            return None, "confirmation cut short by the env-step budget", None, inc_val, None
        lead = max(pool, key=sl.expected_gain)  # the last round's survivors: one left out earlier keeps a noisier estimate
        gain = sl.expected_gain(lead)
        power = gate_power(gain, lead.confirmed_sd if lead.confirmed_sd is not None else sl.spread(), n_val, level)
        if gain <= 0 or (not final and power < want):
            why = "no gain to certify" if gain <= 0 else "too little power to certify it"
            return None, (f"not gated, {why}: the best candidate's gain over the incumbent on fresh training seeds "
                          f"{gain:+.2f} (power {power:.2f})" + ("" if final else "; search goes on")), None, inc_val, None
        cap = self.final_validation(lead.length, lead.length_sd) if final else None
        if cap is not None and cap < 2:
            return None, "the env-step budget left cannot pay for the final validation", None, inc_val, None
        decision, cand_val, inc_val = self.decide(generation, lead.candidate, incumbent, inc_val,
                                                  label="final" if final else None, cap=cap)
        if decision is None:
            return None, "validation cut short by the env-step budget", None, inc_val, None
        sl.decide(lead.candidate.id, decision.promoted, cand_val.mean, _diff_sd(cand_val, inc_val))
        return decision, decision.reason, cand_val, inc_val, lead.candidate

    def confirm(self, generation: int, entries: Sequence[Any], incumbent: Candidate, inc_val: Evaluation, n: int) -> bool:
        """Run ``entries``' candidates and the incumbent on ``n`` fresh training seeds of the confirmation range (counted
        as re-evaluation) and record each entry's paired differences; True when the env-step cap cut it short."""
        if not entries or n < 1:
            return False
        start = 2_000_000_000 + self._confirmed_seeds
        self._confirmed_seeds += n
        ev = self.evaluate([e.candidate for e in entries] + [incumbent], self.splits.seeds("train", start, n), "train",
                           generation)
        self.usage.reeval_env_steps += sum(x.env_steps for x in ev.values())
        if any(_cut(x) for x in ev.values()):
            return True
        for e in entries:
            self.shortlist.confirm(e, ev[e.candidate.id], ev[incumbent.id])
            lengths = [ep.length for ep in ev[e.candidate.id].episodes]
            e.length = float(np.mean(lengths))
            e.length_sd = float(np.std(lengths)) if len(lengths) > 1 else e.length
        return False

    def confirmation_size(self, runs: int, length: float, length_sd: float = 0.0) -> int:
        """Seeds per candidate for the final confirmation of ``runs`` candidates (the incumbent among them): what the
        budget leaves once one validation is paid for — env steps with every episode priced at ``length`` (env steps,
        the longest mean length of the episodes it reads) and a 10 % margin on the validation, and episodes — at most
        :data:`MAX_CONFIRM` (0 when nothing is left, and with no env-step or episode budget: a run bounded by its wall
        clock alone gets one round of confirmation). So the run ends with its budget spent on choosing well."""
        b, u, n_val = self.budget.spec, self.usage, len(self.validation_seeds)
        if b.env_steps is None and b.episodes is None:
            return 0
        n = MAX_CONFIRM
        if b.env_steps is not None:
            left = b.env_steps - u.env_steps - _validation_price(n_val, length, length_sd, self.task.step_limit)
            n = min(n, int(left // (runs * max(1.0, length))))
        return max(0, min(n, self._episode_room(runs)))

    def _episode_room(self, runs: int) -> int:
        """Seeds per candidate that ``runs`` candidates can each play with what ``[budget] episodes`` leaves once one
        validation is paid for (unbounded without an episode budget; may be negative)."""
        b, u = self.budget.spec, self.usage
        if b.episodes is None:
            return MAX_CONFIRM
        return (b.episodes - u.episodes - len(self.validation_seeds)) // runs

    def final_validation(self, length: float, length_sd: float = 0.0) -> int:
        """Validation seeds the final decision can afford: all of them unless the budget left is short (env steps: its
        episodes priced at ``length`` with a 10 % margin; episodes). Chosen before the candidate's first validation
        episode, so the gate's level holds."""
        b, u = self.budget.spec, self.usage
        n = len(self.validation_seeds)
        if b.episodes is not None:
            n = min(n, b.episodes - u.episodes)
        if b.env_steps is not None:
            while n > 0 and _validation_price(n, length, length_sd, self.task.step_limit) > b.env_steps - u.env_steps:
                n -= 1
        return n

    def final_decision(self, generation: int, incumbent: Candidate, inc_val: Evaluation
                       ) -> tuple[Candidate, Evaluation]:
        """The budget ended the search (``decide = "powered"``, or ``"every"`` with ``[planner] final``): certify the
        shortlist's best confirmed candidate with the validation kept for it (:meth:`certify` with ``final``);
        recorded as the gate decision labelled ``final``. Returns the incumbent
        and its validation evaluation after it."""
        if not self.shortlist.entries:
            return incumbent, inc_val
        decision, note, cand_val, inc_val, best = self.certify(generation, incumbent, inc_val, (0.0, 0), 1.0,
                                                               final=True)
        self.record(EventType.FINAL_DECISION, "final_decision",
                    {"generation": generation, "gated": decision is not None, "note": note,
                     "promoted": bool(decision is not None and decision.promoted),
                     **({"candidate_id": best.id} if best is not None else {})})
        if decision is not None and decision.promoted and best is not None and cand_val is not None:
            return best, cand_val
        return incumbent, inc_val

    def broken_start(self, inc_val: Evaluation) -> Stop | None:
        """Why the run must not search at all: every validation episode of the starting policy ended in an
        error (a model for another env, an unsupported algorithm, an act() that raises), quoting the first."""
        if not inc_val.n or inc_val.n_errors < inc_val.n:
            return None
        first = next(e.error for e in inc_val.episodes if e.error is not None).strip().splitlines()[-1][:300]
        return Stop(StopKind.BROKEN, f"{BROKEN_START} {inc_val.n} of its validation episodes, so nothing was "
                    f"searched: {first}; see the episodes with `ratchet evaluate --run {self.run_dir}`")

    def run(self) -> RunResult:
        spec = self.spec
        baseline = self.start
        self.record_candidate(baseline, 0)
        incumbent = baseline
        self.task_after_incumbent(baseline)  # e.g. a game's self-play league starts with the start policy
        n_first = self.gate.first_look(len(self.validation_seeds))  # a sequential gate extends it as decisions read
        inc_val = self.evaluate([incumbent], self.validation_seeds[:n_first], "validation", 0)[incumbent.id]
        self.shortlist.fallback = inc_val.mean
        est_len = max(1.0, inc_val.env_steps / max(1, inc_val.n))
        self._longest = est_len  # the longest mean episode length of any evaluation so far
        stale, generation, completed, stop = 0, 0, 0, self.broken_start(inc_val)
        critique = None  # the incumbent's latest training critique, handed to the refiner
        while stop is None:
            generation += 1
            replaying = self._replaying = self.ledger.get(f"generation/{generation}") is not None
            self.usage.wall_clock_s = self._clock_offset + time.monotonic() - self._session_start
            stop = self.budget.stop_reason(self.usage, inc_val.mean, stale, check_clock=not replaying)
            # plan: which refiner, what its generation costs, whether it fits; the training seeds
            arm, cost, reserve, stop = self.choose_and_price(generation, est_len, stop)
            if stop is not None:
                break
            refiner = self.refiners[arm]
            n_candidates, training = self.prices.evaluations(cost), cost.training_env_steps
            rerun = self.prices.reruns_incumbent(cost)  # the incumbent on the same seeds: a paired reference
            plan = self.planner.plan(generation)
            self._spare = self.prices.spare(n_candidates, est_len, reserve, training)  # for trace replays
            # refine (propose) — from the incumbent and its latest critique
            recommended = refiner.recommend()
            if recommended is not None and recommended.source != incumbent.source:
                recommended = None  # for a program the incumbent no longer runs (a structural promotion since)
            self._failures, stopped = [], None  # the generation's failed requests to outside services
            try:
                proposed = refiner.propose(incumbent, critique, self.rng)
            except EndpointError as exc:  # its service is down: go on without it, or stop (resumable)
                if not self.others_available(arm, est_len, reserve):
                    raise
                proposed, stopped = list(exc.proposals), str(exc)
            screened = refiner.take_rejections()
            proposals = self.screen_proposals(arm, incumbent, proposed, generation, screened)
            self._refused = len(screened) + len(proposed) - len(proposals)  # refused before any episode ran
            contenders = proposals + ([recommended] if recommended is not None else [])
            rerun = rerun and bool(contenders)  # no contender: nothing to compare the incumbent with
            self.record_candidates(contenders, generation)
            # execute
            train = self.evaluate(contenders + [incumbent] * rerun, plan.train_seeds, "train", generation)
            gen_evals = list(train.values())
            self.usage.reeval_env_steps += sum(e.env_steps for c, e in train.items() if c in self._trained)
            self._trained.update(train)
            if any(_cut(e) for e in gen_evals):  # the executor's hard cap stopped it: judge nothing from it
                stop = Stop(StopKind.BUDGET,
                            "env-step budget used (the last generation was cut short by the cap; it was not judged)")
                break
            # its own recommendation's evaluation after the proposals'; the incumbent's on the same seeds comes last:
            # a reference for paired comparisons
            refiner.observe([train[c.id] for c in contenders] + ([train[incumbent.id]] if rerun else []))
            self.see_training_returns(gen_evals)
            if gen_evals and not any(e.env_steps for e in gen_evals):
                stop = Stop(StopKind.BROKEN, "every episode of the generation failed before its first env step; see "
                            f"why with `ratchet evaluate --run {self.run_dir}`")
            if gen_evals:  # else the last generation's lengths still price the next
                est_len = max(1.0, sum(e.env_steps for e in gen_evals) / max(1, sum(e.n for e in gen_evals)))
            self.shortlist.observe(generation, contenders, train, incumbent, recommended)  # the final decision's pool
            if self.powered or spec.planner.final:  # decisions read the shortlist's best and the incumbent: their lengths price them
                self._longest = max(self.shortlist.longest(spec.planner.confirm_top), inc_val.env_steps / max(1, inc_val.n))
            else:
                self._longest = max([self._longest] + [e.env_steps / e.n for e in gen_evals if e.n])
            # critique
            inc_train = train.get(incumbent.id)
            if inc_train is not None:
                critique = self.critic.critique(inc_train)
                threshold = self.task.success_threshold
                self.planner.observe_incumbent(inc_train, threshold if threshold is not None else inc_val.mean)
            best = gen_best = self.planner.gate_candidate(contenders, recommended, train, incumbent)
            # gate
            reserve = self.prices.gate_reserve(self._longest)
            next_cost = (self.planner.generation_cost(n_candidates, est_len, self.prices.episode_price(est_len)) + reserve[0]
                         + training,
                         n_candidates * spec.planner.train_episodes + reserve[1])
            if self.end_only:  # the search spends the budget; the shortlist's best is decided once, at the end
                decision, note, cand_val, best = None, "decide = \"end\": the gate decides when the search ends", None, None
            elif self.powered:  # the best seen so far, certified when a decision is likely to pass
                decision, note, cand_val, inc_val, best = self.certify(generation, incumbent, inc_val, next_cost, est_len)
            else:
                decision, note, cand_val, inc_val = self.gate_step(generation, best, train, incumbent, inc_val,
                                                                   next_cost, est_len)
                if decision is not None and best is not None and cand_val is not None:
                    self.shortlist.decide(best.id, decision.promoted, cand_val.mean, _diff_sd(cand_val, inc_val))
            promoted = decision is not None and decision.promoted
            refiner.verdict(best.id if best is not None else None, promoted, note)
            if promoted and best is not None and cand_val is not None:
                gain = cand_val.mean - inc_val.mean
                incumbent, inc_val = best, cand_val
            if self.allocator is not None:
                self.allocator.record(arm, gain if promoted else 0.0)
            stale = 0 if promoted or (self.powered and self.shortlist.led_by(generation)) else stale + 1
            summary = {"generation": generation, "train_seeds": list(plan.train_seeds),
                       "weak_seeds": list(plan.weak_seeds), "weakness_pool": len(self.planner.pool),
                       "best_train_mean": train[gen_best.id].mean if gen_best else None,
                       **({"gated_id": best.id} if decision is not None and best is not None else {}),
                       "incumbent_train_mean": inc_train.mean if inc_train is not None else None,
                       "incumbent_id": incumbent.id,
                       "incumbent_validation_mean": inc_val.mean, "gated": decision is not None,
                       "gate_note": note,
                       "promoted": promoted, "refiner": arm, "population": cost.proposals,
                       "cost": dataclasses.asdict(cost),
                       **refiner.summary(),
                       "env_steps": self.usage.env_steps, "episodes": self.usage.episodes,
                       "validation_env_steps": self.usage.validation_env_steps,
                       "critique": critique.to_dict() if critique is not None and inc_train is not None else None,
                       "endpoint_failures": len(self._failures),
                       **({"refiner_stopped": stopped} if stopped else {})}
            self.record(EventType.GENERATION_FINISHED, f"generation/{generation}", summary)
            if promoted and incumbent.id in train:  # the next generation edits the new incumbent: its own critique
                critique = self.critic.critique(train[incumbent.id])
            self.report_progress(**summary, wall_clock_s=self.usage.wall_clock_s, n_refiners=len(self.refiners))
            completed = generation

        # [planner] final: only when the env-step or episode budget ended the search (not the clock, a target,
        # patience or an idle refiner: each of those says the run should end now)
        if (self.powered and stop.kind is not StopKind.BROKEN) or (spec.planner.final and stop.kind is StopKind.BUDGET):
            incumbent, inc_val = self.final_decision(completed, incumbent, inc_val)
        # final, report-only test evaluation (never used for selection)
        test = self.evaluate([incumbent, baseline], self.test_seeds, "test", completed)
        self.usage.wall_clock_s = self._clock_offset + time.monotonic() - self._session_start
        self.record(EventType.RUN_FINISHED, "run_finished",
                    {"stop_reason": str(stop), "stop_kind": stop.kind.value, "generations": completed, "incumbent_id": incumbent.id,
                     "baseline_id": baseline.id, "incumbent_validation_mean": inc_val.mean,
                     "test": test[incumbent.id].summary(), "baseline_test": test[baseline.id].summary(),
                     "test_critique": self.critic.critique(test[incumbent.id], test[baseline.id]).to_dict(),
                     "baseline_test_critique": self.critic.critique(test[baseline.id]).to_dict(),
                     "env_steps": self.usage.env_steps, "episodes": self.usage.episodes,
                     "wall_clock_s": self.usage.wall_clock_s,
                     "env_steps_breakdown": self.usage.breakdown(spec.budget.env_steps)})
        return RunResult(self.run_dir, str(stop), incumbent, test[baseline.id], test[incumbent.id])


def _drive(run: _Run, close_executor: bool, lock_fd: int, lease: WriterLease) -> RunResult:
    # [logging]: the run's progress function, chained behind a tap that writes the ledger's new generation events
    # as scalars (ratchet.metrics); the loop itself knows no writer
    metrics = None
    try:
        metrics = metrics_tap(run.spec.logging.tensorboard, started_event(run.ledger).payload["run_id"], run.ledger,
                              run.progress)
        if metrics is not None:
            run.progress = metrics
        return run.run()
    except (KeyboardInterrupt, WriterLeaseError):  # a lost lease: another process writes the run now
        raise
    except Exception as exc:
        if not lease.lost:
            run.record(EventType.RUN_FAILED, f"run_failed/{time.time()}", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        if metrics is not None:
            metrics.close()  # the events since the last generation (the test means) first; never raises
        lease.release()
        run.ledger.close()
        if close_executor:
            run.executor.close()
        os.close(lock_fd)


def start_run(spec: RunSpec, runs_dir: str | Path = "runs", run_id: str | None = None, *,
              executor: Executor | None = None, progress: ProgressFn | None = None,
              storage: str | None = None) -> RunResult:
    """Start a new run of ``spec`` in ``runs_dir/run_id`` and drive it to the end.

    Args:
        spec: Validated run spec.
        runs_dir: Folder that holds run directories.
        run_id: Directory name; default ``<spec.name>-<timestamp>-<hex>``.
        executor: Where episodes run; default a process pool per ``[execution]`` (closed at the end;
            an executor passed in stays open, so one pool can serve many runs).
        progress: Called after each generation with a dict: ``generation``, ``best_train_mean`` (None
            when no contender finished cleanly), ``incumbent_validation_mean``, ``incumbent_id``,
            ``gated``, ``promoted``, ``gate_note`` (why no gate ran, or the gate's verdict, one line),
            ``usage`` (:class:`ratchet.planner.Usage`: env steps, episodes, validation env steps,
            seconds), ``budget`` (the spec's ``[budget]``) and more (see the ``generation_finished``
            event). :class:`ratchet.progress.ProgressPrinter` prints it as ``ratchet run`` does. With
            ``[logging] tensorboard`` in the spec, each generation's scalars are written first
            (:mod:`ratchet.metrics`), for a resumed run (:func:`resume_run`) too.
        storage: Where the ledger goes: None for ``ledger.sqlite`` in the run directory, or a database
            URL (``postgresql://USER@HOST/DB``, ``sqlite:///PATH``) shared by many runs; the run directory
            then holds a ``ledger.json`` pointer to it (without the password).

    Returns:
        The :class:`RunResult`.

    Raises:
        SpecError: the spec is invalid (checked again here: ``model_copy`` skips validation), e.g. its
            budget cannot pay for the starting policy's first validation, or its ``[logging] tensorboard``
            folder cannot be written (or tensorboardX is not installed).
        PolicyError: the policy file is invalid.
        LedgerError: bad storage URL or unreachable database.
        RatchetError: the run directory or the database already holds this run (use :func:`resume_run`).
    """
    spec_from_dict(spec.to_dict(), spec.base_dir)
    check_logging(spec.logging.tensorboard)
    task = task_from_spec(spec.task)
    spaces = task.spaces()  # the environment, made once with no policy code: setup problems fail here, in one line
    SeedSplits(spec.seed, task.seed_pools()).check_sizes(spec.gate.validation_episodes, spec.test.episodes,
                                                         spec.planner.train_episodes)
    program, start, start_blobs = load_start(spec, task, spaces)
    run_id = run_id or new_run_id(spec.name)
    if not is_run_id(run_id):
        raise RatchetError(f"run id {run_id!r} must be a plain name (letters, digits, '.', '_', '-'; no '/' or '..')")
    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        raise RatchetError(f"--runs-dir {runs_dir} is a file; give a folder for run directories")
    if (Path(runs_dir) / LEDGER_FILE).exists() or (Path(runs_dir) / POINTER_FILE).exists():
        raise RatchetError(f"--runs-dir {runs_dir} is a run's own directory; give the folder that holds runs "
                           f"({Path(runs_dir).parent})")
    run_dir = Path(runs_dir) / run_id
    if (run_dir / LEDGER_FILE).exists() or (run_dir / POINTER_FILE).exists():
        raise RatchetError(f"run {run_id} already exists in {runs_dir}; pick another --run-id "
                           f"(or `ratchet resume {run_dir}` if it was interrupted)")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RatchetError(f"{run_dir} exists and is not a run directory; pick another --run-id or --runs-dir")
    url = storage_url(storage)
    check_refiners(spec)
    ledger = open_store(url, run_dir, run_id) if url else None  # a bad URL fails before any folder is made
    own_executor, lock_fd = executor is None, None
    try:
        if ledger is not None and ledger.get("run_started") is not None:
            raise RatchetError(f"{ledger.location} already exists; pick another --run-id "
                               f"(or `ratchet resume {run_id} --storage URL` if it was interrupted)")
        # an executor that cannot start (Ray unreachable, isolation required but missing) fails here,
        # before any run directory exists
        executor = executor or _executor_for(spec)
        made = not run_dir.exists()  # else an empty folder the user named: emptied again, not removed, on failure
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            # atomic: of two runs racing for one id, one gets it; 0700: policy code (nobody) cannot read it
            run_dir.mkdir(mode=0o700, exist_ok=run_dir.is_dir())
            lock_fd = lock_run_dir(run_dir)
            if program.source:
                (run_dir / "policy.py").write_text(program.source, encoding="utf-8")
            if url:
                write_pointer(run_dir, url, run_id)
        except FileExistsError:
            raise RatchetError(f"run {run_id} already exists in {runs_dir}; pick another --run-id") from None
        except OSError as exc:
            raise RatchetError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    except BaseException:
        if ledger is not None:
            ledger.close()
        if own_executor and executor is not None:
            executor.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    ledger = ledger or open_store(None, run_dir, run_id)
    try:
        for data in start_blobs.values():  # before any event names them
            ledger.put_artifact(data)
        run = _Run(run_dir, spec, program, ledger, executor, progress, start=start, task=task)
    except BaseException:  # e.g. a refiner refused its input files: no run began, so no run directory is left
        ledger.close()
        if own_executor:
            executor.close()
        os.close(lock_fd)
        for path in [run_dir] if made else list(run_dir.iterdir()):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        raise
    try:
        lease: WriterLease | None = WriterLease.acquire(ledger, run_id)
    except WriterLeaseError:  # another process took this run id between our checks and now
        lease = None
    created = lease is not None and ledger.append(EventType.RUN_STARTED, "run_started", {
        "run_id": run_id, "spec": spec.to_dict(), "policy_source": program.source, "policy_path": str(spec.policy_path),
        "task": run.task.to_dict(), "versions": _versions(), "pid": os.getpid(), "host": socket.gethostname(),
        "execution": _describe(run.executor), "pricing": run.pricing, "start_candidate": start.to_dict(),
        "inputs": dict(run.inputs),
        "seeds": {"validation": run.validation_seeds, "test": run.test_seeds,
                  "train": "fresh each generation: SeedSplits(run_seed).seeds('train', ...)"}})[1]
    if not created or lease is None:  # another process started this run id between our checks and now
        if lease is not None:
            lease.release()
        if own_executor:
            executor.close()
        ledger.close()
        os.close(lock_fd)
        raise RatchetError(f"run {run_id} was started by another process just now; pick another --run-id")
    return _drive(run, close_executor=own_executor, lock_fd=lock_fd, lease=lease)


def _describe(executor: Executor) -> dict[str, Any]:
    describe = getattr(executor, "describe", None)  # optional: wrappers and custom executors may lack it
    try:
        return describe() if callable(describe) else {"backend": type(executor).__name__}
    except Exception:  # noqa: BLE001 - a custom executor's description must never stop a run from starting
        return {"backend": type(executor).__name__}


def check_refiners(spec: RunSpec) -> None:
    """Each refiner kind's look at what it needs outside ratchet (an LLM endpoint: reachable, the key
    accepted, the model listed), before a new run spends anything (:attr:`RefinerKind.check`).

    Raises:
        RatchetError: one line saying what to fix (an :class:`~ratchet.errors.EndpointError` for an endpoint).
    """
    entries = spec.refiner_entries()
    for entry, name in zip(entries, arm_names(entries)):
        kind = refiner_kind(entry["kind"])
        if kind.check is not None:
            kind.check(kind.settings(**{k: v for k, v in entry.items() if k not in ("kind", "name")}), name)



def load_program(path: str | Path, task: Task, dims: dict[str, int] | None = None) -> PolicyProgram:
    """:func:`ratchet.policy.load_policy` for ``task``: array shapes written as ``"obs"``/``"act"`` are
    resolved from the task's spaces (the driver makes the env for that; it never runs policy code).

    Raises:
        PolicyError: the policy file is invalid.
        TaskError: the policy needs the task's sizes and its environment cannot be made.
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        source = ""  # load_policy says what is wrong
    if uses_task_dims(source) and dims is None:
        dims = task.dims()
    return load_policy(path, dims=dims if uses_task_dims(source) else None, functions=task.functions)


def load_start(spec: RunSpec, task: Task, spaces: tuple[Any, Any] | None = None
               ) -> tuple[PolicyProgram, Candidate, dict[str, bytes]]:
    """The run's starting point for ``[policy]`` of any kind: the program (empty for network kinds), the
    starting candidate and its artifacts' bytes by digest (see :func:`ratchet.policies.start.start_candidate`).

    Raises:
        PolicyError: the policy file or model is invalid.
        TaskError: the environment cannot be made (network kinds need its spaces).

    Args:
        spec: The run spec.
        task: Its task.
        spaces: The task's ``(observation_space, action_space)`` when already made (else made when needed).
    """
    from ratchet.policies.start import start_candidate
    from ratchet.policy import space_dims

    kind = spec.policy.kind
    if kind != "program" and "act" not in task.functions:
        from ratchet.errors import PolicyError

        raise PolicyError(f"[policy] kind = {kind!r} maps observations to actions, but {task.name} calls "
                          f"{', '.join(task.functions)}(); use kind = \"program\" (a policy file defining them)")
    if spaces is None and kind in SPACE_KINDS:
        spaces = task.spaces()
    dims = space_dims(*spaces) if spaces is not None and spaces[0] is not None else None
    program = load_program(spec.policy_path, task, dims) if kind in SOURCE_KINDS else None
    return start_candidate(spec.policy, spec.base_dir, spaces if kind in SPACE_KINDS else None, spec.seed, program)


def _executor_for(spec: RunSpec) -> Executor:
    return executor_from_spec(spec.execution)


def resume_run(run: str | Path, runs_dir: str | Path = "runs", *, executor: Executor | None = None,
               progress: ProgressFn | None = None, storage: str | None = None) -> RunResult:
    """Continue a run that was interrupted (Ctrl-C, crash, ``kill -9``).

    The spec and policy come from the ledger, not from files that may have changed since. A run
    found only in ``storage`` (started on another machine) gets a run directory ``runs_dir/RUN_ID``
    with a pointer to its database.

    Only one process writes a run at a time, on any machine: resuming takes the run's writer lease
    (:class:`~ratchet.ledger.lease.WriterLease`), which a live writer holds and renews. A writer that
    died on this host is noticed at once; one on another host (same ``--storage`` database) once its
    lease expired, ``$RATCHET_LEASE_TTL_S`` (default 60) seconds after its last heartbeat.

    Args:
        run: Run id or run directory.
        runs_dir: Folder that holds run directories.
        executor: As for :func:`start_run`.
        progress: As for :func:`start_run`.
        storage: Database URL to look the run up in (see :func:`open_run`).

    Raises:
        RunNotFoundError: no such run.
        WriterLeaseError: another live process is writing the run (here or on another machine).
        LedgerError: the run already finished or its ledger has no start event.
    """
    ledger, run_dir, lock_fd, lease = open_for_writing(run, runs_dir, storage=storage)
    try:
        events = ledger.read()
        started = started_event(ledger)
        if ledger.get("run_finished") is not None:
            hint = (f"`ratchet show {run} --storage URL`" if storage else f"`ratchet show {run_dir}`")
            if unfinished_round(events) is not None:
                hint += f"; `ratchet correct {run} --resume-round` finishes its correction round"
            raise LedgerError(f"run {started.payload['run_id']} already finished; {hint}")
        r, lock_fd = rebuild_run(ledger, run_dir, lock_fd, executor, progress, storage)
    except BaseException:
        lease.release()
        ledger.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    r._clock_offset = active_seconds(events)
    ledger.append(EventType.RUN_RESUMED, f"resumed/{time.time()}", {"pid": os.getpid(), "host": socket.gethostname(),
                                                                      "events_before": len(events)})
    return _drive(r, close_executor=executor is None, lock_fd=lock_fd, lease=lease)


def spec_of(ledger: LedgerStore) -> RunSpec:
    """The run's spec as its ``run_started`` event recorded it (not the file, which may have changed since). A run
    recorded before ``[planner] final`` existed keeps the loop it was started with (``final = false``), so resuming
    it recomputes the same events."""
    return recorded_spec(started_event(ledger).payload["spec"])


def recorded_spec(data: dict[str, Any]) -> RunSpec:
    """A spec as a ledger recorded it (:meth:`RunSpec.to_dict`, every setting written out), read with the defaults of
    the code that recorded it where they have changed since: without ``[planner] final`` it was ``false``."""
    data = copy.deepcopy(data)
    planner = data.setdefault("planner", {})
    if isinstance(planner, dict):
        planner.setdefault("final", False)
    return spec_from_dict(data, where="ledger spec")


def rebuild_run(ledger: LedgerStore, run_dir: Path, lock_fd: int | None, executor: Executor | None = None,
                progress: ProgressFn | None = None, storage: str | None = None) -> tuple[_Run, int]:
    """The run's wiring rebuilt from its ``run_started`` event (spec, policy, starting candidate, inputs), for
    a writer that holds the run (:func:`open_for_writing`). A run found only in ``storage`` (started on
    another machine) gets a run directory here with a pointer to its database, and its lock. Without an
    ``executor``, a process pool per the spec's ``[execution]`` is started (last: nothing leaks when an
    earlier step fails); the caller closes it.

    Returns:
        ``(run, lock_fd)``.

    Raises:
        SpecError, PolicyError: the recorded spec or policy no longer loads (package versions changed).
        RatchetError: the run directory cannot be created.
    """
    started = started_event(ledger)
    spec = spec_of(ledger)
    source = started.payload["policy_source"]
    # the task as the run recorded it (an evaluator's source included), not as its files are now
    task = task_from_dict(started.payload["task"]) if "task" in started.payload else task_from_spec(spec.task)
    if spec.policy.kind not in SOURCE_KINDS:  # a network: no program
        program = PolicyProgram("", ())
    else:
        dims = task.dims() if uses_task_dims(source) else None
        program = parse_policy(source, started.payload.get("policy_path", "<policy>"), dims=dims,
                               functions=task.functions)
    if not run_dir.exists():  # found only in the database: give it a run directory here
        try:
            run_dir.mkdir(mode=0o700, parents=True)
            if program.source:
                (run_dir / "policy.py").write_text(program.source, encoding="utf-8")
            if storage is not None:  # a run found only in a database (always so here: it had no directory)
                write_pointer(run_dir, storage, started.payload["run_id"])
        except OSError as exc:
            raise RatchetError(f"cannot create run directory {run_dir}: {exc.strerror or exc}") from None
    if lock_fd is None:
        lock_fd = lock_run_dir(run_dir)
    start = (Candidate.from_dict(started.payload["start_candidate"]) if "start_candidate" in started.payload
             else program.candidate())
    return _Run(run_dir, spec, program, ledger, executor or _executor_for(spec), progress,
                pricing=started.payload.get("pricing", "worst-case"),
                start=start, inputs=started.payload.get("inputs", {}), task=task), lock_fd
