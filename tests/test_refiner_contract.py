"""The Refiner contract, run through by every registered kind (a conformance suite, as Optuna ships for its
storages): each kind is a :class:`~ratchet.refiners.base.Refiner`; a run killed mid-way and resumed replays
the same proposals as one that was never interrupted; every generation costs at most what the refiner
declared before it ran (candidates evaluated, training env steps, requests). And a kind registered from
outside ``ratchet.refiners`` runs end to end without touching the loop."""

from __future__ import annotations

import shutil
import sys
from collections import defaultdict
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import DATA, GOOD_EDIT, SimulatedKill, base_spec_dict, read_events
from test_dagger import EXPERT

from ratchet.execution.process import ProcessExecutor
from ratchet.loop import resume_run, start_run
from ratchet.refiners.base import Refiner
from ratchet.refiners.registry import KIND_MODULES, known_kinds, refiner_kind
from ratchet.spec import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
needs_rl = pytest.mark.skipif(find_spec("torch") is None or find_spec("stable_baselines3") is None,
                              reason="needs the rl extra: pip install 'policy-ratchet[rl]'")
PPO = {"env_steps": 512, "checkpoints": 2, "n_steps": 128, "batch_size": 64, "n_epochs": 2, "seeds": 2}


class Dying(ProcessExecutor):
    """A one-worker pool that dies (like kill -9) after ``die_after`` episodes; training jobs run as usual."""

    def __init__(self, die_after: int | None = None) -> None:
        super().__init__(workers=1, episode_timeout_s=60)
        self.die_after, self.episodes = die_after, 0

    def run(self, task, jobs, on_episode=None, **kw):
        def counted(i, ep):
            if on_episode is not None:
                on_episode(i, ep)
            self.episodes += 1
            if self.die_after is not None and self.episodes >= self.die_after:
                raise SimulatedKill("killed")
        return super().run(task, jobs, counted, **kw)


def _spec(directory: Path, kind: str, url: str | None = None, policy: str = "cartpole_linear.py", **tables):
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(DATA / policy, directory / "policy.py")
    (directory / "expert.py").write_text(EXPERT)
    d = base_spec_dict()
    d.update(test={"episodes": 3}, refiner={"train_episodes": 2}, budget={"env_steps": 6000},
             gate={"validation_episodes": 6, "max_share": 0.9, "spending": "none"},
             execution={"workers": 1, "episode_timeout_s": 60, "training_timeout_s": 300})
    d["task"] = {"env_id": "CartPole-v1", "max_episode_steps": 100}
    table = {"cmaes": {"popsize": 4}, "mutate": {"programs": 2, "variants": 2},
             "llm": {"base_url": url, "model": "stand-in", "proposals": 2, "variants": 1, "retries": 0},
             "ppo": PPO, "residual": PPO,
             "dagger": {"expert": "expert.py", "initial_episodes": 1, "episodes": 1, "rounds": 2, "updates": 5},
             }.get(kind)
    if kind in ("hg-dagger", "bc"):
        table = {"expert": "expert.py", "initial_episodes": 1, "episodes": 1, "rounds": 2, "updates": 5}
    d["refiners"] = [{"kind": kind, **table, **tables}]
    if kind in ("ppo", "dagger", "hg-dagger", "bc"):
        d["policy"] = {"kind": "mlp", "hidden": [8]}
    elif kind == "residual":
        d["policy"] = {"kind": "residual", "path": "policy.py", "hidden": [8]}
    return spec_from_dict(d, directory)


def whole_and_resumed(spec, tmp_path: Path, die_after: int, before_resume=None):
    """Run ``spec`` whole (under ``tmp_path/a``) and again killed after ``die_after`` episodes then resumed (under
    ``tmp_path/b``; ``before_resume()`` runs between the kill and the resume): ``(whole, resumed, events_a,
    events_b)``, the two results and the two ledgers' events."""
    with Dying() as ex:
        whole = start_run(spec, tmp_path / "a", "r", executor=ex)
    killed = Dying(die_after=die_after)
    try:
        with pytest.raises(SimulatedKill):
            start_run(spec, tmp_path / "b", "r", executor=killed)
    finally:
        killed.close()
    if before_resume is not None:
        before_resume()
    with Dying() as ex:
        resumed = resume_run(tmp_path / "b" / "r", executor=ex)
    return whole, resumed, read_events(tmp_path / "a" / "r"), read_events(tmp_path / "b" / "r")


def _proposals(events) -> list[str]:
    return [e.payload["candidate"]["id"] for e in events if e.type.value == "candidate_proposed"]


# ppo and residual train twice (whole, then killed and resumed): CPU-bound, 557 s for residual on a loaded machine
KINDS = [pytest.param(k, marks=[needs_rl, pytest.mark.timeout(1200)]) if k in ("ppo", "residual") else k for k in
         ("cmaes", "mutate", "llm", "dagger", "hg-dagger", "bc", "ppo", "residual")]


#: kinds whose task is not CartPole, covered where their task is: cfr solves OpenSpiel games (tests/test_games.py: a
#: run, and its solver line continued exactly across jobs)
ELSEWHERE = {"cfr"}


def test_every_registered_kind_is_covered_here_and_is_a_refiner():
    assert set(known_kinds()) <= {k.values[0] if hasattr(k, "values") else k for k in KINDS} | ELSEWHERE
    for kind in ("cmaes", "mutate", "llm", "dagger"):
        module = sys.modules.get(KIND_MODULES[kind]) or __import__(KIND_MODULES[kind], fromlist=["KINDS"])
        classes = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__
                   and v.__name__.endswith("Refiner")]
        assert classes and all(issubclass(c, Refiner) for c in classes), kind
        refiner_kind(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_replays_its_proposals_and_costs_what_it_declared(tmp_path, kind, standin):
    url = standin([GOOD_EDIT], default=GOOD_EDIT).url if kind == "llm" else None
    spec = _spec(tmp_path / "spec", kind, url)
    whole, resumed, a, b = whole_and_resumed(spec, tmp_path, die_after=20)  # after the first validation (6) and part of the first generations
    assert _proposals(a) == _proposals(b) and len(_proposals(a)) > 1
    assert (resumed.incumbent.id, resumed.stop_reason) == (whole.incumbent.id, whole.stop_reason)

    evaluated, training, requests = defaultdict(set), defaultdict(int), defaultdict(int)
    generation = 1
    for e in a:
        p = e.payload
        if e.type.value == "episodes_evaluated" and p["split"] == "train":
            evaluated[p["generation"], tuple(p["seeds"])].add(p["candidate_id"])
        elif e.type.value == "training_finished":
            training[generation] += p["env_steps"]
        elif e.type.value == "llm_call":
            requests[generation] += p.get("attempts") or 1
        elif e.type.value == "generation_finished":
            cost = p["cost"]
            g = p["generation"]
            # on the generation's own seeds (a decision's confirmations read seeds of their own)
            assert len(evaluated[g, tuple(p["train_seeds"])]) <= cost["proposals"] + 1 + cost["recommends"], (g, cost)
            assert training[g] == cost["training_env_steps"], (g, cost)
            assert requests[g] <= max(cost["requests"], 0), (g, cost)
            generation = g + 1
    assert generation > 1


#: the kinds that tune a program's numbers, each run on a policy with an int and a categorical parameter
TUNERS = {"cmaes": {}, "mutate": {"variants": 3}, "llm": {"variants": 3, "sigma": 0.4}}


@pytest.mark.parametrize("kind", sorted(TUNERS))
def test_a_kind_that_tunes_numbers_tunes_ints_and_choices_and_replays_them(tmp_path, kind, standin):
    """tests/data/cartpole_typed.py declares an int (``range`` fails on anything else) and a categorical parameter;
    every refiner that tunes numbers proposes ints and choices (several of each), its policy's episodes never fail
    on their types, and a run killed mid-way and resumed proposes exactly what the whole run did."""
    url = standin([GOOD_EDIT], default=GOOD_EDIT).url if kind == "llm" else None
    spec = _spec(tmp_path / "spec", kind, url, "cartpole_typed.py", **TUNERS[kind])
    whole, resumed, a, b = whole_and_resumed(spec, tmp_path, die_after=20)
    assert _proposals(a) == _proposals(b) and len(_proposals(a)) > 1
    assert (resumed.incumbent.id, resumed.stop_reason) == (whole.incumbent.id, whole.stop_reason)
    timing = ("wall_clock_s",)  # what a kill and resume may change
    assert {k: v for k, v in a[-1].payload.items() if k not in timing} == \
        {k: v for k, v in b[-1].payload.items() if k not in timing}  # the same final record

    cands = [e.payload["candidate"] for e in a if e.type.value == "candidate_proposed"]
    horizons, rules = {c["params"]["horizon"] for c in cands}, {c["params"]["rule"] for c in cands}
    assert all(type(h) is int for h in horizons) and len(horizons) > 1, horizons
    assert rules <= {"angle", "both", "velocity"} and len(rules) > 1, rules
    own = {c["id"] for c in cands if c["source"] is None}  # the run's own program (an edit may fail on its own)
    played = [ep for e in a if e.type.value == "episodes_evaluated" and e.payload["candidate_id"] in own
              for ep in e.payload["episodes"]]
    assert played and not any((ep.get("error") or "").startswith("policy") for ep in played)  # none raised
    assert type(whole.incumbent.params["horizon"]) is int


PLUGIN = ROOT / "examples" / "own_refiner"


def test_a_kind_registered_from_outside_runs_end_to_end(tmp_path, monkeypatch):
    from ratchet.refiners import registry

    monkeypatch.syspath_prepend(str(PLUGIN))  # examples/own_refiner/nudge.py, the README's example
    monkeypatch.setattr(registry, "KIND_MODULES", dict(KIND_MODULES))  # the registration ends with the test
    registry.register_kind("nudge", "nudge")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_kind("nudge", "another_module")
    d = base_spec_dict()
    d.update(refiners=[{"kind": "nudge", "step": 0.3}], test={"episodes": 3}, refiner={"train_episodes": 2},
             gate={"validation_episodes": 6, "spending": "none"}, execution={"workers": 1})
    shutil.copy(DATA / "cartpole_linear.py", tmp_path / "policy.py")
    with Dying() as ex:
        res = start_run(spec_from_dict(d, tmp_path), tmp_path / "runs", "n", executor=ex)
    events = read_events(res.run_dir)
    assert res.stop_reason == "nudge: 3 rounds done"
    assert sum(e.type.value == "generation_finished" for e in events) == 3
    assert {e.payload["candidate"].get("refiner") for e in events if e.type.value == "candidate_proposed"} >= {"nudge"}
