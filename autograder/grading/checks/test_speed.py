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
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

import pytest
import torch

from autograder.grading import timing, verdict
from autograder.grading.checks.fixtures import GradingContext
from autograder.grading.checks.harness import Inputs, ModuleRef, Submission, assert_close, fail, reference_forward
from autograder.grading.checks.mistakes import NOT_ONE_PASS
from autograder.grading.devices import TimingLockError, device_key, timing_lock
from autograder.grading.verdict import Verdict
from autograder.rubric import Rubric, SpeedSettings, Workload
from autograder.sandbox import procfs
from autograder.sandbox.client import Worker, WorkerError, WorkerTimeout
from reference import mha as ref

LOOP_HINT = (
    "\nCompute every head in one batched pass: project once, view the result as (b, T, H, head_dim), "
    "move the heads in front of the tokens and let one batched matmul serve them all; a Python loop over "
    "the heads pays the cost of every small call once per head."
)


@pytest.fixture(scope="module")
def timing_workers(context: GradingContext) -> Iterator[dict[str, timing.BackgroundWorker]]:
    """The wrapper's and the reference's timing workers, running only the reference's code (the grading run
    starts them in the background when it starts; here otherwise)."""
    started = context.timing_workers or timing.start_trusted_workers(context.submission.worker.config)
    yield started
    if not context.timing_workers:
        for worker in started.values():
            worker.close()


def trusted(worker: Worker, op: str, **args: Any) -> Any:
    """A request to the reference's worker: a failure there is the grader's, never the student's."""
    try:
        return worker.request(op, **args)
    except WorkerError as exc:
        raise timing.CannotTime(f"the reference's timing worker failed ({op}): {exc}") from None


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


def verifier(workload: Workload, rubric: Rubric) -> Callable[[dict[str, list[torch.Tensor]]], None]:
    """Checks a round's answers: every probe of the submission's outputs against the reference's."""
    rtol, atol = rubric.tolerance(workload.dtype)
    sigmas = speed_settings(rubric).probe_sigmas

    def verify(answers: dict[str, list[torch.Tensor]]) -> None:
        for mine, expected in zip(answers[timing.SUBMISSION], answers[timing.REFERENCE]):
            timing.check_probes(mine, expected, rtol, atol, sigmas, workload.d_out)

    return verify


def describe(workload: Workload) -> str:
    w = workload
    return (
        f"{w.name}: batch {w.batch}, {w.tokens} tokens, {w.d_in} -> {w.d_out} features, {w.heads} heads "
        f"of width {w.d_out // w.heads}, {w.dtype}"
    )


def record(context: GradingContext, workload: Workload, figures: dict[str, Any]) -> None:
    """The workload's figures into the run's measurements; the headline figures are the geometric means
    over the workloads measured (one on the CPU); `bands` are the rubric's, for the feedback to explain."""
    settings = speed_settings(context.rubric)
    bands = {key: getattr(settings, key) for key in ("full_credit_at", "no_credit_at", "give_up_below")}
    speed = context.measurements.setdefault(
        "speed", {"device": context.device, "threads": settings.threads, "bands": bands, "workloads": {}}
    )
    speed["workloads"][workload.name] = figures
    measured = [f for f in speed["workloads"].values() if "relative" in f]
    for key in ("speedup", "reference_speedup", "relative"):
        speed[key] = timing.geometric_mean([f[key] for f in measured]) if measured else None


@dataclass
class Built:
    """A module built in one of the reference's timing workers."""

    worker: Worker
    handle: str


def check_values_first(
    submission: Submission,
    module: ModuleRef,
    mha: ref.MultiHeadAttention,
    inputs: Inputs,
    workload: Workload,
    rubric: Rubric,
    device: str,
) -> None:
    """The submission's output on this very workload, before any timing: a timing of something wrong
    would mean nothing."""
    x = inputs.randn(*workload.shape, dtype=getattr(torch, workload.dtype))
    assert_close(
        submission.forward(module, x).y,
        reference_forward(mha.to(device), x.to(device)).cpu(),
        workload.dtype,
        rubric,
        f"output on the speed workload ({describe(workload)})",
    )


def build_references(
    timing_workers: dict[str, timing.BackgroundWorker],
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
        (timing.REFERENCE, "MultiHeadAttention", [w.d_in, w.d_out, w.tokens, 0.0, w.heads], state),
        (
            timing.WRAPPER,
            "MultiHeadAttentionWrapper",
            [w.d_in, w.d_out // w.heads, w.tokens, 0.0, w.heads],
            wrapper_state,
        ),
    ):
        worker = timing_workers[name].get()
        module = trusted(
            worker, "build", cls=cls, args=args, kwargs={}, state_dict=weights, dtype=w.dtype, device=device
        )
        built.append(Built(worker, module.handle))
    return built[0], built[1]


def timing_targets(
    submission: Submission, module: ModuleRef, reference: Built, wrapper: Built, workload: Workload, threads: int
) -> list[timing.Target]:
    """The three timed modules, each by its timed `forward_many` requests on the workload's inputs, through
    the same client code (`client.TimedCalls`): only what a failure means differs."""
    w = workload
    request_args: dict[str, Any] = dict(
        shape=list(w.shape),
        dtype=w.dtype,
        out_features=w.d_out,
        threads=threads,
        flush_bytes=int(w.flush_mib * (1 << 20)),
    )

    def in_reference_worker(built: Built, cls: str) -> Callable[[int, float], timing.Calls]:
        return lambda calls, timeout: built.worker.timed_calls(
            calls, timeout, target=f"the reference's {cls}.forward", handle=built.handle, **request_args
        )

    def in_submission_worker(calls: int, timeout: float) -> timing.Calls:
        return submission.timed_calls(module, calls, timeout, **request_args)

    def grader_fault(exc: WorkerError) -> NoReturn:
        raise timing.CannotTime(f"the reference's timing worker failed (forward_many): {exc}") from None

    def submission_failed(exc: WorkerError) -> NoReturn:
        if isinstance(exc, WorkerTimeout):  # its deadline is set by the reference's time: too slow, not hung
            fail(str(exc), mistake=NOT_ONE_PASS)
        submission.failed(exc)

    return [
        timing.Target(
            timing.WRAPPER,
            wrapper.worker,
            in_reference_worker(wrapper, "MultiHeadAttentionWrapper"),
            w.wrapper_calls,
            grader_fault,
        ),
        timing.Target(
            timing.REFERENCE,
            reference.worker,
            in_reference_worker(reference, "MultiHeadAttention"),
            w.calls,
            grader_fault,
        ),
        timing.Target(timing.SUBMISSION, submission.worker, in_submission_worker, w.calls, submission_failed),
    ]


def measure_locked(
    context: GradingContext,
    submission: Submission,
    targets: list[timing.Target],
    inputs: Inputs,
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
        with timing_lock(device_key(device), settings.lock_seconds):
            submission.begin_check()  # the wait for the lock is not the submission's time
            return timing.measure(
                targets,
                settings,
                iter(inputs.seed_value, None),
                verifier(workload, rubric),
                submission.worker.config.request_seconds,
                points=points,
                own_wait=procfs.own_wait,
            )
    except TimingLockError as exc:
        raise timing.CannotTime(str(exc)) from None
    except timing.TimingFailed as exc:
        seconds = round(time.perf_counter() - started, 3)
        record(context, workload, {"workload": asdict(workload), "failed": str(exc), "seconds": seconds})
        too_slow = isinstance(exc, timing.TooSlow)
        fail(f"{describe(workload)}: {exc}" + (LOOP_HINT if too_slow else ""), mistake=NOT_ONE_PASS if too_slow else "")


def drop(*built: Built) -> None:
    """Kept reference workers serve later gradings: they forget what this one built."""
    for module in built:
        with contextlib.suppress(WorkerError):
            module.worker.request("drop", handle=module.handle)


def figures_of(measurement: timing.Measurement, workload: Workload, settings: SpeedSettings) -> dict[str, Any]:
    """The measurement's figures, once the run is known to tell a parallel forward from a sequential one."""
    figures = timing.summarize(measurement)
    if figures["reference_speedup"] < settings.min_reference_speedup:
        raise timing.CannotTime(
            f"in this run the reference was only {figures['reference_speedup']:.2f} times faster than the wrapper "
            f"on {describe(workload)} (at least {settings.min_reference_speedup:g} is needed to tell a parallel forward "
            "from a sequential one): choose a workload in [speed] where the weight split matters on this machine"
        )
    return figures


def flag_if_implausible(
    context: GradingContext, workload: Workload, figures: dict[str, Any], settings: SpeedSettings
) -> None:
    """A speedup far beyond the reference's, for the same computation, is for the instructor to look at."""
    if figures["relative"] > settings.flag_above:
        context.flags.append(
            f"speed ({workload.name}): a speedup over the wrapper of {figures['speedup']:.2f}x is "
            f"{figures['relative']:.2f} times the reference's {figures['reference_speedup']:.2f}x in the same run, "
            "implausibly fast for the same computation: look for caching, timing tricks or work done outside the "
            "timed forward"
        )


def speed_verdict(measurement: timing.Measurement, settings: SpeedSettings, points: float) -> Verdict:
    """What stopped the rounds; the rounds taken, should none have (never at `max_rounds`)."""
    return measurement.verdict or verdict.final(timing.relatives(measurement), settings, points)


def explain_verdict(workload: Workload, figures: dict[str, Any], said: Verdict, settings: SpeedSettings) -> None:
    """Fail with the figures and the verdict in words, unless every point is earned."""
    if said.credit >= 1:
        return
    times = figures["ms_per_call"]
    hint = LOOP_HINT if said.median <= settings.no_credit_at else ""
    fail(
        f"{describe(workload)}: your forward took {times[timing.SUBMISSION]:.3g} ms per call, the reference "
        f"MultiHeadAttention {times[timing.REFERENCE]:.3g} ms and the wrapper {times[timing.WRAPPER]:.3g} ms. "
        f"Your speedup over the wrapper is {figures['speedup']:.2f}x, the reference's {figures['reference_speedup']:.2f}x "
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
    timing_workers: dict[str, timing.BackgroundWorker],
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
    check_values_first(submission, module, mha, inputs, w, rubric, device)
    reference, wrapper = build_references(timing_workers, w, state, wrapper_state, device)  # only now: see above
    try:
        targets = timing_targets(submission, module, reference, wrapper, w, settings.threads)
        measurement = measure_locked(context, submission, targets, inputs, w, rubric, device, points, started)
    finally:
        drop(reference, wrapper)
    figures = figures_of(measurement, w, settings)
    said = speed_verdict(measurement, settings, points)
    figures.update(workload=asdict(w), credit=said.credit, seconds=round(time.perf_counter() - started, 3))
    figures.setdefault("verdict", {}).update(said=verdict.describe(said, settings))
    record(context, w, figures)
    flag_if_implausible(context, w, figures, settings)
    request.node.user_properties.append(("credit", said.credit))
    explain_verdict(w, figures, said, settings)
