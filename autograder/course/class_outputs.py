"""Everything written about the whole class, from the record alone (no grading happens here).

`write_class_outputs` is the one step that writes them, after a class run and after a merge of
shards alike. Each student of the roster is one `Row` (`rows.py`), whatever happened to them, and every output
has a row per student:

- `autograded/<student>/mha/results.json`: a copy of the record, where nbgrader's layout puts it;
- `feedback/<student>/mha/feedback.html`: what a student reads (`feedback.py`);
- the gradebook database, through nbgrader's own API (`gradebook.py`);
- `grades.csv`: per-part scores, the status and a note per student;
- `grades-canvas.csv`: the totals in Canvas's gradebook import format;
- `class.html`: the class report for the instructor (`class_report.py`);
- the class at a glance on the terminal: per part, mean, median and the distribution of scores.
"""

from __future__ import annotations

import contextlib
import queue
import re
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autograder.atomic import write_text_atomically
from autograder.contract import ASSIGNMENT
from autograder.course.class_report import report_path, write_class_report
from autograder.course.clean import clean_for_output, csv_text
from autograder.course.feedback import feedback_written
from autograder.course.gradebook import GradebookError, ensure_configuration, make_ahead, record_grades
from autograder.course.roster import AMBIGUOUS, NO_SUBMISSION, Entry
from autograder.course.rows import NOT_GRADED, STATUSES, Row, graded_parts, status_words
from autograder.course.store import COURSE_FILE_MODE, Record
from autograder.model import CANNOT_GRADE, points_text
from autograder.rubric import Rubric

BARS = " ▁▂▃▄▅▆▇█"


# -- grades.csv and the LMS export -----------------------------------------------------------------


def grades_csv(rows: list[Row], rubric: Rubric) -> str:
    """Per student: total, per-part scores, status, the file graded, a note. A student without a score
    has empty score cells (cannot_grade) or zeros (no submission), never a made-up number. Every cell
    is cleaned and never read as a formula (`clean.csv_cell`): names and notes are the student's."""
    parts = graded_parts(rubric)
    lines: list[list[str]] = [["student", "score", "max_score", *parts, "status", "file", "note"]]
    for row in rows:
        run = row.scored_run
        if run is not None:
            scores = row.part_scores()
            cells = [_number(run.score), *(_number(scores.get(p, 0.0)) for p in parts)]
        elif row.status == NO_SUBMISSION:
            cells = ["0", *("0" for _ in parts)]
        else:
            cells = ["", *("" for _ in parts)]
        lines.append(
            [
                row.shown,
                cells[0],
                _number(rubric.max_score),
                *cells[1:],
                row.status,
                row.entry.file.name if row.entry.file else "",
                row.note(),
            ]
        )
    return csv_text(lines)


def canvas_csv(rows: list[Row], rubric: Rubric, assignment: str = ASSIGNMENT) -> str:
    """Canvas's gradebook import: Student, ID, SIS User ID, SIS Login ID, Section, then one column
    per assignment, and a "Points Possible" row first. nbgrader's student id (the folder name) goes
    in SIS Login ID, which Canvas matches students by when ID is empty. A student who could not be
    graded gets an empty cell (Canvas leaves the grade alone), one with no submission a 0. The
    assignment's column is headed `assignment`: see `canvas_header_note` for how Canvas reads it."""
    lines: list[list[str]] = [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", assignment],
        ["Points Possible", "", "", "", "", _number(rubric.max_score)],
    ]
    for row in rows:
        run = row.scored_run
        score = _number(run.score) if run is not None else ("0" if row.status == NO_SUBMISSION else "")
        lines.append([row.shown, "", "", row.shown, "", score])
    return csv_text(lines)


# Canvas's importer reads an assignment column's header as "Name (id)" (its Assignment.title_and_id): it
# matches the assignment with that id; a header without one matches an assignment of exactly that name;
# anything else creates a new assignment.
CANVAS_HEADER = re.compile(r"\A(.*)\s\((\d+)\)\Z")


def canvas_header_note(header: str) -> str:
    """What Canvas will do with the Canvas file's assignment column, when it may not be what is meant."""
    if CANVAS_HEADER.match(header):
        return ""
    return (
        f"grades-canvas.csv heads its column {header!r}: Canvas puts it into an assignment named exactly "
        f"{header!r}, or makes a new one. To fill an existing assignment, give its column's header as a "
        "Canvas gradebook export shows it, `Name (id)`: --canvas-assignment, or CANVAS_ASSIGNMENT= for make"
    )


def _number(value: float) -> str:
    return points_text(value)


# -- the class at a glance -------------------------------------------------------------------------


def distribution(scores: list[float], maximum: float, bins: int = 10) -> str:
    """A one-line histogram of `scores` over [0, maximum]: one bar per bin, height by count."""
    if not scores:
        return ""
    counts = [0] * bins
    for score in scores:
        index = bins - 1 if maximum <= 0 else min(bins - 1, int(score / maximum * bins))
        counts[index] += 1
    top = max(counts)
    return "".join(BARS[round(c / top * (len(BARS) - 1))] if c else "·" for c in counts)


def class_table(rows: list[Row], rubric: Rubric) -> Table:
    scored = [r for r in rows if r.scored]
    scored_runs = [run for run in (r.scored_run for r in rows) if run is not None]
    table = Table(title=f"The class at a glance: {len(scored)} of {len(rows)} students scored")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("part", "left"),
        ("points", "right"),
        ("mean", "right"),
        ("median", "right"),
        ("full marks", "right"),
        ("distribution (0 to max)", "left"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify)
    series = [(p, rubric.part_points(p), [r.part_scores().get(p, 0.0) for r in scored]) for p in graded_parts(rubric)]
    series.append(("total", rubric.max_score, [run.score for run in scored_runs]))
    for name, points, scores in series:
        if scores:
            full = sum(s >= points - 1e-9 for s in scores)
            table.add_row(
                name,
                f"{points:g}",
                f"{statistics.fmean(scores):.1f}",
                f"{statistics.median(scores):g}",
                f"{full}/{len(scores)}",
                distribution(scores, points),
                end_section=name == series[-2][0],
            )
        else:
            table.add_row(name, f"{points:g}", "-", "-", "-", "")
    return table


NOTE_CHARS = 200  # of a note in the students' table (grades.csv has it whole)


def shortened(text: str, limit: int) -> str:
    """`text` cut to `limit` characters at a word, with an ellipsis where it was cut."""
    if len(text) <= limit:
        return text
    return text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ;,:") + "…"


def students_table(rows: list[Row]) -> Table:
    table = Table(title="Students")
    table.add_column("student")
    table.add_column("score", justify="right")
    table.add_column("status")
    table.add_column("note", overflow="fold")
    for row in rows:
        run = row.scored_run
        score = f"{points_text(run.score)} / {points_text(run.max_score)}" if run is not None else "-"
        style = {CANNOT_GRADE: "red", NO_SUBMISSION: "yellow", NOT_GRADED: "yellow", AMBIGUOUS: "yellow"}
        table.add_row(
            escape(clean_for_output(row.shown, newlines=False)),
            score,
            status_words(row.status),
            escape(shortened(row.note(), NOTE_CHARS)),
            style=style.get(row.status),
        )
    return table


# -- the one step that writes them ----------------------------------------------------------------


@dataclass
class OutputOptions:
    released: bool = False  # feedback may show what the rubric shows "after_due_date"
    db_url: str | None = None  # the gradebook (default: the course's nbgrader configuration)
    gradebook: bool = True
    feedback: bool = True
    canvas_assignment: str = ASSIGNMENT  # the Canvas file's column header: "Name (id)" of a Canvas assignment


class OutputsAhead:
    """What the class outputs cost that need not wait for the last grading, done in a thread of its own while
    the class is graded (a class run's coordinator mostly waits on its grading processes meanwhile): the
    imports (matplotlib, nbgrader), the gradebook's database where it does not exist yet
    (`gradebook.stamp_new_database`), and each student's feedback page once their run is recorded (`graded`).
    `write_class_outputs` then finds those pages current and writes only what is not. Only a saving of time:
    what fails here is done again, and said, by `write_class_outputs`."""

    def __init__(self, course: Path, record: Record, options: OutputOptions):
        self.course, self.record, self.options = Path(course), record, options
        self.graded_entries: queue.SimpleQueue[Entry | None] = queue.SimpleQueue()
        self.written: set[str] = set()  # the students whose feedback page it wrote (read once `close` returns)
        self.thread = threading.Thread(target=self._run, name="outputs-ahead", daemon=True)
        self.thread.start()

    def graded(self, entry: Entry) -> None:
        """`entry`'s student has a new run in the record: their feedback page can be written now."""
        self.graded_entries.put(entry)

    def close(self) -> None:
        """Wait for what was asked to be done (the class outputs are written after, from the record)."""
        self.graded_entries.put(None)
        self.thread.join()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            if self.options.feedback:
                from matplotlib.figure import Figure  # noqa: F401  # imported ahead: about a second
            if self.options.gradebook:
                make_ahead(self.course, self.options.db_url)
        while (entry := self.graded_entries.get()) is not None:
            if not self.options.feedback:
                continue
            with contextlib.suppress(Exception):
                row = Row(entry, self.record.run(entry.student) if entry.has_file else None)
                self.written.update(feedback_written(self.course, [row], released=self.options.released))


def mirror_results(course: Path, record: Record, rows: list[Row]) -> int:
    """Copy each stored results.json to `autograded/<student>/mha/` where it differs or is missing."""
    copied = 0
    for row in rows:
        source = record.results_path(row.student)
        if row.run is None or not source.is_file():
            continue
        target = course / "autograded" / row.student / record.assignment / "results.json"
        data = source.read_bytes()
        try:
            same = target.read_bytes() == data
        except OSError:
            same = False
        if not same:
            write_text_atomically(target, data.decode("utf-8"), COURSE_FILE_MODE)
            copied += 1
    return copied


def write_class_outputs(
    course: Path,
    rows: list[Row],
    rubric: Rubric,
    options: OutputOptions | None = None,
    console: Console | None = None,
    written_ahead: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Write every class output from `rows`; print the tables and where each output is. `written_ahead`: the
    students whose feedback page this run wrote already (`OutputsAhead`), counted with those written here."""
    options = options or OutputOptions()
    console = console or Console(highlight=False)
    course = Path(course)
    record = Record(course)
    where: dict[str, str] = {}
    mirror_results(course, record, rows)
    where["results (the record)"] = f"{course / record.root.name}/<student>/{ASSIGNMENT}/results.json"
    where["results (nbgrader's layout)"] = f"{course}/autograded/<student>/{ASSIGNMENT}/results.json"
    if options.feedback:
        pages = written_ahead | set(feedback_written(course, rows, released=options.released))
        where["feedback"] = f"{course}/feedback/<student>/{ASSIGNMENT}/feedback.html ({len(pages)} written)"
    if options.gradebook:
        told = ensure_configuration(course)
        if told:
            console.print(told, style="yellow", markup=False)
        try:
            where["gradebook"] = record_grades(course, rows, rubric, db_url=options.db_url)
        except GradebookError as exc:
            console.print(f"gradebook not updated: {exc}", style="red", markup=False)
    write_text_atomically(course / "grades.csv", grades_csv(rows, rubric), COURSE_FILE_MODE)
    where["grades.csv"] = str(course / "grades.csv")
    write_text_atomically(
        course / "grades-canvas.csv", canvas_csv(rows, rubric, options.canvas_assignment), COURSE_FILE_MODE
    )
    where["Canvas import"] = f"{course / 'grades-canvas.csv'} (column {options.canvas_assignment!r})"
    written = write_class_report(course, rows, rubric, released=options.released)
    where["class report"] = f"{report_path(course)} ({'written' if written else 'unchanged'})"
    console.print(students_table(rows))
    console.print(class_table(rows, rubric))
    counts = {status: sum(r.status == status for r in rows) for status in STATUSES}
    console.print(", ".join(f"{n} {status_words(s)}" for s, n in counts.items() if n))
    for name, path in where.items():
        console.print(f"{name}: {path}", markup=False, soft_wrap=True)  # a path on one line, to copy or click
    if note := canvas_header_note(options.canvas_assignment):
        console.print(note, style="yellow", markup=False)
    return where
