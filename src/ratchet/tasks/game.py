"""Game tasks: the candidate plays a seat of a game against an opponent drawn from a declared pool.

``[task] kind = "game"`` with ``game`` naming a game of one of the ecosystem's standard interfaces:

* PettingZoo's AEC API (``game = "classic/connect_four-v3"``, or the module name ``"connect_four_v3"``), through
  ``pettingzoo.make("aec", ...)``;
* OpenSpiel (``game = "openspiel:kuhn_poker"``, any ``pyspiel.load_game`` string such as
  ``"openspiel:leduc_poker"``); chance nodes are sampled from the episode's seed.

An **episode** is a triple (seed, opponent, seat), all three read from the seed (:meth:`GameTask.matchup`): the
seed's split (``seed % 3``, as :class:`ratchet.planner.SeedSplits` makes them) picks the opponent pool
(``train_opponents``, ``validation_opponents``, ``test_opponents``), the rest of the seed picks the opponent and
the seat the candidate plays (``seats``: one seat, or every seat in turn). So the gate's paired test compares
candidate and incumbent on the same triples, and each split draws its own opponents.

The policy's ``act(observation, params)`` gets a dict: ``"observation"`` (the game's numeric observation of the
player to move: PettingZoo's ``observation``, OpenSpiel's information-state tensor), ``"action_mask"`` (int8,
shape ``(n_actions,)``, 1 where the action is legal), ``"seat"`` (int, 0-based) and, for OpenSpiel,
``"info_state"`` (the information-state string: a key for tabular policies). It returns an action index. An
illegal move ends the episode as the candidate's failure with the loss payoff (``illegal = "fail"``), or is
replaced by a uniformly drawn legal move and counted (``illegal = "replace"``; ``diagnostics["illegal_moves"]``).

**Opponents** are policy files (``[task.opponents]``: name → path, or ``{path, params}``), the same kind of file as
a candidate, with the same ``act``. They are policy code: executors run them sandboxed, in a process of their
own beside the candidate's (:class:`OpponentHandles`), never in the trusted referee. The game itself is the
trusted side: it applies moves, checks legality and pays out. A declared opponent that raises, answers garbage or
an illegal move, or whose process dies, is a fault of the task's setup (``diagnostics["fault"] == "task"``: the run
stops naming it), never the candidate's outcome.

**Clocks.** Each player keeps a clock of its own, as in chess: the candidate and the opponent (all the seats it
plays) may each use up to ``[execution] episode_timeout_s`` seconds of wall clock in one game, counting its start
(loading its file, ``reset``) and its moves; the time the other player and the referee take is on neither's clock,
so one game may last up to twice ``episode_timeout_s``. A candidate that runs out of its clock loses the game as
its failure (``"timeout ..."``); an opponent that runs out of its clock forfeits it: the candidate wins (the best
payoff, ``diagnostics["forfeit"]`` saying why), and the run goes on.

An episode's return is the candidate's payoff (Connect Four: +1 win, 0 draw, −1 loss; poker: chips), its length the
moves played by both sides (``env steps``), success a win (payoff > 0) unless ``success_threshold`` says otherwise;
``diagnostics`` holds ``opponent``, ``seat``, ``outcome`` (``"win"``, ``"draw"``, ``"loss"``) and ``illegal_moves``.

A **self-play league** (``league = true``): the start policy and each incumbent a promotion puts in place join the
training pool (``league1``, ``league2``...), whose opponents are drawn from the meta-strategy of the league's payoff
table. Before a promotion the candidate also plays ``league_games`` games against every member, on seeds of their
own (:meth:`GameTask.rival_seeds`), and is refused if it loses to any of them on average: the final incumbent has
not lost to any incumbent before it (the guard against strategy cycles the league itself could run into). A league
member is a former candidate, policy code like any: whatever it does (raises, answers garbage or an illegal move,
its process dies, hangs or runs out of its clock) forfeits the game, and never stops the run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from ratchet.errors import TaskError

__all__ = ["GameTask", "Opponent", "OpponentHandles", "meta_strategy", "outcome_of"]

_SPLITS = ("train", "validation", "test")
MAX_OPPONENTS = 64
#: League games (:meth:`GameTask.rival_seeds`) use seeds from here up, validation seeds (``seed % 3 == 1``) apart
#: from the spec's: member ``i``'s game ``g`` is ``RIVAL_SEEDS + 3 * (i * RIVAL_SPAN + g) + 1``.
RIVAL_SEEDS = 3 << 40
RIVAL_SPAN = 1 << 16
DEFAULT_MAX_MOVES = 1000  # PettingZoo games declare no length; OpenSpiel games do (max_game_length)
_VALUES: dict[str, dict[str, Any]] = {}  # an opponent's parameter values, by source and params (parsed once)


class OpponentHandles(Protocol):
    """How a game's episode reaches its opponents: executors supply one (sandboxed opponent processes for trusted
    rollouts, :class:`ratchet.execution.envhost.OpponentProcess`; loaded modules otherwise)."""

    @property
    def clock_s(self) -> float | None:
        """Each player's clock in one game, seconds of wall clock (``[execution] episode_timeout_s``); None: no
        clocks (nothing here bounds the players' time)."""

    def get(self, key: str, source: str) -> Any:
        """A :class:`ratchet.tasks.PolicyHandle` for the opponent whose policy file has this source (``key``: its
        SHA-256), ready for ``start``."""

    def limit(self, seconds: float) -> AbstractContextManager[Any]:
        """One player's turn with ``seconds`` left on its clock: past them, ``RolloutAborted("timeout")`` is raised
        inside the block (the env host's timer). Where a player cannot be interrupted (in-process) the block runs to
        its end, and the game reads the clock after it."""


@dataclass(frozen=True)
class Opponent:
    """One opponent of the pool: a policy file and the parameter values it plays with.

    Attributes:
        name: What tables and messages call it (``"minimax4"``).
        path: The file it was read from (for messages).
        source: The policy file's text (stored with the task, so replay and resume play the same opponent).
        params: Its parameter values: the file's ``PARAMETERS`` defaults, updated by the spec's ``params``.
    """

    name: str
    path: str
    source: str
    params: Mapping[str, Any] = field(default_factory=dict)
    candidate_id: str | None = None  # a league member: the run's earlier incumbent it is

    @property
    def key(self) -> str:
        """SHA-256 of the source (the opponent process keeps sources by it)."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def values(self) -> dict[str, Any]:
        """The parameter values as the policy receives them (NumPy arrays for array parameters)."""
        import json

        from ratchet.policy import materialize, parse_policy

        cache_key = self.key + json.dumps(_jsonable(self.params), sort_keys=True)
        if cache_key not in _VALUES and self.candidate_id is not None:  # a run's incumbent: its values are whole
            _VALUES[cache_key] = dict(self.params)
        if cache_key not in _VALUES:
            values = dict(parse_policy(self.source, self.path).defaults)
            unknown = sorted(set(self.params) - set(values))
            if unknown:
                raise TaskError(f"params names {unknown[0]!r}, which its PARAMETERS do not declare "
                                f"({', '.join(values) or 'none'})")
            values.update(self.params)
            _VALUES[cache_key] = values
        return materialize(_VALUES[cache_key])


#: Every training opponent keeps at least this share of a uniform draw under the meta-strategy, so the league never
#: stops meeting an opponent the equilibrium gives no weight to (it could regress against it unseen).
MIN_SHARE = 0.25


def meta_strategy(table: np.ndarray) -> np.ndarray:
    """Weights over a payoff table's columns (the training opponents): the column player's Nash equilibrium strategy
    of the zero-sum matrix game ``table`` (rows: the league's members, maximising their payoff), mixed with a
    uniform draw so each column keeps :data:`MIN_SHARE` of its uniform weight. The mix of opponents the league's
    best member does worst against: what PSRO (Lanctot et al., NeurIPS 2017) trains the next response on. Solved as
    a linear program (``scipy.optimize.linprog``, HiGHS): minimise ``v`` subject to ``table @ σ <= v``, ``σ`` a
    distribution.

    Args:
        table: float64, shape ``(rows, columns)``, payoffs of the row player.

    Returns:
        float64, shape ``(columns,)``, non-negative, summing to 1.

    Raises:
        ValueError: an empty or non-finite table.
    """
    from scipy.optimize import linprog

    a = np.asarray(table, dtype=np.float64)
    if a.ndim != 2 or a.size == 0 or not np.isfinite(a).all():
        raise ValueError(f"a payoff table must be a finite 2-D array, got shape {a.shape}")
    m, n = a.shape
    # variables (σ_1..σ_n, v): minimise v; a @ σ - v <= 0; Σσ = 1; σ >= 0
    res = linprog(np.r_[np.zeros(n), 1.0], A_ub=np.c_[a, -np.ones(m)], b_ub=np.zeros(m),
                  A_eq=np.r_[np.ones(n), 0.0][None, :], b_eq=[1.0], bounds=[(0, None)] * n + [(None, None)],
                  method="highs")
    sigma = np.clip(res.x[:n], 0.0, None) if res.status == 0 else np.full(n, 1.0 / n)
    sigma = sigma / sigma.sum()
    return (1 - MIN_SHARE) * sigma + MIN_SHARE / n


def outcome_of(payoff: float) -> str:
    """``"win"`` (payoff > 0), ``"draw"`` (0) or ``"loss"``."""
    return "win" if payoff > 0 else "draw" if payoff == 0 else "loss"


# -- the two interfaces ----------------------------------------------------------------------------------

class _PettingZoo:
    """A PettingZoo AEC game, one episode."""

    def __init__(self, game_id: str, kwargs: Mapping[str, Any]) -> None:
        import warnings

        import pettingzoo

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.env = pettingzoo.make("aec", _pettingzoo_id(game_id), **dict(kwargs))
        self.agents = list(self.env.possible_agents)

    def reset(self, seed: int, rng: np.random.Generator) -> None:
        self.env.reset(seed=int(seed))
        self.totals = dict.fromkeys(self.agents, 0.0)

    def spaces(self) -> tuple[Any, Any]:
        from gymnasium.spaces import Box, Dict, Discrete

        agent = self.agents[0]
        inner = self.env.observation_space(agent)
        box = inner["observation"] if isinstance(inner, Dict) else inner
        n = int(self.env.action_space(agent).n)
        return Dict({"observation": box, "action_mask": Box(0, 1, (n,), np.int8)}), Discrete(n)

    def to_move(self) -> int | None:
        env = self.env
        while env.agents:
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                env.step(None)  # PettingZoo's way of letting a finished agent leave
                continue
            return self.agents.index(agent)
        return None

    def observe(self, seat: int) -> dict[str, Any]:
        obs = self.env.observe(self.agents[seat])
        if isinstance(obs, Mapping):
            mask = np.asarray(obs.get("action_mask"), dtype=np.int8)
            return {"observation": np.asarray(obs["observation"]), "action_mask": mask, "seat": seat}
        n = int(self.env.action_space(self.agents[seat]).n)
        return {"observation": np.asarray(obs), "action_mask": np.ones(n, np.int8), "seat": seat}

    def step(self, action: int) -> None:
        self.env.step(int(action))
        for agent in self.agents:
            self.totals[agent] += float(self.env.rewards.get(agent, 0.0))

    def payoff(self, seat: int) -> float:
        return self.totals[self.agents[seat]]

    def ended(self) -> tuple[bool, bool]:
        env = self.env
        terminated = not env.agents or any(env.terminations.values())
        truncated = not terminated and any(env.truncations.values())
        return bool(terminated), bool(truncated)

    def close(self) -> None:
        self.env.close()


def _pettingzoo_id(game_id: str) -> str:
    """The registry id of ``game_id``: ``"classic/connect_four-v3"`` as given, ``"connect_four_v3"`` (the module
    name the PettingZoo docs use) mapped to it."""
    import pettingzoo

    if game_id in pettingzoo.aec_registry:
        return game_id
    stem, _, version = game_id.rpartition("_v")
    matches = [k for k in pettingzoo.aec_registry if stem and version.isdigit() and k.endswith(f"/{stem}-v{version}")]
    if len(matches) == 1:
        return matches[0]
    import difflib

    close = difflib.get_close_matches(game_id, list(pettingzoo.aec_registry), n=3)
    raise TaskError(f"unknown PettingZoo game {game_id!r}" + (f"; did you mean {', '.join(close)}?" if close else
                    " (use an AEC registry id such as \"classic/connect_four-v3\")"))


class _OpenSpiel:
    """An OpenSpiel game, one episode; chance outcomes are drawn from the episode's generator."""

    def __init__(self, name: str, kwargs: Mapping[str, Any]) -> None:
        import pyspiel

        try:
            self.game = pyspiel.load_game(name, dict(kwargs)) if kwargs else pyspiel.load_game(name)
        except Exception as exc:  # noqa: BLE001 - pyspiel raises its own errors for unknown games and parameters
            raise TaskError(f"OpenSpiel cannot load game {name!r}: {' '.join(str(exc).split())[:200]}") from None
        kind = self.game.get_type()
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise TaskError(f"OpenSpiel game {name!r} is not sequential (simultaneous-move games are not supported)")
        self.info_tensor = bool(kind.provides_information_state_tensor)
        if not self.info_tensor and not kind.provides_observation_tensor:
            raise TaskError(f"OpenSpiel game {name!r} provides neither an information-state nor an observation "
                            "tensor for a policy to read")
        self.n_seats = int(self.game.num_players())
        self.agents = list(range(self.n_seats))

    def reset(self, seed: int, rng: np.random.Generator) -> None:
        self.state, self.rng = self.game.new_initial_state(), rng
        self._chance()

    def _chance(self) -> None:
        while self.state.is_chance_node():
            outcomes, probs = zip(*self.state.chance_outcomes(), strict=True)
            p = np.asarray(probs, dtype=np.float64)
            self.state.apply_action(int(outcomes[int(self.rng.choice(len(outcomes), p=p / p.sum()))]))

    def spaces(self) -> tuple[Any, Any]:
        from gymnasium.spaces import Box, Dict, Discrete

        shape = self.game.information_state_tensor_shape() if self.info_tensor else self.game.observation_tensor_shape()
        n = int(self.game.num_distinct_actions())
        return (Dict({"observation": Box(-np.inf, np.inf, tuple(shape), np.float32),
                      "action_mask": Box(0, 1, (n,), np.int8)}), Discrete(n))

    def to_move(self) -> int | None:
        if self.state.is_terminal():
            return None
        return int(self.state.current_player())

    def observe(self, seat: int) -> dict[str, Any]:
        return self.observation_of(self.state, seat)

    def observation_of(self, s: Any, seat: int) -> dict[str, Any]:
        """What ``seat`` sees of state ``s`` (the policy's observation dict)."""
        tensor = s.information_state_tensor(seat) if self.info_tensor else s.observation_tensor(seat)
        out = {"observation": np.asarray(tensor, dtype=np.float32),
               "action_mask": np.asarray(s.legal_actions_mask(seat), dtype=np.int8), "seat": seat}
        if self.game.get_type().provides_information_state_string:
            out["info_state"] = s.information_state_string(seat)
        return out

    def exploitability(self, probabilities: Any) -> tuple[float, float, int]:
        """Exact exploitability of the policy ``probabilities(observation) -> action probabilities`` played by every
        seat: ``(exploitability, NashConv, information states asked)``, from OpenSpiel's best response
        (``open_spiel.python.algorithms.exploitability``; exploitability = NashConv / players).

        Raises:
            _BadProbabilities: an answer that is not a distribution over the legal actions.
        """
        from open_spiel.python import policy as os_policy
        from open_spiel.python.algorithms import exploitability

        table = os_policy.TabularPolicy(self.game)
        for i, state in enumerate(table.states):
            obs = self.observation_of(state, state.current_player())
            p = np.asarray(probabilities(obs), dtype=np.float64).ravel()
            mask = obs["action_mask"].astype(bool)
            if p.shape != mask.shape or not np.isfinite(p).all() or (p < 0).any() or p[~mask].sum() > 1e-9 \
                    or abs(p.sum() - 1.0) > 1e-6:
                raise _BadProbabilities(f"probabilities() at {obs.get('info_state', i)!r} returned "
                                        f"{np.round(p, 4).tolist()[:8]}, not a distribution over the legal actions "
                                        f"{np.flatnonzero(mask).tolist()}")
            table.action_probability_array[i] = p / p.sum()
        conv = float(exploitability.nash_conv(self.game, table))
        return conv / self.n_seats, conv, len(table.states)

    def step(self, action: int) -> None:
        self.state.apply_action(int(action))
        self._chance()

    def payoff(self, seat: int) -> float:
        return float(self.state.returns()[seat])

    def ended(self) -> tuple[bool, bool]:
        return bool(self.state.is_terminal()), False

    def close(self) -> None:
        pass


# -- the task --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GameTask:
    """A game against a pool of opponents (see the module docstring).

    Args:
        game: ``"classic/connect_four-v3"`` (PettingZoo AEC) or ``"openspiel:kuhn_poker"`` (OpenSpiel).
        opponents: The pool, each an :class:`Opponent`.
        pools: Split (``"train"``, ``"validation"``, ``"test"``) → the names of the opponents its episodes meet.
        seats: The seats the candidate plays (0-based); episodes cycle through them.
        illegal: ``"fail"`` (an illegal move is the episode's failure) or ``"replace"`` (a legal move drawn
            uniformly instead, counted).
        max_moves: Most moves (both sides) per episode, env steps; default the game's own bound (OpenSpiel) or
            1000. A game cut there is ``truncated``.
        success_threshold: An episode succeeds when the payoff is ``>=`` this; None: when it is a win (> 0).
        game_kwargs: Keyword arguments for the game (``pettingzoo.make`` / ``pyspiel.load_game`` parameters).
        label: What people and prompts call the task; default the game's name.
        league: Self-play league: the start policy and each incumbent a promotion puts in place join the training
            pool (:meth:`after_promotion`), and training opponents are drawn from the meta-strategy (``weights``).
        weights: Training opponents' sampling weights (the league's meta-strategy), by name; None: uniform.
        objective: ``"payoff"`` (an episode is a game against an opponent) or ``"exploitability"`` (OpenSpiel games
            small enough to solve, such as Kuhn and Leduc poker: an episode is the exact exploitability of the
            policy's ``probabilities(observation, params)``, played by every seat; its return is minus that, so the
            gate promotes only what lowers it; no opponents needed).
        league_games: With ``league``: games (episodes) a candidate the gate would promote plays against each league
            member before it is promoted, seats in turn (:meth:`rival_seeds`); None: 2 per seat; 0: no such check.

    Raises:
        TaskError: the game cannot be made, a pool names an unknown opponent or is empty, a seat does not exist,
            or ``illegal`` is neither ``"fail"`` nor ``"replace"`` (one line saying which).
    """

    kind: ClassVar[str] = "game"
    episode_unit: ClassVar[str] = "episodes"
    return_name: ClassVar[str] = "return"
    batched_rollouts: ClassVar[bool] = False  # no run_batch: one game at a time
    records_transitions: ClassVar[bool] = False  # render_path is ignored: no transitions for a world model
    deterministic: ClassVar[bool] = False  # opponents and seats vary with the seed
    action_mode: ClassVar[str] = "error"

    game: str
    opponents: tuple[Opponent, ...]
    pools: Mapping[str, tuple[str, ...]]
    seats: tuple[int, ...] = ()
    illegal: str = "fail"
    max_moves: int | None = None
    success_threshold: float | None = None
    game_kwargs: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None
    league: bool = False
    weights: Mapping[str, float] | None = None
    objective: str = "payoff"
    league_games: int | None = None

    def __post_init__(self) -> None:
        if self.illegal not in ("fail", "replace"):
            raise TaskError(f"[task] illegal must be \"fail\" or \"replace\", got {self.illegal!r}")
        if self.objective not in ("payoff", "exploitability"):
            raise TaskError(f"[task] objective must be \"payoff\" or \"exploitability\", got {self.objective!r}")
        if self.league_games is not None and (isinstance(self.league_games, bool) or not isinstance(self.league_games, int)
                                              or not 0 <= self.league_games < RIVAL_SPAN):
            raise TaskError(f"[task] league_games must be a whole number from 0 to {RIVAL_SPAN - 1}, got "
                            f"{self.league_games!r}")
        if self.league_games is not None and not self.league:
            raise TaskError("[task] league_games applies to a league: add league = true or remove it")
        if self.objective == "exploitability":
            self._exact_only()
            return
        if not self.opponents:
            raise TaskError("a game task needs opponents: add [task.opponents] with name = \"opponents/bot.py\"")
        if len(self.opponents) > MAX_OPPONENTS:
            raise TaskError(f"{len(self.opponents)} opponents; a pool may have at most {MAX_OPPONENTS}")
        names = [o.name for o in self.opponents]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise TaskError(f"two opponents are named {twice!r}; give each opponent its own name")
        reserved = next((o.name for o in self.opponents if self.league and o.candidate_id is None
                         and o.name.startswith("league") and o.name[6:].isdigit()), None)
        if reserved is not None:  # after_promotion names the k-th league member league<k>
            raise TaskError(f"[task.opponents] {reserved}: names league1, league2, … are kept for the league's "
                            "members (promoted incumbents join under them); rename this opponent")
        for split in _SPLITS:
            pool = self.pools.get(split)
            if not pool:
                raise TaskError(f"[task] {split}_opponents is empty; name at least one of {', '.join(names)}")
            unknown = [n for n in pool if n not in names]
            if unknown:
                raise TaskError(f"[task] {split}_opponents names {unknown[0]!r}, which is not in [task.opponents] "
                                f"({', '.join(names)})")
        adapter = self._adapter()
        try:
            n_seats = len(adapter.agents)
            seats = tuple(self.seats) or tuple(range(n_seats))
            bad = [s for s in seats if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n_seats]
            if bad or len(set(seats)) != len(seats):
                raise TaskError(f"[task] seats must be distinct seats of {self.game} (0..{n_seats - 1}), got "
                                f"{list(self.seats)}")
            object.__setattr__(self, "seats", seats)
            if self.max_moves is None:
                bound = int(adapter.game.max_game_length()) if isinstance(adapter, _OpenSpiel) else DEFAULT_MAX_MOVES
                object.__setattr__(self, "max_moves", bound)
            object.__setattr__(self, "pools", {s: tuple(self.pools[s]) for s in _SPLITS})
        finally:
            adapter.close()
        for opp in self.opponents:
            try:
                opp.values()
            except Exception as exc:  # noqa: BLE001 - a malformed opponent file is a setup problem, in one line
                raise TaskError(f"opponent {opp.name} ({opp.path}): {' '.join(str(exc).split())[:240]}") from None

    def __hash__(self) -> int:
        return hash((self.game, tuple(o.key for o in self.opponents)))

    def _exact_only(self) -> None:
        """Checks for ``objective = "exploitability"``: an OpenSpiel game, no opponents, seats, league or moves."""
        if not self.game.startswith("openspiel:"):
            raise TaskError("[task] objective = \"exploitability\" needs an OpenSpiel game (\"openspiel:kuhn_poker\"); "
                            "an exact best response is computed there")
        adapter = self._adapter()
        assert isinstance(adapter, _OpenSpiel)  # checked above
        if self.opponents or self.league or self.seats and tuple(self.seats) != tuple(adapter.agents):
            raise TaskError("[task] objective = \"exploitability\" plays every seat against a best response: drop "
                            "opponents, seats and league")
        if not adapter.game.get_type().provides_information_state_string:
            raise TaskError(f"{self.game} has no information states to tabulate a policy over")
        object.__setattr__(self, "seats", tuple(adapter.agents))
        object.__setattr__(self, "pools", {s: () for s in _SPLITS})
        from open_spiel.python import policy as os_policy

        object.__setattr__(self, "max_moves", len(os_policy.TabularPolicy(adapter.game).states))

    def _adapter(self) -> _PettingZoo | _OpenSpiel:
        try:
            if self.game.startswith("openspiel:"):
                return _OpenSpiel(self.game.removeprefix("openspiel:"), self.game_kwargs)
            return _PettingZoo(self.game, self.game_kwargs)
        except ImportError as exc:
            which = "open_spiel" if self.game.startswith("openspiel:") else "pettingzoo"
            raise TaskError(f"game {self.game!r} needs {which} ({exc.name or exc} is missing): "
                            "pip install \"policy-ratchet[games]\"") from None
        except TaskError:
            raise
        except Exception as exc:  # noqa: BLE001 - the game library refusing its arguments: a setup problem
            raise TaskError(f"cannot make game {self.game!r}: {type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]}") from None

    # -- who plays whom --------------------------------------------------------------------------------

    def matchup(self, seed: int) -> tuple[Opponent, int]:
        """The opponent and the candidate's seat of episode ``seed``: the pool of the seed's split
        (``seed % 3``), then ``seed // 3`` picks the opponent and, in turn, the seat. Training seeds of a league
        draw the opponent from the meta-strategy (``weights``) instead, with a generator seeded by the seed."""
        from ratchet.tasks.evaluator import split_of

        if int(seed) >= RIVAL_SEEDS:  # a league game (rival_seeds)
            member, game = divmod((int(seed) - RIVAL_SEEDS) // 3, RIVAL_SPAN)
            members = self.members()
            if member >= len(members):
                raise TaskError(f"seed {seed} is a game against league member {member + 1}, which this task has not")
            return members[member], self.seats[game % len(self.seats)]
        split = split_of(seed)
        pool = self.pools[split]
        k = int(seed) // 3
        if split == "train" and self.weights:
            rng = np.random.default_rng([int(seed), 11])
            p = np.array([self.weights.get(n, 0.0) for n in pool], dtype=np.float64)
            name = pool[int(rng.choice(len(pool), p=p / p.sum()))]
            seat = self.seats[int(rng.integers(len(self.seats)))]
        else:
            name = pool[k % len(pool)]
            seat = self.seats[(k // len(pool)) % len(self.seats)]
        return next(o for o in self.opponents if o.name == name), seat

    # -- the league ------------------------------------------------------------------------------------

    def members(self) -> list[Opponent]:
        """The league's members (the run's incumbents so far, oldest first)."""
        return [o for o in self.opponents if o.candidate_id is not None]

    def after_promotion(self, incumbent: Any,
                        payoffs: Mapping[str, Mapping[str, float]]) -> tuple[GameTask, dict[str, Any]]:
        """The task once ``incumbent`` (a :class:`~ratchet.policy.Candidate`: the start policy, or the one a
        promotion just put in place) holds the incumbency: with ``league``, it joins the training pool as
        ``"league<k>"`` and the training opponents' weights become the meta-strategy of :meth:`payoff_table`
        (:func:`meta_strategy`; uniform while no incumbent has training payoffs); otherwise (or for a policy that is
        not a plain program, which an opponent process cannot run) the task is unchanged.

        Args:
            incumbent: The incumbent now.
            payoffs: Each incumbent's mean training payoff per opponent name, by candidate id.

        Returns:
            ``(task, notes)``: notes ``rows``, ``columns``, ``table`` (:meth:`payoff_table`) and ``meta_strategy`` of a
            grown league; ``(self, {})`` when nothing changed.
        """
        from dataclasses import replace

        if not self.league or incumbent.kind != "program" or incumbent.artifacts:
            return self, {}
        if any(o.candidate_id == incumbent.id for o in self.opponents):
            return self, {}
        if len(self.opponents) >= MAX_OPPONENTS:
            return self, {}
        joined = Opponent(f"league{len(self.members()) + 1}", f"<incumbent {incumbent.id}>", incumbent.source,
                          _jsonable(incumbent.params), incumbent.id)
        grown = replace(self, opponents=(*self.opponents, joined),
                        pools={**self.pools, "train": (*self.pools["train"], joined.name)}, weights=None)
        rows, cols, table = grown.payoff_table(payoffs)
        weights = dict(zip(cols, meta_strategy(table).tolist(), strict=True)) if rows else None
        notes = {"rows": rows, "columns": cols, "table": table.round(4).tolist(), "meta_strategy": dict(weights or {})}
        return replace(grown, weights=weights), notes

    @property
    def changes_on_promotion(self) -> bool:
        """With ``league``: each promotion adds the incumbent to the training pool and the rivals
        (:meth:`after_promotion`, :meth:`rival_seeds`)."""
        return self.league

    def rival_seeds(self) -> dict[str, list[int]]:
        """The league games a candidate plays before a promotion, by member name: ``league_games`` seeds per member
        (2 per seat by default), seats in turn (:meth:`matchup` reads them). The loop refuses a candidate whose mean
        payoff against any member is below 0 (it loses to an incumbent of the run). Empty without a league."""
        if not self.league:
            return {}
        n = 2 * len(self.seats) if self.league_games is None else self.league_games
        return {m.name: [RIVAL_SEEDS + 3 * (i * RIVAL_SPAN + g) + 1 for g in range(n)]
                for i, m in enumerate(self.members())}

    def payoff_table(self, payoffs: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[str], np.ndarray]:
        """The league's empirical payoff table: rows the league's members and the incumbents that have training
        payoffs (by candidate id), columns the training pool, entries the row's mean payoff against the column.
        An entry between two league members that was never played is the negated entry of the reverse pairing (a
        two-player zero-sum game played from both seats), else 0.

        Returns:
            ``(row ids, column names, table)`` with ``table`` float64 of shape ``(rows, columns)``.
        """
        cols = list(self.pools["train"])
        rows = [cid for cid in payoffs if payoffs[cid]]
        member = {o.candidate_id: o.name for o in self.opponents if o.candidate_id is not None}
        by_name = {name: cid for cid, name in member.items()}
        table = np.zeros((len(rows), len(cols)), dtype=np.float64)
        for i, cid in enumerate(rows):
            for j, col in enumerate(cols):
                if col in payoffs[cid]:
                    table[i, j] = payoffs[cid][col]
                elif col in by_name and member.get(cid) in payoffs.get(by_name[col], {}):
                    table[i, j] = -payoffs[by_name[col]][member[cid]]
        return rows, cols, table

    def opponent_sources(self) -> dict[str, str]:
        """Every opponent's source, by its SHA-256: policy code executors run sandboxed beside the candidate."""
        return {o.key: o.source for o in self.opponents}

    # -- the Task contract -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``[task] name``, else the game (``"classic/connect_four-v3"``)."""
        return self.label or self.game

    @property
    def step_limit(self) -> int:
        """Most moves per episode (both sides), env steps."""
        assert self.max_moves is not None  # set in __post_init__
        return int(self.max_moves)

    @property
    def functions(self) -> dict[str, int]:
        """``{"act": 2}``: a player is an ``act(observation, params)``; with ``objective = "exploitability"`` also
        ``probabilities(observation, params)``, its action distribution."""
        return {"act": 2, "probabilities": 2} if self.objective == "exploitability" else {"act": 2}

    @property
    def cost_unit(self) -> str:
        """``"env steps"`` (moves); ``"information states"`` asked, for ``objective = "exploitability"``."""
        return "information states" if self.objective == "exploitability" else "env steps"

    def seed_pools(self) -> Mapping[str, Sequence[int]] | None:
        """None: any seed makes an episode."""
        return None

    def private_paths(self) -> tuple[str, ...]:
        """None: the opponents' files travel as sources, and nothing of the game is secret."""
        return ()

    def spaces(self) -> tuple[Any, Any]:
        """``(Dict(observation, action_mask), Discrete(n_actions))``, as one player sees the game."""
        adapter = self._adapter()
        try:
            return adapter.spaces()
        finally:
            adapter.close()

    def dims(self) -> dict[str, int]:
        """``{"obs": observation size (flattened), "act": number of actions}``."""
        obs, act = self.spaces()
        return {"obs": int(np.prod(obs["observation"].shape)), "act": int(act.n)}

    def make_env(self, render_mode: str | None = None) -> Any:
        """Game tasks have no single-agent environment.

        Raises:
            TaskError: always (refiners that step an environment, such as ppo or dagger, do not apply).
        """
        raise TaskError(f"{self.name} is a game task: it has no single-agent environment to step (refiners and "
                        "tools that need one, such as ppo, dagger or traces, do not apply)")

    def is_success(self, episode_return: float, terminated: bool, truncated: bool) -> bool | None:
        """``return >= success_threshold`` when set; else a win (payoff > 0), and no success defined for
        ``objective = "exploitability"``."""
        if self.success_threshold is not None:
            return bool(episode_return >= self.success_threshold)
        if self.objective == "exploitability":
            return None
        return bool(episode_return > 0)

    def success_rule(self) -> str | None:
        """How success is decided."""
        what = "minus exploitability" if self.objective == "exploitability" else "payoff"
        if self.success_threshold is not None:
            return f"{what} ≥ {self.success_threshold:g} ([task] success_threshold)"
        return None if self.objective == "exploitability" else "a win (payoff > 0)"

    @property
    def diagnose(self) -> Any:
        """Failing episodes are grouped by outcome and opponent (``"loss vs minimax4"``); errors by their text."""
        return _diagnose

    def observation_names(self, size: int) -> list[str]:
        """Generic names."""
        return [f"x[{i}]" for i in range(size)]

    def describe(self) -> str:
        """The game, the seats and the opponents, for prompts."""
        pools = "; ".join(f"{s}: {', '.join(self.pools[s])}" for s in _SPLITS)
        return (f"Play {self.game} as seat(s) {', '.join(map(str, self.seats))} against opponents ({pools}). "
                "act(observation, params) gets a dict with 'observation' (numeric array), 'action_mask' (1 = legal) "
                "and 'seat', and returns the index of a legal action. The return is the payoff "
                f"(win > 0); an illegal move {'loses the game' if self.illegal == 'fail' else 'is replaced'}.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description, with every opponent's source (so replay and resume play the same ones)."""
        return {"kind": "game", "game": self.game, "seats": list(self.seats), "illegal": self.illegal,
                "max_moves": self.max_moves, "success_threshold": self.success_threshold,
                "game_kwargs": dict(self.game_kwargs), "cost_unit": self.cost_unit,
                "opponents": [{"name": o.name, "path": o.path, "source": o.source, "params": _jsonable(o.params),
                               **({"candidate_id": o.candidate_id} if o.candidate_id else {})}
                              for o in self.opponents],
                **{f"{s}_opponents": list(self.pools[s]) for s in _SPLITS},
                **({"name": self.label} if self.label else {}), **({"league": True} if self.league else {}),
                **({"weights": dict(self.weights)} if self.weights else {}),
                **({"objective": self.objective} if self.objective != "payoff" else {}),
                **({"league_games": self.league_games} if self.league_games is not None else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GameTask:
        """Inverse of :meth:`to_dict` (the stored sources, never the files as they are now)."""
        opponents = tuple(Opponent(o["name"], o["path"], o["source"], dict(o.get("params") or {}),
                                   o.get("candidate_id")) for o in d["opponents"])
        return cls(d["game"], opponents, {s: tuple(d[f"{s}_opponents"]) for s in _SPLITS},
                   tuple(d.get("seats") or ()), d.get("illegal", "fail"), d.get("max_moves"),
                   d.get("success_threshold"), dict(d.get("game_kwargs") or {}), d.get("name"),
                   bool(d.get("league", False)), d.get("weights"), d.get("objective", "payoff"), d.get("league_games"))

    @classmethod
    def from_spec(cls, table: Any) -> GameTask:
        """From a spec's ``[task]`` table (``opponents`` paths resolved against the spec's folder by
        :func:`ratchet.spec.spec_from_dict`); the ledger's stored form is read as :meth:`from_dict`.

        Raises:
            TaskError: an opponent file is missing or unreadable, or as the constructor.
        """
        t = table if isinstance(table, Mapping) else table.model_dump()
        if isinstance(t.get("opponents"), list):
            return cls.from_dict(t)
        if not t.get("game"):
            raise TaskError("[task] kind = \"game\" needs game = \"classic/connect_four-v3\" (PettingZoo) or "
                            "\"openspiel:kuhn_poker\" (OpenSpiel)")
        table_opps = t.get("opponents") or {}
        opponents = tuple(_read_opponent(name, entry) for name, entry in table_opps.items())
        names = tuple(o.name for o in opponents)
        pools = {s: tuple(t.get(f"{s}_opponents") or names) for s in _SPLITS}
        return cls(t["game"], opponents, pools, tuple(t.get("seats") or ()), t.get("illegal") or "fail",
                   t.get("max_moves"), t.get("success_threshold"), dict(t.get("game_kwargs") or {}), t.get("name"),
                   bool(t.get("league")), objective=t.get("objective") or "payoff", league_games=t.get("league_games"))

    # -- one episode -----------------------------------------------------------------------------------

    def run_episode(self, policy: Any, params: Mapping[str, Any], seed: int, render_path: str | None = None,
                    opponents: OpponentHandles | None = None) -> Any:
        """Play episode ``seed``: the candidate in its seat, the matched opponent in every other seat (runs on
        the trusted side: the env host, which applies moves and pays out), each player on its own clock of
        ``opponents.clock_s`` seconds (see "Clocks" above).

        Args:
            policy: The candidate (:class:`ratchet.tasks.PolicyHandle`).
            params: Its parameter values.
            seed: The episode's seed: the opponent, the seat (:meth:`matchup`), the game's and the players'
                randomness.
            render_path: Ignored (nothing is rendered).
            opponents: Where the opponents run, and the players' clocks (the executor's :class:`OpponentHandles`).

        Returns:
            The :class:`~ratchet.rollout.Episode`; the candidate's crash, garbage, illegal move or clock run out (seen
            after its move) is an errored episode with the loss payoff; a declared opponent's crash, garbage or
            illegal move an errored episode with ``diagnostics["fault"] == "task"``; an opponent whose clock ran out,
            and a league member that failed in any way, forfeit: a won episode with ``diagnostics["forfeit"]``.

        Raises:
            TaskError: no ``opponents`` were given (an executor that cannot run them).
            RolloutAborted: the candidate's process died, ran out of its clock or sent garbage (its length and the
                loss payoff attached), or the opponent's did: a declared opponent's process that died or sent garbage
                with :attr:`RolloutAborted.fault` set; an opponent that ran out of its clock, or a league member's
                lost process, with :attr:`RolloutAborted.episode` set to the forfeit (the process is replaced all the
                same).
        """
        from ratchet.rollout import Episode, PolicyFailure, RolloutAborted, error_text

        if self.objective == "exploitability":
            return self._exact_episode(policy, params, seed)
        if opponents is None:
            raise TaskError("this executor cannot run a game's opponents (use [execution] backend = \"process\")")
        opp, seat = self.matchup(seed)
        rng = np.random.default_rng([int(seed), 7])
        game = self._adapter()
        steps, illegal = 0, 0
        info: dict[str, Any] = {"opponent": opp.name, "seat": seat}
        clocks = _Clocks(opponents)
        try:
            game.reset(seed, rng)
            spaces = game.spaces()
            worst = self._worst(game)
            try:
                clocks.run(True, policy.start, params, seed, spaces)
            except PolicyFailure as exc:
                return self._lost(seed, steps, worst, f"{exc.kind}: {exc.text[:300]}" if exc.text else exc.kind, info)
            except RolloutAborted as exc:
                raise clocks.charged(exc, steps, worst) from None
            if clocks.out(True):
                return self._lost(seed, steps, worst, f"start: {clocks.ran_out(True)}", info)
            rival_params = opp.values()
            try:
                rival = clocks.run(False, _started, opponents, opp, rival_params, seed, spaces)
            except RolloutAborted as exc:
                raise self._rival_lost(exc, seed, opp, info, game, steps, clocks, "start") from None
            except Exception as exc:  # noqa: BLE001 - the opponent failing to start is the setup's fault
                return self._fault(seed, opp, error_text(exc), info, game, steps)
            if clocks.out(False):
                return self._forfeit(seed, opp, f"failed: start: {clocks.ran_out(False)}", info, game, steps)
            while (mover := game.to_move()) is not None and steps < self.step_limit:
                obs = game.observe(mover)
                mine = mover == seat
                try:
                    if mine:
                        action = clocks.run(True, policy.act, obs, params)
                    else:
                        action = clocks.run(False, rival.act, obs, rival_params)
                    legal = _legal(action, obs["action_mask"])
                except RolloutAborted as exc:
                    if not mine:
                        raise self._rival_lost(exc, seed, opp, info, game, steps, clocks, f"move {steps}") from None
                    raise clocks.charged(exc, steps, worst) from None
                except BaseException as exc:  # noqa: BLE001 - what a player raised (in-process: anything) is its failure
                    if not mine:
                        return self._fault(seed, opp, f"move {steps}: {error_text(exc)}", info, game, steps)
                    return self._lost(seed, steps, worst, f"move {steps}: {error_text(exc)}", info)
                if clocks.out(mine):
                    if not mine:
                        return self._forfeit(seed, opp, f"failed: move {steps}: {clocks.ran_out(False)}", info, game, steps)
                    return self._lost(seed, steps, worst, f"move {steps}: {clocks.ran_out(True)}", info)
                if legal is None:
                    what = f"move {steps}: illegal move {_show(action)} (legal: {np.flatnonzero(obs['action_mask']).tolist()})"
                    if not mine:
                        return self._fault(seed, opp, what, info, game, steps)
                    if self.illegal == "fail":
                        return self._lost(seed, steps, worst, what, info)
                    illegal += 1
                    legal = int(rng.choice(np.flatnonzero(obs["action_mask"])))
                game.step(legal)
                steps += 1
            terminated, truncated = game.ended()
            if not terminated:
                truncated = True
            payoff = game.payoff(seat)
        finally:
            game.close()
        if not np.isfinite(payoff):
            return self._fault(seed, opp, f"the game paid a non-finite payoff {payoff}", info)
        return Episode(int(seed), float(payoff), steps, bool(terminated), bool(truncated and not terminated),
                       self.is_success(payoff, terminated, truncated), None,
                       {**info, "cause": "terminated" if terminated else "truncated", "outcome": outcome_of(payoff),
                        "illegal_moves": illegal})

    def _exact_episode(self, policy: Any, params: Mapping[str, Any], seed: int) -> Any:
        """One exact evaluation: minus the exploitability of the policy's ``probabilities`` (every seat)."""
        from ratchet.rollout import Episode, RolloutAborted, error_text

        game = self._adapter()
        assert isinstance(game, _OpenSpiel)  # objective = "exploitability" needs OpenSpiel (checked at construction)
        asked = [0]

        def probabilities(obs: dict[str, Any]) -> Any:
            asked[0] += 1
            return policy.call("probabilities", (obs,))

        try:
            policy.start(params, seed, game.spaces())
            value, conv, states = game.exploitability(probabilities)
        except RolloutAborted as exc:
            exc.length, exc.episode_return = asked[0], -float(game.game.max_utility() - game.game.min_utility())
            raise
        except BaseException as exc:  # noqa: BLE001 - the policy's failure (raised, garbage) is its outcome
            text = str(exc) if isinstance(exc, _BadProbabilities) else error_text(exc)
            return Episode(int(seed), -float(game.game.max_utility() - game.game.min_utility()), asked[0], False,
                           False, self.is_success(-np.inf, False, False), text[:500], {"cause": "error"})
        return Episode(int(seed), -value, states, True, False, self.is_success(-value, True, False), None,
                       {"cause": "terminated", "scores": {"exploitability": value, "nash_conv": conv}})

    def _worst(self, game: _PettingZoo | _OpenSpiel) -> float:
        """The loss payoff an errored episode of the candidate gets: OpenSpiel's ``min_utility``, else −1."""
        return float(game.game.min_utility()) if isinstance(game, _OpenSpiel) else -1.0

    def _best(self, game: _PettingZoo | _OpenSpiel) -> float:
        """The win payoff a game a league member forfeits pays: OpenSpiel's ``max_utility``, else +1."""
        return float(game.game.max_utility()) if isinstance(game, _OpenSpiel) else 1.0

    def _lost(self, seed: int, steps: int, worst: float, error: str, info: Mapping[str, Any]) -> Any:
        from ratchet.rollout import Episode

        return Episode(int(seed), worst, steps, False, False, False, error[:500],
                       {**info, "cause": "error", "outcome": "loss", "illegal_moves": 0})

    def _fault(self, seed: int, opp: Opponent, error: str, info: Mapping[str, Any],
               game: _PettingZoo | _OpenSpiel | None = None, steps: int = 0) -> Any:
        """An opponent's failure: a declared opponent's is the setup's fault (the run stops); a league member's (a
        run's incumbent, policy code like any candidate) forfeits the game (:meth:`_forfeit`)."""
        from ratchet.rollout import Episode

        if opp.candidate_id is not None and game is not None:
            return self._forfeit(seed, opp, f"failed: {error}", info, game, steps)
        return Episode(int(seed), 0.0, 0, False, False, None,
                       f"opponent {opp.name} ({Path(opp.path).name}) failed on seed {seed}: {error}"[:500],
                       {**info, "cause": "error", "fault": "task"})

    def _forfeit(self, seed: int, opp: Opponent, why: str, info: Mapping[str, Any], game: _PettingZoo | _OpenSpiel,
                 steps: int) -> Any:
        """The game ``opp`` forfeits after ``steps`` moves: the candidate wins it (the best payoff, terminated,
        ``diagnostics["forfeit"]``: ``"opponent NAME " + why``, at most 300 characters)."""
        from ratchet.rollout import Episode

        best = self._best(game)
        return Episode(int(seed), best, steps, True, False, self.is_success(best, True, False), None,
                       {**info, "cause": "terminated", "outcome": outcome_of(best), "illegal_moves": 0,
                        "forfeit": f"opponent {opp.name} {why}"[:300]})

    def _rival_lost(self, exc: Any, seed: int, opp: Opponent, info: Mapping[str, Any],
                    game: _PettingZoo | _OpenSpiel, steps: int, clocks: _Clocks, when: str) -> Any:
        """``exc`` (a :class:`~ratchet.rollout.RolloutAborted` from the opponent's process), saying whose it is: an
        opponent that ran out of its own clock, and a league member whose process was lost in any way, forfeit
        (:attr:`~ratchet.rollout.RolloutAborted.episode`); a declared opponent whose process died or sent garbage
        is the setup's fault (:attr:`~ratchet.rollout.RolloutAborted.fault`). ``when``: ``"start"`` or ``"move 3"``."""
        if exc.status == "timeout":
            what = clocks.ran_out(False)
        else:
            what = f"its process was lost ({exc.status}{': ' + exc.detail if exc.detail else ''})"
        if exc.status == "timeout" or opp.candidate_id is not None:
            exc.episode = self._forfeit(seed, opp, f"failed: {when}: {what}", info, game, steps)
        else:
            exc.fault = f"opponent {opp.name} ({opp.path}) on seed {seed}: {when}: {what}"
        return exc


def _started(opponents: OpponentHandles, opp: Opponent, params: Mapping[str, Any], seed: int,
             spaces: tuple[Any, Any]) -> Any:
    """``opp``'s handle, started for episode ``seed``."""
    handle = opponents.get(opp.key, opp.source)
    handle.start(params, seed, spaces)
    return handle


class _Clocks:
    """The two clocks of one game (see "Clocks" above): seconds left to the candidate (``True``) and to its opponent
    (``False``), all None when the executor keeps no clocks (:attr:`OpponentHandles.clock_s`)."""

    def __init__(self, handles: OpponentHandles) -> None:
        self.handles, self.clock_s = handles, handles.clock_s
        self.left: dict[bool, float | None] = {True: self.clock_s, False: self.clock_s}

    def run(self, mine: bool, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``: a turn of the candidate (``mine``) or its opponent, on that player's clock."""
        left = self.left[mine]
        if left is None:
            return call(*args)
        began = time.monotonic()
        try:
            with self.handles.limit(left):
                return call(*args)
        finally:
            self.left[mine] = left - (time.monotonic() - began)

    def out(self, mine: bool) -> bool:
        """Whether that player's clock has run out (read after its turn)."""
        left = self.left[mine]
        return left is not None and left <= 0

    def ran_out(self, mine: bool) -> str:
        """Why that player's turn ended, in words: ``"timeout after 60 s of its own clock (its start and moves)"``
        for the candidate, ``"ran out of its clock (60 s of its own start and moves)"`` for the opponent."""
        clock = "" if self.clock_s is None else f"{self.clock_s:g} s "
        if mine:
            return f"timeout after {clock}of its own clock (its start and moves)"
        return f"ran out of its clock ({clock}of its own start and moves)"

    def charged(self, exc: Any, steps: int, worst: float) -> Any:
        """``exc`` (the candidate's lost process) with what the game reached: ``steps`` and the loss payoff."""
        exc.length, exc.episode_return = steps, worst
        if exc.status == "timeout" and self.clock_s is not None:
            exc.detail = "of its own clock (its start and moves)"
        return exc


class _BadProbabilities(Exception):
    """A policy's ``probabilities()`` answer is not a distribution over the legal actions."""


def _legal(action: Any, mask: np.ndarray) -> int | None:
    """``action`` as an int index when it is one and legal under ``mask``, else None."""
    try:
        a = np.asarray(action)
    except Exception:  # noqa: BLE001 - an in-process player may return any object
        return None
    if a.size != 1 or a.dtype.kind not in "iuf":
        return None
    v = float(a.reshape(()))
    if not np.isfinite(v) or v != int(v) or not 0 <= int(v) < len(mask) or not mask[int(v)]:
        return None
    return int(v)


def _show(action: Any) -> str:
    text = " ".join(str(action).split())
    return text[:40]


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (np.asarray(v).tolist() if isinstance(v, (np.ndarray, list, tuple)) else v) for k, v in params.items()}


def _read_opponent(name: Any, entry: Any) -> Opponent:
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum() or len(name) > 40:
        raise TaskError(f"[task.opponents] key {str(name)[:40]!r} must be a short name (letters, digits, - and _)")
    params: Mapping[str, Any] = {}
    if isinstance(entry, Mapping):
        unknown = set(entry) - {"path", "params"}
        if unknown or "path" not in entry:
            raise TaskError(f"[task.opponents] {name} must be a path or a table {{path = \"bot.py\", params = {{...}}}}")
        path, params = entry["path"], entry.get("params") or {}
        if not isinstance(params, Mapping):
            raise TaskError(f"[task.opponents] {name}.params must be a table of parameter values")
    else:
        path = entry
    if not isinstance(path, str) or not path:
        raise TaskError(f"[task.opponents] {name} must name a policy file")
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"opponent {name}: policy file not found: {p}")
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"opponent {name}: cannot read {p}: {exc}") from None
    return Opponent(name, str(p.resolve()), source, dict(params))


def _diagnose(episode: Any) -> list[str]:
    """``"loss vs minimax4"`` / ``"draw vs random"``, or the error's text."""
    if episode.error:
        from ratchet.critic import error_mode

        return [error_mode(episode.error)]
    d = episode.diagnostics
    return [f"{d.get('outcome', 'loss')} vs {d.get('opponent', '?')}"]

