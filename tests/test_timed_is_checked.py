"""What is timed is what was captured: no signal a submission can read earns it speed points.

Each submission here is the reference's forward when it believes it is being checked and the forbidden (and
fast) scaled_dot_product_attention when it believes it is being timed, by one signal alone: autograd, train or
eval mode, the request on the stack, the pattern of frames, the caller's frame, the workload's shapes, the order
of calls, the time since the module's first forward, an active dispatch mode (`speed_variants.TELLS`); and the
third audit's loop over heads when checked. Before every timed call was itself a checked one, each earned full
speed points (relative speedups 0.97 to 1.16). Now nothing the submission's worker runs is timed: its forward is
captured once as a graph of ATen operations, the grader refuses a graph with a ready-made attention, and a
trusted worker replays and times the graph it accepted. So each is either refused, saying why, or timed as the
honest forward it showed the capture: the graph that was timed (results.json's `operations`) never holds the
kernel.

A submission that knows the grader's generator (graded with a known `--seed`) and predicts the timing seeds
from it, as they were once drawn, answers nothing from its table: the seeds come from the operating system. And
patches to the submission's own request loop (the outputs it shows, a wait before it is ready) change nothing:
it is not what is timed.
"""

from __future__ import annotations

import pytest

from autograder.grading.graphs import ATTENTION_OPS
from helpers import GradingPool, grade, part_scores
from speed_variants import (
    LOOPS_WHEN_CHECKED,
    SHOWS_OTHER_OUTPUTS,
    TELLS,
    definitions,
    holds_before_ready,
    predicts_seeds,
    two_faced,
)

pytestmark = [pytest.mark.slow, pytest.mark.long]

KERNEL = [prefix for prefixes in ATTENTION_OPS.values() for prefix in prefixes]


@pytest.fixture(scope="module")
def pool():
    graders = GradingPool()
    yield graders
    graders.close()


def speed_check(results: dict) -> dict:
    (check,) = [t for t in results["tests"] if t["tags"][0] == "speed"]
    return check


def timed_operations(results: dict) -> dict[str, int] | None:
    """The operations of the submission's graph that was timed, as results.json records them (None: not timed)."""
    workloads = (results["extra_data"].get("speed") or {}).get("workloads") or {}
    figures = next(iter(workloads.values()), {})
    return (figures.get("operations") or {}).get("submission")


@pytest.mark.parametrize("tell", list(TELLS))
def test_a_forward_that_tells_timed_from_checked_gains_nothing(pool, tmp_path, tell):
    path = tmp_path / "mha.py"
    path.write_text(two_faced(tell))
    results, _ = pool.grade(path, tmp_path, parts=["speed"])
    assert results["extra_data"]["status"] == "graded"
    check = speed_check(results)
    operations = timed_operations(results)
    if check["status"] == "failed" and "scaled_dot_product_attention" in check["output"]:
        assert check["score"] == 0 and operations is None  # refused before anything was timed
    else:  # the capture saw the honest forward: that, and only that, was timed
        assert operations is not None and operations.get("bmm", 0) >= 2, (check["output"], operations)
        assert not [op for op in operations if any(op.startswith(k) or k in op for k in KERNEL)], operations


def test_the_honest_forward_is_not_accused(pool, tmp_path):
    """The control: the reference's own forward is captured, timed and earns the speed points."""
    path = tmp_path / "mha.py"
    path.write_text(definitions())
    results, _ = pool.grade(path, tmp_path, parts=["speed"])
    check = speed_check(results)
    assert check["score"] > 0, check["output"]
    figures = next(iter(results["extra_data"]["speed"]["workloads"].values()))
    assert figures["operations"]["submission"] == figures["operations"]["reference"]  # the same graph, timed


def test_a_loop_when_checked_and_ready_made_attention_when_timed(pool, tmp_path):
    """The third audit's submission, graded whole: captured without autograd, it shows the kernel, which the
    check of part mha refuses (and the speed part rests on)."""
    path = tmp_path / "mha.py"
    path.write_text(LOOPS_WHEN_CHECKED)
    results, _ = pool.grade(path, tmp_path)
    check = speed_check(results)
    assert check["score"] == 0, check["output"]
    scores = part_scores(results)
    assert scores["mha"][0] < scores["mha"][1]
    assert any("scaled_dot_product_attention" in t["output"] for t in results["tests"] if t["tags"][0] == "mha"), (
        results["tests"]
    )


def test_a_submission_that_predicts_the_timing_seeds_predicts_nothing(tmp_path):
    run_seed = 4242
    path = tmp_path / "mha.py"
    path.write_text(predicts_seeds(run_seed))
    results, run = grade(path, tmp_path, "--seed", str(run_seed), "--part", "speed", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    check = speed_check(results)
    # the loop over heads it falls back to on every input it did not predict: far too slow for any points
    assert check["score"] == 0 and check["status"] == "failed", check["output"]


@pytest.mark.parametrize(
    "source", [SHOWS_OTHER_OUTPUTS, holds_before_ready(5.0)], ids=["shows_other_outputs", "holds_before_ready"]
)
def test_patching_the_submissions_own_request_loop_changes_nothing_that_is_timed(pool, tmp_path, source):
    """These patches of the worker's timed request earned nothing once it was what was timed (caught); it is not
    timed any more, so they are the reference they otherwise are."""
    path = tmp_path / "mha.py"
    path.write_text(source)
    results, _ = pool.grade(path, tmp_path, parts=["speed"])
    check = speed_check(results)
    assert check["score"] > 0, check["output"]
    assert results["execution_time"] < 60
