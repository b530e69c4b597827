"""Errors raised while the file loads are said once, in the part that made them: a demo or a self-check that
uses a wrong or unwritten part is folded under that part (`grading.load_parts`), the feedback's first line,
the terminal's note and grades.csv's note say the diagnosis in the student's terms, and the untouched release
reads "not done yet", part by part, in one box."""

from __future__ import annotations

import html5lib
import pytest

from autograder.contract import PART_IDS
from autograder.course.feedback import render
from autograder.course.roster import read_roster
from autograder.course.rows import Row
from autograder.grading.load_parts import cell_parts
from autograder.model import NOT_DONE_YET, GradingRun
from autograder.sandbox.protocol import CellProblem
from classkit import make_course
from helpers import ROOT, SAMPLES, grade

RELEASE = ROOT / "assignments" / "release" / "mha" / "mha.py"
NOT_SPEED = [arg for part in PART_IDS if part != "speed" for arg in ("--part", part)]


def test_a_cell_is_folded_under_the_first_failing_part_it_uses_or_builds_on():
    cells = [
        (14, 1, "wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)\nwrapper(batch)\n"),
        (15, 1, "def _check_combine():\n    assert False\n_check_combine()\n"),
        (16, 1, "def combine(outputs):\n    return torch.cat(outputs, dim=-1\n"),
        (17, 1, "print(undefined_thing)\n"),
        (18, 1, "mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)\n"),
    ]
    problems = [
        CellProblem(14, "RuntimeError", "Sizes of tensors must match"),
        CellProblem(15, "AssertionError", "combine returned shape (2, 12, 2)"),
        CellProblem(16, "SyntaxError", "'(' was never closed"),
        CellProblem(17, "NameError", "name 'undefined_thing' is not defined"),
        CellProblem(18, "RuntimeError", "an error of its own"),
    ]
    # the wrapper builds on combine, which lost points: the demo's error is combine's; the wrapper kept its own
    assert cell_parts(cells, problems, {"combine"}) == {"14": "combine", "15": "combine", "16": "combine"}
    # a part that lost nothing explains nothing: mha's demo stays on its own, as raised
    assert "18" not in cell_parts(cells, problems, {"combine", "wrapper"})
    assert cell_parts(cells, problems, {"mha"}) == {"18": "mha"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The sample casey (combine joins along the token dimension, a wrong quiz answer) and the untouched
    release, graded for real (without the speed part)."""
    paths = {"casey": SAMPLES / "casey" / "mha" / "mha.py", "release": RELEASE}
    graded = {}
    for name, path in paths.items():
        results, _ = grade(path, tmp_path_factory.mktemp(name), *NOT_SPEED)
        graded[name] = GradingRun.from_gradescope(results)
    return graded


def page_of(tmp_path, run: GradingRun):
    course = make_course(tmp_path, {"casey": {"mha.py": ""}})
    (entry,) = read_roster(course)
    page = html5lib.HTMLParser(namespaceHTMLElements=False).parse(render(Row(entry, run), False, "x"))
    return page, Row(entry, run)


def boxes(page) -> list[str]:
    return [" ".join("".join(p.itertext()).split()) for p in page.iter("p") if "problem" in p.get("class", "")]


def test_a_wrong_part_raising_in_other_cells_is_one_box_in_that_part_and_the_headline_names_it(graded, tmp_path):
    run = graded["casey"]
    assert len(run.load.cells) >= 2 and set(run.load.cell_parts.values()) == {"combine"}
    page, row = page_of(tmp_path, run)
    said = boxes(page)
    assert len([box for box in said if box.startswith("While loading")]) == 1, said
    section = page.find(".//section[@id='part-combine']")
    assert any("While loading" in " ".join(p.itertext()) for p in section.iter("p")), said
    raw = [c.message for c in run.load.cells if c.type == "RuntimeError"]
    for text in (said[0], run.headline(), row.note()):  # the first line, the terminal's and grades.csv's note
        assert not any(message in text for message in raw), text
    combine = next(p for p in run.parts() if p.part == "combine")
    assert run.diagnosis(combine) in run.headline() and "token dimension" in run.diagnosis(combine)


def test_the_untouched_release_reads_not_done_yet_part_by_part_in_one_box(graded, tmp_path):
    run = graded["release"]
    assert len(run.load.cells) > 10 and not run.load.loose_lines()
    page, row = page_of(tmp_path, run)
    said = boxes(page)
    assert len(said) == 1 and said[0].startswith(NOT_DONE_YET), said
    assert all(run.titles[part] in said[0] for part in PART_IDS if part != "speed")
    assert row.note().startswith(NOT_DONE_YET)
