"""The grader's side of the untrusted worker: spawn it, talk to it with deadlines, kill and replace it.

Student code runs only in the worker process (`worker_main.py`). This module never unpickles anything
from it but `torch.load(weights_only=True)` payloads, and every answer is checked by the caller.
"""
from __future__ import annotations

import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

WORKER_SOURCE = Path(__file__).with_name("worker_main.py")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
MAX_MESSAGE = 1 << 30
CRASHES_BEFORE_GIVING_UP = 2  # a target that ended the worker this often is not tried again


class WorkerError(Exception):
    """A request could not be answered; the message is meant for the student."""


class SubmissionError(WorkerError):
    """The student's code raised an exception while answering."""

    def __init__(self, error: dict):
        self.type = error.get("type", "Exception")
        self.message = error.get("message", "")
        self.traceback = error.get("traceback", "")
        super().__init__(f"{self.type}: {self.message}")


class WorkerTimeout(WorkerError):
    pass


class WorkerCrashed(WorkerError):
    pass


class LoadFailed(WorkerError):
    pass


@dataclass
class WorkerConfig:
    device: str = "cpu"
    memory_bytes: int | None = 4 << 30
    load_seconds: float = 60.0
    cell_seconds: float = 3.0
    request_seconds: float = 10.0
    output_bytes: int = 8 << 10
    isolation: str = "auto"  # "auto", "namespace" or "process"
    hide: list[str] = field(default_factory=list)
    threads: int | None = None


@lru_cache(maxsize=None)
def namespace_sandbox_available() -> bool:
    """Whether `unshare` can give the worker its own user, mount, pid and network namespaces."""
    unshare = shutil.which("unshare")
    if not unshare:
        return False
    try:
        probe = subprocess.run(_unshare_prefix(unshare) + ["true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _unshare_prefix(unshare: str) -> list[str]:
    return [unshare, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--mount-proc",
            "--net", "--kill-child"]


class OutputCapture(threading.Thread):
    """Drains the worker's stdout/stderr so a flood cannot block it; keeps the first `limit` bytes."""

    def __init__(self, stream, limit: int):
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.head = bytearray()
        self.total = 0

    def run(self):
        while chunk := self.stream.read1(1 << 16) if hasattr(self.stream, "read1") else self.stream.read(1 << 16):
            self.total += len(chunk)
            room = self.limit - len(self.head)
            if room > 0:
                self.head += chunk[:room]

    def text(self) -> str:
        text = self.head.decode("utf-8", errors="replace")
        if self.total > len(self.head):
            text += f"\n... [{self.total - len(self.head):,} more bytes of output not kept]"
        return text


class Worker:
    """One submission's worker. `request()` restarts it after a crash or a timeout; a submission
    whose loading fails or hangs is not restarted again and again: its failure is remembered."""

    def __init__(self, cells: list[tuple[int, str]], filename: str, config: WorkerConfig):
        self.cells, self.filename, self.config = cells, filename, config
        self.process: subprocess.Popen | None = None
        self.capture: OutputCapture | None = None
        self.load_report: dict | None = None
        self.load_failure: str | None = None
        self.hung: dict[str, str] = {}  # target -> message, for targets that timed out once
        self.crashes: dict[str, list[str]] = {}  # target -> messages, each time it ended the worker
        self.skipped_cells: list[int] = []  # top-level cells stopped for running too long
        self.starts = 0
        self.events: list[str] = []
        self.outputs: list[str] = []
        self.isolation = self._choose_isolation()
        self._scratch: str | None = None

    # -- lifecycle
    def _choose_isolation(self) -> str:
        wanted = self.config.isolation
        if wanted == "auto":
            return "namespace" if namespace_sandbox_available() else "process"
        if wanted == "namespace" and not namespace_sandbox_available():
            raise WorkerError("namespace isolation was asked for, but `unshare` cannot create namespaces here")
        return wanted

    def _spawn(self):
        self.starts += 1
        self._scratch = tempfile.mkdtemp(prefix="mha-worker-")
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        sandbox = self.isolation == "namespace"
        hide = sorted({str(PROJECT_ROOT), "/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir(), *self.config.hide})
        keep = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})
        config = {
            "filename": self.filename,
            "device": self.config.device,
            "threads": self.config.threads or torch.get_num_threads(),
            "sandbox": sandbox,
            "hide": [p for p in hide if os.path.isdir(p)],
            "keep": [k for k in keep if any(_inside(k, h) for h in hide)],  # the interpreter and its packages
            "workdir": "/tmp" if sandbox else self._scratch,
        }
        # -u: unbuffered, so what the student's code printed is captured even when the worker is killed
        command = [sys.executable, "-I", "-u", "-c", WORKER_SOURCE.read_text(), str(req_r), str(resp_w),
                   json.dumps(config)]
        if sandbox:
            command = _unshare_prefix(shutil.which("unshare")) + ["--"] + command
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": config["workdir"], "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            if name in os.environ:
                env[name] = os.environ[name]
        memory = self.config.memory_bytes if self.config.device == "cpu" else None

        def limits():
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if memory:
                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

        self.process = subprocess.Popen(
            command, cwd=self._scratch, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=(req_r, resp_w), start_new_session=True,
            preexec_fn=limits,
        )
        os.close(req_r)
        os.close(resp_w)
        self._to_worker, self._from_worker = req_w, resp_r
        self.capture = OutputCapture(self.process.stdout, self.config.output_bytes)
        self.capture.start()

    def start(self) -> dict:
        """Start (or restart) the worker and load the submission. Returns the load report."""
        if self.load_failure:
            raise LoadFailed(self.load_failure)
        self._spawn()
        try:
            ready = self._receive(self.config.load_seconds, "starting Python and torch")
            if not ready.get("ok"):
                raise WorkerCrashed("the worker could not start")
            if self.config.device.startswith("cuda") and not ready["value"].get("cuda"):
                if self.isolation != "namespace":
                    raise WorkerCrashed("the worker cannot see the CUDA device")
                # Some drivers need more than the sandbox shows; grade anyway, and say so.
                self.kill()
                self.isolation = "process"
                self.events.append("CUDA was not visible inside the namespace sandbox: fell back to process isolation")
                return self.start()
            reply = self._exchange({"op": "load", "cells": self.cells, "filename": self.filename,
                                    "cell_seconds": self.config.cell_seconds, "skip": self.skipped_cells},
                                   self.config.load_seconds, "loading your file")
        except WorkerTimeout:
            self.load_failure = (f"loading your file did not finish within {self.config.load_seconds:g} s "
                                 "(an infinite loop or a very slow cell at the top level?)")
            self.kill()
            raise LoadFailed(self.load_failure) from None
        except WorkerError as exc:
            self.kill()
            last = self.output().strip().splitlines()[-3:]
            self.load_failure = f"loading your file ended the worker: {exc}" + (
                "\nIts last output:\n" + "\n".join(last) if last else "")
            raise LoadFailed(self.load_failure) from None
        if not reply.get("ok"):
            self.load_failure = f"loading your file failed in the worker: {reply.get('error')}"
            self.kill()
            raise LoadFailed(self.load_failure)
        if self.load_report is None:
            self.load_report = reply["value"]
            self.skipped_cells = [e["cell"] for e in reply["value"]["errors"] if e.get("timed_out")]
        return reply["value"]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self):
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        for fd in (self._to_worker, self._from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.capture:
            self.capture.join(timeout=2)
            text = self.capture.text()
            if text:
                self.outputs.append(text)
        shutil.rmtree(self._scratch, ignore_errors=True)
        self.process = None

    close = kill

    def output(self) -> str:
        texts = list(self.outputs)
        if self.capture and self.process is not None:
            texts.append(self.capture.text())
        return "\n".join(t for t in texts if t)

    # -- requests
    def request(self, op: str, timeout: float | None = None, target: str | None = None, **payload):
        """Send one request and return its value. Raises SubmissionError when the student's code raised,
        WorkerTimeout / WorkerCrashed when the worker had to be killed (it is restarted next time)."""
        if target and target in self.hung:
            raise WorkerTimeout(self.hung[target])
        if target and len(self.crashes.get(target, ())) >= CRASHES_BEFORE_GIVING_UP:
            raise WorkerCrashed(f"{self.crashes[target][-1]} (this happened {CRASHES_BEFORE_GIVING_UP} times; "
                                "not tried again in later checks)")
        if not self.alive():
            self.start()
        timeout = timeout or self.config.request_seconds
        try:
            reply = self._exchange({"op": op, **payload}, timeout, target or op)
        except WorkerTimeout as exc:
            if target:
                self.hung[target] = f"{exc} (not tried again in later checks)"
            self.events.append(str(exc))
            self.kill()
            raise
        except WorkerCrashed as exc:
            self.events.append(str(exc))
            if target:
                self.crashes.setdefault(target, []).append(str(exc))
            self.kill()
            raise
        if not reply.get("ok"):
            raise SubmissionError(reply.get("error") or {})
        return reply["value"]

    def _exchange(self, message: dict, timeout: float, what: str) -> dict:
        buffer = io.BytesIO()
        torch.save(message, buffer)
        data = buffer.getvalue()
        try:
            _write_all(self._to_worker, struct.pack(">Q", len(data)) + data, self, timeout, what)
        except (BrokenPipeError, OSError):
            raise self._crashed(what) from None
        return self._receive(timeout, what)

    def _receive(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        header = self._read(8, deadline, what, timeout)
        (size,) = struct.unpack(">Q", header)
        if size > MAX_MESSAGE:
            raise self._crashed(what, f"it sent an answer of {size:,} bytes")
        payload = self._read(size, deadline, what, timeout)
        try:
            reply = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        except Exception as exc:
            raise WorkerCrashed(f"the worker's answer while {what} could not be read safely ({exc})") from None
        if not isinstance(reply, dict):
            raise WorkerCrashed(f"the worker's answer while {what} was not a message")
        return reply

    def _read(self, n: int, deadline: float, what: str, timeout: float) -> bytes:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimeout(f"{what} did not finish within {timeout:g} s (an infinite loop?)")
            ready, _, _ = select.select([self._from_worker], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(self._from_worker, min(n, 1 << 20))
            if not chunk:
                raise self._crashed(what)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _crashed(self, what: str, detail: str | None = None) -> WorkerCrashed:
        code = None
        if self.process is not None:
            try:
                code = self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
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
        hint = {"SIGSEGV": " (a segmentation fault)", "SIGKILL": " (killed, often for using too much memory)",
                "SIGABRT": " (aborted)"}.get(name, "")
        return f"it was ended by {name}{hint}"
    return f"it exited with status {code} (does your code call exit() or os._exit()?)"


def _write_all(fd: int, data: bytes, worker: Worker, timeout: float, what: str):
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    while view:
        if time.monotonic() > deadline:
            raise WorkerTimeout(f"{what} did not finish within {timeout:g} s (the worker stopped reading)")
        _, ready, _ = select.select([], [fd], [], 0.5)
        if ready:
            view = view[os.write(fd, view[: 1 << 16]):]
        elif not worker.alive():
            raise BrokenPipeError


def _inside(path: str, parent: str) -> bool:
    path, parent = os.path.abspath(path), os.path.abspath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")
