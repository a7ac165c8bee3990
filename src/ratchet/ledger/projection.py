"""Projections: a run's state rebuilt from its ledger events."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ratchet.critic import Evaluation
from ratchet.errors import LedgerError
from ratchet.ledger.events import Event, EventType, RejectionKind
from ratchet.ledger.storage import is_run_id
from ratchet.policy import Candidate
from ratchet.processes import process_running
from ratchet.rollout import Episode

if TYPE_CHECKING:
    from ratchet.ledger.lease import LeaseInfo

__all__ = ["RunState", "project", "used_counts"]


@dataclass
class RunState:
    """Everything ``ratchet show``/``report`` need, derived only from events.

    ``env_steps`` and ``episodes`` count training and validation episodes (the budget's units);
    ``env_steps`` also counts refiners' training jobs (``training_env_steps``: PPO updates), as the budget
    does; test episodes are reported separately in ``baseline_test``/``test``.

    ``corrections``: one dict per person's correction round after the run finished (see
    :mod:`ratchet.correction_round`): ``round``, ``candidate_id`` (the candidate the person corrected),
    ``episodes``, ``person_steps``, ``env_steps``, ``dataset`` (digest), ``status`` (``recorded``: not yet
    retrained and gated; ``finished``), and once finished ``student_id``, ``gated``, ``promoted``, ``reason``
    (the gate's verdict, or why no gate ran), ``incumbent_id``. The rounds' env steps are outside the run's
    budget and are not in ``env_steps``: ``correction_env_steps`` has them (``person``: the person's episodes;
    ``validation`` and ``test``: the rounds' evaluations), and ``env_steps_breakdown`` lists them as ``person``,
    ``correction validation`` and ``correction test``. A promoting round moves ``incumbent_id``; a finished
    round's test evaluation of the incumbent replaces ``test``.

    ``llm_usage``: per LLM refiner (arm name), what its endpoint was asked and spent (:func:`llm_usage_of`).

    ``status`` is ``running``, ``stale`` (its writer's lease expired without the run finishing or
    failing: the writer died or hangs, possibly on another machine; ``ratchet resume`` takes it over),
    ``interrupted`` (stopped, or its writer is gone from this machine), ``finished``, ``failed`` or
    ``unknown``; ``status_text`` says it for people. ``writer`` is the run's writer lease (see
    :meth:`ratchet.ledger.lease.LeaseInfo.to_json`) while the run is not finished or failed.
    """

    run_id: str = ""
    status: str = "unknown"
    spec: dict[str, Any] = field(default_factory=dict)
    #: The task as the run recorded it (:meth:`ratchet.tasks.Task.to_dict`; an evaluator's source included).
    task: dict[str, Any] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    execution: dict[str, Any] = field(default_factory=dict)
    policy_source: str = ""
    env_steps: int = 0
    episodes: int = 0
    validation_env_steps: int = 0
    training_env_steps: int = 0
    generations: int = 0
    wall_clock_s: float = 0.0
    started_at: float = 0.0
    stop_reason: str | None = None
    stop_kind: str | None = None  # ratchet.planner.StopKind's value (None in ledgers written before it was recorded)
    error: str | None = None
    baseline_id: str | None = None
    incumbent_id: str | None = None
    incumbent_validation_mean: float | None = None
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    #: the task as promotions changed it (``task_updated``: a game's league), each with the number of evaluations
    #: recorded before it took effect; ``league`` holds those events' payoff tables and meta-strategies
    task_versions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    league: list[dict[str, Any]] = field(default_factory=list)
    gates: list[dict[str, Any]] = field(default_factory=list)
    promotions: list[dict[str, Any]] = field(default_factory=list)
    rejected_proposals: list[dict[str, Any]] = field(default_factory=list)
    endpoint_failures: list[dict[str, Any]] = field(default_factory=list)
    generation_log: list[dict[str, Any]] = field(default_factory=list)
    baseline_test: dict[str, Any] | None = None
    test: dict[str, Any] | None = None
    baseline_test_critique: dict[str, Any] | None = None
    test_critique: dict[str, Any] | None = None
    writer: dict[str, Any] | None = None
    env_steps_breakdown: dict[str, Any] | None = None
    final_decision: dict[str, Any] | None = None  # the decision the budget's end brought (powered, or [planner] final)
    corrections: list[dict[str, Any]] = field(default_factory=list)
    correction_env_steps: dict[str, int] = field(default_factory=lambda: {"person": 0, "validation": 0, "test": 0})
    llm_usage: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def status_text(self) -> str:
        """The status for people: ``"stale: last heartbeat 3 min ago on host X"`` for a stale run."""
        if self.status == "stale" and self.writer:
            from ratchet.ledger.lease import format_age

            age = format_age(self.writer["last_heartbeat_s_ago"])
            return f"stale: last heartbeat {age} ago on host {self.writer['host']}"
        return self.status

    def candidate(self, candidate_id: str) -> Candidate:
        """The full candidate (source resolved) with this id (a unique prefix is enough).

        Raises:
            KeyError: unknown or ambiguous id.
        """
        matches = [c for c in self.candidates if c.startswith(candidate_id)]
        if len(matches) != 1:
            raise KeyError(candidate_id)
        d = dict(self.candidates[matches[0]])
        if d.get("source") is None:  # stored once, in run_started
            d["source"] = self.policy_source
        return Candidate.from_dict(d)

    def evaluation(self, candidate_id: str, split: str) -> Evaluation | None:
        """The latest evaluation of a candidate on a split (validation and test are fixed seed lists)."""
        for ev in reversed(self.evaluations):
            if ev["candidate_id"] == candidate_id and ev["split"] == split:
                return Evaluation(candidate_id, split, tuple(Episode.from_dict(e) for e in ev["episodes"]))
        return None

    def endpoint_failure_reasons(self, n: int = 5) -> list[dict[str, Any]]:
        """The most frequent reasons of ``endpoint_failures`` (requests to an LLM endpoint that got no answer:
        HTTP status, the server's message, attempts), as ``{"reason": ..., "count": ...}``, most frequent first."""
        counts: dict[str, int] = {}
        for f in self.endpoint_failures:
            reason = str(f.get("error") or "request failed")[:300]
            counts[reason] = counts.get(reason, 0) + 1
        return [{"reason": r, "count": c} for r, c in sorted(counts.items(), key=lambda kv: -kv[1])[:n]]

    def rejection_counts(self) -> list[dict[str, Any]]:
        """Why the run's ``proposal_rejected`` events rejected their proposals, as ``{"reason", "count"}``, most
        frequent first; ``reason`` a :class:`~ratchet.ledger.events.RejectionKind`'s label (``"duplicate"``,
        ``"dropped by the cascade after its first stage"``, ``"screened out by the world model"``, ``"not run before
        the world model could screen"``, ``"no usable new source"``). ``ratchet show`` counts them
        (:func:`rejection_counts_text`)."""
        counts: dict[str, int] = {}
        for r in self.rejected_proposals:
            kind = RejectionKind.of(r).label
            counts[kind] = counts.get(kind, 0) + 1
        return [{"reason": k, "count": c} for k, c in sorted(counts.items(), key=lambda kv: -kv[1])]

    def episode_failures(self, n: int = 3) -> dict[str, Any] | None:
        """The run's failed episodes (an error recorded: the policy raised, timed out, failed to load, was skipped), as
        ``{"episodes", "candidates", "reasons": [{"reason", "count"}], "worst": {"candidate_id", "episodes",
        "split"}}``: how many episodes of how many candidates, the ``n`` most frequent reasons (the error without its
        seed, :func:`ratchet.critic.seedless`, at most 160 characters), and the candidate with the most failed episodes (on the split where most of
        them were). None when no episode failed. ``ratchet show`` (and ``--json``) and the report show it
        (:func:`episode_failures_text`)."""
        from ratchet.critic import seedless

        reasons: dict[str, int] = {}
        per: dict[str, dict[str, int]] = {}  # candidate id -> split -> failed episodes
        for ev in self.evaluations:
            for ep in ev["episodes"]:
                if ep.get("error") is None:
                    continue
                reason = seedless(str(ep["error"]))[:160]
                reasons[reason] = reasons.get(reason, 0) + 1
                splits = per.setdefault(str(ev["candidate_id"]), {})
                splits[ev["split"]] = splits.get(ev["split"], 0) + 1
        if not per:
            return None
        worst = max(per, key=lambda c: sum(per[c].values()))
        return {"episodes": sum(reasons.values()), "candidates": len(per),
                "reasons": [{"reason": r, "count": c} for r, c in sorted(reasons.items(), key=lambda kv: -kv[1])[:n]],
                "worst": {"candidate_id": worst, "episodes": sum(per[worst].values()),
                          "split": max(per[worst], key=per[worst].__getitem__)}}

    @property
    def task_name(self) -> str:
        """What the run's task is called: the env id, a game's name (or the game), or an evaluator task's name (its
        file's stem)."""
        t = self.task or self.spec.get("task", {})
        if t.get("env_id"):
            return str(t["env_id"])
        if t.get("game") and not t.get("name"):
            return str(t["game"])
        name = t.get("name") or str(t.get("evaluator") or "?").rsplit("/", 1)[-1].removesuffix(".py")
        return str(name)

    @property
    def cost_unit(self) -> str:
        """What the run's env-step counts count, as its task recorded it: ``"env steps"``, or an evaluator task's
        cost unit (``"instances"``, ``"items"``)."""
        return str((self.task or {}).get("cost_unit", "env steps"))

    @property
    def episode_unit(self) -> str:
        """What the run's task calls an episode, plural: ``"episodes"``, an evaluator's ``"instances"``."""
        return _task_words(self.task or self.spec.get("task"))[0]

    @property
    def return_name(self) -> str:
        """What the run's task calls an episode's return: ``"return"``, an evaluator's ``"score"``."""
        return _task_words(self.task or self.spec.get("task"))[1]

    def world_model(self) -> dict[str, Any] | None:
        """The world-model screen's account (``[model] screen``), from the generations' summaries; None without one.

        Returns:
            ``screened`` (generations it chose what ran), ``saved`` (proposals screened out), ``rank_correlation``
            (mean Spearman correlation of its ranking with the real training means, over the generations that gave
            one; None before any), ``judged`` (how many did), ``on`` (whether it still screens), ``unused`` (why the
            run can record no transitions, so the screen never screens: ``"the task (evaluator) records no
            transitions …"``; None where it can, or for a run recorded before this was recorded), and the last fitted
            model's ``rows`` (transitions), ``holdout_error`` and ``disagreement`` (held-out, in standard deviations
            of the predicted quantities); ``judge`` (``"controls"``, or ``"kept"`` for a run recorded before controls
            judged the screen), ``advantage`` (over the kept-versus-control pairs, (wins - losses) / pairs, -1 to 1;
            None before any) and ``pairs``, ``margin`` (mean over generations of the kept candidates' mean real
            training return minus the controls', in return units; None before any) and ``margins`` (how many).
        """
        return world_model_account(self.generation_log)

    def screen_unused_text(self) -> str | None:
        """Why a run with ``[model] screen = true`` screened no generation, one line for the end of ``ratchet run``:
        the run can record no transitions (:func:`world_model_text` of its ``unused`` account, as ``show`` says
        it), the model job's recorded note (``"not screened: …"``), or the run ended first (no generation ran, or
        none before the model had ``[model] min_transitions`` transitions). None where the screen is off or
        screened a generation."""
        model = self.spec.get("model") or {}
        wm = self.world_model()
        if not model.get("screen") or (wm is not None and wm["screened"]):
            return None
        if wm is not None and wm["unused"]:
            return world_model_text(wm)
        notes = [str(g["screen_note"]) for g in self.generation_log
                 if str(g.get("screen_note", "")).startswith("not screened")]
        why = ("no generation ran" if wm is None else notes[-1].removeprefix("not screened: ") if notes
               else f"the run ended before its world model had [model] min_transitions = "
                    f"{model.get('min_transitions', '?')} transitions")
        return f"screen unused: {why}; no generation screened; [model] screen had no effect in this run"

    def used(self) -> list[tuple[str, int]]:
        """What the run has used of its budget, in its task's words, for every display (``show``, the result line,
        the dashboard, the report): ``[(cost_unit, env_steps), (episode_unit, episodes)]`` — ``[("env steps",
        52_000), ("episodes", 120)]``, ``[("items", 149_000), ("instances", 298)]``. A task whose cost unit is its
        episode (an evaluator without ``COST_UNIT``: every instance costs 1) has one count: ``[("instances",
        episodes)]``, the instances run, failed or skipped, as ``[budget] episodes`` counts them (its env-step count
        leaves out only instances a timeout or a crash cut short, and those skipped after it)."""
        return used_counts(self, self.env_steps, self.episodes)

    def to_json(self) -> dict[str, Any]:
        """The summary printed by ``ratchet show --json``. The incumbent's ``kind`` is its policy kind and
        ``artifacts`` its artifacts' digests by role (empty for a plain program)."""
        inc = self.candidates.get(self.incumbent_id or "", {})
        return {"run_id": self.run_id, "status": self.status, "status_text": self.status_text, "writer": self.writer,
                "env_steps": self.env_steps,
                "episodes": self.episodes, "validation_env_steps": self.validation_env_steps,
                "generations": self.generations, "wall_clock_s": round(self.wall_clock_s, 3),
                "stop_reason": self.stop_reason, "stop_kind": self.stop_kind, "error": self.error,
                "env_id": self.spec.get("task", {}).get("env_id"), "task": self.task_name,
                "cost_unit": self.cost_unit, "episode_unit": self.episode_unit, "return_name": self.return_name,
                "used": [list(u) for u in self.used()], "execution": self.execution,
                "budget": self.spec.get("budget"),
                "baseline": {"candidate_id": self.baseline_id},
                "incumbent": {"candidate_id": self.incumbent_id, "validation_mean": self.incumbent_validation_mean,
                              "kind": inc.get("kind", "program"), "params": dict(inc.get("params", {})),
                              "artifacts": dict(inc.get("artifacts") or {})},
                "promotions": len(self.promotions), "env_steps_breakdown": self.env_steps_breakdown,
                "final_decision": self.final_decision,
                "corrections": [dict(c) for c in self.corrections],
                "code_changes": [{"generation": p["generation"], "from": p["from"], "to": p["to"],
                                  "diff": p["source_diff"], "structure_diff": p.get("structure_diff"),
                                  "value_changes": p.get("value_changes")}
                                 for p in self.promotions if p.get("source_diff")],
                "llm_usage": {k: dict(v) for k, v in self.llm_usage.items()},
                "rejected_proposals": len(self.rejected_proposals),
                "rejected_proposal_reasons": self.rejection_counts(),
                "endpoint_failures": len(self.endpoint_failures),
                "endpoint_failure_reasons": self.endpoint_failure_reasons(),
                "failed_episodes": self.episode_failures(),
                "baseline_test": _test_summary(self.baseline_test), "test": _test_summary(self.test),
                "test_worst_seeds": [s for s, _ in (self.test_critique or {}).get("worst_seeds", [])],
                "test_failure_modes": [{k: m[k] for k in ("label", "count", "example_seeds")}
                                       for m in (self.test_critique or {}).get("failure_modes", [])],
                "test_by_opponent": self.test_by_opponent(),
                "league": [dict(x) for x in self.league], "world_model": self.world_model()}

    def task_for(self, evaluation: int) -> dict[str, Any] | None:
        """The task (:meth:`Task.to_dict`) that ran evaluation number ``evaluation`` (an index into
        :attr:`evaluations`): the run's task as last updated before it was recorded (None: not recorded)."""
        task = self.task
        for before, version in self.task_versions:
            if before <= evaluation:
                task = version
        return task

    def test_by_opponent(self) -> list[dict[str, Any]]:
        """A game's test payoffs per opponent (:func:`ratchet.critic.by_opponent`), the final incumbent's row beside
        the starting policy's: ``opponent``, ``n``, ``start_mean``, ``final_mean``, ``wins``, ``draws``, ``losses``
        (the final incumbent's), the final incumbent's worst opponent first. Empty for tasks without opponents."""
        start = {o["opponent"]: o for o in (self.baseline_test_critique or {}).get("opponents", [])}
        return [{"opponent": o["opponent"], "n": o["n"], "start_mean": start.get(o["opponent"], {}).get("mean"),
                 "final_mean": o["mean"], "wins": o["wins"], "draws": o["draws"], "losses": o["losses"]}
                for o in (self.test_critique or {}).get("opponents", [])]


def used_counts(state: RunState, env_steps: int, episodes: int) -> list[tuple[str, int]]:
    """:meth:`RunState.used` of ``env_steps`` and ``episodes`` as the loop recorded them (``run_finished``, a
    ``generation_finished``), in ``state``'s words: for displays that fold only those events (the dashboard)."""
    if state.cost_unit == state.episode_unit:
        return [(state.episode_unit, episodes)]
    return [(state.cost_unit, env_steps), (state.episode_unit, episodes)]


def _task_words(task: Any) -> tuple[str, str]:
    """``(episode_unit, return_name)`` as the recorded task states them (:meth:`ratchet.tasks.Task.to_dict` of a task
    whose words are not a gym task's: an evaluator's ``"instances"`` and ``"score"``); a gym task's words otherwise,
    also for a task recorded before tasks stated them."""
    t = task if isinstance(task, dict) else {}
    unit, name = t.get("episode_unit"), t.get("return_name")
    return (unit if isinstance(unit, str) and unit else "episodes", name if isinstance(name, str) and name else "return")


def _count(x: Any) -> float:
    """A recorded count or amount read defensively (0 for anything that is not a finite, non-negative number)."""
    import math

    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
    return x if ok else 0


def failure_reason(error: Any) -> str:
    """A failed request's reason, short enough to group by: the error's text up to its first ``": "`` or
    ``" ("`` (``"HTTP 503 Service Unavailable"``, ``"timed out"``), at most 80 characters."""
    import re

    text = " ".join(str(error).split()) or "unknown"
    return re.split(r": | \(", text, maxsplit=1)[0][:80]


def rejection_counts_text(counts: list[dict[str, Any]]) -> str:
    """:meth:`RunState.rejection_counts` in words: ``"6 duplicates, 3 screened out by the world model"``."""
    duplicate = RejectionKind.DUPLICATE.label
    return ", ".join(f"{c['count']} {'duplicates' if c['reason'] == duplicate and c['count'] != 1 else c['reason']}"
                     for c in counts)


def episode_failures_text(failures: dict[str, Any], run: str) -> str:
    """:meth:`RunState.episode_failures` for people, one line each: the counts, the most frequent reasons (with their
    counts), and the ``ratchet critique`` command that diagnoses the candidate with the most failed episodes
    (``run``: the run id as the user named it)."""
    worst = failures["worst"]
    split = f" --split {worst['split']}" if worst["split"] in ("train", "test", "league") else ""  # critique's splits
    return "\n".join([(f"{failures['episodes']} episode(s) of {failures['candidates']} candidate(s) failed "
                      "(raised, timed out, failed to load or skipped); most often:"),
                      *(f"  {r['count']} × {r['reason']}" for r in failures["reasons"]),
                      (f"most failed: {worst['candidate_id']} ({worst['episodes']} episode(s)); diagnose it: "
                      f"ratchet critique {run} --candidate {worst['candidate_id']}{split}")])


def _add_llm_call(usage: dict[str, dict[str, Any]], key: str, p: dict[str, Any]) -> None:
    """Count one ``llm_call`` event into ``usage`` (see :func:`llm_usage_of`)."""
    refiner = p.get("refiner")
    name = refiner if isinstance(refiner, str) else key.split("/")[1] if key.count("/") >= 2 else "llm"
    u = usage.setdefault(name, {"model": p.get("model"), "requests": 0, "attempts": 0, "answered": 0,
                                "prompt_tokens": 0, "completion_tokens": 0, "tokens_estimated": False, "cost": 0.0,
                                "seconds": 0.0, "failures": {}})
    u["requests"] += 1
    u["attempts"] += int(_count(p.get("attempts"))) or 1
    u["prompt_tokens"] += int(_count(p.get("prompt_tokens")))
    u["completion_tokens"] += int(_count(p.get("completion_tokens")))
    u["tokens_estimated"] = u["tokens_estimated"] or bool(p.get("tokens_estimated"))
    u["cost"] += float(_count(p.get("cost")))
    if isinstance(p.get("currency"), str):
        u["currency"] = p["currency"]
    model = p.get("model")
    if isinstance(model, str):  # a pool's requests by model (one model: one entry)
        u.setdefault("models", {})[model] = u.get("models", {}).get(model, 0) + 1
    u["seconds"] += float(_count(p.get("seconds")))
    if p.get("response") is None:
        reason = failure_reason(p.get("error"))
        u["failures"][reason] = u["failures"].get(reason, 0) + 1
    else:
        u["answered"] += 1


def llm_usage_of(events: list[Event]) -> dict[str, dict[str, Any]]:
    """Per LLM refiner (arm name), from its ``llm_call`` events: ``model``, ``requests`` (calls made),
    ``attempts`` (HTTP attempts, retries included), ``answered`` (calls that got a reply), ``prompt_tokens``,
    ``completion_tokens``, ``tokens_estimated`` (some counts are estimates: the endpoint reported none),
    ``cost`` (priced by the refiner's ``price_prompt``/``price_completion``, per million tokens) and its
    ``currency`` (absent from ledgers before it was recorded, and for unpriced requests), ``models`` (model name ->
    requests sent to it: a pool's choices), ``seconds`` (spent waiting on the endpoint) and ``failures`` (reason -> count of calls without a reply,
    :func:`failure_reason`)."""
    usage: dict[str, dict[str, Any]] = {}
    for ev in events:
        if ev.type is EventType.LLM_CALL:
            _add_llm_call(usage, ev.key, ev.payload)
    return usage


def cost_text(u: dict[str, Any]) -> str:
    """An :func:`llm_usage_of` entry's cost with its currency where recorded (``"0.0123 USD"``)."""
    return f"{u['cost']:.4g}" + (f" {u['currency']}" if u.get("currency") else "")


#: The keys of a ``generation_finished`` payload that hold the world-model screen's account (``[model] screen``).
SCREEN_KEYS = ("screen_on", "screen_proposed", "screen_kept", "screen_saved", "screen_rank_correlation", "model_rows",
               "model_error", "model_disagreement", "screen_advantage", "screen_pairs", "screen_margin", "screen_waiting",
               "screen_unused")


def world_model_account(generations: list[dict[str, Any]]) -> dict[str, Any] | None:
    """:meth:`RunState.world_model` from ``generation_finished`` payloads (or their :data:`SCREEN_KEYS`), in order."""
    gens = [g for g in generations if "screen_on" in g]
    if not gens:
        return None
    rhos = [g["screen_rank_correlation"] for g in gens if isinstance(g.get("screen_rank_correlation"), (int, float))]
    fitted = [g for g in gens if g.get("model_rows") is not None]
    last = fitted[-1] if fitted else {}
    margins = [g["screen_margin"] for g in gens if isinstance(g.get("screen_margin"), (int, float))]
    judged = [g for g in gens if "screen_pairs" in g]  # absent: recorded before controls judged the screen
    return {"judge": "controls" if judged else "kept",
            "advantage": judged[-1].get("screen_advantage") if judged else None,
            "pairs": int(judged[-1].get("screen_pairs") or 0) if judged else 0,
            "margin": sum(margins) / len(margins) if margins else None, "margins": len(margins),
            "screened": sum(1 for g in gens if (g.get("screen_kept") or 0) < (g.get("screen_proposed") or 0)
                            and not g.get("screen_waiting")),  # waiting: fewer ran, but nothing screened them
            "saved": max(int(g.get("screen_saved") or 0) for g in gens),
            "rank_correlation": sum(rhos) / len(rhos) if rhos else None, "judged": len(rhos),
            "on": bool(gens[-1]["screen_on"]), "unused": gens[-1].get("screen_unused"), "rows": last.get("model_rows"),
            "holdout_error": last.get("model_error"), "disagreement": last.get("model_disagreement")}


def world_model_text(wm: dict[str, Any]) -> str:
    """One line of the world-model screen's account (:meth:`RunState.world_model`), for ``show`` and the report."""
    if wm.get("unused"):  # the run records no transitions: as the start note says (ratchet.spec.screen_unused)
        kept = f", {wm['saved']} proposal(s) not run ([model] unscreened = \"kept\")" if wm["saved"] else ""
        return f"screen unused: {wm['unused']}; no generation screened{kept}; [model] screen has no effect in this run"
    rho = "no rank correlation yet" if wm["rank_correlation"] is None else (
        f"rank correlation with real training returns {wm['rank_correlation']:+.2f} (mean of {wm['judged']}"
        f"{', among the candidates run: biased low' if wm['judge'] == 'controls' else ''})")
    judged, off = "", "it did not predict"
    if wm["judge"] == "controls" and wm["advantage"] is None:
        judged = "no controls run yet, so nothing unbiased judges it ([model] controls); "
    elif wm["judge"] == "controls":
        margin = "" if wm["margin"] is None else (f", kept minus controls {wm['margin']:+.4g} real training return "
                                                  f"(mean of {wm['margins']})")
        judged = (f"advantage over random screened-out controls {wm['advantage']:+.2f} over {wm['pairs']} pair(s) "
                  f"(kept won {50 * (1 + wm['advantage']):.0f} %){margin}; ")
        off = "its kept candidates did no better than the controls"
    model = "" if wm["rows"] is None else (f"; last model: {wm['rows']:,} transitions, held-out error "
                                           f"{wm['holdout_error']:.3g}, disagreement {wm['disagreement']:.3g} (in "
                                           "standard deviations)")
    return (f"screen {'on' if wm['on'] else f'switched off ({off})'}: screened {wm['screened']} "
            f"generation(s), {wm['saved']} proposal(s) not run; {judged}{rho}{model}")


def llm_usage_text(u: dict[str, Any]) -> str:
    """One refiner's :func:`llm_usage_of` entry for people, e.g. ``"12 requests (14 HTTP attempts), 11 answered
    · 12,345 tokens (10,000 prompt + 2,345 answer) · cost 0.0123 USD · 45.6 s waiting"``, then for a pool of
    models a line ``"models: 18× dear, 2× cheap"`` and, when some failed, a line ``"failed: 2× HTTP 503 Service
    Unavailable, 1× timed out"``."""
    tokens = u["prompt_tokens"] + u["completion_tokens"]
    est = ", partly estimated" if u.get("tokens_estimated") else ""
    line = (f"{u['requests']:,} request{'s' if u['requests'] != 1 else ''} ({u['attempts']:,} HTTP attempt"
            f"{'s' if u['attempts'] != 1 else ''}), {u['answered']:,} answered · {tokens:,} tokens "
            f"({u['prompt_tokens']:,} prompt + {u['completion_tokens']:,} answer{est}) · cost {cost_text(u)} · "
            f"{u['seconds']:.1f} s waiting")
    if len(u.get("models") or {}) > 1:
        line += "\nmodels: " + ", ".join(f"{n}× {m}" for m, n in sorted(u["models"].items(), key=lambda kv: -kv[1]))
    if u["failures"]:
        line += "\nfailed: " + ", ".join(f"{n}× {r}" for r, n in sorted(u["failures"].items(), key=lambda kv: -kv[1]))
    return line


def _test_summary(s: dict[str, Any] | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {k: s.get(k) for k in ("mean", "std", "n", "success_rate", "n_errors")}


def _pid_alive(pid: int | None, host: str | None = None) -> bool:
    """Whether the writer ``pid`` still runs; a writer on another host cannot be checked and counts as
    alive (its ledger is in a shared database)."""
    if host is not None and host != socket.gethostname():
        return True
    return pid is not None and pid != 0 and process_running(pid)


def active_seconds(events: list[Event]) -> float:
    """Wall-clock seconds the run was actually running: the sum over its sessions (start or resume
    to that session's last event), so downtime between a kill and a resume is not counted."""
    total, session_start, last = 0.0, None, None
    for ev in events:
        if ev.type in (EventType.RUN_STARTED, EventType.RUN_RESUMED):
            if session_start is not None and last is not None:
                total += last - session_start
            session_start = ev.time
        last = ev.time
    if session_start is not None and last is not None:
        total += last - session_start
    return total


def project(events: list[Event], lease: LeaseInfo | None = None) -> RunState:
    """Fold events into a :class:`RunState`.

    Args:
        events: The run's events, in order.
        lease: The run's writer lease (``ledger.read_lease()``), when the store has one. It decides
            whether a run that neither finished nor failed is ``running`` (lease live), ``stale``
            (expired: no heartbeat for its time-to-live) or ``interrupted`` (released, or its holder's
            process is gone from this host). Without one, only a writer on this host can be checked
            (by pid); one on another host counts as running.
    """
    st = RunState()
    pid = host = None
    for ev in events:
        p = ev.payload
        if ev.type is EventType.RUN_STARTED:
            if not is_run_id(p.get("run_id")):  # every display shows it, every path is made of it: a plain name
                raise LedgerError(f"the ledger is damaged at event {ev.seq}: its run id {str(p.get('run_id'))[:60]!r} "
                                  "is not a plain name (letters, digits, '.', '_', '-'; no '/' or '..')")
            st.run_id, st.spec, st.versions = p["run_id"], p["spec"], p.get("versions", {})
            st.task = p.get("task")
            st.execution = p.get("execution", {})
            st.policy_source, st.started_at, pid, st.status = p["policy_source"], ev.time, p.get("pid"), "running"
            host = p.get("host")
        elif ev.type is EventType.RUN_RESUMED:
            pid, host, st.status, st.error = p.get("pid"), p.get("host"), "running", None
        elif ev.type is EventType.CANDIDATE_PROPOSED:
            c = p["candidate"]
            st.candidates.setdefault(c["id"], c)
            if p["generation"] == 0 and st.baseline_id is None:
                st.baseline_id = st.incumbent_id = c["id"]
        elif ev.type is EventType.EPISODES_EVALUATED:
            st.evaluations.append(p)
            if "correction_round" in p:  # a correction round's evaluation: outside the run's budget
                st.correction_env_steps[p["split"]] = st.correction_env_steps.get(p["split"], 0) + \
                    p["summary"]["env_steps"]
            elif p["split"] != "test":
                st.env_steps += p["summary"]["env_steps"]
                st.episodes += p["summary"]["n"]
                if p["split"] in ("validation", "league"):  # "league": a game league's games before a promotion
                    st.validation_env_steps += p["summary"]["env_steps"]
                if p["split"] == "validation" and p["candidate_id"] == st.incumbent_id \
                        and st.incumbent_validation_mean is None:
                    st.incumbent_validation_mean = p["summary"]["mean"]
        elif ev.type is EventType.TRAINING_FINISHED and "correction_round" not in p:
            st.env_steps += int(p["env_steps"])
            st.training_env_steps += int(p["env_steps"])
        elif ev.type is EventType.EPISODE_TRACED:  # a replay for a prompt's trace: in the budget, as the loop counts
            st.env_steps += int(p["env_steps"])
            st.episodes += 1
        elif ev.type is EventType.LLM_CALL:
            _add_llm_call(st.llm_usage, ev.key, p)
            if p.get("response") is None:  # the endpoint's failure (status, its message, attempts), not a proposal's
                st.endpoint_failures.append({k: p.get(k) for k in ("refiner", "status", "error", "message",
                                                                   "attempts")})
        elif ev.type is EventType.GATE_DECIDED:
            st.gates.append(p)
        elif ev.type is EventType.TASK_UPDATED:
            st.task_versions.append((len(st.evaluations), p["task"]))
            st.league.append({k: p.get(k) for k in ("generation", "retired", "incumbent", "rows", "columns", "table",
                                                    "meta_strategy")})
        elif ev.type is EventType.FINAL_DECISION:
            st.final_decision = dict(p)
        elif ev.type is EventType.PROPOSAL_REJECTED:
            if not str(p.get("reason", "")).startswith("request failed:"):  # older ledgers: an endpoint failure
                st.rejected_proposals.append(p)
        elif ev.type is EventType.INCUMBENT_CHANGED:
            st.promotions.append(p)
            st.incumbent_id, st.incumbent_validation_mean = p["to"], p["validation_mean"]
        elif ev.type is EventType.GENERATION_FINISHED:
            st.generation_log.append(p)
            st.generations = max(st.generations, p["generation"])
        elif ev.type is EventType.RUN_FINISHED:
            st.status, st.stop_reason, st.stop_kind = "finished", p["stop_reason"], p.get("stop_kind")
            st.baseline_test, st.test = p["baseline_test"], p["test"]
            st.baseline_test_critique, st.test_critique = p.get("baseline_test_critique"), p.get("test_critique")
            st.wall_clock_s = p.get("wall_clock_s", ev.time - st.started_at)
            st.env_steps_breakdown = p.get("env_steps_breakdown")
        elif ev.type is EventType.RUN_FAILED:
            st.status, st.error = "failed", p["error"]
        elif ev.type is EventType.CORRECTION_RECORDED:
            st.corrections.append({"round": p["round"], "who": p["who"], "candidate_id": p["candidate_id"],
                                   "episodes": len(p["episodes"]), "person_steps": p["person_steps"],
                                   "env_steps": p["env_steps"], "dataset": p["dataset"], "retrain": p["retrain"],
                                   "status": "recorded"})
            st.correction_env_steps["person"] += int(p["env_steps"])
        elif ev.type is EventType.CORRECTION_FINISHED:
            for c in st.corrections:
                if c["round"] == p["round"]:
                    c.update({k: p.get(k) for k in ("student_id", "gated", "promoted", "reason", "incumbent_id")},
                             status="finished")
            if p.get("test") is not None:
                st.test, st.test_critique = p["test"], p.get("test_critique")
    st.baseline_test_critique, st.test_critique = _regrouped(st.baseline_test_critique), _regrouped(st.test_critique)
    if st.corrections:
        st.env_steps_breakdown = {**(st.env_steps_breakdown or {}), "person": st.correction_env_steps["person"],
                                  "correction validation": st.correction_env_steps["validation"],
                                  "correction test": st.correction_env_steps["test"]}
    if st.status != "finished" and events:
        st.wall_clock_s = active_seconds(events)
        st.status, st.writer = live_status(st.status, pid, host, lease)
    return st


def _regrouped(critique: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored critique (``Critique.to_dict``) with its failure modes regrouped by
    :func:`ratchet.critic.merged_modes`: a ledger written before errors were grouped without their seeds has one
    mode per seed of the same failure."""
    from ratchet.critic import merged_modes

    if not critique or not critique.get("failure_modes"):
        return critique
    return {**critique, "failure_modes": merged_modes(critique["failure_modes"])}


def live_status(status: str, pid: int | None, host: str | None,
                lease: LeaseInfo | None) -> tuple[str, dict[str, Any] | None]:
    """``(status, writer)`` of a run whose events say ``status`` (``"running"`` until it finished or failed): a
    running run's writer lease decides whether it still runs (lease live), is ``stale`` (expired) or
    ``interrupted`` (released, or its holder's process is gone from this host); without a lease, the writer
    ``pid`` on ``host`` (from ``run_started``/``run_resumed``) is checked when it is on this host. ``writer`` is
    the lease (:meth:`~ratchet.ledger.lease.LeaseInfo.to_json`) or None."""
    if status != "running":
        return status, None
    if lease is not None:
        from ratchet.ledger.lease import writer_dead_here

        if lease.released or writer_dead_here(lease):
            return "interrupted", lease.to_json()
        return ("stale" if lease.expired else "running"), lease.to_json()
    return ("running" if _pid_alive(pid, host) else "interrupted"), None
