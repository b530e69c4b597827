"""The speed part's figures are typed in the model (`model.SpeedFigures`) and written to results.json exactly
as the speed check's dicts were: the same keys in the same order; a record read back writes the same text.
They are made by `grading/speed_figures.py`, from a measurement and its verdict."""

import json

from autograder.contract import Workload
from autograder.model import (
    GRADED,
    Decision,
    GradingRun,
    RelativeSpread,
    SpeedBands,
    SpeedFigures,
    WorkloadFigures,
)

# extra_data.speed of a grading, as the speed check wrote it when its figures were dicts (one workload
# measured and stopped by a verdict, one whose timing failed), its numbers shortened.
WRITTEN = """{
  "device": "cpu",
  "threads": 1,
  "bands": {"full_credit_at": 0.75, "no_credit_at": 0.55, "give_up_below": 0.35},
  "workloads": {
    "64 heads": {
      "speedup": 7.02, "reference_speedup": 6.72, "relative": 1.03,
      "relative_spread": {"q1": 0.9, "q3": 1.05, "min": 0.34, "max": 1.11},
      "ms_per_call": {"wrapper": 6.86, "reference": 0.95, "submission": 0.97},
      "per_round_ms": {"charged": {"wrapper": [6.9, 6.8]}, "wall": {"wrapper": [23.4, 27.9]},
                       "cpu": {"wrapper": [6.9, 6.8]}, "waiting": {"wrapper": [19.4, 21.0]}},
      "rounds": 11, "timed_seconds": 3.272,
      "relative_interval": {"low": 0.74, "high": 1.07, "level": 0.9},
      "verdict": {"median": 1.03, "low": 0.74, "high": 1.07, "confidence": 0.9, "rounds": 11,
                  "stopped_because": "full", "close": false, "said": "full points"},
      "workload": {"device": "cpu", "name": "64 heads", "dtype": "float32", "batch": 2, "tokens": 16, "d_in": 256,
                   "d_out": 256, "heads": 64, "calls": 32, "wrapper_calls": 1, "flush_mib": 0.0},
      "credit": 1.0, "seconds": 5.1
    },
    "at max rounds": {
      "speedup": 2.0, "reference_speedup": 4.0, "relative": 0.5, "rounds": 200, "timed_seconds": 9.0,
      "workload": {"device": "cpu", "name": "at max rounds", "dtype": "float32", "batch": 2, "tokens": 16, "d_in": 256,
                   "d_out": 256, "heads": 64, "calls": 32, "wrapper_calls": 1, "flush_mib": 0.0},
      "credit": 0.0, "seconds": 9.5, "verdict": {"said": "none"}
    },
    "failed": {"workload": {"device": "cpu", "name": "failed", "dtype": "float32", "batch": 2, "tokens": 16, "d_in": 256,
                   "d_out": 256, "heads": 64, "calls": 32, "wrapper_calls": 1, "flush_mib": 0.0}, "failed": "too slow to time", "seconds": 2.0}
  },
  "speedup": 7.02,
  "reference_speedup": 6.72,
  "relative": 1.03
}"""


def test_a_written_record_reads_into_typed_figures_and_writes_back_the_same_text():
    data = json.loads(WRITTEN)
    speed = SpeedFigures.from_json(data)
    assert speed.bands == SpeedBands(0.75, 0.55, 0.35) and speed.relative == 1.03
    measured, at_max, failed = speed.workloads.values()
    assert measured.decision == Decision(1.03, 0.74, 1.07, 0.9, 11, "full", False)
    assert measured.interval == (0.74, 1.07, 0.9) and measured.said == "full points" and measured.kept == {}
    assert measured.relative_spread == RelativeSpread(0.9, 1.05, 0.34, 1.11)
    assert isinstance(measured.workload, Workload) and measured.workload.heads == 64
    assert at_max.decision is None and at_max.said == "none" and at_max.kept == {}
    assert failed.relative is None and failed.failed == "too slow to time"
    assert json.dumps(speed.to_json()) == json.dumps(data)  # every key, in its place
    run = GradingRun(GRADED, "mha.py", speed=speed)
    assert json.dumps(run.to_gradescope()["extra_data"]["speed"]) == json.dumps(data)
    assert GradingRun.from_gradescope(run.to_gradescope()) == run


def test_an_older_or_odd_record_still_reads():
    """A record without the bands' give-up rule, the verdict or the interval, with a figure of the wrong type
    (the file may be forged) and a key this grader does not write: it reads, a figure of the wrong type as
    absent (as the class report counted it: not timed), a key this grader does not write kept as read."""
    data = {
        "bands": {"full_credit_at": 0.8, "no_credit_at": 0.5},
        "workloads": {
            "w": {
                "speedup": 2.0,
                "relative": "fast",
                "rounds": 5,
                "relative_interval": {"low": 0.1},
                "relative_spread": {"q1": 0.9},
                "workload": {"name": "w"},
            },
            "x": ["not", "figures"],
        },
        "speedup": None,
        "reference_speedup": None,
        "relative": None,
        "note": "from an older grader",
    }
    speed = SpeedFigures.from_json(data)
    assert speed.bands == SpeedBands(0.8, 0.5) and speed.kept == {"note": "from an older grader"}
    w = speed.workloads["w"]
    assert (w.speedup, w.relative, w.rounds, w.interval) == (2.0, None, 5, None)
    # a spread or a workload that is not whole is not typed, but kept as read
    assert (w.relative_spread, w.workload) == (None, None)
    assert w.kept == {"relative_interval": {"low": 0.1}, "relative_spread": {"q1": 0.9}, "workload": {"name": "w"}}
    assert speed.workloads["x"] == WorkloadFigures()


def a_measurement(wrapper: float, reference: float, submission: float, rounds: int = 9):
    from autograder.grading import timing, workers

    seconds = {
        workers.WRAPPER: [wrapper] * rounds,
        workers.REFERENCE: [reference] * rounds,
        workers.SUBMISSION: [submission] * rounds,
    }
    return timing.Measurement(seconds, seconds, seconds, {k: [0.0] * rounds for k in seconds})


def test_the_figures_are_made_from_a_measurement_and_its_verdict():
    """`speed_figures.measured`: the summary, the verdict (in words, its credit and its decision) and the
    workload; `add`: the run's figures, whose headline figures are the geometric means of the measured ones."""
    import dataclasses

    import pytest

    from autograder.grading import speed_figures, timing, verdict
    from autograder.grading.workers import CannotTime
    from autograder.rubric import load_rubric

    rubric = load_rubric()
    settings = rubric.speed
    (workload,) = settings.workloads_for("cpu")
    measurement = a_measurement(6.4e-3, 0.64e-3, 1.28e-3)
    said = verdict.final(timing.relatives(measurement), settings, 10.0)
    measurement.verdict = said
    figures = speed_figures.measured(measurement, workload, settings, said, {"submission": {"mm": 3}}, 2.5)
    assert figures.relative == pytest.approx(0.5) and figures.workload == workload
    assert (
        figures.decision
        == said.decision()
        == Decision(said.median, said.low, said.high, said.confidence, said.rounds, said.stopped_because, said.close)
    )
    assert (figures.credit, figures.said) == (said.credit, verdict.describe(said, settings))
    assert (figures.operations, figures.seconds) == ({"submission": {"mm": 3}}, 2.5)

    other = dataclasses.replace(workload, name="other")
    speed = speed_figures.add(None, "cpu", settings, workload, figures)
    speed = speed_figures.add(speed, "cpu", settings, other, speed_figures.failed(other, "too slow", 1.0))
    assert speed.bands == SpeedBands(settings.full_credit_at, settings.no_credit_at, settings.give_up_below)
    assert list(speed.workloads) == [workload.name, "other"] and speed.workloads["other"].failed == "too slow"
    assert speed.relative == pytest.approx(0.5)  # the failed workload is not in the means
    twice = speed_figures.add(speed, "cpu", settings, other, dataclasses.replace(figures, relative=2.0))
    assert twice.relative == pytest.approx(1.0)  # sqrt(0.5 * 2)

    with pytest.raises(CannotTime, match="reference was only"):  # the run cannot tell parallel from sequential
        speed_figures.measured(a_measurement(1e-3, 1e-3, 1e-3), workload, settings, said)
