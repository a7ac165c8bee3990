"""A Connect Four player: a short look-ahead over a weighted evaluation of the board.

It searches ``DEPTH`` plies (negamax with alpha-beta pruning over bitboards); a won position ends the search, a
move that leaves the opponent an immediate win is never searched, and an opponent's immediate win must be blocked.
Other leaves are scored by a weighted count of features from the side to move: windows of four cells holding three
or two of its pieces and none of the other's (its chances), the same for the opponent (what it must block), pieces
in the centre column, and threats on rows of the right parity (a first player's threats on odd rows, a second
player's on even rows, win Connect Four's endgames). It weighs them with one set of weights when it plays first and
another when it plays second. The weights start at a guess; ratchet refines them against the opponent pool.

The board is two bitboards (``me``, ``mask``): bit ``c * 7 + r`` is column ``c``, row ``r`` from the bottom, with a
spare bit on top of each column (J. Pons, "Solving Connect 4", 2019: the threat and window counts are shifts).
"""

import numpy as np

FEATURES = ("my_three", "my_two", "their_three", "their_two", "centre", "parity")
# one set of weights for each seat: the first and the second player want different things (odd or even rows)
PARAMETERS = {
    "my_three_first": {"default": 1.0, "low": -10.0, "high": 10.0},
    "my_two_first": {"default": 1.0, "low": -10.0, "high": 10.0},
    "their_three_first": {"default": 1.0, "low": -10.0, "high": 10.0},
    "their_two_first": {"default": 1.0, "low": -10.0, "high": 10.0},
    "centre_first": {"default": 0.0, "low": -10.0, "high": 10.0},
    "parity_first": {"default": 0.0, "low": -10.0, "high": 10.0},
    "my_three_second": {"default": 1.0, "low": -10.0, "high": 10.0},
    "my_two_second": {"default": 1.0, "low": -10.0, "high": 10.0},
    "their_three_second": {"default": 1.0, "low": -10.0, "high": 10.0},
    "their_two_second": {"default": 1.0, "low": -10.0, "high": 10.0},
    "centre_second": {"default": 0.0, "low": -10.0, "high": 10.0},
    "parity_second": {"default": 0.0, "low": -10.0, "high": 10.0},
}

DEPTH = 4
ROWS, COLS = 6, 7
H1 = ROWS + 1
WON = 1e6
BOTTOM = sum(1 << (c * H1) for c in range(COLS))
BOARD = BOTTOM * ((1 << ROWS) - 1)
ODD = sum(1 << (c * H1 + r) for c in range(COLS) for r in (0, 2, 4))  # rows 1, 3 and 5 counted from the bottom
CENTRE = ((1 << ROWS) - 1) << (3 * H1)
COLUMN = [((1 << ROWS) - 1) << (c * H1) for c in range(COLS)]
ORDER = (3, 2, 4, 1, 5, 0, 6)  # centre first: better moves first, more cut-offs
DIRECTIONS = (1, H1, H1 - 1, H1 + 1)  # vertical, horizontal and both diagonals


def threats(p, mask):
    """Empty cells where one more piece of ``p`` completes four in a line."""
    r = (p << 1) & (p << 2) & (p << 3)
    for s in DIRECTIONS[1:]:
        q = (p << s) & (p << 2 * s)
        r |= q & (p << 3 * s)
        r |= q & (p >> s)
        q = (p >> s) & (p >> 2 * s)
        r |= q & (p << s)
        r |= q & (p >> 3 * s)
    return r & (BOARD ^ mask)


def windows(p, other):
    """How many windows of four hold exactly three, and exactly two, of ``p``'s pieces and none of ``other``'s."""
    free = BOARD & ~other
    threes = twos = 0
    for s in DIRECTIONS:
        ok = free & (free >> s) & (free >> 2 * s) & (free >> 3 * s)  # windows (by first cell) free of ``other``
        a, b, c, d = p, p >> s, p >> 2 * s, p >> 3 * s
        x0, x1, y0, y1 = a ^ b, a & b, c ^ d, c & d  # a + b and c + d as two-bit numbers, then their sum
        z0, carry = x0 ^ y0, x0 & y0
        z1 = x1 ^ y1 ^ carry
        z2 = (x1 & y1) | (carry & (x1 ^ y1))
        threes += (ok & z0 & z1 & ~z2).bit_count()
        twos += (ok & ~z0 & z1 & ~z2).bit_count()
    return threes, twos


def evaluate(me, mask, w, first):
    """The weighted features of a position from the side to move (pieces ``me``; ``first``: it moved first)."""
    them = me ^ mask
    m3, m2 = windows(me, them)
    t3, t2 = windows(them, me)
    mine, theirs = (ODD, ~ODD) if first else (~ODD, ODD)
    parity = (threats(me, mask) & mine).bit_count() - (threats(them, mask) & theirs).bit_count()
    centre = (me & CENTRE).bit_count() - (them & CENTRE).bit_count()
    return w[0] * m3 + w[1] * m2 - w[2] * t3 - w[3] * t2 + w[4] * centre + w[5] * parity


def search(me, mask, depth, alpha, beta, w, first):
    """Negamax value of the position for the side to move, to ``depth`` plies."""
    possible = (mask + BOTTOM) & BOARD
    if threats(me, mask) & possible:
        return WON + depth  # it wins with its next move: sooner is better
    if depth == 0:
        return evaluate(me, mask, w, first)
    them = me ^ mask
    their_wins = threats(them, mask)
    forced = their_wins & possible  # the opponent wins there next unless blocked
    best = -np.inf
    for c in ORDER:
        move = possible & COLUMN[c]
        if not move or (move << 1) & their_wins or (forced and not move & forced):
            continue
        value = -search(them, mask | move, depth - 1, -beta, -alpha, w, not first)
        if value > best:
            best = value
            alpha = max(alpha, value)
            if alpha >= beta:
                break
    if best == -np.inf:  # every move loses at once, or the board is full
        return 0.0 if possible == 0 else -WON - depth + 1
    return best


def act(observation, params):
    board = observation["observation"]  # (6, 7, 2): plane 0 the player to move's pieces, plane 1 the other's
    me = them = 0
    for r in range(ROWS):
        for c in range(COLS):
            bit = 1 << (c * H1 + ROWS - 1 - r)
            if board[r, c, 0]:
                me |= bit
            elif board[r, c, 1]:
                them |= bit
    mask = me | them
    first = me.bit_count() == them.bit_count()
    w = [float(params[f"{name}_{'first' if first else 'second'}"]) for name in FEATURES]
    legal = [c for c in ORDER if observation["action_mask"][c]]
    best, choice = -np.inf, legal[0]
    for c in legal:
        move = (mask + BOTTOM) & BOARD & COLUMN[c]
        if threats(me, mask) & move:
            return int(c)  # a winning move
        value = -search(me ^ mask, mask | move, DEPTH - 1, -np.inf, -best, w, not first)
        if value > best:
            best, choice = value, c
    return int(choice)
