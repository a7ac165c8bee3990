"""``source`` policies (ratchet.policies.source): a folder of source files built and run in the sandbox.

The C++ bin-packing example scores exactly as the Python one; hostile compiled candidates (a failed build, a
compiler bomb, a crash, a program that spins, floods its output, forks, reads files outside or opens a socket) are
each that candidate's recorded failure beside a good candidate that is unaffected; every refiner that claims the kind
replays a killed and resumed run exactly; export writes the folder back."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import uuid
from pathlib import Path

import numpy as np
import pytest
from test_refiner_contract import Dying, whole_and_resumed

from ratchet.errors import PolicyError
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.execution.sandbox import Sandbox, isolation
from ratchet.loop import start_run
from ratchet.policies.source import Folder, build, export_folder, read_folder, stdin_text
from ratchet.policy import Candidate
from ratchet.refiners.registry import known_kinds, refiner_kind
from ratchet.spec import spec_from_dict
from ratchet.tasks.evaluator import CandidateError, EvaluatorTask, numbers

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpp_binpack"
needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("g++") is None, reason="needs gcc/g++")
needs_bwrap = pytest.mark.skipif(isolation() != "bwrap", reason="needs bubblewrap (apt-get install bubblewrap)")
pytestmark = needs_cc

GOOD = """#include <stdio.h>
// EVOLVE-BLOCK-START
double A = 1.5;  // ratchet: a 0..4
double B = 0.5;  // ratchet: b 0..2
// EVOLVE-BLOCK-END
int main(void) {
    double x;
    if (scanf("%lf", &x) != 1) return 2;
    printf("%.17g\\n", A * x + B);
    return 0;
}
"""

EVALUATOR = """
from ratchet.tasks.evaluator import numbers

FUNCTIONS = {"answer": "answer(x, params) -> str: a * x + b"}


def make_instance(seed):
    return int(seed) % 5


def evaluate(instance, policy):
    y = numbers(policy.answer(instance), 1)[0]
    return -abs(y - (2.0 * instance + 1.0))
"""

BUILD = ["cc -O1 -o prog main.c"]


def _folder(directory: Path, main: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "main.c").write_text(main)
    return directory


def _candidate(directory: Path, main: str = GOOD, build_cmds=None, **limits) -> Candidate:
    program = read_folder(_folder(directory, main), build_cmds or BUILD, ["./prog"], ["answer"], **limits)
    return Candidate.create(program.source, program.defaults, kind="source")


@pytest.fixture()
def task(tmp_path) -> EvaluatorTask:
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "evaluate.py").write_text(EVALUATOR)
    return EvaluatorTask.from_file(tmp_path / "ev" / "evaluate.py")


def test_a_folder_is_the_candidate_and_its_regions_the_parameters(tmp_path):
    root = _folder(tmp_path / "f", GOOD)
    (root / "sub").mkdir()
    (root / "sub" / "util.h").write_text("// no region\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")  # hidden entries are not the program's
    program = read_folder(root, BUILD, ["./prog"], ["answer"])
    assert [(p.name, p.default, p.low, p.high) for p in program.parameters] == [("a", 1.5, 0.0, 4.0),
                                                                               ("b", 0.5, 0.0, 2.0)]
    folder = Folder.from_source(program.source)
    assert sorted(folder.files) == ["main.c", "sub/util.h"]
    a = Candidate.create(program.source, program.defaults, kind="source")
    (root / "sub" / "util.h").write_text("// changed\n")
    b = Candidate.create(read_folder(root, BUILD, ["./prog"], ["answer"]).source, program.defaults, kind="source")
    c = Candidate.create(program.source, {"a": 2.0, "b": 0.5}, kind="source")
    assert len({a.id, b.id, c.id}) == 3  # every file and every value is in the id
    assert Candidate.from_dict(c.to_dict()) == c
    out = export_folder(c, tmp_path / "out")
    assert [p.relative_to(tmp_path / "out").as_posix() for p in out] == ["main.c", "sub/util.h"]
    assert (tmp_path / "out" / "main.c").read_text() == GOOD.replace("A = 1.5", "A = 2.0")


def test_a_promotions_diff_shows_the_changed_literals_by_file(tmp_path):
    from ratchet.proposals import promotion_changes

    a = _candidate(tmp_path / "f")
    b = Candidate.create(a.source, {"a": 2.25, "b": 0.5}, kind="source", parent_id=a.id)
    changes = promotion_changes(a, b)
    assert changes["source_diff"].splitlines()[2:] == [
        "@@ -3,3 +3,3 @@", " // EVOLVE-BLOCK-START", "-double A = 1.5;  // ratchet: a 0..4",
        "+double A = 2.25;  // ratchet: a 0..4", " double B = 0.5;  // ratchet: b 0..2"]
    assert changes["structure_diff"] == "" and changes["value_changes"] == [{"name": "a", "from": 1.5, "to": 2.25}]


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "not a folder"),
    (lambda d: (d.mkdir(), (d / "a.o").write_bytes(b"\x7fELF\xff\xfe")), "not UTF-8"),
    (lambda d: (d.mkdir(), os.symlink("/etc/passwd", d / "x")), "a link"),
    (lambda d: (_folder(d, GOOD), os.symlink("/etc", d / "etc")), "etc: a link to a folder"),  # was skipped
    (lambda d: (d.mkdir(), (d / "m.c").write_text("// EVOLVE-BLOCK-START\nx=1;\n")), "never closed"),
])
def test_a_bad_folder_is_one_clear_line(tmp_path, make, message):
    make(tmp_path / "f")
    with pytest.raises(PolicyError, match=message):
        read_folder(tmp_path / "f", BUILD, ["./prog"], ["answer"])


def test_a_linked_folder_beside_the_files_named_in_only_is_left_out(tmp_path):
    os.symlink("/etc", _folder(tmp_path / "f", GOOD) / "etc")
    assert len(read_folder(tmp_path / "f", BUILD, ["./prog"], ["answer"], only=["main.c"]).parameters) == 2
    with pytest.raises(PolicyError, match="a link to a folder"):
        read_folder(tmp_path / "f", BUILD, ["./prog"], ["answer"], only=["main.c", "etc/hosts"])


def test_call_arguments_and_numbers_in_answers():
    assert stdin_text(["3 4\n", 2, 0.5, np.array([1.0, 2.5]), [[1, 2], [3, 4]]]) == "3 4\n2\n0.5\n1.0 2.5\n1 2\n3 4\n"
    assert numbers(" 1 2.5\n-3 ", 3).tolist() == [1.0, 2.5, -3.0]
    for bad, count, dtype in (("1 x", None, float), ("1 2", 3, float), ("1.5", 1, np.int64), ("nan", 1, float),
                              (b"1", None, float)):
        with pytest.raises(CandidateError):
            numbers(bad, count, dtype=dtype)


def _load(name: str, path: Path, options: dict | None = None):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if options is not None:
        module.OPTIONS = options
    spec.loader.exec_module(module)
    return module


def test_the_cpp_heuristic_scores_exactly_as_the_python_one(tmp_path, monkeypatch):
    """examples/cpp_binpack's heuristic is examples/bin_packing's policy.py: the same packing, the same score, at the
    start values and at others written into its marked region."""
    monkeypatch.chdir(tmp_path)  # where the worker side builds (the candidate's own folder in a run)
    program = read_folder(EXAMPLE / "heuristic", ["g++ -O2 -ffp-contract=off -o prog main.cpp"], ["./prog"], ["pack"])
    py_eval = _load("bp_or", ROOT / "examples" / "bin_packing" / "evaluate.py", {"kind": "or"})
    py_policy = _load("bp_policy", ROOT / "examples" / "bin_packing" / "policy.py")
    cpp_eval = EvaluatorTask.from_file(EXAMPLE / "evaluate.py", options={"kind": "or"})._module()[0]
    assert {p.name for p in program.parameters} == set(py_policy.PARAMETERS)
    policy = build(program.source, {})
    tuned = {"tight_gap": 0.05, "tight_bonus": 0.3, "dead_gap": 0.2, "dead_penalty": 0.4, "spread_gap": 0.6,
             "spread_weight": 1.7, "new_bin_bonus": -0.3}
    for params in (program.defaults, tuned):
        policy.reset(params, 0)

        class Cpp:
            def pack(self, text, p=params):
                return policy.pack(text, p)

        class Py:
            def priority(self, item, bins, p=params):
                return py_policy.priority(item, bins, p)

        for seed in (0, 1, 2):
            want = py_eval.evaluate(py_eval.make_instance(seed), Py())
            got = cpp_eval.evaluate(cpp_eval.make_instance(seed), Cpp())
            assert got["score"] == want["score"] and got["diagnostics"] == want["diagnostics"], (seed, params)


def test_an_answer_that_breaks_the_online_rule_is_the_candidates_failure():
    cpp_eval = EvaluatorTask.from_file(EXAMPLE / "evaluate.py", options={"kind": "or"})._module()[0]
    with pytest.raises(CandidateError, match="only bins 0..0"):
        cpp_eval.replay(np.array([10, 20]), 150, np.array([1, 0]))
    with pytest.raises(CandidateError, match="does not fit"):
        cpp_eval.replay(np.array([100, 60]), 150, np.array([0, 0]))


# -- hostile compiled candidates, each beside a good one ------------------------------------------------------

TIMEOUT_S = 8.0
SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def sandboxed(request):
    os.environ["RATCHET_TEST_API_KEY"] = "sk-test-do-not-leak"
    ex = ProcessExecutor(workers=2, episode_timeout_s=TIMEOUT_S, sandbox=Sandbox(memory_limit_mb=2048))
    request.addfinalizer(ex.close)
    yield ex
    os.environ.pop("RATCHET_TEST_API_KEY", None)


def _beside_good(ex, task, tmp_path, bad: Candidate):
    good = _candidate(tmp_path / "good")
    jobs = [Job(good, s) for s in SEEDS] + [Job(bad, s) for s in SEEDS] + [Job(good, s) for s in SEEDS]
    eps = ex.run(task, jobs)
    want = [-abs(1.5 * (s % 5) + 0.5 - (2.0 * (s % 5) + 1.0)) for s in SEEDS]
    assert [e.episode_return for e in eps[:3]] == want and [e.episode_return for e in eps[6:]] == want
    assert all(e.error is None for e in eps[:3] + eps[6:]), [e.error for e in eps]
    bad_eps = eps[3:6]
    assert all(e.error for e in bad_eps), [e.error for e in bad_eps]
    return bad_eps


def test_text_reaches_only_an_evaluator_that_declares_it(sandboxed, tmp_path):
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "evaluate.py").write_text(EVALUATOR.replace("params) -> str:", "params):"))
    numeric = EvaluatorTask.from_file(tmp_path / "ev" / "evaluate.py")  # an evaluator that expects numbers
    eps = sandboxed.run(numeric, [Job(_candidate(tmp_path / "good"), s) for s in SEEDS])
    assert all("answer() returned str '" in e.error for e in eps), [e.error for e in eps]


def _main(body: str, head: str = "") -> str:
    return f"#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n{head}\nint main(void) {{\n{body}\n}}\n"


def test_a_build_that_fails_is_recorded_with_the_compilers_words(sandboxed, task, tmp_path):
    eps = _beside_good(sandboxed, task, tmp_path, _candidate(tmp_path / "bad", _main("return undeclared;")))
    assert all("build failed" in e.error and "undeclared" in e.error for e in eps), eps[0].error


def test_a_compiler_bomb_is_stopped_by_the_build_limits(sandboxed, task, tmp_path):
    # each macro doubles the tokens: 2**40 string literals to concatenate (hours and terabytes if let run)
    bomb = '#define X0 "a" "a"\n' + "".join(f"#define X{i} X{i - 1} X{i - 1}\n" for i in range(1, 41))
    eps = _beside_good(sandboxed, task, tmp_path,
                       _candidate(tmp_path / "bomb", _main("puts(X40); return 0;", bomb), build_timeout_s=2.0,
                                  build_memory_mb=512))
    assert all("build" in e.error for e in eps), [e.error for e in eps]


@pytest.mark.parametrize("command, limits, reason", [
    ("python3 -c 'bytearray(1 << 30)'", {"build_memory_mb": 256}, "MemoryError"),
    ("sleep 30", {"build_timeout_s": 0.5}, "build timed out after 0.5 s"),
])
def test_each_build_command_has_its_memory_and_time_limit(tmp_path, monkeypatch, command, limits, reason):
    from ratchet.policies.source import ProgramFailed

    monkeypatch.chdir(tmp_path)
    program = read_folder(_folder(tmp_path / "f", GOOD), [command], ["./prog"], ["answer"], **limits)
    policy = build(program.source, {})
    for _ in range(2):  # the failure is kept: a second instance does not build again
        with pytest.raises(ProgramFailed, match=reason):
            policy.reset(program.defaults, 0)


@pytest.mark.parametrize("body, reason", [
    ("int *p = 0; return *p;", "killed by SIGSEGV"),
    ("return 7;", "exited with status 7"),
    ("puts(\"oops\"); return 0;", "'oops' is not a number"),
    (("static char b[1 << 16]; for (int i = 0; i < (int)sizeof b; i++) b[i] = '7';"
     " for (;;) fwrite(b, 1, sizeof b, stdout);"), "printed more than"),
    ("char *s = getenv(\"RATCHET_TEST_API_KEY\"); puts(s ? s : \"none\"); return 0;", "'none' is not a number"),
])
def test_a_program_that_misbehaves_fails_its_instances(sandboxed, task, tmp_path, body, reason):
    eps = _beside_good(sandboxed, task, tmp_path, _candidate(tmp_path / "bad", _main(body), max_output_bytes=1 << 16))
    assert all(reason in e.error for e in eps), [e.error for e in eps]
    assert not any("sk-test" in e.error for e in eps)


def test_a_program_that_spins_runs_out_its_clock(sandboxed, task, tmp_path):
    eps = _beside_good(sandboxed, task, tmp_path, _candidate(tmp_path / "spin", _main("for (;;) {}")))
    assert all(e.error.startswith(("skipped: timeout", f"timeout after {TIMEOUT_S:g} s")) for e in eps), eps


@pytest.mark.parametrize("child, reason", [("", "still holds its output"),
                                           ("fclose(stdout); close(1);", "left 1 process(es) running")])
def test_a_program_that_leaves_a_process_fails_and_the_process_is_killed(sandboxed, task, tmp_path, child, reason):
    body = f"if (fork() == 0) {{ setsid(); {child} sleep(1000); return 0; }} puts(\"3.5\"); return 0;"
    eps = _beside_good(sandboxed, task, tmp_path, _candidate(tmp_path / "fork", _main(body)))
    assert all(reason in e.error for e in eps), [e.error for e in eps]


@needs_bwrap
def test_a_program_cannot_read_files_outside_or_reach_the_network(sandboxed, task, tmp_path):
    home = os.path.realpath(os.path.expanduser("~"))
    secret = os.path.join(home, f".ratchet-secret-{uuid.uuid4().hex}")
    Path(secret).write_text("hunter2")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    head = "#include <sys/socket.h>\n#include <netinet/in.h>\n#include <arpa/inet.h>\n"
    body = (f'FILE *f = fopen("{secret}", "r"); if (f) {{ char b[64] = {{0}}; fgets(b, 63, f); printf("%s\\n", b);'
            ' return 0; }\n'
            'int s = socket(AF_INET, SOCK_STREAM, 0); struct sockaddr_in a = {0}; a.sin_family = AF_INET;'
            f' a.sin_port = htons({server.getsockname()[1]}); a.sin_addr.s_addr = inet_addr("127.0.0.1");'
            ' if (s >= 0 && connect(s, (struct sockaddr*)&a, sizeof a) == 0) { puts("connected"); return 0; }'
            ' return 5;')
    try:
        eps = _beside_good(sandboxed, task, tmp_path, _candidate(tmp_path / "spy", _main(body, head)))
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected
    finally:
        server.close()
        os.remove(secret)
    assert all("exited with status 5" in e.error for e in eps), [e.error for e in eps]


# -- runs: the kind through the loop, and the refiners that claim it ------------------------------------------

def _spec(directory: Path, refiner: str, url: str | None = None):
    _folder(directory / "prog", GOOD)
    (directory / "evaluate.py").write_text(EVALUATOR)
    table = {"cmaes": {"popsize": 4},
             "llm": {"base_url": url, "model": "stand-in", "proposals": 2, "variants": 2, "retries": 0,
                     "check_endpoint": False}}.get(refiner, {})
    d = {"name": "src", "seed": 0, "task": {"kind": "evaluator", "evaluator": "evaluate.py"},
         "policy": {"kind": "source", "path": "prog", "build": BUILD, "run": ["./prog"]},
         "refiners": [{"kind": refiner, **table}], "planner": {"train_episodes": 2},
         "gate": {"validation_episodes": 4, "max_share": 0.9, "spending": "none"}, "budget": {"episodes": 40},
         "test": {"episodes": 2}, "execution": {"workers": 1, "episode_timeout_s": 60}}
    return spec_from_dict(d, directory)


#: every refiner kind that claims it can refine a source policy
CLAIMING = [k for k in known_kinds() if "source" in refiner_kind(k).policy_kinds]


def test_some_refiner_claims_the_kind():
    assert {"cmaes", "mutate", "llm"} <= set(CLAIMING)


# new-user pass: cmaes on a folder without marked regions advised "declare them in its PARAMETERS", which a source
# folder has not; it names the regions and the `ratchet:` annotations instead
def test_cmaes_on_a_folder_without_regions_says_how_to_mark_them(tmp_path):
    from ratchet.refiners.cmaes import NO_FOLDER_PARAMETERS

    spec = _spec(tmp_path / "spec", "cmaes")
    (tmp_path / "spec" / "prog" / "main.c").write_text(GOOD.replace("// EVOLVE-BLOCK-START\n", "")
                                                       .replace("// EVOLVE-BLOCK-END\n", ""))
    result = start_run(spec, tmp_path / "runs", "r")
    assert result.stop_reason == NO_FOLDER_PARAMETERS
    assert "EVOLVE-BLOCK-START" in result.stop_reason and "PARAMETERS" not in result.stop_reason


def _edit_by_seed(body):
    """A stand-in model's answer to a request for a source folder: a per-path edit of main.c that depends only on the
    request (its seed), so a resumed run is answered as the whole one was."""
    k = body["seed"] % 7 + 1
    return (f"Scale b.\nmain.c\n<<<<<<< SEARCH\n    printf(\"%.17g\\n\", A * x + B);\n=======\n"
            f"    printf(\"%.17g\\n\", A * x + B * {k});\n>>>>>>> REPLACE\n")


@pytest.mark.parametrize("refiner", CLAIMING)
def test_a_killed_and_resumed_run_replays_a_whole_one(tmp_path, refiner, request):
    url = request.getfixturevalue("standin")(respond=_edit_by_seed).url if refiner == "llm" else None
    spec = _spec(tmp_path / "spec", refiner, url)
    # killed after the first validation and part of the first generation
    whole, resumed, a, b = whole_and_resumed(spec, tmp_path, die_after=14)
    ids = [[e.payload["candidate"]["id"] for e in ev if e.type.value == "candidate_proposed"] for ev in (a, b)]
    assert ids[0] == ids[1] and len(ids[0]) > 1
    returns = [sorted((e.payload["candidate_id"], e.payload["split"], tuple(e.payload["seeds"]),
                       tuple(x["episode_return"] for x in e.payload["episodes"]))
                      for e in ev if e.type.value == "episodes_evaluated") for ev in (a, b)]
    assert returns[0] == returns[1]
    assert (resumed.incumbent.id, resumed.stop_reason) == (whole.incumbent.id, whole.stop_reason)
    assert whole.incumbent.kind == "source"
    assert not (tmp_path / "a" / "r" / "policy.py").exists()  # the folder is in the ledger, not a policy.py


RUST = """use std::io::Read;
// EVOLVE-BLOCK-START
const A: f64 = 1.5; // ratchet: a 0..4
const B: f64 = 0.5; // ratchet: b 0..2
// EVOLVE-BLOCK-END
fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let x: f64 = s.trim().parse().unwrap();
    println!("{}", A * x + B);
}
"""


def test_a_rust_program_builds_and_answers(tmp_path, monkeypatch):
    """Rust where a toolchain is installed (rustup's ~/.cargo/bin too: this runs outside the sandbox, which hides
    the caller's home); skipped without one."""
    cargo = os.path.expanduser("~/.cargo/bin")
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + cargo)
    if shutil.which("rustc") is None:
        pytest.skip("needs rustc")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.rs").write_text(RUST)
    program = read_folder(tmp_path / "src", ["rustc -O -o prog main.rs"], ["./prog"], ["answer"])
    assert [(p.name, p.default) for p in program.parameters] == [("a", 1.5), ("b", 0.5)]
    monkeypatch.chdir(tmp_path)
    policy = build(program.source, {})
    params = {"a": 2.0, "b": 1.0}
    policy.reset(params, 0)
    assert float(policy.answer(3, params)) == 7.0


def test_the_cli_evaluates_a_folder_and_exports_a_run_as_a_folder(tmp_path):
    from typer.testing import CliRunner

    from ratchet.cli import app

    spec = _spec(tmp_path / "spec", "cmaes")
    (tmp_path / "spec" / "ratchet.toml").write_text(
        'name = "src"\n[task]\nkind = "evaluator"\nevaluator = "evaluate.py"\n[policy]\nkind = "source"\n'
        f'path = "prog"\nbuild = {BUILD!r}\nrun = ["./prog"]\n'.replace("'", '"'))
    runner = CliRunner()
    res = runner.invoke(app, ["evaluate", str(tmp_path / "spec" / "prog"), "--spec", str(tmp_path / "spec" / "ratchet.toml"),
                              "--episodes", "2", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "errors 0" in res.output
    with Dying() as ex:
        start_run(spec, tmp_path / "runs", "r", executor=ex)
    res = runner.invoke(app, ["export", "r", "--runs-dir", str(tmp_path / "runs"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "main.c").read_text().startswith("#include <stdio.h>\n// EVOLVE-BLOCK-START\n")


def test_an_integer_literal_is_an_int_parameter_and_written_back_as_one(tmp_path):
    """An integer literal in a marked region is searched as an int (no two candidates write the same program); one
    whose bounds hold no two whole numbers stays a float."""
    main = ("// EVOLVE-BLOCK-START\nint rounds = 4;\nint depth = 3; // ratchet: depth 2.5..3.5\n"
            "double w = 1.5;\n// EVOLVE-BLOCK-END\nint main(void) { return 0; }\n")
    program = read_folder(_folder(tmp_path / "f", main), BUILD, ["./prog"], ["answer"])
    kinds = {p.name: (p.type, p.default, p.low, p.high) for p in program.parameters}
    assert kinds == {"main_c_L2": ("int", 4, 0, 8), "depth": ("float", 3.0, 2.5, 3.5),
                     "main_c_L4": ("float", 1.5, 0.0, 3.0)}
    rounds = next(p for p in program.parameters if p.type == "int")
    assert {rounds.from_unit(u) for u in (0.0, 0.05, 0.5, 0.99, 1.0)} <= set(range(9))
    files = Folder.from_source(program.source).with_values({**program.defaults, "main_c_L2": 7})
    assert "int rounds = 7;" in files["main.c"]


# -- llm: a model edits the folder's files ----------------------------------------------------------------------

PRINT = '    printf("%.17g\\n", A * x + B);\n'
WHOLE = "Double b.\n```c path=main.c\n" + GOOD.replace("A * x + B)", "A * x + 2 * B)") + "```\n"
PER_PATH = ("Add b once more.\n=== main.c ===\n<<<<<<< SEARCH\n" + PRINT + "=======\n"
            + PRINT.replace("+ B)", "+ B + B)") + ">>>>>>> REPLACE\n")


def _llm(server, **settings):
    from ratchet.refiners.llm import FOLDER_SYSTEM_PROMPT, LLMRefiner, LLMSettings, task_facts

    r = LLMRefiner(LLMSettings(base_url=server.url, model="m", concurrency=1, incumbent_share=1.0, **settings),
                   task_facts(EvaluatorTask.from_file(Path(server.evaluator)))[0])
    r.system_prompt = FOLDER_SYSTEM_PROMPT  # as the kind's build sets it for a source folder
    return r


def test_llm_edits_a_c_folder_whole_and_per_path_and_each_edit_builds_and_scores(sandboxed, task, tmp_path,
                                                                                 standin):
    outside = "Use the system's.\n```c path=../main.c\nint main(void) { return 0; }\n```\n"
    missing = "A helper.\n=== util.c ===\n```c\nint helper(void) { return 1; }\n```\n"
    broken = WHOLE.replace("// EVOLVE-BLOCK-END\n", "")
    server = standin([WHOLE, PER_PATH, outside, missing, broken, PER_PATH.replace("+ B + B)", "+ B * 1.5)")])
    server.evaluator = str(tmp_path / "ev" / "evaluate.py")
    r = _llm(server, proposals=4, variants=1, on_unusable="retry")
    parent = _candidate(tmp_path / "f")
    props = r.propose(parent, None, np.random.default_rng(0))
    system, prompt = (m["content"] for m in server.requests[0]["body"]["messages"])
    assert "=== main.c ===\n```c\n#include <stdio.h>" in prompt and "Build: cc -O1 -o prog main.c" in prompt
    assert "- a (main.c line 3): 1.5, bounds 0..4" in prompt and "EVOLVE-BLOCK-START" in system
    # the path outside the folder and the file that does not exist are unusable; the first is asked about again
    reasons = [x.reason for x in r.take_rejections()]
    assert "'../main.c' is outside the program's folder" in reasons[0] and "(asked again: retry)" in reasons[0]
    assert "'util.c' is not a file of the program's folder (no file may be added)" in reasons[1]
    assert "outside the program's folder" in server.requests[3]["body"]["messages"][-1]["content"]
    # a region left open is unusable too, its reason quoted when the model is asked again
    assert "marked regions cannot be read" in reasons[2] and "never closed" in reasons[2]
    assert "never closed" in server.requests[5]["body"]["messages"][-1]["content"]
    assert len(reasons) == 3 and len(server.requests) == 6
    assert [c.kind for c in props] == ["source"] * 3 and all(c.parent_id == parent.id for c in props)
    assert all(set(c.params) == {"a", "b"} for c in props)  # the parameters come from the new regions
    assert "+    printf(\"%.17g\\n\", A * x + 2 * B);" in r.history[0].summary  # the history diffs the files
    eps = sandboxed.run(task, [Job(c, s) for c in props for s in SEEDS])
    assert all(e.error is None for e in eps), [e.error for e in eps]
    got = [e.episode_return for e in eps]
    want = [-abs(1.5 * (s % 5) + k - (2.0 * (s % 5) + 1.0)) for k in (1.0, 1.0, 0.75) for s in SEEDS]
    assert got == pytest.approx(want)


def test_llm_edits_start_from_the_parents_values_and_a_comment_only_edit_is_a_duplicate(tmp_path, standin):
    from ratchet.proposals import file_normal_form, normal_id

    comments = ("Explain.\nmain.c\n<<<<<<< SEARCH\nint main(void) {\n=======\n/* the answer */\nint main(void)  {"
                "  // a * x + b\n>>>>>>> REPLACE\n")
    server = standin([comments])
    server.evaluator = str(tmp_path / "ev" / "evaluate.py")
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "evaluate.py").write_text(EVALUATOR)
    start = _candidate(tmp_path / "f")
    parent = Candidate.create(start.source, {"a": 2.0, "b": 0.5}, kind="source")
    [new] = _llm(server, proposals=1, variants=1).propose(parent, None, np.random.default_rng(0))
    assert "double A = 2.0;" in Folder.from_source(new.source).files["main.c"]  # the parent's value written in
    assert new.id != parent.id and normal_id(new) == normal_id(parent)  # the run scores only the first
    assert normal_id(Candidate.create(new.source, {"a": 2.5, "b": 0.5}, kind="source")) != normal_id(parent)
    # what the normal form keeps, by language: C's preprocessor lines, Go's line breaks, any other file's text
    assert file_normal_form("m.c", "#include <math.h>\nint x;") != file_normal_form("m.c", "#include <time.h>\nint x;")
    assert file_normal_form("m.c", "#define F (x)\n") != file_normal_form("m.c", "#define F(x)\n")
    assert file_normal_form("m.go", "return\nx // c") == "return\nx" != file_normal_form("m.go", "return x")
    assert file_normal_form("m.sh", "#!/bin/sh\n# c\nx=1\n") == "#!/bin/sh\nx=1"
    assert file_normal_form("m.py", "x = 1  # c\n") == file_normal_form("m.py", "x=1\n")
    assert file_normal_form("data.txt", "a  b # c") == "a  b # c"
