"""The results plugin, run by pytest's own pytester on small check modules written here."""

import os
import sys

import pytest

from autograder.grading.plugin import ResultsPlugin
from autograder.model import FAILED, NOT_CHARGED, NOT_CREDITED, PASSED, TIMING_LOCK, WORKER
from rubric_text import rubric_file

pytest_plugins = ["pytester"]

CHECKS = '''
import pytest

@pytest.mark.part("quiz")
def test_passes():
    """a check that passes"""

@pytest.mark.part("quiz")
@pytest.mark.parametrize("n", [1, 2])
def test_fails_through_fail(n):
    """a check the student fails"""
    if n == 2:
        pytest.fail("wrong answer", pytrace=False)

@pytest.mark.part("mha")
@pytest.mark.evidence("worker")
def test_structure():
    """a check on what the worker reports"""

@pytest.mark.part("mha")
def test_property_of_a_wrong_answer():
    """a check that rests on another"""
    from autograder.grading.plugin import NotCredited
    raise NotCredited("not credited: the output is wrong")

@pytest.mark.part("mha")
def test_shared_problem():
    """a check that meets a problem many share"""
    from autograder.grading.plugin import NotCredited
    raise NotCredited("the whole story", cause="a problem many checks share")

@pytest.mark.part("mha")
def test_another_parts_problem():
    """a check that meets another part's problem"""
    from autograder.grading.plugin import NotCredited
    raise NotCredited("the whole story", cause="a constructor not kept", owner="fuse")

@pytest.mark.part("mha")
def test_not_charged():
    """a check that waits for another part"""
    from autograder.grading.plugin import NotCharged
    raise NotCharged("waiting: a stand-in gives values only")
'''


@pytest.fixture
def rubric(tmp_path):
    return rubric_file(
        tmp_path,
        "[parts.quiz]\npoints = 10\n[parts.mha]\npoints = 5\n"
        '[tests."quiz::test_passes"]\nvisibility = "after_due_date"\n',
    )


@pytest.fixture
def plain_rubric(tmp_path):
    return rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")


def run(pytester, rubric, source, visible_only=False):
    pytester.makepyfile(test_quiz=source)
    plugin = ResultsPlugin(rubric, visible_only)
    pytester.inline_run("-p", "no:cacheprovider", plugins=[plugin])
    return plugin


def test_outcomes_names_parts_and_evidence(pytester, rubric):
    plugin = run(pytester, rubric, CHECKS)
    outcomes = {(o.name, o.case): o for o in plugin.outcomes.values()}
    assert plugin.grader_errors == []
    assert outcomes["a check that passes", ""].status == PASSED
    assert outcomes["a check the student fails", "1"].status == PASSED
    failed = outcomes["a check the student fails", "2"]
    assert (
        failed.status == FAILED and failed.message == "wrong answer" and failed.key == "quiz::test_fails_through_fail"
    )
    assert outcomes["a check on what the worker reports", ""].evidence == WORKER
    assert outcomes["a check on what the worker reports", ""].part == "mha"
    # a check that rests on another is not credited, not failed; a shared problem fails, with its cause
    gated = outcomes["a check that rests on another", ""]
    assert gated.status == NOT_CREDITED and gated.message == "not credited: the output is wrong"
    shared = outcomes["a check that meets a problem many share", ""]
    assert shared.status == FAILED and shared.cause == "a problem many checks share"
    assert shared.owner == ""  # its own part's
    # another part's problem names that part (the scoring does not charge it here); a check that cannot be
    # judged for another part's mistake is not charged
    elsewhere = outcomes["a check that meets another part's problem", ""]
    assert (elsewhere.status, elsewhere.cause, elsewhere.owner) == (FAILED, "a constructor not kept", "fuse")
    waiting = outcomes["a check that waits for another part", ""]
    assert waiting.status == NOT_CHARGED and waiting.message == "waiting: a stand-in gives values only"


def test_visible_only_runs_only_visible_checks(pytester, rubric):
    plugin = run(pytester, rubric, CHECKS, visible_only=True)
    assert "a check that passes" not in {o.name for o in plugin.outcomes.values()}
    assert len(plugin.outcomes) == 7


@pytest.mark.parametrize(
    "body,says",
    [
        ("{}['float32']", "KeyError"),
        ("assert 1 == 2", "AssertionError"),
        ("raise RuntimeError('a bug in the grader')", "a bug in the grader"),
    ],
)
def test_any_exception_but_a_failure_is_the_graders(pytester, plain_rubric, body, says):
    source = f'''
import pytest

@pytest.mark.part("quiz")
def test_broken():
    """a check with a bug"""
    {body}
'''
    plugin = run(pytester, plain_rubric, source)
    assert len(plugin.grader_errors) == 1 and says in plugin.grader_errors[0]
    assert "test_broken" in plugin.grader_errors[0]


def test_a_fixture_error_is_the_graders(pytester, plain_rubric):
    source = '''
import pytest

@pytest.fixture
def broken():
    raise ValueError("setup went wrong")

@pytest.mark.part("quiz")
def test_uses_it(broken):
    """a check whose fixture breaks"""
'''
    plugin = run(pytester, plain_rubric, source)
    assert plugin.grader_errors and "setup went wrong" in plugin.grader_errors[0]


def test_a_check_without_a_part_or_a_misspelt_key_stops_the_run(pytester, tmp_path):
    rubric = rubric_file(tmp_path, '[parts.quiz]\npoints = 10\n[tests."quiz::test_pases"]\nweight = 2\n')
    plugin = run(pytester, rubric, CHECKS)
    assert any('did you mean "quiz::test_passes"' in e for e in plugin.grader_errors)
    assert plugin.outcomes == {} or all(o.status is None for o in plugin.outcomes.values())
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    plugin = run(pytester, rubric, CHECKS)  # test_structure's part "mha" is not in this rubric
    assert any("no @pytest.mark.part" in e for e in plugin.grader_errors)


def test_a_check_module_that_does_not_import_is_named(pytester, plain_rubric):
    plugin = run(pytester, plain_rubric, "import no_such_module_anywhere\n")
    assert plugin.grader_errors and "could not be collected" in plugin.grader_errors[0]


def test_a_pytest_timeout_is_the_graders(pytester, plain_rubric):
    source = '''
import time
import pytest

@pytest.mark.part("quiz")
@pytest.mark.timeout(1, method="signal")
def test_slow():
    """a check that hangs in the grader"""
    time.sleep(5)
'''
    pytester.makepyfile(test_quiz=source)
    plugin = ResultsPlugin(plain_rubric, False)
    pytester.inline_run("-p", "no:cacheprovider", plugins=[plugin])  # pytest-timeout: loaded as installed
    assert plugin.grader_errors and "Timeout" in plugin.grader_errors[0]


def test_pytest_timeouts_message_is_told_apart_by_its_exported_words():
    """pytest-timeout's failure is its exported message (`PYTEST_FAILURE_MESSAGE`) with the limit in it, whole;
    a check's own message that merely contains it, or another number, is not."""
    from pytest_timeout import PYTEST_FAILURE_MESSAGE

    from autograder.grading.plugin import stopped_by_pytest_timeout

    assert stopped_by_pytest_timeout(PYTEST_FAILURE_MESSAGE % 120) and stopped_by_pytest_timeout(
        PYTEST_FAILURE_MESSAGE % 1.5
    )
    for other in (
        "",
        PYTEST_FAILURE_MESSAGE % "",
        PYTEST_FAILURE_MESSAGE % "soon",
        "values differ: " + PYTEST_FAILURE_MESSAGE % 1,
    ):
        assert not stopped_by_pytest_timeout(other), other


def test_a_pytest_plugin_installed_beside_the_grader_never_joins_the_checks(tmp_path, monkeypatch):
    """The checks run with pytest's plugin autoload off (`--disable-plugin-autoload`, never a process-wide
    environment variable): a plugin that an installed package declares (entry point `pytest11`) does not
    load, while plain pytest, asked the same way, loads it."""
    from types import SimpleNamespace

    from autograder.grading import grade
    from autograder.rubric import load_rubric

    mark = tmp_path / "loaded"
    site = tmp_path / "site"
    (site / "intruder-1.0.dist-info").mkdir(parents=True)
    (site / "intruder-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: intruder\nVersion: 1.0\n")
    (site / "intruder-1.0.dist-info" / "entry_points.txt").write_text("[pytest11]\nintruder = intruder_plugin\n")
    (site / "intruder_plugin.py").write_text(f"open({str(mark)!r}, 'a').close()\n")  # noted when imported
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "intruder_plugin", raising=False)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(empty)])
    assert mark.exists()  # installed this way, a plugin loads into a plain pytest run
    mark.unlink()
    del sys.modules["intruder_plugin"]
    grade.run_checks(SimpleNamespace(notes=None), load_rubric(), visible_only=False, checks=("none::none",))
    assert not mark.exists()
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in os.environ


def test_a_submission_kept_waiting_by_others_timing_is_graded_again(pytester, plain_rubric):
    """A request that waited its grading's allowance for other gradings' timing (`devices.QuietLock`) is the
    grader's trouble with the cause `timing_lock`, which a class run grades again: never a failed check."""
    source = '''
import pytest
from autograder.grading.devices import TimingLockBusy

@pytest.mark.part("quiz")
def test_kept_waiting():
    """a check whose request waited too long for others' timing"""
    raise TimingLockBusy("cannot time now: the submission's code waited 30 s in all")
'''
    plugin = run(pytester, plain_rubric, source)
    assert len(plugin.grader_errors) == 1
    assert [error.cause for error in plugin.errors] == [TIMING_LOCK]
