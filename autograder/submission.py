"""Reading a submission file into code cells, without running any of it.

A `.ipynb` gives its code cells in order; a `.py` is split on jupytext's `# %%` markers (one cell when
it has none). IPython magics, `!` shell escapes and `%%` cell magics are never run: their lines become
`pass`, so line numbers in tracebacks still match the student's file.
"""
from __future__ import annotations

import re
from pathlib import Path


SUFFIXES = (".py", ".ipynb")
MAX_BYTES = 5 << 20
_MAGIC_LINE = re.compile(r"^(\s*)(?:[%!]|\w+\s*=\s*[%!])")
_CELL_MARKER = re.compile(r"^# %%(.*)$")


class SubmissionFormatError(ValueError):
    """The file cannot be read as a submission; the message says what to fix."""


def read_cells(path: Path) -> list[tuple[int, str]]:
    """[(cell number, source), ...] for the code cells of `path`, magics neutralised."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise SubmissionFormatError(f"{path.name}: a submission is a .py or .ipynb file")
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise SubmissionFormatError(f"{path.name} is {size:,} bytes; the limit is {MAX_BYTES:,}")
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SubmissionFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    if path.suffix == ".ipynb":
        return notebook_cells(text, path.name)
    return python_cells(text)


def notebook_cells(text: str, name: str = "notebook") -> list[tuple[int, str]]:
    import nbformat  # only for notebooks: it is slow to import

    try:
        notebook = nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat raises several kinds for malformed JSON
        raise SubmissionFormatError(f"{name} is not a readable Jupyter notebook ({exc})") from None
    cells = []
    for number, cell in enumerate(notebook.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        source = neutralise_magics(cell.get("source", ""))
        if source.strip():
            cells.append((number, source))
    return cells


def python_cells(text: str) -> list[tuple[int, str]]:
    """Split on `# %%` markers; each cell is padded with blank lines so its line numbers are the file's."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if _CELL_MARKER.match(line)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    cells = []
    for number, (start, stop) in enumerate(zip(starts, starts[1:] + [len(lines)]), start=1):
        header = _CELL_MARKER.match(lines[start])
        if header and "[markdown]" in header.group(1):
            continue
        body = "".join(lines[start:stop])
        if body.strip():
            cells.append((number, "\n" * start + body))
    return cells


def neutralise_magics(source: str) -> str:
    if source.lstrip().startswith("%%"):
        return ""  # a cell magic: the whole cell is for IPython, not Python
    out = []
    for line in source.splitlines():
        match = _MAGIC_LINE.match(line)
        out.append(f"{match.group(1)}pass  # IPython syntax, not run by the grader" if match else line)
    return "\n".join(out) + "\n"
