"""The sample class, made from the current release: each sample is the release plus one student's answers.

`assignments/samples/<student>.toml` says what the student handed in: the file (`mha.ipynb` or `mha.py`),
which answers the cells not listed get (`reference`: the reference's solution, `release`: the stub left
as released), and the code the student wrote in place of a stub, by the answer cell's id:

    file = "mha.py"
    other_answers = "reference"
    [answers]
    "answer-combine" = '''
    return torch.cat(outputs, dim=1)
    '''

`make release` (`python -m autograder release`) rewrites `assignments/submitted/<student>/mha/` from them,
so a sample never lags behind the release; `python -m autograder.authoring.samples --check` (and a test)
fails, naming the student, when a committed sample is not what the release and the answers make.

An answer replaces the stub (`# YOUR CODE HERE` and `raise NotImplementedError()`) at the stub's
indentation; the reference's answer for a cell is its solution region in reference/mha.py.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import jupytext
import nbformat

from autograder.authoring.release import (
    SOLUTION_BEGIN,
    SOLUTION_END,
    default_root,
    py_notebook,
)
from autograder.contract import ASSIGNMENT
from autograder.rubric import tomllib

STUB = "# YOUR CODE HERE"
RAISE = "raise NotImplementedError()"


class SampleError(ValueError):
    """A sample's answers do not fit the release; the message names the sample and the cell."""


@dataclass
class Sample:
    student: str
    file: str  # mha.ipynb or mha.py
    other_answers: str  # "reference" or "release"
    answers: dict[str, str]  # answer cell id -> the code written in place of its stub


def read_sample(path: Path) -> Sample:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    sample = Sample(path.stem, data["file"], data.get("other_answers", "reference"), dict(data.get("answers", {})))
    if sample.file not in (f"{ASSIGNMENT}.ipynb", f"{ASSIGNMENT}.py"):
        raise SampleError(f"{path.name}: file must be {ASSIGNMENT}.ipynb or {ASSIGNMENT}.py, not {sample.file!r}")
    if sample.other_answers not in ("reference", "release"):
        raise SampleError(f"{path.name}: other_answers must be 'reference' or 'release'")
    return sample


def reference_answers(source_nb: nbformat.NotebookNode) -> dict[str, str]:
    """{answer cell id: its solution region, dedented}, from the nbgrader source notebook."""
    answers = {}
    for cell in source_nb.cells:
        if not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        lines = cell.source.splitlines()
        begin = next(i for i, line in enumerate(lines) if SOLUTION_BEGIN in line)
        end = next(i for i, line in enumerate(lines) if SOLUTION_END in line)
        answers[cell.id] = textwrap.dedent("\n".join(lines[begin + 1 : end]))
    return answers


def fill(source: str, answer: str, where: str) -> str:
    """A released cell with its stub replaced by `answer`, indented as the stub was."""
    lines = source.split("\n")
    stub = next((i for i, line in enumerate(lines) if line.strip() == STUB), None)
    if stub is None or stub + 1 >= len(lines) or lines[stub + 1].strip() != RAISE:
        raise SampleError(f"{where}: the released cell has no stub to replace")
    indent = lines[stub][: len(lines[stub]) - len(lines[stub].lstrip())]
    code = textwrap.indent(textwrap.dedent(answer).strip("\n"), indent, lambda line: bool(line.strip()))
    return "\n".join(lines[:stub] + code.split("\n") + lines[stub + 2 :])


def filled_release(
    release_nb: nbformat.NotebookNode,
    source_nb: nbformat.NotebookNode,
    answers: dict[str, str],
    others: str = "reference",
    where: str = "",
) -> nbformat.NotebookNode:
    """A copy of the release notebook whose answer cells hold `answers` (by cell id); the other answer cells
    get the reference's solution (`others="reference"`) or stay as released."""
    nb: nbformat.NotebookNode = nbformat.reads(nbformat.writes(release_nb), as_version=4)
    solutions = reference_answers(source_nb)
    cells = {cell.id for cell in nb.cells if cell.metadata.get("nbgrader", {}).get("solution")}
    unknown = sorted(set(answers) - cells)
    if unknown:
        raise SampleError(
            f"{where}: no answer cell {', '.join(unknown)} in the release (cells: {', '.join(sorted(cells))})"
        )
    for cell in nb.cells:
        if cell.id in answers:
            cell.source = fill(cell.source, answers[cell.id], f"{where}, cell {cell.id}")
        elif cell.id in cells and others == "reference":
            cell.source = fill(cell.source, solutions[cell.id], f"{where}, cell {cell.id}")
    return nb


def render(nb: nbformat.NotebookNode, file: str) -> str:
    """The text of a submission: the notebook as Jupyter writes it, or the .py twin as the release's."""
    text: str
    if file.endswith(".ipynb"):
        text = nbformat.writes(nb, version=4)
    else:
        text = jupytext.writes(py_notebook(nb), fmt="py:percent")
    return text if text.endswith("\n") else text + "\n"


def course_paths(root: Path) -> tuple[Path, Path, Path]:
    course = root / "assignments"
    return (
        course / "samples",
        course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
        course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
    )


def expected_samples(root: Path | None = None) -> dict[Path, str]:
    """{the sample's submission path: its text}, from the committed release and the answer files."""
    root = Path(root) if root else default_root()
    folder, release, source = course_paths(root)
    release_nb, source_nb = nbformat.read(release, as_version=4), nbformat.read(source, as_version=4)
    out = {}
    for path in sorted(folder.glob("*.toml")):
        sample = read_sample(path)
        nb = filled_release(release_nb, source_nb, sample.answers, sample.other_answers, path.name)
        out[root / "assignments" / "submitted" / sample.student / ASSIGNMENT / sample.file] = render(nb, sample.file)
    return out


def stale_samples(root: Path | None = None) -> list[str]:
    """The students whose committed submission is not the release plus their answers (or is missing)."""
    stale = []
    for path, text in expected_samples(root).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path.parent.parent.name)
    return stale


def write_samples(root: Path | None = None) -> list[Path]:
    """Rewrite every sample's folder: its one submission file, nothing else."""
    written = []
    for path, text in expected_samples(root).items():
        for old in path.parent.glob(f"{ASSIGNMENT}.*"):
            if old != path:
                old.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the committed samples are stale")
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_samples(args.root)
        if stale:
            print(f"stale samples (run `make release`): {', '.join(stale)}", file=sys.stderr)
            return 1
        print("every sample is the release plus its answers")
        return 0
    written = write_samples(args.root)
    print(f"samples: {', '.join(p.parent.parent.name for p in written)} (the release plus each one's answers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
