"""Lockstep batches (``[execution] lockstep_episodes``): a worker pair steps many episodes of one candidate at once,
and every episode is the one it would be alone — for every shipped example, every policy kind, and episodes that
fail on their own."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.policy import parse_policy
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
GYM_EXAMPLES = sorted(p.parent.name for p in ROOT.glob("examples/*/ratchet.toml")
                      if not any(f'kind = "{k}"' in p.read_text() for k in ("evaluator", "game", "openevolve")))


def _both(task, cands_and_seeds, lockstep=8, workers=1, timeout_s=60.0):
    """The episodes of the same jobs one at a time and in lockstep, as dicts."""
    out = []
    for width in (1, lockstep):
        with ProcessExecutor(workers=workers, episode_timeout_s=timeout_s, lockstep=width) as ex:
            out.append([e.to_dict() for e in ex.run(task, cands_and_seeds)])
    return out


@pytest.mark.parametrize("example", GYM_EXAMPLES)
def test_every_shipped_example_gives_the_same_episodes_in_lockstep(example, tmp_path):
    """The start candidate of each example (program, mlp, sb3 and residual kinds), its env cut to 200 steps per
    episode to keep the test short: lockstep episodes equal one-at-a-time episodes, field for field."""
    from ratchet.loop import load_start
    from ratchet.spec import load_spec
    from ratchet.tasks import task_from_spec

    spec = load_spec(ROOT / "examples" / example / "ratchet.toml")
    if spec.task.env_id.startswith(("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid")):
        pytest.importorskip("mujoco", reason="MuJoCo tasks need pip install 'policy-ratchet[mujoco]'")
    table = spec.task.model_dump()
    table["max_episode_steps"] = 200
    task = task_from_spec(table)
    _, cand, blobs = load_start(spec, task)
    if cand.kind == "residual":  # a start correction is zero; give it weights so it changes actions
        from ratchet.ledger.artifacts import digest
        from ratchet.policies import mlp

        net = mlp.init_weights(*task.spaces(), hidden=[16], seed=3, zero_output=False).to_bytes()
        cand = type(cand).create(cand.source, cand.params, kind="residual", artifacts={"correction": digest(net)})
        blobs = {digest(net): net}
    jobs = [Job(cand, s, blobs) for s in range(10)]
    alone, together = _both(task, jobs, lockstep=4)
    assert together == alone
    assert not any(e["error"] for e in alone), [e["error"] for e in alone]


def _program(source: str, params=None):
    return parse_policy(source).candidate(params)


CARTPOLE = GymTask("CartPole-v1")
LINEAR = """
import numpy as np
PARAMETERS = {"w": {"default": [0.1, 0.5, 1.0, 1.0], "low": -5, "high": 5, "shape": [4]}}
def act(obs, params):
    return int(obs @ params["w"] > 0)
"""


def test_episodes_fail_on_their_own_in_a_batch():
    """An invalid action in one episode, a raise in another and a reset that fails in a third end only those
    episodes, each with the error (and env steps, return, final observation) it gets alone."""
    source = """
import math
PARAMETERS = {}
STATE = {}
def reset(params, seed):
    if seed == 3:
        raise ValueError("no start for seed 3")
    STATE["seed"], STATE["t"] = seed, 0
def act(obs, params):
    STATE["t"] += 1
    if STATE["seed"] == 1 and STATE["t"] == 7:
        return 5
    if STATE["seed"] == 2 and STATE["t"] == 11:
        raise RuntimeError("boom at 11")
    if STATE["seed"] == 4 and STATE["t"] == 4:
        return math.nan
    return int(obs[2] + obs[3] > 0)
"""
    alone, together = _both(CARTPOLE, [Job(_program(source), s) for s in range(6)])
    assert together == alone
    errors = [e["error"] for e in alone]
    assert errors[0] is None and errors[5] is None
    assert "invalid action: step 6" in errors[1]
    assert re.fullmatch(r"policy raised RuntimeError: boom at 11 \(policy line \d+\)", errors[2])  # where it raised
    assert re.fullmatch(r"policy raised ValueError: no start for seed 3 \(policy line \d+\)", errors[3])
    assert alone[3]["diagnostics"]["final_observation"] is None
    assert "non-finite" in errors[4] and alone[4]["length"] == 3


def test_a_policy_drawing_random_numbers_gets_its_own_episode_draws():
    """A policy that draws from the global generators is served one episode at a time inside the batch, so its
    episodes are the same as alone (seeded with their own seed)."""
    source = """
import random
import numpy as np
PARAMETERS = {}
def act(obs, params):
    return int(np.random.random() < 0.5) if random.random() < 0.3 else int(obs[2] > 0)
"""
    alone, together = _both(CARTPOLE, [Job(_program(source), s) for s in range(6)])
    assert together == alone
    assert len({e["length"] for e in alone}) > 1


def test_uses_global_random_reads_names_not_docstrings():
    from ratchet.policy import uses_global_random

    def code(src):
        return compile(src, "<p>", "exec")

    assert uses_global_random(code("import numpy as np\ndef act(o, p):\n    return np.random.rand()"))
    assert uses_global_random(code("from random import choice\ndef act(o, p):\n    return choice([0, 1])"))
    assert uses_global_random(code("def act(o, p):\n    return __import__('random').random()"))
    assert not uses_global_random(code('"""Not random at all."""\ndef act(o, p):\n    """no random here"""\n    return 0'))


def test_act_batch_answers_a_whole_round():
    """A program's ``act_batch(observations, params)`` answers every episode of a round in one call, and gives
    the episodes ``act`` gives alone (a batch of one)."""
    source = LINEAR + """
CALLS = []
def act_batch(observations, params):
    CALLS.append(len(observations))
    return (observations @ params["w"] > 0).astype(int)
"""
    cand = _program(source)
    alone, together = _both(CARTPOLE, [Job(cand, s) for s in range(8)])
    assert together == alone
    assert not any(e["error"] for e in alone)


@pytest.mark.parametrize("answer, fragment", [("[0]", "wrong number of actions"), ("None", "returned no sequence"),
                                              ("1 / 0", "policy raised ZeroDivisionError")])
def test_act_batch_that_fails_fails_the_round(answer, fragment):
    source = LINEAR + f"""
def act_batch(observations, params):
    return {answer}
"""
    with ProcessExecutor(workers=1, episode_timeout_s=60, lockstep=4) as ex:
        eps = ex.run(CARTPOLE, [Job(_program(source), s) for s in range(4)])
    assert all(fragment in e.error for e in eps), [e.error for e in eps]


def test_mlp_outputs_are_row_for_row_those_of_one_observation():
    """A network's batch forward pass gives each row exactly the bits of that observation alone (BLAS's matrix
    product would not: its summation order depends on the batch size)."""
    from ratchet.policies import mlp

    task = GymTask("LunarLander-v3")
    net = mlp.load_weights(mlp.init_weights(*task.spaces(), hidden=[64, 64], seed=1, zero_output=False).to_bytes())
    obs = np.random.default_rng(0).normal(size=(37, 8)).astype(np.float32)
    batch = net.outputs(obs)
    assert all((batch[i] == net.output(obs[i])).all() for i in range(len(obs)))
    assert net.act_batch(obs).tolist() == [net.act(o) for o in obs]


def test_a_hanging_episode_stops_its_batch_within_the_timeout():
    """A policy that hangs in one episode of a batch: the round stops at the timeout, and the batch's unfinished
    episodes run again one at a time, as they would alone: the hanging one times out (so a hang costs two timeouts,
    not a multiple of the batch), every other one did nothing wrong and gets its own result, and the next candidate
    runs."""
    source = hangs((2,), at_step=20)
    good = _program(LINEAR)
    with ProcessExecutor(workers=1, episode_timeout_s=4, lockstep=16) as ex:
        t0 = time.monotonic()
        eps = ex.run(CARTPOLE, [Job(_program(source), s) for s in range(14)] + [Job(good, 0)])
        took = time.monotonic() - t0
    assert took < 40, took  # two timeouts and the episodes (about 6 s alone); a timeout per episode would be 56 s
    assert eps[2].error == "timeout after 4 s on seed 2" and eps[2].length == 19
    assert [e.error for e in eps[:2] + eps[3:]] == [None] * 14


def hangs(seeds: tuple[int, ...] | None, at_step: int) -> str:
    """A CartPole policy's source that hangs (sleeps 1000 s) at its ``at_step``-th action of an episode on one of
    ``seeds`` (every seed where None), and otherwise balances."""
    on = "" if seeds is None else f'STATE["seed"] in {seeds!r} and '
    return f"""
import time
PARAMETERS = {{}}
STATE = {{}}
def reset(params, seed):
    STATE["seed"], STATE["t"] = seed, 0
def act(obs, params):
    STATE["t"] += 1
    if {on}STATE["t"] == {at_step}:
        time.sleep(1000)
    return int(obs[2] + obs[3] > 0)
"""


def test_an_episode_hanging_on_its_first_observation_is_the_only_one_timed_out():
    """The first round of a batch asks one episode alone: a policy that hangs on that observation is that episode's
    timeout, and the batch's other episodes (started beside it, or not yet) each run for a result of their own, the
    returns they get with no hang anywhere (`ratchet evaluate --timeout` on a policy hanging on one seed)."""
    honest = _program(hangs((), at_step=1))
    with ProcessExecutor(workers=1, episode_timeout_s=3, lockstep=16) as ex:
        eps = ex.run(CARTPOLE, [Job(_program(hangs((0,), at_step=1)), s) for s in range(5)])
        alone = ex.run(CARTPOLE, [Job(honest, s) for s in range(1, 5)])
    assert eps[0].error == "timeout after 3 s on seed 0" and eps[0].length == 0
    assert [(e.error, e.episode_return, e.length) for e in eps[1:]] == [
        (None, e.episode_return, e.length) for e in alone]


def test_a_policy_hanging_on_every_seed_costs_two_timeouts():
    """Once a candidate has timed out twice (a hang on more than one seed), the rest of its batch is skipped, so a
    policy that hangs everywhere costs two timeouts, not one per episode."""
    source = hangs(None, at_step=1)
    with ProcessExecutor(workers=1, episode_timeout_s=2, lockstep=16) as ex:
        eps = ex.run(CARTPOLE, [Job(_program(source), s) for s in range(6)])
    assert [e.error for e in eps[:2]] == ["timeout after 2 s on seed 0", "timeout after 2 s on seed 1"]
    assert all(e.error == "skipped: timeout after 2 s on seed 1" for e in eps[2:])


def test_a_slow_policy_is_not_timed_out_for_answering_a_whole_round():
    """A policy taking 0.2 s per action, 16 episodes of 5 steps and a 2.5 s timeout: a round of all 16 would take
    3.2 s, but rounds grow only while they take under a tenth of the timeout, so no episode times out (each has
    1.5 s to spare: a loaded machine may leave a process unscheduled for a second)."""
    source = """
import time
PARAMETERS = {}
def act(obs, params):
    time.sleep(0.2)
    return int(obs[2] > 0)
"""
    task = GymTask("CartPole-v1", max_episode_steps=5)
    with ProcessExecutor(workers=1, episode_timeout_s=2.5, lockstep=16) as ex:
        eps = ex.run(task, [Job(_program(source), s) for s in range(16)])
    assert [e.error for e in eps] == [None] * 16
    assert all(e.length == 5 for e in eps)


def test_a_batch_starts_only_when_its_worst_case_fits_the_env_step_cap():
    """With ``max_env_steps`` a batch is sized so that even if every episode runs to the time limit the cap holds."""
    task = GymTask("CartPole-v1", max_episode_steps=50)
    with ProcessExecutor(workers=2, episode_timeout_s=60, lockstep=16) as ex:
        eps = ex.run(task, [Job(_program(LINEAR), s) for s in range(40)], max_env_steps=730)
    assert sum(e.length for e in eps) <= 730
    ran = [e for e in eps if e.error is None]
    assert len(ran) == 14 and all(e.error == "skipped: env-step budget used" for e in eps if e.error)


def test_lockstep_setting_is_checked():
    from ratchet.errors import RatchetError

    with pytest.raises(RatchetError, match="lockstep must be an int from 1 to 4096"):
        ProcessExecutor(workers=1, lockstep=0)


def test_round_messages_round_trip_and_bad_answers_are_refused():
    """The round message carries new, ended and asked slots; an answer that is not n actions is refused."""
    from ratchet.execution.protocol import (
        BadReply,
        SlotFailure,
        decode_actions,
        decode_round,
        encode_actions,
        encode_round,
    )
    from ratchet.rollout import Opaque, PolicyFailure

    obs = [np.arange(4, dtype=np.float32) + i for i in range(3)]
    new, done, slots, got = decode_round(encode_round([(2, 7)], [0], [1, 2, 5], obs, True), (np.dtype(np.float32), (4,)))
    assert (new, done, slots) == ([(2, 7)], [0], [1, 2, 5]) and np.array_equal(got, np.stack(obs))
    assert decode_actions(encode_actions([1, 0, 1], 3), 3) == [1, 0, 1]
    mixed = decode_actions(encode_actions([1, SlotFailure("policy raised X", "boom", start=True), "left"], 3), 3)
    assert mixed[0] == 1 and isinstance(mixed[1], PolicyFailure) and mixed[1].start and isinstance(mixed[2], Opaque)
    rows = decode_actions(encode_actions(np.ones((3, 2)), 3), 3)
    assert len(rows) == 3 and rows[0].shape == (2,)
    for bad in (b"", b"A", b"Ax", b"Al\x02\x00\x00\x00", encode_actions([1, 2], 2), b"\x80pickle"):
        with pytest.raises((BadReply, PolicyFailure)):
            decode_actions(bad, 3)


def test_a_batch_keeps_state_only_for_running_episodes():
    """The policy process drops an episode's module instance when the env host says it ended, so a batch of many
    seeds holds at most a width's worth of policy instances."""
    from ratchet.execution.worker import _Batch, _Policies

    policies = _Policies()
    policies.sources["k"] = "PARAMETERS = {}\nBIG = bytearray(10)\ndef act(obs, params):\n    return 0\n"
    task = GymTask("CartPole-v1")
    batch = _Batch(policies, "k", {}, task.spaces(), ("act",), None)
    obs = np.zeros((2, 4), dtype=np.float32)
    batch.act([(0, 1), (1, 2)], [], [0, 1], obs)
    assert set(batch.instances) == {0, 1}
    batch.act([(2, 3)], [0], [1, 2], obs)
    assert set(batch.instances) == {1, 2}


def test_act_batch_failing_midway_fails_only_the_round_and_keeps_the_steps():
    """act_batch raising after many rounds errs the round's episodes with the steps they took; episodes that had
    finished stand (the env-step cap counts every step)."""
    source = LINEAR + """
SEEN = [0]
def act_batch(observations, params):
    SEEN[0] += len(observations)
    if SEEN[0] > 1500:
        raise ValueError("tired")
    return (observations @ params["w"] > 0).astype(int)
"""
    task = GymTask("CartPole-v1", max_episode_steps=300)
    with ProcessExecutor(workers=1, episode_timeout_s=60, lockstep=4) as ex:
        eps = ex.run(task, [Job(_program(source), s) for s in range(8)])
    ok, failed = [e for e in eps if e.error is None], [e for e in eps if e.error]
    assert ok and failed and all(re.fullmatch(r"policy raised ValueError: tired \(policy line \d+\)", e.error or "")
                                   and e.length > 0 for e in failed)
    assert sum(e.length for e in eps) == 1499  # every observation answered before the failing round was a step


def test_a_slow_phase_after_fast_rounds_reruns_the_batch_one_at_a_time():
    """A policy fast for 20 steps and then 0.25 s on one action: rounds had grown to all 12 episodes (3 s > the 2.5 s
    timeout), so the batch is rerun one episode at a time, where each episode fits its own timeout."""
    source = """
import time
PARAMETERS = {}
STATE = {}
def reset(params, seed):
    STATE["t"] = 0
def act(obs, params):
    STATE["t"] += 1
    if STATE["t"] == 20:
        time.sleep(0.25)
    return int(obs[2] + obs[3] > 0)
"""
    task = GymTask("CartPole-v1", max_episode_steps=30)
    with ProcessExecutor(workers=1, episode_timeout_s=2.5, lockstep=16) as ex:
        eps = ex.run(task, [Job(_program(source), s) for s in range(12)])
    assert [e.error for e in eps] == [None] * 12


def test_each_episode_gets_its_own_copy_of_the_spaces():
    """A policy seeding ACTION_SPACE in reset and sampling from it gets the episodes it gets alone."""
    source = """
PARAMETERS = {}
def reset(params, seed):
    ACTION_SPACE.seed(seed)
def act(obs, params):
    return int(ACTION_SPACE.sample()) if abs(obs[2]) < 0.02 else int(obs[2] + obs[3] > 0)
"""
    alone, together = _both(CARTPOLE, [Job(_program(source), s) for s in range(6)])
    assert together == alone


def test_a_start_failure_claimed_mid_episode_keeps_the_steps_taken():
    """Policy code can make its process answer any round with a failure "at the start" of an episode; once the env
    host has stepped that episode the claim is ignored: the episode keeps the env steps taken and the return earned
    before the error (so the env-step count and cap hold), as the same failure one at a time does."""
    source = """
from ratchet.execution.protocol import SlotFailure
PARAMETERS = {}
STATE = {}
def reset(params, seed):
    STATE["t"] = 0
def act(obs, params):
    STATE["t"] += 1
    if STATE["t"] == 40:
        return SlotFailure("policy failed to load", "not me", start=True)
    return int(obs[2] + obs[3] > 0)
"""
    task = GymTask("CartPole-v1", max_episode_steps=300)
    with ProcessExecutor(workers=1, episode_timeout_s=60, lockstep=4) as ex:
        eps = ex.run(task, [Job(_program(source), s) for s in range(4)])
    assert [(e.length, e.episode_return) for e in eps] == [(39, 39.0)] * 4, [(e.length, e.error) for e in eps]
    assert all(e.error == "policy failed to load: not me" for e in eps)


def test_a_policy_reaching_the_global_generators_by_no_name_gets_its_own_episode_draws():
    """Isolation in a batch rests on what the policy does, not on the names in its code: a program that reaches
    NumPy's and Python's process-wide generators through names built at run time (the scan of names sees none)
    still gets, in a batch, the draws its episodes get alone."""
    source = """
PARAMETERS = {}
NP = getattr(__import__("numpy"), "".join(["ran", "dom"]))
PY = __import__("".join(["ran", "dom"]))
def act(obs, params):
    if abs(obs[2]) < 0.02:
        return int(NP.rand() < 0.5)
    if abs(obs[3]) < 0.05:
        return int(getattr(PY, "".join(["ran", "dom"]))() < 0.5)
    return int(obs[2] + obs[3] > 0)
"""
    from ratchet.policy import uses_global_random

    assert not uses_global_random(compile(source, "<policy>", "exec"))
    alone, together = _both(CARTPOLE, [Job(_program(source), s) for s in range(6)])
    # the batch's attempts were rerun one at a time: the steps they took count in the budget (Episode.env_steps)
    lost = [e["diagnostics"].pop("lost_env_steps", 0) for e in together]
    assert together == alone
    assert sum(lost) > 0 and not any("lost_env_steps" in e["diagnostics"] for e in alone)
    assert len({e["length"] for e in alone}) > 1


def test_a_write_to_builtins_reaches_no_other_episode():
    """Each episode's module resolves its bare names in a builtins namespace of its own, as it was before any policy
    code ran: a name one episode writes there (through ``__builtins__`` or the ``builtins`` module) is not seen by
    another episode of the batch, nor by a later episode one at a time."""
    source = """
import builtins
PARAMETERS = {}
LEAKED = []
def act(obs, params):
    if not LEAKED:
        try:
            LEAKED.append(MARK)
        except NameError:
            LEAKED.append(None)
    builtins.MARK = 1
    __builtins__["MARK"] = 1
    return 0 if LEAKED[0] is not None else int(obs[2] + obs[3] > 0)
"""
    alone, together = _both(CARTPOLE, [Job(_program(source), s) for s in range(6)])
    assert together == alone
    assert all(e["length"] > 30 and e["error"] is None for e in alone), [e["length"] for e in alone]


def test_a_batch_answers_one_at_a_time_when_policy_code_changes_the_generators_beside_another_episode():
    """The policy process watches what policy code does to the process-wide generators, not what its code names:
    a draw while another episode runs (in ``act`` or in ``reset``) turns the round's answer into ONE_AT_A_TIME
    (the env host decodes it as a "solo" abort); a draw by the only running episode, and a policy that never draws,
    are answered as usual."""
    from ratchet.execution.protocol import ONE_AT_A_TIME, decode_actions
    from ratchet.execution.worker import _Batch, _Policies
    from ratchet.rollout import RolloutAborted

    draws = 'PARAMETERS = {}\nR = getattr(__import__("numpy"), "".join(["ran", "dom"]))\n' \
            'def act(obs, params):\n    return int(R.rand() < 0.5)\n'
    drawing_reset = 'PARAMETERS = {}\nimport importlib\nR = importlib.import_module("".join(["ran", "dom"]))\n' \
                    'def reset(params, seed):\n    R.getrandbits(8)\ndef act(obs, params):\n    return 0\n'
    task = GymTask("CartPole-v1")
    obs = np.zeros((2, 4), dtype=np.float32)

    def batch(source):
        policies = _Policies()
        policies.sources["k"] = source
        return _Batch(policies, "k", {}, task.spaces(), ("act",), None)

    b = batch(draws)
    assert b.width > 1  # the scan of names sees nothing
    assert b.act([(0, 1)], [], [0], obs[:1]) != ONE_AT_A_TIME  # alone in the batch: its draws are its own
    assert b.act([(1, 2)], [], [0, 1], obs) == ONE_AT_A_TIME
    assert batch(drawing_reset).act([(0, 1), (1, 2)], [], [0, 1], obs) == ONE_AT_A_TIME
    honest = batch(LINEAR)
    for _ in range(3):
        assert honest.act([(i, i) for i in range(2)] if _ == 0 else [], [], [0, 1], obs) != ONE_AT_A_TIME
    with pytest.raises(RolloutAborted) as info:
        decode_actions(ONE_AT_A_TIME, 2)
    assert info.value.status == "solo"


def test_reading_the_global_generators_sees_every_change():
    import random

    from ratchet.execution.worker import _generators

    g = _generators()
    before = g.read()
    assert g.read() == before
    for change in (lambda: np.random.rand(), lambda: random.random(), lambda: random.seed(5),
                   lambda: np.random.seed(5), lambda: np.random.set_state(np.random.get_state()[:1] + (
                       np.roll(np.random.get_state()[1], 1),) + np.random.get_state()[2:])):
        change()
        after = g.read()
        assert after != before
        before = after
    saved = np.random.get_bit_generator()
    try:
        np.random.set_bit_generator(np.random.MT19937(0))
        assert g.read() != g.read()
    finally:
        np.random.set_bit_generator(saved)
    assert g.read() == g.read()


def test_an_env_that_raises_is_the_tasks_fault_not_the_candidates(data_envs):
    """With trusted rollouts the env runs where no policy code reaches it: what it raises in ``step`` or ``reset``
    is the task's fault (one line naming the seed, the step, the env and what it raised), alone and in lockstep;
    the candidate's episodes carry no error of their own."""
    cand = _program(LINEAR)
    for env_id, where, call, raised in (("RatchetStepRaises-v0", "after 4 steps", "env.step()",
                                         "RuntimeError in env.step(): env bug in step"),
                                        ("RatchetResetRaises-v0", "at reset", "env.reset()",
                                         "ValueError in env.reset(): env bug in reset")):
        task = GymTask(f"ratchet_test_envs:{env_id}")
        alone, together = _both(task, [Job(cand, s) for s in range(3)], lockstep=4)
        assert together == alone
        for s, e in enumerate(alone):
            assert e["diagnostics"] == {"cause": "error", "fault": "task"}, e
            assert e["error"] == f"environment error on seed {s} {where}: ratchet_test_envs:{env_id} raised {raised}"
            assert "policy" not in e["error"] and call in e["error"]


def test_an_env_that_raises_in_process_stays_the_episodes_error(data_envs):
    """With ``trusted_rollouts = false`` policy code shares the env's process and could have tampered with it: what
    the env raises stays the episode's error, as before."""
    from ratchet.execution.sandbox import Sandbox

    cand = _program(LINEAR)
    for env_id, error in (("RatchetStepRaises-v0", "policy raised RuntimeError: env bug in step"),
                          ("RatchetResetRaises-v0", "policy raised ValueError: env bug in reset")):
        task = GymTask(f"ratchet_test_envs:{env_id}")
        with ProcessExecutor(workers=1, episode_timeout_s=60, sandbox=Sandbox(trusted_rollouts=False)) as ex:
            eps = ex.run(task, [Job(cand, s) for s in range(2)])
        assert [e.error for e in eps] == [error] * 2
        assert not any(e.diagnostics.get("fault") for e in eps)


def test_an_env_that_cannot_be_made_for_an_isolated_policy_is_the_tasks_fault():
    """The env host makes a fresh env per episode; when that fails (with trusted rollouts: no policy code in the
    process) the episode is the task's fault, alone and in a batch, and no policy code is asked."""

    class Isolated:  # a policy handle in a process of its own; asking it anything would fail the test
        isolated = True

    task = GymTask("CartPole-v1", env_kwargs={"no_such_setting": 1})
    made = "raised ratchet.errors.TaskError in gymnasium.make: cannot make CartPole-v1 with env_kwargs"
    for s, ep in [(3, task.run_episode(Isolated(), {}, 3)), *zip((1, 2), task.run_batch(Isolated(), {}, [1, 2], 2, 9))]:
        assert ep.diagnostics == {"cause": "error", "fault": "task"}
        assert ep.error.startswith(f"environment error on seed {s} making it: CartPole-v1 {made}"), ep.error
