"""The device a grading times on: its name, and one timing section at a time per device, across processes.

Correctness checks of several submissions may share a device; timing must not: `timing_lock` is a
lock per physical device, held across processes, that the code timing a submission takes around
its timed section, so two timings never overlap on one device (nor on the CPU).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
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


TIMING_LOCK_VARIABLE = "AUTOGRADER_TIMING_LOCK"


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


def timing_lock_path(key: str, environ: Mapping[str, str] | None = None) -> Path:
    """$AUTOGRADER_TIMING_LOCK when set, else one lock file per device key in the machine's temp folder."""
    environ = os.environ if environ is None else environ
    if environ.get(TIMING_LOCK_VARIABLE):
        return Path(environ[TIMING_LOCK_VARIABLE])
    return Path(tempfile.gettempdir()) / f"mha-autograder-timing-{re.sub(r'[^A-Za-z0-9._-]', '_', key)}.lock"


class TimingLockBusy(TimeoutError):
    """Another grading held the device's timing lock for longer than the wait allowed."""


@contextlib.contextmanager
def timing_lock(
    key: str, seconds: float | None = None, environ: Mapping[str, str] | None = None, poll: float = 0.05
) -> Iterator[Path]:
    """Hold the device's timing lock while timing: an flock on a file in the grader's temporary folder
    (which sandboxed workers cannot see), released by the kernel however its holder ends, so it is never
    stale. Waits at most `seconds` (None: as long as it takes), then raises TimingLockBusy."""
    path = timing_lock_path(key, environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Read-only is enough for flock, so a lock file another user created still works.
    descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimingLockBusy(
                        f"the timing lock {path} was held by another grading for {seconds:g} s"
                    ) from None
                time.sleep(poll)
        yield path
    finally:
        os.close(descriptor)  # closing releases the lock
