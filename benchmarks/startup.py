"""Worker start-up: what a fresh worker process pays before its first episode.

Every episode batch, training job and resumed run starts Python processes that import ratchet; what
``import ratchet.execution.worker`` pulls in is paid once per worker. Measures, in fresh processes, the import
time of the worker module (``python -X importtime``) and the wall clock and child CPU time of starting a
2-worker process pool and running 4 CartPole episodes on it, repeated.

Usage: python benchmarks/startup.py [--pools N] [--ref GIT_REF] [--write]
``--ref`` also measures a git ref (checked out into a temporary worktree) beside the working tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import machine, write_section

ROOT = Path(__file__).resolve().parents[1]

_POOLS = """
import json, resource, sys, time
from ratchet.execution import Job
from ratchet.execution.process import ProcessExecutor
from ratchet.policy import load_policy
from ratchet.task import GymTask
pools = int(sys.argv[1])
task, prog = GymTask("CartPole-v1"), load_policy(sys.argv[2])
t0 = time.perf_counter()
for _ in range(pools):
    with ProcessExecutor(workers=2) as ex:
        ex.run(task, [Job(prog.candidate(), s) for s in range(4)])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([time.perf_counter() - t0, r.ru_utime + r.ru_stime]))
"""


def measure(src: Path, pools: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import ratchet.execution.worker"], env=env,
                         capture_output=True, text=True, check=True).stderr.strip().splitlines()
    worker_import = int(out[-1].split("|")[1]) / 1e6  # cumulative microseconds of the last (outermost) import
    wall, cpu = json.loads(subprocess.run([sys.executable, "-c", _POOLS, str(pools),
                                           str(ROOT / "examples/cartpole/policy.py")], env=env, capture_output=True,
                                          text=True, check=True).stdout)
    return {"worker_import_s": worker_import, "wall_s": wall, "child_cpu_s": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, default=3)
    ap.add_argument("--ref", help="a git ref to measure beside the working tree (e.g. a commit before a change)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.ref:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tmp + "/ref", args.ref],
                           check=True, capture_output=True)
            try:
                rows.append((args.ref, measure(Path(tmp) / "ref" / "src", args.pools)))
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp + "/ref"],
                               capture_output=True, check=False)  # best effort: the temporary worktree may be gone
        rows.append(("working tree", measure(ROOT / "src", args.pools)))
    lines = [(f"| code | `import ratchet.execution.worker` (s) | {args.pools} pools × (2 workers + 4 episodes): wall (s) "
              "| child CPU (s) |"), "|---|---|---|---|"]
    lines += [f"| {name} | {m['worker_import_s']:.2f} | {m['wall_s']:.2f} | {m['child_cpu_s']:.2f} |" for name, m in rows]
    table = "\n".join(lines)
    print(table)
    if args.write:
        cmd = "python benchmarks/startup.py" + (f" --ref {args.ref}" if args.ref else "") + f" --pools {args.pools} --write"
        write_section("Worker start-up", f"Command: `{cmd}`\n\nMachine: {machine()}\n\n{table}\n")


if __name__ == "__main__":
    main()
