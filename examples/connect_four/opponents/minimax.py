"""Minimax bot for Connect Four: negamax with alpha-beta pruning to ``depth`` plies.

Leaves are scored by the textbook evaluation (wins, then windows of four holding three or two of one side's
pieces and no other, and pieces in the centre column). Moves are searched centre first; among equally good moves
it picks one at random (NumPy's generator, seeded by the episode), so games against it vary with the seed and
replay exactly. The spec plays it at depths 1-4 (``params = {depth = 4}``).
"""

import numpy as np

PARAMETERS = {"depth": {"default": 2, "low": 1, "high": 6}}

ROWS, COLS = 6, 7
WIN = 1_000_000
# every window of four cells (row, col) in a line: horizontal, vertical and both diagonals
LINES = [[(r + i * dr, c + i * dc) for i in range(4)]
         for r in range(ROWS) for c in range(COLS) for dr, dc in ((0, 1), (1, 0), (1, 1), (-1, 1))
         if 0 <= r + 3 * dr < ROWS and 0 <= c + 3 * dc < COLS]
ORDER = [3, 2, 4, 1, 5, 0, 6]


def _won(grid, who):
    return any(all(grid[r][c] == who for r, c in line) for line in LINES)


def _score(grid, who):
    """The evaluation from ``who``'s side (+1 its pieces, -1 the other's)."""
    total = 3 * sum(1 for r in range(ROWS) if grid[r][3] == who) - 3 * sum(1 for r in range(ROWS) if grid[r][3] == -who)
    for line in LINES:
        cells = [grid[r][c] for r, c in line]
        mine, theirs = cells.count(who), cells.count(-who)
        if theirs == 0:
            total += {4: WIN, 3: 5, 2: 2}.get(mine, 0)
        elif mine == 0:
            total -= {4: WIN, 3: 4, 2: 2}.get(theirs, 0)
    return total


def _drop(grid, col):
    """The row a piece dropped in ``col`` lands on, or None when the column is full."""
    for r in range(ROWS - 1, -1, -1):
        if grid[r][col] == 0:
            return r
    return None


def _negamax(grid, who, depth, alpha, beta):
    if _won(grid, -who):
        return -WIN - depth  # the last move won: sooner is worse for us
    moves = [c for c in ORDER if grid[0][c] == 0]
    if depth == 0 or not moves:
        return _score(grid, who)
    best = -np.inf
    for col in moves:
        row = _drop(grid, col)
        grid[row][col] = who
        value = -_negamax(grid, -who, depth - 1, -beta, -alpha)
        grid[row][col] = 0
        best = max(best, value)
        alpha = max(alpha, value)
        if alpha >= beta:
            break
    return best


def act(observation, params):
    board = observation["observation"]
    grid = [[int(board[r, c, 0]) - int(board[r, c, 1]) for c in range(COLS)] for r in range(ROWS)]
    legal = [c for c in ORDER if observation["action_mask"][c]]
    depth = int(params["depth"])
    values = []
    for col in legal:
        row = _drop(grid, col)
        grid[row][col] = 1
        values.append(-_negamax(grid, -1, depth - 1, -np.inf, np.inf))
        grid[row][col] = 0
    best = max(values)
    choices = [c for c, v in zip(legal, values) if v == best]
    return int(choices[np.random.randint(len(choices))])
