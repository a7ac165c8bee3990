"""A generalized planner for the 4-operator blocksworld: moves chosen by a weighted score.

The planner moves whole blocks (each move is two actions: pick-up or unstack, then put-down or stack)
and keeps two rules that make every plan valid and finite, whatever the weights:

* a *well-placed* block (it and everything under it are where the goal wants them) never moves again;
* a misplaced block moves either to its *final place* (its goal support is well-placed and clear, or the
  table when the goal puts it there or says nothing) or, when it is not on the table, to the table.

So a block moves at most twice and some move is always possible until the goal holds. Which move comes
next is the policy: every possible move gets a score, a weighted sum of its features, and the best one
(lowest block number on ties) is made. The features: ``final`` (the block becomes well-placed), ``table``
(the block goes to the table), ``unlock`` (how many blocks can move to their final place afterwards),
``waits`` (the block's goal support is well-placed, only covered: it could go there soon), ``below``
(misplaced blocks under it, / n) and ``height`` (blocks under it, / n).

At the default weights only ``table`` counts: the planner first puts every misplaced block on the table,
then builds the goal towers — always valid, but about 10 % longer than optimal on 8-10 blocks. A large
``w_final`` gives the classic "move a block to its final place whenever you can" strategy; the other
weights decide which block to put aside when no block can go to its final place.
"""

import numpy as np

PARAMETERS = {
    "w_final": {"default": 0.0, "low": -10.0, "high": 10.0},
    "w_table": {"default": 1.0, "low": -10.0, "high": 10.0},
    "w_unlock": {"default": 0.0, "low": -10.0, "high": 10.0},
    "w_waits": {"default": 0.0, "low": -10.0, "high": 10.0},
    "w_below": {"default": 0.0, "low": -10.0, "high": 10.0},
    "w_height": {"default": 0.0, "low": -10.0, "high": 10.0},
}

PICK_UP, PUT_DOWN, STACK, UNSTACK = 0, 1, 2, 3


def _analyse(on, goal, wanted):
    """(well-placed flags, clear flags) of the state ``on``."""
    n = len(on)
    clear = [True] * n
    for s in on:
        if s >= 0:
            clear[s] = False
    placed = [None] * n

    def well(i):
        if placed[i] is None:
            s, g = on[i], goal[i]
            here = s == g if g != -2 else (s == -1 or wanted[s] == -1)
            placed[i] = here and (s == -1 or well(s))
        return placed[i]

    for i in range(n):
        well(i)
    return placed, clear


def _final_place(b, on, goal, placed, clear):
    """Where misplaced block b becomes well-placed now (-1 the table), or None."""
    g = goal[b]
    if g < 0:
        return -1 if on[b] != -1 else None
    if g != b and clear[g] and placed[g]:
        return g
    return None


def _moves(on, goal, wanted):
    placed, clear = _analyse(on, goal, wanted)
    moves = []
    for b in range(len(on)):
        if not clear[b] or placed[b]:
            continue
        dest = _final_place(b, on, goal, placed, clear)
        if dest is not None:
            moves.append((b, dest, True))
        elif on[b] != -1:
            moves.append((b, -1, False))
    return moves, placed


def plan(state, goal, params):
    on = [int(s) for s in state]
    goal = [int(g) for g in goal]
    n = len(on)
    wanted = [-1] * n
    for i, g in enumerate(goal):
        if g >= 0:
            wanted[g] = i
    steps = []
    for _ in range(2 * n + 1):
        moves, placed = _moves(on, goal, wanted)
        if not moves:
            break
        best, best_score = None, -np.inf
        for b, dest, final in moves:
            after = list(on)
            after[b] = dest
            unlock = sum(1 for _, _, f in _moves(after, goal, wanted)[0] if f)
            g = goal[b]
            waits = 1.0 if (not final and g >= 0 and placed[g]) else 0.0
            below, height, s = 0, 0, on[b]
            while s != -1:
                height += 1
                below += 0 if placed[s] else 1
                s = on[s]
            score = (params["w_final"] * final + params["w_table"] * (dest == -1)
                     + params["w_unlock"] * unlock + params["w_waits"] * waits
                     + params["w_below"] * below / n + params["w_height"] * height / n)
            if score > best_score:
                best, best_score = (b, dest), score
        b, dest = best
        steps.append((PICK_UP, b, -1) if on[b] == -1 else (UNSTACK, b, on[b]))
        steps.append((PUT_DOWN, b, -1) if dest == -1 else (STACK, b, dest))
        on[b] = dest
    return np.array(steps, dtype=np.int64).reshape(-1, 3)
