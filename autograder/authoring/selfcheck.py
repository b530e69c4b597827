"""Run a notebook's self-checks, part by part: the students' own local check.

    python selfcheck.py mha.ipynb        (or mha.py)

It runs the file's code cells in order in one namespace, as "Run All" in Jupyter would, but goes on
past a cell that raises, then reports each self-check cell (one per part: nbgrader's locked grade
cells in a notebook, the cells titled "Self-check: part ..." in the .py, or any cell that defines
`_check_<part>`) as passed, not done yet
(a stub still raises NotImplementedError) or failed, with its message. IPython magics and shell
escapes are skipped. Exit status 0 when every self-check passed, 1 otherwise.

The self-checks use only what the notebook itself contains (the book's running example, shapes,
allowed letters), never the answer key, so this file ships in the student kit unchanged. It runs
the student's code in this process, like the notebook does: it is for checking one's own work. The
grader runs more checks, on hidden inputs, and never in the process that decides the score.

Standard library only (and torch, which the notebook imports).
"""

from __future__ import annotations

import json
import re
import sys
import traceback
from pathlib import Path

TITLE = re.compile(r"^# %%.*\bSelf-check: part (\w+)")
CHECK_FUNCTION = re.compile(r"^def _check_(\w+)\(", re.MULTILINE)  # what every self-check cell defines
MAGIC = re.compile(r"^(\s*)(?:[%!]|\w+\s*=\s*[%!])")


def cells_of(path: Path) -> list[tuple[str | None, str]]:
    """[(part of a self-check cell, or None; source)] for the file's code cells, in order."""
    text = path.read_text(encoding="utf-8")
    cells: list[tuple[str | None, str]] = []
    if path.suffix == ".ipynb":
        for cell in json.loads(text).get("cells", []):
            if cell.get("cell_type") != "code":
                continue
            source = "".join(cell.get("source", ""))
            meta = cell.get("metadata", {}).get("nbgrader", {})
            part = meta.get("grade_id") if meta.get("grade") and not meta.get("solution") else None
            cells.append((part or check_part(source), source))
        return cells
    part, lines, markdown = None, [], False
    for line in text.splitlines() + ["# %% end"]:
        if line.startswith("# %%"):
            if lines and not markdown:
                source = "\n".join(lines)
                cells.append((part or check_part(source), source))
            title = TITLE.match(line)
            part, lines, markdown = (title.group(1) if title else None), [], "[markdown]" in line
        else:
            lines.append(line)
    return cells


def check_part(source: str) -> str | None:
    """The part of a self-check cell that lost its metadata (saved by another editor): `_check_<part>`."""
    found = CHECK_FUNCTION.search(source)
    return found.group(1) if found else None


def without_magics(source: str) -> str:
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join(MAGIC.sub(r"\1pass  # ", line) if MAGIC.match(line) else line for line in source.splitlines())


def run(path: Path) -> int:
    try:
        import torch  # noqa: F401  (the notebook's first cell imports it; say clearly when it is missing)
    except ImportError:
        print(f"{sys.executable} cannot import torch: install it first (pip install torch)", file=sys.stderr)
        return 2
    namespace: dict = {"__name__": "__main__"}
    results: list[tuple[str, str, str]] = []
    for number, (part, source) in enumerate(cells_of(path), start=1):
        try:
            exec(compile(without_magics(source), f"{path.name}, cell {number}", "exec"), namespace)
        except NotImplementedError as exc:
            outcome = ("not done yet", str(exc) or "a stub still raises NotImplementedError")
        except AssertionError as exc:
            outcome = ("failed", str(exc))
        except Exception as exc:
            last = traceback.extract_tb(exc.__traceback__)[-1]
            outcome = ("failed", f"{type(exc).__name__}: {exc} ({last.filename}, line {last.lineno})")
        else:
            outcome = ("passed", "")
        if part is not None:
            results.append((part, *outcome))
        elif outcome[0] != "passed" and outcome[0] != "not done yet":
            print(f"cell {number} raised {outcome[1]}", file=sys.stderr)
    if not results:
        print(f"{path.name}: no self-check cells found (is this the assignment's notebook or .py?)")
        return 1
    width = max(len(part) for part, _, _ in results)
    for part, status, message in results:
        print(f"{part:<{width}}  {status}" + (f": {message}" if message else ""))
    passed = sum(status == "passed" for _, status, _ in results)
    print(f"{passed} of {len(results)} self-checks passed. The grader runs more checks, on inputs you do not see.")
    return 0 if passed == len(results) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python selfcheck.py mha.ipynb|mha.py", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file() or path.suffix not in (".py", ".ipynb"):
        print(f"{path}: not a .py or .ipynb file", file=sys.stderr)
        return 2
    return run(path)


if __name__ == "__main__":
    sys.exit(main())
