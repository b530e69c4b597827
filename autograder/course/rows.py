"""One row per student of the roster, whatever happened to them: what every class output is made from.

A `Row` joins a roster entry (`roster.Entry`: the file graded, or why there is none) with the
student's stored grading run (`model.GradingRun`). `class_outputs`, `feedback` and `gradebook` all
read rows; none of them imports another for it.

A row's status is one of the class's status words (`STATUSES`), the same in grades.csv, the terminal
tables (with spaces for underscores), results.json (`graded`, `cannot_grade`: the model's own words)
and the documentation:

| status | meaning |
| --- | --- |
| `graded` | one file was graded |
| `ambiguous` | several candidate files: one was graded, and the note says which and why |
| `cannot_grade` | the grader could not grade it (its own fault, never the student's): no score, graded again next run |
| `no_submission` | no file to grade; the note says why |
| `not_graded` | a file, but no stored run yet (a run limited to other students) |
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autograder.contract import ASSIGNMENT, PART_IDS
from autograder.course.clean import clean_for_output
from autograder.course.roster import AMBIGUOUS, NO_SUBMISSION, Entry
from autograder.model import CANNOT_GRADE, GRADED, CheckResult, GradingRun
from autograder.rubric import Rubric

NOT_GRADED = "not_graded"
STATUSES = (GRADED, AMBIGUOUS, CANNOT_GRADE, NO_SUBMISSION, NOT_GRADED)


def status_words(status: str) -> str:
    """A status as the terminal shows it: the same word, spaces for underscores ("cannot grade")."""
    return status.replace("_", " ")


@dataclass
class Row:
    entry: Entry
    run: GradingRun | None  # None: no submission, or not graded (yet)

    @property
    def student(self) -> str:
        return self.entry.student

    @property
    def shown(self) -> str:
        """The student as every output shows them (`roster.Entry.shown`): never another student's label."""
        return self.entry.shown

    @property
    def status(self) -> str:
        if not self.entry.has_file:
            return NO_SUBMISSION
        if self.run is None:
            return NOT_GRADED
        if not self.run.graded:
            return CANNOT_GRADE
        return AMBIGUOUS if self.entry.status == AMBIGUOUS else GRADED

    @property
    def scored(self) -> bool:
        return self.status in (GRADED, AMBIGUOUS)

    @property
    def scored_run(self) -> GradingRun | None:
        """The stored run when it scored the student (`scored`), else None."""
        return self.run if self.scored else None

    def part_scores(self) -> dict[str, float]:
        run = self.scored_run
        return {p.part: p.score for p in run.parts()} if run is not None else {}

    def note(self) -> str:
        """For the instructor: why there is no score, or what to know about the one there is; cleaned
        (`clean.clean_for_output`) and on one line, since it quotes file names the student chose."""
        notes = []
        if self.status == CANNOT_GRADE and self.run is not None:
            notes.append(self.run.reason)
        if self.entry.note:
            notes.append(self.entry.note)
        if self.entry.timestamp_note:
            notes.append(self.entry.timestamp_note)
        run = self.scored_run
        if run is not None:
            if run.load.problem or run.load.cells:  # what went wrong, said in the student's terms (`headline`)
                notes.append(run.headline() or next(iter(run.load.loose_lines()), ""))
            notes += [f"Worker: {e}" for e in run.events[:1]]
            notes += [f"Flagged: {flag}" for flag in run.flags]
        return "; ".join(clean_for_output(n, newlines=False) for n in notes if n)


def graded_parts(rubric: Rubric) -> list[str]:
    """The rubric's parts, in the fixed part order."""
    return [p for p in PART_IDS if p in rubric.parts] + [p for p in rubric.parts if p not in PART_IDS]


# What a page may say of a check (its name, result, message and the mistake it names), by its visibility in
# the rubric: before the due date, and after it (`released`: `--released`, `make grade RELEASED=1`). A hidden
# check is only ever counted. The feedback pages and the class report follow the same rule.
SHOWN_BEFORE = {"visible"}
SHOWN_AFTER = {"visible", "after_due_date", "after_published"}


def shown(check: CheckResult, released: bool) -> bool:
    return check.visibility in (SHOWN_AFTER if released else SHOWN_BEFORE)


def feedback_path(course: Path, student: str) -> Path:
    """Where a student's feedback page is (`feedback.py` writes it; the class report links to it)."""
    return Path(course) / "feedback" / student / ASSIGNMENT / "feedback.html"


def page_is_current(path: Path, fingerprint: re.Pattern[bytes], value: str) -> bool:
    """Whether the page at `path` was written from the same inputs: its `fingerprint` (a pattern whose group
    is the value, in the page's first 4 KiB) says `value`. A page that cannot be read is not current."""
    try:
        with open(path, "rb") as handle:
            match = fingerprint.search(handle.read(4096))
    except OSError:
        return False
    return match is not None and match.group(1).decode() == value
