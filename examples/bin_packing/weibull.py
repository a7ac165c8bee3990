"""ratchet evaluator: online bin packing, Weibull 5k instances (FunSearch's benchmark; see binpacking.py).

The instance generator, the packing loop and the scoring live in binpacking.py beside this file, loaded by path
(ratchet execs this file with ``__file__`` set, so no ``sys.path`` change is needed). Generated seeds carry
their split (seed % 3: 0 train, 1 validation, 2 test).
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "ratchet_example_binpacking", os.path.join(os.path.dirname(os.path.abspath(__file__)), "binpacking.py"))
_bp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bp)

KIND = "weibull"
FUNCTIONS = _bp.FUNCTIONS
DESCRIPTION = _bp.description(KIND)
COST_UNIT = "items"
MAX_COST = int(_bp.KINDS[KIND]["n_items"])
CandidateError = _bp.CandidateError


def make_instance(seed):
    """Instance ``seed``: its item sizes drawn with numpy's default_rng(seed), the capacity and the L1 bound."""
    return _bp.make_instance(KIND, seed)


def evaluate(instance, policy):
    """Pack the instance online with ``policy.priority``; score = -excess % over the L1 bound (higher is better)."""
    return _bp.evaluate(instance, policy)
