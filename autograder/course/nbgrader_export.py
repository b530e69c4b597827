"""`nbgrader export` through our CSV cleaning: nbgrader's CSV exporter, every cell neutralised.

nbgrader's own `CsvExportPlugin` joins the cells with commas as they are: a student id or a name
with a comma shifts the columns, and one that starts with `=` is a formula in a spreadsheet. This
plugin writes the same columns, in the same order, through `clean.csv_text` (quoted where needed,
OWASP's rule against formula injection). The course's `nbgrader_config.py` that `grade-class` writes
selects it (`c.ExportApp.plugin_class`) when this package can be imported, so `nbgrader export` run
from the course folder uses it.
"""

from __future__ import annotations

from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import CsvExportPlugin

from autograder.atomic import write_text_atomically
from autograder.course.clean import csv_text, distinct_labels
from autograder.course.store import COURSE_FILE_MODE
from autograder.model import points_text

COLUMNS = (
    "assignment",
    "duedate",
    "timestamp",
    "student_id",
    "last_name",
    "first_name",
    "email",
    "raw_score",
    "late_submission_penalty",
    "score",
    "max_score",
)


def export_rows(gradebook: Gradebook, students: list[str], assignments: list[str]) -> list[list[str]]:
    """nbgrader's export, row for row (its rules: no submission is 0, the score less the penalty)."""
    rows = [list(COLUMNS)]
    shown = distinct_labels(student.id for student in gradebook.students)  # ids stay distinct once cleaned
    for assignment in gradebook.assignments:
        if assignments and assignment.name not in assignments:
            continue
        for student in gradebook.students:
            if students and student.id not in students:
                continue
            row = {
                "assignment": assignment.name,
                "duedate": assignment.duedate,
                "student_id": shown[student.id][0],
                "last_name": student.last_name,
                "first_name": student.first_name,
                "email": student.email,
                "max_score": assignment.max_score,
            }
            try:
                submission = gradebook.find_submission(assignment.name, student.id)
            except MissingEntry:
                row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0)
            else:
                penalty = submission.late_submission_penalty
                row.update(
                    timestamp=submission.timestamp,
                    raw_score=submission.score,
                    late_submission_penalty=penalty,
                    score=max(0.0, submission.score - penalty),
                )
            rows.append([cell(key, row[key]) for key in COLUMNS])
    return rows


POINTS = ("raw_score", "late_submission_penalty", "score", "max_score")


def cell(column: str, value: object) -> str:
    """One cell as text; points as every output of ours writes them (the gradebook adds the parts' scores
    as floats, 85.63000000000001, where we write 85.63)."""
    if value is None:
        return ""
    if column in POINTS and isinstance(value, (int, float)):
        return points_text(float(value))
    return str(value)


class SafeCsvExportPlugin(CsvExportPlugin):
    """nbgrader's CSV export, every cell through `clean.csv_cell`."""

    def export(self, gradebook: Gradebook) -> None:
        destination = self.to or "grades.csv"
        self.log.info("Exporting grades to %s", destination)
        rows = export_rows(gradebook, [str(s) for s in self.student], [str(a) for a in self.assignment])
        write_text_atomically(Path(destination), csv_text(rows), COURSE_FILE_MODE)
