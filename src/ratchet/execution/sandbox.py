"""Sandboxing for policy code: how worker processes are launched and what they may do.

Policy code is untrusted (it may come from an LLM). Every worker process that runs it is started
through :meth:`Sandbox.command` and confines itself with :func:`confine` before it reads its first
job. Layers, strongest first:

* **bubblewrap** (``bwrap``, Debian package ``bubblewrap``) when it is on ``PATH`` and works: the
  whole filesystem read-only except the worker's fresh temporary directory (for a trusted rollout's
  policy process, an empty tmpfs of :attr:`Sandbox.disk_limit_mb` in its place, emptied after each
  candidate: see :meth:`Sandbox.command`), new network, PID, IPC and UTS namespaces (no route to the
  host's network, loopback included), all capabilities dropped, the sandbox dies with its parent.
* otherwise a new **network namespace** through ``unshare(2)`` where the kernel allows it.
* always: resource limits (address space, CPU time, open files, processes), an environment reduced
  to an allow-list (API keys never reach policy code), and a fresh temporary working directory.

Where the process limit cannot be enforced by ``RLIMIT_NPROC`` (root is exempt from it), a cgroup-v1
``pids`` controller is used when it is writable.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ratchet.errors import SandboxError
from ratchet.processes import process_running

__all__ = [
    "Sandbox",
    "SandboxError",
    "clear_folder",
    "confine",
    "hide_from_policies",
    "isolation",
    "reap_strays",
    "rearm_cpu_limit",
    "sweep_leftovers",
]

#: Variables a worker inherits from the parent (plus :attr:`Sandbox.env_allowlist`). Everything else,
#: API keys and tokens included, is dropped.
BASE_ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "PYTHONHASHSEED",
                      "VIRTUAL_ENV", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                      "SDL_VIDEODRIVER", "SDL_AUDIODRIVER", "MUJOCO_GL", "RATCHET_WORKER_OUTPUT")

_PIDS_CGROUP = Path("/sys/fs/cgroup/pids")
_FILE_SIZE_LIMIT = 256 * 2**20  # bytes one worker may write to a single file


@dataclass(frozen=True)
class Sandbox:
    """How worker processes that run policy code are confined. Picklable (it travels to Ray workers).

    Args:
        enabled: False runs workers unconfined (only for measuring the sandbox's cost).
        require_isolation: Refuse to start workers unless policy code gets its own network namespace.
        memory_limit_mb: ``RLIMIT_AS`` per worker process, in MiB.
        cpu_limit_s: ``RLIMIT_CPU`` per worker process, in seconds of CPU time.
        max_open_files: ``RLIMIT_NOFILE`` per worker process.
        max_processes: Processes a worker may hold at once, itself included (fork-bomb bound).
        disk_limit_mb: What one candidate may write in all, in MiB (the size of the tmpfs a trusted rollout's
            policy process gets as its folder under bubblewrap; memory, not disk, so a worker may use up to
            ``memory_limit_mb`` plus this). Every file is also bounded by ``RLIMIT_FSIZE`` (256 MiB).
        env_allowlist: Extra environment variables passed through to workers.
        trusted_rollouts: Step the environment in a trusted env host process outside the policy's
            sandbox, which exchanges only observations and actions with the sandboxed policy process, so
            policy code cannot forge a return (see :mod:`ratchet.execution.envhost`). False runs policy
            and environment in one sandboxed process: a little faster, but a policy can then report any
            return it likes.
    """

    enabled: bool = True
    require_isolation: bool = False
    memory_limit_mb: int = 4096
    cpu_limit_s: int = 3600
    max_open_files: int = 256
    max_processes: int = 64
    disk_limit_mb: int = 256
    env_allowlist: tuple[str, ...] = field(default_factory=tuple)
    trusted_rollouts: bool = True

    @classmethod
    def from_spec(cls, execution: Any) -> Sandbox:
        """Build from a spec's ``[execution]`` section (:class:`ratchet.spec.ExecutionSpec`)."""
        return cls(enabled=execution.sandbox, require_isolation=execution.require_isolation,
                   memory_limit_mb=execution.memory_limit_mb, cpu_limit_s=execution.cpu_limit_s,
                   max_open_files=execution.max_open_files, max_processes=execution.max_processes,
                   disk_limit_mb=execution.disk_limit_mb, env_allowlist=tuple(execution.env_allowlist),
                   trusted_rollouts=execution.trusted_rollouts)

    def describe(self) -> str:
        """One line for the ledger and ``ratchet show``: the isolation level and the limits."""
        rollouts = "trusted rollouts" if self.trusted_rollouts else "policy and env in one process"
        if not self.enabled:
            return f"off; {rollouts}"
        return (f"{isolation()}; {rollouts}; {self.memory_limit_mb} MiB, {self.cpu_limit_s} s CPU, {self.max_open_files} files, "
                f"{self.max_processes} processes per worker")

    def drop_to_uid(self) -> int | None:
        """The uid policy code runs as: ``nobody`` (65534) when ratchet runs as root under bubblewrap
        (root owns ``/root``, ``~/.pgpass``, ``/etc/shadow``, and is exempt from ``RLIMIT_NPROC``), else
        None (the caller's uid). Also None when ``nobody`` could not read the Python installation or
        the project (e.g. a checkout inside a 0700 folder): policy code then runs as root without
        capabilities, and :meth:`check` says so once."""
        if not (self.enabled and os.geteuid() == 0 and isolation() == "bwrap"):
            return None
        return _NOBODY if _readable_by_others(_python_paths(), _private_home()) is None else None

    def prepare_workdir(self, workdir: str) -> None:
        """Make the worker's fresh directory writable by the uid it will run as."""
        uid = self.drop_to_uid()
        if uid is not None:
            os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o755)  # bubblewrap, root without capabilities, must still enter it

    def environment(self, workdir: str, extra: dict[str, str], cgroup: Path | None = None) -> dict[str, str]:
        """The worker's environment: the allow-list only, ``HOME``/``TMPDIR`` set to ``workdir``, and
        ``RATCHET_SANDBOX`` (the settings :func:`confine` applies).

        With the sandbox off, the parent's whole environment (the caller asked for no confinement).
        """
        if not self.enabled:
            return dict(os.environ, **extra)
        keep = set(BASE_ENV_ALLOWLIST) | set(self.env_allowlist)
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(HOME=workdir, TMPDIR=workdir, MPLCONFIGDIR=workdir, PYTHONDONTWRITEBYTECODE="1")
        env.update(extra)
        env["RATCHET_SANDBOX"] = json.dumps({**asdict(self), "isolation": isolation(), "drop_to": self.drop_to_uid(),
                                             "cgroup": cgroup is not None})
        return env

    def command(self, argv: list[str], workdir: str, cgroup: Path | None, bounded: bool = False) -> list[str]:
        """The launcher command line for ``argv`` (a worker's ``python -m ...``) running in ``workdir``.

        Under bubblewrap the filesystem is read-only but for ``workdir`` (``/dev``, too, is read-only,
        bar its device nodes), the caller's home directory is replaced by an empty, read-only one (bar
        the Python installation, read-only, if it lives there), with new network/PID/IPC/UTS namespaces
        and no capabilities. With ``bounded`` (a trusted rollout's policy process) the process gets an
        empty tmpfs of :attr:`disk_limit_mb` at ``workdir`` instead of the folder itself, so what it
        writes is bounded in all and never reaches the host (nor does it see what the caller keeps there,
        such as the log its output is appended to); where bubblewrap cannot size a tmpfs (before 0.8) the
        folder itself is bound, unbounded in all, and :meth:`check` says so. With a pids ``cgroup`` a tiny
        ``sh`` launcher enters it before ``exec`` (so nothing the worker starts can escape the bound).
        """
        if not self.enabled:
            return argv
        if isolation() == "bwrap":
            home = _private_home()
            hide: list[str] = []
            if home is not None:  # an empty home; the Python installation inside it (if any) read-only
                hide, made = ["--tmpfs", home], {home}
                for path in _python_paths():
                    if path.startswith(home + os.sep):
                        parts = Path(path).relative_to(home).parts
                        for k in range(1, len(parts)):  # traversable by the worker's uid (bwrap's default: 0700)
                            parent = os.path.join(home, *parts[:k])
                            if parent not in made:
                                made.add(parent)
                                hide += ["--perms", "0755", "--dir", parent]
                        hide += ["--ro-bind", path, path]
                hide += ["--remount-ro", home]  # the sandbox's own uid would own it (no root): writable else
            hide += _hidden_mounts(home, workdir)
            # as root, keep only what is needed to become nobody; setuid() then clears every capability
            caps = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if self.drop_to_uid() is not None else []
            if bounded and _sized_tmpfs():  # 0777: owned by root where bubblewrap runs as root; no one else sees it
                folder = ["--perms", "0777", "--size", str(self.disk_limit_mb * 2**20), "--tmpfs", workdir]
            else:
                folder = ["--bind", workdir, workdir]
            # /dev is a tmpfs of the sandbox (its /dev/shm too): read-only, or policy code could write there unbounded
            argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc", *hide,
                    *folder, "--chdir", workdir, "--unshare-net", "--unshare-pid",
                    "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL", *caps, "--die-with-parent", "--", *argv]
        if cgroup is not None:
            argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *argv]
        return argv

    def make_cgroup(self) -> Path | None:
        """A fresh pids cgroup bounding a worker to :attr:`max_processes`, or None where none can be made
        (not root, no cgroup-v1 pids controller mounted writable)."""
        if not self.enabled or os.geteuid() != 0 or not os.access(_PIDS_CGROUP, os.W_OK):
            return None
        try:
            path = Path(tempfile.mkdtemp(prefix=f"ratchet-{os.getpid()}-", dir=_PIDS_CGROUP))
        except OSError:
            return None
        try:
            (path / "pids.max").write_text(str(self.max_processes + 2))  # + launcher and bwrap's init
        except OSError:
            remove_cgroup(path)
            return None
        return path

    def check(self) -> None:
        """Say once (stderr) what isolation is missing; raise if the spec requires it.

        Raises:
            SandboxError: ``require_isolation`` is set and policy code would get the host's network.
        """
        level = isolation()
        if not self.enabled:
            if self.require_isolation:
                raise SandboxError("require_isolation = true conflicts with sandbox = false in [execution]")
            return
        if level == "none":
            if self.require_isolation:
                raise SandboxError("require_isolation = true, but this machine cannot give policy code its own "
                                   "network namespace; install bubblewrap (apt-get install bubblewrap) or run "
                                   "where unprivileged user namespaces are allowed")
            _warn_once("policy code runs with the host's network and filesystem (only resource limits and a "
                       "scrubbed environment apply); install bubblewrap (apt-get install bubblewrap) to isolate it")
        elif level == "bwrap" and os.geteuid() == 0 and self.drop_to_uid() is None:
            blocked = _readable_by_others(_python_paths(), _private_home())
            _warn_once(f"policy code runs as root (without capabilities), not as nobody, because {blocked} is not "
                       "readable by other users; root-owned files such as /etc/shadow stay readable to it. Install "
                       "ratchet where every user can read it to close this")
        elif level == "netns":
            _warn_once("policy code has no network but can write where this user can (bubblewrap not found; "
                       "apt-get install bubblewrap for a read-only filesystem)")
        if level == "bwrap" and not _sized_tmpfs():
            _warn_once(f"what a candidate writes is bounded per file ({_FILE_SIZE_LIMIT // 2**20} MiB), not in all "
                       "(this bubblewrap cannot size a tmpfs; version 0.8 or later can)")


_warned: set[str] = set()
_NOBODY = 65534
_hidden: set[str] = set()


def hide_from_policies(*paths: str | os.PathLike[str]) -> bool:
    """Replace each of ``paths`` (folders: the runs folder, a run's directory) by an empty one in the
    view of every worker started from now on under bubblewrap, so policy code cannot read ledgers,
    reports or other runs' policies even where it runs as the caller's uid. A folder that holds the
    Python installation or the project is left visible (hiding it would break every worker); give a
    narrower one beside it (the run's own directory). No effect without bubblewrap.

    Returns:
        Whether any of ``paths`` was not hidden before (workers already running still see it).
    """
    new = {os.path.realpath(p) for p in paths} - _hidden
    _hidden.update(new)
    for path in sorted(new):
        if isolation() == "bwrap" and any(q == path or q.startswith(path.rstrip(os.sep) + os.sep)
                                          for q in _python_paths()):
            _warn_once(f"{path} holds the Python installation or an import path, so it stays visible to "
                       "policy code; keep an evaluator's data sets and reference solutions in a folder of their own")
    return bool(new)


def _hidden_mounts(home: str | None, workdir: str) -> list[str]:
    """bubblewrap arguments that hide the folders given to :func:`hide_from_policies`."""
    def inside(p: str, q: str) -> bool:
        return p == q or p.startswith(q.rstrip(os.sep) + os.sep)

    needed = [*_python_paths(), os.path.realpath(workdir)]
    done: list[str] = [home] if home is not None else []  # the home is already an empty tmpfs
    out: list[str] = []
    for path in sorted(_hidden):  # a parent sorts before its children
        if path == os.sep or not os.path.isdir(path) or any(inside(p, path) for p in needed) \
                or any(inside(path, q) for q in done):
            continue
        done.append(path)
        out += ["--tmpfs", path, "--remount-ro", path]
    return out


def _private_home() -> str | None:
    """The caller's home directory (hidden from policy code), unless it is ``/`` or missing."""
    home = os.path.realpath(os.path.expanduser("~"))
    return home if home != "/" and os.path.isdir(home) else None


def _readable_by_others(paths: list[str], home: str | None) -> str | None:
    """The first folder or file among ``paths`` (and their parents) that a user other than its owner
    cannot reach, or None. Folders inside ``home`` are skipped: the sandbox recreates them 0755."""
    for path in paths:
        parts = Path(path).parts
        for k in range(1, len(parts) + 1):
            p = os.path.join(*parts[:k])
            if home is not None and (p == home or p.startswith(home + os.sep)) and k < len(parts):
                continue
            try:
                mode = os.stat(p).st_mode
            except OSError:
                continue
            need = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
            if k == len(parts) and stat.S_ISDIR(mode):
                need |= stat.S_IROTH
            if not mode & need:
                return p
    return None


def _python_paths() -> list[str]:
    """Paths the worker's Python needs: prefixes, the interpreter, and every import path."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable),
                  *sys.path, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    out: list[str] = []
    for p in candidates:
        if p and os.path.exists(p):
            p = os.path.realpath(p)
            if p not in out:
                out.append(p)
    # a path inside another one is bound with it
    return [p for p in out if not any(p != q and p.startswith(q + os.sep) for q in out)]


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(f"ratchet: warning: {message}", file=sys.stderr)


@functools.cache
def isolation() -> str:
    """The strongest isolation this machine gives worker processes: ``"bwrap"`` (bubblewrap works),
    ``"netns"`` (``unshare(2)`` of a network namespace works) or ``"none"``. Probed once per process."""
    if os.environ.get("RATCHET_FORCE_ISOLATION") in ("bwrap", "netns", "none"):  # for tests of the fallbacks
        return os.environ["RATCHET_FORCE_ISOLATION"]
    if shutil.which("bwrap"):
        try:
            probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                                    "--unshare-net", "--unshare-pid", "--cap-drop", "ALL", "--", "true"],
                                   capture_output=True, timeout=30, check=False)
            if probe.returncode == 0:
                return "bwrap"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        probe = subprocess.run([sys.executable, "-c", ("from ratchet.execution.sandbox import _unshare_net;"
                                "raise SystemExit(0 if _unshare_net() else 1)")], capture_output=True, timeout=60,
                               check=False)
        if probe.returncode == 0:
            return "netns"
    except (OSError, subprocess.SubprocessError):
        pass
    return "none"


@functools.cache
def _sized_tmpfs() -> bool:
    """Whether this bubblewrap can make a tmpfs of a given size and mode (``--size``, ``--perms``: 0.8 and later).
    Probed once per process."""
    try:
        probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--perms", "0777", "--size", str(2**20),
                                "--tmpfs", "/tmp", "--", "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _unshare_net() -> bool:
    """Move this process into a new, empty network namespace (a user namespace first when not root)."""
    import ctypes

    clone_newnet, clone_newuser = 0x40000000, 0x10000000
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    if libc.unshare(clone_newnet) == 0:
        return True
    return libc.unshare(clone_newuser | clone_newnet) == 0


def confine(settings: dict[str, Any]) -> None:
    """Called by a worker on itself before it reads a job: resource limits, a network namespace
    where bubblewrap did not give one, and child-subreaper status (so every process the policy
    starts stays this worker's descendant and is reaped by :func:`reap_strays`).

    Raises:
        SandboxError: ``require_isolation`` is set and the network namespace could not be made.
    """
    import ctypes
    import resource

    uid = settings.get("drop_to")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)  # from root to another uid: every capability is gone too

    def limit(which: int, value: int) -> None:
        _soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))

    limit(resource.RLIMIT_AS, int(settings["memory_limit_mb"]) * 2**20)
    limit(resource.RLIMIT_NOFILE, int(settings["max_open_files"]))
    limit(resource.RLIMIT_FSIZE, _FILE_SIZE_LIMIT)
    if not settings.get("cgroup") and os.geteuid() != 0:  # a pids cgroup, where there is one, is exact
        limit(resource.RLIMIT_NPROC, _user_processes() + int(settings["max_processes"]))
    rearm_cpu_limit(int(settings["cpu_limit_s"]))
    try:
        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
    if settings.get("isolation") == "netns" and not _unshare_net() and settings.get("require_isolation"):
        raise SandboxError("could not create a network namespace for the worker")


def rearm_cpu_limit(seconds: int) -> None:
    """Let this process use ``seconds`` more CPU time from now (soft ``RLIMIT_CPU``; SIGXCPU past it).
    Child processes inherit the limit, counted from their own start. The per-episode wall-clock
    timeout in the parent is the guarantee; this bounds CPU that escapes it (e.g. forked children)."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime) + seconds
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def reap_strays() -> int:
    """Kill and reap every child process still running (a policy's forks; orphans re-parent here
    because the worker is a child subreaper). Returns how many there were."""
    me, killed = os.getpid(), 0
    for _ in range(50):  # a fork bomb may be forking while we kill; bounded by the pids limit
        kids = _children(me)
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    time.sleep(0.005)
            except ChildProcessError:
                break
    return killed


def clear_folder(folder: str, keep: Collection[str] = ()) -> bool:
    """Remove every entry of ``folder`` but those named in ``keep``, whatever modes policy code gave them (a folder
    it made unreadable is opened up first; links are removed, never followed). Call it only once every process
    that could write there is gone.

    Returns:
        Whether it worked: False when something could not be removed (a tree too deep, a path too long, a file
        this uid may not remove), so the caller can give up the folder instead of handing it on.
    """
    def remove(path: str) -> None:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.chmod(path, 0o700)  # a folder, not a link to one: lstat says so, and nothing else runs now
            for name in os.listdir(path):
                remove(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.unlink(path)

    try:
        for name in os.listdir(folder):
            if name not in keep:
                remove(os.path.join(folder, name))
    except (OSError, RecursionError):
        return False
    return True


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/PID/task/*/children``; a full ``/proc`` scan where the
    kernel lacks that file)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = []
    out: list[int] = []
    found = False
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
        except OSError:
            continue
        found = True
        try:
            out += [int(x) for x in os.read(fd, 1 << 16).split()]
        finally:
            os.close(fd)
    if found:
        return out
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _user_processes() -> int:
    uid, n = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                n += entry.stat().st_uid == uid
            except OSError:
                pass
    return n


def remove_cgroup(path: Path) -> None:
    """Kill whatever is left in a worker's pids cgroup and remove it (best effort)."""
    for _ in range(100):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def sweep_leftovers() -> int:
    """Remove worker directories (``$TMPDIR/ratchet-worker-<pid>-*``) and pids cgroups
    (``ratchet-<pid>-*``) left by ratchet processes that are gone (``kill -9`` gives them no chance to
    clean up). Best effort; returns how many were removed."""
    removed = 0
    places = [(Path(tempfile.gettempdir()), "ratchet-worker-")]
    if os.access(_PIDS_CGROUP, os.W_OK):
        places.append((_PIDS_CGROUP, "ratchet-"))
    for folder, prefix in places:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for path in entries:
            rest = path.name[len(prefix):] if path.name.startswith(prefix) else ""
            pid = rest.split("-", 1)[0]
            if not pid.isdigit() or process_running(int(pid)) or not path.is_dir():
                continue
            if folder == _PIDS_CGROUP:
                remove_cgroup(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
            removed += not path.exists()
    return removed
