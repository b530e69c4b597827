"""Which part each error raised while the file loaded comes from, so that it is said once, in that part.

A cell that raised while loading is most often a demo or a self-check that uses a part whose code is wrong
or not written yet: its error is that part's mistake met again, in PyTorch's words. It is folded under the
part that made it (`model.LoadReport.cell_parts`): the part its own definitions belong to (a syntax error in
combine's cell is combine's); else, of the parts it uses (by the names it mentions, a self-check by the part
it checks) and what they build on (`contract.BUILDS_ON`), the first in the notebook's order that lost points.
A cell no failing part explains stays on its own, said as it was raised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from autograder.contract import PART_IDS, PART_OF_NAME, with_what_it_builds_on
from autograder.sandbox.protocol import CellProblem

NAME = re.compile(r"[A-Za-z_]\w*")
SELF_CHECK = re.compile(r"^_check_(\w+)\(\)\s*$", re.MULTILINE)
DEFINES = re.compile(r"^(?:(?:async\s+)?def|class)\s+(\w+)|^(\w+)\s*(?::[^=]*)?=(?!=)", re.MULTILINE)
UNDEFINED = re.compile(r"name '(\w+)' is not defined")


def own_part(source: str) -> str | None:
    """The part whose definitions the cell holds (a stub's cell, a syntax error in it), if any."""
    for def_name, assigned in DEFINES.findall(source):
        part = PART_OF_NAME.get(def_name or assigned)
        if part is not None:
            return part
    return None


def used_parts(source: str, problem: CellProblem) -> set[str]:
    """The parts a cell uses: the names it mentions, the part its self-check checks, a name it missed."""
    parts = {PART_OF_NAME[name] for name in NAME.findall(source) if name in PART_OF_NAME}
    parts |= {part for part in SELF_CHECK.findall(source) if part in PART_IDS}
    missing = UNDEFINED.search(problem.message) if problem.type == "NameError" else None
    if missing and missing.group(1) in PART_OF_NAME:
        parts.add(PART_OF_NAME[missing.group(1)])
    return parts


def part_of_problem(source: str, problem: CellProblem, failing: set[str]) -> str | None:
    """The failing part a cell's load-time error comes from, or None when no failing part explains it."""
    own = own_part(source)
    if own is not None and own in failing and problem.type == "SyntaxError":
        return own
    candidates = with_what_it_builds_on(used_parts(source, problem) | ({own} if own else set()))
    return next((part for part in PART_IDS if part in candidates and part in failing), None)


def cell_parts(cells: Iterable[Sequence[object]], problems: Iterable[CellProblem], failing: set[str]) -> dict[str, str]:
    """{cell number (as results.json keys it): part} for the load-time errors a failing part explains."""
    sources = {int(str(cell[0])): str(cell[2]) for cell in cells}
    found = {}
    for problem in problems:
        part = part_of_problem(sources.get(problem.cell, ""), problem, failing)
        if part is not None:
            found[str(problem.cell)] = part
    return found
