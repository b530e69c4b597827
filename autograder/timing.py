"""Timing for the speed part: the measurement protocol, its statistics, and the per-device timing lock.

What is timed: the reference `MultiHeadAttentionWrapper`, the reference `MultiHeadAttention` and the
submission's `MultiHeadAttention`, all built with the same weights, each in a worker of its own: the two
reference modules in workers that run only the reference's code, in the same kind of sandboxed process as the
submission's, spoken to through the same protocol, so process, protocol and serialisation costs are the same
for all three and cancel in the ratios. (Each has a worker of its own because a process that has just run
the wrapper's many small calls runs the next forward measurably slower.)

How (`measure`):

- Everything that runs inside a worker is treated as hostile, so the clock is the grader's own: wall time
  around each `forward_many` request. The request carries only seeds; the worker makes each input from its
  seed (no input exists before its request, and nothing large crosses the pipe while the clock runs) and
  answers, per token, a random probe of each output. Every answer is compared with the reference's for the
  same seed, so caching, replaying, returning before the work is done or working on another stream earn
  nothing but a failure.
- Warm-up rounds first, then measured rounds. Each round draws fresh seeds, shared by the three targets,
  and times the wrapper, then the reference and the submission, which take turns at going first.
- Only the worker being timed runs: every other worker, with every process it started, is stopped
  (SIGSTOP), so a submission's background threads or processes cannot slow the reference down.
- Equal torch threads in every worker, and a worker's CPU time (every process it started, to the
  nanosecond) is charged when it exceeds what those threads could have used in the wall time measured: a
  submission cannot win by using more cores than the reference gets.

The statistic (`summarize`): per round, the submission's speedup over the wrapper and the reference's own;
their ratio (the submission's speedup as a fraction of the reference's) is the score's input, as the median
over rounds, with the spread kept. Because the wrapper and the reference are measured in the same run on
the same machine, the thresholds hold on any machine.

On CUDA the whole measurement holds a lock file per device, so gradings running in parallel on one GPU never
time at the same moment (`device_lock`); the worker overwrites a buffer larger than the L2 cache before each
forward and synchronises the device after each, as GPU kernel leaderboards do.
"""
from __future__ import annotations

import ast
import contextlib
import errno
import fcntl
import math
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from autograder import submission as reader
from autograder.rubric import SpeedSettings
from autograder.sandbox.client import Worker, WorkerConfig, WorkerError

REFERENCE_SOURCE = Path(__file__).resolve().parent.parent / "reference" / "mha.py"
WRAPPER, REFERENCE, SUBMISSION = "wrapper", "reference", "submission"


class TimingFailed(Exception):
    """The submission's timed forwards failed, were wrong or far too slow; the message is for the student."""


class CannotTime(RuntimeError):
    """The measurement itself cannot be trusted or run (never the submission's fault)."""


# -- the reference's own worker ------------------------------------------------------------------------------

class ReferenceWorker:
    """The worker that runs the reference's code for timing, started in a thread as soon as it is made, so
    that its start overlaps the other checks; `get()` waits for it to be ready."""

    def __init__(self, config: WorkerConfig):
        self.worker = Worker(reference_cells(), "reference.py", config)
        self.error: str | None = None
        self.thread = threading.Thread(target=self._start, name="reference-timing-worker", daemon=True)
        self.thread.start()

    def _start(self):
        try:
            loaded = self.worker.start()
            if loaded.errors:
                self.error = f"the reference did not load in its timing worker: {loaded.errors[0].message}"
        except WorkerError as exc:
            self.error = f"the reference's timing worker could not start: {exc}"

    def get(self) -> Worker:
        self.thread.join()
        if self.error:
            raise CannotTime(self.error)
        return self.worker

    def close(self):
        self.thread.join()
        self.worker.close()


def start_reference_workers(config: WorkerConfig) -> dict[str, ReferenceWorker]:
    """The wrapper's and the reference's timing workers, both starting now."""
    return {WRAPPER: ReferenceWorker(config), REFERENCE: ReferenceWorker(config)}


def reference_cells(path: Path = REFERENCE_SOURCE) -> list[tuple[int, int, str]]:
    """The reference's code cells that only define (imports, classes, functions, constants): what its timing
    worker loads, without the notebook's demonstrations and self-checks."""
    cells = []
    for number, source in reader.read_cells(path):
        body = ast.parse(source).body
        if body and all(isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
                        or (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper()
                                                                 for t in node.targets))
                        for node in body):
            cells.append((number, 1, source))
    return cells


# -- what is timed -------------------------------------------------------------------------------------------

@dataclass
class Target:
    """One module to time. `run(seeds, timeout)` sends one `forward_many` request and returns its answers
    (per call, a (batch, tokens, 3) tensor of probes); `worker` is the process it runs in; `calls` how many
    forwards it runs per round (the wrapper, many times slower, needs fewer to be timed as well)."""

    name: str
    worker: Worker  # or anything with suspend(), resume() and cpu_seconds()
    run: Callable[[list[int], float], list]
    calls: int


@dataclass
class Measurement:
    """Seconds per forward of each target in each measured round, and each worker's CPU charge."""

    rounds: dict[str, list[float]]
    cpu_factor: dict[str, float]  # per target: charged time / wall time (1 unless it used more threads)
    warmup: dict[str, list[float]] = field(default_factory=dict)


class Stage:
    """Lets one worker run at a time: every other one is stopped, with all its processes."""

    def __init__(self, workers):
        self.workers = list({id(w): w for w in workers}.values())
        self.running = None

    def __enter__(self):
        for worker in self.workers:
            worker.suspend()
        return self

    def run(self, worker):
        if self.running is not worker:
            if self.running is not None:
                self.running.suspend()
            worker.resume()
            self.running = worker

    def __exit__(self, *exc):
        for worker in self.workers:
            worker.resume()


def measure(targets: list[Target], settings: SpeedSettings, seeds: Iterator[int],
            verify: Callable[[dict[str, list]], None], request_seconds: float,
            clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Warm-up rounds, then `settings.rounds` measured rounds of each target's forwards (see the module's
    docstring); in a round every target's inputs come from the same new seeds. `verify(answers by target)`
    checks a round's answers (it raises TimingFailed). Raises
    TimingFailed when the submission's forwards fail, or are so slow after warm-up that even its best time
    is below `give_up_below` of the reference's worst."""
    by_name = {t.name: t for t in targets}
    workers = [t.worker for t in targets]
    walls: dict[str, list[float]] = {t.name: [] for t in targets}
    warm: dict[str, list[float]] = {t.name: [] for t in targets}
    worker_wall: dict[int, float] = {id(w): 0.0 for w in workers}

    def one_round(order: list[str], into: dict[str, list[float]], counted: bool):
        round_seeds = [next(seeds) for _ in range(max(t.calls for t in targets))]
        answers = {}
        for name in order:
            target = by_name[name]
            stage.run(target.worker)
            timeout = request_seconds
            if name == SUBMISSION and warm[REFERENCE]:
                # far beyond what could still earn anything: stop waiting (a sleeping or hanging forward)
                slowest = max(warm[REFERENCE] + walls[REFERENCE]) * target.calls
                timeout = min(request_seconds, 1.0 + 2 * slowest / settings.give_up_below)
            start = clock()
            answers[name] = target.run(round_seeds[:target.calls], timeout)
            wall = clock() - start
            into[name].append(wall / target.calls)
            if counted:
                worker_wall[id(target.worker)] += wall
        verify(answers)

    with Stage(workers) as stage:
        names = [t.name for t in targets]
        for _ in range(settings.warmup_rounds):  # the reference before the submission: its time bounds the wait
            one_round(names, warm, counted=False)
        if SUBMISSION in warm and REFERENCE in warm:
            best = max(warm[REFERENCE]) / min(warm[SUBMISSION])
            if best < settings.give_up_below:
                raise TimingFailed(
                    f"your forward took {min(warm[SUBMISSION]) * 1e3:.3g} ms per call at best, the reference's "
                    f"{max(warm[REFERENCE]) * 1e3:.3g} ms at worst: more than {1 / settings.give_up_below:g} times "
                    "slower, so the measured rounds were not run")
        cpu_before = {id(w): w.cpu_seconds() for w in stage.workers}
        for index in range(settings.rounds):
            one_round(round_order(names, index), walls, counted=True)
        cpu_used = {id(w): w.cpu_seconds() - cpu_before[id(w)] for w in stage.workers}
    factors = {t.name: cpu_factor(cpu_used[id(t.worker)], worker_wall[id(t.worker)], settings.threads)
               for t in targets}
    return Measurement(walls, factors, warm)


def round_order(names: list[str], index: int) -> list[str]:
    """The wrapper first, then the reference and the submission, in turn first: each follows the wrapper
    and the other equally often, so neither gains from what ran just before it."""
    first, rest = names[0], names[1:]
    return [first] + (rest if index % 2 == 0 else rest[::-1])


def check_probes(mine, expected, rtol: float, atol: float, sigmas: float, features: int):
    """Compare one timed call's answer (per token: sum y*R, sum |y|, sum y*y over the output's features,
    R standard normal) with the reference's for the same seed. For an output y' = y + e, the first column
    differs by sum e*R, normal with standard deviation sqrt(sum e^2); an output within the dtype's tolerance
    has |e| <= atol + rtol |y|, which bounds that deviation from the reference's own sums. Raises
    TimingFailed when a token's probe is off by more than `sigmas` such deviations."""
    if not (isinstance(mine, torch.Tensor) and mine.shape == expected.shape and mine.dtype == expected.dtype
            and bool(torch.isfinite(mine).all())):
        raise TimingFailed("a timed forward's answer was malformed or not finite")
    abs_sum, square_sum = expected[..., 1], expected[..., 2]
    deviation = torch.sqrt(features * atol**2 + 2 * atol * rtol * abs_sum + rtol**2 * square_sum)
    worst = ((mine[..., 0] - expected[..., 0]).abs() / deviation).max().item()
    if worst > sigmas:
        raise TimingFailed(
            "the output of a timed forward differs from the reference's for the same input (a random probe of "
            f"it is off by {worst:.3g} standard deviations of an output within tolerance, {sigmas:g} allowed). "
            "Each timed call must compute the answer for its own new input: answers cached or replayed from "
            "earlier calls earn nothing.")


# -- statistics ----------------------------------------------------------------------------------------------

CPU_SLACK_SECONDS = 0.002  # rounding of CPU time around a whole measurement (it is read to the nanosecond)


def cpu_factor(cpu_seconds: float, wall_seconds: float, threads: int) -> float:
    """How much more than its wall time a worker is charged: its CPU time over what `threads` threads
    could have used in that wall time, when above 1. A worker that used more cores than it was given is
    charged as if it had done the same work on the cores it was given."""
    if wall_seconds <= 0:
        return 1.0
    return max(1.0, (cpu_seconds - CPU_SLACK_SECONDS) / (threads * wall_seconds))


def credit(relative: float, no_credit_at: float, full_credit_at: float) -> float:
    """The fraction of the speed part's points for a speedup that is `relative` of the reference's: none
    at or below `no_credit_at`, all from `full_credit_at`, linear in between."""
    if relative >= full_credit_at:
        return 1.0
    if relative <= no_credit_at:
        return 0.0
    return (relative - no_credit_at) / (full_credit_at - no_credit_at)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarize(measurement: Measurement) -> dict:
    """The figures of one workload: median times, per-round speedups over the wrapper, the submission's
    speedup as a fraction of the reference's (`relative`, the median of the per-round ratios) and its
    spread. Times are charged times: wall time times the CPU factor."""
    charged = {name: [t * measurement.cpu_factor[name] for t in times] for name, times in measurement.rounds.items()}
    wrapper, reference, mine = charged[WRAPPER], charged[REFERENCE], charged[SUBMISSION]
    speedups = [w / s for w, s in zip(wrapper, mine)]
    reference_speedups = [w / r for w, r in zip(wrapper, reference)]
    relatives = [s / r for s, r in zip(speedups, reference_speedups)]
    q1, median, q3 = quartiles(relatives)
    return {
        "speedup": statistics.median(speedups),
        "reference_speedup": statistics.median(reference_speedups),
        "relative": median,
        "relative_spread": {"q1": q1, "q3": q3, "min": min(relatives), "max": max(relatives)},
        "ms_per_call": {name: statistics.median(times) * 1e3 for name, times in charged.items()},
        "wall_ms_per_call": {name: [round(t * 1e3, 4) for t in times] for name, times in measurement.rounds.items()},
        "cpu_factor": dict(measurement.cpu_factor),
        "rounds": len(relatives),
    }


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


# -- the device lock -----------------------------------------------------------------------------------------

def lock_path(device: str, directory: str | Path | None = None) -> Path:
    name = "".join(ch if ch.isalnum() else "-" for ch in device)
    return Path(directory or tempfile.gettempdir()) / f"mha-autograder-timing-{name}.lock"


@contextlib.contextmanager
def device_lock(device: str, seconds: float, directory: str | Path | None = None, poll: float = 0.05):
    """Hold the timing lock of `device` (an exclusive `flock` on a file in the temporary directory, which the
    sandboxed workers cannot see). The kernel releases it when its holder exits, however that happens, so
    no lock is ever stale. Raises CannotTime after waiting `seconds`."""
    path = lock_path(device, directory)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise CannotTime(f"the timing lock {path} was held by another grading for {seconds:g} s") from None
                time.sleep(poll)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock
