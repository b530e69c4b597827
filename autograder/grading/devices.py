"""The device a grading times on: its name, and one timing section at a time per device, across processes.

Correctness checks of several submissions may share a device; timing must not: `timing_lock` is a
lock per physical device, held across processes, that the code timing a submission takes around
its timed section, so two timings never overlap on one device (nor on the CPU). The lock files live
in a folder only the grader's user can enter (0700), opened without following links and only as
regular files, so a student's worker running as another uid can neither hold nor replace them. A
lock busy for longer than the rubric's `lock_seconds` (below pytest-timeout's limit) is a retryable
"cannot time now": the run cannot grade, never a zero.
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


@contextlib.contextmanager
def timing_lock(
    key: str, seconds: float | None = None, environ: Mapping[str, str] | None = None, poll: float = 0.05
) -> Iterator[Path]:
    """Hold the device's timing lock while timing: an flock on a file in a folder only the grader's user
    can enter (`timing_lock_folder`), released by the kernel however its holder ends, so it is never
    stale. Waits at most `seconds` (None: as long as it takes), then raises TimingLockBusy."""
    path = timing_lock_path(key, environ)
    private_folder(path.parent)
    descriptor = open_lock_file(path)
    try:
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimingLockBusy(
                        f"{CANNOT_TIME_NOW}: another grading held the timing lock of {key} for {seconds:g} s "
                        f"({path}); nothing is charged to the submission, and it is graded again"
                    ) from None
                time.sleep(poll)
        yield path
    finally:
        os.close(descriptor)  # closing releases the lock
