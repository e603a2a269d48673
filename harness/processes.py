"""Child processes that cannot outlive the harness.

Each child runs in its own session (so a signal reaches the whole group), dies with its
parent (parent-death signal), and is tracked so ``atexit`` and SIGTERM/SIGHUP handlers stop
what is still running. Context managers stop them in the normal case; these are the nets for
Ctrl-C, a failing test and a killed test runner.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

_PR_SET_PDEATHSIG = 1
_live: dict[int, ManagedProcess] = {}
_lock = threading.Lock()
_SETPRIV = shutil.which("setpriv")


class ManagedProcess:
    """A started child process with its log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group (SIGSTOP/SIGCONT stall and resume it)."""
        if self.running():
            _signal_group(self.pid, sig)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the process group and reap it: a crash, with no chance to clean up."""
        try:
            _signal_group(self.pid, signal.SIGKILL)
            self.popen.wait(timeout)
        finally:
            with _lock:
                _live.pop(self.pid, None)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``timeout``."""
        try:
            if self.running():
                # A stalled (SIGSTOPped) process must run again to act on SIGTERM.
                _signal_group(self.pid, signal.SIGTERM)
                _signal_group(self.pid, signal.SIGCONT)
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    _signal_group(self.pid, signal.SIGKILL)
                    self.popen.wait(5)
            # Children of the child (none expected) share its group: make sure they are gone.
            _signal_group(self.pid, signal.SIGKILL)
        finally:
            with _lock:
                _live.pop(self.pid, None)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ManagedProcess:
    """Start ``argv`` in a new session, output appended to ``log_path``.

    The child gets SIGKILL if this process dies, even by SIGKILL: ``setpriv --pdeathsig``
    when available (it simply execs), else ``prctl`` in a pre-exec hook.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = list(argv)
    preexec = None
    if _SETPRIV:
        command = [_SETPRIV, "--pdeathsig", "KILL", "--", *command]
    else:
        preexec = _die_with_parent
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    process = ManagedProcess(name, popen, log_path)
    with _lock:
        _live[popen.pid] = process
    return process


def stop_all() -> None:
    """Stop every process started here that is still running (atexit and signal path)."""
    with _lock:
        processes = list(_live.values())
    for p in reversed(processes):
        with contextlib.suppress(Exception):
            p.stop(timeout=3)


atexit.register(stop_all)


def install_signal_handlers() -> None:
    """Make SIGTERM and SIGHUP behave like Ctrl-C (KeyboardInterrupt).

    ``with`` blocks and pytest finalizers then stop what was started, and pytest aborts the
    run instead of carrying on (it would treat SystemExit in a fixture as a plain error).
    Only replaces default handlers, only from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def exit_on(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, exit_on)


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit; True if it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.05)
    return False
