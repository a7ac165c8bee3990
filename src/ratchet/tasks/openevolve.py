"""OpenEvolve tasks: an OpenEvolve example folder run as it is, its evaluator *inside the sandbox*.

OpenEvolve's evaluator contract is ``evaluate(program_path) -> dict`` of metrics (``combined_score`` by
convention), and the evaluator runs the program itself (usually in a subprocess of ``sys.executable``).
``[task] kind = "openevolve"`` runs such an evaluator unchanged::

    [task]
    kind = "openevolve"
    evaluator = "evaluator.py"          # their evaluator, as published
    program = "initial_program.py"      # the program file it is given (default)
    metric = "combined_score"           # the metric that is the score (default)

    [policy]
    kind = "source"                     # the candidate: the program file, its EVOLVE-BLOCK numbers the parameters
    path = "."
    files = ["initial_program.py"]
    run = ["sh", "-c", "exec \\"$RATCHET_PYTHON\\" -"]

**What runs where.** Because their evaluator runs the candidate, it cannot be ratchet's trusted scorer: ratchet
runs it in the sandbox, beside the candidate, in the candidate's policy process (one sandboxed run per
evaluation, with the ``source`` policy's time, memory and output limits). The task's one function is
``evaluate(script, params) -> str``: the candidate's ``run`` command is given a short Python script on stdin
(:func:`driver_script`) that writes the evaluator (the source stored with the task, never the candidate's copy)
to a folder of its own, calls its ``evaluate`` on the program file (the candidate's values written in), and prints
the metrics as one JSON line. The trusted side (:func:`evaluate`, run by the :class:`~ratchet.tasks.evaluator.
EvaluatorTask` machinery) takes only that line: at most ``max_output_bytes``, a JSON object, numbers only (text
values are dropped), finite, with the score metric present. Anything else — the evaluator or the program raising,
hanging, printing too much or garbage, a missing or non-finite metric — is that candidate's recorded failure.

**What is trusted.** Nothing the score depends on: the program runs in the same sandbox as the evaluator, so it
can forge the metrics (patch the evaluator, print a line of its own). The sandbox keeps it from the driver, the
ledger, the network and the user's files; the gate and the report still read only what crossed the boundary.
Where the score must not be forgeable, split the evaluator: the instance-making and checking part becomes a
``kind = "evaluator"`` module (trusted, outside the sandbox), the program a ``program`` or ``source`` policy it
calls (docs/how-to/tasks/openevolve.md).

Every evaluation of an OpenEvolve evaluator is one instance (its seed unused): scores are usually deterministic,
so ``[planner] train_episodes = 1`` and small gates are the useful settings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ratchet.errors import TaskError
from ratchet.tasks.evaluator import MAX_SCORES, MAX_SOURCE_BYTES, CandidateError, EvaluatorTask

__all__ = ["ADAPTER", "MARKER", "RAISED", "OpenEvolveTask", "driver_script", "metrics_of", "spec_text"]

#: The trusted evaluator module every OpenEvolve task runs (an :mod:`ratchet.tasks.evaluator` module): its OPTIONS
#: hold the user's evaluator source, the program file's name and the score metric.
ADAPTER = '''"""ratchet's adapter for an OpenEvolve evaluator (ratchet.tasks.openevolve)."""
from ratchet.tasks.openevolve import evaluate as _evaluate

FUNCTIONS = {"evaluate": "evaluate(script, params) -> str: runs the OpenEvolve evaluator on the program file "
                         "(a Python script on stdin) and prints its metrics as one JSON line"}
DESCRIPTION = OPTIONS.get("description") or "An OpenEvolve example: its evaluator scores the program file."


def make_instance(seed):
    return None


def evaluate(instance, policy):
    return _evaluate(policy, OPTIONS)
'''

#: The line before the metrics in the driver's output (what precedes it is ignored).
MARKER = "RATCHET-OPENEVOLVE-METRICS"
#: The line before what the evaluator raised, in the driver's output: ``{"raised": "TYPE: message", "at": "file:line
#: in function; …"}`` (the traceback's last line and its frames in the evaluator's and program's files, innermost last).
RAISED = "RATCHET-OPENEVOLVE-RAISED"


def driver_script(evaluator_source: str, evaluator_name: str, program: str) -> str:
    """The Python script the candidate's ``run`` command executes in the sandbox (stdin): writes the evaluator to
    ``.openevolve-evaluator/<evaluator_name>`` in the build folder, runs ``evaluate(<program path>)`` with stdout
    (the file descriptor: subprocesses too) sent to stderr, and prints :data:`MARKER` and the metrics as JSON
    (numbers as floats; anything else as text, which the trusted side drops), or, when loading the evaluator or
    ``evaluate`` raised, :data:`RAISED` and what it raised (the traceback's last line, and its frames by file name:
    no sandbox path)."""
    return f'''import json, os, sys, traceback
src, name, program = {evaluator_source!r}, {evaluator_name!r}, {program!r}
here = os.getcwd()
folder = os.path.join(here, ".openevolve-evaluator")
os.makedirs(folder, exist_ok=True)
path = os.path.join(folder, name)
with open(path, "w", encoding="utf-8") as f:
    f.write(src)
sys.path.insert(0, folder)
sys.stdout.flush()
out = os.dup(1)
os.dup2(2, 1)
import importlib.util
try:
    spec = importlib.util.spec_from_file_location("openevolve_evaluator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.evaluate(os.path.join(here, program))
    result = getattr(result, "metrics", result)
except BaseException as exc:
    traceback.print_exc()
    sys.stdout.flush()
    at = [f"{{os.path.basename(f.filename)}}:{{f.lineno}} in {{f.name}}" for f in traceback.extract_tb(exc.__traceback__)
          if not f.filename.startswith("<")]
    raised = " ".join(f"{{type(exc).__name__}}: {{exc}}".split()).rstrip(":")
    raised = raised.replace(folder + os.sep, "").replace(here + os.sep, "")  # no sandbox paths
    os.write(out, ("\\n{RAISED}\\n" + json.dumps({{"raised": raised[:300], "at": "; ".join(at)[-300:]}}) + "\\n").encode())
    sys.exit(0)
sys.stdout.flush()
def plain(v):
    try:
        return float(v) if not isinstance(v, (str, bytes)) else str(v)[:200]
    except (TypeError, ValueError):
        return str(v)[:200]
if isinstance(result, dict):
    line = json.dumps({{str(k)[:40]: plain(v) for k, v in result.items()}})
else:
    line = json.dumps("a " + type(result).__name__)
os.write(out, ("\\n{MARKER}\\n" + line + "\\n").encode())
'''


def metrics_of(text: Any, metric: str) -> tuple[float, dict[str, float]]:
    """The score and the other numeric metrics in what the driver printed (untrusted: the candidate's sandbox).

    Returns:
        ``(score, metrics)``: ``metric``'s value, and every other finite number (at most ``MAX_SCORES - 1``, names
        cut to 40 characters); text values and ``bool``s are left out.

    Raises:
        CandidateError: the evaluator raised (its exception's type and message, and where), no metrics line, not a
            JSON object, the metric missing, not a number or not finite.
    """
    if not isinstance(text, str):
        raise CandidateError(f"the evaluator's output is not text (got {type(text).__name__})")
    _, raised, what = text.rpartition(RAISED)
    if raised and MARKER not in what:  # the evaluator (or the program it ran) raised
        try:
            got = json.loads(what.strip())
        except ValueError:
            got = None
        if isinstance(got, dict) and isinstance(got.get("raised"), str):
            at = got.get("at") if isinstance(got.get("at"), str) else ""
            raise CandidateError(f"the OpenEvolve evaluator raised {got['raised'][:300]}"
                                 + (f" (at {at[-300:]})" if at else ""))
    _, found, tail = text.rpartition(MARKER)
    if not found:
        raise CandidateError("the OpenEvolve evaluator printed no metrics (it, or the program, failed before "
                             "evaluate() returned)")
    try:
        metrics = json.loads(tail.strip())
    except ValueError:
        raise CandidateError("the OpenEvolve evaluator's metrics are not one JSON line") from None
    if not isinstance(metrics, dict):
        what = metrics[:40] if isinstance(metrics, str) else f"a {type(metrics).__name__}"
        raise CandidateError(f"the OpenEvolve evaluator returned {what}, not a dict of metrics")
    value = metrics.get(metric)
    if metric in metrics and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise CandidateError(f"the OpenEvolve evaluator returned {metric} = {str(value)[:40]!r}, a "
                             f"{type(value).__name__}, not a number (the score metric)")
    if not isinstance(value, (int, float)):
        raise CandidateError(f"the OpenEvolve evaluator returned no number {metric!r} (the score metric; got "
                             f"{sorted(map(str, metrics))[:8]})")
    if not math.isfinite(value):
        raise CandidateError(f"the OpenEvolve evaluator returned {metric} = {value}, not a finite number")
    others: dict[str, float] = {}
    for k, v in metrics.items():
        if k == metric or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        if len(others) >= MAX_SCORES - 1:
            break
        others[str(k)[:40]] = float(v)
    return float(value), others


def evaluate(policy: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """One evaluation (the adapter module's ``evaluate``, on the trusted side): run the driver in the candidate's
    sandbox and read its metrics (:func:`metrics_of`).

    Raises:
        CandidateError: as :func:`metrics_of`; the call itself raises for a program that crashed, hung or printed
            too much (the candidate's failure).
    """
    answer = policy.evaluate(driver_script(options["evaluator_source"], options["evaluator_name"],
                                           options["program"]))
    score, metrics = metrics_of(answer, options["metric"])
    return {"score": score, "diagnostics": {options["metric"][:40]: score, **metrics}}


class OpenEvolveTask(EvaluatorTask):
    """``[task] kind = "openevolve"``: an :class:`~ratchet.tasks.evaluator.EvaluatorTask` whose trusted module is
    :data:`ADAPTER` and whose ``options`` hold the OpenEvolve evaluator's source (stored in the ledger with the
    task, so replay and resume run the same evaluator), the program file's name and the score metric."""

    kind: ClassVar[str] = "openevolve"

    @classmethod
    def from_spec(cls, table: Any) -> OpenEvolveTask:
        """From a spec's ``[task]`` table (``evaluator``, ``program``, ``metric``, ``name``, ``success_threshold``,
        ``deterministic``);
        the ledger's stored form (with ``source``) is read as :meth:`from_dict`.

        Raises:
            TaskError: no evaluator, or it cannot be read (missing, not UTF-8, over 1 MiB).
        """
        t = table if isinstance(table, Mapping) else table.model_dump()
        if t.get("source") is not None:
            task = cls.from_dict(t)
            assert isinstance(task, OpenEvolveTask)
            return task
        if not t.get("evaluator"):
            raise TaskError("[task] kind = \"openevolve\" needs evaluator = \"evaluator.py\" (OpenEvolve's evaluator, "
                            "with evaluate(program_path) -> dict of metrics)")
        p = Path(t["evaluator"])
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise TaskError(f"cannot read the OpenEvolve evaluator {p}: {exc.strerror or exc}") from None
        if len(data) > MAX_SOURCE_BYTES:
            raise TaskError(f"{p}: {len(data):,} bytes; an evaluator may have at most {MAX_SOURCE_BYTES:,}")
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            raise TaskError(f"{p}: not UTF-8 text") from None
        options = {"evaluator_source": source, "evaluator_name": p.name,
                   "program": t.get("program") or "initial_program.py", "metric": t.get("metric") or "combined_score"}
        return cls(str(p.resolve()), ADAPTER, t.get("success_threshold"), t.get("name") or p.parent.name or None,
                   options, bool(t.get("deterministic")))

    def to_dict(self) -> dict[str, Any]:
        """As :meth:`EvaluatorTask.to_dict`, with ``"kind": "openevolve"``."""
        return {**super().to_dict(), "kind": self.kind}


def spec_text(folder: str | Path, evaluator: str = "evaluator.py", program: str | None = None,
              budget: int = 600) -> str:
    """The ``ratchet.toml`` that runs an OpenEvolve example folder as it is (``ratchet import openevolve``): an
    ``openevolve`` task of ``evaluator``, the program file as a ``source`` policy, CMA-ES over its ``EVOLVE-BLOCK``
    numbers with a small step (structural integers such as array sizes break a program when moved), one evaluation
    per candidate, ``budget`` evaluations.

    ``program``: the program file; default ``initial_program.py``, else the one ``.py`` file of the folder with an
    ``EVOLVE-BLOCK-START`` marker.

    Raises:
        TaskError: no evaluator, or no program file (or several candidates for it) in the folder.
    """
    from ratchet.regions import START

    root = Path(folder)
    if not (root / evaluator).is_file():
        raise TaskError(f"{root}: no {evaluator} (an OpenEvolve example folder has the evaluator with "
                        "evaluate(program_path); name another with --evaluator)")
    if program is None:
        if (root / "initial_program.py").is_file():
            program = "initial_program.py"
        else:
            found = sorted(p.name for p in root.glob("*.py") if p.name != evaluator and p.is_file()
                           and START in p.read_text(encoding="utf-8", errors="replace"))
            if len(found) != 1:
                raise TaskError(f"{root}: {'no' if not found else 'several'} .py files with an EVOLVE-BLOCK-START "
                                f"marker ({', '.join(found)}); name the program file with --program")
            program = found[0]
    elif not (root / program).is_file():
        raise TaskError(f"{root}: no program file {program}")
    if START not in (root / program).read_text(encoding="utf-8", errors="replace"):
        raise TaskError(f"{root / program}: no {START} marker: nothing in it to refine; mark the region to evolve "
                        f"(# {START} ... # EVOLVE-BLOCK-END)")
    import ast

    try:
        tree = ast.parse((root / evaluator).read_text(encoding="utf-8", errors="replace"))
    except SyntaxError as exc:
        raise TaskError(f"{root / evaluator}:{exc.lineno}: not valid Python: {exc.msg}") from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == "evaluate" for n in tree.body):
        raise TaskError(f"{root / evaluator}: no top-level evaluate(program_path) function (OpenEvolve's evaluator "
                        "contract)")
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in (root.resolve().name or "openevolve"))
    return f"""# Written by `ratchet import openevolve`: runs this OpenEvolve example as it is. Their {evaluator} runs in the
# sandbox beside {program}, so the score is forgeable by the program (docs/how-to/tasks/openevolve.md).
name = {json.dumps(name)}
seed = 0

[task]
kind = "openevolve"
evaluator = {json.dumps(evaluator)}
program = {json.dumps(program)}
metric = "combined_score"
# If their score is the same every time for the same program (most OpenEvolve examples), uncomment: each distinct
# program is then scored once and promoted by an exact comparison, with no statistics.
# deterministic = true

[policy]
kind = "source"
path = "."
files = [{json.dumps(program)}]
run = ["sh", "-c", "exec \\"$RATCHET_PYTHON\\" -"]

[[refiners]]
kind = "cmaes"
sigma0 = 0.01
popsize = 8

[planner]
train_episodes = 1

[gate]
validation_episodes = 2

[budget]
episodes = {int(budget)}

[test]
episodes = 1
"""
