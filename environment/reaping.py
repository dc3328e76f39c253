"""No process of a sandboxed snippet survives its call (environment/sandbox.py's cleanup).

Every process of a snippet carries a unique marker in its environment (MARKER_NAME=<uuid>, inherited
through fork and exec). After the call, kill_everything SIGKILLs the snippet's process group, then
scans /proc/*/environ for the marker and kills every match until none is left, which also catches a
child that called setsid() and double-forked. A process that exec()s with an empty environment
escapes the scan; in a PID namespace (environment/isolation.py) it dies with the namespace, which is
why the group is watched too.

Test: python -m pytest -q tests/test_sandbox.py
"""

import os
import signal
import time

MARKER_NAME = "AGENTFLOW_SANDBOX_RUN"  # environment variable that tags every process of a snippet


def pids_with_environ_entry(prefix: bytes) -> list[int]:
    """Pids of live processes whose environment has an entry starting with `prefix`."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:  # exited meanwhile, or belongs to another user
            continue
        # A zombie has no memory any more, so its environ reads empty and it is not counted.
        if any(entry.startswith(prefix) for entry in entries):
            pids.append(int(name))
    return pids


def live_sandbox_processes() -> list[int]:
    """Pids still carrying any sandbox marker (from any run_python call, in any process)."""
    return pids_with_environ_entry(MARKER_NAME.encode() + b"=")


def group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running (zombies do not count)."""
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state, _ppid, group = f.read().rsplit(b")", 1)[1].split()[:3]
        except (OSError, ValueError):  # not a process, or exited meanwhile
            continue
        if state != b"Z" and int(group) == pgid:
            return True
    return False


def kill_everything(pgid: int | None, marker: str, deadline: float) -> None:
    """SIGKILL the process group and every process carrying `marker`, until none is running."""
    # A process may fork while we kill its parent, so kill again until a scan finds nothing. The
    # group is watched too: in namespaces, a process that wiped its environment dies with the
    # namespace, which the kernel empties while bwrap's init (in our group) exits.
    # (A pid could in theory be reused between the scan and the kill; the window is microseconds.)
    while True:
        try:
            if pgid is not None:
                os.killpg(pgid, signal.SIGKILL)
        except OSError:  # the group is already empty
            pass
        pids = pids_with_environ_entry(marker.encode())
        if not pids and (pgid is None or not group_running(pgid)) or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)
