"""Points from the rubric: shares within a part, parametrised cases, visibility, a round total; the model's edge."""

import pytest
import torch

from autograder.contract import PART_IDS
from autograder.grading.scoring import Outcome, allocate_points, score
from autograder.model import GRADED, GradingRun
from autograder.rubric import load_rubric
from rubric_text import rubric_file


def test_default_rubric_totals_a_round_number_and_uses_known_parts():
    rubric = load_rubric()
    assert rubric.max_score == 100
    assert set(rubric.parts) <= set(PART_IDS)


def test_points_shared_by_weight_then_by_case(tmp_path):
    rubric = rubric_file(
        tmp_path,
        """
[parts.mha]
points = 30
[tests."mha::test_a"]
weight = 2
""",
    )
    outcomes = [
        Outcome("mha::test_a", "mha", "a", "passed"),
        Outcome("mha::test_a", "mha", "a", "failed"),
        Outcome("mha::test_b", "mha", "b", "passed"),
    ]
    assert allocate_points(outcomes, rubric) == pytest.approx([10, 10, 10])
    results = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric)).to_gradescope()
    assert results["score"] == 20 and results["max_score"] == 30
    assert [t["status"] for t in results["tests"]] == ["passed", "failed", "passed"]
    assert results["tests"][0]["tags"][0] == "mha"


def test_a_check_that_never_ran_counts_as_failed(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    results = GradingRun(
        GRADED, "mha.py", checks=score([Outcome("quiz::test_x", "quiz", "x", None)], rubric)
    ).to_gradescope()
    assert results["tests"][0]["status"] == "failed" and results["score"] == 0
    assert "not run" in results["tests"][0]["output"]


def test_summary_names_the_first_failure(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    outcomes = [
        Outcome("quiz::a", "quiz", "a", "passed"),
        Outcome("quiz::b", "quiz", "b", "failed", "wrong: B"),
        Outcome("quiz::c", "quiz", "c", "failed", "wrong: C"),
    ]
    (entry,) = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric)).parts()
    assert entry.passed == 1 and entry.total == 3
    assert entry.first_failure.message == "wrong: B"


def test_results_json_reads_back_into_the_same_model(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n[parts.mha]\npoints = 20\n")
    outcomes = [
        Outcome("mha::a", "mha", "a", "passed", evidence="worker"),
        Outcome("quiz::b", "quiz", "b", "failed", "B"),
    ]
    run = GradingRun(
        GRADED,
        "mha.py",
        device="cpu",
        isolation="namespace",
        seed=7,
        checks=score(outcomes, rubric),
        events=["a hang"],
        student_output="hello",
        titles={"quiz": "Questions"},
        speed={"speedup": 2.5},
        flags=["implausible"],
    )
    data = run.to_gradescope()
    again = GradingRun.from_gradescope(data)
    assert again == run
    assert [c.part for c in again.checks] == ["quiz", "mha"]  # part order, whatever order they ran in
    assert data["tests"][1]["tags"] == ["mha", "mha::a", "worker-reported"]
    assert data["leaderboard"][0]["value"] == 2.5


def test_a_run_that_could_not_grade_has_no_score():
    run = GradingRun("cannot_grade", "mha.py", reason="broken rubric")
    data = run.to_gradescope()
    assert data["score"] == 0 and data["max_score"] == 0 and data["tests"] == []
    assert "could not be graded: broken rubric" in data["output"]
    assert GradingRun.from_gradescope(data).status == "cannot_grade"


def test_a_checks_inputs_depend_only_on_the_run_seed_and_its_own_id():
    from autograder.grading.checks.harness import Inputs, check_seed

    first = Inputs(check_seed(123, "test_mha.py::test_gradients")).randn(3, 4)
    # whatever other checks ran before, in whatever order: the same id and run seed give the same inputs
    for other in ("test_quiz.py::test_answer[HEADS_RUN]", "test_combine.py::test_book_example"):
        Inputs(check_seed(123, other)).randn(100)
    assert torch.equal(Inputs(check_seed(123, "test_mha.py::test_gradients")).randn(3, 4), first)
    assert not torch.equal(Inputs(check_seed(124, "test_mha.py::test_gradients")).randn(3, 4), first)
    assert not torch.equal(Inputs(check_seed(123, "test_mha.py::test_dropout")).randn(3, 4), first)
