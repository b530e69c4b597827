"""Reading a submission file into code cells, without running any of it.

A `.ipynb` gives its code cells in order; a `.py` is split on jupytext's `# %%` markers (one cell when
it has none). IPython magics, `!` shell escapes and `%%` cell magics are never run: their lines become
`pass`, so every line of a cell stays where it was.

Each code cell comes back as a `Cell(number, line, source)`:

- `number` is the cell's number as the student sees it. In a notebook it is the 1-based position
  among *all* cells, markdown and raw ones included, as Jupyter lists them. In a `.py` file it is the
  1-based position among the `# %%` cells, markdown ones included; code before the first marker is
  cell 1 (a preamble of only blank lines and comments is not a cell, as in Jupyter).
- `line` is the 1-based line of the file where `source` starts: 1 in a notebook (a cell's own lines),
  the line after the `# %%` marker in a `.py` file, so `source`'s line `k` is the file's line
  `line + k - 1`. Lines end at `\\n`, `\\r\\n` or a lone `\\r`, as Python and editors count them.
- `source` is the cell's text with magics neutralised, newlines normalised to `\\n`. It is never
  padded, and reading is linear in the size of the file.

Two kinds of problem, two exceptions:

- `SubmissionFormatError`: the student's file is there but cannot be read as a submission: a wrong
  suffix, over `MAX_BYTES`, empty or without code, not UTF-8, a NUL byte, not a notebook, a notebook
  that nbformat's schema rejects, or a symbolic link to a file outside its own folder (refused: it
  could point at the answer key or a classmate's work). The submission is graded, with 0 points and
  the message, which says what to fix.
- `NotASubmission`: the grader was not given a submission file at all: the path does not exist, is a
  directory, a FIFO, socket or device, or cannot be read by the grader. The run could not grade.

Encoding: a submission must be UTF-8 (a leading byte-order mark is allowed and dropped). A file in
another encoding is refused with the line of its first undecodable byte rather than guessed at,
so a student's code never silently changes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import warnings
from pathlib import Path
from typing import NamedTuple

SUFFIXES = (".py", ".ipynb")
MAX_BYTES = 5 << 20
MAX_DETAIL = 200  # characters of a validator's message or a student's value quoted back
_MAGIC_LINE = re.compile(r"^(\s*)(?:[%!]|\w+\s*=\s*[%!])")
_CELL_MARKER = re.compile(r"# %%(.*)")
_NOT_CODE = ("[markdown]", "[md]", "[raw]")


class Cell(NamedTuple):
    number: int  # as the student sees it (see the module docstring)
    line: int  # 1-based line of the file where `source` starts
    source: str


class SubmissionFormatError(ValueError):
    """The student's file cannot be read as a submission; the message says what to fix."""


class NotASubmission(OSError):
    """The path given to the grader is not a readable submission file; nothing can be graded."""


def submission_suffix(name: str) -> str | None:
    """What kind of submission a file's name says it is: ".py" or ".ipynb", whatever the case of its
    suffix (`MHA.PY` is a .py file), else None. The one file-name rule: the class roster, the platform
    adapters and this reader all use it."""
    suffix = os.path.splitext(name)[1].lower()
    return suffix if suffix in SUFFIXES else None


def read_cells(path: Path) -> list[Cell]:
    """The code cells of the submission at `path`, magics neutralised."""
    path = Path(path)
    data = _read_bytes(path)
    kind = submission_suffix(path.name)
    if kind is None:
        raise SubmissionFormatError(f"{path.name}: a submission is a .py or .ipynb file")
    if not data.strip():
        raise SubmissionFormatError(f"{path.name} is empty" + (" (only whitespace)" if data else ""))
    text = _decode(data, path.name)
    cells = notebook_cells(text, path.name) if kind == ".ipynb" else python_cells(text)
    if not any(_has_code(cell.source) for cell in cells):
        raise SubmissionFormatError(
            f"{path.name} has no code (only blank lines, comments or markdown): there is nothing to grade"
        )
    return cells


# -- the file ---------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, at most MAX_BYTES, read without blocking and without following a link out
    of the submission's folder."""
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        raise NotASubmission(f"no such submission file: {path}") from None
    except OSError as exc:
        raise NotASubmission(f"cannot read {path}: {exc.strerror or exc}") from None
    target = os.path.realpath(path)
    if link:
        folder = os.path.realpath(path.parent)
        if os.path.commonpath([folder, target]) != folder:
            raise SubmissionFormatError(
                f"{path.name} is a symbolic link to a file outside its folder; the grader does not follow "
                "it. Submit the file itself."
            )
        if not os.path.exists(target):
            raise SubmissionFormatError(f"{path.name} is a symbolic link to a file that does not exist")
    try:
        mode = os.stat(target).st_mode
        if stat.S_ISDIR(mode):
            raise NotASubmission(f"{path} is a directory, not a submission file")
        if not stat.S_ISREG(mode):
            raise NotASubmission(f"{path} is not a regular file (a FIFO, socket or device), not a submission")
        # O_NONBLOCK: should the file be swapped for a FIFO meanwhile, opening it does not wait.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except NotASubmission:
        raise
    except OSError as exc:
        raise NotASubmission(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotASubmission(f"{path} is not a regular file, not a submission")
        chunks, size = [], 0
        while size <= MAX_BYTES and (chunk := os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise NotASubmission(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_BYTES:
        hint = " Clear the notebook's outputs before saving it." if submission_suffix(path.name) == ".ipynb" else ""
        raise SubmissionFormatError(f"{path.name} is over the size limit of {MAX_BYTES:,} bytes.{hint}")
    return b"".join(chunks)


def _decode(data: bytes, name: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = _normalise_newlines(data[: exc.start].decode("utf-8", "replace")).count("\n") + 1
        raise SubmissionFormatError(
            f"{name} is not UTF-8 text: byte 0x{data[exc.start]:02x} on line {line} cannot be decoded. "
            "Save the file as UTF-8 and submit it again."
        ) from None
    if "\0" in text:
        line = _normalise_newlines(text[: text.index("\0")]).count("\n") + 1
        raise SubmissionFormatError(f"{name} contains a NUL byte on line {line}; is it a text file?")
    return text


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _has_code(source: str) -> bool:
    """Whether any line is more than blank space or a comment."""
    return any(line.strip() and not line.lstrip().startswith("#") for line in source.split("\n"))


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "..."


# -- notebooks --------------------------------------------------------------------------------------


def notebook_cells(text: str, name: str = "notebook") -> list[Cell]:
    """The code cells of a notebook's JSON text, after nbformat's schema has accepted it."""
    import nbformat  # only for notebooks: it is slow to import

    try:
        data = json.loads(text)
    except RecursionError:
        raise SubmissionFormatError(f"{name} is not a Jupyter notebook: its JSON is nested too deeply") from None
    except ValueError as exc:
        raise SubmissionFormatError(f"{name} is not a readable Jupyter notebook (invalid JSON: {exc})") from None
    version = data.get("nbformat") if isinstance(data, dict) else None
    if type(version) is not int or not ("cells" in data or "worksheets" in data):
        raise SubmissionFormatError(
            f"{name} is JSON but not a Jupyter notebook (no 'nbformat' version and 'cells'); "
            "save it from Jupyter or submit the .py file"
        )
    if version not in (3, 4):
        raise SubmissionFormatError(
            f"{name} is in notebook format version {version}; the grader reads version 4 (and 3). "
            "Save it from a current Jupyter"
        )
    try:
        with warnings.catch_warnings():  # a missing cell id is only a warning, and Jupyter accepts it
            warnings.simplefilter("ignore")
            nbformat.validate(data)
        notebook = nbformat.convert(nbformat.from_dict(data), 4) if version != 4 else data
    except nbformat.ValidationError as exc:
        raise SubmissionFormatError(f"{name} is not a valid Jupyter notebook: {_where(exc)}") from None
    except Exception as exc:  # nbformat raises several kinds for a version it does not know
        raise SubmissionFormatError(
            f"{name} is not a readable Jupyter notebook: nbformat cannot read format {version}."
            f"{_quote(data.get('nbformat_minor'))} ({type(exc).__name__})"
        ) from None
    cells = []
    for number, cell in enumerate(notebook["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = _cell_text(cell.get("source", ""), number, name)
        source = neutralise_magics(_normalise_newlines(source))
        if source.strip():
            cells.append(Cell(number, 1, source))
    return cells


def _cell_text(source: object, number: int, name: str) -> str:
    """A cell's source as one string (the schema allows a string or a list of strings)."""
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise SubmissionFormatError(f"{name}: cell {number}'s source is not text but {_quote(source)}")
    if "\0" in source:
        raise SubmissionFormatError(f"{name}: cell {number} contains a NUL character")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SubmissionFormatError(
            f"{name}: cell {number} contains an invalid character ({_quote(exc.object[exc.start : exc.end])})"
        ) from None
    return source


def _where(error: Exception) -> str:
    """A validation error as 'cell 3, source: <message>', short."""
    path = list(getattr(error, "absolute_path", None) or getattr(error, "path", None) or [])
    place = []
    if len(path) >= 2 and path[0] == "cells" and isinstance(path[1], int):
        place.append(f"cell {path[1] + 1}")
        path = path[2:]
    place += [str(part) for part in path]
    message = getattr(error, "message", None) or str(error).split("\n", 1)[0]
    if len(message) > MAX_DETAIL:
        message = message[:MAX_DETAIL] + "..."
    return f"{', '.join(place) or 'the notebook'}: {message}"


# -- .py files --------------------------------------------------------------------------------------


def python_cells(text: str) -> list[Cell]:
    """Split a percent-format file on its `# %%` markers; markdown and raw cells are skipped."""
    lines = _normalise_newlines(text).split("\n")
    markers = [i for i, line in enumerate(lines) if _CELL_MARKER.match(line)]
    # (cell number, index of its first source line, index after its last, header)
    spans = []
    if not markers or markers[0] > 0:
        stop = markers[0] if markers else len(lines)
        if _has_code("\n".join(lines[:stop])):
            spans.append((0, stop, ""))
    for k, start in enumerate(markers):
        stop = markers[k + 1] if k + 1 < len(markers) else len(lines)
        marker = _CELL_MARKER.match(lines[start])
        spans.append((start + 1, stop, marker.group(1) if marker else ""))
    cells = []
    for number, (start, stop, header) in enumerate(spans, start=1):
        if any(tag in header for tag in _NOT_CODE):
            continue
        body = "\n".join(lines[start:stop])
        if body.strip():
            source = neutralise_magics(body)
            if source.strip():
                cells.append(Cell(number, start + 1, source))
    return cells


def neutralise_magics(source: str) -> str:
    """`source` with each IPython line (`%magic`, `!cmd`, `x = !cmd`) replaced by `pass` at the same
    indentation; a `%%` cell magic empties the whole cell. Lines are kept one for one."""
    if source.lstrip().startswith("%%"):
        return ""  # a cell magic: the whole cell is for IPython, not Python
    out = []
    for line in _normalise_newlines(source).split("\n"):
        match = _MAGIC_LINE.match(line)
        out.append(f"{match.group(1)}pass  # IPython syntax, not run by the grader" if match else line)
    return "\n".join(out).rstrip("\n") + "\n"
