"""The rubric is validated in full when loaded: a broken rubric stops grading, it never scores a student."""

import json
import subprocess
import sys

import pytest

from autograder.rubric import DEFAULT_RUBRIC, RubricError, load_rubric
from helpers import REFERENCE
from rubric_text import rubric_file

PACKAGED = DEFAULT_RUBRIC.read_text()


def edited(tmp_path, old: str, new: str):
    assert old in PACKAGED, old
    path = tmp_path / "rubric.toml"
    path.write_text(PACKAGED.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    "text,message",
    [
        ("[parts.nonsense]\npoints = 3\n", "unknown part"),
        ("[parts.quiz]\npoints = -1\n", "points must be at least 0"),
        ('[parts.quiz]\npoints = "ten"\n', "points must be a number"),
        ("[parts.quiz]\npoints = true\n", "points must be a number"),
        ("[parts.quiz]\n", "needs points"),
        ('[parts.quiz]\npoints = 1\ncolour = "red"\n', "unknown key in [parts.quiz]: 'colour'"),
        ('[parts.quiz]\npoints = 1\n[tests."quiz::a"]\nvisibility = "secret"\n', "visibility"),
        ('[parts.quiz]\npoints = 1\n[tests."quiz::a"]\nweight = "two"\n', "weight must be a number"),
        ('[parts.quiz]\npoints = 1\n[tests."quiz::a"]\nwieght = 2\n', "unknown key"),
        ("[parts.quiz\n", "cannot read rubric"),
    ],
)
def test_malformed_rubrics_name_the_key_to_fix(tmp_path, text, message):
    with pytest.raises(RubricError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        rubric_file(tmp_path, text)
    assert str(tmp_path / "rubric.toml") in str(info.value)  # and the file


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("float32 = [1.3e-6, 1e-5]\n", "", "[tolerances] float32 must be [rtol, atol] (missing)"),
        ("[limits]", "[limitz]", "unknown key 'limitz'"),
        ("request_seconds = 10 ", "# request_seconds = 10 ", "[limits] request_seconds is missing"),
        ("crashes_before_giving_up = 2 ", "crashes_before_giving_up = 1.5 ", "must be an integer"),
        ("scaled_dot_product_attention = false", 'scaled_dot_product_attention = "no"', "true or false"),
    ],
)
def test_every_required_value_is_checked(tmp_path, old, new, message):
    with pytest.raises(RubricError) as info:
        load_rubric(edited(tmp_path, old, new))
    assert message in str(info.value)


def test_a_misspelt_limit_is_refused_by_name_and_every_limit_is_a_typed_field(tmp_path):
    """[limits] reads into `Limits`, one typed field per key: a misspelt key is refused with the allowed keys in
    the rubric's order, and each value has its field's type (a count is an int)."""
    import dataclasses

    from autograder.rubric import LIMITS, Limits

    with pytest.raises(RubricError) as info:
        load_rubric(edited(tmp_path, "request_seconds = 10 ", "request_secnds = 10 "))
    assert str(info.value) == (
        f"{tmp_path / 'rubric.toml'}: unknown key in [limits]: 'request_secnds' (allowed: {', '.join(LIMITS)})"
    )
    assert list(LIMITS)[:4] == ["load_seconds", "cell_seconds", "later_cell_seconds", "request_seconds"]
    limits = load_rubric().limits
    assert isinstance(limits, Limits) and [f.name for f in dataclasses.fields(limits)] == list(LIMITS)
    for name, (kind, meaning) in LIMITS.items():
        assert type(getattr(limits, name)) is kind and meaning, name
    assert LIMITS["processes"][0] is int and LIMITS["memory_gib"][0] is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.memory_gib = 1.0  # type: ignore[misc]


def test_a_misspelt_check_key_is_an_error_with_a_suggestion(tmp_path):
    rubric = load_rubric(
        edited(tmp_path, '[tests."mha::test_matches_reference"]', '[tests."mha::test_matches_referense"]')
    )
    with pytest.raises(RubricError, match='did you mean "mha::test_matches_reference"'):
        rubric.check_test_keys({"mha::test_matches_reference", "mha::test_gradients"})


@pytest.mark.slow
@pytest.mark.parametrize(
    "old,new,says",
    [
        ("float32 = [1.3e-6, 1e-5]\n", "", "float32"),  # once scored the reference 77.56 with exit 0
        ("[limits]", "[limitz]", "limitz"),  # once a traceback, exit 1, no results.json
        ("weight = 4\n", 'weight = "two"\n', "weight"),
        ('[tests."mha::test_matches_reference"]', '[tests."mha::test_matches_referense"]', "referense"),
    ],
)
def test_a_broken_rubric_cannot_grade_and_says_why(tmp_path, old, new, says):
    rubric = edited(tmp_path, old, new)
    out = tmp_path / "results.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            str(REFERENCE),
            "--rubric",
            str(rubric),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 2, run.stderr
    results = json.loads(out.read_text())
    assert results["score"] == 0 and results["max_score"] == 0 and results["tests"] == []
    assert results["extra_data"]["status"] == "cannot_grade"
    assert says in results["output"] and str(rubric) in results["output"]


def test_a_worker_made_without_a_rubric_is_held_to_the_packaged_rubrics_limits():
    """`WorkerConfig`'s defaults are the packaged rubric's `[limits]` as `worker_config` copies them (the device,
    isolation and hidden folders as given here), so that a worker made without a rubric (a tool's, a test's) is
    held to what a grading holds it to. Only the contract's names are not the rubric's."""
    from dataclasses import fields

    from autograder.grading.workers import worker_config
    from autograder.sandbox.settings import WorkerConfig

    graded, default = worker_config(load_rubric(), "cpu", [], "auto"), WorkerConfig()
    not_limits = {"contract"}  # the names a submission defines (contract.CONTRACT_NAMES), not a limit
    differ = {
        f.name: (getattr(default, f.name), getattr(graded, f.name))
        for f in fields(WorkerConfig)
        if f.name not in not_limits and getattr(default, f.name) != getattr(graded, f.name)
    }
    assert differ == {}, "WorkerConfig() differs from the packaged rubric (default, rubric's): " + repr(differ)
