"""Speed: the submission's weight split against the reference wrapper, by as much as the reference's.

What is timed is never student code. This check builds the submission's MultiHeadAttention with hidden weights
in its worker, checks its output on the timed workload (a clear message beats a timing of something wrong),
captures its forward there as a graph of ATen operations, judges the graph here (`graphs`), and has it replayed
by a trusted worker that never ran student code; the reference MultiHeadAttention and the wrapper, with the same
weights, are captured and replayed the same way in their own trusted workers. It holds the device's timing lock
while it measures the three graphs (`autograder/grading/timing.py`), with the submission's own worker stopped
throughout, then scores the submission's speedup over the wrapper as a fraction of the reference's own speedup
in the same run (`[speed]` in the rubric). Every timed call gets a fresh input from the operating system's
randomness and is checked: what a student hid from the capture is simply not run, and a graph that is not right
on a fresh input earns nothing.

The speed part's checks run first in a grading (`GradingFixtures` orders them), so that the graphs are timed in
workers that have run nothing else of this grading.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest
import torch

from autograder.contract import Workload
from autograder.grading import graphs, speed_figures, timing, verdict
from autograder.grading.checks.fixtures import GradingContext
from autograder.grading.checks.harness import (
    NOT_REPLAYABLE,
    READY_MADE,
    Inputs,
    Submission,
    assert_close,
    fail,
    reference_cost,
    reference_forward,
    replay,
    replay_state,
)
from autograder.grading.checks.mistakes import NOT_ONE_PASS
from autograder.grading.devices import TimingLockError, device_key
from autograder.grading.speed_figures import describe
from autograder.grading.verdict import Verdict
from autograder.grading.workers import (
    REFERENCE,
    SUBMISSION,
    WRAPPER,
    BackgroundWorker,
    CannotTime,
    start_trusted_workers,
)
from autograder.model import TIMING_LOCK, WorkloadFigures
from autograder.rubric import Rubric, SpeedSettings
from autograder.sandbox import procfs
from autograder.sandbox.client import SubmissionError, Worker, WorkerError, WorkerTimeout
from autograder.sandbox.protocol import (
    BuildRequest,
    Captured,
    DropRequest,
    ForwardManyRequest,
    Graph,
    ModuleInfo,
    Request,
)
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
    workload: Workload, rubric: Rubric, mha: ref.MultiHeadAttention, device: str
) -> Callable[[timing.RoundAnswers], None]:
    """Checks a round's answers. Every timed call of the submission's graph is a checked one: every column of its
    probes against the reference's for the same seed, and the whole outputs of the calls picked after the clock
    stopped against the reference's output on that input, computed here, and against the probes the call
    answered. A graph that is not right on every fresh input earns no speed points."""
    rtol, atol = rubric.tolerance(workload.dtype)
    sigmas = speed_settings(rubric).probe_sigmas
    reference = mha.to(device)

    def verify(round: timing.RoundAnswers) -> None:
        mine = round.answers[SUBMISSION]
        for answer, expected in zip(mine, round.answers[REFERENCE]):
            timing.check_probes(answer, expected, rtol, atol, sigmas, workload.d_out)
        for index, y in zip(round.show[SUBMISSION], round.shown[SUBMISSION].outputs):
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

    return verify


@dataclass
class Built:
    """A timed module in a trusted timing worker, by its handle: a replayed graph (`graph`), or the wrapper as it
    is (None)."""

    worker: Worker
    handle: str
    graph: Graph | None


def check_values_first(
    submission: Submission,
    module: ModuleInfo,
    mha: ref.MultiHeadAttention,
    inputs: Inputs,
    workload: Workload,
    rubric: Rubric,
    device: str,
) -> None:
    """The submission's own output on this very workload, before anything is captured or timed: a timing of
    something wrong would mean nothing, and a clear message beats a timing's."""
    x = inputs.randn(*workload.shape, dtype=getattr(torch, workload.dtype))
    reference, on_device = mha.to(device), x.to(device)
    expected, cpu = reference_cost(lambda: reference_forward(reference, on_device).cpu())
    assert_close(
        submission.forward(module, x, reference_cpu=cpu).y,
        expected,
        workload.dtype,
        rubric,
        f"output on the speed workload ({describe(workload)})",
    )


def captured_graph(
    submission: Submission,
    module: ModuleInfo,
    state: dict[str, torch.Tensor],
    workload: Workload,
    rubric: Rubric,
    device: str,
) -> Captured:
    """The graph of the submission's forward on this workload's shape, judged here: what is timed. A forward
    that uses a ready-made attention earns nothing here and is told so once, by the check of part mha that
    the speed part requires, or here where only this workload's graph shows it; one whose graph runs what the
    grader does not replay fails, saying which."""
    capture = submission.capture(module, workload.shape, workload.dtype, list(state), rubric.graph.max_nodes, device)
    used = graphs.ready_made(capture.graph, rubric)
    if used:  # (when the check of part mha finds it too, the speed part is not credited instead: said once)
        fail(
            f"{describe(workload)}: your forward calls {', '.join(used)} here, which the exercise does not allow "
            "(the speed part times the attention you write yourself)",
            mistake=READY_MADE,
        )
    problem = graphs.not_allowed(capture.graph, rubric)
    if problem is not None:
        fail(f"{describe(workload)}: {problem.message}", mistake=NOT_REPLAYABLE, diagnosis=NOT_REPLAYABLE)
    return capture


def trusted_graph(
    worker: Worker,
    built: ModuleInfo,
    workload: Workload,
    state: dict[str, torch.Tensor],
    device: str,
    key: tuple[Any, ...],
    replayer: Worker,
) -> Built:
    """A reference module built in the reference's timing worker, captured there (once per grading process:
    `key`) and replayed in `replayer` as the submission's is (`timing.replay_in`); a failure is the grader's."""
    try:
        return Built(replayer, *timing.replay_in(worker, built.handle, workload, state, device, key, replayer))
    except (WorkerError, ValueError) as exc:
        raise CannotTime(f"the reference's timing worker could not capture and replay its forward: {exc}") from None


def build_timed(
    timing_workers: dict[str, BackgroundWorker],
    workload: Workload,
    state: dict[str, torch.Tensor],
    wrapper_state: dict[str, torch.Tensor],
    capture: Captured,
    device: str,
) -> dict[str, Built]:
    """The three timed modules: the reference MultiHeadAttention's graph and the submission's (with the grader's
    weights), replayed side by side in the reference's timing worker, and the wrapper, the same weights, in its
    own. The wrapper is timed as it is, not as a graph: the score compares the submission's speedup over it with
    the reference's, in which it cancels; and capturing its many small calls (1,921 operations over 64 heads) would
    cost a grading seconds and its worker memory that a Gradescope container does not have."""
    w = workload
    reference, wrapper = timing_workers[REFERENCE].get(), timing_workers[WRAPPER].get()
    args = [w.d_in, w.d_out, w.tokens, 0.0, w.heads]
    module = trusted(reference, BuildRequest("MultiHeadAttention", args, {}, state, w.dtype, device))
    key = ("MultiHeadAttention", *args, *w.shape, w.dtype, device)
    built = {REFERENCE: trusted_graph(reference, module, w, state, device, key, reference)}
    wrapper_args = [w.d_in, w.d_out // w.heads, w.tokens, 0.0, w.heads]
    eager = trusted(
        wrapper, BuildRequest("MultiHeadAttentionWrapper", wrapper_args, {}, wrapper_state, w.dtype, device)
    )
    built[WRAPPER] = Built(wrapper, eager.handle, None)
    replayed = replay(reference, capture, replay_state(capture, state), device)
    built[SUBMISSION] = Built(reference, replayed.handle, capture.graph)
    return built


def timing_targets(
    built: dict[str, Built], workload: Workload, threads: int, ready_seconds: float
) -> list[timing.Target]:
    """The three timed graphs, each by its timed `forward_many` requests on the workload's inputs, through the
    same client code (`client.TimedCalls`) in the same kind of trusted worker: only what a failure means
    differs. After each of the submission's requests, the whole outputs of `SHOWN` of its calls, picked at
    random once the clock has stopped, are checked."""
    w = workload

    def calls_of(name: str, what: str) -> Callable[[int, float], timing.Calls]:
        flush_bytes = int(w.flush_mib * (1 << 20))
        one = built[name]
        return lambda calls, timeout: one.worker.timed_calls(
            ForwardManyRequest(one.handle, calls, list(w.shape), w.dtype, w.d_out, threads, flush_bytes),
            timeout,
            target=what,
            ready_seconds=ready_seconds,
        )

    def grader_fault(exc: WorkerError) -> NoReturn:
        raise CannotTime(f"the reference's timing worker failed (forward_many): {exc}") from None

    def graph_failed(exc: WorkerError) -> NoReturn:
        if isinstance(exc, WorkerTimeout):  # its deadline is set by the reference's time: too slow, not hung
            fail(f"{describe(w)}: the graph of your forward {exc}", mistake=NOT_ONE_PASS)
        detail = f"{exc.type}: {exc.message}" if isinstance(exc, SubmissionError) else str(exc)
        fail(f"{describe(w)}: the graph of your forward failed when it was timed: {detail}", diagnosis=NOT_REPLAYABLE)

    return [
        timing.Target(
            WRAPPER, built[WRAPPER].worker, calls_of(WRAPPER, "the reference wrapper"), w.wrapper_calls, grader_fault
        ),
        timing.Target(REFERENCE, built[REFERENCE].worker, calls_of(REFERENCE, "the reference"), w.calls, grader_fault),
        timing.Target(
            SUBMISSION,
            built[SUBMISSION].worker,
            calls_of(SUBMISSION, "your forward"),
            w.calls,
            graph_failed,
            shown=SHOWN,
        ),
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
                quiet=[submission.worker],
                hold_seconds=settings.hold_seconds - context.quiet.held,
            )
    except TimingLockError as exc:
        raise CannotTime(str(exc), cause=TIMING_LOCK) from None
    except timing.TimingFailed as exc:
        seconds = round(time.perf_counter() - started, 3)
        figures = speed_figures.failed(workload, str(exc), seconds)
        context.speed = speed_figures.add(context.speed, context.device, settings, workload, figures)
        too_slow = isinstance(exc, timing.TooSlow)
        fail(f"{describe(workload)}: {exc}" + (LOOP_HINT if too_slow else ""), mistake=NOT_ONE_PASS if too_slow else "")


def drop(*built: Built) -> None:
    """Kept reference workers serve later gradings: they forget what this one built."""
    for module in built:
        with contextlib.suppress(WorkerError):
            module.worker.request(DropRequest(module.handle))


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
    check_values_first(submission, module, mha, inputs, w, rubric, device)
    capture = captured_graph(submission, module, state, w, rubric, device)
    built = build_timed(timing_workers, w, state, wrapper_state, capture, device)  # only now: see above
    try:
        targets = timing_targets(built, w, settings.threads, settings.ready_seconds)
        verify = verifier(w, rubric, mha, device)
        measurement = measure_locked(context, submission, targets, verify, w, rubric, device, points, started)
    finally:
        drop(*built.values())
    said = speed_verdict(measurement, settings, points)
    operations = {name: dict(graphs.op_counts(one.graph)) for name, one in built.items() if one.graph is not None}
    seconds = round(time.perf_counter() - started, 3)
    figures = speed_figures.measured(measurement, w, settings, said, operations, seconds)
    context.speed = speed_figures.add(context.speed, context.device, settings, w, figures)
    flag_if_implausible(context, w, figures, settings)
    request.node.user_properties.append(("credit", said.credit))
    explain_verdict(w, figures, said, settings)
