"""The steps of a class run (`course/grade_class.py`), each on its own: the options object, the pre-checks,
the plan under the lock, the retry of what could not be timed, the outputs; and the reporter, which is
told of every event and is the only one that prints."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from autograder.course import grade_class
from autograder.course.grade_class import (
    CannotGrade,
    ClassOptions,
    ClassRun,
    OptionsError,
    Reporter,
    check_isolation,
    finish,
    plan_under_lock,
    prepare,
    retry_untimed,
)
from autograder.course.shard import Shard, ShardError
from autograder.grading.devices import CANNOT_TIME_NOW
from autograder.model import CANNOT_GRADE, TIMING_LOCK, GradingRun
from classkit import fill_record, make_course, synthetic_run
from helpers import FakeGrader

MERGE_REFUSED = "--merge grades nothing, so it takes neither --shard, --force nor --student"
# The reporter's events: every public method but `say`, which they all print through.
EVENTS = sorted(name for name, value in vars(Reporter).items() if callable(value) and name[0] != "_" and name != "say")


class Recorder(Reporter):
    """A reporter that keeps every event (name and arguments), and prints into a string, not the terminal."""

    def __init__(self) -> None:
        super().__init__(Console(file=io.StringIO(), width=200, highlight=False))
        self.events: list[tuple[Any, ...]] = []

    def names(self) -> list[str]:
        return [event[0] for event in self.events]

    def printed(self) -> str:
        file = self.console.file
        assert isinstance(file, io.StringIO)
        return " ".join(file.getvalue().split())


def _recording(name: str) -> Any:
    base = getattr(Reporter, name)

    def record(self: Recorder, *args: Any, **kwargs: Any) -> Any:
        self.events.append((name, *args))
        return base(self, *args, **kwargs)

    return record


for _name in EVENTS:
    if _name != "grading":
        setattr(Recorder, _name, _recording(_name))


def _grading(self: Recorder, total: int) -> Any:
    self.events.append(("grading", total))
    bar = Reporter.grading(self, total)

    class Told:
        def __enter__(self_) -> Any:
            done = bar.__enter__()

            def told(job: grade_class.Job, run: GradingRun) -> None:
                self.events.append(("graded", job.student, run.status))
                done(job, run)

            return told

        def __exit__(self_, *exc: Any) -> Any:
            return bar.__exit__(*exc)

    return Told()


Recorder.grading = _grading  # type: ignore[method-assign,assignment]


def course_of(tmp_path: Path, students: tuple[str, ...] = ("ann", "bob", "cat")) -> Path:
    return make_course(tmp_path / "course", {s: {"mha.py": "x = 1\n"} for s in students})


def everything_in(course: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.stat().st_mode, p.stat().st_mtime_ns) for p in [course, *course.rglob("*")])


# --- the options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("grading", [{"force": True}, {"shard": "1/3"}, {"students": ("ann",)}])
def test_the_options_refuse_merge_with_what_only_grading_takes(tmp_path, grading):
    with pytest.raises(OptionsError) as refused:
        ClassOptions(tmp_path, merge=True, **grading)
    assert str(refused.value) == MERGE_REFUSED
    ClassOptions(tmp_path, **grading)  # without --merge, each is fine


def test_the_options_refuse_fewer_than_one_job_but_a_merge_ignores_jobs(tmp_path):
    for jobs in (0, -2):
        with pytest.raises(OptionsError, match="^--jobs must be at least 1$"):
            ClassOptions(tmp_path, jobs=jobs)
    assert ClassOptions(tmp_path, jobs=0, merge=True).merge  # as the command line has always done
    assert ClassOptions(tmp_path, jobs=1).jobs == 1


def test_the_options_read_the_shard_once_and_refuse_one_that_does_not_exist(tmp_path):
    options = ClassOptions(tmp_path, shard="1/3")
    assert options.share == Shard(1, 3)
    assert ClassOptions(tmp_path).share is None
    with pytest.raises(ShardError, match="shard 5/2 does not exist"):
        ClassOptions(tmp_path, shard="5/2")


def test_the_options_are_frozen_and_keep_plain_values(tmp_path):
    options = ClassOptions(str(tmp_path), students=["ann", "bob"])  # type: ignore[arg-type]
    assert options.course == tmp_path and options.students == ("ann", "bob")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.force = True  # type: ignore[misc]
    assert options.rubric_path.name == "rubric.toml"
    assert options.outputs.canvas_assignment == "mha" and options.outputs.released is False


# --- step 1: the pre-checks ----------------------------------------------------------------------------


def test_prepare_refuses_an_unknown_student_and_changes_nothing(tmp_path):
    course = course_of(tmp_path)
    before = everything_in(course)
    with pytest.raises(CannotGrade, match=r"^no folder submitted/<student>/ for zed$"):
        prepare(ClassOptions(course, device="cpu", students=("ann", "zed")), Recorder())
    assert everything_in(course) == before


def test_prepare_refuses_a_rubric_it_cannot_read(tmp_path):
    with pytest.raises(CannotGrade, match="cannot read rubric"):
        prepare(ClassOptions(course_of(tmp_path), device="cpu", rubric=tmp_path / "none.toml"), Recorder())


def test_prepare_takes_the_shards_share_within_the_students_asked_for(tmp_path):
    course = course_of(tmp_path, ("ann", "bob", "cat", "dan"))
    report = Recorder()
    run = prepare(ClassOptions(course, device="cpu", shard="0/2"), report)
    assert run.students is not None and len(run.students) == 2
    assert report.events == [("shard_share", Shard(0, 2), 2, 4)]
    mine = run.students
    run = prepare(ClassOptions(course, device="cpu", shard="0/2", students=(mine[0], "dan")), Recorder())
    assert run.students == tuple(s for s in mine if s in (mine[0], "dan"))
    run = prepare(ClassOptions(course, device="cpu", jobs=3), Recorder())
    assert run.students is None and run.jobs == 3 and run.placement.device == "cpu"


# --- step 2: the isolation, asked only when someone is to be graded -------------------------------------


def test_check_isolation_asks_the_machine_only_when_someone_is_to_be_graded(tmp_path, monkeypatch):
    course = course_of(tmp_path, ("ann",))
    fill_record(course, {"ann": synthetic_run("mha.py")})
    asked: list[str] = []

    def refusal(isolation: str, rubric: Path) -> str:
        asked.append(isolation)
        return "no sandbox is available here"

    monkeypatch.setattr(grade_class, "isolation_refusal", refusal)
    check_isolation(prepare(ClassOptions(course, device="cpu", isolation="namespace"), Recorder()))
    assert asked == []  # everyone is up to date: nothing to refuse
    with pytest.raises(CannotGrade, match="^no sandbox is available here$"):
        check_isolation(prepare(ClassOptions(course, device="cpu", isolation="namespace", force=True), Recorder()))
    assert asked == ["namespace"]


def test_the_grader_closes_its_own_files_after_the_isolation_is_allowed_and_says_which(tmp_path, monkeypatch):
    """Where each worker runs as a fresh uid outside the sandbox, the grader's own files are closed once grading
    may start, never when it refuses, and the reporter says which were closed."""
    course = course_of(tmp_path, ("ann",))
    closing: list[str] = []
    monkeypatch.setattr(grade_class, "Grader", fake_grader())
    outputs_to(monkeypatch)
    monkeypatch.setattr(
        grade_class, "close_grader_files", lambda isolation, rubric: closing.append(isolation) or ["/x/reference"]
    )
    monkeypatch.setattr(grade_class, "isolation_refusal", lambda isolation, rubric: "no sandbox is available here")
    report = Recorder()
    assert grade_class.grade_class(ClassOptions(course, device="cpu", isolation="process"), report) == 2
    assert closing == [] and "closed_grader_files" not in report.names()
    monkeypatch.setattr(grade_class, "isolation_refusal", lambda isolation, rubric: "")
    assert grade_class.grade_class(ClassOptions(course, device="cpu", isolation="process"), report) == 0
    assert closing == ["process"] and ("closed_grader_files", ["/x/reference"]) in report.events
    assert (
        "closed the grader's own files to other users (chmod o-rwx), the virtualenv kept: /x/reference"
        in report.printed()
    )


# --- step 3: the plan, under the lock ------------------------------------------------------------------


def test_plan_under_lock_grades_who_changed_and_says_so(tmp_path):
    course = course_of(tmp_path)
    fill_record(course, {"ann": synthetic_run("mha.py")})
    report = Recorder()
    run = prepare(ClassOptions(course, device="cpu"), report)
    todo = plan_under_lock(run, report)
    assert sorted(job.student for job in todo) == ["bob", "cat"]
    assert report.names() == ["planned"] and report.events[0][1] == 3
    assert "3 submissions: 2 to grade, 1 already graded (2 not graded yet)" in report.printed()
    assert run.record.forced_runs() == []


def test_plan_under_lock_records_a_forced_run_before_anyone_is_graded(tmp_path):
    course = course_of(tmp_path)
    fill_record(course, {s: synthetic_run("mha.py") for s in ("ann", "bob", "cat")})
    run = prepare(ClassOptions(course, device="cpu", force=True, students=("ann", "bob")), Recorder())
    todo = plan_under_lock(run, Recorder())
    (forced,) = run.record.forced_runs()
    assert sorted(job.student for job in todo) == ["ann", "bob"]
    assert {job.inputs["forced"] for job in todo} == {forced.token}
    # the next run, not forced, finishes what that one started
    report = Recorder()
    again = plan_under_lock(prepare(ClassOptions(course, device="cpu"), Recorder()), report)
    assert sorted(job.student for job in again) == ["ann", "bob"]
    assert report.names() == ["unfinished_forced", "planned"] and report.events[0][1] == 2


def test_plan_under_lock_passes_on_the_rosters_notes_of_the_students_asked_for(tmp_path):
    course = make_course(
        tmp_path / "course", {"ann": {"mha.py": "x = 1\n", "mha.ipynb": "{}"}, "bob": {"mha.py": "x\n"}, "cat": {}}
    )
    report = Recorder()
    plan_under_lock(prepare(ClassOptions(course, device="cpu", students=("ann", "bob")), report), report)
    noted = [event[1].student for event in report.events if event[0] == "roster_note"]
    assert noted == ["ann"]  # cat has a note too (no submission), but was not asked for


# --- steps 4 and 5: grading, and the retry of what could not be timed -----------------------------------


def retry_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy: dict[str, bool]) -> tuple[bool, list, Recorder]:
    course = course_of(tmp_path, tuple(busy))
    runs = {
        s: dataclasses.replace(  # the cause the grading records (`workers.CannotTime.cause`)
            synthetic_run("mha.py", status=CANNOT_GRADE, reason=f"{CANNOT_TIME_NOW}: held 30 s"),
            cannot_grade_cause=TIMING_LOCK,
        )
        if held
        else synthetic_run("mha.py")
        for s, held in busy.items()
    }
    fill_record(course, runs)
    graded: list[tuple[list[str], int]] = []
    monkeypatch.setattr(
        grade_class,
        "grade_all",
        lambda todo, run, jobs, report, ahead=None: graded.append(([j.student for j in todo], jobs)) or True,
    )
    run = prepare(ClassOptions(course, device="cpu", force=True), Recorder())
    report = Recorder()
    finished = retry_untimed(run, plan_under_lock(run, Recorder()), report)
    return finished, graded, report


def test_retry_untimed_grades_again_one_at_a_time_only_who_could_not_be_timed(tmp_path, monkeypatch):
    finished, graded, report = retry_case(tmp_path, monkeypatch, {"ann": True, "bob": False, "cat": True})
    assert finished and graded == [(["ann", "cat"], 1)]
    assert report.events == [("retrying_untimed", 2)]


def test_retry_untimed_does_nothing_when_everyone_was_timed(tmp_path, monkeypatch):
    finished, graded, report = retry_case(tmp_path, monkeypatch, {"ann": False, "bob": False})
    assert finished and graded == [] and report.events == []


# --- step 6: the outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("shard", [None, "0/1"])
def test_finish_writes_the_class_outputs_but_in_a_shard(tmp_path, monkeypatch, shard):
    course = course_of(tmp_path, ("ann",))
    fill_record(course, {"ann": synthetic_run("mha.py")})
    written: list[list[str]] = []
    monkeypatch.setattr(
        grade_class,
        "write_class_outputs",
        lambda course, rows, *a, **k: written.append([r.entry.student for r in rows]),
    )
    run: ClassRun = prepare(ClassOptions(course, device="cpu", shard=shard), Recorder())
    assert finish(run, Recorder()) == []
    assert written == ([] if shard else [["ann"]])


# --- the reporter ---------------------------------------------------------------------------------------


def fake_grader(stopped: tuple[str, ...] = ()) -> type:
    """A grading process that writes a graded run, or is stopped (Ctrl-C) at any of `stopped`."""

    class Grader(FakeGrader):
        def run_for(self, request: dict) -> GradingRun:
            if request.id in stopped:
                raise KeyboardInterrupt
            return super().run_for(request)

    return Grader


def outputs_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class outputs (a gradebook, a report: seconds) replaced by a line printed where they print; the
    machine taken to allow grading."""

    def write(
        course: Path, rows: list, rubric: Any, options: Any, console: Console, written_ahead: frozenset = frozenset()
    ) -> dict[str, str]:
        console.print(f"grades.csv: {len(rows)} students")
        return {}

    monkeypatch.setattr(grade_class, "write_class_outputs", write)
    monkeypatch.setattr(grade_class, "isolation_refusal", lambda isolation, rubric: "")  # whatever the machine
    monkeypatch.setattr(grade_class, "close_grader_files", lambda isolation, rubric: [])


def test_the_reporter_is_told_each_event_of_a_class_run_and_nothing_else_prints(tmp_path, monkeypatch, capsys):
    course = course_of(tmp_path)
    course.chmod(0o755)
    monkeypatch.setattr(grade_class, "Grader", fake_grader())
    outputs_to(monkeypatch)
    report = Recorder()
    assert grade_class.grade_class(ClassOptions(course, device="cpu", jobs=1), report) == grade_class.EXIT_DONE
    assert report.names() == ["closed_to_others", "planned", "grading", "graded", "graded", "graded"]
    assert report.events[2] == ("grading", 3)
    assert sorted(event[1] for event in report.events[3:]) == ["ann", "bob", "cat"]
    assert capsys.readouterr().out == ""  # the outputs' tables went to the reporter's console too
    assert "3 submissions: 3 to grade" in report.printed() and "grades.csv: 3 students" in report.printed()


def test_the_reporter_is_told_of_an_interrupted_forced_run_and_what_is_left(tmp_path, monkeypatch):
    course = course_of(tmp_path)
    fill_record(course, {s: synthetic_run("mha.py") for s in ("ann", "bob", "cat")})
    monkeypatch.setattr(grade_class, "Grader", fake_grader(stopped=("bob", "cat")))
    outputs_to(monkeypatch)
    report = Recorder()
    options = ClassOptions(course, device="cpu", jobs=1, force=True)
    assert grade_class.grade_class(options, report) == grade_class.EXIT_INTERRUPTED
    assert report.events[-1] == ("interrupted", ["bob", "cat"])
    assert "the forced regrade is half done (2 students not regraded yet)" in report.printed()


def test_the_reporter_is_told_why_no_one_can_be_graded(tmp_path):
    report = Recorder()
    options = ClassOptions(course_of(tmp_path), device="cpu", students=("zed",))
    assert grade_class.grade_class(options, report) == grade_class.EXIT_CANNOT_GRADE
    assert report.events == [("cannot", "no folder submitted/<student>/ for zed")]
    assert report.printed() == "cannot grade: no folder submitted/<student>/ for zed"


def test_the_reporter_is_told_who_a_merge_misses(tmp_path):
    course = course_of(tmp_path, ("ann", "bob"))
    fill_record(course, {"ann": synthetic_run("mha.py")})
    report = Recorder()
    assert grade_class.merge_class(ClassOptions(course, merge=True), report) == grade_class.EXIT_MERGE_INCOMPLETE
    assert report.names() == ["merge_incomplete"] and set(report.events[0][1]) == {"bob"}
    assert report.printed().startswith("cannot merge: 1 of 2 students have no up-to-date results")
