"""Who is in the class, and which file of theirs is graded: one entry per folder under submitted/.

nbgrader's layout is `submitted/<student>/<assignment>/`. Every student folder is an entry, whatever
it holds, so no student can silently drop out of the outputs:

- `submitted`: one candidate file (a `.py` or `.ipynb` directly in the assignment folder, whatever the
  case of its suffix: `submission.submission_suffix`, the rule the reader applies too). It is
  graded whatever its name; `mha (1).ipynb` or `mha-1.ipynb` (what `nbgrader zip_collect` and LMS
  downloads produce) gets a note saying which file was graded.
- `ambiguous`: several candidates. One is graded, by a fixed rule (`choose`), and the note names it,
  the others and the reason.
- `no_submission`: no assignment folder, or no candidate in it; the note says which.

Links are never followed out of a student's folder: `submitted/<student>/` must be a folder of its
own (not a link), its `mha/` may link only within it, and a candidate file only within `mha/` (the
rule the reader applies to a link). A link that leaves is refused, and the note says so:
`submitted/frank/mha -> ../alice/mha` is no submission of frank's, never alice's work graded as his.

`timestamp.txt` beside the file (what `nbgrader submit` writes on the student's side and `nbgrader
collect` copies) is read as nbgrader reads it, for the gradebook only, never for a score: opened with
O_NOFOLLOW and O_NONBLOCK, a regular file of at most 64 bytes. Anything else (a link, a FIFO, a
device, too long, not a time nbgrader can parse) is a note on that student, and no time is recorded.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from autograder.contract import ASSIGNMENT
from autograder.course.clean import distinct_labels
from autograder.grading.submission import submission_suffix

TIMESTAMP_FILE, TIMESTAMP_BYTES = "timestamp.txt", 64
SUBMITTED, AMBIGUOUS, NO_SUBMISSION = "submitted", "ambiguous", "no_submission"
# "mha (2)", "mha-2", "mha_2", "mha 2", "mha(2)": the copy number LMS downloads and browsers add
_COPY = re.compile(r"^(?P<stem>.*?)[\s_-]*(?:\((?P<paren>\d+)\)|(?<=[\s_-])(?P<bare>\d+))$")


@dataclass(frozen=True)
class Entry:
    student: str
    status: str  # SUBMITTED, AMBIGUOUS or NO_SUBMISSION
    file: Path | None = None  # the file graded
    candidates: tuple[str, ...] = ()  # every candidate's name
    note: str = ""  # for the instructor: which file was graded and why, or why there is none
    timestamp: datetime | None = None  # timestamp.txt's time (UTC), for the gradebook only
    timestamp_note: str = ""  # for the instructor: why timestamp.txt was not read
    label: str = ""  # the student as every output shows them (`clean.distinct_labels`); "" when `student` is shown

    @property
    def has_file(self) -> bool:
        return self.file is not None

    @property
    def shown(self) -> str:
        """The student as the outputs show them: safe in a terminal and a CSV cell, and no other student's."""
        return self.label or self.student


def resolves_inside(path: Path, root: Path) -> bool:
    """Whether `path`'s real path (every link followed) is `root`'s real path or below it."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def read_timestamp(folder: Path) -> tuple[datetime | None, str]:
    """timestamp.txt in `folder` as nbgrader parses it (naive UTC), and a note when it is there but was
    not read. Bounded and non-blocking whatever the student put there; never raises."""
    path = folder / TIMESTAMP_FILE
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        why = "it is a symbolic link" if is_link(path) else (exc.strerror or str(exc))
        return None, f"{TIMESTAMP_FILE} not read: {why}"
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None, f"{TIMESTAMP_FILE} not read: it is not a regular file"
        data = os.read(descriptor, TIMESTAMP_BYTES + 1)
    except OSError as exc:
        return None, f"{TIMESTAMP_FILE} not read: {exc.strerror or exc}"
    finally:
        os.close(descriptor)
    if len(data) > TIMESTAMP_BYTES:
        return None, f"{TIMESTAMP_FILE} not read: it is longer than {TIMESTAMP_BYTES} bytes"
    from nbgrader.utils import parse_utc  # (slow to import: only when there is a timestamp)

    try:
        return parse_utc(data.decode("ascii").strip()), ""
    except (ValueError, OverflowError, TypeError):
        shown = data.decode("ascii", "replace").strip()[:TIMESTAMP_BYTES]
        return None, f"{TIMESTAMP_FILE} not read: {shown!r} is not a time"


@dataclass(frozen=True)
class Scan:
    files: list[Path]  # the candidates, as named in the folder
    refused: list[str]  # why a file was not a candidate (a link out of the folder)
    unreadable: str = ""  # why the folder could not be listed (then there are no candidates)


def scan(folder: Path, within: Path | None = None) -> Scan:
    """The files directly in `folder` that could be the submission (`submission_suffix`: `.py` or
    `.ipynb`, any case; not hidden), without following a link out of `within` (default: `folder`):
    a regular file, or a link whose real path is a regular file inside `within`."""
    within = folder if within is None else within
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return Scan([], [], exc.strerror or str(exc))
    files, refused = [], []
    for name in names:
        path = folder / name
        if name.startswith(".") or not submission_suffix(name):
            continue
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            files.append(path)
        elif stat.S_ISLNK(mode):
            if not resolves_inside(path, within):
                refused.append(f"{name} is a symbolic link out of the folder, not followed")
            elif os.path.isfile(path):
                files.append(path)
    return Scan(files, refused)


def candidates_in(folder: Path) -> list[Path]:
    """The files in `folder` that could be the submission (see `scan`)."""
    return scan(folder).files


def copy_number(path: Path) -> tuple[str, int]:
    """("mha", 2) for `mha (2).ipynb` or `mha-2.py`; ("mha", 0) for `mha.py`."""
    match = _COPY.match(path.stem)
    if not match:
        return path.stem, 0
    return match["stem"], int(match["paren"] or match["bare"])


def choose(files: list[Path], assignment: str = ASSIGNMENT) -> tuple[Path, str]:
    """The file to grade among several, and why: the assignment's own name first (the notebook before
    the .py), then the highest copy number of the assignment's name (the latest upload), then a
    notebook, then the first name in alphabetical order."""

    def rank(path: Path) -> tuple[bool, bool, int, bool, str]:
        stem, number = copy_number(path)
        exact = path.stem == assignment
        named = stem.lower().endswith(assignment)
        return (not exact, not named, -number, path.suffix.lower() != ".ipynb", path.name)

    best = min(files, key=rank)
    stem, number = copy_number(best)
    if best.stem == assignment:
        why = f"it has the assignment's own name ({best.name})"
    elif stem.lower().endswith(assignment) and number:
        why = f"it has the highest copy number of {assignment}{best.suffix} (the latest upload)"
    elif best.suffix.lower() == ".ipynb":
        why = "it is the notebook"
    else:
        why = "it comes first in alphabetical order"
    return best, why


def cannot_read(where: str, why: str) -> str:
    """The note on a student whose folder the grader may not read: nothing of theirs was graded, and why."""
    return (
        f"{where} cannot be read by the grader ({why}): nothing in it was graded; make it readable by the "
        "grader's user and run again"
    )


def entry_for(student_folder: Path, assignment: str = ASSIGNMENT) -> Entry:
    """The student's entry. Never raises: a folder or file the grader may not read is a note on that student."""
    student = student_folder.name
    folder = student_folder / assignment
    if is_link(student_folder):
        return Entry(student, NO_SUBMISSION, note=f"submitted/{student} is a symbolic link, not followed")
    if is_link(folder) and not resolves_inside(folder, student_folder):
        return Entry(
            student,
            NO_SUBMISSION,
            note=f"submitted/{student}/{assignment} is a symbolic link out of {student}'s folder, not followed",
        )
    try:
        is_folder = stat.S_ISDIR(os.stat(folder).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_folder = False
    except OSError as exc:  # the student's folder may not be searched (mode 0600, 0000, ...)
        return Entry(student, NO_SUBMISSION, note=cannot_read(f"submitted/{student}/", exc.strerror or str(exc)))
    if not is_folder:
        return Entry(student, NO_SUBMISSION, note=f"no {assignment}/ folder in submitted/{student}/")
    found = scan(folder)
    if found.unreadable:  # (mode 0300, say): not even listed
        return Entry(student, NO_SUBMISSION, note=cannot_read(f"submitted/{student}/{assignment}/", found.unreadable))
    files = found.files
    refused = "; ".join(found.refused)
    if not files:
        try:
            held = sorted(name for name in os.listdir(folder) if not name.startswith("."))
        except OSError:
            held = []
        seen = f" (it holds: {', '.join(held[:5])}{', ...' if len(held) > 5 else ''})" if held else " (it is empty)"
        return Entry(
            student,
            NO_SUBMISSION,
            note=f"no {assignment}.ipynb or {assignment}.py, nor any other .ipynb "
            f"or .py file, in submitted/{student}/{assignment}/{seen}" + (f": {refused}" if refused else ""),
        )
    names = tuple(p.name for p in files)
    timestamp, timestamp_note = read_timestamp(folder)
    if len(files) == 1:
        file = files[0]
        notes = (
            []
            if file.stem == assignment
            else [f"graded {file.name}, the only submission file (not named {assignment}.ipynb or {assignment}.py)"]
        )
        return Entry(student, SUBMITTED, file, names, "; ".join(notes + found.refused), timestamp, timestamp_note)
    file, why = choose(files, assignment)
    others = ", ".join(n for n in names if n != file.name)
    return Entry(
        student,
        AMBIGUOUS,
        file,
        names,
        f"{len(files)} candidate files: graded {file.name} because {why}; not graded: {others}"
        + (f"; {refused}" if refused else ""),
        timestamp,
        timestamp_note,
    )


def read_roster(course: Path, assignment: str = ASSIGNMENT) -> list[Entry]:
    """One entry per folder under `course/submitted/`, sorted by student."""
    submitted = Path(course) / "submitted"
    if not submitted.is_dir():
        return []
    try:
        names = sorted(os.listdir(submitted))
    except OSError as exc:
        raise RosterError(f"{submitted} cannot be read by the grader ({exc.strerror or exc})") from None
    # a link among the student folders is an entry too (refused by `entry_for`), never followed
    folders = [
        submitted / n for n in names if not n.startswith(".") and (is_link(submitted / n) or _is_dir(submitted / n))
    ]
    return labelled([entry_for(folder, assignment) for folder in folders])


def labelled(entries: list[Entry]) -> list[Entry]:
    """The entries with the labels the outputs show them by (`clean.distinct_labels`), and a note for each
    whose label is not its folder's name."""
    labels = distinct_labels(e.student for e in entries)
    changed = []
    for entry in entries:
        label, note = labels[entry.student]
        if label == entry.student:
            changed.append(entry)
            continue
        changed.append(replace(entry, label=label, note="; ".join(n for n in (note, entry.note) if n)))
    return changed


class RosterError(OSError):
    """The class's submitted/ folder cannot be read at all: nobody can be graded."""


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False
