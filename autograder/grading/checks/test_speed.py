"""Speed: the submission's weight split against the reference wrapper, by as much as the reference's.

The speed part's checks run first in a grading (`GradingFixtures` orders them), so that the submission's
module is timed in a worker that has only loaded its file, as the reference's are.

How it is measured is `autograder/grading/timing.py`'s business; this check builds the three modules with the same
hidden weights, checks the submission's values on the timed workload first (a clear message beats a timing
of something wrong), holds the device's timing lock while it measures, then scores the submission's speedup
over the wrapper as a fraction of the reference's own speedup in the same run (`[speed]` in the rubric).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, NoReturn

import pytest
import torch

from autograder.grading import timing, verdict
from autograder.grading.checks.fixtures import GradingContext
from autograder.grading.checks.harness import (
    Inputs,
    Submission,
    assert_close,
    calls_difference,
    fail,
    forbidden_calls,
    reference_forward,
)
from autograder.grading.checks.mistakes import NOT_ONE_PASS
from autograder.grading.devices import TimingLockError, device_key
from autograder.grading.verdict import Verdict
from autograder.grading.workers import (
    REFERENCE,
    SUBMISSION,
    WRAPPER,
    BackgroundWorker,
    CannotTime,
    start_trusted_workers,
)
from autograder.model import TIMING_LOCK, SpeedBands, SpeedFigures, WorkloadFigures
from autograder.rubric import Rubric, SpeedSettings, Workload
from autograder.sandbox import procfs
from autograder.sandbox.client import Worker, WorkerError, WorkerTimeout
from autograder.sandbox.protocol import BuildRequest, DropRequest, ForwardManyRequest, ModuleInfo, Request
from reference import mha as ref

LOOP_HINT = (
    "\nCompute every head in one batched pass: project once, view the result as (b, T, H, head_dim), "
    "move the heads in front of the tokens and let one batched matmul serve them all; a Python loop over "
    "the heads pays the cost of every small call once per head."
)
# How many of each of the submission's timed requests' calls are also checked whole, picked after its clock.
SHOWN = 2


@pytest.fixture(scope="module")
def timing_workers(context: GradingContext) -> Iterator[dict[str, BackgroundWorker]]:
    """The wrapper's and the reference's timing workers, running only the reference's code (the grading run
    starts them in the background when it starts; here otherwise)."""
    started = context.timing_workers or start_trusted_workers(context.submission.worker.config)
    yield started
    if not context.timing_workers:
        for worker in started.values():
            worker.close()


def trusted(worker: Worker, request: Request) -> Any:
    """A request to the reference's worker: a failure there is the grader's, never the student's."""
    try:
        return worker.request(request)
    except WorkerError as exc:
        raise CannotTime(f"the reference's timing worker failed ({request.op}): {exc}") from None


def speed_settings(rubric: Rubric) -> SpeedSettings:
    """The rubric's [speed]; a speed check without one is the grader's fault."""
    if rubric.speed is None:
        raise RuntimeError("the speed part's check ran without [speed] in the rubric")
    return rubric.speed


def same_weights(
    inputs: Inputs, workload: Workload, dtype: torch.dtype
) -> tuple[ref.MultiHeadAttention, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The reference MultiHeadAttention with hidden weights, and the wrapper whose head h holds head h's
    columns of them (so the three modules timed do the same projections)."""
    w = workload
    mha = ref.MultiHeadAttention(w.d_in, w.d_out, w.tokens, 0.0, w.heads)
    state = inputs.state_dict(mha, dtype)
    width = w.d_out // w.heads
    wrapper = ref.MultiHeadAttentionWrapper(w.d_in, width, w.tokens, 0.0, w.heads).to(dtype)
    with torch.no_grad():
        for h, head in enumerate(wrapper.get_submodule("heads").children()):
            for name in ("W_query", "W_key", "W_value"):
                getattr(head, name).weight.copy_(getattr(mha, name).weight[h * width : (h + 1) * width])
    return mha.eval(), state, wrapper.state_dict()


def timed_input(seed: int, workload: Workload, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A timed call's input and probe, made from its seed exactly as the worker makes them
    (`server.op_forward_many`): x, then R, from one generator on the device."""
    w = workload
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(w.shape, generator=generator, device=device, dtype=getattr(torch, w.dtype))
    probe = torch.randn((*w.shape[:-1], w.d_out), generator=generator, device=device).double()
    return x, probe


def probes_of(y: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """Per token, (sum y*R, sum |y|, sum y*y) over the features, as a timed call answers them."""
    y = y.double()
    return torch.stack([(y * probe).sum(-1), y.abs().sum(-1), (y * y).sum(-1)], -1)


def verifier(
    workload: Workload, rubric: Rubric, mha: ref.MultiHeadAttention, checked_calls: dict[str, int], device: str
) -> Callable[[timing.RoundAnswers], None]:
    """Checks a round's answers. Every timed call of the submission is a checked one: every column of its
    probes against the reference's for the same seed; the whole outputs of the calls picked after the clock
    stopped against the reference's output on that input, computed here, and against the probes the call
    answered; and every call's record of PyTorch calls against the record of the same forward when its values
    were checked (`check_values_first`). A forward that computes, or calls anything, differently when timed
    earns no speed points, whatever it used to tell the two apart."""
    rtol, atol = rubric.tolerance(workload.dtype)
    sigmas = speed_settings(rubric).probe_sigmas
    reference = mha.to(device)

    def verify(round: timing.RoundAnswers) -> None:
        mine = round.answers[SUBMISSION]
        for answer, expected in zip(mine, round.answers[REFERENCE]):
            timing.check_probes(answer, expected, rtol, atol, sigmas, workload.d_out)
        shown = round.shown[SUBMISSION]
        for index, y in zip(round.show[SUBMISSION], shown.outputs):
            x, probe = timed_input(round.seeds[index], workload, device)
            expected = reference_forward(reference, x).double().cpu()
            if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(expected.shape):
                raise timing.TimingFailed("a timed forward's output, shown after the timing, was malformed")
            if not torch.allclose(y.double(), expected, rtol=rtol, atol=atol):
                largest = (y.double() - expected).abs().max().item()
                raise timing.TimingFailed(
                    "the whole output of a timed call, asked for once the timing had stopped, differs from the "
                    f"reference's for the same input (largest difference {largest:.3g}; tolerance {atol:g} + "
                    f"{rtol:g} x |expected|): every timed call must compute the right answer for its input"
                )
            if not torch.allclose(probes_of(y.to(probe.device), probe).cpu(), mine[index], rtol=1e-9, atol=1e-9):
                raise timing.TimingFailed(
                    "the whole output a timed call showed after the timing is not the output whose probes it "
                    "answered while it was timed"
                )
        for record in shown.calls:
            if record != checked_calls:
                raise timing.TimingFailed(
                    "your forward called different PyTorch functions when it was timed than when its values "
                    f"were checked on the same workload ({calls_difference(checked_calls, record)}). The speed "
                    "part times only a forward that computes the same way whether or not it is checked"
                )
        if len(shown.calls) != len(mine):
            raise timing.TimingFailed("the timed calls' records of what they called did not come back whole")

    return verify


def describe(workload: Workload) -> str:
    w = workload
    return (
        f"{w.name}: batch {w.batch}, {w.tokens} tokens, {w.d_in} -> {w.d_out} features, {w.heads} heads "
        f"of width {w.d_out // w.heads}, {w.dtype}"
    )


def record(context: GradingContext, workload: Workload, figures: WorkloadFigures) -> None:
    """The workload's figures into the run's speed figures; the headline figures are the geometric means
    over the workloads measured (one on the CPU); `bands` are the rubric's, for the feedback to explain."""
    settings = speed_settings(context.rubric)
    speed = context.speed or SpeedFigures(
        device=context.device,
        threads=settings.threads,
        bands=SpeedBands(settings.full_credit_at, settings.no_credit_at, settings.give_up_below),
    )
    workloads = {**speed.workloads, workload.name: figures}
    measured = [f for f in workloads.values() if f.relative is not None]

    def mean(values: list[float | None]) -> float | None:
        return timing.geometric_mean(values) if measured else None

    context.speed = replace(
        speed,
        workloads=workloads,
        speedup=mean([f.speedup for f in measured]),
        reference_speedup=mean([f.reference_speedup for f in measured]),
        relative=mean([f.relative for f in measured]),
    )


@dataclass
class Built:
    """A module built in one of the reference's timing workers."""

    worker: Worker
    handle: str


def check_values_first(
    submission: Submission,
    module: ModuleInfo,
    mha: ref.MultiHeadAttention,
    inputs: Inputs,
    workload: Workload,
    rubric: Rubric,
    device: str,
) -> dict[str, int]:
    """The submission's output on this very workload, before any timing: a timing of something wrong
    would mean nothing. Twice, on two inputs, so that whatever a forward does once (a mask made on its first
    call) is behind it; the second forward's record of PyTorch calls is what every timed call must match,
    and it may not show an API the rubric forbids."""
    record: dict[str, int] = {}
    for _ in range(2):
        x = inputs.randn(*workload.shape, dtype=getattr(torch, workload.dtype))
        answer = submission.forward(module, x)
        assert_close(
            answer.y,
            reference_forward(mha.to(device), x.to(device)).cpu(),
            workload.dtype,
            rubric,
            f"output on the speed workload ({describe(workload)})",
        )
        record = answer.torch_calls or {}
    used = forbidden_calls(record, rubric.apis)
    if used:
        fail(
            f"{describe(workload)}: on this workload your forward calls {', '.join(used)}, which the exercise does "
            "not allow (the speed part times the attention you write yourself)"
        )
    return record


def build_references(
    timing_workers: dict[str, BackgroundWorker],
    workload: Workload,
    state: dict[str, torch.Tensor],
    wrapper_state: dict[str, torch.Tensor],
    device: str,
) -> tuple[Built, Built]:
    """The reference MultiHeadAttention and the wrapper, with the same weights, each in its timing worker."""
    w = workload
    built = []
    weights: dict[str, torch.Tensor]
    for name, cls, args, weights in (
        (REFERENCE, "MultiHeadAttention", [w.d_in, w.d_out, w.tokens, 0.0, w.heads], state),
        (
            WRAPPER,
            "MultiHeadAttentionWrapper",
            [w.d_in, w.d_out // w.heads, w.tokens, 0.0, w.heads],
            wrapper_state,
        ),
    ):
        worker = timing_workers[name].get()
        module = trusted(worker, BuildRequest(cls, args, {}, weights, w.dtype, device))
        built.append(Built(worker, module.handle))
    return built[0], built[1]


def timing_targets(
    submission: Submission,
    module: ModuleInfo,
    reference: Built,
    wrapper: Built,
    workload: Workload,
    threads: int,
    ready_seconds: float,
) -> list[timing.Target]:
    """The three timed modules, each by its timed `forward_many` requests on the workload's inputs, through
    the same client code (`client.TimedCalls`): only what a failure means differs. The reference's and the
    submission's forwards run under the call recorder (`server.CallRecorder`), so both pay its cost; the
    wrapper's, trusted and never compared, does not. After each of the submission's requests, the whole
    outputs of `SHOWN` of its calls, picked at random once the clock has stopped, are checked."""
    w = workload

    def forwards(handle: str, calls: int, record: bool) -> ForwardManyRequest:
        flush_bytes = int(w.flush_mib * (1 << 20))
        return ForwardManyRequest(handle, calls, list(w.shape), w.dtype, w.d_out, threads, flush_bytes, record)

    def in_reference_worker(built: Built, cls: str, record: bool) -> Callable[[int, float], timing.Calls]:
        return lambda calls, timeout: built.worker.timed_calls(
            forwards(built.handle, calls, record),
            timeout,
            target=f"the reference's {cls}.forward",
            ready_seconds=ready_seconds,
        )

    def in_submission_worker(calls: int, timeout: float) -> timing.Calls:
        return submission.timed_calls(module, forwards(module.handle, calls, True), timeout, ready_seconds)

    def grader_fault(exc: WorkerError) -> NoReturn:
        raise CannotTime(f"the reference's timing worker failed (forward_many): {exc}") from None

    def submission_failed(exc: WorkerError) -> NoReturn:
        if isinstance(exc, WorkerTimeout):  # its deadline is set by the reference's time: too slow, not hung
            fail(str(exc), mistake=NOT_ONE_PASS)
        submission.failed(exc)

    return [
        timing.Target(
            WRAPPER,
            wrapper.worker,
            in_reference_worker(wrapper, "MultiHeadAttentionWrapper", record=False),
            w.wrapper_calls,
            grader_fault,
        ),
        timing.Target(
            REFERENCE,
            reference.worker,
            in_reference_worker(reference, "MultiHeadAttention", record=True),
            w.calls,
            grader_fault,
        ),
        timing.Target(SUBMISSION, submission.worker, in_submission_worker, w.calls, submission_failed, shown=SHOWN),
    ]


def measure_locked(
    context: GradingContext,
    submission: Submission,
    targets: list[timing.Target],
    verify: Callable[[timing.RoundAnswers], None],
    workload: Workload,
    rubric: Rubric,
    device: str,
    points: float,
    started: float,
) -> timing.Measurement:
    """The measurement, holding the device's timing lock (`points`: what it decides, for the verdict). Timed forwards that fail, are wrong or are far too
    slow fail the check here, with what was found recorded."""
    settings = speed_settings(rubric)
    try:
        with context.quiet.hold(device_key(device), settings.lock_seconds):
            submission.begin_check()  # the wait for the lock is not the submission's time
            return timing.measure(
                targets,
                settings,
                timing.fresh_seeds(),
                verify,
                submission.worker.config.request_seconds,
                points=points,
                own_wait=procfs.own_wait,
                hold_seconds=settings.hold_seconds - context.quiet.held,
            )
    except TimingLockError as exc:
        raise CannotTime(str(exc), cause=TIMING_LOCK) from None
    except timing.TimingFailed as exc:
        seconds = round(time.perf_counter() - started, 3)
        record(context, workload, WorkloadFigures(workload=asdict(workload), failed=str(exc), seconds=seconds))
        too_slow = isinstance(exc, timing.TooSlow)
        fail(f"{describe(workload)}: {exc}" + (LOOP_HINT if too_slow else ""), mistake=NOT_ONE_PASS if too_slow else "")


def drop(*built: Built) -> None:
    """Kept reference workers serve later gradings: they forget what this one built."""
    for module in built:
        with contextlib.suppress(WorkerError):
            module.worker.request(DropRequest(module.handle))


def figures_of(measurement: timing.Measurement, workload: Workload, settings: SpeedSettings) -> WorkloadFigures:
    """The measurement's figures, once the run is known to tell a parallel forward from a sequential one."""
    figures = timing.summarize(measurement)
    reference_speedup = figures.reference_speedup or 0.0  # summarize always sets it
    if reference_speedup < settings.min_reference_speedup:
        raise CannotTime(
            f"in this run the reference was only {reference_speedup:.2f} times faster than the wrapper "
            f"on {describe(workload)} (at least {settings.min_reference_speedup:g} is needed to tell a parallel forward "
            "from a sequential one): choose a workload in [speed] where the weight split matters on this machine"
        )
    return figures


def flag_if_implausible(
    context: GradingContext, workload: Workload, figures: WorkloadFigures, settings: SpeedSettings
) -> None:
    """A speedup far beyond the reference's, for the same computation, is for the instructor to look at."""
    if (figures.relative or 0.0) > settings.flag_above:
        context.flags.append(
            f"speed ({workload.name}): a speedup over the wrapper of {figures.speedup:.2f}x is "
            f"{figures.relative:.2f} times the reference's {figures.reference_speedup:.2f}x in the same run, "
            "implausibly fast for the same computation: look for caching, timing tricks or work done outside the "
            "timed forward"
        )


def speed_verdict(measurement: timing.Measurement, settings: SpeedSettings, points: float) -> Verdict:
    """What stopped the rounds; the rounds taken, should none have (never at `max_rounds`)."""
    return measurement.verdict or verdict.final(timing.relatives(measurement), settings, points)


def explain_verdict(workload: Workload, figures: WorkloadFigures, said: Verdict, settings: SpeedSettings) -> None:
    """Fail with the figures and the verdict in words, unless every point is earned."""
    if said.credit >= 1:
        return
    times = figures.ms_per_call or {}
    hint = LOOP_HINT if said.median <= settings.no_credit_at else ""
    fail(
        f"{describe(workload)}: your forward took {times[SUBMISSION]:.3g} ms per call, the reference "
        f"MultiHeadAttention {times[REFERENCE]:.3g} ms and the wrapper {times[WRAPPER]:.3g} ms. "
        f"Your speedup over the wrapper is {figures.speedup:.2f}x, the reference's {figures.reference_speedup:.2f}x "
        f"in the same run: {verdict.describe(said, settings)}. Full points from {settings.full_credit_at:g}, none "
        f"at {settings.no_credit_at:g} or below.{hint}",
        mistake=NOT_ONE_PASS if hint else "",
    )


@pytest.mark.part("speed")
def test_faster_than_the_wrapper(
    context: GradingContext,
    submission: Submission,
    inputs: Inputs,
    rubric: Rubric,
    device: str,
    speed_workload: Workload,
    timing_workers: dict[str, BackgroundWorker],
    request: pytest.FixtureRequest,
) -> None:
    """the parallel forward beats the wrapper by about as much as the reference's does"""
    started = time.perf_counter()
    settings, w = speed_settings(rubric), speed_workload
    points = rubric.part_points("speed") / max(1, len(settings.workloads_for(device)))
    mha, state, wrapper_state = same_weights(inputs, w, getattr(torch, w.dtype))
    # the submission's grading worker, which no other check has used yet: the speed part runs first
    module = submission.build(
        "MultiHeadAttention", w.d_in, w.d_out, w.tokens, 0.0, w.heads, state_dict=state, dtype=getattr(torch, w.dtype)
    )
    checked_calls = check_values_first(submission, module, mha, inputs, w, rubric, device)
    reference, wrapper = build_references(timing_workers, w, state, wrapper_state, device)  # only now: see above
    try:
        targets = timing_targets(submission, module, reference, wrapper, w, settings.threads, settings.ready_seconds)
        verify = verifier(w, rubric, mha, checked_calls, device)
        measurement = measure_locked(context, submission, targets, verify, w, rubric, device, points, started)
    finally:
        drop(reference, wrapper)
    figures = figures_of(measurement, w, settings)
    said = speed_verdict(measurement, settings, points)
    figures = replace(
        figures,
        workload=asdict(w),
        credit=said.credit,
        seconds=round(time.perf_counter() - started, 3),
        said=verdict.describe(said, settings),
    )
    record(context, w, figures)
    flag_if_implausible(context, w, figures, settings)
    request.node.user_properties.append(("credit", said.credit))
    explain_verdict(w, figures, said, settings)
