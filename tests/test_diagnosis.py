"""Which failures say the same, and which runs are graded again, are decided from causes set where the
failure or the fault was raised (`harness.fail`'s diagnosis and mistake, `CannotTime.cause`), never from the
words of a message or a reason."""

import dataclasses

import pytest

from autograder.grading.checks.harness import (
    WRONG_SHAPE,
    WRONG_VALUES,
    Failure,
    assert_close,
    attempt,
    fail,
    mistake_of,
)
from autograder.grading.plugin import CheckFailed, SharedProblem
from autograder.grading.scoring import Outcome, score
from autograder.model import CANNOT_GRADE, FAILED, PASSED, TIMING_LOCK, GradingRun
from autograder.rubric import load_rubric
from rubric_text import rubric_file


def raised(function, *args, **kwargs) -> CheckFailed:
    with pytest.raises(CheckFailed) as info:
        function(*args, **kwargs)
    return info.value


def test_two_cases_with_one_cause_in_other_words_are_one_diagnosis(tmp_path):
    """The same mistake, named where each case failed, in messages that share no words: one group, said once
    with both cases; the same words with two different causes: two groups."""
    rubric = rubric_file(tmp_path, "[parts.fuse]\npoints = 10\n")
    loop = "the heads are computed one by one"
    outcomes = [
        Outcome("fuse::test_w", "fuse", "weights", FAILED, "twelve matmuls where one would do", case="a", mistake=loop),
        Outcome("fuse::test_w", "fuse", "weights", FAILED, "a Python for over self.heads", case="b", mistake=loop),
        Outcome("fuse::test_w", "fuse", "weights", PASSED, case="c"),
    ]
    (row,) = score(outcomes, rubric)
    assert row.message.splitlines() == ["failed in 2 of 3 cases: [a] and [b]", "twelve matmuls where one would do"]
    same_words = [
        Outcome("fuse::test_w", "fuse", "weights", FAILED, "wrong", case="a", diagnosis="the bias is dropped"),
        Outcome("fuse::test_w", "fuse", "weights", FAILED, "wrong", case="b", diagnosis="the heads are swapped"),
    ]
    (row,) = score(same_words, rubric)
    assert row.message.splitlines() == ["failed in all 2 cases", "[a]: wrong", "[b]: wrong"]


def test_checks_of_a_part_with_one_diagnosis_say_it_once_whatever_their_words(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.mha]\npoints = 20\n")
    outcomes = [
        Outcome("mha::test_a", "mha", "first", FAILED, "the output is off\nin detail", diagnosis=WRONG_VALUES),
        Outcome("mha::test_b", "mha", "second", FAILED, "nothing alike\nin detail", diagnosis=WRONG_VALUES),
        Outcome("mha::test_c", "mha", "third", FAILED, "the output is off\nin detail", diagnosis=WRONG_SHAPE),
    ]
    first, second, third = score(outcomes, rubric)
    assert first.message == "the output is off\nin detail"
    assert second.message == 'nothing alike (the same as under "mha: first")'
    assert third.message == "the output is off\nin detail"  # the same words, another diagnosis: said in full


def test_a_failure_carries_its_diagnosis_from_where_it_was_raised():
    """`fail` names the diagnosis given, else the mistake, else the one a `Failure` carries; a `Failure` carries
    both through `attempt` to the check that passes it on, and through `reworded` words; a shared cause and its
    owner travel the same way, and make the failure a `SharedProblem` wherever it is raised again."""
    assert raised(fail, "whatever is said", mistake="a named mistake").diagnosis == "a named mistake"
    assert raised(fail, "x", mistake="counted", diagnosis="what went wrong").diagnosis == "what went wrong"
    assert raised(fail, "said in its own way").diagnosis == ""  # names none: its own
    problem = Failure("relayed", mistake="m", diagnosis="d")
    failed = raised(fail, problem)
    assert (failed.mistake, failed.diagnosis) == ("m", "d")
    failed = raised(fail, problem.reworded(f"{problem} (and more)"))
    assert (failed.msg, failed.mistake, failed.diagnosis) == ("relayed (and more)", "m", "d")
    _, caught = attempt(fail, "inner words", diagnosis="the inner diagnosis")
    assert caught is not None and (caught.diagnosis, mistake_of(caught)) == ("the inner diagnosis", "")
    shared = Failure("cell 3 has a syntax error", mistake="syntax", cause="cell 3", owner="combine")
    _, caught = attempt(fail, shared)
    with pytest.raises(SharedProblem) as again:
        fail(caught.reworded(f"{caught}; and so on"))
    assert (again.value.cause, again.value.owner, again.value.mistake) == ("cell 3", "combine", "syntax")


def test_wrong_values_on_two_inputs_are_one_diagnosis_whatever_their_labels_and_numbers():
    torch = pytest.importorskip("torch")
    rubric = load_rubric()
    expected = torch.zeros(2, 3, dtype=torch.float64)
    one = raised(assert_close, expected + 1, expected, "float64", rubric, "output (3 heads)")
    two = raised(assert_close, expected - 7.5, expected, "float64", rubric, "output on 12 tokens")
    assert str(one.msg) != str(two.msg) and one.diagnosis == two.diagnosis == WRONG_VALUES
    shape = raised(assert_close, torch.zeros(3, 2, dtype=torch.float64), expected, "float64", rubric, "output")
    assert shape.diagnosis == WRONG_SHAPE
    hinted = raised(assert_close, expected + 1, expected, "float64", rubric, "output", lambda y: "a named hint")
    assert hinted.diagnosis == hinted.mistake == "a named hint"


def test_a_class_run_grades_again_by_the_runs_cause_not_its_reasons_words():
    """`could_not_time` reads the cause the grading recorded: a run whose reason is reworded is still graded
    again; a reason that only says "cannot time now" (a run that recorded no such cause) is not. The cause
    survives results.json, and a run without one writes no key for it."""
    from autograder.course.grade_class import could_not_time
    from autograder.grading.devices import CANNOT_TIME_NOW

    busy = GradingRun(CANNOT_GRADE, "mha.py", reason="the lock was held: in any words", cannot_grade_cause=TIMING_LOCK)
    assert could_not_time(busy) and could_not_time(GradingRun.from_gradescope(busy.to_gradescope()))
    words_only = GradingRun(CANNOT_GRADE, "mha.py", reason=f"{CANNOT_TIME_NOW}: but no cause was recorded")
    assert not could_not_time(words_only)
    assert "cannot_grade_cause" not in words_only.to_gradescope()["extra_data"]
    assert not could_not_time(dataclasses.replace(busy, status="graded"))


@pytest.mark.slow
def test_a_timing_lock_that_cannot_be_taken_is_a_cause_the_run_records(tmp_path, monkeypatch):
    """For real: the speed part's check meets a timing lock it cannot take (its folder is a file), and the run
    records the cause by name (cannot grade, retried), not only in its words."""
    from autograder.grading import devices
    from autograder.grading.grade import Options, grade_submission
    from helpers import REFERENCE

    not_a_folder = tmp_path / "locks"
    not_a_folder.write_text("")
    monkeypatch.setenv(devices.TIMING_LOCK_FOLDER_VARIABLE, str(not_a_folder))
    run = grade_submission(REFERENCE, Options(device="cpu", out=None, parts=("speed",)))
    assert run.status == CANNOT_GRADE and run.cannot_grade_cause == TIMING_LOCK, run.reason
