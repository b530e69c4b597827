"""The device a grading times on: its name, and quiet timing: while anything is timed on the machine, no
student's code runs on it.

One lock file per physical device (`timing_lock_path`), in a folder only the grader's user can enter (0700),
opened without following links and only as regular files, so a student's worker running as another uid can
neither hold nor replace them; flocks, which the kernel releases however their holder ends, so none is ever
stale. A timing hold (`QuietLock.hold`) takes its device's lock EXCLUSIVE; a request to a submission's worker
(`QuietLock.request`, every request of `client.Worker` with `quiet` set) takes every device's lock SHARED:
so while anything is timed, no student's code runs on the machine, in any grading process, and two timings
on one device never overlap. Two more files make that fair and complete:

- `turnstile.lock`: a hold takes it first and keeps it until it has its device, so a stream of overlapping
  requests from other gradings cannot starve a waiting hold (a request passes the turnstile only for the
  instant of its non-blocking tries);
- `requests.lock`: every request holds it SHARED; a hold drains it (EXCLUSIVE for an instant) behind the
  turnstile, so a request that began before the hold's device file existed has ended too.

Every wait is bounded: a hold by the rubric's `lock_seconds`, a grading's requests by `lock_seconds` in all
(`QuietLock(wait_seconds)`). At the bound comes a retryable "cannot time now" (`TimingLockBusy`): the run
cannot grade and is graded again, never a zero; and the time a request waited is not the submission's
(`client.Worker` moves its deadlines by it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path


def visible_devices(environ: Mapping[str, str], device_count: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries, one per device torch can use, that a child can be pinned to.

    Without CUDA_VISIBLE_DEVICES every device is visible, by index. With it, its entries (indices,
    GPU-... or MIG-... UUIDs) are kept in order; CUDA stops at the first invalid one, which is why
    only as many as torch counts are kept.
    """
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(index) for index in range(device_count)]
    entries = [entry.strip() for entry in listed.split(",")]
    return [entry for entry in entries if entry][:device_count]


TIMING_LOCK_VARIABLE = "AUTOGRADER_TIMING_LOCK"  # the lock file itself, for one device
TIMING_LOCK_FOLDER_VARIABLE = "AUTOGRADER_TIMING_LOCK_DIR"  # the folder of every device's lock file
CANNOT_TIME_NOW = "cannot time now"  # how a busy or unusable lock's message starts: retry later


def device_key(device: str) -> str:
    """A name for the physical device this process times on: "cpu", or the GPU's UUID (its
    CUDA_VISIBLE_DEVICES entry where torch cannot tell), stable whatever the process's numbering."""
    if device == "cpu":
        return "cpu"
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    if uuid is not None:
        return f"cuda-{uuid}"
    visible = visible_devices(os.environ, torch.cuda.device_count())
    return f"cuda-{visible[torch.cuda.current_device()]}" if visible else "cuda"


def timing_lock_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where the timing locks live: a folder only the grader's user can enter, so that no student's
    worker (another uid under process isolation) can hold a lock, plant a FIFO or a link in its place,
    or read it. $AUTOGRADER_TIMING_LOCK_DIR when set; else /run/mha-autograder for root (a root-only
    parent); else $XDG_RUNTIME_DIR/mha-autograder (the user's own); else mha-autograder-<uid> in the
    machine's temp folder. Every grading of one user on one machine uses the same folder."""
    environ = os.environ if environ is None else environ
    if environ.get(TIMING_LOCK_FOLDER_VARIABLE):
        return Path(environ[TIMING_LOCK_FOLDER_VARIABLE])
    if os.geteuid() == 0 and os.path.isdir("/run") and os.access("/run", os.W_OK):
        return Path("/run/mha-autograder")
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "mha-autograder"
    return Path(tempfile.gettempdir()) / f"mha-autograder-{os.geteuid()}"


def timing_lock_path(key: str, environ: Mapping[str, str] | None = None) -> Path:
    """$AUTOGRADER_TIMING_LOCK when set, else one lock file per device key in `timing_lock_folder`."""
    environ = os.environ if environ is None else environ
    if environ.get(TIMING_LOCK_VARIABLE):
        return Path(environ[TIMING_LOCK_VARIABLE])
    return timing_lock_folder(environ) / f"timing-{re.sub(r'[^A-Za-z0-9._-]', '_', key)}.lock"


class TimingLockError(RuntimeError):
    """The device's timing lock cannot be taken now (never the submission's fault): grade again later."""


class TimingLockBusy(TimingLockError, TimeoutError):
    """Another grading held the device's timing lock for longer than the wait allowed."""


def private_folder(folder: Path) -> Path:
    """`folder`, made if missing, as a folder of this user's that no other user can enter (0700): not
    a link, owned by this user; one of ours left open to others is closed. Else TimingLockError."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode):
            raise TimingLockError(f"{CANNOT_TIME_NOW}: the timing locks' folder {folder} is not a folder (a link?)")
        if info.st_uid != os.geteuid():
            raise TimingLockError(
                f"{CANNOT_TIME_NOW}: the timing locks' folder {folder} belongs to uid {info.st_uid}, not to the "
                "grader's user: remove it (or set AUTOGRADER_TIMING_LOCK_DIR)"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(folder, 0o700, follow_symlinks=False)
    except OSError as exc:
        raise TimingLockError(f"{CANNOT_TIME_NOW}: cannot use the timing locks' folder {folder}: {exc}") from None
    return folder


def open_lock_file(path: Path) -> int:
    """A descriptor on the lock file at `path` (made 0600 if missing), never through a link, never
    blocking on a FIFO, and only if it is a regular file; else TimingLockError."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TimingLockError(f"{CANNOT_TIME_NOW}: cannot open the timing lock {path}: {exc}") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise TimingLockError(f"{CANNOT_TIME_NOW}: the timing lock {path} is not a regular file")
    return descriptor


TURNSTILE = "turnstile.lock"  # a hold passes it first: requests cannot starve a waiting hold
REQUESTS = "requests.lock"  # every request holds it shared: a hold drains it


def take(descriptor: int, operation: int, deadline: float | None, poll: float) -> bool:
    """flock `operation` on `descriptor`, waiting until `deadline` (`time.monotonic()`; None: as long as it
    takes). Whether it was taken."""
    while True:
        try:
            fcntl.flock(descriptor, operation | (0 if deadline is None else fcntl.LOCK_NB))
            return True
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)


class QuietLock:
    """One grading's side of quiet timing (see the module's docstring): its timing holds (`hold`), and its
    requests to the submission's worker (`request`), which pass at once while this grading itself holds the
    lock (what it times then is its own). `wait_seconds`: how long its requests may wait for other gradings'
    holds in all (None: without bound); `held`: the seconds its holds lasted, for the rubric's cap on them
    (`[speed] hold_seconds`)."""

    def __init__(self, wait_seconds: float | None = None, environ: Mapping[str, str] | None = None, poll: float = 0.01):
        self.wait_seconds, self.environ, self.poll = wait_seconds, environ, poll
        self.holding = 0  # holds open now
        self.waited = 0.0  # seconds its requests waited, in all
        self.held = 0.0  # seconds its holds lasted, in all

    def folder(self) -> Path:
        return private_folder(timing_lock_path("cpu", self.environ).parent)

    @contextlib.contextmanager
    def hold(self, key: str, seconds: float | None = None) -> Iterator[Path]:
        """Hold the device's lock EXCLUSIVE while timing: once no other grading holds it and no request to any
        submission's worker on the machine runs. Waits at most `seconds` (None: as long as it takes), then
        raises TimingLockBusy."""
        path = timing_lock_path(key, self.environ)
        folder = private_folder(path.parent)
        deadline = None if seconds is None else time.monotonic() + seconds
        device = open_lock_file(path)
        try:
            with self._exclusive(folder / TURNSTILE, deadline, key, seconds):
                if not take(device, fcntl.LOCK_EX, deadline, self.poll):
                    raise self._busy(key, seconds)
                with self._exclusive(folder / REQUESTS, deadline, key, seconds):
                    pass  # drained: every request that began before is over
            began = time.monotonic()
            self.holding += 1
            try:
                yield path
            finally:
                self.holding -= 1
                self.held += time.monotonic() - began
        finally:
            os.close(device)  # closing releases the lock

    @contextlib.contextmanager
    def _exclusive(self, path: Path, deadline: float | None, key: str, seconds: float | None) -> Iterator[None]:
        descriptor = open_lock_file(path)
        try:
            if not take(descriptor, fcntl.LOCK_EX, deadline, self.poll):
                raise self._busy(key, seconds)
            yield
        finally:
            os.close(descriptor)

    @staticmethod
    def _busy(key: str, seconds: float | None) -> TimingLockBusy:
        return TimingLockBusy(
            f"{CANNOT_TIME_NOW}: another grading held the timing lock of {key} for {seconds or 0:g} s (timing, or "
            "running a submission's code); nothing is charged to the submission, and it is graded again"
        )

    @contextlib.contextmanager
    def request(self) -> Iterator[float]:
        """Hold every device's lock SHARED while a submission's code runs; yields the seconds waited for them
        (which the worker's client does not charge to the submission). Raises TimingLockBusy once this
        grading's requests have waited `wait_seconds` in all."""
        if self.holding:
            yield 0.0
            return
        folder = self.folder()
        started = time.monotonic()
        left = None if self.wait_seconds is None else max(0.0, self.wait_seconds - self.waited)
        held = self._enter(folder)
        while held is None:
            if left is not None and time.monotonic() - started >= left:
                self.waited += time.monotonic() - started
                raise TimingLockBusy(
                    f"{CANNOT_TIME_NOW}: the submission's code waited {self.wait_seconds:g} s in all for other "
                    "gradings' timing to end; nothing is charged to the submission, and it is graded again"
                )
            time.sleep(self.poll)
            held = self._enter(folder)
        waited = time.monotonic() - started
        self.waited += waited
        try:
            yield waited
        finally:
            for descriptor in held:
                os.close(descriptor)

    def _enter(self, folder: Path) -> list[int] | None:
        """Through the turnstile, every lock SHARED without waiting: their descriptors, or None (nothing held)."""
        turnstile = open_lock_file(folder / TURNSTILE)
        held: list[int] = []
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for path in self._shared_paths(folder):
                held.append(open_lock_file(path))
                fcntl.flock(held[-1], fcntl.LOCK_SH | fcntl.LOCK_NB)
            return held
        except BlockingIOError:
            for descriptor in held:
                os.close(descriptor)
            return None
        except BaseException:
            for descriptor in held:
                os.close(descriptor)
            raise
        finally:
            os.close(turnstile)

    def _shared_paths(self, folder: Path) -> list[Path]:
        """`requests.lock` and every device's lock file (the named one too, where one is named)."""
        named = timing_lock_path("cpu", self.environ)
        devices = {
            folder / name for name in os.listdir(folder) if name.startswith("timing-") and name.endswith(".lock")
        }
        return [folder / REQUESTS, *sorted(devices | {named})]


def timing_lock(
    key: str, seconds: float | None = None, environ: Mapping[str, str] | None = None, poll: float = 0.05
) -> contextlib.AbstractContextManager[Path]:
    """A timing hold on the device `key` by a grading of its own (`QuietLock.hold`)."""
    return QuietLock(environ=environ, poll=poll).hold(key, seconds)
