"""ratchet vs hand-written search loops at equal env-step budgets, judged on ratchet's test seeds.

Competitors (each searches the example's parameters in the same normalised coordinates as ratchet's CMA-ES
refiner, ``Parameter.to_unit``: each parameter mapped to [0, 1] within its bounds, in log space for
``scale = "log"``; same starting values, the policy file's defaults):

- ``ratchet``: ``start_run`` on the example's spec with its default settings (and the budget below).
- ``ratchet-screen`` (not run unless named): the same with ``[model] screen = true`` (issue 45's world-model screen)
  and any further ``[model]`` keys given by ``--model``; its result (printed and in ``--results``) keeps the screen's
  account, ``RunState.world_model()``: rank correlation, proposals not run, whether it switched itself off.
- ``pycma``: a plain pycma ask/tell loop, the same ``sigma0`` and population size as ratchet's refiner; every
  candidate is scored by its mean return on ``train_episodes`` fresh training seeds (the spec's
  ``[refiner] train_episodes``, shared by the generation); it returns its best-by-training candidate.
- ``optuna-cmaes`` / ``optuna-tpe``: Optuna's ``CmaEsSampler`` (``x0`` the defaults, the same ``sigma0``) and
  ``TPESampler``; one trial = the mean return over ``train_episodes`` fresh training seeds; the starting policy
  is enqueued as the first trial; trials are asked in batches of the population size so both workers stay busy;
  returns the study's best trial.

Every competitor's episodes run under the executor's hard env-step cap (``max_env_steps``, the budget left), which
skips an episode that could take the total over the budget; a candidate with a skipped episode is not scored, and
the search ends with the first batch that had one. No env step is spent on validation. Policy code of every competitor runs in ratchet's executor (the same sandboxed
worker processes as ratchet's own runs, ``[execution]`` of the spec), on seeds of ratchet's training split
(``SeedSplits(run seed)``), so no competitor ever sees a validation or test seed.

Judged on ratchet's test seeds of the same run seed (the spec's ``[test] episodes``): test mean of the returned
candidate; *regression*: it is significantly worse than the starting policy on the test seeds (one-sided paired
t-test, ``scipy.stats.ttest_rel(..., alternative="less")``, p < 0.05); *gap*: the return the competitor reports
for its pick (best training mean; for ratchet the incumbent's validation mean) minus its test mean.

Usage: python benchmarks/peers.py [--examples lunar_lander ...] [--seeds 0,1,2] [--budget NAME=STEPS ...]
       [--competitors ratchet,pycma,optuna-cmaes,optuna-tpe] [--model KEY=VALUE,...] [--results FILE.jsonl]
       [--write]
Needs the bench extra (``pip install -e ".[bench]"``) for Optuna.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import key_values, machine, write_section
from scipy import stats

from ratchet.execution import BUDGET_SKIP, Job, executor_from_spec
from ratchet.ledger.projection import project, world_model_text
from ratchet.loop import load_program, open_ledger, start_run
from ratchet.planner import SeedSplits
from ratchet.policy import Candidate, PolicyProgram
from ratchet.spec import RunSpec, load_spec
from ratchet.task import GymTask

ROOT = Path(__file__).resolve().parents[1]
#: Env-step budget per example (issue 9: lunar_lander and bipedal_walker at 1 M; the others at their spec's).
BUDGETS = {"lunar_lander": 1_000_000, "bipedal_walker": 1_000_000, "pendulum": None, "mountain_car_continuous": None}
COMPETITORS = ("ratchet", "ratchet-screen", "pycma", "optuna-cmaes", "optuna-tpe")


class Searcher:
    """Evaluates candidates for a competitor on fresh training seeds and counts env steps."""

    def __init__(self, spec: RunSpec, program: PolicyProgram, executor, budget: int) -> None:
        self.spec, self.program, self.executor, self.budget = spec, program, executor, budget
        self.task = GymTask.from_spec(spec.task)
        self.splits = SeedSplits(spec.seed)
        self.n_train = spec.refiner.train_episodes
        self.env_steps, self.next_seed = 0, 0
        self.best: tuple[float, Candidate] | None = None
        self.exhausted = False  # the executor's cap skipped an episode: the budget is spent

    def params(self, u: Sequence[float]) -> dict[str, float]:
        return {p.name: p.from_unit(float(x)) for p, x in zip(self.program.parameters, u)}

    def x0(self) -> list[float]:
        return [float(p.to_unit(p.default_value)) for p in self.program.parameters]

    def affordable(self) -> bool:
        """Whether any budget is left; the next batch is then capped exactly by the executor (episodes it cut
        short count as not run)."""
        return not self.exhausted and self.env_steps < self.budget

    def evaluate(self, points: Sequence[Sequence[float]]) -> list[float]:
        """Mean training return of each point on one batch of fresh training seeds (shared by the batch, like a
        ratchet generation). Episodes cut by the budget count as not run; a point whose episodes did not all
        run scores -inf and is never picked."""
        seeds = self.splits.seeds("train", self.next_seed, self.n_train)
        self.next_seed += self.n_train
        cands = [Candidate.create(self.program.source, self.params(u), refiner="peer") for u in points]
        jobs = [Job(c, s) for c in cands for s in seeds]
        eps = self.executor.run(self.task, jobs, max_env_steps=self.budget - self.env_steps)
        self.env_steps += sum(e.length for e in eps)
        self.exhausted = any(e.error == BUDGET_SKIP for e in eps)
        out = []
        for i, c in enumerate(cands):
            mine = eps[i * len(seeds):(i + 1) * len(seeds)]
            ok = all(e.error is None for e in mine)
            score = float(np.mean([e.episode_return for e in mine])) if ok else -math.inf
            out.append(score)
            if ok and (self.best is None or score > self.best[0]):
                self.best = (score, c)
        return out


def run_pycma(s: Searcher) -> None:
    import cma

    opts = {"bounds": [0.0, 1.0], "seed": s.spec.seed + 1, "verbose": -9}
    if s.spec.refiner.popsize:
        opts["popsize"] = s.spec.refiner.popsize
    es = cma.CMAEvolutionStrategy(s.x0(), s.spec.refiner.sigma0, opts)
    s.evaluate([s.x0()])  # the starting policy is a candidate too
    while s.affordable():
        xs = es.ask()
        es.tell(xs, [-f if math.isfinite(f) else 1e12 for f in s.evaluate(xs)])


def run_optuna(s: Searcher, kind: str) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)  # CmaEsSampler's x0/sigma0, deprecated in Optuna 4.9
    names = [p.name for p in s.program.parameters]
    x0 = dict(zip(names, s.x0()))
    n = len(names)
    batch = s.spec.refiner.popsize or 4 + int(3 * np.log(n))
    if kind == "cmaes":
        sampler = optuna.samplers.CmaEsSampler(x0=x0, sigma0=s.spec.refiner.sigma0, seed=s.spec.seed + 1,
                                               popsize=batch)
    else:
        sampler = optuna.samplers.TPESampler(seed=s.spec.seed + 1)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(x0)
    while s.affordable():
        trials = [study.ask() for _ in range(batch)]
        points = [[t.suggest_float(k, 0.0, 1.0) for k in names] for t in trials]
        for t, f in zip(trials, s.evaluate(points)):
            if math.isfinite(f):
                study.tell(t, f)
            else:
                study.tell(t, state=optuna.trial.TrialState.FAIL)


def test_eval(executor, spec: RunSpec, cand: Candidate) -> np.ndarray:
    task = GymTask.from_spec(spec.task)
    seeds = SeedSplits(spec.seed).seeds("test", 0, spec.test.episodes)
    eps = executor.run(task, [Job(cand, sd) for sd in seeds])
    return np.array([e.episode_return for e in eps])


def one(name: str, competitor: str, seed: int, budget: int | None, runs_dir: Path, model: str = "") -> dict:
    spec = load_spec(ROOT / "examples" / name)
    spec = spec.model_copy(update={"seed": seed})
    if competitor == "ratchet-screen":  # the world model screens each generation's proposals (issue 45)
        spec = spec.model_copy(update={"model": type(spec.model).model_validate({**spec.model.model_dump(), "screen": True, **key_values(model)})})
    if budget is not None:
        spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"env_steps": budget})})
    budget = spec.budget.env_steps
    t0 = time.perf_counter()
    screen = None
    if competitor.startswith("ratchet"):
        result = start_run(spec, runs_dir, f"{name}-{competitor}-s{seed}")
        st = project(open_ledger(result.run_dir).read())
        test, base = result.test.returns, result.baseline_test.returns
        reported, used = st.incumbent_validation_mean, st.env_steps
        screen = st.world_model()  # the screen's account (rank correlation, proposals not run, on or off)
    else:
        program = load_program((ROOT / "examples" / name / spec.policy.path), GymTask.from_spec(spec.task))
        with executor_from_spec(spec.execution) as ex:
            s = Searcher(spec, program, ex, budget)
            if competitor == "pycma":
                run_pycma(s)
            else:
                run_optuna(s, competitor.split("-")[1])
            reported, pick = s.best
            test = test_eval(ex, spec, pick)
            base = test_eval(ex, spec, program.candidate())
            used = s.env_steps
    p = float(stats.ttest_rel(test, base, alternative="less").pvalue) if np.any(test != base) else 1.0
    return {"example": name, "competitor": competitor, "seed": seed, "test": float(test.mean()),
            "start": float(base.mean()), "regressed": bool(p < 0.05), "p": p, "reported": float(reported),
            "env_steps": int(used), "budget": int(budget), "wall": time.perf_counter() - t0,
            "model": model if competitor == "ratchet-screen" else "", "screen": screen}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", nargs="*", default=list(BUDGETS), choices=sorted(BUDGETS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--competitors", default=",".join(c for c in COMPETITORS if c != "ratchet-screen"))
    ap.add_argument("--budget", action="append", default=[], metavar="NAME=STEPS",
                    help="Override an example's env-step budget (a reduced grid).")
    ap.add_argument("--results", metavar="FILE.jsonl",
                    help="Keep each run's result in this file (one JSON line per run) and reuse the runs already "
                         "there, so the grid can be run in parts and the table built from all of them.")
    ap.add_argument("--table-only", action="store_true",
                    help="Run nothing: build the table from the runs in --results (a grid that did not finish shows "
                         "the run seeds it has).")
    ap.add_argument("--model", default="", metavar="KEY=VALUE,...",
                    help="further [model] keys of the ratchet-screen competitor (its screen is on), e.g. "
                         "'factor=4,controls=1'")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if args.model:  # a bad --model: one line before any run
        from pydantic import ValidationError

        from ratchet.spec import ModelSpec

        try:
            ModelSpec.model_validate({"screen": True, **key_values(args.model)})
        except ValidationError as exc:
            ap.error(f"--model {args.model}: {'; '.join(e['msg'] + ' (' + '.'.join(map(str, e['loc'])) + ')' for e in exc.errors())}")
    budgets = dict(BUDGETS)
    for item in args.budget:
        k, _, v = item.partition("=")
        budgets[k] = int(v)
    seeds = [int(x) for x in args.seeds.split(",")]
    comps = args.competitors.split(",")
    unknown = [c for c in comps if c not in COMPETITORS]
    if unknown:
        ap.error(f"--competitors: unknown {', '.join(unknown)}; choose from {', '.join(COMPETITORS)}")
    if any(c.startswith("optuna") for c in comps) and not args.table_only:
        try:
            import optuna  # noqa: F401
        except ImportError:
            ap.error("the optuna competitors need Optuna and cmaes: .venv/bin/pip install -e '.[bench]' "
                     "(or leave them out of --competitors)")
    results, done = [], {}
    if args.results and Path(args.results).exists():
        for line in Path(args.results).read_text().splitlines():
            r = json.loads(line)
            done[(r["example"], r["competitor"], r["seed"], r["budget"], r.get("model", ""))] = r
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.examples:
            for seed in seeds:
                for comp in comps:
                    budget = budgets[name] or load_spec(ROOT / "examples" / name).budget.env_steps
                    model = args.model if comp == "ratchet-screen" else ""
                    r = done.get((name, comp, seed, budget, model))
                    if r is None and args.table_only:
                        continue
                    if r is None:
                        r = one(name, comp, seed, budget, Path(tmp), model)
                        if args.results:
                            with open(args.results, "a") as f:
                                f.write(json.dumps(r) + "\n")
                    results.append(r)
                    print(f"{name} s{seed} {comp}: test {r['test']:.1f} (start {r['start']:.1f}, p_worse "
                          f"{r['p']:.3g}) reported {r['reported']:.1f} env steps {r['env_steps']:,} "
                          f"{r['wall']:.0f} s", flush=True)
                    if r.get("screen"):
                        print(f"  world model: {world_model_text(r['screen'])}", flush=True)
    rows = []
    for name in args.examples:
        for comp in comps:
            rs = [r for r in results if r["example"] == name and r["competitor"] == comp]
            if not rs:
                continue
            tests = [r["test"] for r in rs]
            gaps = [r["reported"] - r["test"] for r in rs]
            sd = statistics.stdev(tests) if len(tests) > 1 else 0.0
            per_seed = ", ".join(f"{r['test']:.1f} (s{r['seed']})" for r in rs)
            rows.append(f"| {name} | {comp} | {np.mean([r['start'] for r in rs]):.1f} | {np.mean(tests):.1f} ± {sd:.1f} | "
                        f"{statistics.median(tests):.1f} | {per_seed} | "
                        f"{sum(r['regressed'] for r in rs)} / {len(rs)} | {np.mean(gaps):+.1f} | "
                        f"{np.mean([r['env_steps'] for r in rs]):,.0f} / {rs[0]['budget']:,} | "
                        f"{np.mean([r['wall'] for r in rs]):.0f} |")
    table = ("| example | competitor | start: test mean | test mean ± std across run seeds | median | per run seed | "
             "significantly worse than start (paired t, p < 0.05) | reported − test (mean) | env steps used / budget "
             "(mean) | wall clock per run (s) |\n|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    if args.write:
        cmd = (f"python benchmarks/peers.py --examples {' '.join(args.examples)} --seeds {args.seeds} "
               f"--competitors {args.competitors}" + "".join(f" --budget {b}" for b in args.budget)
               + (f" --results {Path(args.results).name}" if args.results else "") + " --write")
        write_section("Peers: ratchet vs pycma and Optuna at equal env-step budgets",
                      f"Command: `{cmd}` — see the script's docstring for the competitors. Budgets (env steps): "
                      + ", ".join(f"{n} {budgets[n] or 'its spec'}" for n in args.examples)
                      + f"; run seeds {args.seeds}; judged on ratchet's test seeds of each run seed. Policy code of "
                      "every competitor runs in ratchet's executor (sandboxed worker processes, 2 workers).\n\n"
                      f"Machine: {machine()}\n\n{table}")


if __name__ == "__main__":
    main()
