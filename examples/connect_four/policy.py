"""A Connect Four player: a short look-ahead over a weighted evaluation of the board.

It searches ``DEPTH`` plies (negamax with alpha-beta pruning); a won or lost position ends the search, and other
leaves are scored by a weighted count of features from its own side: windows of four cells holding three or two of
its pieces and no other (threats), the same for the opponent (the threats it must block), and pieces in the centre
columns. The weights start at a guess; ratchet refines them against the opponent pool.
"""

import numpy as np

PARAMETERS = {
    "my_three": {"default": 1.0, "low": -10.0, "high": 10.0},
    "my_two": {"default": 1.0, "low": -10.0, "high": 10.0},
    "their_three": {"default": 1.0, "low": -10.0, "high": 10.0},
    "their_two": {"default": 1.0, "low": -10.0, "high": 10.0},
    "centre": {"default": 0.0, "low": -10.0, "high": 10.0},
}

DEPTH = 3
ROWS, COLS = 6, 7
WON = 1e6


def _windows():
    """Flat indices of every window of four cells in a line, shape (69, 4)."""
    out = []
    for r in range(ROWS):
        for c in range(COLS):
            for dr, dc in ((0, 1), (1, 0), (1, 1), (-1, 1)):
                if 0 <= r + 3 * dr < ROWS and 0 <= c + 3 * dc < COLS:
                    out.append([(r + i * dr) * COLS + c + i * dc for i in range(4)])
    return np.array(out)


WINDOWS = _windows()
CENTRE = np.array([0, 1, 2, 3, 2, 1, 0] * ROWS, dtype=float)  # closeness to the centre column, per cell


def _features(board):
    """(wins, losses, my threes, my twos, their threes, their twos, centre) of ``board`` (+1 mine, -1 theirs)."""
    cells = board.ravel()[WINDOWS]
    mine, theirs = (cells == 1).sum(axis=1), (cells == -1).sum(axis=1)
    free_of_theirs, free_of_mine = theirs == 0, mine == 0
    return ((mine == 4).any(), (theirs == 4).any(),
            np.sum(free_of_theirs & (mine == 3)), np.sum(free_of_theirs & (mine == 2)),
            np.sum(free_of_mine & (theirs == 3)), np.sum(free_of_mine & (theirs == 2)),
            float(CENTRE @ board.ravel()))


def _value(board, w):
    won, lost, m3, m2, t3, t2, centre = _features(board)
    if won:
        return WON
    if lost:
        return -WON
    return w[0] * m3 + w[1] * m2 - w[2] * t3 - w[3] * t2 + w[4] * centre


def _drop(board, col):
    rows = np.flatnonzero(board[:, col] == 0)
    return None if rows.size == 0 else rows[-1]


def _search(board, depth, alpha, beta, w):
    """Negamax value of ``board`` for the player to move (+1), ``depth`` plies ahead."""
    value = _value(board, w)
    if depth == 0 or abs(value) == WON:
        return value
    best = -np.inf
    for col in (3, 2, 4, 1, 5, 0, 6):
        row = _drop(board, col)
        if row is None:
            continue
        board[row, col] = 1
        v = -_search(-board, depth - 1, -beta, -alpha, w)
        board[row, col] = 0
        best, alpha = max(best, v), max(alpha, v)
        if alpha >= beta:
            break
    return value if best == -np.inf else best


def act(observation, params):
    obs = observation["observation"]
    board = obs[:, :, 0].astype(float) - obs[:, :, 1]
    w = [params["my_three"], params["my_two"], params["their_three"], params["their_two"], params["centre"]]
    legal = np.flatnonzero(observation["action_mask"])
    values = []
    for col in legal:
        row = _drop(board, col)
        board[row, col] = 1
        values.append(-_search(-board, DEPTH - 1, -np.inf, np.inf, w))
        board[row, col] = 0
    return int(legal[int(np.argmax(values))])
