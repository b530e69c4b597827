"""The frames between the grader and one worker process, and what the process printed.

`Channel` writes a request and reads its reply within a deadline: every reply is bounded by
`protocol.FrameLimits` before anything is materialised and checked against the protocol's schema; a reply that
breaks it is the worker's fault (`WorkerCrashed`). Nothing from the worker is ever unpickled. `OutputCapture`
drains the worker's stdout and stderr so that a flood cannot block it.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import sys
import termios
import threading
from collections.abc import Callable
from typing import IO, Any

from autograder.sandbox import launcher, protocol
from autograder.sandbox.errors import Deadline, EndedBeforeRequest, WorkerCrashed, WorkerError
from autograder.sandbox.protocol import Asks, ProtocolError, V


class OutputCapture(threading.Thread):
    """Drains the worker's stdout/stderr so a flood cannot block it; keeps the first `limit` bytes."""

    def __init__(self, stream: IO[bytes], limit: int):
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.head = bytearray()
        self.total = 0

    def run(self) -> None:
        while chunk := os.read(self.stream.fileno(), 1 << 16):
            self.total += len(chunk)
            room = self.limit - len(self.head)
            if room > 0:
                self.head += chunk[:room]

    def text(self) -> str:
        text = protocol.clean_text(self.head.decode("utf-8", errors="replace"), self.limit)
        if self.total > len(self.head):
            text += f"\n... [{self.total - len(self.head):,} more bytes of output not kept]"
        return text


class Channel:
    """The frames between the grader and one worker process: a request written, its reply read and checked, each
    within a deadline, and the CPU budget checked while it is read where the caller charges it (`budget`, which
    raises BudgetSpent). Knows nothing of restarts: a failure is raised for the `Worker` to handle."""

    def __init__(
        self,
        process: launcher.WorkerProcess,
        limits: protocol.FrameLimits,
        codec: protocol.TensorCodec,
        memory_bytes: int | None,
        budget: Callable[[str], None],
    ):
        self.process, self.limits, self.codec = process, limits, codec
        self.memory_bytes, self.budget = memory_bytes, budget

    def frame(self, request: Asks[Any]) -> bytes:
        encoder = protocol.Encoder(self.codec)
        return protocol.pack_frame(protocol.request_header(request, encoder), encoder.blobs)

    def send(self, frame: bytes, deadline: Deadline, what: str) -> None:
        """Write a frame; a worker that no longer reads its pipe has ended (WorkerCrashed)."""
        try:
            _write_all(self.process, frame, deadline, what)
        except (BrokenPipeError, OSError):  # nothing reads the pipe any more
            raise self.crashed(what) from None

    def exchange(self, request: Asks[V], deadline: Deadline, what: str) -> protocol.Reply[V]:
        """One untimed request and its reply. A worker that ended before reading the request raises
        EndedBeforeRequest (it ended on its own, between requests)."""
        try:
            self.send(self.frame(request), deadline, what)
        except WorkerCrashed as exc:
            raise EndedBeforeRequest(str(exc)) from None
        try:
            return self.receive(request.op, deadline, what)
        except WorkerCrashed as exc:
            if self.request_unread():
                raise EndedBeforeRequest(str(exc)) from None
            raise

    def request_unread(self) -> bool:
        """Whether the worker has ended with bytes of the request written last still in the pipe, unread."""
        if self.process.alive():
            return False
        try:
            unread = fcntl.ioctl(self.process.to_worker, termios.FIONREAD, b"\0" * 4)
        except OSError:
            return False
        return int.from_bytes(unread, sys.byteorder, signed=True) > 0

    def receive(self, op: str, deadline: Deadline, what: str, charge: bool = True) -> protocol.Reply[Any]:
        """The reply to `op`, read within `deadline`, bounded by the frame limits and checked against the
        protocol before it is used; one that cannot be read safely is the worker's fault (WorkerCrashed)."""

        def read_exact(n: int) -> bytes:
            return self.read(n, deadline, what, charge)

        def read_into(view: memoryview) -> None:  # a blob, straight into its tensor's memory
            while view:
                chunk = self.read(min(len(view), 1 << 20), deadline, what, charge)
                view[: len(chunk)] = chunk
                view = view[len(chunk) :]

        def parse() -> protocol.Reply[Any]:
            header, blobs = protocol.read_frame(read_exact, self.limits, read_into)
            decoder = protocol.Decoder(blobs, self.limits, self.codec.from_wire)
            return protocol.parse_reply(op, header, decoder)

        try:
            reply = parse()
        except ProtocolError as exc:
            problem = str(exc)
        except WorkerError:  # a deadline, a budget or the worker's end, met while reading: as it is
            raise
        except Exception as exc:  # any other trouble decoding an answer is the answer's: the worker's fault
            problem = f"it could not be decoded ({type(exc).__name__}: {protocol.clean_text(str(exc), 200)})"
        else:
            deadline.check(what)
            return reply
        # Raised outside `except`, so the refused answer is let go: raised inside, the WorkerCrashed would
        # keep the ProtocolError as its context, and through its traceback parse()'s blobs (up to reply_mib)
        # for as long as a caller holds it, and a second such answer would be held beside the first.
        raise WorkerCrashed(f"the worker's answer while {what} could not be read safely: {problem}")

    def read(self, n: int, deadline: Deadline, what: str, charge: bool = True) -> bytes:
        """`n` bytes from the worker. `charge`: stop once the CPU budget is spent (a walk of the worker's
        processes per chunk); a timed call does not, so that every timed worker pays the same (`TimedCalls`)."""
        chunks = []
        while n:
            deadline.check(what)
            if charge:
                self.budget(what)
            ready, _, _ = select.select([self.process.from_worker], [], [], min(deadline.left(), 0.5))
            if not ready:
                continue
            chunk = os.read(self.process.from_worker, min(n, 1 << 20))
            if not chunk:
                raise self.crashed(what)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def crashed(self, what: str, detail: str | None = None) -> WorkerCrashed:
        return ended_while(self.process, what, self.memory_bytes, detail)


def ended_while(
    process: launcher.WorkerProcess | None, what: str, memory_bytes: int | None, detail: str | None = None
) -> WorkerCrashed:
    """The error for a worker that ended (or was never there) while `what`, saying how it ended."""
    code = None
    if process is not None:
        try:
            code = process.process.wait(timeout=5)
        except Exception:
            code = None
        if detail is None and process.went_over_memory():
            detail = (
                f"it was killed for using more than the submission's {(memory_bytes or 0) / (1 << 30):g} GiB of "
                "memory (all its processes together)"
            )
    return WorkerCrashed(f"the process running your code ended while {what}: {detail or describe_exit(code)}")


def describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0 or code > 128:
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = {
            "SIGSEGV": " (a segmentation fault)",
            "SIGKILL": " (killed, often for using too much memory)",
            "SIGABRT": " (aborted)",
        }.get(name, "")
        return f"it was ended by {name}{hint}"
    return f"it exited with status {code} (does your code call exit() or os._exit()?)"


def _write_all(process: launcher.WorkerProcess, data: bytes, deadline: Deadline, what: str) -> None:
    view = memoryview(data)
    while view:
        deadline.check(what, why="the worker stopped reading")
        _, ready, _ = select.select([], [process.to_worker], [], min(deadline.left(), 0.5))
        if ready:
            try:  # the pipe does not block (see `launch`): a worker that read a little and stopped cannot hold us
                view = view[os.write(process.to_worker, view[: 1 << 16]) :]
            except BlockingIOError:
                continue
        elif not process.alive():
            raise BrokenPipeError
