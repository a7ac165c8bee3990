"""The bin packing example's evaluator (examples/bin_packing): instances, the L1 bound, packing, candidate errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent.parent / "examples" / "bin_packing"


def _load(name: str, file: str, options: dict | None = None):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if options is not None:  # as ratchet sets [task] options before the evaluator runs
        module.OPTIONS = options
    spec.loader.exec_module(module)
    return module


bp = _load("bin_packing_example_core", "evaluate.py")
weibull = _load("bin_packing_example_weibull", "evaluate.py", {"kind": "weibull"})
or_style = _load("bin_packing_example_or", "evaluate.py", {"kind": "or"})
policy = _load("bin_packing_example_policy", "policy.py")
DEFAULTS = {k: v["default"] for k, v in policy.PARAMETERS.items()}


class LocalPolicy:
    """The contract's stand-in for ratchet's sandboxed policy: calls fn(*args, params)."""

    def __init__(self, module, params):
        self.m, self.p = module, params

    def __getattr__(self, name):
        return lambda *a: getattr(self.m, name)(*a, self.p)


class Fixed:
    """A policy object whose priority is a given function (no params)."""

    def __init__(self, fn):
        self.priority = fn


def reference_pack(items, capacity, rule):
    """Plain-Python online packing: ``rule`` = "first" or "best" over a list of open bins (no numpy, no policy)."""
    bins: list[int] = []
    for size in items:
        size = int(size)
        fits = [i for i, r in enumerate(bins) if r >= size]
        if not fits:
            bins.append(capacity - size)
        elif rule == "first":
            bins[fits[0]] -= size
        else:
            bins[min(fits, key=lambda i: (bins[i], i))] -= size
    return len(bins)


def small(kind, seed, n):
    inst = bp.make_kind_instance(kind, seed)
    inst["items"] = inst["items"][:n]
    inst["lower_bound"] = bp.lower_bound(inst["items"], inst["capacity"])
    return inst


def test_generators_match_the_spec():
    w = weibull.make_instance(2)
    assert w["capacity"] == 100 and len(w["items"]) == 5000 and w["items"].dtype == np.int64
    assert w["items"].min() >= 1 and w["items"].max() <= 100
    assert 38 < w["items"].mean() < 43  # 45 * Gamma(1 + 1/3) = 40.2
    rng = np.random.default_rng(2)
    assert np.array_equal(w["items"], np.clip(np.round(45 * rng.weibull(3.0, 5000)), 1, 100).astype(np.int64))
    o = or_style.make_instance(5)
    assert o["capacity"] == 150 and len(o["items"]) == 500
    assert o["items"].min() >= 20 and o["items"].max() <= 100
    assert np.array_equal(o["items"], np.random.default_rng(5).integers(20, 101, 500))
    assert np.array_equal(weibull.make_instance(2)["items"], w["items"])  # deterministic
    assert not np.array_equal(weibull.make_instance(3)["items"], w["items"])


def test_module_constants_follow_the_contract():
    for ev, n in ((weibull, 5000), (or_style, 500)):
        assert ev.COST_UNIT == "items" and ev.MAX_COST == n
        assert set(ev.FUNCTIONS) == {"priority"} and ev.FUNCTIONS["priority"].startswith("priority(item, bins, params)")
        assert "excess" in ev.DESCRIPTION
    assert set(policy.PARAMETERS) and all(v["low"] <= v["default"] <= v["high"] for v in policy.PARAMETERS.values())


def test_l1_lower_bound():
    assert bp.lower_bound(np.array([50, 50]), 100) == 1
    assert bp.lower_bound(np.array([50, 51]), 100) == 2
    assert bp.lower_bound(np.array([1]), 150) == 1
    w = weibull.make_instance(2)
    assert w["lower_bound"] == -(-int(w["items"].sum()) // 100)


@pytest.mark.parametrize("kind,seed", [("weibull", 0), ("weibull", 5), ("or", 1), ("or", 8)])
def test_start_policy_is_best_fit_and_references_agree(kind, seed):
    inst = small(kind, seed, 600)
    cap = inst["capacity"]
    best = reference_pack(inst["items"], cap, "best")
    start = bp.evaluate(inst, LocalPolicy(policy, DEFAULTS))
    assert start["diagnostics"]["bins_used"] == best
    assert bp.evaluate(inst, Fixed(bp.best_fit))["diagnostics"]["bins_used"] == best
    assert bp.evaluate(inst, Fixed(bp.first_fit))["diagnostics"]["bins_used"] == reference_pack(inst["items"], cap,
                                                                                                 "first")
    assert start["diagnostics"]["new_bin_choices"] == 0
    assert start["cost"] == len(inst["items"]) and "failure" not in start
    lb = inst["lower_bound"]
    assert start["score"] == pytest.approx(-100 * (best - lb) / lb)


def test_full_instance_reference_numbers_are_sane():
    inst = weibull.make_instance(2)
    ff = bp.excess_pct(inst, bp.first_fit)
    bf = bp.excess_pct(inst, bp.best_fit)
    assert 2.0 < bf < ff < 8.0  # FunSearch's Weibull 5k: best fit 3.98 %, first fit 4.23 %
    res = weibull.evaluate(inst, Fixed(bp.best_fit))
    d = res["diagnostics"]
    assert d["bins_used"] >= d["lower_bound"] and 0.9 < d["mean_fill"] <= 1.0
    assert d["excess_pct"] == pytest.approx(bf) and res["score"] == pytest.approx(-bf)


def test_new_bin_every_time_is_labelled_wasteful():
    inst = small("or", 4, 200)
    res = or_style.evaluate(inst, Fixed(lambda item, bins: np.arange(len(bins), dtype=float)))  # last = new bin
    assert res["diagnostics"]["bins_used"] == 200 and res["failure"] == "wasteful packing" and res["text"]


@pytest.mark.parametrize("bad", [
    lambda item, bins: np.zeros(len(bins) + 1),            # wrong shape
    lambda item, bins: np.float64(1.0),                    # a scalar
    lambda item, bins: np.full(len(bins), np.nan),         # NaN
    lambda item, bins: np.where(bins > item, np.inf, 0.0),  # inf
    lambda item, bins: np.array(["a"] * len(bins)),        # not numeric
    lambda item, bins: np.ones(len(bins), dtype=bool),     # bool
    lambda item, bins: [[1.0], [2.0, 3.0]],                # ragged
])
def test_bad_priorities_raise_candidate_error(bad):
    with pytest.raises(weibull.CandidateError):
        weibull.evaluate(small("weibull", 0, 50), Fixed(bad))


def test_lists_and_integer_scores_are_accepted():
    inst = small("or", 2, 100)
    res = or_style.evaluate(inst, Fixed(lambda item, bins: [-int(b - item) for b in bins]))
    assert res["diagnostics"]["bins_used"] == reference_pack(inst["items"], inst["capacity"], "best")
