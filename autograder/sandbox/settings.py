"""A worker's settings, one type from the rubric's limits (`grading/workers.worker_config`) through the
client (`client.Worker`) to the launcher (`launcher.LaunchSettings` adds what one start decides).

Its defaults are the packaged rubric's `[limits]` (`autograder/rubric.toml`, as `workers.worker_config` copies
them; a test holds them equal), so that a worker made without a rubric is held to what a grading holds it to."""

from __future__ import annotations

from dataclasses import dataclass, field

from autograder.sandbox import protocol


@dataclass(frozen=True)
class WorkerConfig:
    device: str = "cpu"
    memory_bytes: int | None = 4 << 30
    load_seconds: float = 60.0
    boot_seconds: float = 60.0  # a new worker starting Python, its jail and torch (the grader's own start)
    cell_seconds: float = 3.0
    later_cell_seconds: float = 1.0  # each later cell, once one was stopped while loading
    request_seconds: float = 10.0
    hung_request_seconds: float | None = 3.0  # once the submission is known to hang; None: request_seconds
    # An untimed request that runs the student's code is stopped once it has used `request_factor` times the
    # reference's CPU for the same request (given with it), never before `request_floor_seconds` of CPU, and
    # never after its wall deadline. None: no CPU deadline (the wall deadline alone).
    request_factor: float = 50.0
    request_floor_seconds: float | None = 3.0
    submission_seconds: float = 300.0
    submission_cpu_seconds: float | None = 300.0
    processes: int | None = 256  # processes and threads of the worker, all together
    cpus: float | None = 2.0  # CPU quota of the worker, all its processes together, in cores
    use_cgroups: bool = True
    output_bytes: int = 8 << 10
    crashes_before_giving_up: int = 2  # a target that ended the worker this often is not tried again
    isolation: str = "auto"  # "auto", "namespace" or "process"
    hide: list[str] = field(default_factory=list)
    threads: int = 2
    limits: protocol.FrameLimits = field(default_factory=protocol.FrameLimits)
    contract: tuple[str, ...] = ()
    forks_per_server: int = 50  # fork workers from this process's fork server, replaced after so many (0: never)
    scratch_bytes: int = 256 << 20  # the sandbox's /tmp
