"""Grading a submission folder: what Gradescope's and GitHub Classroom's adapters share.

`grade_folder(folder, out)`:

1. writes a placeholder results.json at `out` first (`cannot_grade`: "grading did not finish"), so a
   grader killed before the end (for memory, or by the platform's timeout) leaves one that says so,
   never nothing and never an old score;
2. finds the file to grade in `folder` (`find_submission`): `mha.ipynb` or `mha.py`, else the one
   `.ipynb`/`.py` file, else the best of several by the class roster's rule (`roster.choose`), said
   in a note; the suffix's case does not matter (`submission.submission_suffix`, the reader's rule).
   A file directly in the folder comes first; else one anywhere below it (a folder or a repository
   was uploaded), hidden files and folders left out;
3. never follows a link out of `folder`: a link is a candidate only when its real path is a regular
   file inside the folder, and links to folders are not walked into. A link out (to the grader's own
   reference, to another submission) is refused with a note;
4. copies the file (`copy_submission`: opened with O_NOFOLLOW and O_NONBLOCK, a regular file only,
   read at most one byte past the reader's size limit) into a private temporary folder as
   `mha.py`/`mha.ipynb`, so the worker never sees the student's folder;
5. grades the copy exactly as `python -m autograder grade` does, and writes results.json.

Nothing to grade (no candidate, or only links out) is `cannot_grade` with the note, as before.
Every file name quoted in a note is cleaned (`clean.clean_for_output`): it is the student's choice.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from autograder.contract import ASSIGNMENT
from autograder.course.clean import clean_for_output
from autograder.course.roster import choose, resolves_inside, scan
from autograder.grading.submission import MAX_BYTES, submission_suffix
from autograder.model import CANNOT_GRADE, GradingRun, write_results, write_unfinished


@dataclass
class Found:
    file: Path | None  # the file to grade, as found in the folder (None: nothing to grade)
    note: str = ""  # for the student: which file was graded when the choice was not obvious, or why none
    refused: list[str] = field(default_factory=list)  # links not followed


def find_submission(folder: Path) -> Found:
    """The file to grade in a platform's submission folder, and a note when its name is not the usual."""
    folder = Path(folder)
    top = scan(folder)
    files, refused = list(top.files), list(top.refused)
    if not files:  # uploaded as a folder (or a GitHub repository): look below, never through a link
        for parent, folders, _ in os.walk(folder):
            folders[:] = sorted(f for f in folders if not f.startswith("."))
            if Path(parent) == folder:
                continue
            found = scan(Path(parent), within=folder)
            files += found.files
            relative = Path(parent).relative_to(folder)
            refused += [f"{relative.as_posix()}/{why}" for why in found.refused]
    files.sort()
    refused_note = "; ".join(refused)
    if not files:
        why = f" ({refused_note})" if refused_note else ""
        return Found(None, f"no {ASSIGNMENT}.ipynb or {ASSIGNMENT}.py was submitted{why}", refused)
    if len(files) == 1:
        file = files[0]
        usual = file.name in (f"{ASSIGNMENT}.ipynb", f"{ASSIGNMENT}.py")
        note = " ".join(n for n in ("" if usual else f"Graded {file.name}.", _sentence(refused_note)) if n)
        return Found(file, note, refused)
    file, why = choose(files)
    note = f"{len(files)} files were submitted: graded {file.relative_to(folder)} because {why}."
    return Found(file, " ".join(n for n in (note, _sentence(refused_note)) if n), refused)


def _sentence(text: str) -> str:
    return f"Not graded: {text}." if text else ""


class CannotCopy(OSError):
    """The file found cannot be copied safely (it changed into a link or a FIFO, or cannot be read)."""


def copy_submission(file: Path, folder: Path, work: Path) -> Path:
    """Copy `file` (found in `folder`) into `work` as mha.py or mha.ipynb, never through a link out of
    `folder`: the real path must lie inside it and be a regular file, opened with O_NOFOLLOW (a link
    swapped in meanwhile is refused) and O_NONBLOCK (a FIFO never blocks)."""
    if not resolves_inside(file, folder):
        raise CannotCopy(f"{file.name} is a symbolic link out of the submission folder, not followed")
    real = os.path.realpath(file)
    try:
        source = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CannotCopy(f"cannot read {file.name}: {exc.strerror or exc}") from None
    copy = Path(work) / f"{ASSIGNMENT}{submission_suffix(file.name) or '.py'}"
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise CannotCopy(f"{file.name} is not a regular file")
        target = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(target, "wb") as handle:
            left = MAX_BYTES + 1  # the reader refuses anything longer, with its own message
            while left > 0 and (chunk := os.read(source, min(1 << 20, left))):
                handle.write(chunk)
                left -= len(chunk)
    except OSError as exc:
        if isinstance(exc, CannotCopy):
            raise
        raise CannotCopy(f"cannot copy {file.name}: {exc.strerror or exc}") from None
    finally:
        os.close(source)
    return copy


def grade_folder(folder: Path, out: Path, device: str = "auto", isolation: str | None = None) -> GradingRun:
    """Grade the submission in `folder` into results.json at `out` (always written); return the run. The
    workers start (`EarlyStart`) before the grader imports torch, pytest and the checks, as `grade`'s do."""
    write_unfinished(out, "")
    found = find_submission(folder)
    note = clean_for_output(found.note)
    if found.file is None:
        run = GradingRun(status=CANNOT_GRADE, submission="", reason=note)
    else:
        with tempfile.TemporaryDirectory(prefix="mha-submission-") as work:  # the worker never sees `folder`
            try:
                copy = copy_submission(found.file, Path(folder), Path(work))
            except CannotCopy as exc:
                run = GradingRun(status=CANNOT_GRADE, submission="", reason=clean_for_output(str(exc)))
            else:
                from autograder.grading.workers import EarlyStart

                isolation = isolation or os.environ.get("AUTOGRADER_ISOLATION", "auto")
                early = EarlyStart.begin(
                    copy, device=device, rubric_path=None, isolation=isolation, out=out, parts=None
                )
                from autograder.grading.grade import Options, grade_submission

                run = grade_submission(
                    copy, Options(device=device, out=out, quiet=True, isolation=isolation, early=early)
                )
                if note:
                    run = replace(run, events=[note, *run.events])
    write_results(out, run)
    return run
