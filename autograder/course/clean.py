"""Strings a student controls, cleaned where they leave the grader.

Folder and file names, notes that quote them, and whatever else a student chose reach the
instructor's terminal, grades.csv, the Canvas file and the feedback pages. They get the cleaning the
grader gives every string from the worker (`protocol.clean_text`: bounded, no lone surrogates, every
control character but newline and tab replaced, so no ESC or OSC sequence reaches a terminal), and
in a CSV cell OWASP's rule against formula injection: a cell that starts with `=`, `+`, `-`, `@`, a
tab or a carriage return gets a leading `'`, so a spreadsheet shows it as text.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from autograder.sandbox.protocol import FrameLimits
from autograder.sandbox.protocol import clean_text as clean_worker_text

TEXT_LIMIT = FrameLimits().string_chars
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def clean_for_output(text: Any, newlines: bool = True, limit: int = TEXT_LIMIT) -> str:
    """`text` (anything: made a string first) cleaned as the grader cleans a worker's strings
    (`protocol.clean_text`), ready for a terminal, a note or a page; on one line unless `newlines`."""
    cleaned = clean_worker_text(str(text), limit)
    return cleaned if newlines else " ".join(cleaned.replace("\t", " ").splitlines())


def csv_cell(value: Any) -> str:
    """One CSV cell: cleaned, on one line, and never read as a formula (OWASP's CSV injection rule)."""
    text = value if isinstance(value, str) else str(value)
    risky = text.startswith(FORMULA_START) or text.lstrip().startswith(FORMULA_START)
    text = clean_for_output(text, newlines=False)
    return "'" + text if risky or text.lstrip().startswith(FORMULA_START) else text


def csv_text(rows: Iterable[Iterable[Any]]) -> str:
    """A CSV file's text, every cell through `csv_cell`."""
    handle = io.StringIO()
    writer = csv.writer(handle, lineterminator="\n")
    for row in rows:
        writer.writerow([csv_cell(cell) for cell in row])
    return handle.getvalue()
