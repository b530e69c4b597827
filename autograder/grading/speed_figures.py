"""The speed part's figures, as results.json records them (`model.SpeedFigures`): one timed workload's, made
from its measurement and its verdict (`measured`) or from why its timing failed (`failed`), and the run's, each
workload's added as it is timed (`add`), with the headline figures (the geometric means over the workloads
measured) and the rubric's bands beside them.

The speed check (`checks/test_speed.py`) times and judges; what it found becomes figures here, and the tests
that need a grading's figures make them here too, the same way.
"""

from __future__ import annotations

from dataclasses import replace

from autograder.contract import Workload
from autograder.grading import timing, verdict
from autograder.grading.verdict import Verdict
from autograder.grading.workers import CannotTime
from autograder.model import SpeedBands, SpeedFigures, WorkloadFigures
from autograder.rubric import SpeedSettings


def describe(workload: Workload) -> str:
    """A workload in words, as the speed part's messages name it."""
    w = workload
    return (
        f"{w.name}: batch {w.batch}, {w.tokens} tokens, {w.d_in} -> {w.d_out} features, {w.heads} heads "
        f"of width {w.d_out // w.heads}, {w.dtype}"
    )


def measured(
    measurement: timing.Measurement,
    workload: Workload,
    settings: SpeedSettings,
    said: Verdict,
    operations: dict[str, dict[str, int]] | None = None,
    seconds: float | None = None,
) -> WorkloadFigures:
    """A timed workload's figures (`timing.summarize`) with the verdict `said` on them, once the run is known to
    tell a parallel forward from a sequential one (else CannotTime: the grader's fault, not the student's).
    `operations`: the timed graphs' operation counts; `seconds`: the whole check's time."""
    figures = timing.summarize(measurement)
    reference_speedup = figures.reference_speedup or 0.0  # summarize always sets it
    if reference_speedup < settings.min_reference_speedup:
        raise CannotTime(
            f"in this run the reference was only {reference_speedup:.2f} times faster than the wrapper "
            f"on {describe(workload)} (at least {settings.min_reference_speedup:g} is needed to tell a parallel forward "
            "from a sequential one): choose a workload in [speed] where the weight split matters on this machine"
        )
    return replace(
        figures,
        operations=operations,
        workload=workload,
        credit=said.credit,
        seconds=seconds,
        said=verdict.describe(said, settings),
    )


def failed(workload: Workload, why: str, seconds: float | None = None) -> WorkloadFigures:
    """The figures of a workload whose timing failed: why, and how long the check took."""
    return WorkloadFigures(workload=workload, failed=why, seconds=seconds)


def add(
    speed: SpeedFigures | None, device: str, settings: SpeedSettings, workload: Workload, figures: WorkloadFigures
) -> SpeedFigures:
    """The run's speed figures (`speed`, None before the first workload) with `workload`'s added; the headline
    figures are the geometric means over the workloads measured (one on the CPU); `bands` are the rubric's, for
    the feedback to explain."""
    speed = speed or SpeedFigures(
        device=device,
        threads=settings.threads,
        bands=SpeedBands(settings.full_credit_at, settings.no_credit_at, settings.give_up_below),
    )
    workloads = {**speed.workloads, workload.name: figures}
    timed = [f for f in workloads.values() if f.relative is not None]

    def mean(values: list[float | None]) -> float | None:
        return timing.geometric_mean(values) if timed else None

    return replace(
        speed,
        workloads=workloads,
        speedup=mean([f.speedup for f in timed]),
        reference_speedup=mean([f.reference_speedup for f in timed]),
        relative=mean([f.relative for f in timed]),
    )
