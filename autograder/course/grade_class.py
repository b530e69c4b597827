"""Grading a whole class: every assignments/submitted/<student>/mha/, a few at a time.

The steps:

1. read the roster (`roster.read_roster`): one entry per student folder, with the file to grade;
2. decide who needs grading (`store.Record.why_regrade`): a new or changed submission, rubric,
   grader, reference, torch or device (content hashes), or a last run that could not grade;
   `force` regrades everyone asked for, `students` limits grading to those students;
3. grade them, `jobs` at a time, in long-lived grading processes (`grading_pool.Grader`), each
   submission with its own fresh worker; a submission whose grading process hangs or dies gets a
   `cannot_grade` run and is graded again next time, and the others go on;
4. write every class output from the record (`class_outputs.write_class_outputs`).

A class can be split into shards graded on many machines that share the course folder (`--shard K/N`,
see `autograder.course.shard`): a shard grades and records only its own students and writes no class output.
`merge_class` (`--merge`) then writes the class's outputs from everyone's stored runs without grading,
and names whoever has no up-to-date run. With several CUDA devices, each grading process is pinned to
the least busy one (`autograder.course.placement`).

Each run's results.json is stored (atomically) as soon as it is graded, and its inputs right after,
so a class run killed at any moment loses nothing already graded: the next run grades the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autograder.contract import ASSIGNMENT
from autograder.course.class_outputs import OutputOptions, write_class_outputs
from autograder.course.clean import clean_for_output
from autograder.course.grading_pool import Grader
from autograder.course.placement import NoDevice, Placement, placement_for
from autograder.course.roster import Entry, RosterError, read_roster
from autograder.course.rows import Row, status_words
from autograder.course.shard import Shard, engine_index_in
from autograder.course.store import ClassInputs, Record, close_to_others
from autograder.grading.devices import CANNOT_TIME_NOW
from autograder.model import CANNOT_GRADE, GradingRun, points_text
from autograder.rubric import DEFAULT_RUBRIC, Rubric, RubricError, load_rubric

EXIT_DONE, EXIT_MERGE_INCOMPLETE, EXIT_CANNOT_GRADE, EXIT_INTERRUPTED = 0, 1, 2, 130
# What a merge compares with the stored inputs: shards may run other torch builds on other devices.
MERGE_INPUTS = ("submission", "file", "rubric", "grader", "reference")


@dataclass
class Job:
    entry: Entry
    inputs: dict[str, str]
    reason: str  # why it is graded

    @property
    def student(self) -> str:
        return self.entry.student

    @property
    def file(self) -> Path:
        """The file to grade: `plan` makes a job only for an entry that has one."""
        if self.entry.file is None:
            raise ValueError(f"no file to grade for {self.student}")
        return self.entry.file


def plan(
    roster: list[Entry],
    record: Record,
    class_inputs: ClassInputs,
    force: bool,
    students: list[str] | None,
    unfinished: dict[str, str] | None = None,
) -> list[Job]:
    """The students to grade now, each with the reason. `unfinished`: the students a forced regrade
    that was stopped has not regraded yet, with its token (they are forced still)."""
    unfinished = unfinished or {}
    jobs = []
    for entry in roster:
        if entry.file is None or (students is not None and entry.student not in students):
            continue
        inputs = class_inputs.for_file(entry.file)
        if force:
            reason: str | None = "forced"
        elif entry.student in unfinished:
            reason = "forced (the last forced run stopped before it)"
            inputs = {**inputs, "forced": unfinished[entry.student]}
        else:
            reason = record.why_regrade(entry.student, inputs)
        if reason is not None:
            jobs.append(Job(entry, inputs, reason))
    return jobs


def unfinished_forced(record: Record, roster: list[Entry]) -> dict[str, str]:
    """Every student a stopped forced regrade has not regraded yet, with that regrade's token."""
    submitted = {e.student for e in roster if e.has_file}
    return {s: run.token for run in record.forced_runs() for s in record.still_forced(run, submitted)}


def close_finished_forced(record: Record, roster: list[Entry]) -> list[str]:
    """Forget every forced regrade that is done; return the students still to be regraded by force."""
    submitted = {e.student for e in roster if e.has_file}
    left = []
    for run in record.forced_runs():
        still = record.still_forced(run, submitted)
        if still:
            left += still
        else:
            run.path.unlink(missing_ok=True)
    return sorted(set(left))


class Slots:
    """One long-lived grading process per pool thread, each pinned for its life to one device of the
    placement (the least busy visible GPU on CUDA; nothing on the CPU)."""

    def __init__(self, placement: Placement | None = None):
        self.placement = placement
        self.local = threading.local()
        self.graders: list[Grader] = []
        self.lock = threading.Lock()
        self.held = contextlib.ExitStack()

    def grader(self) -> Grader:
        if not hasattr(self.local, "grader"):
            with self.lock:
                env = self.held.enter_context(self.placement.slot()) if self.placement else None
                self.local.grader = Grader(env=env)
                self.graders.append(self.local.grader)
        grader: Grader = self.local.grader
        return grader

    def close(self) -> None:
        with self.lock:
            for grader in self.graders:
                grader.close()
            self.held.close()


def grade_job(
    slots: Slots, record: Record, job: Job, device: str, rubric: Path, timeout: float, isolation: str
) -> GradingRun:
    out = record.results_path(job.student)
    out.parent.mkdir(parents=True, exist_ok=True)
    request = {
        "id": job.student,
        "submission": str(job.file),
        "out": str(out),
        "device": device,
        "rubric": str(rubric),
        "isolation": isolation,
    }
    answer = slots.grader().grade(request, timeout)
    run = record.run(job.student) if answer.ok else None
    if run is None:
        run = GradingRun(
            status=CANNOT_GRADE,
            submission=job.file.name,
            reason=answer.problem or "no readable results.json was written",
        )
        record.save_run(job.student, run)
    record.save_inputs(job.student, job.inputs)  # after results.json: a kill in between only regrades
    return run


def could_not_time(run: GradingRun | None) -> bool:
    """Whether a run could not grade only because the device's timing lock was busy: worth retrying."""
    return run is not None and not run.graded and CANNOT_TIME_NOW in run.reason


WAITING_TO_TIME = "waiting to time (another grading holds the timing lock; timed again at the end)"


def progress_words(run: GradingRun) -> str:
    """How the progress line shows a student just graded: the score, "waiting to time" for a run that is
    retried once the timing lock is free (not a failure of anyone's), else "cannot grade"."""
    if run.graded:
        return f"{points_text(run.score)}/{points_text(run.max_score)}"
    return WAITING_TO_TIME if could_not_time(run) else status_words(CANNOT_GRADE)


def class_rows(roster: list[Entry], record: Record) -> list[Row]:
    """Every student of the roster with their stored run (None: no submission, or not graded yet):
    what the class outputs are written from, after grading or when merging runs graded elsewhere."""
    return [Row(entry, record.run(entry.student) if entry.has_file else None) for entry in roster]


def hold_course(course: Path, console: Console, shard: Shard | None = None) -> TextIO:
    """An exclusive lock on the course (on one shard of it), so two runs never grade the same students at
    once; the shards of a class, on one machine or on many sharing the folder, run side by side. It lives
    beside the record, not in it, so that copying a shard's record (a CI artifact) copies no lock."""
    lock_path = Path(course) / (f".grading-shard-{shard.index}-of-{shard.count}.lock" if shard else ".grading.lock")
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        console.print("another grading run holds this course; waiting for it to finish")
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def quantity(number: int, noun: str) -> str:
    """'1 submission', '3 submissions'."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def default_jobs() -> int:
    """Twice the CPUs, at least 2 and at most 8: a submission that hangs spends most of its time waiting
    for deadlines, and another can use the CPU meanwhile; each job holds a grader and a worker in memory."""
    return min(max(2, 2 * (os.cpu_count() or 1)), 8)


def isolation_refusal(isolation: str, rubric: Path) -> str:
    """Why no student could be graded here with `isolation` (no sandbox and no fresh uid; or a fresh uid
    outside the sandbox that could read the grader's own files: `exposure.problem`), and what would fix it;
    "" when grading can start. Said once, before anyone is graded, rather than once per student."""
    from autograder.sandbox import exposure, machine

    here = machine.survey()
    if isolation != "auto" or here.isolation is not None:
        return exposure.problem(isolation, rubric)
    return here.refusal + (f". What would fix it here: {here.advice}" if here.advice else "")


def grade_class(
    course: Path,
    device: str = "auto",
    rubric: Path | None = None,
    jobs: int | None = None,
    force: bool = False,
    students: list[str] | None = None,
    released: bool = False,
    db_url: str | None = None,
    isolation: str | None = None,
    shard: Shard | None = None,
    canvas_assignment: str = ASSIGNMENT,
) -> int:
    console = Console(highlight=False)
    course = Path(course)
    rubric_path = Path(rubric or DEFAULT_RUBRIC)
    try:
        loaded: Rubric = load_rubric(rubric_path)
        placement = placement_for(device)
    except (RubricError, NoDevice) as exc:
        console.print(f"cannot grade: {exc}", style="red", markup=False)
        return EXIT_CANNOT_GRADE
    isolation = isolation or os.environ.get("AUTOGRADER_ISOLATION", "auto")
    try:
        roster = read_roster(course)
    except RosterError as exc:
        console.print(f"cannot grade: {clean_for_output(exc, newlines=False)}", style="red", markup=False)
        return EXIT_CANNOT_GRADE
    known = {e.student for e in roster}
    if students is not None and set(students) - known:
        missing = ", ".join(sorted(set(students) - known))
        console.print(
            clean_for_output(f"cannot grade: no folder submitted/<student>/ for {missing}", newlines=False),
            style="red",
            markup=False,
        )
        return EXIT_CANNOT_GRADE
    if shard is not None:
        mine = shard.select([entry.student for entry in roster])  # split over every student folder
        console.print(f"shard {shard}: {len(mine)} of the class's {len(roster)} students", markup=False)
        students = [s for s in mine if students is None or s in students]
    elif engine_variable := engine_index_in():
        console.print(
            f"{engine_variable} is set, but without --shard this grades the whole class; "
            "--shard auto grades this task's share",
            style="yellow",
            markup=False,
        )
    jobs = jobs or max(default_jobs(), len(placement.devices))
    if placement.devices:
        console.print(
            f"{jobs} at a time on {len(placement.devices)} CUDA device(s): "
            f"{', '.join(placement.devices)}, each grading process on one",
            markup=False,
        )
    record = Record(course)
    # the device the runs are graded on (auto resolved), so that asking for it by another name regrades nobody
    inputs = ClassInputs.compute(rubric_path, placement.device)
    # Refused before anything in the course changes (its lock file, its mode), and only when there is someone
    # to grade (a re-run with nothing changed asks the machine nothing); the plan is made again under the lock.
    unfinished = {} if force else unfinished_forced(record, roster)
    todo = plan(roster, record, inputs, force, students, unfinished)
    refusal = isolation_refusal(isolation, rubric_path) if todo else ""
    if refusal:
        console.print(f"cannot grade: {refusal}", style="red", markup=False)
        return EXIT_CANNOT_GRADE
    if close_to_others(course):
        console.print(f"closed {course} to other users (chmod o-rwx): a worker may run as another uid", markup=False)
    lock = hold_course(course, console, shard)
    try:
        for entry in roster:
            if entry.note and (students is None or entry.student in students):
                console.print(
                    clean_for_output(f"{entry.shown}: {entry.note}", newlines=False), style="yellow", markup=False
                )
        unfinished = {} if force else unfinished_forced(record, roster)
        if unfinished:
            console.print(
                f"the last forced run stopped before it regraded {len(unfinished)} students: "
                "they are regraded now, forced",
                style="yellow",
                markup=False,
            )
        todo = plan(roster, record, inputs, force, students, unfinished)
        if force:  # recorded first: a forced run killed halfway is finished by the next run, forced or not
            forced = record.start_forced([j.student for j in todo])
            for job in todo:
                job.inputs["forced"] = forced.token
        submitted = [e for e in roster if e.has_file and (students is None or e.student in students)]
        reasons: dict[str, int] = {}
        for job in todo:
            reasons[job.reason] = reasons.get(job.reason, 0) + 1
        why = f" ({', '.join(f'{n} {r}' for r, n in reasons.items())})" if reasons else ""
        console.print(
            f"{quantity(len(submitted), 'submission')}: {len(todo)} to grade, {len(submitted) - len(todo)} already "
            f"graded{why}",
            markup=False,
        )
        interrupted = not grade_all(
            todo, record, placement, rubric_path, loaded.limits.class_seconds, jobs, isolation, console
        )
        untimed = [job for job in todo if not interrupted and could_not_time(record.run(job.student))]
        if untimed:  # the device's timing lock stayed busy (other gradings' timing): once more, one at a time
            console.print(
                f"{len(untimed)} could not be timed now (the device's timing lock was busy): "
                "grading them again, one at a time",
                markup=False,
            )
            interrupted = not grade_all(
                untimed, record, placement, rubric_path, loaded.limits.class_seconds, 1, isolation, console
            )
        left = close_finished_forced(record, roster)
        if shard is None:
            rows = class_rows(roster, record)
            options = OutputOptions(released=released, db_url=db_url, canvas_assignment=canvas_assignment)
            write_class_outputs(course, rows, loaded, options, console)
    finally:
        lock.close()
    if interrupted:
        console.print("interrupted: what was graded is kept; run again to grade the rest")
        if left:
            console.print(
                f"the forced regrade is half done ({len(left)} students not regraded yet): "
                "the next run regrades them, forced, with or without FORCE",
                style="yellow",
                markup=False,
            )
        return EXIT_INTERRUPTED
    if shard is not None:
        console.print(
            f"shard {shard} done; once every shard is, `grade-class {course} --merge` writes the class's outputs",
            markup=False,
        )
    return EXIT_DONE


def merge_class(
    course: Path,
    rubric: Path | None = None,
    released: bool = False,
    db_url: str | None = None,
    canvas_assignment: str = ASSIGNMENT,
) -> int:
    """Write the class's outputs from the runs already recorded (by shards or earlier runs), grading
    nothing. A run that could not grade counts as it does after a whole-class run. When a student with
    a submission has no run up to date with their submission, the rubric, the grader and the reference,
    say who and why, write nothing, and return EXIT_MERGE_INCOMPLETE: grade them (their shard again, or
    plain grade-class) and merge again. The torch build and device are not compared: shards may differ."""
    console = Console(highlight=False)
    course = Path(course)
    rubric_path = Path(rubric or DEFAULT_RUBRIC)
    try:
        loaded = load_rubric(rubric_path)
    except RubricError as exc:
        console.print(f"cannot merge: {exc}", style="red", markup=False)
        return EXIT_CANNOT_GRADE
    close_to_others(course)
    try:
        roster = read_roster(course)
    except RosterError as exc:
        console.print(f"cannot merge: {clean_for_output(exc, newlines=False)}", style="red", markup=False)
        return EXIT_CANNOT_GRADE
    record = Record(course)
    class_inputs = ClassInputs.compute(rubric_path, device="")
    missing: dict[str, str] = {}
    for entry in roster:
        if entry.file is None:
            continue
        wanted = {key: value for key, value in class_inputs.for_file(entry.file).items() if key in MERGE_INPUTS}
        why = record.why_stale(entry.student, wanted)  # a run that could not grade is merged as it is
        if why is not None:
            missing[entry.student] = why
    for student in unfinished_forced(record, roster):
        missing.setdefault(student, "a forced regrade stopped before it regraded this student")
    submitted = sum(entry.has_file for entry in roster)
    if missing:
        console.print(
            f"cannot merge: {len(missing)} of {submitted} students have no up-to-date results; nothing was written",
            style="red",
            markup=False,
        )
        shown = {entry.student: entry.shown for entry in roster}
        for student, why in sorted(missing.items()):
            console.print(clean_for_output(f"  {shown.get(student, student)}: {why}", newlines=False), markup=False)
        console.print(
            f"grade them (their shard again, or `grade-class {course}`, which grades only what is "
            "missing) and merge again",
            markup=False,
        )
        return EXIT_MERGE_INCOMPLETE
    console.print(f"merged the results of {submitted} students", markup=False)
    write_class_outputs(
        course,
        class_rows(roster, record),
        loaded,
        OutputOptions(released=released, db_url=db_url, canvas_assignment=canvas_assignment),
        console,
    )
    return EXIT_DONE


def grade_all(
    todo: list[Job],
    record: Record,
    placement: Placement,
    rubric: Path,
    timeout: float,
    jobs: int,
    isolation: str,
    console: Console,
) -> bool:
    """Grade every job; False when interrupted (Ctrl-C)."""
    if not todo:
        return True
    device = placement.device
    slots = Slots(placement)
    columns = (
        TextColumn("grading"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo))))
    futures = {}
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("", total=len(todo))
            futures = {
                pool.submit(grade_job, slots, record, job, device, rubric, timeout, isolation): job for job in todo
            }
            for future in as_completed(futures):
                run = future.result()
                progress.update(
                    task,
                    advance=1,
                    description=escape(clean_for_output(futures[future].entry.shown, newlines=False))
                    + ": "
                    + progress_words(run),
                )
        return True
    except KeyboardInterrupt:
        for future in futures:
            future.cancel()
        return False
    finally:
        slots.close()
        pool.shutdown(wait=True, cancel_futures=True)
