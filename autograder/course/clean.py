"""Strings a student controls, cleaned where they leave the grader.

Folder and file names, notes that quote them, and whatever else a student chose reach the
instructor's terminal, grades.csv, the Canvas file and the feedback pages. They get the cleaning the
grader gives every string from the worker (`protocol.clean_text`: bounded, no lone surrogates, every
control character but newline and tab and every bidirectional control replaced, so no ESC or OSC
sequence reaches a terminal and no U+202E reorders a name), and in a CSV cell OWASP's rule against
formula injection: a cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
leading `'`, so a spreadsheet shows it as text.

A student's id (their folder's name) must also stay distinct once cleaned: `dup\nname` and `dup name`
were one row of grades.csv. `distinct_labels` gives every id the label the outputs show: the id itself
when it is safe as it is, else its cleaned form, told apart from every other label by a number when
they would meet, with a note saying so.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from autograder.sandbox.protocol import FrameLimits, unsafe_char
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


def label_for(name: str) -> str:
    """A name a student chose, on one line and safe to show: every control character (newline and tab
    included), bidirectional control and lone surrogate becomes U+FFFD, so it never reads as another name
    with spaces where its control characters were."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "".join("\ufffd" if unsafe_char(ch) or ch in "\n\t" else ch for ch in text)


def distinct_labels(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """For each of `names` (students' ids: distinct), the label every output shows and a note ("" when the
    label is the name). A name that is safe as it is, in a terminal and in a CSV cell, is its own label; any
    other is shown cleaned (`label_for`), and where that would meet another label, in a terminal or in a
    CSV cell (after `csv_cell`), it gets " (2)", " (3)", ... until it meets none: no two students share a row."""
    names = list(dict.fromkeys(names))
    safe = [n for n in names if label_for(n) == n and csv_cell(n) == n]
    taken = {csv_cell(n) for n in safe}
    labels = {n: (n, "") for n in safe}
    for name in sorted(n for n in names if n not in labels):
        shown = label_for(name)
        label, number = shown, 2
        while csv_cell(label) in taken:
            label, number = f"{shown} ({number})", number + 1
        taken.add(csv_cell(label))
        if label == name:  # safe but for a CSV cell's leading quote, which csv_cell adds: nothing to say
            labels[name] = (name, "")
            continue
        why = "characters that cannot be shown as they are (control, bidirectional or undecodable ones)"
        if label_for(name) == name:
            why = "a start that a spreadsheet would read as a formula"
        tell = "" if label == shown else ", numbered to tell it from another student's"
        labels[name] = (label, f"the folder's name has {why}: shown as '{label}'{tell}")
    return labels
