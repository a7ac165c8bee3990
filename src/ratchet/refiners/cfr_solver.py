"""A vectorised CFR-family solver for small OpenSpiel games (Kuhn, Leduc poker): the ``cfr`` refiner's engine.

The game tree is enumerated once (:class:`GameTree`); each player's strategy is then handled in *sequence form*
(von Stengel, "Efficient computation of behavior strategies", GEB 1996): a realization plan ``x[I, a]`` (the player's
own probability of reaching information state ``I`` and playing ``a``) is a level-by-level forward pass over the
player's own decisions, and the counterfactual values of every (information state, action) are one weighted
``bincount`` over the terminal histories followed by a level-by-level backward pass. One iteration of CFR is a
handful of NumPy operations per level instead of a walk over every history; the numbers are the same as OpenSpiel's
tree-walking solvers (``open_spiel.python.algorithms.cfr`` and ``discounted_cfr``) up to float rounding, iteration
by iteration (``tests/test_cfr.py`` checks it).

Algorithms (all with alternating updates: player 0, then player 1 against player 0's new strategy, as OpenSpiel):

- ``cfr``: vanilla CFR, regret matching, uniform averaging. Zinkevich et al., "Regret Minimization in Games with
  Incomplete Information" (NeurIPS 2007).
- ``cfr+``: regret matching+ (cumulative regrets floored at 0), linear averaging (iteration ``t`` weighs ``t``).
  Tammelin, "Solving Large Imperfect Information Games Using CFR+" (2014); Tammelin et al. (IJCAI 2015).
- ``dcfr``: Discounted CFR with α = 1.5, β = 0, γ = 2: after iteration ``t`` positive cumulative regrets are scaled
  by ``t^α / (t^α + 1)``, negative ones by ``t^β / (t^β + 1)``, and iteration ``t`` weighs ``t^γ`` in the average.
  Brown & Sandholm, "Solving Imperfect-Information Games via Discounted Regret Minimization" (AAAI 2019).
- ``pcfr+``: Predictive CFR+: regret matching+ whose next strategy is taken from the cumulative regrets *plus a
  prediction* of the next instantaneous regrets (the last observed ones), quadratic averaging (``t^2``). Farina,
  Kroer & Sandholm, "Faster Game Solving via Predictive Blackwell Approachability: Connecting Regret Matching and
  Mirror Descent" (AAAI 2021).

The exact exploitability of any tabular policy is the same backward pass with a maximum in place of the expectation
(a best response of each player in sequence form), so a job can measure its checkpoints for a fraction of an
iteration's cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["ALGORITHMS", "Algorithm", "CFRState", "GameTree", "average_policy", "exploitability", "iterate", "regret_matching"]

Algorithm = Literal["cfr", "cfr+", "dcfr", "pcfr+"]
#: The algorithms :func:`iterate` runs (see the module docstring).
ALGORITHMS: tuple[str, ...] = ("cfr", "cfr+", "dcfr", "pcfr+")

_DCFR_ALPHA, _DCFR_BETA, _DCFR_GAMMA = 1.5, 0.0, 2.0


@dataclass(frozen=True)
class GameTree:
    """An OpenSpiel game's full tree, flattened for sequence-form passes.

    Information states are the rows of OpenSpiel's ``TabularPolicy`` (its ``states`` order), actions its columns.
    A *sequence* is a flat index into ``1 + S * A`` numbers: ``0`` is the empty sequence (nothing played yet),
    ``1 + row * A + action`` is playing ``action`` at information state ``row``.

    Attributes:
        info_states: The S information state strings, in ``TabularPolicy`` order.
        mask: bool (S, A), the legal actions of each information state.
        owner: int (S,), the player acting at each information state.
        parent: int (S,), each information state's parent sequence: the owner's own last (state, action) before
            it, or 0 (perfect recall makes it unique).
        levels: Per depth (number of own earlier decisions, any player), the int rows at that depth.
        player_levels: Per player, per depth, that player's int rows at that depth.
        terminal_seq: int (players, Z), each player's last sequence before each of the Z terminal histories.
        terminal_weight: float (Z,), the chance probability of reaching each terminal history.
        terminal_utility: float (players, Z), the returns at each terminal history.
    """

    info_states: tuple[str, ...]
    mask: np.ndarray
    owner: np.ndarray
    parent: np.ndarray
    levels: tuple[np.ndarray, ...]
    player_levels: tuple[tuple[np.ndarray, ...], ...]
    terminal_seq: np.ndarray
    terminal_weight: np.ndarray
    terminal_utility: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """(information states, actions): the shape of every per-(state, action) array."""
        return (int(self.mask.shape[0]), int(self.mask.shape[1]))

    @property
    def players(self) -> int:
        return int(self.terminal_seq.shape[0])

    @classmethod
    def from_game(cls, game: Any) -> GameTree:
        """Enumerate ``game`` (a ``pyspiel.Game``: sequential, perfect recall, chance with explicit outcomes).

        Raises:
            ValueError: the game is not sequential or an information state is reached after two different own
                sequences (imperfect recall).
        """
        import pyspiel
        from open_spiel.python import policy as os_policy

        if game.get_type().dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ValueError("CFR needs a sequential game (wrap a simultaneous one with turn_based_simultaneous_game)")
        table = os_policy.TabularPolicy(game)
        lookup = table.state_lookup
        n_states, n_actions = table.action_probability_array.shape
        n_players = game.num_players()
        mask = table.legal_actions_mask.astype(bool)
        owner = np.full(n_states, -1, dtype=np.int64)
        parent = np.full(n_states, -1, dtype=np.int64)
        seqs: list[tuple[int, ...]] = []
        weights: list[float] = []
        utils: list[Sequence[float]] = []
        stack: list[tuple[Any, tuple[int, ...], float]] = [(game.new_initial_state(), (0,) * n_players, 1.0)]
        while stack:
            state, seq, weight = stack.pop()
            if state.is_terminal():
                seqs.append(seq)
                weights.append(weight)
                utils.append(state.returns())
            elif state.is_chance_node():
                for action, p in state.chance_outcomes():
                    stack.append((state.child(action), seq, weight * p))
            else:
                player = state.current_player()
                row = lookup[state.information_state_string(player)]
                if parent[row] < 0:
                    owner[row], parent[row] = player, seq[player]
                elif parent[row] != seq[player] or owner[row] != player:
                    raise ValueError(f"information state {table.states[row].information_state_string()!r} is "
                                     "reached after two different own histories (CFR needs perfect recall)")
                for action in state.legal_actions():
                    nxt = seq[:player] + (1 + row * n_actions + action,) + seq[player + 1:]
                    stack.append((state.child(action), nxt, weight))
        if (owner < 0).any():
            raise ValueError("some information states of the TabularPolicy are never reached")
        depth = np.zeros(n_states, dtype=np.int64)
        for row in _topological(parent, n_actions):
            depth[row] = 0 if parent[row] == 0 else depth[(parent[row] - 1) // n_actions] + 1
        levels = tuple(np.flatnonzero(depth == d) for d in range(int(depth.max()) + 1))
        player_levels = tuple(tuple(rows[owner[rows] == p] for rows in levels) for p in range(n_players))
        return cls(tuple(s.information_state_string() for s in table.states), mask, owner, parent, levels,
                   player_levels, np.asarray(seqs, dtype=np.int64).T.copy(), np.asarray(weights, dtype=np.float64),
                   np.asarray(utils, dtype=np.float64).T.copy())

    def uniform(self) -> np.ndarray:
        """float (S, A): the uniform policy over each state's legal actions."""
        return self.mask / self.mask.sum(axis=1, keepdims=True)

    def realization(self, policy: np.ndarray) -> np.ndarray:
        """float (1 + S*A,): every player's realization plan of ``policy`` (float (S, A) action probabilities),
        indexed by sequence (entry 0, the empty sequence, is 1)."""
        n_states, n_actions = self.shape
        x = np.empty(1 + n_states * n_actions)
        x[0] = 1.0
        plan = x[1:].reshape(n_states, n_actions)
        for rows in self.levels:
            plan[rows] = x[self.parent[rows]][:, None] * policy[rows]
        return x

    def counterfactual(self, player: int, x: np.ndarray, policy: np.ndarray | None) -> np.ndarray:
        """float (1 + S*A,): ``player``'s counterfactual value of each of its sequences (0 elsewhere), the others
        playing realization plan ``x``; ``player`` plays ``policy`` below each sequence, or a best response when
        ``policy`` is None. Entry 0 is ``player``'s value of the game."""
        reach = self.terminal_weight * self.terminal_utility[player]
        for other in range(self.players):
            if other != player:
                reach = reach * x[self.terminal_seq[other]]
        n_states, n_actions = self.shape
        size = 1 + n_states * n_actions
        values = np.bincount(self.terminal_seq[player], weights=reach, minlength=size)
        q = values[1:].reshape(n_states, n_actions)
        for rows in reversed(self.player_levels[player]):
            if policy is None:
                v = np.where(self.mask[rows], q[rows], -np.inf).max(axis=1)
            else:
                v = (policy[rows] * q[rows]).sum(axis=1)
            values += np.bincount(self.parent[rows], weights=v, minlength=size)
        return values


@dataclass
class CFRState:
    """A solver line's state (everything the next iteration needs; saved as a job's artifact).

    Attributes:
        regret: float (S, A), cumulative (discounted, floored: per algorithm) counterfactual regrets.
        average: float (S, A), the cumulative weighted realization plans (normalised per row: the average policy).
        current: float (S, A), the current iterate (the strategy the next iteration plays).
        iteration: Iterations done.
    """

    regret: np.ndarray
    average: np.ndarray
    current: np.ndarray
    iteration: int

    @classmethod
    def start(cls, tree: GameTree, policy: np.ndarray | None = None) -> CFRState:
        """A new line whose first iterate is ``policy`` (float (S, A)), uniform by default."""
        current = tree.uniform() if policy is None else np.asarray(policy, dtype=np.float64).copy()
        return cls(np.zeros(tree.shape), np.zeros(tree.shape), current, 0)


def regret_matching(regret: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float (S, A) regret matching of ``regret`` (float (S, A)) over ``mask`` (bool (S, A)): positive parts
    normalised per row; uniform over the legal actions where none is positive. Hart & Mas-Colell (Econometrica 2000)."""
    pos = np.maximum(regret, 0.0) * mask
    total = pos.sum(axis=1, keepdims=True)
    uniform = mask / mask.sum(axis=1, keepdims=True)
    return np.where(total > 0, pos / np.where(total > 0, total, 1.0), uniform)


def iterate(tree: GameTree, state: CFRState, algorithm: Algorithm, iterations: int) -> CFRState:
    """Run ``iterations`` iterations of ``algorithm`` from ``state`` (updated in place and returned).

    Each iteration updates player 0, then player 1 (against player 0's new strategy), and so on (alternating
    updates); the updating player's realization plan before its update enters the average with the algorithm's
    weight.

    Raises:
        ValueError: an unknown algorithm.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    n_states, n_actions = tree.shape
    rows_of = [np.flatnonzero(tree.owner == p) for p in range(tree.players)]
    mask = tree.mask
    for _ in range(int(iterations)):
        state.iteration += 1
        t = float(state.iteration)
        weight = {"cfr": 1.0, "cfr+": t, "dcfr": t ** _DCFR_GAMMA, "pcfr+": t * t}[algorithm]
        for player, rows in enumerate(rows_of):
            x = tree.realization(state.current)
            q = tree.counterfactual(player, x, state.current)[1:].reshape(n_states, n_actions)[rows]
            sigma = state.current[rows]
            regret = (q - (sigma * q).sum(axis=1, keepdims=True)) * mask[rows]
            state.average[rows] += weight * x[1:].reshape(n_states, n_actions)[rows]
            cumulative = state.regret[rows] + regret
            if algorithm in ("cfr+", "pcfr+"):
                cumulative = np.maximum(cumulative, 0.0)
            elif algorithm == "dcfr":
                up, down = t ** _DCFR_ALPHA, t ** _DCFR_BETA
                cumulative = cumulative * np.where(cumulative >= 0, up / (up + 1), down / (down + 1))
            state.regret[rows] = cumulative
            predicted = cumulative + regret if algorithm == "pcfr+" else cumulative
            state.current[rows] = regret_matching(predicted, mask[rows])
    return state


def average_policy(tree: GameTree, state: CFRState) -> np.ndarray:
    """float (S, A): the line's average policy (uniform where a state was never reached by its owner)."""
    total = state.average.sum(axis=1, keepdims=True)
    return np.where(total > 0, state.average / np.where(total > 0, total, 1.0), tree.uniform())


def exploitability(tree: GameTree, policy: np.ndarray) -> float:
    """Exploitability of ``policy`` (float (S, A), every seat playing it): NashConv / players, where NashConv is the
    sum over players of (best-response value − on-policy value). OpenSpiel's
    ``open_spiel.python.algorithms.exploitability.exploitability``, computed in sequence form."""
    x = tree.realization(policy)
    conv = 0.0
    for player in range(tree.players):
        best = tree.counterfactual(player, x, None)[0]
        played = tree.counterfactual(player, x, policy)[0]
        conv += best - played
    return float(conv / tree.players)


def _topological(parent: np.ndarray, n_actions: int) -> list[int]:
    """Rows ordered so that each row's parent row comes first."""
    order: list[int] = []
    seen = np.zeros(parent.shape[0], dtype=bool)
    for start in range(parent.shape[0]):
        chain = []
        row = start
        while not seen[row]:
            chain.append(row)
            seen[row] = True
            if parent[row] == 0:
                break
            row = int((parent[row] - 1) // n_actions)
        order.extend(reversed(chain))
    return order
