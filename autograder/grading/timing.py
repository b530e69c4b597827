"""Timing for the speed part: the measurement protocol, its statistics, and the per-device timing lock.

What is timed: the reference `MultiHeadAttentionWrapper`, the reference `MultiHeadAttention` and the
submission's `MultiHeadAttention`, all built with the same weights, each in a worker of its own: the two
reference modules in workers that run only the reference's code, in the same kind of sandboxed process as the
submission's, spoken to through the same protocol, so process, protocol and serialisation costs are the same
for all three and cancel in the ratios. (Each has a worker of its own because a process that has just run
the wrapper's many small calls runs the next forward measurably slower.) The submission's is its grading
worker, timed before any other check has run in it (the speed part's checks run first); a long-lived grading
process keeps the two reference workers for its next gradings (`KeptWorkers`).

How (`measure`):

- Everything that runs inside a worker is treated as hostile, so the clock is the grader's own: wall time
  around a timed request's calls (`client.TimedCalls`). The request carries only settings; then the grader
  sends each call's seed in a frame of its own, the next only once the previous call's answer has come back,
  and the worker makes the call's input from its seed. So no input exists before its call starts, no call
  can be batched with or prepared for a later one, and nothing the worker reports is a time (a submission
  that patches the worker's request loop changes nothing the grader measures). The client's work inside the
  clock is the same for the three workers: one small frame out, one answer in; the submission's CPU budget
  is charged between requests. The answer is, per token, a random probe of the output; every answer is
  compared with the reference's for the same seed, so caching, replaying, returning before the work is done
  or working on another stream earn nothing but a failure. The clock starts when the request is sent, so the
  worker's time before its first call is charged too (and bounded: `ready_seconds`). The seeds come from the
  operating system (`fresh_seeds`), never from a generator whose outputs a worker has seen.
- Every timed call is a checked one: after each request, once its clock has stopped, the whole outputs of
  calls picked at random only then (`Target.shown`, `pick`) and every call's record of the PyTorch functions it
  called come back (`Calls.finish`), for `verify` to compare with the reference's outputs and with the record
  of the same forward when its values were checked (the speed check's `verifier`).
- Warm-up rounds first, then measured rounds in batches (`verdict`): after `min_rounds`, and every
  `batch_rounds` more, a confidence interval for the median relative speedup is asked whether it settles the
  credit; the rounds stop when it does, or at `max_rounds`. Each round draws fresh seeds, shared by the three
  targets, and times the wrapper, then the reference and the submission, which take turns at going first.
  A forward far too slow to earn anything (`give_up_below`) is given up on only after `min_rounds` measured
  rounds, never on the warm-up alone; and once the grading's timing holds reach the rubric's `hold_seconds`,
  the rounds stop (from `min_rounds` on), an unsettled verdict credited the top of its interval.
- Only the worker being timed runs: every other worker, with every process it started, is stopped
  (SIGSTOP, or its control group frozen), and so is the submission's own worker throughout (`measure`'s
  `quiet`), so a submission's background threads or processes cannot slow anything timed down. Every timed
  worker is a trusted one that replays a graph the grader checked, and starts no process of its own.
- Each request is charged its wall time less the time the worker's thread that answers it, and the grader's
  thread that times it, waited for a CPU held by other processes (so a busy machine hurts nobody: with a
  round trip per call, the grader's own waits for a CPU would otherwise count once per call), but never less
  than the CPU time of all the worker's processes spread over the threads it was given (equal torch threads
  everywhere): a submission cannot win by using more cores than the reference gets, and sleeping or blocking
  is charged (`charge`). Other threads' waits are not deducted: the worker can cause them itself, and
  together they can exceed the wall time. The charge is never below zero.

The statistic (`summarize`): per round, the submission's speedup over the wrapper and the reference's own;
their ratio (the submission's speedup as a fraction of the reference's) is the score's input, as the median
over rounds, with its interval, the spread, the rounds taken and why they stopped (`verdict.Verdict`). Because the wrapper and the reference are measured in the same run on
the same machine, the thresholds hold on any machine.

The whole measurement holds its device's lock exclusive (`devices.QuietLock.hold`): gradings running in
parallel on one device never time at the same moment, and no other submission's code runs on the machine
meanwhile (every submission's worker is stopped outside its own requests, which hold the lock shared). On
CUDA the worker overwrites a buffer larger than the L2 cache before each forward and synchronises the device
after each, as GPU kernel leaderboards do.
"""

from __future__ import annotations

import math
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from autograder.contract import Workload
from autograder.grading import verdict
from autograder.grading.verdict import Verdict
from autograder.grading.workers import (
    REFERENCE,
    SUBMISSION,
    WRAPPER,
    BackgroundWorker,
    start_trusted_workers,
    trusted_config,
)
from autograder.model import RelativeSpread, WorkloadFigures
from autograder.rubric import SpeedSettings
from autograder.sandbox.client import Worker, WorkerError
from autograder.sandbox.protocol import (
    Captured,
    CaptureRequest,
    DropRequest,
    Graph,
    ModuleInfo,
    ReplayRequest,
    TimedShown,
)
from autograder.sandbox.settings import WorkerConfig


class TimingFailed(Exception):
    """The submission's timed forwards failed, were wrong or far too slow; the message is for the student."""


class TooSlow(TimingFailed):
    """After warm-up, even the submission's best time is far below anything that could earn points."""


# -- the reference's own worker ------------------------------------------------------------------------------


class KeptWorkers:
    """A long-lived grading process's two trusted timing workers, kept from one grading to the next
    (`grade.Options.kept_workers`), and the settings they were started for. Its owner, the process's loop,
    closes them when it ends (`close`, or a `with` block)."""

    def __init__(self) -> None:
        self.config: WorkerConfig | None = None
        self.workers: dict[str, BackgroundWorker] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> KeptWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, config: WorkerConfig) -> dict[str, BackgroundWorker]:
        """The two trusted timing workers for `config`'s kind of worker: the kept ones when they are for the
        same settings and still answer, else new ones (replacing any others). They only ever run the
        reference's code, so nothing of one submission reaches the next, and a grading starts one worker
        instead of three. Whoever uses a kept worker leaves closing it to `close`."""
        wanted = trusted_config(config)
        with self._lock:
            workers = self.workers
            if not (workers and self.config == wanted and all(w.healthy() for w in workers.values())):
                for worker in workers.values():
                    worker.close()
                workers = start_trusted_workers(config)
                for worker in workers.values():
                    worker.kept = True
                self.config, self.workers = wanted, workers
            return dict(workers)

    def close(self) -> None:
        """Close the kept workers (after any trouble in a grading, and when their owner ends); the next `get`
        starts them afresh."""
        with self._lock:
            for worker in self.workers.values():
                worker.close()
            self.config, self.workers = None, {}


# -- what is timed -------------------------------------------------------------------------------------------


# The reference's captured graphs, by what they were captured from (its class, arguments, the workload's shape and
# dtype, the device): its code does not change while a grading process runs and a graph takes its weights as
# inputs, so one capture serves every grading of the process (the wrapper's, over 64 heads, takes seconds).
REFERENCE_GRAPHS: dict[tuple[Any, ...], Captured] = {}


def replay_in(
    worker: Worker,
    handle: str,
    workload: Workload,
    state: dict[str, torch.Tensor],
    device: str,
    key: tuple[Any, ...] | None = None,
    replayer: Worker | None = None,
) -> tuple[str, Graph]:
    """A module of the reference's, built in the trusted `worker` under `handle`, captured there on the workload's
    shape (or its graph taken from `REFERENCE_GRAPHS` under `key`), dropped there, and replayed as a graph in
    `replayer` (default: `worker`), as the submission's forward is (the timed modules are replayed graphs in the
    same kind of process). Its own state where `state` (the weights the grader loaded) does not name it (its
    mask). Returns the replayed graph's handle, and the graph. Raises WorkerError or ValueError."""
    captured = REFERENCE_GRAPHS.get(key) if key is not None else None
    if captured is None:
        request = CaptureRequest(handle, list(workload.shape), workload.dtype, 0, list(state), device=device)
        captured = worker.request(request)
        if not isinstance(captured, Captured):
            raise ValueError("the capture did not give a graph")
        if key is not None:
            REFERENCE_GRAPHS[key] = captured
    tensors = [state[name] if name in state else captured.state[name] for name in captured.graph.inputs]
    worker.request(DropRequest(handle))
    replayed = (replayer or worker).request(ReplayRequest(captured.graph.to_wire(), tensors, device))
    if not isinstance(replayed, ModuleInfo):
        raise ValueError("the replay did not give a module")
    return replayed.handle, captured.graph


class Timed(Protocol):
    """What timing needs of a worker (`client.Worker` has it): to stop and resume every process it started; the
    CPU time of all its processes, ended ones included, which never falls; and the nanoseconds its thread that
    answers requests waited for a CPU, by thread id."""

    def suspend(self) -> None: ...

    def resume(self) -> None: ...

    def cpu_seconds(self) -> float: ...

    def thread_waits(self) -> dict[int, int]: ...


class Calls(Protocol):
    """One timed request (`client.TimedCalls` is one): `open()` sends its settings and waits for the worker's
    ready, `call(seed)` sends one call's seed and returns its answer: only these are inside the clock.
    `finish(show)` after the last, outside it, returns what the request shows: the whole outputs of the calls
    in `show`, and every call's record of the PyTorch functions it called."""

    def open(self) -> None: ...

    def call(self, seed: int) -> Any: ...

    def finish(self, show: list[int]) -> TimedShown: ...


@dataclass
class Target:
    """One module to time. `open(calls, timeout)` makes one timed request of that many calls, not sent yet
    (the worker is started if it must be), and returns its `Calls`; each answer is a (batch, tokens, 3)
    tensor of probes. `worker` is the process it runs in; `calls` how many forwards it runs per round (the
    wrapper, many times slower, needs fewer to be timed as well); `shown` how many of its calls' whole
    outputs are asked for after each request, picked at random only then (the submission's: any timed call
    may turn out to be a checked one). `failed(error)` turns a failure of the worker (a `WorkerError`) into
    what it means: the submission's fault (TimingFailed, or a failed check) or the grader's (CannotTime)."""

    name: str
    worker: Timed
    open: Callable[[int, float], Calls]
    calls: int
    failed: Callable[[WorkerError], None] = lambda error: None
    shown: int = 0


@dataclass
class RoundAnswers:
    """One round's answers, for `verify`: the seeds of its calls, and per target the probes each call
    answered, which calls' whole outputs were asked for after the clock stopped, and what the request showed
    (those outputs, every call's record)."""

    seeds: list[int]
    answers: dict[str, list[Any]]
    show: dict[str, list[int]]
    shown: dict[str, TimedShown]


def fresh_seeds() -> Iterator[int]:
    """Seeds for the timed calls, from the operating system's randomness: never from a generator whose
    outputs a worker has seen (the hidden weights come from the check's own), so no submission can predict
    the next call's input."""
    return iter(lambda: secrets.randbits(63), None)


def pick(count: int, among: int) -> list[int]:
    """`count` distinct calls of `among`, chosen by the operating system's randomness, in order."""
    return sorted(secrets.SystemRandom().sample(range(among), min(count, among)))


@dataclass
class Measurement:
    """Per target, per measured round, seconds per forward: `rounds` the charged time (what is scored),
    `walls` the wall time, `cpus` the CPU time of all the worker's processes, `waits` the time its threads
    and the grader's timing thread spent ready to run but waiting for a CPU."""

    rounds: dict[str, list[float]]
    walls: dict[str, list[float]] = field(default_factory=dict)
    cpus: dict[str, list[float]] = field(default_factory=dict)
    waits: dict[str, list[float]] = field(default_factory=dict)
    warmup: dict[str, list[float]] = field(default_factory=dict)
    verdict: Verdict | None = None  # what stopped the rounds (`verdict.decide`)
    seconds: float = 0.0  # the whole measurement's wall time, warm-up included (what the rounds cost)


class Stage:
    """Lets one worker run at a time, for its timed requests: every other one is stopped, with all its
    processes."""

    def __init__(self, workers: list[Timed]):
        self.workers = list({id(w): w for w in workers}.values())
        self.running: Timed | None = None

    def __enter__(self) -> Stage:
        for worker in self.workers:
            worker.suspend()
        return self

    def run(self, worker: Timed) -> None:
        if self.running is not worker:
            if self.running is not None:
                self.running.suspend()
            worker.resume()
            self.running = worker

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            worker.resume()


MIN_CHARGE = 1e-9  # seconds: a charge is never zero (the statistics divide by it); no forward comes near it


def charge(wall: float, cpu: float, wait: float, threads: int) -> float:
    """The time a request is charged: its wall time less the time the worker's thread that answers it, and the
    grader's thread that times it, waited for a CPU that other processes held (a busy machine is nobody's
    fault), but never less than its CPU time spread over the threads it was given (more cores earn nothing).
    Sleeping or blocking is charged; and since waiting for a CPU means wanting one, no worker can be charged
    less than the CPU time it used. Waits count up to the wall time and no further, and a CPU time below zero
    counts as none, so the charge is never below zero (nor below MIN_CHARGE)."""
    wait = min(max(wait, 0.0), wall)
    return max(MIN_CHARGE, max(cpu, 0.0) / threads, wall - wait)


def waited(before: dict[int, int], after: dict[int, int]) -> float:
    """Seconds waited for a CPU between two of a worker's `thread_waits()`, by the threads alive at both (a
    thread that ended takes its waits with it, which can only raise the charge); never below zero."""
    return sum(max(0, after[tid] - before[tid]) for tid in after.keys() & before.keys()) / 1e9


def measure(
    targets: list[Target],
    settings: SpeedSettings,
    seeds: Iterator[int],
    verify: Callable[[RoundAnswers], None],
    request_seconds: float,
    clock: Callable[[], float] = time.perf_counter,
    points: float = 1.0,
    own_wait: Callable[[], float] | None = None,
    hold_seconds: float = math.inf,
    quiet: Sequence[Timed] = (),
) -> Measurement:
    """Warm-up rounds, then measured rounds of each target's forwards (see the module's docstring) until
    the sequential verdict (`verdict.decide`, on the `points` the measurement decides) settles the credit
    or `settings.max_rounds` are taken; in a round every target's inputs come from the same new seeds.
    `own_wait()` (`procfs.own_wait`), when given: the seconds this thread has waited for a CPU, which the
    request is not charged either (its calls are a ping-pong of this thread and the worker's). The clock runs
    from the request's settings to its last answer, so the worker's time before its first call is charged
    too. `verify(round)` checks a round's answers, probes and shown outputs (it raises TimingFailed).
    `hold_seconds` (on `clock`): what is left of the grading's cap on its timing holds; past it, the rounds stop
    at the next round from `min_rounds` on (`verdict.capped`). `quiet`: workers that are not timed and stay
    stopped throughout (the submission's own, whose code must not run while anything is timed). Raises
    TimingFailed when the submission's forwards fail, or are so slow over `min_rounds` measured rounds that even
    its best time is below `give_up_below` of the reference's worst (`give_up_if_too_slow`: never on the
    warm-up alone)."""
    by_name = {t.name: t for t in targets}
    names = [t.name for t in targets]
    warm: dict[str, list[float]] = {name: [] for name in names}

    def per_target() -> dict[str, list[float]]:
        return {name: [] for name in names}

    result = Measurement(per_target(), per_target(), per_target(), per_target(), warmup=warm)

    def one_round(order: list[str], counted: bool) -> None:
        round_seeds = [next(seeds) for _ in range(max(t.calls for t in targets))]
        answers, show, shown = {}, {}, {}
        for name in order:
            target = by_name[name]
            stage.run(target.worker)
            timeout = request_seconds
            if name == SUBMISSION and warm[REFERENCE]:
                # far beyond what could still earn anything: stop waiting (a sleeping or hanging forward)
                slowest = max(result.walls[REFERENCE] or warm[REFERENCE]) * target.calls
                timeout = min(request_seconds, 1.0 + 2 * slowest / settings.give_up_below)
            answers[name], show[name], shown[name], (wall, cpu, wait) = timed_request(
                target, round_seeds[: target.calls], timeout, clock, own_wait
            )
            charged = charge(wall, cpu, wait, settings.threads) / target.calls
            if counted:
                for into, value in (
                    (result.rounds, charged),
                    (result.walls, wall),
                    (result.cpus, cpu),
                    (result.waits, wait),
                ):
                    into[name].append(value if into is result.rounds else value / target.calls)
            else:
                warm[name].append(charged)
        verify(RoundAnswers(round_seeds, answers, show, shown))

    began, cap_at = time.perf_counter(), clock() + hold_seconds
    with Stage([t.worker for t in targets] + list(quiet)) as stage:
        for _ in range(settings.warmup_rounds):  # the reference before the submission: its time bounds the wait
            one_round(names, counted=False)
        for index in range(settings.max_rounds):
            one_round(round_order(names, index), counted=True)
            taken = index + 1
            if taken >= settings.min_rounds:
                give_up_if_too_slow(result, settings)
            if verdict.next_look(index, settings) == taken:  # a look: do the rounds so far settle it?
                result.verdict = verdict.decide(relatives(result), settings, points)
            if result.verdict is None and taken >= settings.min_rounds and clock() >= cap_at:
                result.verdict = verdict.capped(relatives(result), settings, points)
            if result.verdict is not None:
                break
    result.seconds = time.perf_counter() - began
    return result


def timed_request(
    target: Target, seeds: list[int], timeout: float, clock: Callable[[], float], own_wait: Callable[[], float] | None
) -> tuple[list[Any], list[int], TimedShown, tuple[float, float, float]]:
    """One target's timed request in a round (`measure`): its answers to one call per seed, the calls picked to
    show after the clock stopped, what they showed, and (wall, CPU, wait) seconds of the whole request on `clock`:
    its worker's CPU, and the time its thread and this one waited for a CPU (`own_wait`). A failure goes through the
    target's (`Target.failed`) and is raised."""
    try:
        calls = target.open(target.calls, timeout)
        cpu_before, waits_before = target.worker.cpu_seconds(), target.worker.thread_waits()
        mine_before = own_wait() if own_wait else 0.0
        start = clock()
        calls.open()
        answers = [calls.call(seed) for seed in seeds]
        wall = clock() - start
        mine = own_wait() - mine_before if own_wait else 0.0
        cpu, wait = target.worker.cpu_seconds() - cpu_before, waited(waits_before, target.worker.thread_waits())
        show = pick(target.shown, target.calls)  # only now: any call may be one that is checked
        return answers, show, calls.finish(show), (wall, cpu, wait + mine)
    except WorkerError as exc:
        target.failed(exc)
        raise


def give_up_if_too_slow(measurement: Measurement, settings: SpeedSettings) -> None:
    """Raise TooSlow when even the submission's best measured round is below `give_up_below` of the reference's
    worst. Only measured rounds count: a warm-up round is a forward's first on its workload, and a machine that
    was busy (a classmate's daemon evicting the caches) can make it far slower than the forward is."""
    mine, reference = measurement.rounds.get(SUBMISSION), measurement.rounds.get(REFERENCE)
    if not (mine and reference):
        return
    best = max(reference) / min(mine)
    if best < settings.give_up_below:
        raise TooSlow(
            f"your forward took {min(mine) * 1e3:.3g} ms per call at best, the reference's {max(reference) * 1e3:.3g} "
            f"ms at worst in the same run ({len(mine)} measured rounds): even so, yours runs at {best:.2f} of the reference's "
            f"speed, and the speed points start above {settings.no_credit_at:g} of it. A forward below "
            f"{settings.give_up_below:g} (more than {1 / settings.give_up_below:.3g} times slower than the reference) "
            "cannot get there, so no more rounds were run"
        )


def relatives(measurement: Measurement) -> list[float]:
    """Per measured round, the submission's speedup over the wrapper as a fraction of the reference's:
    (wrapper / submission) / (wrapper / reference), the reference's time over the submission's."""
    charged = measurement.rounds
    return [
        (w / s) / (w / r) for w, r, s in zip(charged[WRAPPER], charged[REFERENCE], charged[SUBMISSION], strict=True)
    ]


def round_order(names: list[str], index: int) -> list[str]:
    """The wrapper first, then the reference and the submission, in turn first: each follows the wrapper
    and the other equally often, so neither gains from what ran just before it."""
    first, rest = names[0], names[1:]
    return [first] + (rest if index % 2 == 0 else rest[::-1])


def check_probes(mine: object, expected: torch.Tensor, rtol: float, atol: float, sigmas: float, features: int) -> None:
    """Compare one timed call's answer (per token: sum y*R, sum |y|, sum y*y over the output's features,
    R standard normal) with the reference's for the same seed, every column. For an output y' = y + e within
    the dtype's tolerance (|e| <= atol + rtol |y|): the first column differs by sum e*R, normal with
    standard deviation sqrt(sum e^2), which that bound bounds from the reference's own sums (`sigmas` such
    deviations allowed); the second by at most sum |e| and the third by at most sum (2 |y| |e| + e^2), each
    allowed twice its bound (rounding in the sums). Raises TimingFailed when a token's answer is off."""
    if not (
        isinstance(mine, torch.Tensor)
        and mine.shape == expected.shape
        and mine.dtype == expected.dtype
        and bool(torch.isfinite(mine).all())
    ):
        raise TimingFailed("a timed forward's answer was malformed or not finite")
    abs_sum, square_sum = expected[..., 1], expected[..., 2]
    deviation = torch.sqrt(features * atol**2 + 2 * atol * rtol * abs_sum + rtol**2 * square_sum)
    worst = ((mine[..., 0] - expected[..., 0]).abs() / deviation).max().item()
    abs_bound = features * atol + rtol * abs_sum
    square_bound = 2 * (atol * abs_sum + rtol * square_sum) + features * atol**2 + 2 * atol * rtol * abs_sum
    square_bound = square_bound + rtol**2 * square_sum
    off_abs = ((mine[..., 1] - abs_sum).abs() / (2 * abs_bound)).max().item()
    off_square = ((mine[..., 2] - square_sum).abs() / (2 * square_bound)).max().item()
    if worst > sigmas or off_abs > 1 or off_square > 1:
        found = (
            f"a random probe of it is off by {worst:.3g} standard deviations of an output within tolerance, "
            f"{sigmas:g} allowed"
            if worst > sigmas
            else "the sum of its absolute values or of its squares is off by more than any output within "
            "tolerance can be"
        )
        raise TimingFailed(
            f"the output of a timed forward differs from the reference's for the same input ({found}). "
            "Each timed call must compute the answer for its own new input: answers cached or replayed from "
            "earlier calls earn nothing."
        )


# -- statistics ----------------------------------------------------------------------------------------------


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarize(measurement: Measurement) -> WorkloadFigures:
    """The figures of one workload: median times, per-round speedups over the wrapper, the submission's
    speedup as a fraction of the reference's (`relative`, the median of the per-round ratios) and its
    spread. Times are charged times (`charge`); the wall, CPU and waiting times are kept beside them."""
    charged = measurement.rounds
    wrapper, reference, mine = charged[WRAPPER], charged[REFERENCE], charged[SUBMISSION]
    speedups = [w / s for w, s in zip(wrapper, mine)]
    reference_speedups = [w / r for w, r in zip(wrapper, reference)]
    relatives = [s / r for s, r in zip(speedups, reference_speedups)]
    q1, median, q3 = quartiles(relatives)
    v = measurement.verdict
    return WorkloadFigures(
        speedup=statistics.median(speedups),
        reference_speedup=statistics.median(reference_speedups),
        relative=median,
        relative_spread=RelativeSpread(q1, q3, min(relatives), max(relatives)),
        ms_per_call={name: statistics.median(times) * 1e3 for name, times in charged.items()},
        per_round_ms={
            kind: {name: [round(t * 1e3, 4) for t in times] for name, times in values.items()}
            for kind, values in (
                ("charged", charged),
                ("wall", measurement.walls),
                ("cpu", measurement.cpus),
                ("waiting", measurement.waits),
            )
        },
        rounds=len(relatives),
        timed_seconds=round(measurement.seconds, 3),
        decision=None if v is None else v.decision(),
    )


def geometric_mean(values: Sequence[float | None]) -> float | None:
    """The geometric mean of positive, finite `values`; None when there are none, or any other (never a math
    domain error: these are figures of the submission's timing, and no submission may make the grader fail)."""
    if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values if v is not None) / len(values))


# -- the device lock -----------------------------------------------------------------------------------------
