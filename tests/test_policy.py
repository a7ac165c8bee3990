"""ratchet.policy: reading policy files without running them, candidates, export."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from pathlib import Path

import pytest
from conftest import DATA, data_source

from ratchet.errors import PolicyError
from ratchet.policy import Candidate, Parameter, compile_policy, export_source, load_policy, parse_policy

ACT = "\n\ndef act(observation, params):\n    return 0\n"


def policy(params_literal: str, act: str = ACT) -> str:
    return f"PARAMETERS = {params_literal}\n{act}"


def expect_error(source: str, *fragments: str) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(source, "p.py")
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    assert "\n" not in msg
    return msg


# -- happy path ------------------------------------------------------------------------------------

def test_load_policy_reads_defaults_and_bounds():
    prog = load_policy(DATA / "cartpole_linear.py")
    assert [p.name for p in prog.parameters] == ["w_position", "w_velocity", "w_angle", "w_angular_velocity"]
    assert prog.defaults == {"w_position": 0.0, "w_velocity": 0.0, "w_angle": 0.0, "w_angular_velocity": 0.0}
    assert all((p.low, p.high, p.scale) == (-1.0, 1.0, "linear") for p in prog.parameters)
    assert prog.source == data_source("cartpole_linear.py")
    assert prog.path.endswith("cartpole_linear.py")
    assert prog.has_reset is False


def test_log_scale_tuple_form_and_annotated_assignment():
    prog = load_policy(DATA / "policy_log_tuple.py")
    by = {p.name: p for p in prog.parameters}
    assert by["gain"] == Parameter("gain", 0.5, 0.0, 2.0, "linear")
    assert by["rate"] == Parameter("rate", 1e-3, 1e-5, 1e-1, "log")
    assert by["offset"] == Parameter("offset", -0.25, -1.0, 1.0, "linear")
    assert all(isinstance(v, float) for p in prog.parameters for v in (p.default, p.low, p.high))


def test_has_reset_detected():
    assert load_policy(DATA / "policy_raises.py").has_reset is True


def test_empty_parameters_allowed():
    assert parse_policy(policy("{}")).parameters == ()


def test_parsing_never_executes_policy_code():
    # top-level code that would raise (or worse) must not run in the parent process
    prog = load_policy(DATA / "policy_import_error.py")
    assert [p.name for p in prog.parameters] == ["w"]


def test_integer_numbers_accepted_as_floats():
    prog = parse_policy(policy('{"k": {"default": 1, "low": 0, "high": 3}}'))
    assert prog.parameters[0] == Parameter("k", 1.0, 0.0, 3.0)


def test_default_on_bounds_is_inside():
    prog = parse_policy(policy('{"a": {"default": 0.0, "low": 0.0, "high": 1.0}, "b": (1.0, 0.0, 1.0)}'))
    assert prog.defaults == {"a": 0.0, "b": 1.0}


# -- errors ----------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(PolicyError, match="policy file not found"):
        load_policy(tmp_path / "nope.py")


def test_directory_is_not_a_policy_file(tmp_path):
    with pytest.raises(PolicyError, match="not found: .* is a folder; give the .py file"):
        load_policy(tmp_path)
    (tmp_path / "policy.py").write_text("PARAMETERS = {}\ndef act(o, p):\n    return 0\n")
    with pytest.raises(PolicyError, match=r"is a folder; .*\(e\.g\. .*policy\.py\)"):
        load_policy(tmp_path)


def test_syntax_error_names_the_line(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("PARAMETERS = {}\n\ndef act(observation, params)\n    return 0\n")
    with pytest.raises(PolicyError) as info:
        load_policy(f)
    msg = str(info.value)
    assert "syntax error" in msg
    assert re.search(r"broken\.py:3\b", msg), msg


def test_no_act():
    expect_error("PARAMETERS = {}\n\ndef policy(observation, params):\n    return 0\n", "no top-level function act")


def test_act_as_lambda_is_not_a_function():
    expect_error("PARAMETERS = {}\nact = lambda o, p: 0\n", "act")


def test_act_with_one_argument():
    expect_error(policy("{}", "\ndef act(observation):\n    return 0\n"), "act must take two arguments", "p.py:3")


# regression: three required arguments used to pass validation, then every episode failed
def test_act_with_three_required_arguments():
    expect_error(policy("{}", "\ndef act(observation, params, extra):\n    return 0\n"), "act")


@pytest.mark.parametrize("signature", ["observation, params", "observation, params, extra=None", "*args",
                                       "observation, *rest", "obs, params, *, verbose=False"])
def test_act_signatures_callable_with_two_arguments_are_accepted(signature):
    assert parse_policy(policy("{}", f"\ndef act({signature}):\n    return 0\n")).parameters == ()


@pytest.mark.parametrize("signature", ["", "observation, *, params"])
def test_act_signatures_not_callable_with_two_arguments_are_rejected(signature):
    expect_error(policy("{}", f"\ndef act({signature}):\n    return 0\n"), "act must take two arguments")


def test_parameters_missing():
    expect_error(ACT, "no PARAMETERS")


def test_parameters_not_a_literal():
    expect_error(policy("make_params()"), "PARAMETERS must be a literal dict", "p.py:1")
    expect_error("N = 1.0\n" + policy('{"a": {"default": N, "low": 0, "high": 2}}'), "literal")


def test_parameters_not_a_dict():
    expect_error(policy("[1, 2]"), "PARAMETERS must be a dict", "list")


@pytest.mark.parametrize("entry, fragments", [
    ('{"a": {"low": 0.0, "high": 1.0}}', ("'a'", "missing", "default")),
    ('{"a": {"default": 0.5, "high": 1.0}}', ("'a'", "missing", "low")),
    ('{"a": {"default": 0.5, "low": 0.0, "high": 1.0, "step": 0.1}}', ("'a'", "unknown key", "step")),
    # regression (was a bug): a quoted number was reported as "got 0.5", which reads like a valid value
    ('{"a": {"default": "0.5", "low": 0.0, "high": 1.0}}', ("'a'", "default must be a finite number, got '0.5'",
                                                          "without quotes")),
    ('{"a": {"default": True, "low": 0.0, "high": 1.0}}', ("'a'", "default must be a finite number")),
    ('{"a": {"default": 0.5, "low": None, "high": 1.0}}', ("'a'", "low must be a finite number")),
    ('{"a": {"default": 0.5, "low": 0.0, "high": 1e999}}', ("'a'", "high must be a finite number")),
    ('{"a": 0.5}', ("'a'", "must be a dict with default, low, high")),
    ('{"a": (0.5, 0.0)}', ("'a'", "must be a dict")),
    ('{"a": {"default": 0.5, "low": 0.0, "high": 1.0, "scale": "exp"}}', ("'a'", "scale")),
    ('{"not an id": {"default": 0.5, "low": 0.0, "high": 1.0}}', ("must be an identifier",)),
    ('{3: {"default": 0.5, "low": 0.0, "high": 1.0}}', ("must be an identifier",)),
])
def test_malformed_entries(entry, fragments):
    expect_error(policy(entry), "p.py:1", *fragments)


def test_default_outside_bounds():
    expect_error(policy('{"a": {"default": 2.0, "low": 0.0, "high": 1.0}}'), "'a'", "outside its bounds", "[0.0, 1.0]")
    expect_error(policy('{"a": (-0.1, 0.0, 1.0)}'), "outside its bounds")


@pytest.mark.parametrize("low, high", [(1.0, 1.0), (2.0, 1.0)])
def test_low_not_below_high(low, high):
    expect_error(policy(f'{{"a": {{"default": {low}, "low": {low}, "high": {high}}}}}'), "'a'", "must be below high")


@pytest.mark.parametrize("low", [0.0, -1.0])
def test_log_scale_needs_positive_low(low):
    expect_error(policy(f'{{"a": {{"default": 0.5, "low": {low}, "high": 1.0, "scale": "log"}}}}'),
                 "'a'", "log", "low > 0")


# regression: ast.literal_eval's TypeError used to escape as a raw exception
def test_unhashable_key_is_a_policy_error():
    expect_error(policy("{[1]: 2}"), "PARAMETERS")


# regression: math.isfinite on a huge int used to raise OverflowError
def test_huge_integer_literal_is_a_policy_error():
    expect_error(policy('{"a": {"default": 1' + "0" * 400 + ', "low": 0, "high": 1}}'), "'a'")


# regression: the message used to read 'p.py:None: syntax error'
def test_nul_byte_message_has_no_none_line():
    msg = expect_error("PARAMETERS = {}\x00\n" + ACT, "syntax error")
    assert ":None" not in msg


# -- candidates ------------------------------------------------------------------------------------

def test_candidate_id_is_content_derived():
    prog = load_policy(DATA / "cartpole_linear.py")
    a = prog.candidate()
    b = parse_policy(prog.source).candidate(dict(prog.defaults))
    assert a.id == b.id
    assert re.fullmatch(r"[0-9a-f]{12}", a.id)
    # provenance is not part of the identity
    c = prog.candidate(parent_id="abc", refiner="cmaes")
    assert c.id == a.id
    # different values -> different id; int vs float of the same value -> same id
    d = prog.candidate({**prog.defaults, "w_angle": 0.5})
    assert d.id != a.id
    assert prog.candidate({k: 0 for k in prog.defaults}).id == a.id
    # different source -> different id
    e = Candidate.create(prog.source + "\n# comment\n", prog.defaults)
    assert e.id != a.id


def test_candidate_is_frozen_and_params_read_only():
    cand = load_policy(DATA / "cartpole_linear.py").candidate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cand.id = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cand.params["w_angle"] = 1.0  # type: ignore[index]
    assert all(type(v) is float for v in cand.params.values())


def test_candidate_dict_roundtrip_and_corruption_check():
    cand = load_policy(DATA / "cartpole_linear.py").candidate({"w_position": 0.1, "w_velocity": -0.2,
                                                              "w_angle": 0.3, "w_angular_velocity": 1})
    d = cand.to_dict()
    back = Candidate.from_dict(d)
    assert back == cand and back.id == cand.id
    with pytest.raises(PolicyError, match="does not match"):
        Candidate.from_dict({**d, "params": {**d["params"], "w_angle": 0.31}})


# -- parameters: unit mapping ----------------------------------------------------------------------

@pytest.mark.parametrize("param", [Parameter("x", 0.0, -2.0, 6.0), Parameter("r", 1e-3, 1e-5, 1e-1, "log")])
def test_unit_roundtrip(param):
    for v in (param.low, param.high, param.default, (param.low + param.high) / 2):
        u = param.to_unit(v)
        assert 0.0 <= u <= 1.0
        assert math.isclose(param.from_unit(u), v, rel_tol=1e-12, abs_tol=1e-15)
    for u in (0.0, 0.25, 0.5, 1.0):
        assert math.isclose(param.to_unit(param.from_unit(u)), u, abs_tol=1e-12)


def test_log_scale_is_geometric():
    p = Parameter("r", 1e-3, 1e-5, 1e-1, "log")
    assert math.isclose(p.from_unit(0.5), 1e-3, rel_tol=1e-12)  # geometric midpoint of [1e-5, 1e-1]
    assert math.isclose(p.to_unit(1e-3), 0.5)
    lin = Parameter("x", 0.0, -2.0, 6.0)
    assert lin.from_unit(0.5) == 2.0


def test_from_unit_clips():
    p = Parameter("x", 0.0, -1.0, 1.0)
    assert p.from_unit(-3.0) == -1.0
    assert p.from_unit(7.0) == 1.0


# -- export ----------------------------------------------------------------------------------------

def test_export_changes_only_default_literals():
    src = data_source("policy_log_tuple.py")
    new = {"gain": 1.25, "rate": 0.0042, "offset": 0.5}
    out = export_source(src, new)
    diff = [ln for ln in difflib.unified_diff(src.splitlines(), out.splitlines(), lineterm="", n=0)
            if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))]
    assert len(diff) == 6  # three lines out, three lines in
    for old_line, new_line in zip(diff[:3], diff[3:]):
        assert old_line.startswith("-") and new_line.startswith("+")
    assert '"gain": {"default": 1.25, "low": 0.0, "high": 2.0},' in out
    assert '"rate": {"default": 0.0042, "low": 1e-5, "high": 1e-1, "scale": "log"},' in out
    assert '"offset": (0.5, -1, 1),' in out
    reparsed = parse_policy(out)
    assert reparsed.defaults == new
    assert [(p.low, p.high, p.scale) for p in reparsed.parameters] == \
        [(p.low, p.high, p.scale) for p in parse_policy(src).parameters]


def test_export_subset_and_header():
    src = data_source("cartpole_linear.py")
    out = export_source(src, {"w_angle": -0.75}, header="exported\nby a test")
    assert out.startswith("# exported\n# by a test\n")
    assert out.split("\n", 2)[2] == src.replace('"w_angle": {"default": 0.0', '"w_angle": {"default": -0.75')
    assert parse_policy(out).defaults["w_angle"] == -0.75
    assert parse_policy(out).defaults["w_position"] == 0.0


def test_export_roundtrips_float_precision():
    src = data_source("cartpole_linear.py")
    vals = {"w_position": 0.1 + 0.2, "w_velocity": -1 / 3, "w_angle": 2 ** -30, "w_angular_velocity": 0.9999999999999999}
    out = export_source(src, vals)
    assert parse_policy(out).defaults == vals
    # the exported policy is the same candidate, content-wise, as the refined one
    assert compile_policy(out).PARAMETERS["w_velocity"]["default"] == -1 / 3


def test_export_handles_non_ascii_before_the_literal():
    src = 'PARAMETERS = {"ängle": {"default": 0.0, "low": -1.0, "high": 1.0}}  # ° ok\n' + ACT
    out = export_source(src, {"ängle": 0.625})
    assert parse_policy(out).defaults == {"ängle": 0.625}
    assert out.endswith(ACT) and "# ° ok" in out


@pytest.mark.parametrize("odd", ["\x0c", "\u2028", "\x1c", "\x85"])
def test_export_counts_lines_as_python_does(odd):
    """A form feed (an Emacs page break), U+2028 and the like end a line for ``str.splitlines`` but not for Python:
    each edit landed one line early (regression: ``a`` got ``b``'s value, ``b`` kept its own, and a comment above
    them was rewritten, silently)."""
    src = (f'"""y = a*x{odd} + b."""\n\x0c\n# {odd} a comment\nPARAMETERS = {{\n'
           '    # "c": {"default": 0.0, "low": -2.0, "high": 2.0},\n'
           '    "a": {"default": 0.0, "low": -2.0, "high": 2.0},\n'
           '    "b": {"default": 0.5, "low": -2.0, "high": 2.0},\n}\n\n\n'
           'def act(observation, params):\n    return params["a"] * observation + params["b"]\n')
    out = export_source(src, {"a": 1.4952492638929509, "b": -0.35133483863922454})
    assert {p.name: p.default_value for p in parse_policy(out).parameters} == {"a": 1.4952492638929509,
                                                                               "b": -0.35133483863922454}
    assert '# "c": {"default": 0.0, "low": -2.0, "high": 2.0},' in out and odd in out


def test_export_rejects_unknown_parameter_and_out_of_bounds():
    src = data_source("cartpole_linear.py")
    with pytest.raises(PolicyError, match="unknown parameter"):
        export_source(src, {"nope": 1.0})
    with pytest.raises(PolicyError, match="outside its bounds"):
        export_source(src, {"w_angle": 5.0})


def test_compile_policy_runs_the_module():
    mod = compile_policy(data_source("cartpole_linear.py"))
    assert mod.act([0.0, 0.0, 1.0, 0.0], {"w_position": 0, "w_velocity": 0, "w_angle": 1, "w_angular_velocity": 0}) == 1
    with pytest.raises(RuntimeError, match="broken at import"):
        compile_policy(data_source("policy_import_error.py"))


def test_duplicate_parameter_is_named():
    src = 'PARAMETERS = {\n    "k": (1.0, 0.0, 2.0),\n    "k": (5.0, 0.0, 2.0),\n}\ndef act(o, p):\n    return 0\n'
    with pytest.raises(PolicyError, match=r"p.py:3: parameter 'k' is declared twice"):
        parse_policy(src, "p.py")


def test_spec_file_given_as_policy(tmp_path):
    f = tmp_path / "ratchet.toml"
    f.write_text("[task]\nenv_id = 'CartPole-v1'\n")
    with pytest.raises(PolicyError, match="not a policy"):
        load_policy(f)


def test_the_windy_lander_policy_with_its_defaults_is_gymnasiums_heuristic():
    """examples/lunar_lander_windy starts from Gymnasium's own heuristic: with every PARAMETERS default, act() gives
    the heuristic's action exactly, in flight and after a leg touches down, so the run's start is that controller."""
    import gymnasium as gym
    import numpy as np
    from gymnasium.envs.box2d.lunar_lander import heuristic

    prog = load_policy(Path(__file__).resolve().parents[1] / "examples" / "lunar_lander_windy" / "policy.py")
    policy = compile_policy(prog.source)
    env = gym.make("LunarLander-v3", continuous=True, enable_wind=True, wind_power=20.0, turbulence_power=2.0)
    rng = np.random.default_rng(0)
    observations = [rng.uniform(-1.5, 1.5, size=8) for _ in range(200)]
    for o in observations[:100]:  # legs: none, one, the other, both
        o[6], o[7] = float(rng.integers(2)), float(rng.integers(2))
    for o in observations[100:]:
        o[6] = o[7] = 0.0
    for o in observations:
        np.testing.assert_array_equal(policy.act(o, dict(prog.defaults)), heuristic(env, o))


# -- int and categorical parameters ----------------------------------------------------------------

TYPED = policy('{\n'
               '    "depth": {"type": "int", "default": 3, "low": 1, "high": 8},\n'
               '    "width": {"type": "int", "default": 64, "low": 8, "high": 512, "scale": "log"},\n'
               '    "rule": {"type": "categorical", "choices": ["greedy", "sorted", 2, True], "default": "greedy"},\n'
               '    "gain": {"type": "float", "default": 0.5, "low": 0.0, "high": 2.0},\n'
               '}')


def test_int_and_categorical_parameters_are_declared_with_their_types():
    prog = parse_policy(TYPED)
    by = {p.name: p for p in prog.parameters}
    assert by["depth"] == Parameter("depth", 3, 1, 8, "linear", (), "int")
    assert by["width"].scale == "log" and by["width"].type == "int"
    assert by["rule"].choices == ("greedy", "sorted", 2, True) and by["rule"].type == "categorical"
    assert by["gain"] == Parameter("gain", 0.5, 0.0, 2.0)  # "type": "float" is the default, written or not
    assert prog.defaults == {"depth": 3, "width": 64, "rule": "greedy", "gain": 0.5}
    assert [type(v) for v in prog.defaults.values()] == [int, int, str, float]
    assert [p.describe() for p in prog.parameters] == [
        "int in [1, 8]", "int in [8, 512], log scale", "one of 'greedy', 'sorted', 2, True", "float in [0, 2]"]


@pytest.mark.parametrize("entry, fragments", [
    ('{"k": {"type": "int", "default": 2.5, "low": 0, "high": 4}}', ("'k'", "default of an int parameter", "got 2.5")),
    ('{"k": {"type": "int", "default": 2, "low": 0.0, "high": 4}}', ("'k'", "low", "got 0.0; write 0")),
    ('{"k": {"type": "int", "default": True, "low": 0, "high": 4}}', ("'k'", "must be an integer, got True")),
    ('{"k": {"type": "int", "shape": [3], "default": 2, "low": 0, "high": 4}}', ("'k'", "takes no shape")),
    ('{"k": {"type": "int", "default": 2, "low": 0, "high": 4, "scale": "log"}}', ("'k'", "needs low >= 1")),
    ('{"k": {"type": "int", "default": 2, "low": 0, "high": 1152921504606846976}}', ("'k'", "beyond ±2**53")),
    ('{"k": {"type": "int", "default": 5, "low": 0, "high": 4}}', ("'k'", "outside its bounds [0, 4]")),
    ('{"k": {"type": "int", "default": 4, "low": 4, "high": 4}}', ("'k'", "must be below high")),
    ('{"k": {"type": "int", "default": 2, "low": 0}}', ("'k'", "missing ['high']")),
    ('{"k": {"type": "bool", "default": 2, "low": 0, "high": 4}}', ("'k'", "type must be", "got 'bool'")),
    ('{"k": {"default": 2, "low": 0, "high": 4, "choices": [1, 2]}}', ("'k'", "choices belong to a categorical")),
    ('{"c": {"type": "categorical", "default": "a"}}', ("'c'", "missing ['choices']")),
    ('{"c": {"type": "categorical", "choices": ["a", "b"]}}', ("'c'", "missing ['default']")),
    ('{"c": {"type": "categorical", "choices": ["a"], "default": "a"}}', ("'c'", "two or more")),
    ('{"c": {"type": "categorical", "choices": "ab", "default": "a"}}', ("'c'", "must be a list")),
    ('{"c": {"type": "categorical", "choices": ["a", None], "default": "a"}}', ("'c'", "JSON's literals", "None")),
    ('{"c": {"type": "categorical", "choices": ["a", [1]], "default": "a"}}', ("'c'", "JSON's literals", "[1]")),
    ('{"c": {"type": "categorical", "choices": [1, 2.0, True], "default": 1}}', ("'c'", "choices 1 and True are equal")),
    ('{"c": {"type": "categorical", "choices": ["a", "b"], "default": "z"}}', ("'c'", "default 'z' is not one of its choices")),
    ('{"c": {"type": "categorical", "choices": [0, 1], "default": False}}', ("'c'", "default False is not one")),
    ('{"c": {"type": "categorical", "choices": ["a", "b"], "default": "a", "low": 0}}', ("'c'", "not ['low']")),
])
def test_int_and_categorical_errors_name_the_parameter_and_the_fix(entry, fragments):
    expect_error(policy(entry), "p.py:1", *fragments)


def test_every_integer_owns_an_equal_bin_and_maps_back_exactly():
    depth = Parameter("depth", 3, 1, 8, "linear", (), "int")
    us = [i / 800 for i in range(801)]
    counts = {v: sum(depth.from_unit(u) == v for u in us[:-1]) for v in range(1, 9)}
    assert set(counts.values()) == {100}  # 8 integers, each an eighth of [0, 1)
    assert all(type(depth.from_unit(u)) is int for u in us)
    for v in range(1, 9):
        assert depth.to_unit(v) == (v - 1 + 0.5) / 8 and depth.from_unit(depth.to_unit(v)) == v
    assert (depth.from_unit(-5.0), depth.from_unit(9.0)) == (1, 8)
    width = Parameter("width", 64, 8, 512, "log", (), "int")
    assert all(width.from_unit(width.to_unit(v)) == v for v in range(8, 513))
    assert width.from_unit(0.0) == 8 and width.from_unit(1.0) == 512
    assert width.from_unit(0.5) == 62  # the relaxed range's geometric middle: sqrt(7.5 * 512.5) = 62.0


def test_every_choice_owns_an_equal_bin_and_keeps_its_kind():
    rule = parse_policy(TYPED).parameters[2]
    assert [rule.from_unit(u) for u in (0.0, 0.24, 0.26, 0.5, 0.74, 0.76, 1.0)] == \
        ["greedy", "greedy", "sorted", 2, 2, True, True]
    assert [rule.to_unit(c) for c in rule.choices] == [0.125, 0.375, 0.625, 0.875]
    assert rule.to_unit(2.0) == 0.625  # a number matches a number choice
    assert rule.from_unit(0.875) is True and rule.from_unit(0.625) == 2 and rule.from_unit(0.625) is not True
    with pytest.raises(PolicyError, match="'rule': 1 is not one of its choices"):
        rule.to_unit(1)  # 1 == True in Python, but a number is not a bool


def test_candidates_hold_ints_and_choices_in_their_parameters_form():
    prog = parse_policy(TYPED)
    cand = prog.candidate({"depth": 5.0, "width": 100, "rule": 2.0, "gain": 1})
    assert dict(cand.params) == {"depth": 5, "width": 100, "rule": 2, "gain": 1.0}
    assert [type(v) for v in cand.params.values()] == [int, int, int, float]
    back = Candidate.from_dict(json.loads(json.dumps(cand.to_dict())))  # as the ledger keeps it
    assert back == cand and [type(v) for v in back.params.values()] == [int, int, int, float]
    # ids tell the kinds apart: an int, a float, a bool and text of the same value are four candidates
    src = policy('{"c": {"type": "categorical", "choices": [1.5, 2, "2", True], "default": 2}}')
    ids = {parse_policy(src).candidate({"c": c}).id for c in (1.5, 2, "2", True)}
    assert len(ids) == 4
    for bad, why in [({"depth": 2.5}, "'depth': 2.5 is not an integer"), ({"rule": "best"}, "'best' is not one of"),
                     ({"gain": "0.5"}, "'gain': '0.5' is not a number"), ({"depth": True}, "True is not an integer")]:
        with pytest.raises(PolicyError, match=re.escape(why)):
            prog.candidate({**prog.defaults, **bad})


def test_a_value_of_the_wrong_type_is_a_problem_with_a_reason():
    depth, _, rule, gain = parse_policy(TYPED).parameters
    assert [depth.problem(3), rule.problem("sorted"), rule.problem(True), gain.problem(0.5)] == [None] * 4
    assert depth.problem(3.0) == "is 3.0, not an integer"
    assert depth.problem(9) == "is outside its bounds [1, 8]"
    assert rule.problem(1) == "is 1, not one of its choices 'greedy', 'sorted', 2, True"
    assert gain.problem("x") == "is 'x', not a number" and gain.problem(3.0) == "is outside its bounds [0.0, 2.0]"


def test_export_writes_an_int_as_an_int_and_a_choice_as_its_literal():
    out = export_source(TYPED, {"depth": 5, "width": 100.0, "rule": True, "gain": 1})
    diff = [ln for ln in difflib.unified_diff(TYPED.splitlines(), out.splitlines(), lineterm="", n=0)
            if ln.startswith("+") and not ln.startswith("+++")]
    assert diff == ['+    "depth": {"type": "int", "default": 5, "low": 1, "high": 8},',
                    '+    "width": {"type": "int", "default": 100, "low": 8, "high": 512, "scale": "log"},',
                    '+    "rule": {"type": "categorical", "choices": ["greedy", "sorted", 2, True], "default": True},',
                    '+    "gain": {"type": "float", "default": 1.0, "low": 0.0, "high": 2.0},']
    assert parse_policy(out).defaults == {"depth": 5, "width": 100, "rule": True, "gain": 1.0}
    assert '"default": "sorted"}' in export_source(TYPED, {"rule": "sorted"})  # as the choices write it
    with pytest.raises(PolicyError, match="'rule': 'best' is not one of its choices"):
        export_source(TYPED, {"rule": "best"})
    with pytest.raises(PolicyError, match="outside its bounds"):
        export_source(TYPED, {"depth": 9})


def test_show_and_diffs_name_ints_and_choices_as_written():
    from ratchet.policy import describe_value
    from ratchet.proposals import describe_value_changes, value_changes

    assert [describe_value(v) for v in (5, 12345678, "sorted", True, 0.25)] == ["5", "12345678", "'sorted'", "True",
                                                                                 "0.25"]
    changes = value_changes({"depth": 3, "rule": "greedy", "gain": 0.5, "flag": True},
                            {"depth": 12345678, "rule": "sorted", "gain": 0.5, "flag": False})
    assert describe_value_changes(changes) == "depth: 3 → 12345678\nrule: 'greedy' → 'sorted'\nflag: True → False"
    assert value_changes({"rule": 2}, {"rule": "2"}) != []  # a number and text are not the same choice


def test_materialize_gives_act_a_python_int_and_the_choice_itself():
    from ratchet.policy import materialize

    seen = compile_policy(policy('{}', "\ndef act(observation, params):\n"
                                       "    return type(params['depth']).__name__, params['rule']\n"))
    assert seen.act(None, materialize(parse_policy(TYPED).candidate({"depth": 4.0, "rule": "sorted"}).params)) == \
        ("int", "sorted")


def test_the_docs_int_and_categorical_snippet_is_a_valid_policy():
    from ratchet.policy import materialize

    page = (Path(__file__).resolve().parents[1] / "docs/how-to/policies/program.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if '"type": "int"' in b)
    prog = parse_policy(block)
    assert [p.type for p in prog.parameters] == ["int", "int", "categorical", "float"]
    compile_policy(block).act(None, materialize(prog.candidate().params))  # range() takes the int as it comes


def test_a_run_shows_reports_exports_and_replays_ints_and_choices(tmp_path):
    """A start that falls at once (only the angular velocity, with the wrong sign) is refined by CMA-ES; `show`, the
    report and the promotion's diff print the int as an int and the choice as its literal, `export` writes them so
    the file reads back as the incumbent, and `replay` matches the ledger."""
    import html as html_text

    from conftest import make_spec_dir, read_events
    from typer.testing import CliRunner

    from ratchet.cli import app
    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger.projection import project
    from ratchet.loop import start_run
    from ratchet.report.html import render_report
    from ratchet.spec import load_spec

    spec_dir = make_spec_dir(tmp_path / "spec", policy="cartpole_typed.py", budget={"env_steps": 12000},
                             refiner={"popsize": 6, "train_episodes": 2, "sigma0": 0.4},
                             gate={"validation_episodes": 5, "spending": "none"}, test={"episodes": 5},
                             task={"env_id": "CartPole-v1", "max_episode_steps": 200}, execution={"workers": 1})
    start = (spec_dir / "policy.py").read_text(encoding="utf-8")
    start = start.replace('"default": "both"', '"default": "velocity"').replace(
        '"w_angular_velocity": {"default": 0.5', '"w_angular_velocity": {"default": -0.5')
    (spec_dir / "policy.py").write_text(start, encoding="utf-8")
    with ProcessExecutor(workers=1) as ex:
        result = start_run(load_spec(spec_dir), tmp_path / "runs", "typed", executor=ex)
    inc, st = result.incumbent, project(read_events(tmp_path / "runs" / "typed"))
    assert inc.id != st.baseline_id, "nothing was promoted"
    horizon, rule = inc.params["horizon"], inc.params["rule"]
    assert type(horizon) is int and rule in ("angle", "both", "velocity")

    runner = CliRunner()
    shown = runner.invoke(app, ["show", str(tmp_path / "runs" / "typed")])
    assert shown.exit_code == 0 and re.search(rf"horizon {horizon} +│", shown.stdout)  # an int, not {horizon}.0
    assert f"rule '{rule}'" in shown.stdout
    out = tmp_path / "refined.py"
    assert runner.invoke(app, ["export", str(tmp_path / "runs" / "typed"), "-o", str(out)]).exit_code == 0
    exported = out.read_text(encoding="utf-8")
    assert f'"type": "int", "default": {horizon}, "low": 0' in exported and f'"default": "{rule}"}}' in exported
    assert load_policy(out).candidate().params == inc.params
    seed = next(e for e in st.evaluations if e["candidate_id"] == inc.id and e["split"] == "test")["episodes"][0]["seed"]
    replayed = runner.invoke(app, ["replay", str(tmp_path / "runs" / "typed"), "--seed", str(seed)])
    assert replayed.exit_code == 0 and "match" in replayed.stdout, replayed.output
    report = render_report(st)
    table = report[report.index("<h2>Parameter changes"):report.index("<h2>Lineage")]
    assert f"<td>horizon</td><td>1</td><td>{horizon}</td>" in table
    assert f"<td>rule</td><td>{html_text.escape(repr('velocity'))}</td><td>{html_text.escape(repr(rule))}</td>" in table
