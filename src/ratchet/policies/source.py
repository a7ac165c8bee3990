"""``source`` policies: a folder of source files in any language, built and run inside the sandbox.

``[policy] kind = "source"`` names a folder (``path``), the commands that build it (``build``, shell command lines
run in order in a copy of the folder) and the command that runs the built program (``run``, an argv list)::

    [policy]
    kind = "source"
    path = "heuristic"                       # the folder
    build = ["g++ -O2 -o prog main.cpp"]
    run = ["./prog"]

**Content.** The whole folder is the candidate: every regular file in it (UTF-8 text; hidden entries such as
``.git`` left out) travels as its :attr:`~ratchet.policy.Candidate.source`, a canonical JSON document with the
build and run commands (:class:`Folder`), so the candidate id covers every file, the commands and the parameter
values. The **parameters** are the numbers in the files' marked regions (``EVOLVE-BLOCK-START`` /
``EVOLVE-BLOCK-END`` in any comment syntax; :mod:`ratchet.regions`): the files hold the starting values, a
candidate's values are written into the literals before it is built.

**Build.** In the sandboxed policy process, when an instance starts (the candidate's ``reset``, on its clock): the
files with the candidate's values are written to a fresh folder and each build command runs there under
``sh -c`` with its own limits: ``build_timeout_s`` of wall clock (the whole process group is killed past it) and
``build_memory_mb`` of address space per process, beside the sandbox's own (no network, read-only filesystem bar
the candidate's folder, a process limit). A failed build (a compile error, a compiler bomb that runs out of time or
memory) fails every instance of that candidate, with the build's last output as the reason.

Builds are cached by the hash of everything that goes into them (the files with the values written in, the
commands): in the candidate's own folder, so the episodes of one candidate in a policy process build once. The
cache lives and dies with the candidate: its folder is emptied when the candidate is retired
(:func:`ratchet.execution.worker.policy_main`), so no build output, and nothing a program or a build wrote beside
it, is ever seen by another candidate.

**Calls.** A task's functions (an evaluator's ``FUNCTIONS``) are answered by running the built program: each call
``name(x, ...)`` starts ``run`` in the build folder with the arguments as text on its stdin (:func:`stdin_text`)
and ``RATCHET_FUNCTION=name`` in its environment (and ``RATCHET_PYTHON``, the Python interpreter running ratchet,
for programs in Python: ``run = ["sh", "-c", "exec \\"$RATCHET_PYTHON\\" main.py"]``), and returns what it printed
on stdout, as text (at most ``max_output_bytes``). An evaluator declares such functions ``-> str`` and parses the answer
(:func:`ratchet.tasks.evaluator.numbers` reads numbers). A program that exits with a non-zero status, is killed by a
signal, prints more than the limit or what is not UTF-8 fails the call: the instance is the candidate's recorded
failure. A program that hangs runs out the instance's clock (``[execution] episode_timeout_s``), as a Python
candidate does. Nothing runs between calls: a process the program leaves behind is killed when its instances end,
and they count as failed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratchet.errors import PolicyError
from ratchet.policy import Candidate, Parameter, PolicyProgram
from ratchet.regions import Literal, RegionError, extract, substitute

__all__ = ["FORMAT", "Folder", "FolderPolicy", "ProgramFailed", "baked", "build", "export_folder", "files_text",
           "folder_text", "program_of", "read_folder", "stdin_text"]

#: The ``format`` of a folder candidate's source document.
FORMAT = "ratchet-folder/1"
#: Most files a folder may hold.
MAX_FILES = 200
#: Most bytes all of a folder's files may hold together.
MAX_FOLDER_BYTES = 2 << 20
_TAIL = 2000  # characters of a build's or a program's output kept for its failure's reason


class ProgramFailed(Exception):
    """A build failed, or the built program failed a call (the instance is the candidate's failure)."""


@dataclass(frozen=True)
class Folder:
    """A folder candidate's content: its files, commands and limits (JSON in :attr:`Candidate.source`).

    Attributes:
        files: Path relative to the folder (``/``-separated) -> text.
        build: Shell command lines run in order to build it (may be empty: an interpreted language).
        run: The argv that runs the built program, in the build folder.
        functions: The task's functions the program answers (each call runs ``run``).
        build_timeout_s: Wall-clock limit of each build command, seconds.
        build_memory_mb: Address-space limit of each build process, MiB.
        max_output_bytes: Most bytes one call's answer (stdout) may have.
    """

    files: Mapping[str, str]
    build: tuple[str, ...]
    run: tuple[str, ...]
    functions: tuple[str, ...]
    build_timeout_s: float = 60.0
    build_memory_mb: int = 2048
    max_output_bytes: int = 1 << 20

    def to_source(self) -> str:
        """The canonical JSON text (sorted keys and files): the same folder always gives the same text."""
        return json.dumps({"format": FORMAT, "files": dict(sorted(self.files.items())), "build": list(self.build),
                           "run": list(self.run), "functions": list(self.functions),
                           "limits": {"build_timeout_s": self.build_timeout_s, "build_memory_mb": self.build_memory_mb,
                                      "max_output_bytes": self.max_output_bytes}}, sort_keys=True, indent=1)

    @classmethod
    def from_source(cls, source: str) -> Folder:
        """Inverse of :meth:`to_source`.

        Raises:
            PolicyError: not a folder document.
        """
        try:
            d = json.loads(source)
            if d.get("format") != FORMAT:
                raise ValueError
            lim = d["limits"]
            files = {str(k): str(v) for k, v in d["files"].items()}
            return cls(files, tuple(map(str, d["build"])), tuple(map(str, d["run"])), tuple(map(str, d["functions"])),
                       float(lim["build_timeout_s"]), int(lim["build_memory_mb"]), int(lim["max_output_bytes"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            raise PolicyError(f"not a source folder document ({FORMAT})") from None

    @functools.cached_property
    def literals(self) -> dict[str, list[Literal]]:
        """Each file's parameters (:func:`ratchet.regions.extract`), files without any left out."""
        out = {}
        for path, text in sorted(self.files.items()):
            found = extract(text, path)
            if found:
                out[path] = found
        return out

    def parameters(self) -> tuple[Parameter, ...]:
        """The parameters of all files, in file and then text order.

        Raises:
            RegionError: a name used twice (in one file or two).
        """
        seen: dict[str, str] = {}
        out = []
        for path, lits in self.literals.items():
            for lit in lits:
                if lit.name in seen:
                    raise RegionError(f"{path}:{lit.line}: parameter {lit.name!r} is also named in {seen[lit.name]}; "
                                      "give one of them another name (an annotation: // ratchet: NAME)")
                seen[lit.name] = f"{path}:{lit.line}"
                out.append(_parameter(lit))
        return tuple(out)

    def with_values(self, params: Mapping[str, Any]) -> dict[str, str]:
        """The files with ``params`` written into their literals (other files as they are)."""
        values = {k: float(v) for k, v in params.items()}
        return {path: substitute(text, self.literals.get(path, ()), values) if path in self.literals else text
                for path, text in self.files.items()}


def _parameter(lit: Any) -> Parameter:
    """A marked literal as a parameter: an integer literal whose bounds hold whole numbers (at least 1 apart; ``LOW
    >= 1`` for ``log``) is an ``int`` parameter, so refiners search it on a rounded space (:class:`Parameter`) and no
    two candidates write the same program; any other literal a float one."""
    low, high = math.ceil(lit.low), math.floor(lit.high)
    if lit.is_int and low < high and (lit.scale != "log" or low >= 1):
        return Parameter(lit.name, int(lit.value), low, high, lit.scale, type="int")
    return Parameter(lit.name, lit.value, lit.low, lit.high, lit.scale)


def read_folder(path: str | Path, build: Sequence[str], run: Sequence[str], functions: Sequence[str], *,
                build_timeout_s: float = 60.0, build_memory_mb: int = 2048,
                max_output_bytes: int = 1 << 20, only: Sequence[str] = ()) -> PolicyProgram:
    """Read a source folder (driver side: nothing is built or run) into the program a run starts from.

    Returns:
        A :class:`PolicyProgram` whose ``source`` is the folder's document (:meth:`Folder.to_source`) and whose
        parameters are its marked regions' numbers.

    Raises:
        PolicyError: not a folder, a link or a file that is not UTF-8 text in it, too many or too large files,
            no ``run`` command, a file of ``only`` missing, or marked regions that cannot be read.

    ``only``: the files (relative paths) that are the candidate, the folder's other files left out (``[policy]
    files``: an OpenEvolve example's program file beside its evaluator); empty: every file.
    """
    root = Path(path)
    if not root.is_dir():
        raise PolicyError(f"[policy] kind = \"source\": {root} is not a folder; give the folder of the program's "
                          "source files")
    if not run:
        raise PolicyError("[policy] kind = \"source\" needs run = [...], the command that runs the built program "
                          "(e.g. run = [\"./prog\"])")
    files: dict[str, str] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for d in dirnames:  # os.walk lists a link to a folder here and never enters it
            rel = (Path(dirpath) / d).relative_to(root).as_posix()
            if (Path(dirpath) / d).is_symlink() and (not only or any(f.startswith(rel + "/") for f in only)):
                raise PolicyError(f"{Path(dirpath) / d}: a link to a folder; a source folder holds plain files only")
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if only and rel not in only:
                continue
            if p.is_symlink() or not p.is_file():
                raise PolicyError(f"{p}: a link or special file; a source folder holds plain files only")
            if len(files) >= MAX_FILES:
                raise PolicyError(f"{root}: more than {MAX_FILES} files; a source folder is the program's sources only")
            data = p.read_bytes()
            total += len(data)
            if total > MAX_FOLDER_BYTES:
                raise PolicyError(f"{root}: more than {MAX_FOLDER_BYTES:,} bytes of files; keep build outputs and "
                                  "data out of the source folder")
            try:
                files[rel] = data.decode("utf-8")
            except UnicodeDecodeError:
                raise PolicyError(f"{p}: not UTF-8 text (a build output or data file?); a source folder holds "
                                  "source files only") from None
    missing = sorted(set(only) - set(files))
    if missing:
        raise PolicyError(f"[policy] files: {', '.join(missing)} not found in {root} (plain files, relative to it)")
    if not files:
        raise PolicyError(f"{root}: the folder has no files")
    folder = Folder(files, tuple(build), tuple(run), tuple(functions), float(build_timeout_s), int(build_memory_mb),
                    int(max_output_bytes))
    return PolicyProgram(folder.to_source(), folder.parameters(), str(root), has_reset=True)


def program_of(source: str) -> PolicyProgram:
    """The program a folder candidate carries (its source document and its regions' parameters).

    Raises:
        PolicyError: not a folder document, or its regions cannot be read.
    """
    folder = Folder.from_source(source)
    return PolicyProgram(source, folder.parameters(), "<folder>", has_reset=True)


def export_folder(candidate: Candidate, output: str | Path) -> list[Path]:
    """Write the candidate's folder to ``output`` (a folder, made if missing; files already there are
    overwritten), its values written into the marked regions' literals. Returns the files written.

    Raises:
        PolicyError: ``output`` is a file, or the candidate is not a folder.
        OSError: a file cannot be written (a full disk); then none of them was written or changed
            (:func:`ratchet.safefile.write_files`).
    """
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise PolicyError(f"a source policy is exported as a folder; {out} is a file (give -o a new folder)")
    from ratchet.safefile import write_files

    files = Folder.from_source(candidate.source).with_values(candidate.params)
    written = {out.joinpath(*rel.split("/")): text.encode() for rel, text in sorted(files.items())}
    write_files(written, mode=0o644)
    return list(written)


def folder_text(candidate: Candidate) -> str:
    """A folder candidate as one text for diffs (``show``, the report): each file, its values written in, under a
    ``=== path ===`` line, in path order.

    Raises:
        PolicyError: not a folder document.
    """
    return files_text(Folder.from_source(candidate.source).with_values(candidate.params))


def files_text(files: Mapping[str, str]) -> str:
    """Files (path -> text) as one text: each under a ``=== path ===`` line, in path order (:func:`folder_text`)."""
    return "".join(f"=== {rel} ===\n{text}" + ("" if text.endswith("\n") else "\n")
                   for rel, text in sorted(files.items()))


def baked(candidate: Candidate) -> str:
    """A folder candidate's document with its values written into its files' marked regions (the starting point of
    an edit: the new folder's literals are the parent's values).

    Raises:
        PolicyError: not a folder document, or a value that cannot be written as a literal.
    """
    folder = Folder.from_source(candidate.source)
    return dataclasses.replace(folder, files=folder.with_values(candidate.params)).to_source()


def stdin_text(args: Sequence[Any]) -> str:
    """The arguments of a call as the program reads them on stdin: one argument per line, text as it is (a text
    that ends in a newline adds none), a number as Python writes it (``repr``: it reads back exactly), a list,
    tuple or 1-D array as its elements separated by spaces (nested ones row after row, one per line)."""
    def text(a: Any) -> str:
        if isinstance(a, str):
            return a if a.endswith("\n") else a + "\n"
        if isinstance(a, bytes):
            return text(a.decode("utf-8", errors="replace"))
        if hasattr(a, "tolist"):
            a = a.tolist()
        if isinstance(a, (list, tuple)):
            if any(isinstance(x, (list, tuple)) for x in a):
                return "".join(text(x) for x in a)
            return " ".join(_num(x) for x in a) + "\n"
        return _num(a) + "\n"

    return "".join(text(a) for a in args)


def _num(x: Any) -> str:
    if isinstance(x, bool):
        return str(int(x))
    if isinstance(x, int):
        return str(x)
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 and not isinstance(x, float) else repr(v)


def _tail_reader(stream: Any, keep: int, cap: int | None = None) -> tuple[threading.Thread, dict[str, Any]]:
    """A thread reading ``stream`` to its end: ``box["head"]`` the first ``cap`` bytes (None: none kept),
    ``box["tail"]`` the last ``keep``, ``box["total"]`` the count; it stops reading past ``cap`` (``box["over"]``)."""
    box: dict[str, Any] = {"head": bytearray(), "tail": b"", "total": 0, "over": False}

    def read() -> None:
        while True:
            chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
            if not chunk:
                return
            box["total"] += len(chunk)
            box["tail"] = (box["tail"] + chunk)[-keep:]
            if cap is not None:
                room = cap - len(box["head"])
                box["head"] += chunk[:max(room, 0)]
                if len(chunk) > room:
                    box["over"] = True
                    return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, box


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class FolderPolicy:
    """The worker side of a ``source`` candidate (built by :func:`build` in the sandboxed policy process).

    Has one method per task function (:attr:`Folder.functions`), each answering a call by running the built
    program (see the module doc); ``reset(params, seed)`` builds the candidate's files with ``params`` written in
    (or finds the build done before), so a failed build fails the instance when it starts.
    """

    def __init__(self, source: str) -> None:
        self.folder = Folder.from_source(source)
        self.folder.parameters()  # a region that cannot be read fails the candidate's load
        self._builds: dict[str, str | ProgramFailed] = {}  # key -> build folder, or the build's failure
        self._dir: str | None = None
        for name in self.folder.functions:
            setattr(self, name, functools.partial(self._call, name))

    def reset(self, params: Mapping[str, Any], seed: int) -> None:
        """Build (or find built) the files with ``params`` written in; raises :class:`ProgramFailed` when the build
        fails (each time it is asked for: a failure is cached too, so a compiler bomb costs its time once)."""
        files = self.folder.with_values(params)
        key = hashlib.sha256(json.dumps([sorted(files.items()), self.folder.build, self.folder.run],
                                        sort_keys=True).encode()).hexdigest()[:24]
        if key not in self._builds:
            self._builds[key] = self._build(key, files)
        built = self._builds[key]
        if isinstance(built, ProgramFailed):
            raise built
        self._dir = built

    def _build(self, key: str, files: Mapping[str, str]) -> str | ProgramFailed:
        where = os.path.join(os.getcwd(), "ratchet-builds", key)
        os.makedirs(where, exist_ok=True)
        for rel, text in files.items():
            p = os.path.join(where, *rel.split("/"))
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
        f_ = self.folder
        for command in f_.build:
            # the limits set by the shell itself (no preexec_fn: this process may have threads), inherited by
            # every process of the build
            limits = f"ulimit -v {f_.build_memory_mb * 1024}; ulimit -t {math.ceil(f_.build_timeout_s) + 1}; "
            proc = subprocess.Popen(["/bin/sh", "-c", limits + command], cwd=where, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    close_fds=True)
            reader, box = _tail_reader(proc.stdout, _TAIL)
            try:
                code = proc.wait(timeout=f_.build_timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                reader.join(5)
                return ProgramFailed(f"build timed out after {f_.build_timeout_s:g} s (build_timeout_s): {command}")
            _kill_group(proc)  # whatever the build left running
            reader.join(5)
            if code != 0:
                out = box["tail"].decode("utf-8", errors="replace").strip()
                return ProgramFailed(f"build failed: `{command}` {_status(code)}: {out[-_TAIL:]}")
        return where

    def _call(self, name: str, *args: Any) -> str:
        """Run the program on the call's arguments (``params`` last, already written into the build)."""
        if self._dir is None:
            raise ProgramFailed("the program was called before it was built")
        data = stdin_text(args[:-1]).encode("utf-8")
        cap = self.folder.max_output_bytes
        env = dict(os.environ, RATCHET_FUNCTION=name, RATCHET_PYTHON=sys.executable)
        try:
            proc = subprocess.Popen(list(self.folder.run), cwd=self._dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True, env=env)
        except OSError as exc:
            raise ProgramFailed(f"cannot run {shlex.join(self.folder.run)}: {exc.strerror or exc}") from None
        out_t, out = _tail_reader(proc.stdout, 1, cap)
        err_t, err = _tail_reader(proc.stderr, _TAIL)

        def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(data)
                proc.stdin.close()
            except OSError:  # it stopped reading: its answer says what it made of it
                pass

        done = threading.Event()  # its output ended (or passed the cap), or it exited: whichever comes first

        def wait() -> None:
            proc.wait()
            done.set()

        def read() -> None:
            out_t.join()
            done.set()

        for target in (feed, wait, read):
            threading.Thread(target=target, daemon=True).start()
        done.wait()
        if out_t.is_alive():  # it exited: what it printed is in the pipe, unless a process it left holds it open
            out_t.join(1.0)
            if out_t.is_alive():
                _kill_group(proc)
                raise ProgramFailed(f"{name}: the program exited, but a process it started still holds its output")
        if out["over"]:
            _kill_group(proc)
            raise ProgramFailed(f"{name}: the program printed more than {cap:,} bytes (max_output_bytes)")
        code = proc.wait()
        _kill_group(proc)  # processes it started and left (they would count as strays)
        err_t.join(5)
        if code != 0:
            tail = err["tail"].decode("utf-8", errors="replace").strip()
            raise ProgramFailed(f"{name}: the program {_status(code)}" + (f": {tail[-400:]}" if tail else ""))
        try:
            return bytes(out["head"]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProgramFailed(f"{name}: the program printed what is not UTF-8 text") from None


def build(source: str, artifacts: Mapping[str, bytes]) -> FolderPolicy:
    """Worker entry point (see :func:`ratchet.policies.build`): no artifacts."""
    return FolderPolicy(source)
