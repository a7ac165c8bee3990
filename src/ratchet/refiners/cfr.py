"""The ``cfr`` refiner: counterfactual regret minimisation (CFR, CFR+, Discounted CFR, Predictive CFR+) of a tabular
policy for an OpenSpiel game.

Sources: Zinkevich et al., "Regret Minimization in Games with Incomplete Information" (NeurIPS 2007) for CFR;
Tammelin, "Solving Large Imperfect Information Games Using CFR+" (2014) for CFR+; Brown & Sandholm, "Solving
Imperfect-Information Games via Discounted Regret Minimization" (AAAI 2019) for DCFR; Farina, Kroer & Sandholm,
"Faster Game Solving via Predictive Blackwell Approachability" (AAAI 2021) for PCFR+. The solver is ratchet's own,
vectorised over the game tree (:mod:`ratchet.refiners.cfr_solver`); it gives OpenSpiel's CFR, CFR+ and DCFR
iterates to float rounding.

The policy is a program with an array parameter ``logits`` of shape (information states, actions) and the list
``INFO_STATES`` in OpenSpiel's ``TabularPolicy`` order (``examples/kuhn_poker/make_policy.py`` writes one); its
probabilities are the softmax of a state's row over the legal actions. Each generation runs one training job (in the
sandbox, like every training job): ``iterations`` iterations of the solver, whose average policy (or current
iterate, or the less exploitable of the two: ``checkpoint``) becomes the candidate's ``logits`` (``log p``, clipped to
the parameter's bounds). The solver's state (cumulative regrets and policy, the current iterate, the iteration
count) is the job's artifact and the next job continues it, so the refiner runs *one uninterrupted line* of the
solver while the gate certifies its checkpoints when they are better: a parent that is on the line (its start or one
of its checkpoints) continues it; any other parent (a promotion from another refiner) starts a new line from that
parent's policy (the first iterate is the parent's, which also enters the average).

A job is charged ``iterations × information states`` to the budget (the task's unit with ``objective =
"exploitability"``: information states).
"""

from __future__ import annotations

import ast
import io
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ratchet.critic import Critique
from ratchet.errors import SpecError
from ratchet.execution.training import InfoField, Role, TrainingAnswer, TrainingJob
from ratchet.policy import Candidate
from ratchet.refiners.base import GenerationCost, Refiner

__all__ = ["CFRRefiner", "CFRSettings", "train"]


class CFRSettings(BaseModel):
    """Settings of a ``cfr`` refiner (a ``[[refiners]]`` table with ``kind = "cfr"``)."""

    model_config = ConfigDict(extra="forbid")

    iterations: int = Field(1000, ge=1, le=1_000_000, description="Solver iterations per generation (one training "
                                                                 "job; one checkpoint of the line is its candidate).",
                            json_schema_extra={"unit": "solver iterations"})
    algorithm: Literal["pcfr+", "cfr+", "dcfr", "cfr"] = Field(
        "pcfr+", description="Predictive CFR+ (quadratic averaging; the fastest on Leduc poker, benchmarks/RESULTS.md), "
                             "CFR+ (regret matching+, linear averaging), Discounted CFR (α = 1.5, β = 0, γ = 2) or "
                             "vanilla CFR.")
    checkpoint: Literal["lower", "average", "current"] = Field(
        "lower", description="The checkpoint each job proposes: whichever of the average policy and the current "
                             "iterate the job measures as less exploitable, or always the one named.")


def _check_state(data: bytes) -> None:
    """The solver state artifact is an ``.npz`` of float arrays and the iteration (read without pickles)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        if set(z.files) != {"regret", "policy", "current", "iteration"}:
            raise ValueError(f"solver state holds {sorted(z.files)}")
        arrays = [z[k] for k in ("regret", "policy", "current")]
        if any(a.shape != arrays[0].shape or not np.isfinite(a).all() for a in arrays):
            raise ValueError("solver state arrays are malformed")


def _check_logits(data: bytes) -> None:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        if set(z.files) != {"logits"} or not np.isfinite(z["logits"]).all():
            raise ValueError("the logits artifact is malformed")


ANSWER = TrainingAnswer(
    roles=(Role("state", max_bytes=1 << 28, check=_check_state), Role("logits", max_bytes=1 << 26, check=_check_logits)),
    info=(InfoField("iteration", "int", low=1, high=10**9), InfoField("iterations", "int", low=1, high=10**6),
          InfoField("proposed", "str", choices=("average", "current")),
          InfoField("exploitability", "float", low=0.0, high=1e9)))


def _info_states(source: str) -> list[str] | None:
    """The policy file's ``INFO_STATES`` literal (read without running the file), or None."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "INFO_STATES" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                return None
            return [str(v) for v in value] if isinstance(value, list) else None
    return None


class CFRRefiner(Refiner):
    """CFR / CFR+ as a refiner (see the module docstring).

    Args:
        settings: Its :class:`CFRSettings`.
        name: Its arm name.
        ctx: The :class:`~ratchet.refiners.registry.RefinerContext` (its task, program, ``train``).

    Raises:
        SpecError: the task is not an OpenSpiel game, or the program lacks ``logits`` of shape (information states,
            actions) or an ``INFO_STATES`` list in OpenSpiel's order.
    """

    def __init__(self, settings: CFRSettings, name: str, ctx: Any) -> None:
        self.settings, self.name, self.ctx = settings, name, ctx
        game = getattr(ctx.task, "game", "")
        if getattr(ctx.task, "kind", None) != "game" or not str(game).startswith("openspiel:"):
            raise SpecError(f"[[refiners]] {name}: cfr solves OpenSpiel games ([task] kind = \"game\", game = "
                            "\"openspiel:kuhn_poker\")")
        import pyspiel
        from open_spiel.python import policy as os_policy

        self.game_name = str(game).removeprefix("openspiel:")
        table = os_policy.TabularPolicy(pyspiel.load_game(self.game_name))
        order = [s.information_state_string() for s in table.states]
        param = next((p for p in ctx.program.parameters if p.name == "logits"), None)
        if param is None or param.shape != table.action_probability_array.shape:
            raise SpecError(f"[[refiners]] {name}: cfr needs a PARAMETERS array \"logits\" of shape "
                            f"{list(table.action_probability_array.shape)} (information states × actions); "
                            "examples/kuhn_poker/make_policy.py writes such a file")
        if _info_states(ctx.program.source) != order:
            raise SpecError(f"[[refiners]] {name}: the policy's INFO_STATES must list the game's {len(order)} "
                            "information states in OpenSpiel's TabularPolicy order (as make_policy.py writes them)")
        self.n_states, self.n_actions = table.action_probability_array.shape
        self.low = float(np.min(param.low))
        self.high = float(np.max(param.high))
        self._line: set[str] = set()  # the candidates on the current line: its start and its checkpoints
        self._state: str | None = None  # digest of the line's solver state
        self._errors: list[str] = []

    def generation_cost(self) -> GenerationCost:
        """One candidate (the job's average policy) and its training job, charged ``iterations × information
        states``; no paired reference (the task's value is exact)."""
        return GenerationCost(proposals=1, training_env_steps=self.settings.iterations * self.n_states,
                              reference=False)

    def propose(self, parent: Candidate, critique: Critique | None, rng: np.random.Generator) -> list[Candidate]:
        """Continue the line (or start one from ``parent``) for ``iterations`` iterations; the average policy as the
        candidate (``parent`` with new ``logits``)."""
        if parent.id not in self._line:  # a parent from elsewhere: a new line from its policy
            self._line, self._state = {parent.id}, None
        arts = {"state": self._state} if self._state is not None else {}
        job_parent = Candidate.create(parent.source, dict(parent.params), kind="program", artifacts=arts,
                                      parent_id=parent.id, refiner=self.name)
        settings = {**self.settings.model_dump(mode="json"), "game": self.game_name, "low": self.low,
                    "high": self.high}
        cost = self.settings.iterations * self.n_states
        result = self.ctx.train(TrainingJob("cfr", job_parent, settings, (), cost, answer=ANSWER))
        if result.error or not result.outputs:
            self._errors.append(result.error or "no output")
            return []
        out = result.outputs[0]
        self._state = out.info["artifacts"]["state"]
        with np.load(io.BytesIO(out.artifacts["logits"]), allow_pickle=False) as z:
            logits = np.asarray(z["logits"], dtype=np.float64)
        if logits.shape != (self.n_states, self.n_actions):  # the sandboxed job's answer, checked before use
            self._errors.append(f"the job answered logits of shape {list(logits.shape)}, expected "
                                f"{[self.n_states, self.n_actions]}")
            return []
        logits = np.clip(logits, self.low, self.high)
        cand = Candidate.create(parent.source, {**dict(parent.params), "logits": logits.tolist()},
                                parent_id=parent.id, refiner=self.name)
        self._line.add(cand.id)
        return [cand]

    def idle_reason(self) -> str | None:
        """Three failed jobs in a row stop the refiner (the last error is the reason)."""
        if len(self._errors) >= 3:
            return f"its last training jobs failed: {self._errors[-1][:200]}"
        return None

    def verdict(self, candidate_id: str | None, promoted: bool, note: str) -> None:
        """A success resets the failure count."""
        if candidate_id is not None:
            self._errors.clear()

    def summary(self) -> dict[str, Any]:
        """``line``: checkpoints on the current line."""
        return {"line": len(self._line) - 1}


def _masked_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, logits, -np.inf)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _as_logits(policy: np.ndarray, mask: np.ndarray, low: float, high: float) -> np.ndarray:
    """float (S, A): ``log p`` of ``policy`` less each row's largest, clipped to ``[low, high]`` (0 where illegal)."""
    with np.errstate(divide="ignore"):
        logits = np.where(mask, np.log(policy), -np.inf)
    logits = logits - logits.max(axis=1, keepdims=True)
    return np.clip(np.where(mask, logits, 0.0), low, high)


def _load_state(data: bytes, tree: Any) -> Any:
    """A line's :class:`~ratchet.refiners.cfr_solver.CFRState` from its artifact (one written before ``current``
    was kept: the current iterate is regret matching of the regrets, as OpenSpiel's solver had it)."""
    from ratchet.refiners.cfr_solver import CFRState, regret_matching

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        regret = np.array(z["regret"], dtype=np.float64)
        current = np.array(z["current"], dtype=np.float64) if "current" in z.files \
            else regret_matching(regret, tree.mask)
        state = CFRState(regret, np.array(z["policy"], dtype=np.float64), current, int(z["iteration"]))
    if state.regret.shape != tree.shape or state.current.shape != tree.shape:
        raise ValueError(f"the solver state has shape {list(state.regret.shape)}, the game {list(tree.shape)}")
    return state


def train(task: Any, parent: Mapping[str, Any], settings: Mapping[str, Any], seeds: Sequence[int],
          env_steps: int) -> tuple[list[Any], int]:
    """Trainer ``"cfr"`` (see :mod:`ratchet.execution.training`): ``settings["iterations"]`` iterations of
    ``settings["algorithm"]`` (:func:`ratchet.refiners.cfr_solver.iterate`) from the state in
    ``parent["artifacts"]["state"]`` (a line's continuation) or from the parent's ``logits`` (a new line: the first
    iterate is the parent's policy). Returns one output with artifacts ``state`` and ``logits`` (the proposed
    policy's ``log p`` clipped to ``[low, high]``: the average policy, the current iterate, or whichever of the two
    is less exploitable, per ``settings["checkpoint"]``) and info ``exploitability`` (the job's own exact measurement of
    what it proposes; untrusted, the task measures it again), and ``env_steps`` charged in full."""
    import pyspiel

    from ratchet.execution.training import TrainingOutput
    from ratchet.refiners.cfr_solver import CFRState, GameTree, average_policy, exploitability, iterate

    tree = GameTree.from_game(pyspiel.load_game(settings["game"]))
    if "state" in parent["artifacts"]:
        state = _load_state(parent["artifacts"]["state"], tree)
    else:
        logits = np.asarray(parent["params"]["logits"], dtype=np.float64)
        state = CFRState.start(tree, _masked_softmax(logits, tree.mask))
    iterate(tree, state, settings["algorithm"], int(settings["iterations"]))
    wanted = settings.get("checkpoint", "average")
    options = {k: _as_logits(p, tree.mask, float(settings["low"]), float(settings["high"]))
               for k, p in (("average", average_policy(tree, state)), ("current", state.current)) if wanted in (k, "lower")}
    measured = {k: exploitability(tree, _masked_softmax(v, tree.mask)) for k, v in options.items()}
    chosen = min(measured, key=lambda k: measured[k])
    logits = options[chosen]
    out, table = io.BytesIO(), io.BytesIO()
    np.savez(out, regret=state.regret, policy=state.average, current=state.current,
             iteration=np.asarray(state.iteration))
    np.savez(table, logits=logits)
    info = {"iteration": int(state.iteration), "iterations": int(settings["iterations"]), "proposed": chosen,
            "exploitability": max(0.0, float(measured[chosen]))}
    return [TrainingOutput({"state": out.getvalue(), "logits": table.getvalue()}, info)], env_steps


def _kinds() -> dict[str, Any]:
    from ratchet.refiners.registry import RefinerKind

    def build(settings: CFRSettings, name: str, ctx: Any) -> list[CFRRefiner]:
        return [CFRRefiner(settings, name, ctx)]

    return {"cfr": RefinerKind(CFRSettings, ("program",), build,
                               hint="cfr solves a tabular program policy (logits per information state) of an "
                                    "OpenSpiel game")}


KINDS = _kinds()
