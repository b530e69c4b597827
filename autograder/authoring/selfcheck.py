"""Run a notebook's self-checks, part by part: the students' own local check.

    python selfcheck.py mha.ipynb        (or mha.py)
    python selfcheck.py                  (the one of mha.ipynb and mha.py being worked in, saying which)

It runs the file's code cells in order in one namespace, as "Run All" in Jupyter would, but goes on
past a cell that raises. A self-check cell is one per part: nbgrader's locked grade cells in a notebook,
the cells titled "Self-check: part ..." in the .py, or any cell that defines `_check_<part>`. Each one
ends with a call of its `_check_<part>()`, whose value (what Jupyter shows under the cell) is its verdict:

- `passed: ...`: everything this self-check looks at is right;
- `waiting: ...`: the part's own code looks right, but what it produces depends on another part that is
  not right or not written yet (the message names it);
- `answered: ...`: the quiz, whose answers only the grader can judge;
- a syntax error is `failed` in the part whose cell has it (the part of the next self-check), and makes
  the self-checks of other parts that need what the cell defines `waiting`;
- a stub that still raises NotImplementedError is `not done yet` (but `waiting` when its message starts with
  "waiting: ": the speed part's self-check, which has no code of its own, raises so while part 6 is a stub,
  so that the untouched notebook earns nothing under nbgrader either); an AssertionError is `failed`, with
  the self-check's message; any other exception is `failed` with where it was raised.

Only `passed` counts as passed; the exit status is 0 when every part is `passed` or `answered`, 1 otherwise.

Where a problem is, is said the way the grader says it: `File "<mha.py, cell 41>", line 187`: the cell as
Jupyter or the `# %%` markers number it (markdown cells included, from 1), and the line of the file (of the
cell, in a notebook). IPython magics and shell escapes are skipped, keeping every line where it is.

The self-checks use only what the notebook itself contains (the book's running example, shapes, allowed
letters), never the answer key, so this file ships in the student kit unchanged. It runs the student's
code in this process, like the notebook does: it is for checking one's own work. The grader runs more
checks, on hidden inputs, and never in the process that decides the score.

Standard library only (and torch, which the notebook imports).
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, NamedTuple

ASSIGNMENT = "mha"
TITLE = re.compile(r"^# %%.*\bSelf-check: part (\w+)")
CHECK_FUNCTION = re.compile(r"^def _check_(\w+)\(", re.MULTILINE)  # what every self-check cell defines
CELL_MARKER = re.compile(r"^# %%(.*)")
NOT_CODE = ("[markdown]", "[md]", "[raw]")
MAGIC = re.compile(r"^(\s*)(?:[%!]|\w+\s*=\s*[%!])")
STUB = "# YOUR CODE HERE"  # what the release leaves in each answer cell
VERDICT = re.compile(r"(passed|waiting|answered): (.*)", re.DOTALL)
PASSED, WAITING, ANSWERED, NOT_DONE, FAILED = "passed", "waiting", "answered", "not done yet", "failed"


class Cell(NamedTuple):
    number: int  # as the student sees it: markdown cells count too, from 1
    line: int  # the line of the file where the cell's code starts (1 in a notebook: a cell's own lines)
    part: str | None  # the part of a self-check cell
    source: str


def cells_of(path: Path) -> list[Cell]:
    """The file's code cells, numbered as the grader numbers them (autograder/grading/submission.py)."""
    text = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    if path.suffix == ".ipynb":
        cells = []
        for number, cell in enumerate(json.loads(text).get("cells", []), start=1):
            if cell.get("cell_type") != "code":
                continue
            source = "".join(cell.get("source", ""))
            meta = cell.get("metadata", {}).get("nbgrader", {})
            part = meta.get("grade_id") if meta.get("grade") and not meta.get("solution") else None
            if source.strip():
                cells.append(Cell(number, 1, part or check_part(source), source))
        return cells
    lines = text.split("\n")
    markers = [i for i, line in enumerate(lines) if CELL_MARKER.match(line)]
    spans = []  # (index of the first source line, index after the last, the marker's line or "")
    if not markers or markers[0] > 0:
        stop = markers[0] if markers else len(lines)
        if any(line.strip() and not line.lstrip().startswith("#") for line in lines[:stop]):
            spans.append((0, stop, ""))
    for k, start in enumerate(markers):
        spans.append((start + 1, markers[k + 1] if k + 1 < len(markers) else len(lines), lines[start]))
    cells = []
    for number, (start, stop, header) in enumerate(spans, start=1):
        source = "\n".join(lines[start:stop])
        if any(tag in header for tag in NOT_CODE) or not source.strip():
            continue
        title = TITLE.match(header)
        cells.append(Cell(number, start + 1, title.group(1) if title else check_part(source), source))
    return cells


def check_part(source: str) -> str | None:
    """The part of a self-check cell that lost its metadata (saved by another editor): `_check_<part>`."""
    found = CHECK_FUNCTION.search(source)
    return found.group(1) if found else None


def without_magics(source: str) -> str:
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join(MAGIC.sub(r"\1pass  # ", line) if MAGIC.match(line) else line for line in source.split("\n"))


def cell_name(path: Path, cell: Cell) -> str:
    return f"<{path.name}, cell {cell.number}>"


def run_cell(path: Path, cell: Cell, namespace: dict[str, Any]) -> Any:
    """Run one cell as Jupyter does, and return the value of its last line when that is an expression.
    Its line numbers are the file's, so a traceback points where the student looks."""
    name = cell_name(path, cell)
    source = without_magics(cell.source)
    linecache.cache[name] = (len(source), None, [""] * (cell.line - 1) + source.splitlines(True), name)
    tree = ast.parse("\n" * (cell.line - 1) + source, name)  # the file's line numbers, a SyntaxError's too
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
    else:
        last = None
    exec(compile(tree, name, "exec"), namespace)
    if last is not None:
        return eval(compile(ast.Expression(last.value), name, "eval"), namespace)
    return None


def where(path: Path, exc: BaseException) -> str:
    """The deepest frame of the traceback that is in the student's file, as the grader shows it."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.filename.startswith(f"<{path.name}, cell"):
        return f'File "{exc.filename}", line {exc.lineno}'
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(f"<{path.name}, cell")]
    return "".join(traceback.format_list(frames[-1:])).strip()


def verdict(value: object) -> tuple[str, str]:
    """A self-check's returned value as (status, message)."""
    found = VERDICT.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return FAILED, f"the self-check gave no verdict (was its cell edited?): {value!r:.200}"
    return found.group(1), found.group(2)


class Outcome(NamedTuple):
    status: str
    message: str
    missing: str | None = None  # the name a NameError says is not defined


def outcome_of(path: Path, cell: Cell, namespace: dict[str, Any]) -> Outcome:
    try:
        value = run_cell(path, cell, namespace)
    except NotImplementedError as exc:
        said = str(exc)
        if said.startswith(f"{WAITING}: "):  # a part with no code of its own, whose part is a stub: it waits
            return Outcome(WAITING, said.removeprefix(f"{WAITING}: "))
        return Outcome(NOT_DONE, said or "a stub still raises NotImplementedError")
    except AssertionError as exc:
        return Outcome(FAILED, str(exc))
    except Exception as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, NameError) else None
        return Outcome(FAILED, f"{type(exc).__name__}: {exc}\n    {where(path, exc)}", missing)
    return Outcome(*verdict(value)) if cell.part is not None else Outcome(PASSED, "")


DEFINES = re.compile(r"^(?:(?:async\s+)?def|class)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=(?!=)", re.MULTILINE)


def defined_names(source: str) -> set[str]:
    """The top-level names a cell defines (functions, classes, assignments), read without running it."""
    return {def_name or assigned for def_name, assigned in DEFINES.findall(source)}


def syntax_error(path: Path, cell: Cell) -> tuple[str, int] | None:
    """The one diagnosis of a cell that cannot be parsed, and its line (the file's): where it is, and what."""
    try:
        ast.parse("\n" * (cell.line - 1) + without_magics(cell.source), cell_name(path, cell))
    except SyntaxError as exc:
        code = (exc.text or "").strip()
        said = f"{path.name}, cell {cell.number}, line {exc.lineno}: SyntaxError: {exc.msg}"
        return said + (f"\n    {code}" if code else ""), exc.lineno or cell.line
    return None


def run(path: Path) -> int:
    try:
        import torch  # noqa: F401  (the notebook's first cell imports it; say clearly when it is missing)
    except ImportError:
        print(
            f"{sys.executable} cannot import torch: set up the virtualenv first (see README.md)",
            file=sys.stderr,
        )
        return 2
    namespace: dict[str, Any] = {"__name__": "__main__"}
    results: list[tuple[str, str, str]] = []
    unparsed: dict[str, tuple[str, str | None]] = {}  # a name an unparsable cell defines -> (where, its part)
    cells = cells_of(path)
    for cell in cells:
        broken = syntax_error(path, cell)
        if broken:  # one diagnosis, where the file has it: failed in its own part, what else needs it waits
            said, at = broken
            print(said, file=sys.stderr)
            where_and_part = (f"cell {cell.number} (line {at})", owner(cells, cell))
            unparsed.update(dict.fromkeys(defined_names(cell.source), where_and_part))
            if cell.part is not None:
                results.append((cell.part, FAILED, f"this self-check's cell cannot run: {said}"))
            continue
        status, message, missing = outcome_of(path, cell, namespace)
        if missing is not None and missing in unparsed:
            cell_at, part = unparsed[missing]
            own = part == cell.part
            status, message = (
                FAILED if own else WAITING,
                f"{cell_at}, which defines {missing}, has a syntax error (above): fix it, and this self-check runs",
            )
        if cell.part is not None:
            results.append((cell.part, status, message))
        elif status == FAILED:
            print(f"{path.name}, cell {cell.number} raised {message}", file=sys.stderr)
    if not results:
        print(f"{path.name}: no self-check cells found (is this the assignment's notebook or .py?)")
        return 1
    width = max(len(part) for part, _, _ in results)
    for part, status, message in results:
        print(f"{part:<{width}}  {status}" + (f": {message}" if message else ""))
    counts = {status: sum(s == status for _, s, _ in results) for status in (PASSED, ANSWERED)}
    line = f"{counts[PASSED]} of {len(results)} self-checks passed"
    if counts[ANSWERED]:
        line += f", {counts[ANSWERED]} answered (the grader decides whether the answers are right)"
    print(f"{line}. The grader runs more checks, on inputs you do not see.")
    return 0 if counts[PASSED] + counts[ANSWERED] == len(results) else 1


def owner(cells: list[Cell], cell: Cell) -> str | None:
    """The part a cell's code belongs to: the part of the first self-check after it (each part's cells come
    before its self-check), or None after the last."""
    return next((c.part for c in cells if c.number > cell.number and c.part is not None), None)


def stubs_left(cells: list[Cell]) -> int:
    return sum(line.strip() == STUB for cell in cells for line in cell.source.split("\n"))


def file_to_check(folder: Path) -> tuple[Path | None, str]:
    """With no file named: the one of mha.ipynb and mha.py the student works in, and why it was chosen.
    The one with fewer stubs left; with as many, the one changed last; when both hold the same code (as
    unpacked), the notebook."""
    found = [folder / f"{ASSIGNMENT}{suffix}" for suffix in (".ipynb", ".py")]
    found = [p for p in found if p.is_file()]
    if not found:
        return None, f"neither {ASSIGNMENT}.ipynb nor {ASSIGNMENT}.py is in {folder.resolve()}"
    if len(found) == 1:
        return found[0], f"checking {found[0].name}"
    notebook, script = found
    code = {path: cells_of(path) for path in found}
    if [c.source.strip() for c in code[notebook]] == [c.source.strip() for c in code[script]]:
        return notebook, f"checking {notebook.name} ({notebook.name} and {script.name} hold the same code)"
    left = {path: stubs_left(cells) for path, cells in code.items()}
    other = {notebook: script, script: notebook}
    if left[notebook] != left[script]:
        chosen = min(found, key=lambda p: left[p])
        why = f"the one with fewer stubs left ({left[chosen]}; {other[chosen].name} has {left[other[chosen]]})"
    else:
        chosen = max(found, key=lambda p: os.stat(p).st_mtime_ns)
        why = f"the one of {notebook.name} and {script.name} changed last"
    return chosen, f"checking {chosen.name}, {why}; python selfcheck.py {other[chosen].name} checks the other"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1:
        print(f"usage: python selfcheck.py [{ASSIGNMENT}.ipynb|{ASSIGNMENT}.py]", file=sys.stderr)
        return 2
    path: Path | None
    if argv:
        path = Path(argv[0])
    else:
        path, why = file_to_check(Path.cwd())
        print(why)
        if path is None:
            return 2
    if not path.exists():
        print(f"{path}: no such file (is the name right, and are you in its folder?)", file=sys.stderr)
        return 2
    if not path.is_file() or path.suffix not in (".py", ".ipynb"):
        print(f"{path}: not a .py or .ipynb file", file=sys.stderr)
        return 2
    return run(path)


if __name__ == "__main__":
    sys.exit(main())
