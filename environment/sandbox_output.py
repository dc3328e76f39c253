"""A sandboxed snippet's output, bounded, and the one line that says why it failed (environment/sandbox.py).

read_until reads the snippet's pipes with select() against a deadline, so a grandchild that keeps a
pipe open cannot stall the call. Each stream goes into a Capture that keeps only its first and last
`limit` characters and counts the rest, so 10^9 printed characters cost the caller a few kilobytes;
combine puts stdout then stderr together, cut in the middle with a note of how much was cut; and
error_line reads the exit status and stderr's last line ("timed out after 10 s", "MemoryError (the
sandbox allows 1024 MB of memory)").

Test: python -m pytest -q tests/test_sandbox.py
"""

import codecs
import os
import re
import selectors
import signal
import subprocess
import time


class Capture:
    """One output stream, decoded incrementally, keeping only its first and last `limit` chars."""

    def __init__(self, limit: int):
        self.limit = limit
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.head = ""  # the first `limit` characters
        self.tail = ""  # the last `limit` characters after the head
        self.total = 0  # characters seen, kept or not

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        self.total += len(text)
        if len(self.head) < self.limit:
            room = self.limit - len(self.head)
            self.head, text = self.head + text[:room], text[room:]
        if text:
            self.tail = (self.tail + text)[-self.limit:]

    def first(self, n: int) -> str:  # exact for n <= limit
        return self.head[:n]  # if the head is not full, the tail is empty

    def last(self, n: int) -> str:  # exact for n <= limit
        if n <= 0:
            return ""
        return self.tail[-n:] if len(self.tail) >= n else (self.head + self.tail)[-n:]


def combine(stdout: Capture, stderr: Capture, max_chars: int) -> str:
    """stdout then stderr (on a new line), cut in the middle to max_chars plus a note."""
    sep = "\n" if stdout.total and stderr.total and stdout.last(1) != "\n" else ""
    total = stdout.total + len(sep) + stderr.total
    if total <= max_chars:  # both streams were kept whole
        return stdout.first(max_chars) + sep + stderr.first(max_chars)
    n_head, n_tail = max_chars // 2, max_chars - max_chars // 2
    # The head of the combined text is stdout's head, continued by stderr's if stdout is short.
    head = stdout.first(n_head)
    if len(head) < n_head:
        head += sep + stderr.first(n_head - len(head) - len(sep))
    tail = stderr.last(n_tail)
    if len(tail) < n_tail:
        tail = stdout.last(n_tail - len(tail) - len(sep)) + sep + tail
    return f"{head}\n[... {total - len(head) - len(tail)} characters cut ...]\n{tail}"


TRACEBACK_LAST_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")  # "ZeroDivisionError: division..."


def error_line(returncode: int, timed_out: bool, timeout: float, stderr: Capture,
                memory_mb: int, file_size_mb: int) -> str:
    """One clear line saying why the snippet failed."""
    if timed_out:
        return f"timed out after {timeout:g} s"
    if returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else "unknown signal"
        if sig == signal.SIGXCPU:
            name += ": CPU time limit exceeded"
        return f"killed by signal {sig} ({name})"
    lines = [line for line in stderr.last(stderr.limit).splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    # An uncaught exception exits with status 1 and ends stderr with "Name: message"; a syntax
    # error is reported without the "Traceback" header, so it is recognised by its name.
    is_exception = "Traceback (most recent call last):" in stderr.head + stderr.tail or \
        last.startswith(("SyntaxError", "IndentationError", "TabError"))
    if returncode == 1 and is_exception and TRACEBACK_LAST_LINE.match(last):
        if last.startswith("MemoryError"):
            last += f" (the sandbox allows {memory_mb} MB of memory)"
        if "File too large" in last:
            last += f" (the sandbox allows files of at most {file_size_mb} MB)"
        return last[:500]
    return f"exited with status {returncode}"


def read_until(streams: dict, deadline: float, proc: subprocess.Popen | None) -> bool:
    """Read the pipes into their captures until `deadline`; return True if it was reached.

    Without `proc`, stop early when both pipes are closed. With `proc`, stop early only when
    that process has exited: its leftovers may hold the pipes open, and it may have closed them
    itself and still be running.
    """
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while True:
            if proc is not None and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG
                                              | os.WNOWAIT) is not None:
                # WNOWAIT leaves the supervisor a zombie, so its pid (= our pgid) stays reserved
                # until we have killed its group.
                return False
            if proc is None and not selector.get_map():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if not selector.get_map():  # both pipes closed, the process still runs
                time.sleep(min(remaining, 0.01))
                continue
            for key, _ in selector.select(min(remaining, 0.05)):
                data = os.read(key.fd, 1 << 16)
                if data:
                    streams[key.fd].feed(data)
                else:  # end of file: every writer closed it
                    selector.unregister(key.fd)
