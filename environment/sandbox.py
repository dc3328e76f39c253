"""A process sandbox for the Python_Coder tool: run a model-written snippet, return its output.

The official AgentFlow code exec()s the snippet inside the agent process with a thread "timeout"
that cannot stop it, so an infinite loop or a 20 GB allocation takes the agent down with it.
Here `run_python(code)` runs the snippet in a separate interpreter and always comes back, within
`timeout + 2` seconds, with the printed output or a one-line error, and never raises.

What the sandbox does:
- A fresh interpreter (`sys.executable -E -s snippet.py`) in a fresh temporary folder, which is
  its working directory, HOME and TMPDIR, and which is removed afterwards. The folder's random name
  is written "." in the result (a traceback's `File "./snippet.py"`): the result goes into the
  agent's memory and prompts, and a name that changes from call to call made two rollouts from the
  same seed differ.
- An environment stripped of every variable of the caller (only PATH, LANG, HOME, a few thread
  caps and our marker), so API keys in the agent's environment do not leak into os.environ.
- Resource limits set in the child: RLIMIT_CPU a little above the timeout, RLIMIT_AS = memory_mb
  (a big allocation raises MemoryError), RLIMIT_FSIZE = file_size_mb (a big file raises
  "OSError: [Errno 27] File too large"), RLIMIT_CORE = 0, and RLIMIT_NPROC = the processes the
  user already has + max_processes (the kernel does not enforce RLIMIT_NPROC for root).
- A wall-clock timeout that SIGKILLs the whole process group. The output pipes are read with
  select() against the deadline, so a grandchild that keeps a pipe open cannot stall the call
  (environment/sandbox_output.py).
- stdout then stderr captured with bounded memory: each stream keeps only its first and last
  max_output_chars characters and counts the rest, so 10^9 printed characters cost the caller
  a few kilobytes; the result is cut in the middle with a note of how much was cut
  (environment/sandbox_output.py, with the one-line error).
- No process of the snippet survives the call. Every process carries a unique marker in its
  environment (AGENTFLOW_SANDBOX_RUN=<uuid>, inherited through fork and exec); after the call we
  kill the process group, then scan /proc/*/environ for the marker and SIGKILL every match until
  none is left, which also catches a child that called setsid() and double-forked
  (environment/reaping.py). A process
  that exec()s with an empty environment escapes the scan, but not the PID namespace, which the
  kernel empties when it ends (without isolation, it survives). The snippet and its supervisor
  also die with their parent (prctl PR_SET_PDEATHSIG), so a crash of the agent does not leave
  them running.
- A small supervisor process sits between the caller and the snippet, so os.kill(os.getppid())
  in the snippet hits the supervisor (the call returns "killed by signal 9"), not the agent.
- When the caller is root, the snippet runs as the unprivileged user nobody (uid 65534), but
  only if nobody can start the interpreter: on machines where Python lives under /root/.pyenv
  and /root is mode 0700 it cannot, and we fall back to the current user. The check runs once and
  is cached (see `sandbox_user()`).
- Namespaces (environment/isolation.py, with bubblewrap), where the machine allows them: the
  snippet sees only its own processes, has no network (not even the machine's loopback), sees a
  read-only file system with its folder the only writable one, and sees HOME, /tmp, /var, /run and
  the project empty (the interpreter's prefix is bound back). isolation.py says what each layer
  stops. AGENTFLOW_SANDBOX (or set_mode()) chooses: auto (default; where isolation is unavailable
  one line on stderr, then as before), strict (refuse), off (no namespaces). Through bwrap the
  supervisor reports the snippet's wait status on a pipe, as bwrap folds signals into 128 + N.

What it does NOT isolate: the kernel (namespaces without a seccomp filter leave its system calls
reachable), CPU and disk shares beyond the rlimits (the folder's total size is not capped), and,
as root, root-owned files outside the hidden folders (readable, not writable). Without isolation
(mode off, no bwrap, namespaces disabled, not Linux) it is the sandbox without namespaces: a
snippet can read and write whatever its user can (everything, as root), read
/proc/<agent pid>/environ, signal the agent by pid and open sockets. The time bound assumes the
snippet's folder is quick to delete: one that creates hundreds of thousands of files can delay
the return by the time rmtree needs. For untrusted workloads run the whole agent in a container:

    docker run --rm --network none --read-only --tmpfs /tmp --pids-limit 256 --memory 4g \\
        --cap-drop ALL --security-opt no-new-privileges --user 65534:65534 IMAGE ...

Differences from the official code: a real process boundary instead of exec(); output is cut to
the official 3,500 characters in the middle, keeping its head and its tail (errors come last); an
empty result reads "(no output: print the result to see it)" so the planner sees why.

Try:   python -m environment.sandbox snippet.py   (run a file exactly as Python_Coder does; the result as JSON)
Test:  python -m pytest -q tests/test_sandbox.py
Bench: python -m environment.sandbox --bench   (per-call latency with isolation off and on)
"""

import argparse
import json
import math
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache

if not __package__:  # run by path (python environment/sandbox.py): the repository root, not this folder, goes on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from environment import isolation
from environment.reaping import MARKER_NAME, kill_everything, live_sandbox_processes  # noqa: F401 (live_sandbox_processes: the API)
from environment.sandbox_output import Capture, combine, error_line, read_until

NOBODY_UID = 65534  # the conventional unprivileged user and group (nobody / nogroup)
CLEANUP_SECONDS = 1.5  # time allowed after the deadline for killing, draining and reaping


@dataclass
class ExecResult:
    ok: bool  # True when the snippet exited with status 0 and did not time out
    output: str  # stdout then stderr, decoded with errors="replace", cut in the middle if long
    error: str  # one line saying what went wrong ("timed out after 10 s", "MemoryError"); "" if ok
    returncode: int | None  # exit status of the supervisor (negative: killed by that signal)
    seconds: float  # wall-clock seconds of the whole call

    def as_text(self) -> str:
        """What the agent records as the tool result."""
        if self.ok:
            return self.output if self.output.strip() else "(no output: print the result to see it)"
        if self.output.strip():
            return f"{self.output.rstrip()}\nError: {self.error}"
        return f"Error: {self.error}"


# The supervisor runs as `python -I -c _SUPERVISOR <json>`. It sets the limits on itself (they are
# inherited through fork and exec), forks, and the child execs the snippet's interpreter. Setting
# limits here rather than in a Popen preexec_fn keeps run_python safe to call from threads.
_SUPERVISOR = r"""
import ctypes, json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)

def die_with(parent_pid):
    # PR_SET_PDEATHSIG = 1: the kernel sends SIGKILL to us when our parent exits.
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(137)

# In a PID namespace the caller's pid means nothing; our parent there is bwrap's init.
die_with(os.getppid() if cfg["parent_pid"] is None else cfg["parent_pid"])
status_fd = cfg["status_fd"]
uid = os.getuid()
if cfg["max_processes"] is not None:
    # RLIMIT_NPROC counts every process of the user, so allow what it already runs plus a margin.
    running = 0
    for name in os.listdir("/proc"):
        try:
            running += name.isdigit() and os.stat("/proc/" + name).st_uid == uid
        except OSError:
            pass
    cfg["limits"]["RLIMIT_NPROC"] = running + cfg["max_processes"]
for name, value in cfg["limits"].items():
    soft, hard = value if isinstance(value, list) else (value, value)
    try:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    except (ValueError, OSError) as exc:
        print(f"sandbox: could not set {name}: {exc}", file=sys.stderr)
supervisor_pid = os.getpid()
pid = os.fork()
if pid == 0:
    die_with(supervisor_pid)
    try:
        if status_fd is not None:
            os.close(status_fd)
        os.execv(sys.executable, [sys.executable, "-E", "-s", cfg["script"]])
    finally:
        os._exit(127)
_, status = os.waitpid(pid, 0)
if status_fd is not None:
    # bwrap reports a death by signal N as exit status 128 + N, so tell the caller the real status.
    os.write(status_fd, str(status).encode())
if os.WIFSIGNALED(status):
    # Die of the same signal so that the caller sees it (Python ignores SIGPIPE and SIGXFSZ).
    sig = os.WTERMSIG(status)
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)
os._exit(os.WEXITSTATUS(status))
"""


@lru_cache(maxsize=1)
def sandbox_user() -> tuple[int, int] | None:
    """(uid, gid) to run snippets as, or None to run them as the current user.

    Only root can switch users. Even then the switch only helps if nobody can start the
    interpreter: when Python lives under /root/.pyenv and /root is mode 0700, nobody cannot
    even read it, so we try once (cached) and fall back to the current user if it fails.
    """
    if os.geteuid() != 0:
        return None
    try:
        uid = pwd.getpwnam("nobody").pw_uid
        gid = pwd.getpwnam("nobody").pw_gid
    except KeyError:
        uid = gid = NOBODY_UID
    try:
        probe = subprocess.run([sys.executable, "-I", "-c", "pass"], user=uid, group=gid,
                               extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (uid, gid) if probe.returncode == 0 else None


def run_python(code: str, timeout: float = 10.0, max_output_chars: int = 3500,
               memory_mb: int = 1024, file_size_mb: int = 16,
               max_processes: int = 128, mode: str | None = None) -> ExecResult:
    """Run a Python snippet in a sandboxed process and return what it printed.

    `mode` (auto, strict, off) overrides set_mode() and AGENTFLOW_SANDBOX for this call; a refusal
    of strict mode is an ExecResult whose error says what to change.
    Never raises because of the snippet; raises ValueError only for nonsensical limits or modes.
    Example: run_python("print(6 * 7)").as_text() == "42\\n";
             run_python("1/0").error == "ZeroDivisionError: division by zero".
    """
    if not isinstance(code, str):
        raise ValueError(f"code must be a str of Python source, got {type(code).__name__}")
    for name, value in [("timeout", timeout), ("max_output_chars", max_output_chars),
                        ("memory_mb", memory_mb), ("file_size_mb", file_size_mb),
                        ("max_processes", max_processes)]:
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    mode = isolation.current_mode(mode)
    start = time.monotonic()
    deadline = start + timeout
    token = uuid.uuid4().hex
    marker = f"{MARKER_NAME}={token}"  # the environ entry that tags every process of this call
    workdir = proc = status_read = status_write = None
    try:
        launcher = isolation.launcher(mode, sandbox_user())
    except isolation.Unavailable as exc:
        return ExecResult(False, "", str(exc), None, time.monotonic() - start)
    # The user the processes run as outside any namespace (None: the caller's own).
    user = launcher.run_as if launcher else sandbox_user()
    try:
        # 1. A fresh folder with the snippet in it, owned by the user that will run it.
        workdir = tempfile.mkdtemp(prefix="agentflow_sandbox_")
        script = os.path.join(workdir, "snippet.py")
        with open(script, "w", encoding="utf-8", errors="replace") as f:
            f.write(code)
        if user is not None:
            os.chown(workdir, *user)
            os.chown(script, *user)
        # 2. Start the supervisor in a new session (its own process group) with a minimal env.
        env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
               "MPLBACKEND": "Agg", "MPLCONFIGDIR": workdir,
               # One BLAS/OpenMP thread: cheaper under RLIMIT_AS, and fair to the agent's CPUs.
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               MARKER_NAME: token}
        cpu_seconds = math.ceil(timeout) + 1  # SIGXCPU a bit after the wall-clock deadline
        command = [sys.executable, "-I", "-c", _SUPERVISOR]
        if launcher is not None:
            # In namespaces bwrap starts the supervisor, which reports the snippet status on a pipe.
            command = launcher.command(workdir, memory_mb) + command
            status_read, status_write = os.pipe()
            os.set_blocking(status_read, False)
        config = {"parent_pid": None if launcher else os.getpid(), "status_fd": status_write,
                  "script": script,
                  # NPROC is only worth setting where the kernel enforces it (not for root).
                  "max_processes": max_processes if os.geteuid() != 0 or user else None,
                  "limits": {"RLIMIT_CPU": [cpu_seconds, cpu_seconds + 1],
                             "RLIMIT_AS": memory_mb << 20, "RLIMIT_FSIZE": file_size_mb << 20,
                             "RLIMIT_CORE": 0}}
        uid_args = {"user": user[0], "group": user[1], "extra_groups": []} if user else {}
        proc = subprocess.Popen(command + [json.dumps(config)],
                                cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True,
                                pass_fds=() if status_write is None else (status_write,),
                                **uid_args)
        if status_write is not None:
            os.close(status_write)
            status_write = None
        # 3. Read output until the supervisor exits or the deadline passes.
        stdout, stderr = Capture(max_output_chars), Capture(max_output_chars)
        streams = {proc.stdout.fileno(): stdout, proc.stderr.fileno(): stderr}
        timed_out = read_until(streams, deadline, proc)
        # 4. Kill whatever is left, then drain what is still in the pipes (writers are dead now).
        cleanup_deadline = max(time.monotonic(), deadline) + CLEANUP_SECONDS
        kill_everything(proc.pid, marker, cleanup_deadline - 0.5)
        read_until(streams, cleanup_deadline - 0.3, None)
        stdout.feed(b"", final=True)
        stderr.feed(b"", final=True)
        try:
            returncode = proc.wait(timeout=max(0.01, cleanup_deadline - 0.2 - time.monotonic()))
        except subprocess.TimeoutExpired:
            returncode = None
        if status_read is not None and returncode is not None:
            returncode = _supervisor_returncode(status_read, returncode)
        output = combine(stdout, stderr, max_output_chars).replace(workdir, ".")
        if returncode == 0 and not timed_out:
            return ExecResult(True, output, "", 0, time.monotonic() - start)
        error = error_line(returncode if returncode is not None else -signal.SIGKILL,
                            timed_out, timeout, stderr, memory_mb, file_size_mb).replace(workdir, ".")
        return ExecResult(False, output, error, returncode, time.monotonic() - start)
    except Exception as exc:  # the sandbox itself failed (no fork, disk full): report, never raise
        return ExecResult(False, "", f"sandbox could not run the code: {type(exc).__name__}: {exc}",
                          None, time.monotonic() - start)
    finally:
        # 5. Nothing of the snippet may outlive the call: processes first, then its folder.
        if proc is not None:
            # Only an unreaped supervisor still reserves its pgid, so only then kill the group.
            pgid = proc.pid if proc.returncode is None else None
            kill_everything(pgid, marker, time.monotonic() + 0.2)
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
            if proc.returncode is None:
                try:
                    proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
        for fd in (status_read, status_write):
            if fd is not None:
                os.close(fd)
        if workdir is not None:
            _remove_tree(workdir)


def _supervisor_returncode(status_read: int, bwrap_returncode: int) -> int:
    """The supervisor's exit status as subprocess would give it, seen through bwrap."""
    try:
        status = int(os.read(status_read, 64))
    except (BlockingIOError, ValueError):  # no report: the supervisor itself was killed
        # bwrap turns a death by signal N into exit status 128 + N; negative: bwrap was killed.
        return 128 - bwrap_returncode if bwrap_returncode > 128 else bwrap_returncode
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _remove_tree(path: str) -> None:
    """Remove `path`, first making folders writable (a snippet may chmod 000 what it made)."""
    def make_writable_and_retry(func, failed_path, _exc):
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            if os.path.isdir(failed_path) and not os.path.islink(failed_path):
                os.chmod(failed_path, 0o700)
            func(failed_path)
        except OSError:
            pass
    shutil.rmtree(path, onerror=make_writable_and_retry)


def set_mode(mode: str | None) -> None:
    """Isolate snippets in `mode`: auto (default), strict or off; None: AGENTFLOW_SANDBOX decides.

    Raises ValueError for another value, and isolation.Unavailable (a RuntimeError whose message
    says what to change) when strict mode cannot be had here, so a run can refuse before any work.
    """
    isolation.set_mode(mode)
    if isolation.current_mode() == "strict":
        isolation.launcher("strict", sandbox_user())


def _bench(calls: int) -> None:
    """Per-call latency of print(1) with isolation off and on, alternating in the same run."""
    times = {"off": [], "strict": []}
    for mode in times:  # warm-up: the first isolated call also probes bwrap
        run_python("print(1)", mode=mode)
    for _ in range(calls):
        for mode, samples in times.items():
            result = run_python("print(1)", mode=mode)
            if not result.ok:
                sys.exit(f"sandbox --bench: print(1) failed with isolation {mode}: {result.error}")
            samples.append(result.seconds * 1000)
    stats = {mode: (statistics.median(samples), statistics.quantiles(samples, n=10)[-1])
             for mode, samples in times.items()}
    print(f"run_python('print(1)'): {calls} calls per setting, alternating, "
          f"on {os.cpu_count()} CPUs")
    for mode, label in (("off", "isolation off"), ("strict", "isolation on ")):
        print(f"  {label}  median {stats[mode][0]:6.1f} ms   p90 {stats[mode][1]:6.1f} ms")
    print(f"  cost of isolation: {stats['strict'][0] - stats['off'][0]:+.1f} ms median, "
          f"{stats['strict'][1] - stats['off'][1]:+.1f} ms p90")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m environment.sandbox",
        description="Python_Coder's sandbox: run FILE exactly as Python_Coder does (the result as JSON), "
                    "say whether snippets run isolated here, or time it.")
    parser.add_argument("file", nargs="?", help="a Python file to run in the sandbox, as Python_Coder runs a program")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds of wall clock for FILE (default 10)")
    parser.add_argument("--bench", action="store_true",
                        help="time print(1) with isolation off and on, in the same run")
    parser.add_argument("--calls", type=int, default=20, help="calls per setting (default 20)")
    args = parser.parse_args(argv)
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    if args.file:
        try:
            code = open(args.file, encoding="utf-8", errors="replace").read()
        except OSError as e:
            sys.exit(f"cannot read {args.file}: {e.strerror}")
        res = run_python(code, timeout=args.timeout)
        print(json.dumps({"ok": res.ok, "output": res.output, "error": res.error, "returncode": res.returncode,
                          "seconds": round(res.seconds, 3)}, indent=2))
        return
    if args.bench:
        return _bench(args.calls)
    mode = isolation.current_mode()
    try:
        launcher = isolation.launcher("strict", sandbox_user())
    except isolation.Unavailable as exc:
        print(f"mode {mode}; isolation unavailable: {exc}")
        return
    print(f"mode {mode}; isolation available: {launcher.bwrap}, "
          f"{'on' if mode != 'off' else 'but off'} for snippets")


if __name__ == "__main__":
    main()
