"""Write a tabular policy file for an OpenSpiel game: one row of action logits per information state.

    python examples/kuhn_poker/make_policy.py kuhn_poker examples/kuhn_poker/policy.py
    python examples/kuhn_poker/make_policy.py leduc_poker examples/kuhn_poker/leduc_policy.py

The file lists the game's information states (``INFO_STATES``, in OpenSpiel's ``TabularPolicy`` order) and declares
``PARAMETERS = {"logits": ...}`` of shape (states, actions), all zeros: the uniform random policy. ``probabilities``
is the softmax of a state's row over its legal actions, ``act`` draws from it.
"""

import sys

import pyspiel
from open_spiel.python import policy as os_policy

TEMPLATE = '''"""Tabular policy for OpenSpiel's {game}: information state -> action probabilities (written by make_policy.py).

``probabilities`` is the softmax of the state's row of ``logits`` over its legal actions; ``act`` draws an action
from it. All logits 0 is the uniform random policy.
"""

import numpy as np

INFO_STATES = {states!r}
ROW = {{s: i for i, s in enumerate(INFO_STATES)}}

PARAMETERS = {{"logits": {{"shape": [{rows}, {cols}], "default": 0.0, "low": -20.0, "high": 20.0}}}}


def probabilities(observation, params):
    logits = np.asarray(params["logits"][ROW[observation["info_state"]]], dtype=float)
    mask = np.asarray(observation["action_mask"], dtype=bool)
    z = np.where(mask, logits, -np.inf)
    p = np.exp(z - z[mask].max())
    return p / p.sum()


def act(observation, params):
    p = probabilities(observation, params)
    return int(np.random.choice(len(p), p=p))
'''


def main(game_name: str, out: str) -> None:
    game = pyspiel.load_game(game_name)
    table = os_policy.TabularPolicy(game)
    states = [s.information_state_string() for s in table.states]
    n = game.num_distinct_actions()
    with open(out, "w", encoding="utf-8") as f:
        f.write(TEMPLATE.format(game=game_name, states=states, rows=len(states), cols=n))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
