"""Grading a whole class: every assignments/submitted/<student>/mha/, a few at a time.

`grade_class(ClassOptions(...))` runs these steps, each a function of its own (`Reporter` says what
happens, one method per event; the steps never print):

1. `prepare`, the pre-checks: the rubric, the device (`placement`), the roster (`roster.read_roster`: one
   entry per student folder, with the file to grade), the students asked for and the shard's share;
2. `check_isolation`: when there is someone to grade, refuse before anything in the course changes if no
   one could be graded here (no sandbox and no fresh uid, `isolation_refusal`); then, where each worker runs as
   a fresh uid outside the sandbox, close the grader's own files to it (`close_grader_files`) and the course;
3. `plan_under_lock`, the course held (`hold_course`): who needs grading (`store.Record.why_regrade`: a
   new or changed submission, rubric, grader, reference, torch or device (content hashes), or a last run
   that could not grade; `force` regrades everyone asked for, `students` limits grading to those);
4. `grade_all`: grade them, `jobs` at a time, in long-lived grading processes (`grading_pool.Grader`), each
   submission with its own fresh worker; a submission whose grading process hangs or dies gets a
   `cannot_grade` run and is graded again next time, and the others go on;
5. `retry_untimed`: whoever could not be timed because the device's timing lock stayed busy, once more,
   one at a time;
6. `finish`: write every class output from the record (`class_outputs.write_class_outputs`).

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
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autograder.contract import ASSIGNMENT
from autograder.course.class_outputs import OutputOptions, OutputsAhead, write_class_outputs
from autograder.course.clean import clean_for_output
from autograder.course.grading_pool import Grader, GradingJob
from autograder.course.placement import NoDevice, Placement, placement_for
from autograder.course.roster import Entry, RosterError, read_roster
from autograder.course.rows import Row, status_words
from autograder.course.shard import Shard, engine_index_in, parse_shard
from autograder.course.store import ClassInputs, Record, close_to_others
from autograder.model import CANNOT_GRADE, TIMING_LOCK, GradingRun, points_text
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
    students: Collection[str] | None,
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
    request = GradingJob(
        id=job.student, submission=job.file, out=out, device=device, rubric=rubric, isolation=isolation
    )
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
    """Whether a run could not grade only because the device's timing lock could not be taken now: worth
    retrying. Decided by the cause the grading recorded (`GradingRun.cannot_grade_cause`), not its words."""
    return run is not None and not run.graded and run.cannot_grade_cause == TIMING_LOCK


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


def hold_course(course: Path, report: Reporter, shard: Shard | None = None) -> TextIO:
    """An exclusive lock on the course (on one shard of it), so two runs never grade the same students at
    once; the shards of a class, on one machine or on many sharing the folder, run side by side. It lives
    beside the record, not in it, so that copying a shard's record (a CI artifact) copies no lock."""
    lock_path = Path(course) / (f".grading-shard-{shard.index}-of-{shard.count}.lock" if shard else ".grading.lock")
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        report.waiting_for_course()
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


def close_grader_files(isolation: str, rubric: Path) -> list[str]:
    """Where a worker asked for with `isolation` runs as a fresh uid outside the sandbox, the grader's own files
    it could read, closed to other users by the grader itself (`exposure.close_own`: only when the grader owns
    them all, on a writable file system; else `isolation_refusal` has refused). The paths closed."""
    from autograder.sandbox import exposure

    try:
        return exposure.close_own(isolation, rubric)
    except exposure.CannotClose as exc:
        raise CannotGrade(str(exc)) from None


class OptionsError(ValueError):
    """A combination of options a class run refuses (the command line shows it as a usage error)."""


@dataclass(frozen=True)
class ClassOptions:
    """Everything a class run (or a merge) is asked to do, checked once when made."""

    course: Path
    device: str = "auto"
    rubric: Path | None = None  # default: the packaged rubric
    jobs: int | None = None  # default: `default_jobs()`, and at least one per CUDA device
    force: bool = False
    students: tuple[str, ...] | None = None  # only these (the class outputs still cover everyone)
    released: bool = False
    db_url: str | None = None
    isolation: str | None = None  # default: $AUTOGRADER_ISOLATION, else auto
    shard: str | None = None  # "K/N", "auto" or "auto/N", as --shard takes it
    canvas_assignment: str = ASSIGNMENT
    merge: bool = False  # grade nothing: write the outputs from the record (`merge_class`)
    share: Shard | None = field(init=False, default=None)  # `shard` read (an "auto" from the environment)

    def __post_init__(self) -> None:
        object.__setattr__(self, "course", Path(self.course))
        if self.students is not None:
            object.__setattr__(self, "students", tuple(self.students))
        if self.merge:
            if self.shard or self.force or self.students:
                raise OptionsError("--merge grades nothing, so it takes neither --shard, --force nor --student")
            return
        if self.jobs is not None and self.jobs < 1:
            raise OptionsError("--jobs must be at least 1")
        if self.shard:
            object.__setattr__(self, "share", parse_shard(self.shard))  # a ShardError says what to write

    @property
    def rubric_path(self) -> Path:
        return Path(self.rubric or DEFAULT_RUBRIC)

    @property
    def outputs(self) -> OutputOptions:
        return OutputOptions(released=self.released, db_url=self.db_url, canvas_assignment=self.canvas_assignment)


class CannotGrade(Exception):
    """Why no one can be graded (or merged): said once, and the run ends before the course changes."""


class Reporter:
    """What a class run says, one method per event, on a terminal (rich). A front end or a test that wants
    the events, not the words, passes its own (a subclass)."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)

    def say(self, text: str, style: str | None = None) -> None:
        self.console.print(text, style=style, markup=False)

    def cannot(self, reason: str, verb: str = "grade") -> None:
        self.say(f"cannot {verb}: {reason}", style="red")

    def shard_share(self, shard: Shard, mine: int, everyone: int) -> None:
        self.say(f"shard {shard}: {mine} of the class's {everyone} students")

    def shard_variable_ignored(self, variable: str) -> None:
        self.say(
            f"{variable} is set, but without --shard this grades the whole class; --shard auto grades this task's share",
            style="yellow",
        )

    def devices(self, jobs: int, devices: list[str]) -> None:
        self.say(
            f"{jobs} at a time on {len(devices)} CUDA device(s): {', '.join(devices)}, each grading process on one"
        )

    def closed_grader_files(self, paths: list[str]) -> None:
        self.say(
            f"closed the grader's own files to other users (chmod o-rwx), the virtualenv kept: {', '.join(paths)}: "
            "each worker runs as a fresh uid outside the sandbox here"
        )

    def closed_to_others(self, course: Path) -> None:
        self.say(f"closed {course} to other users (chmod o-rwx): a worker may run as another uid")

    def waiting_for_course(self) -> None:
        self.say("another grading run holds this course; waiting for it to finish")

    def roster_note(self, entry: Entry) -> None:
        self.say(clean_for_output(f"{entry.shown}: {entry.note}", newlines=False), style="yellow")

    def unfinished_forced(self, count: int) -> None:
        self.say(
            f"the last forced run stopped before it regraded {count} students: they are regraded now, forced",
            style="yellow",
        )

    def planned(self, submitted: int, todo: list[Job]) -> None:
        reasons: dict[str, int] = {}
        for job in todo:
            reasons[job.reason] = reasons.get(job.reason, 0) + 1
        why = f" ({', '.join(f'{n} {r}' for r, n in reasons.items())})" if reasons else ""
        self.say(
            f"{quantity(submitted, 'submission')}: {len(todo)} to grade, {submitted - len(todo)} already graded{why}"
        )

    @contextlib.contextmanager
    def grading(self, total: int) -> Iterator[Callable[[Job, GradingRun], None]]:
        """A progress bar over `total` gradings; what it yields is told of each one done."""
        columns = (
            TextColumn("grading"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
        )
        with Progress(*columns, console=self.console) as progress:
            task = progress.add_task("", total=total)

            def done(job: Job, run: GradingRun) -> None:
                shown = escape(clean_for_output(job.entry.shown, newlines=False))
                progress.update(task, advance=1, description=shown + ": " + progress_words(run))

            yield done

    def retrying_untimed(self, count: int) -> None:
        self.say(
            f"{count} could not be timed now (the device's timing lock was busy): grading them again, one at a time"
        )

    def interrupted(self, left: list[str]) -> None:
        self.say("interrupted: what was graded is kept; run again to grade the rest")
        if left:
            self.say(
                f"the forced regrade is half done ({len(left)} students not regraded yet): "
                "the next run regrades them, forced, with or without FORCE",
                style="yellow",
            )

    def shard_done(self, shard: Shard, course: Path) -> None:
        self.say(f"shard {shard} done; once every shard is, `grade-class {course} --merge` writes the class's outputs")

    def merge_incomplete(self, missing: dict[str, str], submitted: int, roster: list[Entry], course: Path) -> None:
        self.say(
            f"cannot merge: {len(missing)} of {submitted} students have no up-to-date results; nothing was written",
            style="red",
        )
        shown = {entry.student: entry.shown for entry in roster}
        for student, why in sorted(missing.items()):
            self.say(clean_for_output(f"  {shown.get(student, student)}: {why}", newlines=False))
        self.say(
            f"grade them (their shard again, or `grade-class {course}`, which grades only what is "
            "missing) and merge again"
        )

    def merged(self, submitted: int) -> None:
        self.say(f"merged the results of {submitted} students")


@dataclass
class ClassRun:
    """A class run once its pre-checks passed: the options and what they were resolved to."""

    options: ClassOptions
    rubric: Rubric
    placement: Placement
    roster: list[Entry]
    students: tuple[str, ...] | None  # the students this run grades, if not all (a shard, --student)
    jobs: int
    isolation: str
    record: Record
    inputs: ClassInputs  # computed on the device the runs are graded on (auto resolved)

    def chosen(self, student: str) -> bool:
        return self.students is None or student in self.students


def prepare(options: ClassOptions, report: Reporter) -> ClassRun:
    """Step 1, the pre-checks: the rubric, the device, the roster and the students asked for; the shard's
    share. Raises CannotGrade, having changed nothing."""
    try:
        rubric = load_rubric(options.rubric_path)
        placement = placement_for(options.device)
    except (RubricError, NoDevice) as exc:
        raise CannotGrade(str(exc)) from exc
    isolation = options.isolation or os.environ.get("AUTOGRADER_ISOLATION", "auto")
    try:
        roster = read_roster(options.course)
    except RosterError as exc:
        raise CannotGrade(clean_for_output(exc, newlines=False)) from exc
    known = {e.student for e in roster}
    students = options.students
    if students is not None and set(students) - known:
        missing = ", ".join(sorted(set(students) - known))
        raise CannotGrade(clean_for_output(f"no folder submitted/<student>/ for {missing}", newlines=False))
    if options.share is not None:
        mine = options.share.select([entry.student for entry in roster])  # split over every student folder
        report.shard_share(options.share, len(mine), len(roster))
        students = tuple(s for s in mine if students is None or s in students)
    elif engine_variable := engine_index_in():
        report.shard_variable_ignored(engine_variable)
    jobs = options.jobs or max(default_jobs(), len(placement.devices))
    if placement.devices:
        report.devices(jobs, placement.devices)
    # the device the runs are graded on (auto resolved), so that asking for it by another name regrades nobody
    inputs = ClassInputs.compute(options.rubric_path, placement.device)
    return ClassRun(options, rubric, placement, roster, students, jobs, isolation, Record(options.course), inputs)


def check_isolation(run: ClassRun) -> list[str]:
    """Step 2: refuse (CannotGrade) before anything in the course changes (its lock file, its mode) when no
    one could be graded here with the isolation asked for; asked only when there is someone to grade (a re-run
    with nothing changed asks the machine nothing). Then the grader's own files that a worker could read, closed
    (`close_grader_files`): the paths closed. The plan is made again under the lock."""
    if not plan_jobs(run, plan_unfinished(run)):
        return []
    refusal = isolation_refusal(run.isolation, run.options.rubric_path)
    if refusal:
        raise CannotGrade(refusal)
    return close_grader_files(run.isolation, run.options.rubric_path)


def plan_unfinished(run: ClassRun) -> dict[str, str]:
    return {} if run.options.force else unfinished_forced(run.record, run.roster)


def plan_jobs(run: ClassRun, unfinished: dict[str, str]) -> list[Job]:
    return plan(run.roster, run.record, run.inputs, run.options.force, run.students, unfinished)


def plan_under_lock(run: ClassRun, report: Reporter) -> list[Job]:
    """Step 3, the course held: the roster's notes, the students to grade and why; a forced run is recorded
    before anyone is graded, so a forced run killed halfway is finished by the next run, forced or not."""
    for entry in run.roster:
        if entry.note and run.chosen(entry.student):
            report.roster_note(entry)
    unfinished = plan_unfinished(run)
    if unfinished:
        report.unfinished_forced(len(unfinished))
    todo = plan_jobs(run, unfinished)
    if run.options.force:
        forced = run.record.start_forced([j.student for j in todo])
        for job in todo:
            job.inputs["forced"] = forced.token
    report.planned(sum(e.has_file and run.chosen(e.student) for e in run.roster), todo)
    return todo


def retry_untimed(run: ClassRun, todo: list[Job], report: Reporter, ahead: OutputsAhead | None = None) -> bool:
    """Step 5: whoever could not be timed because the device's timing lock stayed busy (other gradings'
    timing) is graded once more, one at a time. False when interrupted."""
    untimed = [job for job in todo if could_not_time(run.record.run(job.student))]
    if not untimed:
        return True
    report.retrying_untimed(len(untimed))
    return grade_all(untimed, run, 1, report, ahead)


def finish(run: ClassRun, report: Reporter, written_ahead: frozenset[str] = frozenset()) -> list[str]:
    """Step 6: forget the forced regrades that are done, and (but in a shard) write every class output from
    the record (`written_ahead`: the feedback pages written while grading). The students a forced regrade has
    still to regrade."""
    left = close_finished_forced(run.record, run.roster)
    if run.options.share is None:
        rows = class_rows(run.roster, run.record)
        write_class_outputs(
            run.options.course, rows, run.rubric, run.options.outputs, report.console, written_ahead=written_ahead
        )
    return left


def grade_class(options: ClassOptions, report: Reporter | None = None) -> int:
    """Grade the class as `options` say (see the module's docstring); the exit status."""
    report = report or Reporter()
    try:
        run = prepare(options, report)
        closed = check_isolation(run)
    except CannotGrade as exc:
        report.cannot(str(exc))
        return EXIT_CANNOT_GRADE
    if closed:
        report.closed_grader_files(closed)
    if close_to_others(options.course):
        report.closed_to_others(options.course)
    lock = hold_course(options.course, report, options.share)
    try:
        todo = plan_under_lock(run, report)
        ahead = OutputsAhead(options.course, run.record, options.outputs) if todo and options.share is None else None
        try:
            finished = grade_all(todo, run, run.jobs, report, ahead) and retry_untimed(run, todo, report, ahead)
        finally:
            if ahead is not None:
                ahead.close()
        left = finish(run, report, frozenset(ahead.written) if ahead is not None else frozenset())
    finally:
        lock.close()
    if not finished:
        report.interrupted(left)
        return EXIT_INTERRUPTED
    if options.share is not None:
        report.shard_done(options.share, options.course)
    return EXIT_DONE


def stale_runs(options: ClassOptions, roster: list[Entry], record: Record) -> dict[str, str]:
    """Every student with a submission and no run up to date with it, the rubric, the grader and the
    reference (a run that could not grade is merged as it is), or one a stopped forced regrade has not
    reached; with why."""
    class_inputs = ClassInputs.compute(options.rubric_path, device="")
    missing: dict[str, str] = {}
    for entry in roster:
        if entry.file is None:
            continue
        wanted = {key: value for key, value in class_inputs.for_file(entry.file).items() if key in MERGE_INPUTS}
        why = record.why_stale(entry.student, wanted)
        if why is not None:
            missing[entry.student] = why
    for student in unfinished_forced(record, roster):
        missing.setdefault(student, "a forced regrade stopped before it regraded this student")
    return missing


def merge_class(options: ClassOptions, report: Reporter | None = None) -> int:
    """Write the class's outputs from the runs already recorded (by shards or earlier runs), grading
    nothing. A run that could not grade counts as it does after a whole-class run. When a student with
    a submission has no run up to date with their submission, the rubric, the grader and the reference,
    say who and why, write nothing, and return EXIT_MERGE_INCOMPLETE: grade them (their shard again, or
    plain grade-class) and merge again. The torch build and device are not compared: shards may differ."""
    report = report or Reporter()
    course = options.course
    try:
        loaded = load_rubric(options.rubric_path)
    except RubricError as exc:
        report.cannot(str(exc), verb="merge")
        return EXIT_CANNOT_GRADE
    close_to_others(course)
    try:
        roster = read_roster(course)
    except RosterError as exc:
        report.cannot(clean_for_output(exc, newlines=False), verb="merge")
        return EXIT_CANNOT_GRADE
    record = Record(course)
    missing = stale_runs(options, roster, record)
    submitted = sum(entry.has_file for entry in roster)
    if missing:
        report.merge_incomplete(missing, submitted, roster, course)
        return EXIT_MERGE_INCOMPLETE
    report.merged(submitted)
    write_class_outputs(course, class_rows(roster, record), loaded, options.outputs, report.console)
    return EXIT_DONE


def grade_all(todo: list[Job], run: ClassRun, jobs: int, report: Reporter, ahead: OutputsAhead | None = None) -> bool:
    """Step 4 (and 5): grade every job, `jobs` at a time; False when interrupted (Ctrl-C). `ahead` is told of
    each student graded (their feedback page is written while the others are graded)."""
    if not todo:
        return True
    options = run.options
    timeout = run.rubric.limits.class_seconds
    slots = Slots(run.placement)
    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo))))
    futures = {}
    try:
        with report.grading(len(todo)) as done:
            futures = {
                pool.submit(
                    grade_job, slots, run.record, job, run.placement.device, options.rubric_path, timeout, run.isolation
                ): job
                for job in todo
            }
            for future in as_completed(futures):
                job, graded = futures[future], future.result()
                done(job, graded)
                if ahead is not None:
                    ahead.graded(job.entry)
        return True
    except KeyboardInterrupt:
        for future in futures:
            future.cancel()
        return False
    finally:
        slots.close()
        pool.shutdown(wait=True, cancel_futures=True)
