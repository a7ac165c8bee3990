"""Refiner kinds as plug-ins ([[refiners]] tables), candidate kinds and artifacts, training jobs' failure path."""

from __future__ import annotations

import pytest

from ratchet.errors import PolicyError, SpecError
from ratchet.execution.sandbox import Sandbox
from ratchet.execution.training import TrainingJob, run_training
from ratchet.policy import Candidate
from ratchet.refiners.registry import arm_names
from ratchet.spec import spec_from_dict
from ratchet.task import GymTask

DIGEST = "ab" * 32


def test_program_candidate_ids_are_unchanged_and_kinds_change_them():
    plain = Candidate.create("src", {"a": 1.0})
    assert "kind" not in plain.to_dict()  # older ledgers read back, same ids
    mlp = Candidate.create("", {}, kind="mlp", artifacts={"weights": DIGEST})
    other = Candidate.create("", {}, kind="mlp", artifacts={"weights": "cd" * 32})
    assert len({plain.id, mlp.id, other.id}) == 3
    assert Candidate.from_dict(mlp.to_dict()) == mlp and Candidate.from_dict(mlp.to_dict()).artifacts == mlp.artifacts
    assert mlp.policy_key != other.policy_key
    with pytest.raises(PolicyError, match="SHA-256"):
        Candidate.create("", {}, kind="mlp", artifacts={"weights": "nothex"})
    with pytest.raises(PolicyError, match="unknown policy kind"):
        Candidate.create("", {}, kind="tree")


def test_refiner_tables_validate_and_name_arms():
    spec = spec_from_dict({"task": {"env_id": "CartPole-v1"},
                           "refiners": [{"kind": "cmaes", "sigma0": 0.1}, {"kind": "cmaes", "sigma0": 0.5}]})
    entries = spec.refiner_entries()
    assert [e["sigma0"] for e in entries] == [0.1, 0.5]
    assert arm_names(entries) == ["cmaes-1", "cmaes-2"]
    default = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "refiner": {"sigma0": 0.3}}).refiner_entries()
    assert default[0]["kind"] == "cmaes" and default[0]["sigma0"] == 0.3
    for bad, match in [([{"kind": "nope"}], "unknown refiner kind 'nope'"),
                       ([{"sigma0": 0.1}], "needs kind"),
                       ([{"kind": "cmaes", "sigma0": 5}], "sigma0"),
                       ([{"kind": "cmaes", "bogus": 1}], "bogus"),
                       ([{"kind": "cmaes", "name": "a"}, {"kind": "cmaes", "name": "a"}], "distinct")]:
        with pytest.raises(SpecError, match=match):
            spec_from_dict({"task": {"env_id": "CartPole-v1"}, "refiners": bad})


def test_a_refiner_must_fit_the_policy_kind():
    with pytest.raises(SpecError, match="cannot refine a 'mlp' policy"):
        spec_from_dict({"task": {"env_id": "CartPole-v1"}, "policy": {"kind": "mlp"},
                        "refiners": [{"kind": "cmaes"}]})


def test_two_cmaes_tables_share_a_run(tmp_path):
    from ratchet import start_run

    (tmp_path / "policy.py").write_text(
        'PARAMETERS = {"k": {"default": 0.0, "low": -1.0, "high": 1.0}}\n'
        "def act(o, p):\n    return int(o[2] + p['k'] * o[3] > 0)\n")
    spec = spec_from_dict({"task": {"env_id": "CartPole-v1"}, "budget": {"episodes": 120},
                           "gate": {"validation_episodes": 8}, "test": {"episodes": 4},
                           "refiner": {"train_episodes": 2},
                           "refiners": [{"kind": "cmaes", "name": "narrow", "sigma0": 0.05, "popsize": 4},
                                        {"kind": "cmaes", "name": "wide", "sigma0": 0.8, "popsize": 4}],
                           "execution": {"workers": 1}}, tmp_path)
    from ratchet.loop import open_ledger

    res = start_run(spec, tmp_path / "runs", "two")
    ledger = open_ledger(res.run_dir, readonly=True)
    plans = [e.payload["arm"] for e in ledger.read() if e.type.value == "generation_planned"]
    ledger.close()
    assert plans[:2] == ["narrow", "wide"]  # untried arms first, then Thompson sampling


def test_a_failing_training_job_is_a_recorded_outcome_not_an_exception():
    parent = Candidate.create("", {}, kind="mlp", artifacts={"weights": DIGEST})
    job = TrainingJob("no-such-trainer", parent, {}, (1, 2), 100, {DIGEST: b"x"})
    res = run_training(Sandbox(), GymTask("CartPole-v1"), job, timeout_s=60)
    assert res.outputs == () and res.error and "no-such-trainer" in res.error
    assert res.env_steps == 100  # the allowance is charged, whatever the trainer says
