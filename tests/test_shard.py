"""Shards of a class: which students each grades, how the index is read from Slurm and Kubernetes,
and the merge that writes the class's outputs from every shard's results without grading."""

import csv
import os

import pytest

import classkit
from autograder.course.shard import Shard, ShardError, engine_index_in, parse_shard
from autograder.course.store import Record
from autograder.model import CheckResult, GradingRun
from classkit import fill_record
from helpers import autograder

CLASS = ["ann", "bob", "cat", "dan", "eve", "fay", "gus"]


def test_k_of_n_counts_from_zero():
    assert parse_shard("0/4") == Shard(0, 4)
    assert parse_shard(" 3 / 4 ") == Shard(3, 4)
    assert str(parse_shard("2/5")) == "2/5"


@pytest.mark.parametrize(
    "text, message",
    [
        ("4/4", "numbered from 0 to 3"),
        ("-1/4", "numbered from 0 to 3"),
        ("1/0", "at least 1"),
        ("2", "write K/N"),
        ("a/4", "K in --shard 'a/4' must be a whole number"),
        ("1/four", "N in --shard '1/four' must be a whole number"),
    ],
)
def test_a_shard_that_does_not_exist_is_refused_with_the_reason(text, message):
    with pytest.raises(ShardError, match=message):
        parse_shard(text, environ={})


@pytest.mark.parametrize("size", [0, 1, 2, 5, 7, 40, 1000])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 16])
def test_shards_are_disjoint_cover_the_class_and_differ_by_at_most_one(size, count):
    students = [f"student{i:04d}" for i in range(size)]
    shares = [Shard(index, count).select(students) for index in range(count)]
    assert sorted(sum(shares, [])) == sorted(students)  # every student once: disjoint and covering
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


def test_the_split_depends_only_on_the_names():
    shuffled = ["gus", "ann", "fay", "cat", "eve", "bob", "dan"]
    assert Shard(1, 3).select(shuffled) == Shard(1, 3).select(CLASS) == ["bob", "eve"]
    assert Shard(1, 3).select(CLASS + ["bob"]) == ["bob", "eve"]  # a name listed twice is one student


@pytest.mark.parametrize(
    "array, tasks",
    [
        ({"SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "4"}, {0: 0, 1: 1, 3: 3}),
        ({"SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, {1: 0, 2: 1, 4: 3}),  # --array=1-4
        (
            {"SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_STEP": "5", "SLURM_ARRAY_TASK_COUNT": "3"},
            {10: 0, 15: 1, 20: 2},
        ),  # --array=10-20:5
    ],
)
def test_auto_reads_a_slurm_array_task(array, tasks):
    for task, index in tasks.items():
        assert parse_shard("auto", environ={**array, "SLURM_ARRAY_TASK_ID": str(task)}) == Shard(
            index, int(array["SLURM_ARRAY_TASK_COUNT"])
        )


def test_auto_refuses_what_it_cannot_trust():
    slurm = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "4"}
    assert parse_shard("auto/4", environ=slurm) == Shard(2, 4)
    with pytest.raises(ShardError, match="this Slurm array has 4 tasks"):
        parse_shard("auto/3", environ=slurm)
    with pytest.raises(ShardError, match="not on the array's grid"):
        parse_shard("auto", environ={**slurm, "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_STEP": "2"})
    with pytest.raises(ShardError, match="SLURM_ARRAY_TASK_COUNT is not set"):
        parse_shard("auto", environ={"SLURM_ARRAY_TASK_ID": "2"})
    with pytest.raises(ShardError, match="neither is set"):
        parse_shard("auto", environ={})


def test_auto_reads_a_kubernetes_indexed_job_given_its_completions():
    assert parse_shard("auto/5", environ={"JOB_COMPLETION_INDEX": "4"}) == Shard(4, 5)
    with pytest.raises(ShardError, match="write --shard auto/N"):
        parse_shard("auto", environ={"JOB_COMPLETION_INDEX": "4"})
    with pytest.raises(ShardError, match="numbered from 0 to 3"):
        parse_shard("auto/4", environ={"JOB_COMPLETION_INDEX": "4"})


def test_engine_index_in():
    assert engine_index_in({"JOB_COMPLETION_INDEX": "0"}) == "JOB_COMPLETION_INDEX"
    assert engine_index_in({"PATH": "/bin"}) is None


# --- the commands, on results written here (nothing is graded) -----------------------------------


def quiz_run(score: float) -> GradingRun:
    """A made-up graded run: one check, `score` of 100 points."""
    return GradingRun(
        status="graded",
        submission="mha.py",
        checks=[
            CheckResult(
                key="quiz::test_answer", part="quiz", name="the answers", status="passed", score=score, max_score=100
            )
        ],
    )


def make_course(tmp_path, students=CLASS, graded=CLASS):
    """A course whose `graded` students already have an up-to-date run recorded (student k scores k)."""
    course = classkit.make_course(tmp_path / "course", {student: {"mha.py": "x = 1\n"} for student in students})
    fill_record(course, {student: quiz_run(number) for number, student in enumerate(students) if student in graded})
    return course


def grades(course) -> list[list[str]]:
    return list(csv.reader((course / "grades.csv").read_text().splitlines()))


def test_merge_writes_the_class_outputs_from_every_results_file(tmp_path):
    course = make_course(tmp_path)
    run = autograder("grade-class", course, "--merge")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "merged the results of 7 students" in run.stdout
    rows = grades(course)
    assert rows[0][:4] == ["student", "score", "max_score", "quiz"]
    assert [(row[0], float(row[1])) for row in rows[1:]] == [(s, n) for n, s in enumerate(CLASS)]


def test_a_merge_with_students_missing_names_them_writes_nothing_and_fails(tmp_path):
    course = make_course(tmp_path, graded=["ann", "cat", "dan", "eve", "gus"])
    run = autograder("grade-class", course, "--merge")
    assert run.returncode == 1
    out = " ".join(run.stdout.split())
    assert "cannot merge: 2 of 7 students have no up-to-date results; nothing was written" in out
    assert "bob: not graded yet" in out and "fay: not graded yet" in out and "ann:" not in out
    assert not (course / "grades.csv").exists()


def test_a_merge_counts_a_run_of_an_older_submission_as_missing(tmp_path):
    course = make_course(tmp_path)
    (course / "submitted" / "cat" / "mha" / "mha.py").write_text("x = 2\n")  # cat resubmitted after being graded
    run = autograder("grade-class", course, "--merge")
    assert run.returncode == 1
    assert "cat: the submission changed" in " ".join(run.stdout.split())


def test_a_merge_keeps_a_run_that_could_not_grade_and_refuses_a_foreign_results_file(tmp_path):
    course = make_course(tmp_path)
    fill_record(
        course, {"bob": GradingRun(status="cannot_grade", submission="mha.py", reason="the checks could not run")}
    )
    run = autograder("grade-class", course, "--merge")
    assert run.returncode == 0, run.stdout + run.stderr  # as after a whole-class run: a row that says so
    bob = next(row for row in grades(course) if row[0] == "bob")
    assert bob[1] == "" and "cannot_grade" in bob and "the checks could not run" in bob[-1]

    Record(course).results_path("cat").write_text('{"score": 100, "tests": []}')
    run = autograder("grade-class", course, "--merge")
    assert run.returncode == 1
    assert "cat: its results.json is unreadable, or was not written by this grader" in " ".join(run.stdout.split())


def test_a_shard_handles_only_its_students_and_writes_no_class_output(tmp_path):
    course = make_course(tmp_path)
    run = autograder("grade-class", course, "--shard", "1/3", "--device", "cpu")
    assert run.returncode == 0, run.stdout + run.stderr
    out = " ".join(run.stdout.split())
    assert "shard 1/3: 2 of the class's 7 students" in out
    assert "2 submissions: 0 to grade, 2 already graded" in out
    assert "shard 1/3 done" in out
    assert not (course / "grades.csv").exists() and not (course / "autograded").exists()


def test_slurm_s_variables_choose_the_shard(tmp_path):
    course = make_course(tmp_path)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "3"}
    run = autograder("grade-class", course, "--shard", "auto", "--device", "cpu", env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "shard 2/3: 2 of the class's 7 students" in " ".join(run.stdout.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shard", "3/3"], "shard 3/3 does not exist"),
        (["--shard", "auto"], "--shard auto needs SLURM_ARRAY_TASK_ID"),
        (["--merge", "--shard", "0/2"], "--merge grades nothing"),
        (["--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_bad_shard_arguments_are_refused_before_anything_runs(tmp_path, args, message):
    course = make_course(tmp_path)
    env = {
        name: value for name, value in os.environ.items() if name not in ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")
    }
    run = autograder("grade-class", course, *args, env=env)
    assert run.returncode == 2
    assert message in run.stderr


def test_a_folder_that_is_not_a_course_is_refused(tmp_path):
    run = autograder("grade-class", tmp_path / "nowhere", "--merge")
    assert run.returncode == 2 and "has no submitted/ folder" in run.stderr
    assert not (tmp_path / "nowhere").exists()
