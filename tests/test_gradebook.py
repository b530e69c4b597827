"""nbgrader's gradebook, checked with nbgrader's own commands; and nbgrader's commands never destroy ours."""

from __future__ import annotations

import csv
import os
import shutil
import sys
from pathlib import Path

import pytest

from autograder.course.store import Record
from autograder.rubric import load_rubric
from classkit import ROOT, fill_record, make_course, nbgrader, synthetic_run
from helpers import autograder

ADA = ROOT / "assignments" / "submitted" / "ada" / "mha" / "mha.ipynb"  # a complete notebook


def course_with_record(tmp_path, scores: dict[str, dict[str, float]]):
    """A course whose record is up to date, so `grade-class` grades nothing and only writes outputs."""
    course = make_course(
        tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}, "bob": {"mha (1).ipynb": "{}"}, "cat": {}, "dan": None}
    )
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", course)
    fill_record(
        course,
        {"ann": synthetic_run("mha.py", scores.get("ann")), "bob": synthetic_run("mha (1).ipynb", scores.get("bob"))},
    )
    return course


def export_totals(path) -> dict[str, float]:
    return {row["student_id"]: float(row["score"]) for row in csv.DictReader(path.open())}


def our_totals(course) -> dict[str, float]:
    return {row["student"]: float(row["score"] or 0) for row in csv.DictReader((course / "grades.csv").open())}


def test_nbgrader_lists_every_student_and_exports_our_totals(tmp_path):
    course = course_with_record(tmp_path, {"bob": {"mha": 5.0, "quiz": 0.0}})
    run = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "0 to grade" in run.stdout, run.stdout + run.stderr
    listed = nbgrader("db", "student", "list", cwd=course)
    assert listed.returncode == 0, listed.stderr
    assert "There are 4 students in the database" in listed.stdout + listed.stderr
    exported = nbgrader("export", cwd=course)
    assert exported.returncode == 0, exported.stderr
    rubric = load_rubric()
    expected = {
        "ann": 100.0,
        "bob": 100 - rubric.part_points("mha") + 5 - rubric.part_points("quiz"),
        "cat": 0.0,
        "dan": 0.0,
    }
    assert export_totals(course / "nbgrader-grades.csv") == expected == our_totals(course)
    assert our_totals(course)["bob"] == expected["bob"]  # grades.csv is ours still, not nbgrader's


@pytest.mark.slow  # several runs of the command line
def test_any_sqlalchemy_url_from_the_course_configuration_or_the_command_line(tmp_path):
    course = course_with_record(tmp_path, {})
    other = tmp_path / "elsewhere.db"
    with (course / "nbgrader_config.py").open("a") as config:
        config.write(f'c.CourseDirectory.db_url = "sqlite:///{other}"\n')
    autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert other.is_file() and not (course / "gradebook.db").exists()
    assert "There are 4 students" in nbgrader("db", "student", "list", cwd=course).stdout
    third = tmp_path / "third.db"
    autograder("grade-class", course, "--device", "cpu", "--db", f"sqlite:///{third}", cwd=tmp_path)
    assert "There are 4 students" in nbgrader("db", "student", "list", f"--db=sqlite:///{third}", cwd=course).stdout


@pytest.mark.slow
@pytest.mark.long
def test_nbgraders_autograde_feedback_and_export_destroy_nothing_of_ours(tmp_path):
    """nbgrader autograde --force deletes autograded/<student>/mha/; generate_feedback --force deletes
    feedback/<student>/mha/; export writes a CSV; scores changed in the gradebook by someone else (the
    formgrader's API here) are overwritten. The record is untouched, and the next `grade-class` puts
    every output back, and the gradebook in agreement with it, without grading anything."""
    course = make_course(tmp_path / "course", {"ada": {}})
    shutil.copy(ADA, course / "submitted" / "ada" / "mha" / "mha.ipynb")
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "assignments" / "source", course / "source")
    # As in a real course: the release was generated here, so the gradebook knows the notebook's cells
    # (nbgrader's autograde drops the grade id of every cell it does not know, then refuses the notebook).
    generate = nbgrader("generate_assignment", "mha", "--force", cwd=course)
    assert generate.returncode == 0, generate.stderr[-3000:]
    fill_record(course, {"ada": synthetic_run("mha.ipynb", {"mha": 7.0})})  # ours: not the self-checks' 100
    first = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    record = Record(course)
    kept = {p: p.read_bytes() for p in (record.results_path("ada"), record.inputs_path("ada"), course / "grades.csv")}
    ours = 100 - load_rubric().part_points("mha") + 7

    autograde = nbgrader("autograde", "mha", "--force", cwd=course)
    assert autograde.returncode == 0, autograde.stderr[-3000:]
    assert "Removing existing assignment" in autograde.stderr
    assert not (course / "autograded/ada/mha/results.json").exists()  # nbgrader's doing
    feedback = nbgrader("generate_feedback", "mha", "--force", cwd=course)
    assert feedback.returncode == 0, feedback.stderr[-3000:]
    assert not (course / "feedback/ada/mha/feedback.html").exists()  # nbgrader's doing
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        gradebook.find_grade("mha", "mha", "mha", "ada").auto_score = 0.0  # someone else's score
        gradebook.db.commit()
    nbgrader("export", cwd=course)
    assert export_totals(course / "nbgrader-grades.csv") == {"ada": ours - 7}
    assert all(p.read_bytes() == data for p, data in kept.items())  # the record and grades.csv: untouched

    again = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "1 submission: 0 to grade, 1 already graded" in " ".join(again.stdout.split()), again.stdout
    assert (course / "autograded/ada/mha/results.json").read_bytes() == kept[record.results_path("ada")]
    assert (course / "feedback/ada/mha/feedback.html").is_file()
    assert (course / "feedback/ada/mha/mha.html").is_file()  # nbgrader's own page is left alone
    nbgrader("export", cwd=course)
    assert export_totals(course / "nbgrader-grades.csv") == {"ada": ours} == our_totals(course)


# -- timestamp.txt: the student's file, read bounded --------------------------------------------------


def test_a_hostile_timestamp_is_a_note_never_a_crash_of_grade_class_or_merge(tmp_path):
    """A time too large for a datetime, a link to /dev/zero, a FIFO, a long file and a folder, each as
    timestamp.txt: every student gets a row with a note, the run and the merge end normally, and the
    one readable timestamp is in the gradebook."""
    import os

    students = {s: {"mha.py": "x = 1\n"} for s in ("ann", "bob", "cat", "dan", "eve", "fay")}
    course = make_course(tmp_path / "course", students)
    folder = {s: course / "submitted" / s / "mha" for s in students}
    (folder["ann"] / "timestamp.txt").write_text("2024-03-01 10:00:00.000000 UTC\n")
    (folder["bob"] / "timestamp.txt").write_text("99999999999999999999")  # OverflowError in nbgrader
    (folder["cat"] / "timestamp.txt").symlink_to("/dev/zero")  # read whole, it eats memory
    os.mkfifo(folder["dan"] / "timestamp.txt")  # opened blocking, it hangs the run
    (folder["eve"] / "timestamp.txt").write_text("2024-03-01 10:00:00 UTC" + " " * 100)
    (folder["fay"] / "timestamp.txt").mkdir()
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", course)
    fill_record(course, {s: synthetic_run("mha.py") for s in students})
    for args in ((), ("--merge",)):
        run = autograder("grade-class", course, "--device", "cpu", *args, cwd=tmp_path, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
    notes = {row["student"]: row["note"] for row in csv.DictReader((course / "grades.csv").open())}
    assert notes["ann"] == ""
    assert "'99999999999999999999' is not a time" in notes["bob"]
    assert "timestamp.txt not read: it is a symbolic link" in notes["cat"]
    assert "not a regular file" in notes["dan"] and "not a regular file" in notes["fay"]
    assert "longer than 64 bytes" in notes["eve"]
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        stamps = {s: gradebook.find_submission("mha", s).timestamp for s in students}
    assert str(stamps["ann"]) == "2024-03-01 10:00:00"


# -- a course folder outside the repository -----------------------------------------------------------


def test_a_new_course_folder_gets_a_configuration_that_keeps_nbgrader_export_off_grades_csv(tmp_path):
    """A course folder with no nbgrader_config.py: grade-class writes one, so `nbgrader export` there writes
    nbgrader-grades.csv (its cells through our CSV cleaning) and never overwrites our grades.csv."""
    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}, "=cmd|calc": {"mha.py": "x = 2\n"}})
    fill_record(course, {"ann": synthetic_run("mha.py"), "=cmd|calc": synthetic_run("mha.py", {"quiz": 0.0})})
    run = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (course / "nbgrader_config.py").is_file() and "wrote" in " ".join(run.stdout.split())
    ours = (course / "grades.csv").read_bytes()
    exported = nbgrader("export", cwd=course)
    assert exported.returncode == 0, exported.stderr
    assert (course / "grades.csv").read_bytes() == ours
    rows = list(csv.DictReader((course / "nbgrader-grades.csv").open()))
    assert {r["student_id"] for r in rows} == {"ann", "'=cmd|calc"}  # a formula no more
    assert export_totals(course / "nbgrader-grades.csv")["ann"] == 100.0
    again = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "wrote" not in again.stdout  # written once; the instructor's edits are kept


def test_a_course_configuration_that_exports_over_grades_csv_is_named(tmp_path):
    from autograder.course.gradebook import ensure_configuration

    course = make_course(tmp_path / "course", {"ann": {}})
    (course / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'x'\n")
    assert "leaves `nbgrader export` writing grades.csv" in ensure_configuration(course)
    (course / "nbgrader_config.py").write_text("c = get_config()\nc.ExportPlugin.to = 'elsewhere.csv'\n")
    assert ensure_configuration(course) == ""


def test_our_own_configuration_is_read_without_loading_it_and_gives_what_loading_would(tmp_path):
    """grade-class reads back the nbgrader_config.py it wrote without importing nbgrader (a second or more on
    every run): what it assumes is what nbgrader's loader makes of the file; an edited file is loaded."""
    from traitlets.config.loader import PyFileConfigLoader

    from autograder.course import gradebook

    course = make_course(tmp_path / "course", {"ann": {}})
    assert "wrote" in gradebook.ensure_configuration(course)
    assert gradebook.ours_unchanged(course / "nbgrader_config.py")
    loaded = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    assumed = gradebook.course_settings(course)
    assert assumed == (loaded.CourseDirectory.db_url, "")
    assert gradebook.ensure_configuration(course) == ""
    edited = gradebook.CONFIG_TEMPLATE + "c.CourseDirectory.course_id = 'mha-2026'\n"
    (course / "nbgrader_config.py").write_text(edited)
    assert not gradebook.ours_unchanged(course / "nbgrader_config.py")
    assert gradebook.course_settings(course) == (assumed[0], "mha-2026")


def test_a_new_gradebook_is_the_one_nbgrader_makes_without_starting_alembic(tmp_path, monkeypatch):
    """nbgrader's `Gradebook` asks a separate `alembic heads` for the schema's version when it makes a database
    (three seconds of CPU); ours is read in this process. The two databases agree: the same version, the
    same tables and columns."""
    import nbgrader.api
    from sqlalchemy import create_engine, inspect, text

    from autograder.course.gradebook import opened

    theirs, ours = f"sqlite:///{tmp_path / 'theirs.db'}", f"sqlite:///{tmp_path / 'ours.db'}"
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    with nbgrader.api.Gradebook(theirs, "course"):  # nbgrader's own way: it starts `alembic heads`
        pass

    def refused() -> str:
        raise AssertionError("alembic was started")

    monkeypatch.setattr(nbgrader.api, "get_alembic_version", refused)
    with opened(ours, "course") as gradebook:
        gradebook.add_student("ann")

    def schema(url: str) -> tuple[str, dict[str, list[str]]]:
        engine = create_engine(url)
        with engine.connect() as connection:
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        found = inspect(engine)
        tables = {name: sorted(c["name"] for c in found.get_columns(name)) for name in found.get_table_names()}
        engine.dispose()
        return version, tables

    assert schema(ours) == schema(theirs)
    assert schema(ours)[0] and len(schema(ours)[1]) > 5
