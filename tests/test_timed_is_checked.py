"""The code that is timed is the code that is checked: no signal a submission can read earns it speed points.

Each submission here is the reference's forward when it believes it is being checked and the forbidden (and
fast) scaled_dot_product_attention when it believes it is being timed, by one signal alone: autograd, train or
eval mode, the request on the stack, the pattern of frames, the caller's frame, the workload's shapes, the order
of calls, the time since the module's first forward, an active dispatch mode (`speed_variants.TELLS`); and the
third audit's loop over heads when checked. Before every timed call was itself a checked one, each earned full
speed points (relative speedups 0.97 to 1.16). Now every timed call's record of PyTorch calls must be the
record of the same forward when its values were checked on the same workload, and that record may not show a
forbidden API: each gets 0 and says why.

A submission that knows the grader's generator (graded with a known `--seed`) and predicts the timing seeds
from it, as they were once drawn, answers nothing from its table: the seeds come from the operating system.
"""

from __future__ import annotations

import pytest

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

CAUGHT = ("called different PyTorch functions when it was timed", "calls scaled_dot_product_attention")


@pytest.fixture(scope="module")
def pool():
    graders = GradingPool()
    yield graders
    graders.close()


def speed_check(results: dict) -> dict:
    (check,) = [t for t in results["tests"] if t["tags"][0] == "speed"]
    return check


@pytest.mark.parametrize("tell", list(TELLS))
def test_a_forward_that_tells_timed_from_checked_gets_no_speed_points(pool, tmp_path, tell):
    path = tmp_path / "mha.py"
    path.write_text(two_faced(tell))
    results, _ = pool.grade(path, tmp_path, parts=["speed"])
    assert results["extra_data"]["status"] == "graded"
    check = speed_check(results)
    assert check["score"] == 0 and check["status"] == "failed", check["output"]
    assert any(reason in check["output"] for reason in CAUGHT), check["output"]


def test_the_honest_forward_is_not_accused(pool, tmp_path):
    """The control: the same records check on the reference's own forward finds nothing to say."""
    path = tmp_path / "mha.py"
    path.write_text(definitions())
    results, _ = pool.grade(path, tmp_path, parts=["speed"])
    check = speed_check(results)
    assert check["score"] > 0, check["output"]
    assert not any(reason in check["output"] for reason in CAUGHT)


def test_a_loop_when_checked_and_ready_made_attention_when_timed(pool, tmp_path):
    """The third audit's submission, graded whole: its loop over heads costs it the structure check, and its
    timed forwards earn nothing."""
    path = tmp_path / "mha.py"
    path.write_text(LOOPS_WHEN_CHECKED)
    results, _ = pool.grade(path, tmp_path)
    check = speed_check(results)
    assert check["score"] == 0 and CAUGHT[0] in check["output"], check["output"]
    scores = part_scores(results)
    assert scores["mha"][0] < scores["mha"][1]  # the loop, when checked, is a loop
    assert scores["speed"][0] == 0


def test_a_submission_that_predicts_the_timing_seeds_predicts_nothing(tmp_path):
    run_seed = 4242
    path = tmp_path / "mha.py"
    path.write_text(predicts_seeds(run_seed))
    results, run = grade(path, tmp_path, "--seed", str(run_seed), "--part", "speed", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    check = speed_check(results)
    # the loop over heads it falls back to on every input it did not predict: far too slow for any points
    assert check["score"] == 0 and check["status"] == "failed", check["output"]


def test_whole_outputs_shown_after_the_timing_must_be_the_ones_timed(pool, tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(SHOWS_OTHER_OUTPUTS)
    results, _ = pool.grade(path, tmp_path, parts=["speed"])
    check = speed_check(results)
    assert check["score"] == 0 and "asked for once the timing had stopped" in check["output"], check["output"]


@pytest.mark.parametrize("seconds,said", [(0.5, "your forward took"), (5.0, "getting ready for its calls")])
def test_the_time_before_the_first_timed_call_is_timed_and_bounded(pool, tmp_path, seconds, said):
    """A worker that spends time between a timed request and its ready (to prepare, or to hold the device's
    timing lock) is charged for it; past the rubric's `ready_seconds` the request is stopped."""
    path = tmp_path / "mha.py"
    path.write_text(holds_before_ready(seconds))
    results, answer = pool.grade(path, tmp_path, parts=["speed"])
    check = speed_check(results)
    assert check["score"] == 0 and said in check["output"], check["output"]
    assert results["execution_time"] < 60
