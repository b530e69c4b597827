"""Trusted side: the grading process's fork server, and a worker as a fork of it.

Starting a worker costs a Python start and torch's import (about a second of CPU); forking a process that has
both costs a few hundredths. So each grading process keeps one fork server (`ForkServers`, one per kind of
worker it starts, which in a grading is one), started by exec where and as a worker is
(`launcher.start_fork_server`), holding nothing secret, and forks each worker from it. The untrusted side,
`inside/forkserver.py`, lists what each child re-establishes after the fork (`AFTER_FORK`) before any student
code runs; this side gives each child its control group before it goes on (`ForkedProcess`: the child says it
is there, the kernel tells the grader its process id, the grader moves it into its group and says `go`).

The rule for replacing it: after `forks_per_server` forks (the rubric's), a fork server takes no more
requests and a new one is started (fresh address layout and `str` hash secret); the old one ends once its
last child has. A fork server that cannot start, says it cannot fork safely, dies, or does not hand over a
child in time is not asked again: the worker that needed it starts fresh, as every worker did before (the
launcher does that, and says why in `note`), and the next worker asks a new fork server, unless the fork
server never started at all in this process, which then starts every worker fresh.
"""

from __future__ import annotations

import atexit
import json
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from autograder.sandbox import bwrap, procfs
from autograder.sandbox.cgroups import WorkerGroup
from autograder.sandbox.probe import Isolation
from autograder.sandbox.protocol import ChildSetup

MESSAGE_BYTES = 1 << 16


@dataclass(frozen=True)
class ServerKey:
    """What a fork server was started for: a worker of another kind (interpreter, isolation, device, scratch size,
    allow list) is not forked from it."""

    python: str  # the interpreter
    isolation: Isolation
    device: str
    scratch_bytes: int
    allowed: bwrap.AllowList | None  # the namespace sandbox's allow list (None under process isolation)


class ForkFailed(Exception):
    """The fork server did not hand over a child: the worker starts fresh instead."""


class ForkServer:
    """One fork server process. `start` is called once, in a thread of its own that lives as long as the
    process (a child's death signal belongs to the thread that started it), with the grader's end of the
    control socket; it returns the process it started, which has the other end."""

    def __init__(
        self, key: ServerKey, start: Callable[[socket.socket, IO[bytes]], subprocess.Popen[bytes]], limit: int
    ):
        self.key, self.limit = key, limit
        self.forks = 0
        self.retired = False  # takes no more requests; ends when its last child has
        self.problem: str | None = None  # why it cannot be used (it never became ready, or misbehaved)
        self.was_ready = False  # it said it was ready
        self.ready = threading.Event()  # it said whether it is ready (or failed to start: `problem`)
        self.children: list[ForkedProcess] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._theirs = theirs
        self._start = start
        self.log = tempfile.TemporaryFile()  # what it printed: nothing, unless it failed
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._keep, name="fork-server", daemon=True)
        self.thread.start()

    def _keep(self) -> None:
        try:
            self.process = self._start(self._theirs, self.log)
            if self._closing.is_set():  # closed while it was being started
                procfs.kill_tree(procfs.tree_of(self.process.pid))
        except (OSError, subprocess.SubprocessError) as exc:
            self.problem = f"the fork server could not be started: {exc}"
            self.ready.set()
            return
        finally:
            self._theirs.close()
        message = _receive(self.control, None)
        if message is None or "ready" not in message:
            said = (message or {}).get("unsafe")
            self.problem = (
                f"the fork server cannot fork safely here: {said}"
                if isinstance(said, str)
                else "the fork server ended before it was ready"
                + (f" (exit status {self.process.poll()})" if self.process.poll() is not None else "")
            ) + self._said()
        else:
            self.was_ready = True
        self.ready.set()
        self._closing.wait()

    def _said(self) -> str:
        """The last lines the fork server printed, if any."""
        self.log.seek(0)
        lines = self.log.read()[-2000:].decode(errors="replace").strip().splitlines()[-3:]
        return (": " + " | ".join(lines)) if lines else ""

    def usable(self) -> bool:
        return not self.retired and self.problem is None and (self.process is None or self.process.poll() is None)

    def fork(
        self, setup: ChildSetup, fds: tuple[int, int, int], group: WorkerGroup | None, seconds: float
    ) -> ForkedProcess:
        """Ask for one child with a fresh worker's settings (`setup`), its channel's `fds` (the request pipe's read end,
        the reply pipe's write end, the output pipe's write end; the caller closes its copies), in `group`; the
        hand-over happens in the background, within `seconds`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the kernel names the child's process id
        try:
            with self._lock:
                self.forks += 1
                if self.forks >= self.limit:
                    self.retired = True
                socket.send_fds(
                    self.control,
                    [json.dumps({"op": "fork", "config": setup.to_dict()}).encode()],
                    [*fds, theirs.fileno()],
                )
        except OSError as exc:
            ours.close()
            self.ready.wait(5)  # it may have failed to start: that is the reason to give
            self.problem = self.problem or f"the fork server stopped taking requests ({exc})"
            raise ForkFailed(self.problem) from None
        finally:
            theirs.close()
        child = ForkedProcess(self, ours, group, seconds)
        self.children.append(child)
        return child

    def idle(self) -> bool:
        """Whether none of its children is running any more."""
        self.children = [child for child in self.children if child.poll() is None]
        return not self.children

    def close(self) -> None:
        """End it, and so every child it still has (they die with it)."""
        self.retired = True
        self._closing.set()
        process = self.process
        if process is not None:
            if process.poll() is None:
                procfs.kill_tree(procfs.tree_of(process.pid))
            process.wait()
        try:
            self.control.shutdown(socket.SHUT_RDWR)  # wakes the keeper if it still waits for `ready`
        except OSError:
            pass
        self.thread.join(timeout=30)
        self.control.close()
        self.log.close()
        for child in self.children:
            child.gone()


class ForkedProcess:
    """A worker forked from a fork server, as the launcher holds it: what `subprocess.Popen` gives for a worker
    started fresh (`pid`, `poll`, `wait`, `stdout`), and the hand-over (`started`, `cancel`).

    A thread of its own waits for the child, moves it into its control `group` by the process id the kernel
    reports with its message, says `go`, and then waits for the fork server's report of how it ended."""

    def __init__(self, server: ForkServer, status: socket.socket, group: WorkerGroup | None, seconds: float):
        self.server, self.status, self.group = server, status, group
        self.stdout: IO[bytes] | None = None  # set by the launcher: the read end of the worker's output pipe
        self.returncode: int | None = None
        self.problem: str | None = None  # why the hand-over failed
        self._pid: int | None = None
        self._state = "pending"  # -> running, failed or cancelled
        self._lock = threading.Lock()
        self._handed = threading.Event()
        self._ended = threading.Event()
        self._end = time.monotonic() + seconds
        threading.Thread(target=self._hand_over, name="forked-worker", daemon=True).start()

    @property
    def pid(self) -> int:
        if self._pid is None:
            raise ProcessLookupError("the forked worker has not been handed over")
        return self._pid

    def handed_over(self) -> bool:
        """Whether it runs in its group, its process id known."""
        return self._pid is not None

    def _hand_over(self) -> None:
        try:
            pid = self._arrival()
            with self._lock:
                if self._state != "pending":
                    raise ForkFailed("let go before it arrived")
                if self.group is not None:
                    self.group.attach(pid)
                self._pid = pid
                self.status.send(b"go")
                self._state = "running"
        except (ForkFailed, OSError) as exc:
            with self._lock:
                if self._state == "pending":
                    self._state = "failed"
                    self.problem = str(exc)
                    self.server.problem = self.server.problem or f"a fork was not handed over: {exc}"
            self._finish(-signal.SIGKILL)
            return
        finally:
            self._handed.set()
        message = _receive(self.status, None)
        code = message.get("exit") if message else None
        self._finish(code if isinstance(code, int) else -signal.SIGKILL)  # no report: it died with its server

    def _arrival(self) -> int:
        """The child's process id, from the kernel, once it says it has been forked."""
        while True:
            left = self._end - time.monotonic()
            if left <= 0:
                raise ForkFailed("the fork server did not hand over the worker in time")
            ready, _, _ = select.select([self.status], [], [], min(left, 0.5))
            if self._state != "pending":
                raise ForkFailed("let go before it arrived")
            if not ready:
                continue
            data, ancillary, _flags, _address = self.status.recvmsg(MESSAGE_BYTES, socket.CMSG_SPACE(12))
            if data == b"forked":
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
                        pid = int.from_bytes(payload[:4], "little", signed=True)
                        if pid > 0:
                            return pid
                raise ForkFailed("the child's process id did not come with its message")
            said = _decode(data)
            if not data:
                self.server.ready.wait(5)  # it may never have started: that is the reason to give
                raise ForkFailed(self.server.problem or "the fork server ended")
            raise ForkFailed(str((said or {}).get("error", "the fork server answered something else")))

    def _finish(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()
        try:
            self.status.close()
        except OSError:
            pass

    def started(self, seconds: float) -> str | None:
        """Wait at most `seconds` for the hand-over; None once the child is running in its group, else why not
        (it was never handed over: the caller starts a fresh worker instead)."""
        if not self._handed.wait(max(0.0, seconds)):
            self.cancel()
            return "the fork server did not hand over the worker in time"
        return None if self._state == "running" else (self.problem or "the worker was not handed over")

    def cancel(self) -> bool:
        """Let a child go that was not handed over yet: it ends having run nothing (the fork server reaps it).
        True when it was not running (nothing of it is left to kill)."""
        with self._lock:
            if self._state == "running":
                return False
            if self._state == "pending":
                self._state = "cancelled"
                try:
                    self.status.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._handed.wait(5)
        return True

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, as the fork server reports it (-9 when no report can come: the fork server ended)."""
        if not self._ended.wait(30.0 if timeout is None else timeout):
            if timeout is not None:
                raise subprocess.TimeoutExpired("forked worker", timeout)
            self.server.problem = self.server.problem or "the fork server did not report a child's end"
            self._finish(-signal.SIGKILL)
        return self.returncode if self.returncode is not None else -signal.SIGKILL

    def gone(self) -> None:
        """Its fork server has ended: so has it."""
        self._finish(-signal.SIGKILL)


def _decode(data: bytes) -> dict[str, Any] | None:
    try:
        message = json.loads(data)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _receive(sock: socket.socket, seconds: float | None) -> dict[str, Any] | None:
    """One message (a JSON object) from the fork server's side, or None (it ended, or said something else)."""
    try:
        if seconds is not None:
            ready, _, _ = select.select([sock], [], [], seconds)
            if not ready:
                return None
        return _decode(sock.recv(MESSAGE_BYTES))
    except OSError:
        return None


class ForkServers:
    """This process's fork servers, one per kind of worker (`ServerKey`): started on first use, replaced by
    the rule above. Thread-safe (the reference's timing workers start in threads of their own)."""

    def __init__(self) -> None:
        self.current: dict[ServerKey, ForkServer] = {}
        self.retired: list[ForkServer] = []
        self.never: dict[ServerKey, str] = {}  # kinds whose fork server never became ready here: why
        self._lock = threading.Lock()

    def fork(
        self,
        key: ServerKey,
        limit: int,
        start: Callable[[socket.socket, IO[bytes]], subprocess.Popen[bytes]],
        setup: ChildSetup,
        fds: tuple[int, int, int],
        group: WorkerGroup | None,
        seconds: float,
    ) -> ForkedProcess | str:
        """A child of this kind's fork server (started now if needed), or why a fresh worker is needed instead."""
        with self._lock:
            self._end_retired()
            if key in self.never:
                return self.never[key]
            server = self.current.get(key)
            if server is not None and not server.usable():
                del self.current[key]
                self.retired.append(server)
                server.retired = True
                if server.problem is not None and not server.was_ready:
                    self.never[key] = server.problem  # it cannot start here: not tried again by this process
                    return server.problem
                server = None
            if server is None:
                server = self.current[key] = ForkServer(key, start, limit)
        try:
            return server.fork(setup, fds, group, seconds)
        except ForkFailed as exc:
            return str(exc)

    def _end_retired(self) -> None:
        keep = []
        for server in self.retired:
            if server.idle():
                server.close()
            else:
                keep.append(server)
        self.retired = keep

    def close(self) -> None:
        """End every fork server of this process (and so every worker still forked from one)."""
        with self._lock:
            servers = [*self.current.values(), *self.retired]
            self.current, self.retired = {}, []
        for server in servers:
            server.close()


SERVERS = ForkServers()  # this process's
atexit.register(SERVERS.close)
