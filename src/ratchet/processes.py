"""Small process helpers shared by the ledger projection and the sandbox."""

from __future__ import annotations

import os

__all__ = ["process_running"]


def process_running(pid: int) -> bool:
    """Whether process ``pid`` on this machine is running. A zombie (killed, not yet reaped) is not;
    a process we may not signal (another user's) is. A pid that no process can have (not an int, ≤ 0, beyond
    ``pid_t``: read from a damaged ledger or lease) is not running."""
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
