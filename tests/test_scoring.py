"""Points from the rubric: shares within a part, parametrised cases, visibility, a round total."""
import pytest

from autograder.rubric import PART_IDS, RubricError, load_rubric
from autograder.scoring import Outcome, allocate_points, build_results, part_summary


def rubric_file(tmp_path, text):
    path = tmp_path / "rubric.toml"
    path.write_text(text)
    return load_rubric(path)


def test_default_rubric_totals_a_round_number_and_uses_known_parts():
    rubric = load_rubric()
    assert rubric.max_score == 100
    assert set(rubric.parts) <= set(PART_IDS)


def test_points_shared_by_weight_then_by_case(tmp_path):
    rubric = rubric_file(tmp_path, """
[parts.mha]
points = 30
[tests."mha::test_a"]
weight = 2
""")
    outcomes = [Outcome("mha::test_a", "mha", "a", "passed"), Outcome("mha::test_a", "mha", "a", "failed"),
                Outcome("mha::test_b", "mha", "b", "passed")]
    assert allocate_points(outcomes, rubric) == pytest.approx([10, 10, 10])
    results = build_results(outcomes, rubric, {})
    assert results["score"] == 20 and results["max_score"] == 30
    assert [t["status"] for t in results["tests"]] == ["passed", "failed", "passed"]
    assert results["tests"][0]["tags"][0] == "mha"


def test_a_check_that_never_ran_counts_as_failed(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    results = build_results([Outcome("quiz::test_x", "quiz", "x", None)], rubric, {})
    assert results["tests"][0]["status"] == "failed" and results["score"] == 0
    assert "not run" in results["tests"][0]["output"]


def test_summary_names_the_first_failure(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    outcomes = [Outcome("quiz::a", "quiz", "a", "passed"), Outcome("quiz::b", "quiz", "b", "failed", "wrong: B"),
                Outcome("quiz::c", "quiz", "c", "failed", "wrong: C")]
    (entry,) = part_summary(build_results(outcomes, rubric, {}))
    assert entry["passed"] == 1 and entry["total"] == 3
    assert entry["first_failure"]["output"] == "wrong: B"


@pytest.mark.parametrize("text,message", [
    ("[parts.nonsense]\npoints = 3\n", "unknown part"),
    ("[parts.quiz]\npoints = -1\n", "points"),
    ("[parts.quiz]\npoints = 1\n[tests.\"quiz::a\"]\nvisibility = \"secret\"\n", "visibility"),
    ("[parts.quiz\n", "cannot read rubric"),
])
def test_malformed_rubrics_name_the_key_to_fix(tmp_path, text, message):
    with pytest.raises(RubricError, match=message):
        rubric_file(tmp_path, text)


def test_a_broken_installation_is_not_graded_as_zero(tmp_path, monkeypatch):
    """If the checks themselves cannot run, the grader says so and exits non-zero."""
    import json
    import shutil

    import autograder.grade as grade

    checks = tmp_path / "checks"
    shutil.copytree(grade.CHECKS_DIR, checks)
    (checks / "test_combine.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.setattr(grade, "CHECKS_DIR", checks)
    submission = tmp_path / "mha.py"
    submission.write_text("x = 1\n")
    out = tmp_path / "results.json"
    assert grade.grade_submission(submission, device="cpu", out=out, quiet=True) == grade.EXIT_CANNOT_GRADE
    assert "could not be graded" in json.loads(out.read_text())["output"]
