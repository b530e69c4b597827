"""The commands people type: grade, preview and grade-class, including how they fail."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import REFERENCE, ROOT, mutated_reference


def autograder(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "autograder", *map(str, args)], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_missing_file_cannot_be_graded_but_still_gets_results(tmp_path):
    run = autograder("grade", tmp_path / "nope.py", "--out", tmp_path / "results.json", cwd=tmp_path)
    assert run.returncode == 2
    assert "no such submission file" in run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and "could not be graded" in results["output"]


@pytest.mark.slow  # a whole grading run
def test_an_unreadable_notebook_is_graded_zero_with_the_reason(tmp_path):
    notebook = tmp_path / "mha.ipynb"
    notebook.write_text("{ this is not json")
    run = autograder("grade", notebook, "--out", tmp_path / "results.json", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and results["max_score"] == 100
    assert all("not a readable Jupyter notebook" in t["output"] for t in results["tests"] if t["tags"][0] != "speed")
    (speed,) = [t for t in results["tests"] if t["tags"][0] == "speed"]  # it rests on the values, and says so
    assert "not-scored" in speed["tags"] and "counts only once the values" in speed["output"]


@pytest.mark.slow  # a whole grading run
def test_preview_runs_only_visible_checks_and_names_the_mistake(tmp_path):
    wrong = mutated_reference(tmp_path, "dim1", "return torch.cat(outputs, dim=-1)", "return torch.cat(outputs, dim=1)")
    run = autograder("preview", wrong, cwd=tmp_path)
    assert run.returncode == 1, run.stderr  # a visible check failed
    assert "Visible checks" in run.stdout
    assert "concatenated along the token dimension" in " ".join(run.stdout.split())
    assert not list(tmp_path.glob("**/results.json"))  # preview writes no results
    assert "points" not in run.stdout  # nor scores


@pytest.mark.slow  # a whole grading run
@pytest.mark.smoke  # the one whole grading every supported Python runs (make test-pythons)
def test_grade_prints_a_summary_per_part(tmp_path):
    run = autograder("grade", REFERENCE, "--out", tmp_path / "r.json", cwd=tmp_path)
    assert run.returncode == 0
    for part in ("quiz", "combine", "wrapper", "two_dim", "columns", "mha", "fuse", "speed"):
        assert part in run.stdout
    assert "Total: 100 / 100" in run.stdout


@pytest.mark.slow  # a whole grading run
def test_grade_one_part_only(tmp_path):
    out = tmp_path / "r.json"
    run = autograder("grade", REFERENCE, "--part", "speed", "--out", out, "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    assert {t["tags"][0] for t in results["tests"]} == {"speed"}
    assert results["score"] == results["max_score"] == 10
    assert results["leaderboard"][0]["value"] == round(results["extra_data"]["speed"]["speedup"], 3) > 1
    wrong = autograder("grade", REFERENCE, "--part", "sped", "--out", out, "--quiet", cwd=tmp_path)
    assert wrong.returncode == 2 and "no such part: sped" in wrong.stderr


@pytest.mark.slow  # a whole grading run
def test_grade_class_grades_everyone_survives_crashes_and_resumes(tmp_path):
    course = tmp_path / "course"
    for student, source in {"ann": REFERENCE.read_text(), "bob": "import os\nos._exit(1)\n"}.items():
        folder = course / "submitted" / student / "mha"
        folder.mkdir(parents=True)
        (folder / "mha.py").write_text(source)
    (course / "submitted" / "cat" / "mha").mkdir(parents=True)  # submitted nothing

    first = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "cat: no mha.ipynb or mha.py" in " ".join(first.stdout.split())
    ann = json.loads((course / "autograded/ann/mha/results.json").read_text())
    bob = json.loads((course / "autograded/bob/mha/results.json").read_text())
    assert ann["score"] == 100 and bob["score"] == 0
    assert "exited with status 1" in bob["output"]
    rows = (course / "grades.csv").read_text().splitlines()
    assert rows[0].startswith("student,score,max_score,quiz") and len(rows) == 4  # cat too: no submission

    second = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "2 submissions: 0 to grade, 2 already graded" in second.stdout

    shutil.copy(REFERENCE, course / "submitted" / "bob" / "mha" / "mha.py")  # bob resubmits
    third = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "1 to grade" in third.stdout
    assert json.loads((course / "autograded/bob/mha/results.json").read_text())["score"] == 100


@pytest.mark.slow  # a whole grading run
def test_the_seed_is_recorded_and_a_run_can_be_reproduced(tmp_path):
    wrong = mutated_reference(
        tmp_path,
        "scale",
        "attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)\n"
        "        attn_weights = self.dropout(attn_weights)\n\n        # Back to",
        "attn_weights = torch.softmax(attn_scores / self.d_out ** 0.5, dim=-1)\n"
        "        attn_weights = self.dropout(attn_weights)\n\n        # Back to",
    )
    first = tmp_path / "first.json"
    autograder("grade", wrong, "--out", first, "--quiet", cwd=tmp_path)
    seed = json.loads(first.read_text())["extra_data"]["seed"]
    again = tmp_path / "again.json"
    autograder("grade", wrong, "--out", again, "--quiet", "--seed", seed, cwd=tmp_path)
    outputs = [[t["output"] for t in json.loads(p.read_text())["tests"]] for p in (first, again)]
    assert outputs[0] == outputs[1]  # the same hidden inputs, so the same largest differences
    assert any("largest difference" in text for text in outputs[0])


def test_a_broken_installation_is_not_graded_as_zero(tmp_path, monkeypatch):
    """If the checks themselves cannot run, the grader says so and exits non-zero."""
    import autograder.grading.grade as grade

    checks = tmp_path / "broken_checks"  # a package name of its own: pytest runs twice in this process
    shutil.copytree(grade.CHECKS_DIR, checks, ignore=shutil.ignore_patterns("__pycache__"))
    (checks / "test_combine.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.setattr(grade, "CHECKS_DIR", checks)
    submission = tmp_path / "mha.py"
    submission.write_text("x = 1\n")
    out = tmp_path / "results.json"
    assert grade.grade_command(submission, grade.Options(device="cpu", out=out, quiet=True)) == grade.EXIT_CANNOT_GRADE
    assert "could not be graded" in json.loads(out.read_text())["output"]


def test_a_fault_in_a_check_is_the_graders_not_the_students(tmp_path, monkeypatch):
    """A check that raises anything but its own failure (here a KeyError, as a rubric missing a tolerance
    once caused) makes the run ungradable: no score, exit 2, the fault named; never points lost."""
    import autograder.grading.grade as grade

    checks = tmp_path / "faulty_checks"  # a package name of its own: pytest runs twice in this process
    shutil.copytree(grade.CHECKS_DIR, checks, ignore=shutil.ignore_patterns("__pycache__"))
    (checks / "test_quiz.py").write_text(
        (checks / "test_quiz.py")
        .read_text()
        .replace('    """the answer is right"""\n', '    """the answer is right"""\n    {}["float32"]\n')
    )
    monkeypatch.setattr(grade, "CHECKS_DIR", checks)
    out = tmp_path / "results.json"
    code = grade.grade_command(REFERENCE, grade.Options(device="cpu", out=out, quiet=True))
    results = json.loads(out.read_text())
    assert code == grade.EXIT_CANNOT_GRADE
    assert results["score"] == 0 and results["max_score"] == 0 and results["tests"] == []
    assert "the grader itself failed (not your submission's fault)" in results["output"]
    assert "KeyError" in results["extra_data"]["grader_errors"][0]


def test_a_worker_that_cannot_import_torch_is_the_graders_fault_not_a_zero(tmp_path, monkeypatch):
    """The grader installed where its worker's Python has no torch (the worker fails before any of the
    submission's code runs): the reference is not graded 0 but cannot be graded, exit 2, saying why."""
    import os
    import tempfile

    import autograder.grading.grade as grade

    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment: the base interpreter has torch")
    out = tmp_path / "results.json"
    with tempfile.TemporaryDirectory(prefix="no-torch-") as folder:  # readable by the worker's fresh uid
        os.chmod(folder, 0o755)
        python = f"{folder}/python"
        os.symlink(os.path.realpath(sys._base_executable), python)  # the base interpreter: no torch installed
        monkeypatch.setattr(sys, "executable", python)  # what the launcher starts the worker with
        options = grade.Options(device="cpu", out=out, quiet=True, isolation="process")
        code = grade.grade_command(REFERENCE, options)
    results = json.loads(out.read_text())
    assert code == grade.EXIT_CANNOT_GRADE
    assert results["score"] == 0 and results["max_score"] == 0 and results["tests"] == []
    assert "the grader itself failed (not your submission's fault)" in results["output"]
    errors = "\n".join(results["extra_data"]["grader_errors"])
    assert "could not start Python and torch" in errors and "No module named 'torch'" in errors


def test_the_names_say_which_command_runs_the_students_code_unsandboxed(tmp_path):
    """`preview` (sandboxed) replaced the CLI's `check`, which read like the kit's unsandboxed `make check`:
    the old name says where each went, and the help texts say which runs the code unsandboxed."""
    old = autograder("check", tmp_path / "mha.py", cwd=tmp_path)
    assert old.returncode == 2 and "`check` is now `preview`" in old.stderr and "make selfcheck" in old.stderr
    helped = autograder("--help", cwd=tmp_path)
    assert "preview" in helped.stdout and "check " not in helped.stdout
    assert "sandboxed" in " ".join(autograder("preview", "--help", cwd=tmp_path).stdout.split())
    make = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "help"], capture_output=True, text=True)
    lines = {line.split()[1]: line for line in make.stdout.splitlines() if line.startswith("make ")}
    assert "UNSANDBOXED" in lines["selfcheck"] and "same as make selfcheck" in lines["check"]
    assert "SANDBOXED" in lines["preview"] and "UNSANDBOXED" not in lines["preview"]


# -- disputes: explain a failed hidden check from the recorded seed --------------------------------------------


@pytest.mark.slow
def test_explain_recomputes_a_failed_checks_inputs_and_values_from_the_seed(tmp_path):
    """A missing transpose, graded with a seed: `explain` regrades only the failed checks with it and shows each
    one's input, the reference's expected values and the submission's, and says the outcome was reproduced."""
    from helpers import grade, mutated_reference
    from reference import mha as ref

    path = mutated_reference(
        tmp_path,
        "transpose",
        "context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)",
        "context_vec = attn_weights @ values  # (b, H, T, hd)",
    )
    results, run = grade(path, tmp_path, "--seed", "12345", "--part", "mha")
    assert run.returncode == 0 and results["extra_data"]["seed"] == 12345
    out = tmp_path / "mha-results.json"
    case = "mha::test_matches_reference[float64-1 head]"
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "explain", str(out), "--submission", str(path)]
        + ["--check", "mha::test_book_example", "--check", case],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "seed 12345" in text and "again:   failed: output for the book's example" in text
    torch.manual_seed(123)
    expected = ref.MultiHeadAttention(3, 2, 6, 0.0, 2)(ref.batch)[0, 0]  # the book's first context vector
    assert f"[[{expected[0]:.4f}, {expected[1]:.4f}]," in text.replace("tensor(", "")
    assert "input to MultiHeadAttention.forward: (2, 5, 4) float64" in text  # the "1 head" case: batch 2, 5 tokens
    assert "largest difference" in text and "NOT what it was graded" not in text


def test_explain_says_why_the_speed_part_is_not_reproducible(tmp_path):
    from autograder.grading.explain import explain_speed
    from autograder.model import GRADED, GradingRun

    run = GradingRun(
        GRADED, "mha.py", seed=7, speed={"workloads": {"w": {"relative": 0.93, "rounds": 21, "credit": 1}}}
    )
    text = explain_speed(run, "mha.py")
    assert "not reproducible by seed" in text and "--part speed --seed 7" in text and "0.930" in text


def test_make_grade_one_takes_the_seed_to_repeat_a_run():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), "grade-one", "SEED=4242", f"VENV={sys.prefix}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--seed 4242" in done.stdout


def test_explain_finds_a_class_members_file_from_the_record(tmp_path):
    from autograder.grading.explain import submission_of

    record = tmp_path / "course" / "results" / "ada" / "mha" / "results.json"
    copy = tmp_path / "course" / "autograded" / "ada" / "mha" / "results.json"
    graded = tmp_path / "course" / "submitted" / "ada" / "mha" / "mha (1).ipynb"
    for path in (record, copy, graded):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    assert submission_of(record, "mha (1).ipynb") == graded.resolve()
    assert submission_of(copy, "mha (1).ipynb") == graded.resolve()
    assert submission_of(record, "mha.py") is None
