"""Where a class's grading processes run: one visible GPU each, spread evenly.

With several GPUs, `grade-class --device cuda --jobs J` keeps J grading processes going and gives
each one the GPU that has the fewest processes on it, pinned with CUDA_VISIBLE_DEVICES, so a
process (and the student's worker it starts, which inherits the variable) sees exactly one device.
Correctness checks of several submissions may share a GPU; timing must not, which the grading's own
timing lock sees to (`autograder.grading.devices`).

Everything here except `cuda_device_count` is plain logic, tested without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from autograder.grading.devices import visible_devices


class DevicePool:
    """Hands a grading process the device with the fewest processes on it (the first such, on a tie)."""

    def __init__(self, devices: Sequence[str]):
        if not devices:
            raise ValueError("a device pool needs at least one device")
        self.devices = list(devices)
        self.running = dict.fromkeys(self.devices, 0)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def device(self) -> Iterator[str]:
        with self._lock:
            chosen = min(self.devices, key=lambda device: self.running[device])
            self.running[chosen] += 1
        try:
            yield chosen
        finally:
            with self._lock:
                self.running[chosen] -= 1


@dataclass
class Placement:
    """How each grading process of a class is started: the `--device` it gets and, on CUDA, its GPU."""

    device: str  # "cpu" or "cuda"
    pool: DevicePool | None = None
    base_environment: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    @contextlib.contextmanager
    def slot(self) -> Iterator[dict[str, str] | None]:
        """The environment of one grading process: None (inherit) on the CPU, pinned to one GPU on CUDA."""
        if self.pool is None:
            yield None
            return
        with self.pool.device() as device:
            yield {**self.base_environment, "CUDA_VISIBLE_DEVICES": device}

    @property
    def devices(self) -> list[str]:
        return list(self.pool.devices) if self.pool else []


class NoDevice(RuntimeError):
    """--device cuda was asked for and no CUDA device is visible."""


def placement_for(device: str, environ: Mapping[str, str] | None = None, device_count: int | None = None) -> Placement:
    """The placement for `--device auto|cpu|cuda` (`device_count`: torch's count, looked up if None)."""
    environ = dict(os.environ if environ is None else environ)
    if device == "cpu":
        return Placement("cpu", None, environ)
    devices = visible_devices(environ, cuda_device_count() if device_count is None else device_count)
    if not devices:
        if device == "cuda":
            raise NoDevice(
                "--device cuda was asked for, but torch sees no CUDA device"
                + (
                    f" (CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r})"
                    if "CUDA_VISIBLE_DEVICES" in environ
                    else ""
                )
            )
        return Placement("cpu", None, environ)
    return Placement("cuda", DevicePool(devices), environ)


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()
