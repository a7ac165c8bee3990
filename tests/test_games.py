"""Game tasks (:mod:`ratchet.tasks.game`): the candidate plays a seat of a PettingZoo or OpenSpiel game against an
opponent drawn from a declared pool; each split draws its own opponents; the legal-action mask reaches the policy;
an illegal move is the candidate's recorded failure (or replaced and counted); opponents are policy code, run in a
sandboxed process of their own; the gate can refuse a candidate that is worse against any one opponent; the
critique, ``show`` and the report carry the payoff table."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import SimulatedKill, read_events
from test_refiner_contract import Dying

from ratchet.critic import Critic, Evaluation, by_opponent
from ratchet.errors import SpecError, TaskError
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox
from ratchet.execution.worker import LocalOpponents, LocalPolicy, _Policies
from ratchet.gate import worse_against
from ratchet.loop import resume_run, start_run
from ratchet.policy import compile_policy, materialize, parse_policy
from ratchet.rollout import Episode
from ratchet.spec import load_spec
from ratchet.tasks import task_from_dict
from ratchet.tasks.evaluator import split_of
from ratchet.tasks.game import GameTask, Opponent

pytest.importorskip("pettingzoo")
pytest.importorskip("pyspiel")

RANDOM = '''
import numpy as np
PARAMETERS = {}
def act(observation, params):
    return int(np.random.choice(np.flatnonzero(observation["action_mask"])))
'''

#: plays column ``col`` while it is legal, else the first legal column
COLUMN = '''
import numpy as np
PARAMETERS = {"col": {"default": 0.0, "low": 0.0, "high": 6.0}}
def act(observation, params):
    legal = np.flatnonzero(observation["action_mask"])
    want = int(round(float(params["col"])))
    return want if want in legal else int(legal[0])
'''

#: the candidate of the runs: blocks an opponent's vertical three when ``block`` > 0, else plays the legal column
#: closest to ``pref``
PREFER = '''
import numpy as np
PARAMETERS = {"pref": {"default": 3.0, "low": 0.0, "high": 6.0}, "block": {"default": -0.5, "low": -1.0, "high": 1.0}}
def act(observation, params):
    legal = np.flatnonzero(observation["action_mask"])
    board = observation["observation"]
    if params["block"] > 0:
        for c in legal:
            top = np.flatnonzero(board[:, c, 0] + board[:, c, 1])
            if top.size >= 3 and board[top[0]:top[0] + 3, c, 1].all():
                return int(c)
    return int(legal[np.argmin(np.abs(legal - params["pref"]))])
'''


def _opp(name: str, source: str, **params: float) -> Opponent:
    return Opponent(name, f"{name}.py", source, params)


def _c4(*opponents: Opponent, pools: dict | None = None, **kw) -> GameTask:
    names = tuple(o.name for o in opponents)
    return GameTask("classic/connect_four-v3", opponents, pools or {s: names for s in ("train", "validation", "test")},
                    max_moves=42, **kw)


def _local(task: GameTask, source: str, params: dict, seed: int) -> Episode:
    return task.run_episode(LocalPolicy(compile_policy(source)), materialize(params), seed, None,
                            LocalOpponents(_Policies()))


def test_an_episode_is_a_seed_opponent_and_seat_and_each_split_draws_its_own_opponents() -> None:
    a, b, c = _opp("a", RANDOM), _opp("b", COLUMN, col=3.0), _opp("c", COLUMN, col=6.0)
    task = _c4(a, b, c, pools={"train": ("a", "b"), "validation": ("c",), "test": ("a", "c")})
    assert task.seats == (0, 1) and task.step_limit == 42
    seen: dict[str, set] = {"train": set(), "validation": set(), "test": set()}
    for seed in range(3000, 3090):
        opp, seat = task.matchup(seed)
        assert task.matchup(seed) == (opp, seat)  # a pure function of the seed: replay meets the same opponent
        seen[split_of(seed)].add((opp.name, seat))
    assert seen["train"] == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    assert seen["validation"] == {("c", 0), ("c", 1)} and {n for n, _ in seen["test"]} == {"a", "c"}
    ep = _local(task, PREFER, {"pref": 3.0, "block": 0.5}, 3001)  # validation: against c, which drops everything in column 6
    assert ep.diagnostics["opponent"] == "c" and ep.error is None and ep.terminated and not ep.truncated
    assert ep.episode_return == 1.0 and ep.success and ep.diagnostics["outcome"] == "win"  # four in column 3
    again = task_from_dict(json.loads(json.dumps(task.to_dict())))
    assert again == task and _local(again, PREFER, {"pref": 3.0, "block": 0.5}, 3001) == ep


def test_the_mask_reaches_the_policy_and_an_illegal_move_loses_or_is_replaced_and_counted() -> None:
    full_column = '''
import numpy as np
PARAMETERS = {}
def act(observation, params):
    assert observation["action_mask"].dtype == np.int8 and observation["action_mask"].shape == (7,)
    assert observation["observation"].shape == (6, 7, 2) and observation["seat"] in (0, 1)
    return 0  # column 0 until it is full: the seventh move there is illegal
'''
    bot = _opp("bot", COLUMN, col=0.0)
    strict = _c4(bot, seats=(0,))
    ep = _local(strict, full_column, {}, 0)
    assert ep.error is not None and "illegal move 0" in ep.error and ep.episode_return == -1.0
    assert ep.success is False and ep.diagnostics["outcome"] == "loss"
    lenient = _c4(bot, seats=(0,), illegal="replace")
    ep = _local(lenient, full_column, {}, 0)
    assert ep.error is None and ep.diagnostics["illegal_moves"] >= 1 and ep.terminated
    with pytest.raises(TaskError, match="illegal"):
        _c4(bot, illegal="forfeit")


def test_openspiel_poker_samples_chance_from_the_seed_and_gives_the_info_state() -> None:
    caller = '''
import numpy as np
PARAMETERS = {}
def act(observation, params):
    assert isinstance(observation["info_state"], str) and observation["observation"].dtype == np.float32
    legal = np.flatnonzero(observation["action_mask"])
    return int(legal[-1])  # bet / call whenever it can
'''
    task = GameTask("openspiel:kuhn_poker", (_opp("r", RANDOM),), {s: ("r",) for s in ("train", "validation", "test")})
    assert task.step_limit == 3 and task.dims() == {"obs": 11, "act": 2}
    eps = [_local(task, caller, {}, s) for s in range(200, 260)]
    assert all(e.error is None and e.terminated for e in eps)
    assert {e.episode_return for e in eps} <= {-2.0, -1.0, 1.0, 2.0} and len({e.episode_return for e in eps}) >= 3
    assert [_local(task, caller, {}, s) for s in range(200, 260)] == eps  # cards dealt from the seed
    assert {e.diagnostics["seat"] for e in eps} == {0, 1}


TAMPER = '''
import numpy as np
PARAMETERS = {"pref": {"default": 3.0, "low": 0.0, "high": 6.0}}
def act(observation, params):
    np.random.choice = lambda a, *args, **kw: np.asarray(a).ravel()[0]  # would steer a random opponent in-process
    import sys
    for m in list(sys.modules.values()):  # and any policy module it can find
        if getattr(m, "act", None) is not None and m.__dict__.get("PARAMETERS") == {}:
            m.act = lambda o, p: 0
    legal = np.flatnonzero(observation["action_mask"])
    return int(legal[np.argmin(np.abs(legal - params["pref"]))])
'''


def test_opponents_run_sandboxed_in_a_process_of_their_own_that_the_candidate_cannot_reach() -> None:
    task = _c4(_opp("r", RANDOM))
    honest = parse_policy(PREFER).candidate({"pref": 3.0, "block": -0.5})
    tamper = parse_policy(TAMPER).candidate({"pref": 3.0})
    seeds = list(range(30, 42))
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    try:
        a = ex.run(task, [Job(honest, s) for s in seeds])
        b = ex.run(task, [Job(tamper, s) for s in seeds])
    finally:
        ex.close()
    assert all(e.error is None for e in a + b), [e.error for e in a + b]
    # the same games move for move: the tampering reached nothing but the candidate's own process
    assert [(e.episode_return, e.length) for e in a] == [(e.episode_return, e.length) for e in b]
    # in one process (what trusted rollouts prevent) the same tampering does change the opponent's play
    local = [_local(task, TAMPER, {"pref": 3.0}, s) for s in seeds]
    assert [(e.episode_return, e.length) for e in local] != [(e.episode_return, e.length) for e in a]


@pytest.mark.parametrize("trusted", [True, False])
def test_a_failing_opponent_is_the_setups_fault_and_a_failing_candidate_loses(trusted: bool) -> None:
    broken = _opp("broken", "PARAMETERS = {}\ndef act(observation, params):\n    raise RuntimeError('bot bug')\n")
    task = _c4(broken, seats=(1,))  # the opponent moves first
    good = parse_policy(PREFER).candidate({"pref": 3.0, "block": -0.5})
    crash = parse_policy("PARAMETERS = {}\ndef act(observation, params):\n    return 1 / 0\n").candidate({})
    ex = ProcessExecutor(workers=1, episode_timeout_s=30, sandbox=Sandbox(trusted_rollouts=trusted))
    try:
        (fault,) = ex.run(task, [Job(good, 5)])
        (lost,) = ex.run(_c4(_opp("r", RANDOM), seats=(0,)), [Job(crash, 5)])
    finally:
        ex.close()
    assert fault.diagnostics.get("fault") == "task" and "opponent broken" in fault.error and "bot bug" in fault.error
    assert lost.diagnostics.get("fault") is None and "ZeroDivisionError" in lost.error
    assert lost.episode_return == -1.0 and lost.success is False


#: plays the first legal column, sleeping ``first`` seconds on its first move and ``each`` on every move
SLEEPER = '''
import time
import numpy as np
PARAMETERS = {}
moves = [0]
def act(observation, params):
    time.sleep(%(first)s if moves[0] == 0 else %(each)s)
    moves[0] += 1
    return int(np.flatnonzero(observation["action_mask"])[0])
'''


def _sleeper(first: float = 0.0, each: float = 0.0) -> str:
    return SLEEPER % {"first": first, "each": each}


def test_each_player_is_charged_only_its_own_time_on_a_clock_of_its_own() -> None:
    """Regression (issue 41): one deadline per game blamed whoever was moving when it fired. A candidate that slept
    most of the game's time on its first move got a declared opponent blamed ("its process was lost (timeout) — the
    task's fault", the run stopped, and resume failed the same way)."""
    def job(source: str, seed: int) -> Job:
        return Job(parse_policy(source).candidate({}), seed)

    # margins of seconds, not tenths: a loaded machine may leave a process unscheduled for a second or two
    patient = _c4(_opp("patient", _sleeper(first=3.6)), seats=(0,))  # its first move: 3.6 s of its 6 s
    slowbot = _c4(_opp("slowbot", _sleeper(each=2.0)), seats=(0,))  # 2 s a move: past its 6 s by its third move
    ex = ProcessExecutor(workers=1, episode_timeout_s=6)
    try:
        (both,) = ex.run(patient, [job(_sleeper(first=3.6), 3)])  # 7.2 s in all: each within its own clock
        (forfeit,) = ex.run(slowbot, [job(_sleeper(each=0.1), 3)])
        (late,) = ex.run(_c4(_opp("quick", _sleeper()), seats=(0,)), [job(_sleeper(first=60), 3)])
    finally:
        ex.close()
    assert both.error is None and both.terminated and "fault" not in both.diagnostics, both
    assert "forfeit" not in both.diagnostics and both.length > 2
    # the opponent that used up its own clock forfeits: the candidate wins, nothing stops the run
    assert forfeit.error is None and forfeit.diagnostics.get("fault") is None and forfeit.episode_return == 1.0
    assert forfeit.success and forfeit.diagnostics["outcome"] == "win" and 4 <= forfeit.length <= 8
    assert "opponent slowbot failed: move" in forfeit.diagnostics["forfeit"]
    assert "ran out of its clock (6 s of its own start and moves)" in forfeit.diagnostics["forfeit"]
    # a candidate that used up its own clock loses, as its failure, never the opponent's
    assert late.diagnostics.get("fault") is None and "forfeit" not in late.diagnostics
    assert late.error is not None and "timeout after 6 s of its own clock" in late.error, late.error
    assert late.episode_return == -1.0 and late.success is False


def test_in_process_the_clocks_are_read_after_each_turn() -> None:
    task = _c4(_opp("slowbot", _sleeper(each=0.3)), seats=(0,))
    ep = task.run_episode(LocalPolicy(compile_policy(_sleeper())), {}, 3, None,
                          LocalOpponents(_Policies(), clock_s=0.5))
    assert ep.error is None and ep.episode_return == 1.0 and "ran out of its clock" in ep.diagnostics["forfeit"]
    task = _c4(_opp("quick", _sleeper()), seats=(0,))
    ep = task.run_episode(LocalPolicy(compile_policy(_sleeper(each=0.3))), {}, 3, None,
                          LocalOpponents(_Policies(), clock_s=0.5))
    assert ep.error is not None and "timeout after 0.5 s of its own clock" in ep.error and ep.episode_return == -1.0
    assert ep.diagnostics.get("fault") is None and "forfeit" not in ep.diagnostics
    assert _local(task, _sleeper(each=0.3), {}, 3).error is None  # no clocks given: none kept


def _ep(seed: int, ret: float, opponent: str) -> Episode:
    return Episode(seed, ret, 10, True, False, ret > 0, None, {"opponent": opponent, "seat": 0, "outcome": "win"})


def test_the_cycling_guard_refuses_a_candidate_worse_against_one_opponent_and_the_payoff_row_shows_it() -> None:
    # better on average (beats a and b where the incumbent drew) but loses to c, which the incumbent beat
    seeds = list(range(60))
    opp = ["a", "b", "c"]
    inc = Evaluation("inc", "validation", tuple(_ep(s, 0.0 if opp[s % 3] != "c" else 1.0, opp[s % 3]) for s in seeds))
    cand = Evaluation("cand", "validation", tuple(_ep(s, 1.0 if opp[s % 3] != "c" else -1.0 + (s % 2), opp[s % 3])
                                                  for s in seeds))
    assert cand.mean > inc.mean
    why = worse_against(cand, inc, 0.05)
    assert why is not None and why.startswith("worse against c:")
    assert worse_against(inc, inc, 0.05) is None and worse_against(cand, cand, 0.05) is None
    rows = by_opponent(cand, inc)
    assert [r["opponent"] for r in rows] == ["c", "a", "b"]  # worst first
    assert rows[0]["compared_mean"] == 1.0 and rows[0]["losses"] == 10 and rows[0]["draws"] == 10
    text = Critic().critique(cand, inc).text
    assert "by opponent (worst first): c -0.50" in text
    with pytest.raises(ValueError, match="level"):
        worse_against(cand, inc, 1.5)


def _spec_dir(tmp_path: Path, **over) -> Path:
    d = tmp_path / "spec"
    (d / "bots").mkdir(parents=True, exist_ok=True)
    (d / "bots" / "random.py").write_text(RANDOM)
    (d / "bots" / "column.py").write_text(COLUMN)
    (d / "policy.py").write_text(PREFER)
    task = {"kind": "game", "game": "classic/connect_four-v3", "max_moves": 42,
            "validation_opponents": ["edge", "centre"], "test_opponents": ["random", "edge", "centre"]}
    text = f"""
        seed = 1
        [task]
        {chr(10).join(f"{k} = {json.dumps(v)}" for k, v in {**task, **over}.items())}
        [task.opponents]
        random = "bots/random.py"
        edge = {{ path = "bots/column.py", params = {{ col = 6.0 }} }}
        centre = {{ path = "bots/column.py", params = {{ col = 3.0 }} }}
        [policy]
        path = "policy.py"
        [[refiners]]
        kind = "cmaes"
        popsize = 4
        sigma0 = 0.5
        [planner]
        train_episodes = 6
        [gate]
        validation_episodes = 24
        max_share = 0.9
        worse_against_any = 0.05
        [budget]
        episodes = 260
        [test]
        episodes = 24
        [execution]
        workers = 1
        episode_timeout_s = 30
    """
    (d / "ratchet.toml").write_text(textwrap.dedent(text))
    return d


def test_a_game_run_promotes_resumes_after_a_kill_to_the_same_decisions_and_replays_a_game(tmp_path: Path) -> None:
    spec = load_spec(_spec_dir(tmp_path))
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    try:
        result = start_run(spec, tmp_path / "a", run_id="g", executor=ex)
    finally:
        ex.close()
    assert result.test.mean > result.baseline_test.mean + 0.3  # it learns to block: half its games were losses
    events = read_events(tmp_path / "a" / "g")
    assert any(e.type.value == "incumbent_changed" for e in events)
    gates = [e.payload for e in events if e.type.value == "gate_decided"]
    assert gates and all(g["critique"]["opponents"] for g in gates)  # the payoff row of every decision
    val = [e.payload for e in events if e.type.value == "episodes_evaluated" and e.payload["split"] == "validation"]
    assert {ep["diagnostics"]["opponent"] for v in val for ep in v["episodes"]} == {"edge", "centre"}

    dying = Dying(die_after=90)
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "b", run_id="g", executor=dying)
    dying.close()
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    try:
        resume_run("g", tmp_path / "b", executor=ex)
    finally:
        ex.close()

    def decisions(run_dir):
        return [(e.type.value, e.payload.get("candidate_id"), e.payload.get("promoted"))
                for e in read_events(run_dir) if e.type.value in ("gate_decided", "incumbent_changed")]

    assert decisions(tmp_path / "a" / "g") == decisions(tmp_path / "b" / "g")
    from typer.testing import CliRunner

    from ratchet.cli import app

    test = next(e.payload for e in read_events(tmp_path / "b" / "g")
                if e.type.value == "episodes_evaluated" and e.payload["split"] == "test")
    seed = test["episodes"][0]["seed"]
    res = CliRunner().invoke(app, ["replay", "g", "--runs-dir", str(tmp_path / "b"), "--seed", str(seed)])
    assert res.exit_code == 0 and "match: identical return and length" in res.output, res.output
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["show", "g", "--runs-dir", str(tmp_path / "b")])
    assert res.exit_code == 0 and "test by opponent" in res.output and "centre:" in res.output, res.output
    res = CliRunner().invoke(app, ["report", "g", "--runs-dir", str(tmp_path / "b"), "--no-videos"])
    assert res.exit_code == 0, res.output
    assert "Test payoff by opponent" in (tmp_path / "b" / "g" / "report.html").read_text()


@pytest.mark.parametrize(("over", "message"), [
    ({"validation_opponents": ["nobody"]}, "names 'nobody', which is not in [task.opponents]"),
    ({"seats": [2]}, "seats must be distinct seats"),
    ({"game": "classic/connect_five-v3"}, "unknown PettingZoo game"),
    ({"game": "openspiel:no_such_game"}, "OpenSpiel cannot load game"),
    ({"env_id": "CartPole-v1"}, "env_id do(es) not apply to game tasks"),
    ({"illegal": "forfeit"}, "illegal"),
])
def test_bad_game_specs_get_one_line(tmp_path: Path, over: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(_spec_dir(tmp_path, **over))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_opponent_file_that_is_missing_or_declares_no_act_is_named(tmp_path: Path) -> None:
    d = _spec_dir(tmp_path)
    (d / "bots" / "random.py").write_text("PARAMETERS = {}\ndef play(o, p):\n    return 0\n")
    with pytest.raises(SpecError, match="opponent random .*act"):
        load_spec(d)
    (d / "bots" / "random.py").unlink()
    with pytest.raises(SpecError, match="opponent random: policy file not found"):
        load_spec(d)
    with pytest.raises(SpecError, match="seats belongs to game tasks"):
        from ratchet.spec import spec_from_dict

        spec_from_dict({"task": {"env_id": "CartPole-v1", "seats": [0]}, "policy": {"path": "p.py"}})


def test_opponent_names_a_league_would_reuse_are_refused_up_front() -> None:
    """Regression: a user's opponent named league2 passed the checks, and the run failed when the league's second
    member joined under that name ("two opponents share a name"), on every resume too."""
    with pytest.raises(TaskError, match=r"\[task.opponents\] league2: names league1, league2, … are kept"):
        _c4(_opp("r", RANDOM), _opp("league2", RANDOM), league=True)
    assert _c4(_opp("r", RANDOM), _opp("league2", RANDOM)).opponents[1].name == "league2"  # no league: any name
    with pytest.raises(TaskError, match="two opponents are named 'r'; give each"):
        _c4(_opp("r", RANDOM), _opp("r", RANDOM))


def test_game_tasks_refuse_refiners_that_need_an_environment() -> None:
    task = _c4(_opp("r", RANDOM))
    with pytest.raises(TaskError, match="game task: it has no single-agent environment"):
        task.make_env()
    assert np.prod(task.spaces()[0]["observation"].shape) == 84


def test_meta_strategy_is_the_column_players_equilibrium_mixed_with_a_floor() -> None:
    from ratchet.tasks.game import MIN_SHARE, meta_strategy

    rps = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])  # rock-paper-scissors: uniform
    assert np.allclose(meta_strategy(rps), 1 / 3)
    # the league beats column 0 and loses to column 1: the equilibrium plays column 1
    sigma = meta_strategy(np.array([[1.0, -1.0, 0.5], [0.8, -0.5, 0.9]]))
    assert sigma.argmax() == 1 and np.isclose(sigma.sum(), 1) and sigma.min() >= MIN_SHARE / 3 - 1e-12
    with pytest.raises(ValueError, match="finite 2-D"):
        meta_strategy(np.array([[np.nan]]))


def test_a_league_adds_each_incumbent_to_the_training_pool_and_replays_its_games(tmp_path: Path) -> None:
    spec = load_spec(_spec_dir(tmp_path, league=True))
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    try:
        start_run(spec, tmp_path / "a", run_id="l", executor=ex)
    finally:
        ex.close()
    events = read_events(tmp_path / "a" / "l")
    updates = [e.payload for e in events if e.type.value == "task_updated"]
    promotions = [e.payload for e in events if e.type.value == "incumbent_changed"]
    assert promotions and len(updates) == len(promotions) + 1  # the start policy joins when the run starts
    start, first = updates[0], updates[1]
    assert start["incumbent"] == promotions[0]["from"] and start["task"]["train_opponents"][-1] == "league1"
    assert first["task"]["train_opponents"][-2:] == ["league1", "league2"] and first["columns"][-1] == "league2"
    assert np.isclose(sum(first["meta_strategy"].values()), 1.0) and first["rows"][0] == promotions[0]["from"]
    # before each promotion the candidate played every member (2 games a seat) and did not lose to it on average
    evaluated = [e.payload for e in events if e.type.value == "episodes_evaluated"]
    for promo in promotions:
        league_games = [ep for p in evaluated if p["candidate_id"] == promo["to"] and p["split"] == "league"
                        for ep in p["episodes"]]
        assert len(league_games) == 4 and {ep["diagnostics"]["seat"] for ep in league_games} == {0, 1}
        assert np.mean([ep["episode_return"] for ep in league_games]) >= 0
    later = [e for e in events[events.index(next(e for e in events if e.type.value == "task_updated")):]
             if e.type.value == "episodes_evaluated" and e.payload["split"] == "train"]
    met = {ep["diagnostics"]["opponent"] for e in later for ep in e.payload["episodes"]}
    assert "league1" in met  # an incumbent plays as an opponent, sandboxed like the others
    league_game = next((e.payload["candidate_id"], ep["seed"]) for e in later for ep in e.payload["episodes"]
                       if ep["diagnostics"]["opponent"] == "league1")
    dying = Dying(die_after=len(events) // 3)  # killed midway, then resumed: the league grows the same way
    with pytest.raises(SimulatedKill):
        start_run(spec, tmp_path / "b", run_id="l", executor=dying)
    dying.close()
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    try:
        resume_run("l", tmp_path / "b", executor=ex)
    finally:
        ex.close()
    assert [e.payload["meta_strategy"] for e in read_events(tmp_path / "b" / "l") if e.type.value == "task_updated"] \
        == [u["meta_strategy"] for u in updates]
    from typer.testing import CliRunner

    from ratchet.cli import app

    res = CliRunner().invoke(app, ["replay", "l", "--runs-dir", str(tmp_path / "a"), "--seed", str(league_game[1]),
                                   "--candidate", league_game[0]])
    assert res.exit_code == 0 and "match: identical return and length" in res.output, res.output
    res = CliRunner().invoke(app, ["replay", "l", "--runs-dir", str(tmp_path / "a"), "--seed", str(league_game[1]),
                                   "--candidate", league_game[0], "--video", str(tmp_path / "x.gif")])
    assert res.exit_code == 1 and "no frames to record" in res.output and not (tmp_path / "x.gif").exists()
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["show", "l", "--runs-dir", str(tmp_path / "a")])
    assert res.exit_code == 0 and "league payoffs" in res.output and "meta-strategy now" in res.output, res.output
    res = CliRunner().invoke(app, ["report", "l", "--runs-dir", str(tmp_path / "a"), "--no-videos"])
    assert res.exit_code == 0 and "<h2>League</h2>" in (tmp_path / "a" / "l" / "report.html").read_text()


def test_a_candidate_that_loses_to_a_league_member_on_average_is_refused() -> None:
    from types import SimpleNamespace

    from ratchet.policy import Candidate
    from ratchet.services import RunServices
    from ratchet.tasks.game import RIVAL_SEEDS

    task = _c4(_opp("random", RANDOM), league=True)
    assert task.rival_seeds() == {}  # no member yet
    start = Candidate.create(PREFER, {"pref": 3.0, "block": -0.5})
    task, _ = task.after_promotion(start, {})
    rivals = task.rival_seeds()
    assert list(rivals) == ["league1"] and len(rivals["league1"]) == 4
    assert all(s >= RIVAL_SEEDS and split_of(s) == "validation" for s in rivals["league1"])
    assert [task.matchup(s)[1] for s in rivals["league1"]] == [0, 1, 0, 1]
    assert {task.matchup(s)[0].name for s in rivals["league1"]} == {"league1"}
    with pytest.raises(TaskError, match="league member 2"):
        task.matchup(RIVAL_SEEDS + 3 * (1 << 16) + 1)

    def fake(returns: list[float]) -> SimpleNamespace:
        def evaluate(cands, seeds, split, generation):
            eps = tuple(Episode(s, r, 10, True, False, r > 0) for s, r in zip(seeds, returns, strict=True))
            return {cands[0].id: Evaluation(cands[0].id, split, eps)}
        return SimpleNamespace(task=task, evaluate=evaluate)

    cand = SimpleNamespace(id="c")
    assert RunServices._loses_to_a_rival(fake([1.0, -1.0, 0.0, 0.0]), 1, cand) is None  # even: not a loss
    why = RunServices._loses_to_a_rival(fake([1.0, -1.0, -1.0, 0.0]), 1, cand)
    assert why is not None and why.startswith("loses to league1") and "-0.250" in why
    with pytest.raises(TaskError, match="league_games applies to a league"):
        _c4(_opp("random", RANDOM), league_games=4)
    # a league game the candidate crashed or timed out in is lost, whatever payoff the executor wrote
    crashed = [Episode(s, 0.0, 3, False, False, None, "skipped: worker died") for s in rivals["league1"]]
    why = RunServices._loses_to_a_rival(SimpleNamespace(task=task, evaluate=lambda c, s, sp, g: {
        "c": Evaluation("c", sp, tuple(crashed))}), 1, cand)
    assert why is not None and why.startswith("failed 4 of its 4 league games")


def test_a_league_member_that_fails_forfeits_the_game_instead_of_stopping_the_run() -> None:
    from ratchet.policy import Candidate
    from ratchet.tasks.game import RIVAL_SEEDS

    flawed = PREFER.replace("def act(", "def act_(") + "\ndef act(obs, params):\n    raise ValueError('member bug')\n"
    task, _ = _c4(_opp("random", RANDOM), league=True).after_promotion(Candidate.create(flawed, {"pref": 3.0,
                                                                                                 "block": -0.5}), {})
    seed = RIVAL_SEEDS + 3 * 0 + 1 + 3  # league1's second game: the candidate plays second, the member moves first
    assert task.matchup(seed)[1] == 1
    ep = _local(task, PREFER, {"pref": 3.0, "block": -0.5}, seed)
    assert ep.error is None and ep.episode_return == 1.0 and ep.diagnostics.get("fault") is None
    assert "member bug" in ep.diagnostics["forfeit"] and ep.diagnostics["outcome"] == "win"


@pytest.mark.parametrize(("failure", "why"), [("raise ValueError('member bug')", "member bug"),
                                              ("os._exit(3)", "its process was lost (died)"),
                                              ("time.sleep(600)", "ran out of its clock (3 s of its own")])
def test_a_league_member_that_raises_dies_or_hangs_in_its_process_forfeits(failure: str, why: str) -> None:
    """Regression (issue 41): a league member whose process died stopped the run as the task's fault (one that hung
    too), and one that raised was recorded as the candidate's interference (its forfeit was not a reply the driver
    accepted)."""
    from ratchet.policy import Candidate

    member = f'''
import os
import time
import numpy as np
PARAMETERS = {{}}
def act(observation, params):
    if observation["seat"] == 1:  # the time bomb: when it plays the second seat
        {failure}
    return int(np.flatnonzero(observation["action_mask"])[0])
'''
    task, _ = _c4(_opp("random", RANDOM), league=True).after_promotion(Candidate.create(member, {}), {})
    seeds = task.rival_seeds()["league1"][:2]  # the candidate plays seat 0, then seat 1
    ex = ProcessExecutor(workers=1, episode_timeout_s=3)
    try:
        forfeit, played = ex.run(task, [Job(parse_policy(COLUMN).candidate({"col": 3.0}), s) for s in seeds])
    finally:
        ex.close()
    assert forfeit.error is None and forfeit.diagnostics.get("fault") is None, forfeit
    assert forfeit.episode_return == 1.0 and forfeit.diagnostics["outcome"] == "win" and forfeit.terminated
    assert forfeit.diagnostics["forfeit"].startswith("opponent league1 failed: move 1: ")
    assert why in forfeit.diagnostics["forfeit"], forfeit.diagnostics
    assert played.error is None and "forfeit" not in played.diagnostics  # a fresh pair for the next game


KUHN_POLICY = Path(__file__).parent.parent / "examples" / "kuhn_poker" / "policy.py"


def _kuhn_task() -> GameTask:
    return GameTask("openspiel:kuhn_poker", (), {}, objective="exploitability")


def test_the_exploitability_objective_is_exact_and_a_bad_distribution_is_the_candidates_failure() -> None:
    task = _kuhn_task()
    assert task.functions == {"act": 2, "probabilities": 2} and task.cost_unit == "information states"
    ep = _local(task, KUHN_POLICY.read_text(), {"logits": np.zeros((12, 2))}, 7)
    assert ep.error is None and np.isclose(ep.episode_return, -0.458333, atol=1e-5) and ep.length == 12
    assert np.isclose(ep.diagnostics["scores"]["nash_conv"], 2 * 0.458333, atol=1e-5)
    bad = KUHN_POLICY.read_text().replace("return p / p.sum()", "return p")  # unnormalised
    bad = bad.replace("p = np.exp(z - z[mask].max())", "p = 2 * np.exp(z - z[mask].max())")
    ep = _local(task, bad, {"logits": np.zeros((12, 2))}, 7)
    assert ep.error is not None and "not a distribution over the legal actions" in ep.error
    assert ep.episode_return == -4.0  # the worst a value can be: max - min utility
    with pytest.raises(TaskError, match="needs an OpenSpiel game"):
        GameTask("classic/connect_four-v3", (), {}, objective="exploitability")


def test_cfr_jobs_continue_one_solver_line_exactly() -> None:
    from ratchet.refiners.cfr import train

    parent = {"params": {"logits": np.zeros((12, 2)).tolist()}, "artifacts": {}}
    settings = {"game": "kuhn_poker", "algorithm": "cfr+", "low": -20.0, "high": 20.0}
    (whole,), _ = train(None, parent, {**settings, "iterations": 10}, (), 120)
    (first,), _ = train(None, parent, {**settings, "iterations": 4}, (), 48)
    (second,), _ = train(None, {**parent, "artifacts": {"state": first.artifacts["state"]}},
                         {**settings, "iterations": 6}, (), 72)
    import io

    def logits(out) -> np.ndarray:
        return np.load(io.BytesIO(out.artifacts["logits"]), allow_pickle=False)["logits"]

    assert second.info["iteration"] == whole.info["iteration"] == 10
    assert np.allclose(logits(second), logits(whole))  # two jobs of one line = one job of the whole line


def _kuhn_spec(tmp_path: Path, refiner: str) -> Path:
    d = tmp_path / "kuhn"
    d.mkdir(parents=True, exist_ok=True)
    (d / "policy.py").write_text(KUHN_POLICY.read_text())
    (d / "ratchet.toml").write_text(textwrap.dedent(f"""
        seed = 0
        [task]
        kind = "game"
        game = "openspiel:kuhn_poker"
        objective = "exploitability"
        [policy]
        path = "policy.py"
        [[refiners]]
        {refiner}
        [planner]
        train_episodes = 1
        [gate]
        validation_episodes = 2
        max_share = 0.5
        [budget]
        env_steps = 1500
        [test]
        episodes = 2
        [execution]
        workers = 1
    """))
    return d


def test_a_cfr_run_lowers_exploitability_at_every_promotion(tmp_path: Path) -> None:
    spec = load_spec(_kuhn_spec(tmp_path, 'kind = "cfr"\niterations = 5'))
    ex = ProcessExecutor(workers=1, episode_timeout_s=30)
    try:
        result = start_run(spec, tmp_path / "runs", run_id="k", executor=ex)
    finally:
        ex.close()
    events = read_events(tmp_path / "runs" / "k")
    values = [e.payload["validation_mean"] for e in events if e.type.value == "incumbent_changed"]
    assert len(values) >= 3 and all(b > a for a, b in itertools.pairwise(values))  # minus exploitability only rises
    assert -result.test.mean < 0.05 < -result.baseline_test.mean  # from 0.458 (uniform) to below 0.05
    jobs = [e.payload for e in events if e.type.value == "training_finished"]
    assert jobs and all(j["error"] is None for j in jobs) and jobs[-1]["outputs"][0]["info"]["iteration"] == 5 * len(jobs)


def test_cfr_refuses_a_policy_it_cannot_tabulate(tmp_path: Path) -> None:
    d = _kuhn_spec(tmp_path, 'kind = "cfr"')
    (d / "policy.py").write_text(KUHN_POLICY.read_text().replace('"shape": [12, 2]', '"shape": [12, 3]'))
    with pytest.raises(SpecError, match="cfr needs a PARAMETERS array \"logits\" of shape \\[12, 2\\]"):
        start_run(load_spec(d), tmp_path / "runs", run_id="x")


def test_a_league_declares_that_promotions_change_the_task() -> None:
    """Issue 42: the Task contract says whether a promotion may change the task (``changes_on_promotion``), so a run
    never plans work ahead of a verdict on a task the verdict would change ([planner] overlap_gate)."""
    assert _c4(_opp("random", RANDOM), league=True).changes_on_promotion
    assert not _c4(_opp("random", RANDOM)).changes_on_promotion
