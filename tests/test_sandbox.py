"""Hostile-snippet tests of sandbox.run_python: every call returns in time, says what happened in
one line, keeps its output bounded, and leaves no process behind.

Each snippet mentions a token chosen by the test (TOKEN); the processes it starts carry that token
in their command line or environment, so the test can scan /proc for survivors on its own,
independently of the sandbox's marker.

Run: python -m pytest -q tests/test_sandbox.py
"""

import os
import re
import resource
import signal
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from environment import sandbox  # noqa: E402
from environment.sandbox import ExecResult, live_sandbox_processes, run_python  # noqa: E402
from environment import isolation  # noqa: E402

TIMEOUT = 2.0
MAX_CHARS = 3500
NOTE_CHARS = 60  # generous bound on the length of the "[... N characters cut ...]" note
WOKE = "WOKE"  # what a hostile snippet's processes print when their 60 s sleep ends: run_python waited for them


def processes_with(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line or environment holds `token`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                blob = f.read()
            with open(f"/proc/{name}/environ", "rb") as f:
                blob += f.read()
        except (OSError, IndexError):
            continue
        if token.encode() in blob:
            found.append(int(name))
    return found


def run_checked(code: str, timeout: float = TIMEOUT, **kwargs) -> ExecResult:
    """run_python plus the checks every hostile call must pass."""
    token = re.search(r"TOKEN_\w+", code)
    result = run_python(code, timeout=timeout, **kwargs)
    # The hostile snippets' processes sleep 60 s, then print WOKE, or loop forever: a sandbox that waited
    # for them instead of killing them at the timeout returns their WOKE (or never returns).
    assert WOKE not in result.output, "run_python waited for the snippet's processes instead of killing them"
    assert isinstance(result, ExecResult)
    assert "\n" not in result.error
    assert result.ok == (result.error == "")
    max_chars = kwargs.get("max_output_chars", MAX_CHARS)
    assert len(result.output) <= max_chars + NOTE_CHARS
    if token:
        assert processes_with(token.group()) == [], "a process of the snippet survived the call"
    return result


def hostile(template: str) -> str:
    return template.replace("TOKEN", f"TOKEN_{uuid.uuid4().hex}")


# (id, snippet, expected ok, regex the error must match in full, text the output must contain)
CASES = [
    ("simple_print", "print('hello', 6 * 7)", True, "", "hello 42\n"),
    ("infinite_loop", "while True:\n    pass", False, r"timed out after 2 s", ""),
    ("busy_loop_in_a_thread",
     "import threading\ndef spin():\n    while True:\n        pass\n"
     "threading.Thread(target=spin).start()\nprint('spinning', flush=True)",
     False, r"timed out after 2 s", "spinning"),
    ("sleep_past_the_timeout", "import time\nprint('zz', flush=True)\ntime.sleep(60)\nprint('WOKE')",
     False, r"timed out after 2 s", "zz"),
    ("allocate_20_GB", "x = bytearray(20 * 2**30)", False,
     r"MemoryError \(the sandbox allows 1024 MB of memory\)", "Traceback"),
    ("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)", False,
     r"RecursionError: maximum recursion depth exceeded", ""),
    ("write_a_1_GB_file",
     "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n        f.write(bytes(2**20))",
     False, r"OSError: \[Errno 27\] File too large \(the sandbox allows files of at most 16 MB\)",
     ""),
    ("fifty_sleeping_children",
     "import os, subprocess\nfor _ in range(50):\n"
     "    subprocess.Popen(['sh', '-c', 'sleep 60; echo WOKE'], env={**os.environ, 'T': 'TOKEN'})\nprint('started')",
     True, "", "started\n"),
    ("setsid_double_fork_escape",
     "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
     "        code = 'import time; open(\"alive\", \"w\").close(); time.sleep(60); print(\"WOKE\")'\n"
     "        os.execv(sys.executable, [sys.executable, '-c', code, 'TOKEN'])\n    os._exit(0)\n"
     "os.wait()\nwhile not os.path.exists('alive'):\n    time.sleep(0.01)\nprint('escaped')",
     True, "", "escaped\n"),
    ("background_child_holds_the_pipes",
     "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; "
     "time.sleep(60); print(\"WOKE\")', 'TOKEN'])\nprint('main done')", True, "", "main done\n"),
    ("grandchild_holds_the_pipes_and_main_loops",
     "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; "
     "time.sleep(60); print(\"WOKE\")', 'TOKEN'])\nwhile True:\n    pass", False, r"timed out after 2 s", ""),
    ("sys_exit_3", "import sys\nsys.exit(3)", False, r"exited with status 3", ""),
    ("os_exit_7", "import os\nprint('bye', flush=True)\nos._exit(7)", False,
     r"exited with status 7", "bye"),
    ("close_stdout_then_print", "import sys\nprint('before', flush=True)\nsys.stdout.close()\n"
     "print('after')", False, r"ValueError: I/O operation on closed file\.", "before"),
    ("close_both_pipes_and_exit", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.2)",
     True, "", ""),
    ("close_both_pipes_and_loop", "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass",
     False, r"timed out after 2 s", ""),
    ("non_utf8_bytes", "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')", True, "",
     "ok \ufffd\ufffd end\n"),
    ("syntax_error", "def (:\n    pass", False, r"SyntaxError: .+", "SyntaxError"),
    ("missing_module", "import no_such_module_xyz", False,
     r"ModuleNotFoundError: No module named 'no_such_module_xyz'", ""),
    ("zero_division", "print(1 / 0)", False, r"ZeroDivisionError: division by zero", ""),
    ("null_byte_in_source", "print(1)\0", False, r"SyntaxError: .*null bytes.*", ""),
    ("lone_surrogate_in_source", "print('a\ud800b')", True, "", "a?b\n"),
    ("kill_own_process_group", "import os, signal\nos.killpg(0, signal.SIGKILL)", False,
     r"killed by signal 9 \(SIGKILL\)", ""),
    ("stop_itself", "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", False,
     r"timed out after 2 s", ""),
]


@pytest.mark.parametrize("code, ok, error, expected_output",
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_hostile_snippet_returns_expected_outcome_and_leaves_nothing(code, ok, error,
                                                                     expected_output):
    result = run_checked(hostile(code))
    assert result.ok is ok, result
    assert re.fullmatch(error, result.error), result.error
    assert expected_output in result.output


def test_a_billion_printed_characters_are_truncated_with_bounded_parent_memory():
    code = "import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 10**6)"
    rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_checked(code, timeout=20)
    rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kb) / 1024
    assert result.ok, result.error
    assert rss_growth_mb < 100, f"the caller grew by {rss_growth_mb:.0f} MB reading the output"
    assert f"[... {10**9 - MAX_CHARS} characters cut ...]" in result.output
    assert result.output.startswith("x" * (MAX_CHARS // 2) + "\n[...")
    assert result.output.endswith("...]\n" + "x" * (MAX_CHARS // 2))


def test_the_result_is_the_same_from_call_to_call_with_no_random_folder_name_in_it():
    """A traceback names the snippet's file, and its folder is a fresh temporary one: written as "."
    the result is the same in every call, so the memory and the next prompt are too (a random name
    there made two rollouts from one seed part)."""
    code = "import os\nprint(os.getcwd())\nundefined_name\n"
    first, second = run_checked(code), run_checked(code)
    assert first.as_text() == second.as_text()
    assert 'File "./snippet.py", line 3' in first.output and "agentflow_sandbox_" not in first.as_text()
    assert first.output.startswith(".\n") and first.error.startswith("NameError")


def test_output_is_stdout_then_stderr_cut_in_the_middle_with_exact_count():
    code = "import sys\nsys.stdout.write('a' * 10000)\nsys.stderr.write('b' * 10000)"
    result = run_checked(code, max_output_chars=100)
    # 10000 + a separating newline (stdout did not end with one) + 10000 = 20001 characters.
    assert result.output == "a" * 50 + "\n[... 19901 characters cut ...]\n" + "b" * 50
    short = run_checked("import sys\nprint('out')\nsys.stderr.write('err')")
    assert short.output == "out\nerr"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_parent_pid_does_not_reach_the_caller(sig):
    # The snippet's parent is the sandbox's supervisor, not this test process; if it were this
    # process, SIGKILL would end the test run here.
    result = run_checked(hostile(f"import os, sys\nos.kill(os.getppid(), {int(sig)})\n"
                                 "os.execv(sys.executable, [sys.executable, '-c', "
                                 "'import time; time.sleep(5)', 'TOKEN'])"))
    assert result.error == f"killed by signal {int(sig)} ({sig.name})"
    assert result.returncode == -int(sig)


def test_caller_environment_does_not_leak(monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENTFLOW_TEST_SECRET", secret)
    code = ("import os\nprint(dict(os.environ))\n"
            "for pid in (os.getppid(), os.getpid()):\n"
            "    print(open(f'/proc/{pid}/environ', 'rb').read())")
    result = run_checked(code)
    assert result.ok, result.error
    assert "PATH" in result.output and "AGENTFLOW_TEST_SECRET" not in result.output
    assert secret not in result.output


def test_temporary_directory_is_removed_even_if_the_snippet_locks_it():
    code = ("import os\nos.makedirs('deep/er')\nopen('deep/er/f.txt', 'w').write('x')\n"
            "os.chmod('deep/er', 0)\nos.chmod('deep', 0)\nprint(os.getcwd()[::-1])")  # reversed: the result writes the folder '.'
    result = run_checked(code)
    assert result.ok, result.error
    workdir = result.output.strip()[::-1]
    assert os.path.basename(workdir).startswith("agentflow_sandbox_")
    assert not os.path.exists(workdir)


def test_snippet_runs_as_nobody_when_possible_else_as_current_user():
    result = run_checked("import os\nprint(os.getuid())")
    expected = sandbox.sandbox_user()[0] if sandbox.sandbox_user() else os.getuid()
    assert result.output == f"{expected}\n"


def test_as_text_gives_output_or_error_line_after_output():
    assert run_checked("print(42)").as_text() == "42\n"
    assert run_checked("x = 1").as_text() == "(no output: print the result to see it)"
    failed = run_checked("print('partial')\nraise KeyError('k')")
    text = failed.as_text()
    assert text.startswith("partial\n") and text.endswith("\nError: KeyError: 'k'")
    assert run_checked("import sys\nsys.exit(3)").as_text() == "Error: exited with status 3"


def test_live_sandbox_processes_finds_marked_processes():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), sandbox.MARKER_NAME: "test-marker"}
    # Between fork and exec /proc/PID/environ is still this process's, without the marker: the child
    # says "ready" once it runs with its own environment (sh, which then becomes sleep, same pid).
    proc = subprocess.Popen(["sh", "-c", "echo ready; exec sleep 30"], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        assert proc.pid in live_sandbox_processes()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.pid not in live_sandbox_processes()


@pytest.mark.parametrize("kwargs, message", [
    ({"timeout": 0}, "timeout must be positive"),
    ({"memory_mb": -1}, "memory_mb must be positive"),
    ({"max_output_chars": 0}, "max_output_chars must be positive"),
])
def test_nonsensical_limits_raise_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_python("print(1)", **kwargs)


def test_non_string_code_raises_a_clear_error():
    with pytest.raises(ValueError, match="code must be a str"):
        run_python(b"print(1)")  # type: ignore[arg-type]


# --- Isolation (environment/isolation.py): what a snippet must not reach outside its call. -------
# Each attack below succeeds without namespaces (the code before isolation, or mode off), so each
# test fails there; they are skipped only where this machine cannot isolate at all.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def isolated(monkeypatch):
    """The default mode, whatever the caller's AGENTFLOW_SANDBOX; skip where it cannot isolate."""
    monkeypatch.delenv(isolation.MODE_VARIABLE, raising=False)
    monkeypatch.setattr(isolation, "_mode", None)
    try:
        isolation.launcher("strict", sandbox.sandbox_user())
    except isolation.Unavailable as exc:
        pytest.skip(f"this machine cannot isolate: {exc}")


@pytest.fixture
def no_bwrap(monkeypatch):
    """A machine without bubblewrap, seen by a process that has not used the sandbox yet."""
    monkeypatch.delenv(isolation.MODE_VARIABLE, raising=False)
    monkeypatch.setattr(isolation, "_mode", None)
    monkeypatch.setattr(isolation, "BWRAP", "/nonexistent/bwrap")
    monkeypatch.setattr(isolation, "_launchers", {})
    monkeypatch.setattr(isolation, "_noticed", False)


def test_a_snippet_cannot_read_the_agents_environment_or_see_other_processes(isolated,
                                                                             monkeypatch):
    # /proc/<pid>/environ shows a process's environment as it started, so the token set here is
    # given to an agent started now, as `export ..._TOKEN=sk-...; python train.py` would.
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENTFLOW_TEST_TOKEN", secret)
    bystander = subprocess.Popen(["sleep", "30"])  # another process holding the token
    scan = ("import os\nfound, seen = [], []\nfor pid in os.listdir('/proc'):\n"
            "    if pid.isdigit():\n        seen.append(int(pid))\n        try:\n"
            "            env = open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0')\n"
            "        except OSError:\n            continue\n"
            "        found += [e.decode() for e in env if b'AGENTFLOW_TEST_TOKEN' in e]\n"
            "print('found', found)\nprint('seen', sorted(seen))")
    agent = ("import sys\nsys.path.insert(0, sys.argv[1])\n"
             "from environment.sandbox import run_python\n"
             "result = run_python(sys.stdin.read(), timeout=5)\nprint(result.output, result.error)")
    try:
        done = subprocess.run([sys.executable, "-c", agent, ROOT], input=scan, text=True,
                              capture_output=True, timeout=30)
    finally:
        bystander.kill()
        bystander.wait()
    assert "found []" in done.stdout, done.stdout + done.stderr
    assert secret not in done.stdout
    seen = [int(pid) for pid in re.search(r"seen \[([\d, ]*)\]", done.stdout).group(1).split(",")]
    assert bystander.pid not in seen and os.getpid() not in seen and len(seen) <= 4, seen


def test_a_snippet_cannot_connect_to_a_server_on_loopback(isolated):
    import socket
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = ("import socket\nprint('interfaces', [name for _, name in socket.if_nameindex()])\n"
                f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "    print('connected')\nexcept OSError as e:\n"
                "    print('failed:', type(e).__name__)")
        result = run_checked(code)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody knocked
            server.accept()
    assert "failed: ConnectionRefusedError" in result.output, result.output
    assert "interfaces ['lo']" in result.output  # its own loopback only: no route anywhere


def test_a_snippet_cannot_write_outside_its_folder(isolated, tmp_path):
    targets = [tmp_path / "outside.txt", tmp_path / "made" / "by" / "snippet.txt"]
    code = ("import os\nopen('inside.txt', 'w').write('fine')\nprint('inside ok')\n"
            f"for path in {[str(t) for t in targets]!r}:\n    try:\n"
            "        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
            "        open(path, 'w').write('x')\n        print('wrote', path)\n"
            "    except OSError as e:\n        print('failed:', type(e).__name__)")
    result = run_checked(code)
    assert result.ok, result.error
    assert "inside ok" in result.output and "wrote" not in result.output, result.output
    assert not any(t.exists() for t in targets) and not (tmp_path / "made").exists()


def test_a_snippet_cannot_read_the_users_home(isolated):
    home = os.path.expanduser("~")  # the agent's home: ~/.cache, keys, checkpoints
    secret = f"sk-{uuid.uuid4().hex}"
    planted = os.path.join(home, f".agentflow_sandbox_test_{uuid.uuid4().hex}")
    try:
        with open(planted, "w") as f:
            f.write(secret)
    except OSError as exc:
        pytest.skip(f"cannot plant a file in {home}: {exc}")
    try:
        code = (f"import os\nprint('listing', sorted(os.listdir({home!r})))\n"
                f"try:\n    print(open({planted!r}).read())\n"
                "except OSError as e:\n    print('unreadable:', type(e).__name__)")
        result = run_checked(code)
    finally:
        os.remove(planted)
    assert "unreadable: FileNotFoundError" in result.output, result.output
    assert secret not in result.output and os.path.basename(planted) not in result.output
    assert "'.cache'" not in result.output


def test_a_snippet_cannot_signal_the_agent(isolated):
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(True))
    try:
        code = ("import os, signal\nfor sig in (0, signal.SIGUSR1):\n    try:\n"
                f"        os.kill({os.getpid()}, sig)\n        print('reached the agent')\n"
                "    except OSError as e:\n        print('failed:', type(e).__name__)")
        result = run_checked(code)
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == [] and "reached" not in result.output, result.output
    assert result.output.count("failed: ProcessLookupError") == 2


def test_a_process_that_wipes_its_environment_dies_with_the_namespace(isolated):
    # The marker scan cannot see a process that exec()s with an empty environment; the PID
    # namespace takes it down anyway.
    code = hostile("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
                   "    if os.fork() == 0:\n"
                   "        os.execve(sys.executable, [sys.executable, '-c', "
                   "'import time; time.sleep(60); print(\"WOKE\")', 'TOKEN'], {})\n    os._exit(0)\n"
                   "os.wait()\ntime.sleep(0.3)\nprint('escaped')")
    token = re.search(r"TOKEN_\w+", code).group()
    try:
        result = run_checked(code)
    finally:
        for pid in processes_with(token):  # what the code before isolation leaves behind
            os.kill(pid, signal.SIGKILL)
    assert result.ok and result.output == "escaped\n", result


def test_strict_mode_runs_where_isolation_is_available(isolated):
    sandbox.set_mode("strict")
    result = run_checked("import os\nprint(os.getpid())")
    assert result.ok and int(result.output) < 10, result  # a small pid: its own PID namespace


def test_without_bwrap_one_notice_then_snippets_run_as_before(no_bwrap, capsys):
    first = run_checked(f"import os\nprint({os.getpid()} in map(int, filter(str.isdigit, "
                        "os.listdir('/proc'))))")
    second = run_checked("print('again')")
    notice = capsys.readouterr().err
    assert first.ok and first.output == "True\n"  # no PID namespace: it sees this process
    assert second.ok and second.output == "again\n"
    assert notice.count("\n") == 1
    assert notice.startswith("sandbox: running snippets WITHOUT isolation")
    assert "bubblewrap (bwrap) is not installed" in notice and "AGENTFLOW_SANDBOX=strict" in notice


def test_mode_off_runs_without_namespaces_and_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(isolation, "_mode", None)
    sandbox.set_mode("off")
    result = run_checked(f"import os\nprint(os.path.exists('/proc/{os.getpid()}'))")
    assert result.ok and result.output == "True\n"
    assert capsys.readouterr().err == ""


def test_strict_mode_refuses_where_isolation_is_unavailable(no_bwrap, monkeypatch, capsys):
    monkeypatch.setenv(isolation.MODE_VARIABLE, "strict")
    result = run_checked("print('should not run')")
    assert not result.ok and result.output == "" and result.returncode is None
    assert result.error.startswith("sandbox: refusing to run a snippet without isolation")
    assert "install bubblewrap" in result.error and "AGENTFLOW_SANDBOX=auto" in result.error
    with pytest.raises(isolation.Unavailable, match="bubblewrap"):
        sandbox.set_mode("strict")  # so that train.py --sandbox strict can stop before any work
    assert capsys.readouterr().err == ""  # refused, not warned


def test_a_mode_that_does_not_exist_raises_a_clear_error(monkeypatch):
    monkeypatch.setattr(isolation, "_mode", None)
    with pytest.raises(ValueError, match="one of auto, strict, off, got 'on'"):
        sandbox.set_mode("on")
    monkeypatch.setenv(isolation.MODE_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="AGENTFLOW_SANDBOX must be one of auto, strict, off"):
        run_python("print(1)")
    with pytest.raises(ValueError, match="mode must be one of"):
        run_python("print(1)", mode="yes")


def test_help_exits_0():
    done = subprocess.run([sys.executable, "-m", "environment.sandbox", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--bench" in done.stdout, done.stderr


def test_bench_times_both_settings(isolated):
    done = subprocess.run([sys.executable, "-m", "environment.sandbox", "--bench", "--calls", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "isolation off" in done.stdout and "cost of isolation" in done.stdout
