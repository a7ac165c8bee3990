"""Scheduling efficiency without a big machine: how busy a whole run keeps many workers whose episodes cost wall
clock but no CPU.

The environment (``SleepyLander-v0``, registered by this module) sleeps a fixed time per env step (``--step-ms``,
default 10 ms) and does almost nothing else, so 64 workers fit on 2 cores. Its episode lengths are drawn per seed in
the shape of the LunarLander heuristic's (scaled to a 100-step limit): a quarter crash early (6–15 steps), most land
(lognormal around 28 steps) and one in ten hovers until the time limit (100 steps): heavy-tailed. The policy is a
linear program (``W @ obs``, argmax over 4 actions; 32 parameters for ``cmaes``), rewarded for matching a hidden
linear rule; the spec is ratchet's defaults otherwise (``decide = "every"``, 50 validation seeds, 100 test seeds).

For each worker count it runs a whole ratchet run (sandboxed workers, default process executor) and then exactly the
same episodes (read from its ledger; returns checked equal) in a plain thread pool of as many threads. Episode time
is an episode's env steps × the step time (the time the environment itself needs). Reported:

- **busy**: total episode time ÷ (workers × wall clock), the share of the wall clock workers were stepping episodes;
- **× ideal**: wall clock ÷ (total episode time ÷ workers);
- **start-up** apart: the run's workers are started (and have imported their libraries) before its clock starts, and
  that time is its own column (``start-up s``); the plain pool's threads cost nothing to start;
- where ratchet's idle worker-seconds go: **outside** the executor (the driver between ``executor.run`` calls:
  CMA-ES, the gate, the ledger, all workers idle), **barrier** (what a perfect list scheduler of each call's own
  episodes would still leave idle: ``W × max(episode time ÷ W, longest episode) − episode time`` — the per-call
  barrier, only an asynchronous loop removes it) and **executor** (the rest: the call's wall clock beyond that bound
  — dispatch order, lockstep batches, round trips, CPU contention);
- **machine CPU**: how busy the machine's cores were during the run (``/proc/stat``: every process, not only the
  run's): near 100 %, the workers' own CPU (a candidate's process started on each worker, the round trips) and the
  machine's other users set the pace, not the schedule.

``--ref GIT_REF`` also measures a git ref (its ``src`` exported to a temporary folder), each worker count's two runs
back to back, and checks both ledgers record the same evaluations.

``--overlap`` instead measures ``[planner] overlap_gate`` (a generation's validation in one executor call with the next
generation's training episodes): the working tree with CMA-ES on its own path (``follow = "own"``), the setting off
against on, each worker count's two runs back to back, and checks both runs took the same gate decisions.

``--executor ray`` runs the same on the Ray executor instead: a local Ray with as many CPUs as workers (each Ray worker
runs its sandboxed worker pair), its workers at normal priority (``RAY_worker_niceness=0``, as
``ray_throughput.py``); start-up is Ray's own, the node probe and a warm-up call of two one-episode tasks per CPU on
seeds the run never uses (so Ray's workers and their pairs are started), timed apart. Needs the ``ray`` extra.

Usage: python benchmarks/scheduling.py [--workers 16 32 64] [--env-steps 20000] [--step-ms 10] [--ref REF | --overlap]
[--repeats N] [--executor process|ray] [--write]
"""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np

# this module is imported by every worker's env host (``env_id = "scheduling:SleepyLander-v0"``): only Gymnasium and
# NumPy at its top; ratchet is imported where the benchmark itself runs

MAX_STEPS = 100
ENV_ID = "SleepyLander-v0"
_RULE = np.random.default_rng(12345).normal(size=(4, 8))  # the hidden rule the reward asks actions to follow


def episode_length(seed: int) -> int:
    """The env steps of the episode on ``seed`` (whatever the policy does): LunarLander's shape, a 100-step limit."""
    rng = np.random.default_rng([seed, 7])
    u = rng.random()
    if u < 0.25:  # a crash
        return int(rng.integers(6, 16))
    if u < 0.9:  # a landing
        return int(min(MAX_STEPS - 1, max(16, round(rng.lognormal(math.log(28), 0.35)))))
    return MAX_STEPS  # hovering until the time limit


class SleepyLander(gym.Env):
    """Observations are 8 normal draws; reward 1 for the action the hidden rule picks, else -0.25; each step sleeps
    ``step_s`` seconds. The episode ends after :func:`episode_length` steps (terminated; the time limit truncates)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(8,), dtype=np.float32)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, step_s: float = 0.01) -> None:
        self.step_s = float(step_s)
        self._rng = np.random.default_rng(0)
        self._left, self._obs = 0, np.zeros(8, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._rng = np.random.default_rng(seed)
        n = episode_length(int(seed or 0))
        self._left = n if n < MAX_STEPS else MAX_STEPS + 1  # hovering: the time limit truncates it
        self._obs = self._rng.normal(size=8).astype(np.float32)
        return self._obs, {}

    def step(self, action):
        time.sleep(self.step_s)
        reward = 1.0 if int(action) == int(np.argmax(_RULE @ self._obs)) else -0.25
        self._left -= 1
        self._obs = self._rng.normal(size=8).astype(np.float32)
        return self._obs, reward, self._left <= 0, False, {}


if ENV_ID not in gym.registry:  # run as a script, this file is also imported as ``scheduling``: register once
    gym.register(id=ENV_ID, entry_point=SleepyLander, max_episode_steps=MAX_STEPS, reward_threshold=60.0)

POLICY = '''"""Linear: the action whose row of W scores the observation highest."""
import numpy as np

PARAMETERS = {"W": {"shape": ["act", "obs"], "default": 0.0, "low": -1.0, "high": 1.0}}


def act(observation, params):
    return int(np.argmax(params["W"] @ np.asarray(observation)))


def act_batch(observations, params):
    return [int(a) for a in np.argmax(np.asarray(observations) @ params["W"].T, axis=1)]
'''

SPEC = """name = "scheduling"
seed = {seed}

[task]
env_id = "scheduling:{env_id}"
env_kwargs = {{step_s = {step_s}}}

[policy]
path = "policy.py"

[refiner]
sigma0 = 0.3
{follow}
[budget]
env_steps = {env_steps}

[execution]
workers = {workers}
{planner}"""


def measure(workers: int, env_steps: int, step_s: float, seed: int, pool: bool, overlap: bool | None = None,
            executor: str = "process") -> dict:
    """One whole run with ``workers`` workers (their start-up timed apart), instrumented, on the ``executor`` backend
    (``"process"`` or ``"ray"``); with ``pool``, then its episodes in a plain thread pool; with ``overlap`` (True or
    False), CMA-ES on its own path (``follow = "own"``) and ``[planner] overlap_gate = overlap``. Returns the figures as
    a dict (see :func:`summarize`)."""
    import os
    import tempfile
    from pathlib import Path

    from ratchet.execution import Job
    from ratchet.execution.process import ProcessExecutor
    from ratchet.ledger.events import EventType
    from ratchet.ledger.sqlite import SQLiteLedger
    from ratchet.loop import start_run
    from ratchet.spec import load_spec
    from ratchet.tasks import task_from_spec

    calls: list[dict] = []

    base: type = ProcessExecutor
    if executor == "ray":
        os.environ.setdefault("RAY_worker_niceness", "0")  # Ray's workers at the process pool's priority
        from ratchet.execution.ray_executor import RayExecutor

        base = RayExecutor

    class Instrumented(base):  # type: ignore[misc,valid-type]
        """The executor, timing each ``run`` call and each episode's finish (behaviour unchanged)."""

        def run(self, task, jobs, on_episode=None, *args, **kwargs):
            call = {"t0": time.perf_counter(), "jobs": [(j.candidate.id, j.seed) for j in jobs], "lengths": []}

            def seen(i, ep):
                call["lengths"].append(ep.length)
                if on_episode is not None:
                    on_episode(i, ep)

            try:
                return super().run(task, jobs, seen, *args, **kwargs)
            finally:
                call["t1"] = time.perf_counter()
                calls.append(call)

    with tempfile.TemporaryDirectory() as tmp:
        spec_dir = Path(tmp) / "spec"
        spec_dir.mkdir()
        (spec_dir / "policy.py").write_text(POLICY)
        own = overlap is not None
        (spec_dir / "ratchet.toml").write_text(SPEC.format(
            seed=seed, env_id=ENV_ID, step_s=step_s, env_steps=env_steps, workers=workers,
            follow='follow = "own"\n' if own else "",
            planner=f"\n[planner]\noverlap_gate = {str(overlap).lower()}\n" if own else ""))
        spec = load_spec(spec_dir)
        t0 = time.perf_counter()
        ex = Instrumented(workers=workers, episode_timeout_s=spec.execution.episode_timeout_s)
        try:
            if executor == "ray":  # start-up apart: Ray, its probe, and two one-episode tasks per CPU (pairs started)
                from ratchet.policy import load_policy, space_dims

                env = gym.make(ENV_ID, step_s=step_s)
                warm = load_policy(spec_dir / "policy.py", dims=space_dims(env.observation_space, env.action_space))
                ex.batch_episodes = 1
                ex.run(task_from_spec(spec.task), [Job(warm.candidate(), 10**6 + k) for k in range(2 * workers)])
                ex.batch_episodes = spec.execution.batch_episodes
                calls.clear()
            else:
                ex._ensure_workers(workers)  # start-up apart: every pair started and ready (libraries imported)
            startup = time.perf_counter() - t0
            t0, cpu0 = time.perf_counter(), _machine_cpu()
            start_run(spec, Path(tmp) / "runs", "sched", executor=ex)
            wall, cpu1 = time.perf_counter() - t0, _machine_cpu()
        finally:
            ex.close()
        events = SQLiteLedger(Path(tmp) / "runs" / "sched" / "ledger.sqlite", readonly=True).read()
    evals = [e.payload for e in events if e.type is EventType.EPISODES_EVALUATED]
    split_of = {(p["candidate_id"], s): p["split"] for p in evals for s in p["seeds"]}
    ledger = sorted([p["split"], p["candidate_id"], [[x["seed"], x["length"], x["episode_return"]] for x in p["episodes"]]]
                    for p in evals)
    cpu = (cpu1[1] - cpu0[1]) / (cpu1[0] - cpu0[0]) if cpu0 and cpu1 and cpu1[0] > cpu0[0] else None
    gates = [[e.payload["generation"], e.payload["candidate_id"], e.payload["promoted"]] for e in events
             if e.type is EventType.GATE_DECIDED]
    out = {"workers": workers, "step_s": step_s, "startup_s": startup, "wall_s": wall, "ledger": ledger, "cpu": cpu,
           "gates": gates,
           "calls": [{"split": split_of.get(c["jobs"][0], "?") if c["jobs"] else "?", "wall_s": c["t1"] - c["t0"],
                      "t0": c["t0"], "lengths": c["lengths"]} for c in calls]}
    if pool:
        out["pool"] = plain_pool(evals, events, workers, step_s)
    return out


def _machine_cpu() -> tuple[int, int] | None:
    """(all, busy) CPU time of the whole machine so far, in clock ticks (Linux's ``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks), sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait


def plain_pool(evals: list[dict], events: list, workers: int, step_s: float) -> dict:
    """The run's episodes (every evaluation, in ledger order) in a ``ThreadPool(workers)``: each thread makes the env,
    calls the policy directly (no sandbox, no ledger, no barrier); returns checked equal to the ledger's."""
    from multiprocessing.pool import ThreadPool

    from _common import plain_episode

    from ratchet.execution import BUDGET_SKIP
    from ratchet.ledger.events import EventType
    from ratchet.policy import compile_policy

    started = next(e for e in events if e.type is EventType.RUN_STARTED).payload
    cands = {started["start_candidate"]["id"]: started["start_candidate"]["params"]}
    cands.update({e.payload["candidate"]["id"]: e.payload["candidate"]["params"] for e in events
                  if e.type is EventType.CANDIDATE_PROPOSED})
    # an episode the env-step cap skipped never ran (a generation the cap cuts short)
    jobs = [(cands[p["candidate_id"]], x["seed"], x["episode_return"]) for p in evals for x in p["episodes"]
            if x["error"] != BUDGET_SKIP]
    source = started["policy_source"]

    def one(job):
        params, seed, _ = job
        module = compile_policy(source)  # a module of its own per episode, as a fresh worker's
        return plain_episode(module, gym.make(ENV_ID, step_s=step_s), params, seed)

    t0 = time.perf_counter()
    with ThreadPool(workers) as tp:
        got = tp.map(one, jobs, chunksize=1)
    wall = time.perf_counter() - t0
    assert [r for r, _ in got] == [r for _, _, r in jobs], "the plain pool's returns differ from the ledger's"
    return {"wall_s": wall, "steps": sum(n for _, n in got)}


def summarize(m: dict) -> dict:
    """Busy share, × ideal and where the idle worker-seconds go, from :func:`measure`'s figures."""
    w, step = m["workers"], m["step_s"]
    busy = step * sum(sum(c["lengths"]) for c in m["calls"])
    inside = sum(c["wall_s"] for c in m["calls"])
    barrier = executor = 0.0
    for c in m["calls"]:
        work = step * sum(c["lengths"])
        bound = max(work / w, step * max(c["lengths"], default=0))
        barrier += w * bound - work
        executor += w * (c["wall_s"] - bound)
    idle = w * m["wall_s"] - busy
    out = {"busy": busy / (w * m["wall_s"]), "x_ideal": m["wall_s"] / (busy / w), "episode_s": busy,
           "outside": w * (m["wall_s"] - inside) / idle, "barrier": barrier / idle, "executor": executor / idle}
    if "pool" in m:
        p = m["pool"]
        pool_busy = step * p["steps"]
        out["pool_busy"], out["pool_x_ideal"] = pool_busy / (w * p["wall_s"]), p["wall_s"] / (pool_busy / w)
    by_split: dict[str, list[float]] = {}
    for c in m["calls"]:
        work = step * sum(c["lengths"])
        acc = by_split.setdefault(c["split"], [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += c["wall_s"]
        acc[2] += work
    out["splits"] = {k: {"calls": v[0], "wall_s": v[1], "busy": v[2] / (w * v[1]) if v[1] else 0.0}
                     for k, v in by_split.items()}
    return out


def _child(args) -> None:
    import json
    import sys

    overlap = None if args.overlap_gate is None else bool(args.overlap_gate)
    out = measure(args.one, args.env_steps, args.step_ms / 1000, args.seed, not args.no_pool, overlap, args.executor)
    sys.stdout.write("\n" + json.dumps(out) + "\n")  # a line of its own


def main() -> None:
    import argparse
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from _common import machine, write_section

    root = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--env-steps", type=int, default=20_000, help="the run's budget (env steps)")
    ap.add_argument("--step-ms", type=float, default=10.0, help="wall clock each env step sleeps (ms)")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed")
    ap.add_argument("--ref", help="a git ref to measure beside the working tree (e.g. the commit before a change)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each (code, workers), interleaved; the table shows "
                    "the one of median wall clock")
    ap.add_argument("--overlap", action="store_true", help="measure [planner] overlap_gate instead: the working tree "
                    "with CMA-ES on its own path (follow = \"own\"), overlap_gate off against on")
    ap.add_argument("--executor", choices=["process", "ray"], default="process",
                    help="the backend the run's episodes go to (ray: a local Ray with as many CPUs as workers)")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--overlap-gate", type=int, choices=(0, 1), help=argparse.SUPPRESS)  # internal, with --one
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one measurement, as JSON on stdout
    ap.add_argument("--no-pool", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return _child(args)
    here = Path(__file__).resolve()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "src"], check=False, capture_output=True,
                               text=True).stdout.strip()
        tree = f"working tree ({head}{' + changes' if dirty else ''})" if head else "working tree"
        codes = [(tree, root / "src")]
        gate_of: dict[str, list[str]] = {tree: []}
        if args.overlap:
            codes = [("overlap_gate = false", root / "src"), ("overlap_gate = true", root / "src")]
            gate_of = {"overlap_gate = false": ["--overlap-gate", "0"], "overlap_gate = true": ["--overlap-gate", "1"]}
        elif args.ref:  # its src only, exported (no worktree registered)
            archive = subprocess.run(["git", "-C", str(root), "archive", args.ref, "src"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            codes.insert(0, (args.ref, Path(tmp) / "src"))
        for w in args.workers:
            runs: dict[str, list] = {name: [] for name, _ in codes}
            for r in range(args.repeats):
                got = {}
                for k, (name, src) in enumerate(codes):
                    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(here.parent)])}
                    pool = k == len(codes) - 1 and r == args.repeats // 2  # the plain pool once, beside the median
                    cmd = [sys.executable, str(here), "--one", str(w), "--env-steps", str(args.env_steps), "--step-ms",
                           str(args.step_ms), "--seed", str(args.seed), "--executor", args.executor]
                    cmd += ([] if pool else ["--no-pool"]) + gate_of.get(name, [])
                    res = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
                    if res.returncode:
                        sys.exit(f"{name}, {w} workers failed:\n{res.stderr[-3000:]}")
                    got[name] = json.loads(res.stdout.strip().splitlines()[-1])  # the last line: Ray may print before
                    runs[name].append(got[name])
                    print(_row(name, got[name], summarize(got[name])), flush=True)
                if len(got) == 2 and args.overlap:  # the same decisions (overlap also runs a promoted-away reference)
                    a, b = (got[name]["gates"] for name, _ in codes)  # the budget may end one a gate sooner
                    assert a[:len(b)] == b[:len(a)], f"{w} workers: overlap_gate changed the gate's decisions"
                elif len(got) == 2:
                    a, b = (got[name]["ledger"] for name, _ in codes)
                    assert a == b, f"{w} workers: the two checkouts' ledgers record different evaluations"
            for name, _ in codes:
                ms = sorted(runs[name], key=lambda m: m["wall_s"])
                median = ms[len(ms) // 2]
                pools = [m["pool"] for m in ms if "pool" in m]
                if pools:
                    median = {**median, "pool": pools[0]}
                rows.append((name, median, summarize(median)))
    header = ("| code | workers | start-up s | run s | ideal s | busy | × ideal | idle: outside / barrier / executor "
              "| machine CPU | thread pool s | pool busy | pool × ideal |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    table = header + "\n" + "\n".join(_row(*r) for r in rows)
    splits = _splits(rows)
    print("\n" + table + "\n\n" + splits)
    if args.write:
        cmd = ("python benchmarks/scheduling.py --workers " + " ".join(map(str, args.workers))
               + f" --env-steps {args.env_steps} --step-ms {args.step_ms:g}" + (f" --ref {args.ref}" if args.ref else "")
               + (f" --repeats {args.repeats}" if args.repeats > 1 else "") + (" --overlap" if args.overlap else "")
               + (" --executor ray" if args.executor == "ray" else "") + " --write")
        ray = args.executor == "ray"
        write_section("The gate beside the next generation ([planner] overlap_gate)" if args.overlap else
                      "Scheduling efficiency on Ray" if ray else "Scheduling efficiency without a big machine", (
            f"Command: `{cmd}` — a whole run (defaults, `decide = \"every\"`, sandboxed workers under bubblewrap"
            + (", on a local Ray with as many CPUs as workers, Ray's workers at nice 0" if ray else "") + ") on an "
            f"environment whose steps sleep {args.step_ms:g} ms and cost almost no CPU, episode lengths drawn per seed "
            "in LunarLander's shape; then the same episodes in a plain `ThreadPool` of as many threads. Start-up ("
            + ("Ray's, its node probe and a warm-up call of two one-episode tasks per CPU" if ray
               else "every worker pair started and ready") + ") is timed apart and not in `run s`"
            + (f"; each row is the run of median wall clock of {args.repeats}, the two codes' runs interleaved"
               if args.repeats > 1 else "") + ". `idle` splits ratchet's idle "
            "worker-seconds: the driver outside `executor.run`, the per-call barrier (what a perfect scheduler of each "
            "call's episodes still leaves idle) and the executor's own share. `machine CPU`: how busy the machine's "
            "cores were during the run (every process on it, not only the run's).\n\n"
            f"Machine: {machine()}\n\n{table}\n\n{splits}\n"))


def _row(name: str, m: dict, s: dict) -> str:
    pool = (f"{m['pool']['wall_s']:.1f} | {s['pool_busy']:.0%} | {s['pool_x_ideal']:.2f}" if "pool" in m
            else "| |")
    return (f"| {name} | {m['workers']} | {m['startup_s']:.1f} | {m['wall_s']:.1f} | {s['episode_s'] / m['workers']:.1f} "
            f"| {s['busy']:.0%} | {s['x_ideal']:.2f} | {s['outside']:.0%} / {s['barrier']:.0%} / {s['executor']:.0%} "
            f"| {'' if m.get('cpu') is None else format(m['cpu'], '.0%')} | {pool} |")


def _splits(rows: list) -> str:
    """Per split (calls, wall clock, busy share inside the executor), each row's."""
    names = ["validation", "train", "test"]
    out = ["| code | workers | " + " | ".join(f"{n}: calls, s, busy" for n in names) + " |",
           "|---|---|" + "---|" * len(names)]
    for name, m, s in rows:
        cells = []
        for n in names:
            x = s["splits"].get(n)
            cells.append(f"{x['calls']}, {x['wall_s']:.1f}, {x['busy']:.0%}" if x else "")
        out.append(f"| {name} | {m['workers']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
