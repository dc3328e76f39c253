"""Namespaces for the Python_Coder sandbox: a snippet cannot reach out of its own call.

sandbox.py bounds what a snippet does to itself and to the call (time, memory, output, survivors).
This module keeps it away from everything else on the machine. It wraps the sandbox's supervisor in
bubblewrap (`bwrap`, the unprivileged sandboxing tool Flatpak is built on), which creates the
namespaces and mounts from a list of arguments, so the only code of ours is that list, a one-time
probe and the settings. Each layer and what it stops:

- A user namespace without capabilities (--unshare-user, --cap-drop ALL; bwrap also sets
  no_new_privs). Root outside is an ordinary uid inside: no CAP_DAC_OVERRIDE to read other users'
  files, no CAP_KILL, no CAP_SYS_ADMIN, and setuid programs do not raise it. --disable-userns (where
  bwrap has it) forbids nested user namespaces, which many kernel exploits start from.
- A PID namespace with its own /proc (--unshare-pid, --proc /proc). The snippet sees and can signal
  only its own processes: the agent's /proc/<pid>/environ (API keys) and os.kill(<agent pid>) are
  out of reach (ProcessLookupError). The agent still sees the snippet's processes in its own /proc,
  so the marker scan of sandbox.py finds and kills them; and when the namespace's first process
  dies the kernel kills every process in it, including one that wiped its environment.
- An empty network namespace (--unshare-net): a loopback of its own with nothing listening, no route
  to the machine's loopback (a local vLLM or llama.cpp server, the tests' servers) nor to any
  network; the host's abstract Unix sockets are gone with it.
- A read-only view of the file system (--ro-bind / /) with empty read-only folders over the places
  that hold people's and the project's data: HOME, /home, /root, /tmp, /var, /run, /mnt, /media,
  /srv, /etc/ssh, the project folder, the current folder and AGENTFLOW_CACHE; /etc/shadow and
  /etc/gshadow cannot be opened. The interpreter's prefix is bound back read-only, so a Python under
  ~/.pyenv still runs while the rest of HOME (~/.cache, keys, checkpoints) is invisible. Hiding /run
  and /tmp also hides the Unix sockets there (docker, D-Bus, X11). Writable: the snippet's own
  folder (bound back at its path) and a private /dev/shm of memory_mb (for multiprocessing) that
  vanishes with the call; a fresh /dev holds only null, zero, full, random, urandom, tty and pts.
- IPC, UTS and cgroup namespaces (--unshare-all): no System V or POSIX IPC shared with the host.
- --die-with-parent: the namespace dies with the agent.

What is left (the container recipe in README.md covers it): the kernel itself (no seccomp filter,
so a kernel bug is reachable), CPU and memory shares beyond the rlimits, the rest of the file system
readable as Unix permissions allow (as root that includes root-owned files outside the hidden
folders) with any Unix socket that lives outside them, and machines without bwrap.

Settings: AGENTFLOW_SANDBOX=auto (default: isolate where bwrap works, else say so once in one line
on stderr and run snippets as before), strict (refuse to run snippets unisolated), off (never
isolate); sandbox.set_mode() overrides the variable. setup.sh installs bubblewrap when run as root
with apt.

Test: python -m pytest -q tests/test_sandbox.py
"""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

MODE_VARIABLE = "AGENTFLOW_SANDBOX"
MODES = ("auto", "strict", "off")
BWRAP = "bwrap"  # looked up on PATH at first use; tests point it elsewhere to make it unavailable
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALWAYS_HIDDEN = ("/home", "/root", "/tmp", "/var", "/run", "/mnt", "/media", "/srv", "/etc/ssh")
HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow")
# Never hidden, even when HOME or the current folder is one of them: the snippet needs them.
SYSTEM_DIRS = frozenset({"/", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt",
                         "/proc", "/sys", "/dev"})
HOW_TO_ISOLATE = ("install bubblewrap (as root: apt-get install bubblewrap, or bash setup.sh) and "
                  "allow user namespaces (sysctl user.max_user_namespaces > 0)")

_mode: str | None = None  # set by set_mode(); None: AGENTFLOW_SANDBOX decides
_lock = threading.Lock()  # one probe and one notice even when threads call run_python at once
_launchers: dict = {}  # (bwrap name, user) -> Launcher, or the reason isolation is unavailable
_noticed = False  # the one-line notice of auto mode has been printed


class Unavailable(RuntimeError):
    """Isolation is required (strict mode) but this machine cannot provide it."""


def set_mode(mode: str | None) -> None:
    """Use `mode` (auto, strict or off) from now on, whatever AGENTFLOW_SANDBOX says.

    None gives the choice back to the variable.
    """
    global _mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"sandbox mode must be one of {', '.join(MODES)}, got {mode!r}")
    _mode = mode


def current_mode(mode: str | None = None) -> str:
    """The mode of a call: its own `mode`, else set_mode()'s, else AGENTFLOW_SANDBOX, else auto."""
    for source, value in (("mode", mode), ("sandbox.set_mode()", _mode),
                          (MODE_VARIABLE, os.environ.get(MODE_VARIABLE) or None)):
        if value is not None:
            if value not in MODES:
                raise ValueError(f"{source} must be one of {', '.join(MODES)}, got {value!r}")
            return value
    return "auto"


def _under(path: str, folders) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def _outermost(paths, exclude=frozenset()) -> list[str]:
    """The existing folders among `paths`, resolved, less `exclude` and those inside another one."""
    real = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)} - exclude
    return sorted(p for p in real if not _under(p, real - {p}))


def hidden_folders() -> list[str]:
    """Folders the snippet sees empty: people's homes and data, the project, temporary files."""
    candidates = [*ALWAYS_HIDDEN, os.path.expanduser("~"), tempfile.gettempdir(), PROJECT_DIR,
                  os.environ.get("AGENTFLOW_CACHE")]
    try:
        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid without a passwd entry (common in containers)
        pass
    try:
        candidates.append(os.getcwd())
    except OSError:  # the current folder was deleted
        pass
    return _outermost(candidates, SYSTEM_DIRS)


def interpreter_folders() -> list[str]:
    """Folders the interpreter needs (a venv and the Python it was made from)."""
    return _outermost([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                       os.path.dirname(os.path.realpath(sys.executable or "/"))])


@dataclass(frozen=True)
class Launcher:
    bwrap: str  # path of the bwrap executable
    run_as: tuple[int, int] | None  # (uid, gid) that starts bwrap; None: the caller
    inside: tuple[int, int] | None  # (uid, gid) the snippet has inside; None: the same as outside
    features: frozenset  # optional flags this bwrap supports

    def command(self, workdir: str, shm_mb: int) -> list[str]:
        """The bwrap arguments that run a command in namespaces, with `workdir` its only folder."""
        hidden = hidden_folders()
        cmd = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent",
               "--cap-drop", "ALL",
               *(["--disable-userns"] if "--disable-userns" in self.features else []),
               "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
               *(["--size", str(shm_mb << 20)] if "--size" in self.features else []),
               "--tmpfs", "/dev/shm"]
        for folder in hidden:
            cmd += ["--tmpfs", folder]
        for name in HIDDEN_FILES:
            if os.path.exists(name):
                cmd += ["--ro-bind", "/dev/null", name]
        # bwrap reads a source from the real file system, so folders under an emptied one come back.
        for folder in interpreter_folders():
            if _under(folder, hidden):
                cmd += ["--ro-bind", folder, folder]
        cmd += ["--bind", workdir, workdir]
        # The emptied folders and /dev become read-only only now: bwrap had to create mount points
        # in them. --remount-ro is not recursive, so the workdir bound inside stays writable.
        for folder in [*hidden, "/dev"]:
            cmd += ["--remount-ro", folder]
        if self.inside is not None:
            cmd += ["--uid", str(self.inside[0]), "--gid", str(self.inside[1])]
        return cmd + ["--chdir", workdir, "--"]


def _probe(launcher: Launcher) -> str | None:
    """Start the interpreter the way snippets will be started; None if it worked, else why not."""
    workdir = tempfile.mkdtemp(prefix="agentflow_sandbox_probe_")
    try:
        user_args = {}
        if launcher.run_as is not None:
            os.chown(workdir, *launcher.run_as)
            user_args = {"user": launcher.run_as[0], "group": launcher.run_as[1],
                         "extra_groups": []}
        done = subprocess.run(launcher.command(workdir, 16) + [sys.executable, "-I", "-c", "pass"],
                              cwd="/", env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=20,
                              **user_args)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"bwrap exited with status {done.returncode}"


def _find(user: tuple[int, int] | None) -> "Launcher | str":
    """A launcher that works here for snippets run as `user`, or the reason there is none."""
    if not sys.platform.startswith("linux"):
        return f"namespaces need Linux, this is {sys.platform}"
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{bwrap} --help failed: {exc}"
    features = frozenset(flag for flag in ("--disable-userns", "--size") if flag in usage)
    # Start bwrap as `user` (nobody, when the agent is root and nobody can run the interpreter),
    # so that even a namespace escape lands as nobody. Where nobody may not create namespaces but
    # root may, root starts it and the snippet is mapped to the same uid inside.
    tries = [Launcher(bwrap, user, None, features)]
    if user is not None and os.geteuid() == 0:
        tries.append(Launcher(bwrap, None, user, features))
    errors = []
    for launcher in tries:
        error = _probe(launcher)
        if error is None:
            return launcher
        errors.append(error)
    return f"bwrap cannot create namespaces here ({errors[0]})"


def launcher(mode: str, user: tuple[int, int] | None) -> Launcher | None:
    """How to isolate snippets run as `user`; None to run them unisolated.

    None in mode off, and in mode auto where isolation is unavailable, after a one-line notice on
    stderr the first time. In mode strict, raises Unavailable with what to change instead.
    The probe runs once per process (about 0.1 s) and is cached.
    """
    global _noticed
    if mode == "off":
        return None
    with _lock:
        key = (BWRAP, user)
        if key not in _launchers:
            _launchers[key] = _find(user)
        found = _launchers[key]
        if isinstance(found, Launcher):
            return found
        if mode == "strict":
            raise Unavailable(f"sandbox: refusing to run a snippet without isolation ({found}): "
                              f"{HOW_TO_ISOLATE}, or set {MODE_VARIABLE}=auto to run it unisolated")
        if not _noticed:
            _noticed = True
            print(f"sandbox: running snippets WITHOUT isolation ({found}); to isolate them "
                  f"{HOW_TO_ISOLATE}; {MODE_VARIABLE}=strict refuses instead, =off skips this "
                  "check",
                  file=sys.stderr, flush=True)
        return None
