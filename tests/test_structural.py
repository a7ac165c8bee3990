"""Structural refiners: source checks, mutation operators, the LLM editor against a stand-in
chat-completions server (a real HTTP server on 127.0.0.1 with scripted answers), structural runs end
to end, and resume reading recorded LLM responses without calling the server again."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import DATA, GOOD_EDIT, RecordingExecutor, SimulatedKill, base_spec_dict, events_of, read_events

from ratchet.critic import Evaluation
from ratchet.errors import PolicyError
from ratchet.ledger import EventType, SQLiteLedger
from ratchet.loop import LEDGER_FILE, resume_run, start_run
from ratchet.planner import SeedSplits
from ratchet.policy import Candidate, load_policy, parse_policy, uses_task_dims
from ratchet.refiners.cmaes import CMAESRefiner
from ratchet.refiners.llm import (
    EditError,
    LLMRefiner,
    LLMSettings,
    apply_edits,
    build_prompt,
    chat_completions_url,
    parse_answer,
)
from ratchet.refiners.mutate import OPERATORS, MutateSettings, MutationRefiner, _Space, mutate_source
from ratchet.refiners.structural import baked_source, check_source, param_variants
from ratchet.rollout import Episode
from ratchet.spec import spec_from_dict

POLICY = (DATA / "cartpole_linear.py").read_text(encoding="utf-8")
SECRET = "sk-test-DO-NOT-LEAK-4242"

MALFORMED = "I would push right more often.\n<<<<<<< SEARCH\n    return 1 if z > 0 else 0\n"
BREAKS_CONTRACT = """<<<<<<< SEARCH
    return 1 if z > 0 else 0
=======
    return 1 if z > params["missing"] else 0
>>>>>>> REPLACE
"""
WHOLE_FILE = """Rewritten:
```python
PARAMETERS = {"gain": {"default": 1.0, "low": 0.0, "high": 3.0}}


def act(observation, params):
    return 1 if observation[2] + params["gain"] * observation[3] > 0 else 0
```
"""


def cartpole_space() -> _Space:
    env = gym.make("CartPole-v1")
    try:
        return _Space(env.observation_space, env.action_space)
    finally:
        env.close()


TASK_FACTS = {"env_id": "CartPole-v1", "observation_space": "Box(4,)", "action_space": "Discrete(2)",
              "success_threshold": 475.0, "step_limit": 500}


def evaluation(cid: str, mean: float) -> Evaluation:
    return Evaluation(cid, "train", tuple(Episode(s, mean, 10, True, False, None) for s in range(2)))


# -- checks ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, reason", [
    ("PARAMETERS = {}\ndef act(o, p)\n    return 0\n", "syntax error"),
    ("PARAMETERS = {}\ndef policy(o, p):\n    return 0\n", "no top-level function act"),
    ("PARAMETERS = {}\ndef act(o, params):\n    return 1 if o[0] > params['x'] else 0\n",
     "params['x'] is not declared"),
    ("PARAMETERS = {}\ndef act(o, p):\n    return helper(o)\n", "name 'helper' is not defined"),
    ("import os\nPARAMETERS = {}\ndef act(o, p):\n    return 0\n", "import of 'os'"),
    ("PARAMETERS = {}\nprint('hi')\ndef act(o, p):\n    return 0\n", "top-level Expr statement"),
    ("PARAMETERS = {}\ndef act(o, p):\n    x = 1\n", "never returns an action"),
    ("PARAMETERS = {}\ndef act(o, p):\n    return eval('0')\n", "call to eval()"),
    ("PARAMETERS = {}\ndef act(o, p):\n    return ().__class__\n", "attribute '__class__'"),
    # a local read where no path has assigned it yet (a deleted line, an assignment moved below): UnboundLocalError
    ("PARAMETERS = {}\ndef act(o, p):\n    z = z + o[0]\n    return 1 if z > 0 else 0\n",
     "act() reads 'z' before any assignment of it"),
    ("PARAMETERS = {}\ndef act(o, p):\n    if o[0] > 0:\n        return 1\n    z += o[1]\n    return 0\n",
     "act() reads 'z' before any assignment"),
    ("PARAMETERS = {}\ndef act(o, p):\n    while t < 3:\n        t = t + o[0]\n    return 0\n",
     "act() reads 't' before any assignment"),
    # a name only another function's own variable has: NameError
    ("PARAMETERS = {}\ndef helper(o):\n    gap = o[0]\n    return gap\ndef act(o, p):\n    return 1 if gap > 0 else 0\n",
     "act() reads 'gap', which the module never assigns"),
])
def test_check_source_rejects_with_a_reason(source, reason):
    with pytest.raises(PolicyError, match=re.escape(reason)):
        check_source(source)


def test_check_source_accepts_valid_policies():
    for path in ("cartpole_linear.py",):
        assert check_source(POLICY).parameters == load_policy(DATA / path).parameters
    from ratchet.spec import load_spec
    from ratchet.tasks import task_from_spec

    for example in Path(__file__).parent.parent.glob("examples/*/policy.py"):
        source = example.read_text(encoding="utf-8")
        specs = sorted(example.parent.glob("*.toml"))
        task = task_from_spec(load_spec(specs[0]).task) if specs else None
        if uses_task_dims(source):  # shapes relative to the task need its dims
            continue
        try:
            check_source(source, functions=task.functions if task is not None else None)
        except PolicyError as exc:  # a starting program may import more than a machine-written proposal may
            # (circle packing's SLSQP: scipy); then no spec of the example lets a code-editing refiner rewrite it
            assert "import of" in str(exc), (example, exc)
            refiners = [r["kind"] for spec in specs for r in load_spec(spec).refiners]
            assert not {"mutate", "llm"} & set(refiners), (example, refiners)


#: Valid programs the assigned-before-read checks must accept: a name assigned on some path, in an earlier loop
#: iteration, in a try, by a walrus, as a module global from reset, in an enclosing function, a comprehension's own.
VALID_FLOWS = [
    "def act(o, p):\n    if o[0] > 0:\n        y = 1\n    else:\n        y = 0\n    return y\n",
    "def act(o, p):\n    if o[0] > 0:\n        y = 1\n    return y if o[0] > 0 else 0\n",
    "def act(o, p):\n    for i in range(3):\n        if i:\n            y = prev\n        prev = i\n    return 0\n",
    "def act(o, p):\n    while True:\n        if o[0] > 0:\n            return z\n        z = 1\n",
    "def act(o, p):\n    try:\n        y = o[0]\n    except IndexError:\n        return 0\n    return 1 if y > 0 else 0\n",
    "def act(o, p):\n    if (y := o[0]) > 0:\n        return 1 if y else 0\n    return 0\n",
    "STATE = None\ndef reset(p, seed):\n    global TABLE\n    TABLE = [seed]\ndef act(o, p):\n    return TABLE[0] % 2\n",
    "def act(o, p):\n    k = 2\n    def inner(x):\n        return x * k\n    return 1 if inner(o[0]) > 0 else 0\n",
    "def act(o, p):\n    xs = [x for x in o]\n    g = (y for y in xs if y > w)\n    w = 0\n    return len(list(g)) % 2\n",
    "def act(o, p):\n    with open_ctx() as f:\n        v = f\n    return v\ndef open_ctx():\n    return None\n",
    "def act(o, p):\n    return 0\n    print(z)\n    z = 1\n",
]


@pytest.mark.parametrize("body", VALID_FLOWS)
def test_the_assigned_before_read_checks_accept_valid_flows(body):
    check_source("PARAMETERS = {}\n" + body)


def test_mutants_that_read_a_variable_before_assigning_it_are_recorded_rejections_not_episodes():
    # deleting a line of the bin-packing example's priority(), such as its first "score = -gap", leaves programs
    # that pass the undefined-name check and then crash on every instance: refused before any episode, recorded
    import types

    source = (Path(__file__).parent.parent / "examples" / "bin_packing" / "policy.py").read_text(encoding="utf-8")
    parent = Candidate.create(source, {})
    r = MutationRefiner(_Space(None, None), MutateSettings(programs=4, variants=1, operators=["delete"]),
                        functions={"priority": 3})
    proposed, rejected = [], []
    for k in range(12):
        proposed += r.propose(parent, None, np.random.default_rng(k))
        rejected += r.take_rejections()
    assert any("before any assignment" in x.reason for x in rejected), [x.reason for x in rejected]
    for c in proposed:
        module = types.ModuleType("mutant")
        exec(compile(c.source, "<mutant>", "exec"), module.__dict__)  # noqa: S102 - a test's own mutants
        module.priority(30.0, np.array([100.0, 120.0, 150.0]), c.params)  # no UnboundLocalError, no NameError


ONE_BRANCH_EACH = """PARAMETERS = {"k": {"default": 0.5, "low": 0.0, "high": 1.0}}


def act(observation, params):
    observation = observation * params["k"]
    if observation[2] > 0:
        push = 1
    elif observation[3] > 0:
        push = 1
    else:
        push = 0
    return push
"""


# new-user trial: `delete` took one branch's assignment away ("if c: pass / else: push = 0; return push"); the checks
# do not refuse a name some path assigns, so the mutant ran and raised UnboundLocalError whenever the branch was taken
def test_delete_never_leaves_a_name_assigned_in_one_branch_only():
    import ast
    import types

    ran = 0
    for seed in range(16):
        result = mutate_source(ONE_BRANCH_EACH, "delete", np.random.default_rng(seed), cartpole_space())
        assert result is not None
        try:
            check_source(result[0])
        except PolicyError as exc:  # the whole if deleted: push is never assigned, refused
            assert "name 'push' is not defined" in str(exc)
            continue
        module = types.ModuleType("mutant")
        exec(compile(result[0], "<mutant>", "exec"), module.__dict__)  # noqa: S102 - a test's own mutants
        for obs in ([0, 0, 1, 0], [0, 0, -1, 1], [0, 0, -1, -1]):  # every branch: no UnboundLocalError
            module.act(np.array(obs, float), {"k": 0.5})
        ran += 1
    assert ran  # deleting the first line is a mutant that runs
    from ratchet.proposals import one_branch_reads

    bad = ONE_BRANCH_EACH.replace("    else:\n        push = 0\n", "")
    assert one_branch_reads(ast.parse(bad)) == {("act", "push")} and not one_branch_reads(ast.parse(ONE_BRANCH_EACH))
    check_source(bad)  # not refused: valid code may read it only where the same condition held


def test_param_variants_start_at_defaults_and_stay_in_bounds():
    prog = parse_policy('PARAMETERS = {"a": (0.5, 0.0, 1.0), "b": (0.0, -1.0, 1.0)}\ndef act(o, p):\n    return 0\n')
    vs = param_variants(prog, np.random.default_rng(0), 4, fresh=["b"])
    assert vs[0] == {"a": 0.5, "b": 0.0} and len(vs) == 4
    assert all(0 <= v["a"] <= 1 and -1 <= v["b"] <= 1 for v in vs)
    assert param_variants(prog, np.random.default_rng(0), 4, fresh=["b"]) == vs


def test_param_variants_vary_ints_and_choices_in_their_types():
    prog = load_policy(DATA / "cartpole_typed.py")
    vs = param_variants(prog, np.random.default_rng(0), 30, fresh=["rule"], sigma=0.3)
    assert vs[0] == prog.defaults and len(vs) > 10
    assert all(type(v["horizon"]) is int and 0 <= v["horizon"] <= 6 for v in vs)
    assert {v["rule"] for v in vs} == {"angle", "both", "velocity"}  # a fresh choice is drawn across all of them
    assert len({v["horizon"] for v in vs}) > 2  # perturbed around its value, rounded
    baked = baked_source(Candidate.create(prog.source, vs[1]))
    assert f'"default": {vs[1]["horizon"]}, "low": 0' in baked and f'"default": "{vs[1]["rule"]}"}}' in baked
    assert check_source(baked).defaults == vs[1]


def test_baked_source_takes_values_off_their_bounds_by_rounding_only():
    # regression: exp(log(high)) is 100.00000000000013; writing it back as a default failed its bounds check
    src = 'PARAMETERS = {"g": {"default": 1.0, "low": 0.01, "high": 100.0, "scale": "log"}}\n' \
          'def act(o, p):\n    return 0\n'
    top = parse_policy(src).parameters[0].from_unit(1.0)
    assert top > 100.0
    baked = baked_source(Candidate.create(src, {"g": top}))
    assert check_source(baked).defaults == {"g": 100.0}
    with pytest.raises(PolicyError, match="outside its bounds"):
        baked_source(Candidate.create(src, {"g": 100.1}))


# -- mutation operators ----------------------------------------------------------------------------------

@pytest.mark.parametrize("operator", OPERATORS)
def test_each_operator_gives_a_checked_program_deterministically(operator):
    space = cartpole_space()
    other = (Path(__file__).parent.parent / "examples/cartpole/policy.py").read_text(encoding="utf-8")
    ok = 0
    for seed in range(8):
        a = mutate_source(POLICY, operator, np.random.default_rng(seed), space, archive=[other])
        b = mutate_source(POLICY, operator, np.random.default_rng(seed), space, archive=[other])
        assert a == b and a is not None
        new, fresh = a
        assert new != POLICY
        try:
            prog = check_source(new)
        except PolicyError as exc:  # deleting the only assignment of z leaves z undefined: a rejection
            assert operator == "delete" and "not defined" in str(exc)
            continue
        ok += 1
        assert set(fresh) <= {p.name for p in prog.parameters}
    assert ok or operator == "delete"


def test_operators_do_what_they_say():
    space, rng = cartpole_space(), np.random.default_rng
    new, _ = mutate_source(POLICY, "constant", rng(0), space)
    assert 'params["k_1"]' in new and '"k_1": {"default": 0.0, "low": -1.0, "high": 1.0}' in new
    new, fresh = mutate_source(POLICY, "term", rng(0), space)
    assert fresh == ["w_1"] and '+ params["w_1"] * observation[' in new
    new, fresh = mutate_source(POLICY, "guard", rng(0), space)
    assert fresh == ["g_1"] and "if observation[" in new and 'params["g_1"]:\n        return ' in new
    new, _ = mutate_source(POLICY, "swap", rng(0), space)
    assert "z < 0" in new
    assert mutate_source(POLICY, "crossover", rng(0), space, archive=[]) is None  # nothing to cross with


def test_the_critique_guides_which_feature_a_mutation_uses():
    from ratchet.critic import Critique, FailureMode
    from ratchet.refiners.mutate import feature_focus

    names = ["cart_position", "cart_velocity", "pole_angle", "pole_angular_velocity"]
    crit = Critique("x", "train", {"mean": 9.0}, failure_modes=[
        FailureMode("cluster 1", 6, 0.6, 9.0, (1, 2), "pole_angle high (+1.8σ), cart_velocity low (−1.2σ)")])
    focus, direction = feature_focus(crit, names)
    assert focus.tolist() == [0.125, 0.375, 0.375, 0.125] and direction == {1: False, 2: True}
    assert feature_focus(None, names) == (None, {})
    space = cartpole_space()
    space.focus, space.direction = focus, direction
    guards = [mutate_source(POLICY, "guard", np.random.default_rng(k), space)[0] for k in range(40)]
    assert sum("observation[2] > " in g or "observation[1] < " in g for g in guards) > 20
    assert not any("observation[2] < " in g or "observation[1] > " in g for g in guards)


def mountain_car_space() -> _Space:
    env = gym.make("MountainCar-v0")
    try:
        return _Space(env.observation_space, env.action_space)
    finally:
        env.close()


POSITION_ONLY = (Path(__file__).parent.parent / "examples/mountain_car_structure/policy.py").read_text(encoding="utf-8")


def test_mutations_favour_the_observation_elements_a_program_never_reads():
    import ast

    from ratchet.refiners.mutate import unread_elements

    assert unread_elements(ast.parse(POSITION_ONLY), 2) == [1]
    assert unread_elements(ast.parse(POLICY), 4) == []  # reads all four
    whole = "PARAMETERS = {}\n\n\ndef act(obs, params):\n    return int(sum(obs) > 0) + int(obs[-1] > 0)\n"
    assert unread_elements(ast.parse(whole), 2) == []  # the observation used whole: every element may be read
    last = "PARAMETERS = {}\n\n\ndef act(obs, params):\n    return 2 if obs[-1] > 0 else 0\n"
    assert unread_elements(ast.parse(last), 2) == [0]
    space = mountain_car_space()
    guards = [mutate_source(POSITION_ONLY, "guard", np.random.default_rng(k), space)[0] for k in range(60)]
    terms = [mutate_source(POSITION_ONLY, "term", np.random.default_rng(k), space)[0] for k in range(60)]
    # 3/4 of the draws on the velocity (half uniform over both elements, half on the unread one)
    assert 35 <= sum("if observation[1] " in g for g in guards) <= 55
    assert 35 <= sum('* observation[1])' in t for t in terms) <= 55


def test_a_guard_threshold_is_drawn_where_the_element_lives():
    space = mountain_car_space()
    assert space.threshold_bounds(1, 3.0) == pytest.approx((-0.07, 0.07))  # nothing seen: the space's bounds
    finals = [[-0.7, -0.0059], [-0.3, 0.0063], [-0.5, 0.001]]
    space.see([Evaluation("inc", "train", tuple(Episode(s, -200.0, 200, False, True, None, None,
                                                        {"final_observation": f}) for s, f in enumerate(finals)))])
    assert space.threshold_bounds(1, 3.0) == (-0.012, 0.013)  # the seen range widened by half its width, rounded
    assert space.threshold_bounds(0, 3.0) == (-0.9, -0.1)
    assert space.weight_bound(1, 1.0) == 160.0  # 1 / 0.0061: a weight that can make the velocity matter
    new, fresh = mutate_source(POSITION_ONLY, "term", np.random.default_rng(0), space)
    assert '"w_1": {"default": 0.0, "low": -' in new and fresh == ["w_1"]
    new, fresh = mutate_source(POSITION_ONLY, "guard", np.random.default_rng(0), space)
    prog = check_source(new)
    (g,) = [p for p in prog.parameters if p.name in fresh]
    assert (g.low, g.high) in [(-0.012, 0.013), (-0.9, -0.1)]
    # an unbounded element: the seen range, not ±feature_bound
    cart = cartpole_space()
    assert cart.threshold_bounds(1, 3.0) == (-3.0, 3.0)
    assert cart.weight_bound(1, 1.0) == 1.0
    cart.see([Evaluation("inc", "train", (Episode(0, 500.0, 500, False, True, None, None,
                                                  {"final_observation": [0.1, 1.5, 0.2, -2.0]}),
                                          Episode(1, 500.0, 500, False, True, None, None,
                                                  {"final_observation": [0.1, 0.5, -0.2, 2.0]}),
                                          # where a terminated episode failed is the edge of what it visited
                                          Episode(2, 9.0, 9, True, False, None, None,
                                                  {"final_observation": [2.0, 9.0, 0.2, -2.0]})))])
    assert cart.threshold_bounds(1, 3.0) == (0.0, 2.0)
    assert cart.threshold_bounds(0, 3.0) == pytest.approx((-4.8, 4.8))  # never varied: the space's bounds
    # a term's weight bound is term_bound over the element's scale: a weight can make any element matter
    assert (cart.weight_bound(1, 1.0), cart.weight_bound(2, 1.0), cart.weight_bound(0, 1.0)) == (2.0, 5.0, 1.0)


def test_constant_leaves_a_discrete_action_alone():
    src = POSITION_ONLY.replace('params["switch"]', "-0.5")
    for k in range(10):
        new, _ = mutate_source(src, "constant", np.random.default_rng(k), mountain_car_space())
        assert 'return 2 if observation[0] > params["k_' in new and "else 0" in new
    box = gym.make("MountainCarContinuous-v0")
    try:
        space = _Space(box.observation_space, box.action_space)
    finally:
        box.close()
    levels = src.replace("return 2 if", "return [1.0] if").replace("else 0", "else [-1.0]")
    news = {mutate_source(levels, "constant", np.random.default_rng(k), space)[0] for k in range(20)}
    assert any("[params[" in n for n in news)  # a Box action's level is a number worth tuning


def test_a_rewrite_drawn_again_comes_with_new_numbers():
    space = mountain_car_space()
    parent = load_policy(Path(__file__).parent.parent / "examples/mountain_car_structure/policy.py").candidate()
    r = MutationRefiner(space, MutateSettings(programs=2, variants=3, operators=["swap"], incumbent_share=1.0))
    gens = [r.propose(parent, None, np.random.default_rng(k)) for k in range(4)]
    assert all(gens)  # "swap" has two rewrites here (the comparison, the conditional): drawn again, not exhausted
    props = [c for g in gens for c in g]
    assert len({c.source for c in props}) == 2 and len({c.id for c in props}) == len(props)
    for source in {c.source for c in props}:  # its defaults once (swap changes behaviour at them), then new numbers
        assert sum(c.params == parent.params for c in props if c.source == source) == 1


def test_mutation_refiner_proposes_checked_variants_and_records_rejections():
    space = cartpole_space()
    parent = load_policy(DATA / "cartpole_linear.py").candidate({"w_position": 0.1, "w_velocity": 0.2,
                                                                  "w_angle": 0.3, "w_angular_velocity": 0.4})
    r = MutationRefiner(space, MutateSettings(programs=4, variants=3, operators=["term", "delete", "guard"]))
    props = r.propose(parent, None, np.random.default_rng(1))
    again = MutationRefiner(space, MutateSettings(programs=4, variants=3, operators=["term", "delete", "guard"]))
    assert [c.id for c in again.propose(parent, None, np.random.default_rng(1))] == [c.id for c in props]
    assert 0 < len(props) <= r.population_size
    for c in props:
        prog = check_source(c.source)
        assert c.parent_id == parent.id and c.refiner.startswith("mutate-")
        assert set(c.params) == {p.name for p in prog.parameters}
        assert '"w_angle": {"default": 0.3' in c.source  # the parent's values are the mutant's defaults
    rejected = r.take_rejections()
    assert all(x.reason and x.detail["operator"] == "delete" for x in rejected)
    r.observe([evaluation(c.id, float(i)) for i, c in enumerate(props)])
    assert len(r.archive)  # the parent and its mutants, kept to draw parents from


def test_mutation_refiner_keeps_ints_and_choices_through_its_edits():
    space = cartpole_space()
    prog = load_policy(DATA / "cartpole_typed.py")
    parent = prog.candidate({**prog.defaults, "horizon": 4, "rule": "velocity"})
    r = MutationRefiner(space, MutateSettings(programs=4, variants=3))
    props = r.propose(parent, None, np.random.default_rng(3))
    assert props and [c.id for c in MutationRefiner(space, MutateSettings(programs=4, variants=3)).propose(
        parent, None, np.random.default_rng(3))] == [c.id for c in props]
    for c in props:
        assert type(c.params["horizon"]) is int and c.params["rule"] in ("angle", "both", "velocity")
        assert check_source(c.source).defaults["horizon"] == 4  # the parent's int written back as an int
        assert '"default": "velocity"}' in c.source  # the choice as the file writes it
    assert len({(c.params["horizon"], c.params["rule"]) for c in props}) > 1
    r.observe([evaluation(c.id, float(i)) for i, c in enumerate(props)] + [evaluation(parent.id, 0.0)])
    tuned = MutationRefiner(space, MutateSettings(programs=4, variants=3, tune_share=1.0, incumbent_share=0.0))
    tuned.archive = r.archive
    again = tuned.propose(parent, None, np.random.default_rng(4))  # elites' numbers tuned: ints and choices too
    assert any(c.refiner == "mutate-tune" for c in again)
    assert all(type(c.params["horizon"]) is int for c in again)


def test_cmaes_follows_a_structural_promotion():
    prog = load_policy(DATA / "cartpole_linear.py")
    r = CMAESRefiner(prog, sigma0=0.3, seed=0)
    r.propose(prog.candidate(), None, np.random.default_rng(0))
    new, _ = mutate_source(baked_source(prog.candidate()), "term", np.random.default_rng(0), cartpole_space())
    promoted = Candidate.create(new, check_source(new).defaults, parent_id="x", refiner="mutate-term")
    props = r.propose(promoted, None, np.random.default_rng(0))
    assert r.n_programs == 2 and r.dimension == 5
    assert all(c.source == new and set(c.params) == set(promoted.params) for c in props)


# -- the LLM editor ----------------------------------------------------------------------------------------

def test_edit_blocks_parse_and_apply_with_near_misses():
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    blocks = parse_answer(GOOD_EDIT)
    assert len(blocks) == 2
    new = apply_edits(POLICY, blocks)
    assert '"boost"' in new and 'params["boost"] * observation[3]' in new
    check_source(new)
    # trailing blanks and a lost indentation still find their lines
    near = "<<<<<<< SEARCH\nreturn 1 if z > 0 else 0   \n=======\nreturn 0\n>>>>>>> REPLACE\n"
    assert apply_edits(POLICY, parse_answer(near)).endswith("    return 0\n")
    with pytest.raises(EditError, match="does not match"):
        apply_edits(POLICY, parse_answer(near.replace("z > 0", "y > 0")))
    with pytest.raises(EditError, match="without its"):
        parse_answer(MALFORMED)
    with pytest.raises(EditError, match="no SEARCH/REPLACE block"):
        parse_answer("Try harder.")
    assert parse_answer(WHOLE_FILE).startswith("PARAMETERS")


def test_prompt_holds_task_code_critique_history_and_hints():
    from ratchet.critic import Critic
    from ratchet.refiners.llm import Attempt

    crit = Critic().critique(evaluation("c", 9.0))
    msgs = build_prompt(TASK_FACTS, POLICY, crit, [Attempt("-a\n+b", "not promoted: p = 0.3")], hints="Use the angle.")
    text = msgs[1]["content"]
    for part in ("CartPole-v1", "Discrete(2)", "def act", crit.text.strip()[:30], "not promoted: p = 0.3",
                 "Use the angle."):
        assert part in text
    small = build_prompt(TASK_FACTS, POLICY, crit, [Attempt("x" * 5000, "v")] * 5, max_chars=3000)[1]["content"]
    assert len(small) <= 3000 and "Edits already tried" not in small


def test_llm_refiner_against_the_stand_in_server(standin, monkeypatch):
    monkeypatch.setenv("RATCHET_TEST_KEY", SECRET)
    server = standin([GOOD_EDIT, MALFORMED, BREAKS_CONTRACT, {"status": 429}, WHOLE_FILE,
                      {"delay": 60.0, "content": GOOD_EDIT}, GOOD_EDIT.replace("0.5", "0.25")])
    settings = LLMSettings(base_url=server.url, model="stand-in", api_key_env="RATCHET_TEST_KEY", proposals=5,
                           variants=2, timeout_s=5.0, retries=2, backoff_s=0.0, hints="Mind the angle.",
                           budget_requests=7, incumbent_share=1.0, concurrency=1, on_unusable="skip")
    waits = []
    r = LLMRefiner(settings, TASK_FACTS, sleep=waits.append)
    parent = load_policy(DATA / "cartpole_linear.py").candidate()
    props = r.propose(parent, None, np.random.default_rng(0))
    # good edit, malformed, contract broken, 429 then the whole file, slow (timed out: timeout_s is the whole
    # request's deadline, so no retry fits; an endpoint failure, not a failed proposal)
    assert len(server.requests) == 6
    assert all(q["auth"] == f"Bearer {SECRET}" and q["path"] == "/v1/chat/completions" for q in server.requests)
    assert "Mind the angle." in server.requests[0]["body"]["messages"][1]["content"]
    sources = {c.source for c in props}
    assert len(sources) == 2 and all(check_source(s) for s in sources)
    assert len(props) == 4 and all(c.parent_id == parent.id and c.refiner == "llm" for c in props)
    reasons = [x.reason for x in r.take_rejections()]
    assert len(reasons) == 2
    assert reasons[0].startswith("unusable answer") and "without its" in reasons[0]
    assert reasons[1].startswith("failed checks") and "missing" in reasons[1]
    assert r.spent.requests == 6 and r.spent.tokens == 4 * 120 and r.spent.failed == 1  # requests: HTTP attempts
    # the gate's verdicts and the failures show in the next prompt's history
    r.observe([evaluation(c.id, 20.0 + i) for i, c in enumerate(props)])
    r.verdict(props[0].id, False, "rejected: not significant")
    props2 = r.propose(parent, None, np.random.default_rng(1))
    history = server.requests[-1]["body"]["messages"][1]["content"]
    assert "not promoted: rejected: not significant" in history and "unusable answer" in history
    assert "not sent to the gate" in history
    assert r.spent.requests == 7 and r.idle_reason().startswith("llm budget: 7 of 7 requests")
    assert len(props2) == 2
    # no more requests once the budget is spent
    assert r.propose(parent, None, np.random.default_rng(2)) == [] and len(server.requests) == 7


TYPED = (DATA / "cartpole_typed.py").read_text(encoding="utf-8")


def _typed_edit(old: str, new: str) -> str:
    return f"Change a default.\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n"


def test_the_prompt_names_int_and_categorical_parameters_and_a_bad_value_is_refused(standin):
    horizon = '    "horizon": {"type": "int", "default": 1, "low": 0, "high": 6},'
    rule = '    "rule": {"type": "categorical", "choices": ["angle", "both", "velocity"], "default": "both"},'
    server = standin([_typed_edit(horizon, horizon.replace('"default": 1', '"default": 2.5')),
                      _typed_edit(rule, rule.replace('"default": "both"', '"default": "sideways"')),
                      _typed_edit(horizon, horizon.replace('"default": 1', '"default": 4'))])
    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", proposals=3, variants=2, concurrency=1), TASK_FACTS)
    parent = load_policy(DATA / "cartpole_typed.py").candidate()
    props = r.propose(parent, None, np.random.default_rng(0))
    prompt = server.requests[0]["body"]["messages"][1]["content"]
    assert ('params["horizon"]: int in [0, 6] (a Python int)\n'
            '- params["rule"]: one of \'angle\', \'both\', \'velocity\' (the choice itself)') in prompt
    assert "Parameters that are not floats" not in build_prompt(TASK_FACTS, POLICY, None, [])[1]["content"]
    reasons = [x.reason for x in r.take_rejections()]
    assert len(reasons) == 2
    assert "parameter 'horizon': default of an int parameter must be an integer, got 2.5" in reasons[0]
    assert "parameter 'rule': default 'sideways' is not one of its choices 'angle', 'both', 'velocity'" in reasons[1]
    assert props and all(check_source(c.source).defaults["horizon"] == 4 for c in props)
    assert props[0].params["horizon"] == 4 and type(props[0].params["horizon"]) is int


def test_llm_refiner_edits_elites_of_its_archive(standin):
    server = standin([GOOD_EDIT], default=WHOLE_FILE)
    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", proposals=1, variants=1, incumbent_share=0.0),
                   TASK_FACTS)
    parent = load_policy(DATA / "cartpole_linear.py").candidate()
    (edited,) = r.propose(parent, None, np.random.default_rng(0))  # an empty archive: the incumbent is edited
    assert edited.parent_id == parent.id
    r.observe([evaluation(edited.id, 30.0), evaluation(parent.id, 20.0)])  # the incumbent's evaluation comes last
    assert r.archive.get(edited.id).fitness == 30.0 and r.archive.get(parent.id).fitness == 20.0
    (again,) = r.propose(parent, None, np.random.default_rng(1))
    assert again.parent_id == edited.id and '"boost"' in server.requests[-1]["body"]["messages"][1]["content"]


@pytest.mark.parametrize("url, what", [("https://me:pw-4242@llm.example/v1", "user info"),
                                       ("https://llm.example/v1?key=sk-4242", "'key'"),
                                       ("https://llm.example/v1?api-version=1&access_token=t-4242", "'access_token'")])
def test_a_base_url_holding_a_credential_is_refused_and_never_echoed(url, what):
    from ratchet.errors import SpecError
    from ratchet.refiners.llm import redact_url

    d = base_spec_dict()
    d["refiners"] = [{"kind": "llm", "base_url": url, "model": "m"}]
    with pytest.raises(SpecError) as exc:
        spec_from_dict(d, DATA)
    assert what in str(exc.value) and "api_key_env" in str(exc.value) and "4242" not in str(exc.value)
    with pytest.raises(ValueError) as exc:
        LLMSettings(base_url=url, model="m")
    assert "4242" not in str(exc.value) and "4242" not in redact_url(url)
    assert LLMSettings(base_url="https://llm.example/v1?api-version=2024-06-01", model="m")  # not a credential


def test_api_key_env_missing_stops_before_any_request(standin, monkeypatch):
    from ratchet.errors import RatchetError

    monkeypatch.delenv("RATCHET_TEST_KEY", raising=False)
    server = standin()
    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", api_key_env="RATCHET_TEST_KEY"), TASK_FACTS)
    with pytest.raises(RatchetError, match="RATCHET_TEST_KEY"):
        r.propose(load_policy(DATA / "cartpole_linear.py").candidate(), None, np.random.default_rng(0))
    assert not server.requests
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        LLMSettings(base_url=server.url, model="m", api_key_env="sk-123")


# -- runs end to end -----------------------------------------------------------------------------------------

def structural_spec(directory: Path, refiners: list[dict], policy_file: str = "cartpole_linear.py", **sections):
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / policy_file, directory / "policy.py")
    d = base_spec_dict()
    d.update(refiners=refiners, test={"episodes": 5}, execution={"workers": 2, "episode_timeout_s": 30})
    d["refiner"] = {"train_episodes": 2}
    d["gate"] = {"validation_episodes": 8, "max_share": 0.6}
    for k, v in sections.items():
        d[k] = v
    return spec_from_dict(d, directory)


def test_mutate_run_on_cartpole_improves_through_the_gate(tmp_path, pool, monkeypatch):
    spec = structural_spec(tmp_path / "s", [{"kind": "mutate", "programs": 3, "variants": 3}],
                           budget={"env_steps": 12_000})
    # a proposal that skipped its refiner's checks is caught by the driver's own, before any episode
    broken = Candidate.create(POLICY.replace("return 1 if", "return helper() if"), {}, refiner="mutate-bad")
    propose = MutationRefiner.propose
    monkeypatch.setattr(MutationRefiner, "propose", lambda self, *a: propose(self, *a) + [broken])
    result = start_run(spec, tmp_path / "runs", "mut", executor=pool)
    events = read_events(result.run_dir)
    caught = [e for e in events_of(events, EventType.PROPOSAL_REJECTED)
              if e.payload["detail"].get("candidate_id") == broken.id]
    assert caught and all("name 'helper' is not defined" in e.payload["reason"] for e in caught)
    assert all(broken.id not in e.key for e in events if e.type in (EventType.EPISODES_EVALUATED,
                                                                     EventType.CANDIDATE_PROPOSED))
    proposed = [e.payload["candidate"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)]
    structural = [c for c in proposed if c["source"] is not None]
    assert structural and all(c["refiner"].startswith("mutate-") for c in structural)
    for c in structural:
        check_source(c["source"])
    assert events_of(events, EventType.GATE_DECIDED)
    changed = events_of(events, EventType.INCUMBENT_CHANGED)
    assert changed and all("source_diff" in e.payload for e in changed)
    assert any(e.payload["source_diff"] for e in changed)  # code changed (the last promotion may tune an elite)
    assert result.test.mean > result.baseline_test.mean + 50  # 9.0 -> 99.6 (test seeds, run seed 0; 462.2 before issue 22)
    ledger = SQLiteLedger(result.run_dir / LEDGER_FILE, create=False)
    try:
        for e in events_of(events, EventType.PROPOSAL_REJECTED):
            assert e.payload["reason"] and ledger.get_artifact(e.payload["source"])
    finally:
        ledger.close()
    # the CLI reads a structural run: show, report, and export writes the refined source
    from typer.testing import CliRunner

    from ratchet.cli import app

    runner, out = CliRunner(env={"COLUMNS": "250"}), tmp_path / "refined.py"
    for args in (["show", str(result.run_dir)], ["report", str(result.run_dir), "--no-videos", "--force"],
                 ["export", str(result.run_dir), "-o", str(out)]):
        got = runner.invoke(app, args)
        assert got.exit_code == 0, got.output
        if args[0] == "show":  # the code diff of each structural promotion, and the rejected proposals
            assert "code change, gen" in got.output and "rejected proposals" in got.output
    page = (result.run_dir / "report.html").read_text(encoding="utf-8")
    assert "Code change promoted in generation" in page and "rejected before any episode" in page
    refined = check_source(out.read_text(encoding="utf-8"))
    assert refined.defaults == dict(result.incumbent.params)


def spec_source(spec) -> str:
    return Path(spec.policy_path).read_text(encoding="utf-8")


class KillAtTest(RecordingExecutor):
    """Dies (like kill -9) when the final test evaluation starts: every generation, LLM calls included, is
    in the ledger by then."""

    def __init__(self, inner, test_seeds):
        super().__init__(inner)
        self.test_seeds = set(test_seeds)

    def run(self, task, jobs, on_episode=None, **kw):
        if any(j.seed in self.test_seeds for j in jobs):
            raise SimulatedKill("killed before the test evaluation")
        return super().run(task, jobs, on_episode, **kw)


def test_llm_run_records_exchanges_and_resume_never_calls_again(tmp_path, standin, monkeypatch, pool):
    monkeypatch.setenv("RATCHET_TEST_KEY", SECRET)
    server = standin([GOOD_EDIT, MALFORMED, BREAKS_CONTRACT, WHOLE_FILE], default=WHOLE_FILE)
    llm = {"kind": "llm", "base_url": server.url, "model": "stand-in", "api_key_env": "RATCHET_TEST_KEY",
           "proposals": 2, "variants": 2, "budget_requests": 4, "timeout_s": 60, "retries": 0,
           "concurrency": 1}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    test_seeds = SeedSplits(spec.seed).seeds("test", 0, spec.test.episodes)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "runs", "llm", executor=KillAtTest(pool, test_seeds))
    assert len(server.requests) == 4
    run_dir = tmp_path / "runs" / "llm"
    before = events_of(read_events(run_dir), EventType.LLM_CALL)
    assert len(before) == 4 and all(e.payload["error"] is None and e.payload["prompt_tokens"] == 100
                                    for e in before)
    server.stop()  # nothing may call it now; and without the key a call could not even start
    monkeypatch.delenv("RATCHET_TEST_KEY")
    result = resume_run(run_dir, executor=pool)
    assert result.stop_reason.startswith("llm budget: 4 of 4 requests")
    events = read_events(run_dir)
    assert [e.key for e in events_of(events, EventType.LLM_CALL)] == [e.key for e in before]
    rejected = events_of(events, EventType.PROPOSAL_REJECTED)
    assert sorted(e.payload["reason"].split(":")[0] for e in rejected) == ["failed checks", "unusable answer"]
    assert any(e.payload["candidate"]["refiner"] == "llm" for e in events_of(events, EventType.CANDIDATE_PROPOSED))
    ledger = SQLiteLedger(run_dir / LEDGER_FILE, create=False)
    try:
        request = json.loads(ledger.get_artifact(before[0].payload["request"]))
        answer = json.loads(ledger.get_artifact(before[0].payload["response"]))
        assert request["model"] == "stand-in" and "CartPole-v1" in request["messages"][1]["content"]
        assert answer["choices"][0]["message"]["content"] == GOOD_EDIT
    finally:
        ledger.close()
    # the key is nowhere: not in the ledger (events and artifacts), the report or any other file
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f


def test_docs_structural_snippets_are_valid_refiner_tables():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    pages = "".join((root / "docs/how-to/refiners" / f).read_text(encoding="utf-8") for f in ("mutate.md", "llm.md"))
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", pages, re.DOTALL)
              if 'kind = "mutate"' in b or 'kind = "llm"' in b]
    assert len(blocks) == 4  # mutate, llm, the stand-in's, and an llm pool of models
    example = tomllib.loads((root / "examples" / "cartpole" / "standin.toml").read_text(encoding="utf-8"))
    assert example["refiners"] in [tomllib.loads(b)["refiners"] for b in blocks]  # the recipe's is the example's
    for block in blocks:
        tables = tomllib.loads(block)["refiners"]
        spec = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "policy": {"path": "policy.py"}, "refiners": tables},
                              root / "examples" / "cartpole")
        assert [e["kind"] for e in spec.refiner_entries()] == [t["kind"] for t in tables]


def test_a_proposal_whose_values_leave_its_bounds_is_refused_before_any_episode(tmp_path, pool, monkeypatch):
    """Values are checked for every proposal, not only for new source: a refiner that proposes the run's own
    program with a weight of 5 (bounds [-1, 1]) or an undeclared parameter gets a proposal_rejected event."""
    spec = structural_spec(tmp_path / "s", [{"kind": "mutate", "programs": 1, "variants": 1}],
                           budget={"env_steps": 9000})
    program = load_policy(DATA / "cartpole_linear.py")
    wild = Candidate.create(program.source, {p.name: 5.0 for p in program.parameters}, refiner="mutate-wild")
    stray = Candidate.create(program.source, {"nosuch": 0.0}, refiner="mutate-stray")
    propose = MutationRefiner.propose
    monkeypatch.setattr(MutationRefiner, "propose", lambda self, *a: propose(self, *a) + [wild, stray])
    result = start_run(spec, tmp_path / "runs", "wild", executor=pool)
    events = read_events(result.run_dir)
    reasons = {e.payload["detail"].get("candidate_id"): e.payload["reason"]
               for e in events_of(events, EventType.PROPOSAL_REJECTED)}
    assert "outside its bounds" in reasons[wild.id] and "do not match the source's PARAMETERS" in reasons[stray.id]
    assert not any(wild.id in e.key or stray.id in e.key for e in events
                   if e.type in (EventType.EPISODES_EVALUATED, EventType.CANDIDATE_PROPOSED))


# -- no duplicate evaluated (issue 44, item 1) -----------------------------------------------------------------

def test_normal_forms_ignore_formatting_comments_docstrings_and_defaults():
    from ratchet.proposals import normal_id, python_normal_form, text_normal_form

    reformatted = ('"""A docstring."""\n' + POLICY.replace("def act(observation, params):",
                                                             "def act(observation,params):\n    # a comment\n    ''' Doc. '''")
                   .replace('"default": 0.0, "low": -1.0', '"default": 0.3,   "low": -1.0'))
    assert python_normal_form(reformatted) == python_normal_form(POLICY)
    assert python_normal_form(POLICY.replace("z > 0", "z >= 0")) != python_normal_form(POLICY)
    program = load_policy(DATA / "cartpole_linear.py")
    values = {p.name: 0.25 for p in program.parameters}
    a, b = Candidate.create(POLICY, values), Candidate.create(reformatted, values)
    assert a.id != b.id and normal_id(a) == normal_id(b)
    assert normal_id(Candidate.create(reformatted, {**values, "w_angle": 0.5})) != normal_id(a)  # other values
    # any language: comments and whitespace, not what string literals hold, nor the space between two words
    c = 'int  x = 1; // one\n/* note */ s = "a // b";'
    assert text_normal_form(c, ("//",), (("/*", "*/"),)) == 'int x=1;s="a // b";'
    assert text_normal_form("x = 1  # c\ny = 2") == text_normal_form("x=1\ny=2 # other")


def test_a_sources_normal_form_is_worked_out_once_and_a_newly_registered_one_is_used(monkeypatch):
    """A search that moves only values proposes one source many times: its normal form is parsed once (it cost
    3.8 s of a 35 s lunar_lander run, every worker idle); registering a kind's normal form replaces the remembered
    ones."""
    from ratchet import proposals

    calls = []
    monkeypatch.setitem(proposals.NORMAL_FORMS, "program", lambda s: calls.append(s) or proposals.python_normal_form(s))
    proposals._normal_form.cache_clear()
    program = load_policy(DATA / "cartpole_linear.py")
    ids = {proposals.normal_id(Candidate.create(POLICY, {p.name: v for p in program.parameters}))
           for v in (0.1, 0.2, 0.3)}
    assert len(ids) == 3 and len(calls) == 1
    monkeypatch.setitem(proposals.NORMAL_FORMS, "program", proposals.NORMAL_FORMS["program"])  # restored at teardown
    proposals.register_normal_form("program", lambda s: "one form")
    a, b = (Candidate.create(POLICY.replace("z > 0", z), {}) for z in ("z > 0", "z >= 0"))
    assert proposals.normal_id(a) == proposals.normal_id(b)  # the new form, not the remembered one
    proposals._normal_form.cache_clear()


def test_a_proposal_the_run_already_scored_is_refused_before_any_episode_and_its_refiner_told(
        tmp_path, pool, monkeypatch):
    """The incumbent again (the same candidate) and the incumbent written differently (the same normal form) are
    recorded rejections that cost no episode; the refiner hears why. With reject_duplicates = false both run."""
    program = load_policy(DATA / "cartpole_linear.py")
    reformatted = POLICY.replace("def act(observation, params):", "def act(observation,params):  # same code")
    told: list[dict] = []
    propose = MutationRefiner.propose

    def with_copies(self, parent, *a):
        return propose(self, parent, *a) + [parent, Candidate.create(reformatted, parent.params, parent_id=parent.id,
                                                                     refiner="mutate")]

    monkeypatch.setattr(MutationRefiner, "propose", with_copies)
    monkeypatch.setattr(MutationRefiner, "refused", lambda self, reasons: told.append(dict(reasons)), raising=False)
    spec = structural_spec(tmp_path / "s", [{"kind": "mutate", "programs": 1, "variants": 1}],
                           budget={"env_steps": 6000})
    events = read_events(start_run(spec, tmp_path / "runs", "dup", executor=pool).run_dir)
    rejected = [e.payload for e in events_of(events, EventType.PROPOSAL_REJECTED)
                if e.payload["detail"].get("duplicate_of")]
    assert rejected and all(r["reason"].startswith("duplicate:") and "proposed this already" in r["reason"]
                            for r in rejected)
    assert all(r["kind"] == "duplicate" for r in rejected)  # recorded for counting, not read back from the text
    assert all(e.payload["kind"] == "unusable" for e in events_of(events, EventType.PROPOSAL_REJECTED)
               if not e.payload["detail"].get("duplicate_of"))
    assert any("up to formatting" in r["reason"] for r in rejected)
    refused_ids = {r["detail"]["candidate_id"] for r in rejected}
    assert any(set(t) & refused_ids for t in told) and all(t[i].startswith("duplicate:") for t in told for i in t
                                                            if i in refused_ids)
    proposed = {(e.payload["generation"], e.payload["candidate"]["id"])
                for e in events_of(events, EventType.CANDIDATE_PROPOSED)}
    refused = {(r["generation"], r["detail"]["candidate_id"]) for r in rejected}
    assert not refused & proposed  # never a contender in the generation that proposed it
    assert program.candidate().id not in {c for g, c in proposed if g > 0}
    again = structural_spec(tmp_path / "s2", [{"kind": "mutate", "programs": 1, "variants": 1}],
                            budget={"env_steps": 6000}, planner={"reject_duplicates": False, "train_episodes": 2})
    events = read_events(start_run(again, tmp_path / "runs", "again", executor=pool).run_dir)
    assert not any(e.payload["detail"].get("duplicate_of") for e in events_of(events, EventType.PROPOSAL_REJECTED))


def test_an_llm_that_proposes_an_edit_again_hears_so_and_it_costs_no_episode(tmp_path, standin, pool):
    """The stand-in answers one edit, then the same edit written differently, then the first again: the second and
    third are refused as duplicates before any episode, and the third request's prompt says the second was."""
    bad = "Rewritten:\n```python\nPARAMETERS = {}\n\n\ndef act(observation, params):\n    return 0\n```\n"
    again = bad.replace("    return 0", "    # always left\n    return  0")
    server = standin([bad, again, bad])
    llm = {"kind": "llm", "base_url": server.url, "model": "m", "proposals": 1, "variants": 1, "budget_requests": 3,
           "retries": 0, "concurrency": 1}
    spec = structural_spec(tmp_path / "s", [llm], budget={"env_steps": 20_000})
    events = read_events(start_run(spec, tmp_path / "runs", "llm", executor=pool).run_dir)
    assert len(server.requests) == 3
    dups = [e.payload for e in events_of(events, EventType.PROPOSAL_REJECTED) if e.payload["detail"].get("duplicate_of")]
    assert len(dups) == 2
    assert "up to formatting" in dups[0]["reason"] and "the same candidate as" in dups[1]["reason"]
    proposed = [(e.payload["generation"], e.payload["candidate"]["id"])
                for e in events_of(events, EventType.CANDIDATE_PROPOSED)]
    assert not {(d["generation"], d["detail"]["candidate_id"]) for d in dups} & set(proposed)  # no contender
    assert [g for g, c in proposed if c == dups[1]["detail"]["candidate_id"]] == [1]  # the first time only
    third = server.requests[2]["body"]["messages"][1]["content"]
    assert "refused before any episode ran: duplicate:" in third and "you proposed this already" in third


def test_a_proposal_with_a_fractional_int_or_an_unknown_choice_is_refused_before_any_episode(tmp_path, pool,
                                                                                             monkeypatch):
    spec = structural_spec(tmp_path / "s", [{"kind": "mutate", "programs": 1, "variants": 1}], "cartpole_typed.py",
                           budget={"env_steps": 3000}, task={"env_id": "CartPole-v1", "max_episode_steps": 100})
    program = load_policy(DATA / "cartpole_typed.py")
    fraction = Candidate.create(program.source, {**program.defaults, "horizon": 2.5}, refiner="mutate-fraction")
    sideways = Candidate.create(program.source, {**program.defaults, "rule": "sideways"}, refiner="mutate-sideways")
    propose = MutationRefiner.propose
    monkeypatch.setattr(MutationRefiner, "propose", lambda self, *a: propose(self, *a) + [fraction, sideways])
    events = read_events(start_run(spec, tmp_path / "runs", "typed", executor=pool).run_dir)
    reasons = {e.payload["detail"].get("candidate_id"): e.payload["reason"]
               for e in events_of(events, EventType.PROPOSAL_REJECTED)}
    assert reasons[fraction.id] == "parameter 'horizon' is 2.5, not an integer"
    assert reasons[sideways.id] == "parameter 'rule' is 'sideways', not one of its choices 'angle', 'both', 'velocity'"
    assert not any(fraction.id in e.key or sideways.id in e.key for e in events
                   if e.type in (EventType.EPISODES_EVALUATED, EventType.CANDIDATE_PROPOSED))
    own = {e.payload["candidate"]["id"] for e in events_of(events, EventType.CANDIDATE_PROPOSED)
           if e.payload["candidate"]["source"] is None}  # the run's own program (a mutant may fail on its own)
    played = [ep for e in events_of(events, EventType.EPISODES_EVALUATED) if e.payload["candidate_id"] in own
              for ep in e.payload["episodes"]]
    assert played and not any((ep.get("error") or "").startswith("policy") for ep in played)  # act took its values
