"""One score: every output shows the same total and the same part scores for one grading.

The scores are made once (`scoring.score`); results.json, its reading back, grades.csv, the Canvas file, the
feedback page, the terminal summaries, GitHub Classroom's runner result and nbgrader's gradebook with its
export all write them. Hypothesis draws rubrics, checks, cases, outcomes and partial credits; every writer
must agree, to the hundredth, with every other.
"""

from __future__ import annotations

import csv
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from autograder.course.class_outputs import canvas_csv, grades_csv, students_table
from autograder.course.feedback import render
from autograder.course.roster import SUBMITTED, Entry
from autograder.course.rows import Row
from autograder.grading.report import print_summary
from autograder.grading.scoring import Outcome, score
from autograder.model import FAILED, GRADED, NOT_CREDITED, PASSED, GradingRun
from autograder.platforms.classroom import runner_result
from autograder.rubric import Rubric, load_rubric
from rubric_text import rubric_file

PARTS = ("quiz", "combine", "wrapper", "two_dim", "mha", "fuse")
STATUSES = (PASSED, FAILED, NOT_CREDITED)


def same(value: float | str) -> str:
    """A score as two decimals, so that 85.6 and 85.60 compare equal and 85.63 and 85.62 do not."""
    return f"{float(value):.2f}"


@st.composite
def gradings(draw: st.DrawFn) -> tuple[str, list[Outcome]]:
    """A rubric's parts and tests, and the outcomes of one grading under it."""
    parts = draw(st.lists(st.sampled_from(PARTS), min_size=1, max_size=4, unique=True))
    rubric, outcomes = [], []
    for part in parts:
        points = draw(st.integers(0, 4000)) / draw(st.sampled_from([1, 2, 4, 10, 100]))
        points = round(points, 2)
        rubric.append(f"[parts.{part}]\npoints = {points}\n")
        for check in range(draw(st.integers(1, 4))):
            key = f"{part}::test_{check}"
            weight = draw(st.sampled_from([0.5, 1, 2, 3, 4, 7] if check == 0 else [0, 0.5, 1, 2, 3, 4, 7]))
            rubric.append(f'[tests."{key}"]\nweight = {weight}\n')
            cases = draw(st.integers(1, 7))
            for case in range(cases):
                status = draw(st.sampled_from(STATUSES))
                credit = draw(st.none() | st.floats(0, 1)) if status == FAILED else None  # partial credit
                outcomes.append(
                    Outcome(
                        key,
                        part,
                        f"check {check}",
                        status,
                        f"{status} {case}",
                        credit=credit,
                        case=f"case {case}" if cases > 1 else "",
                    )
                )
    return "".join(rubric), outcomes


def writers(run: GradingRun, rubric: Rubric) -> dict[str, tuple[str, dict[str, str]]]:
    """Per output: the total and each part's score, as that output writes them. As in a grading: the
    terminal and the platforms read the run itself; the class outputs read the results.json stored."""
    said: dict[str, tuple[str, dict[str, str]]] = {}
    results = json.loads(json.dumps(run.to_gradescope()))
    by_tag: dict[str, float] = {}
    for test in results["tests"]:
        by_tag[test["tags"][0]] = by_tag.get(test["tags"][0], 0.0) + test["score"]
    said["results.json"] = (same(results["score"]), {p: same(s) for p, s in by_tag.items()})
    stored = GradingRun.from_gradescope(results)
    said["results.json read back"] = (same(stored.score), {p.part: same(p.score) for p in stored.parts()})

    row = Row(Entry("ada", SUBMITTED, Path("mha.py")), stored)
    (header, line) = list(csv.reader(io.StringIO(grades_csv([row], rubric))))
    cells = dict(zip(header, line))
    said["grades.csv"] = (same(cells["score"]), {p.part: same(cells[p.part]) for p in stored.parts()})
    canvas = list(csv.reader(io.StringIO(canvas_csv([row], rubric))))
    said["Canvas"] = (same(canvas[2][5]), {})

    page = render(row)
    total = re.search(r'class="total">Score: ([0-9.]+) /', page)
    headings = re.findall(r"<h2><span>([^<]*)</span><span>([0-9.]+) / [0-9.]+</span></h2>", page)
    titles = {p.title: p.part for p in stored.parts()}
    said["feedback page"] = (same(total.group(1)), {titles[t]: same(s) for t, s in headings if t in titles})

    console = Console(record=True, width=200)
    console.print(students_table([row]))
    said["class table"] = (same(re.search(r"│\s+([0-9.]+) / [0-9.]+ │", console.export_text()).group(1)), {})

    console = Console(record=True, width=200)
    print_summary(run, console=console)
    text = console.export_text()
    parts = {m.group(1): same(m.group(2)) for m in re.finditer(r"│ (\w+)\s+│\s+\d+/\d+ │\s+([0-9.]+)/", text)}
    said["terminal"] = (same(re.search(r"Total: ([0-9.]+) /", text).group(1)), parts)

    classroom = runner_result(run)
    said["GitHub Classroom"] = (
        same(sum(t["score"] for t in classroom["tests"]) / 100),
        {p.part: same(t["score"] / 100) for p, t in zip(run.parts(), classroom["tests"])},
    )
    return said


def disagreements(run: GradingRun, rubric: Rubric) -> list[str]:
    said = writers(run, rubric)
    totals = {name: total for name, (total, _) in said.items()}
    problems = [f"totals differ: {totals}"] if len(set(totals.values())) > 1 else []
    for part in run.parts():
        scores = {name: parts[part.part] for name, (_, parts) in said.items() if part.part in parts}
        if len(set(scores.values())) > 1:
            problems.append(f"{part.part} differs: {scores}")
    return problems


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gradings())
def test_every_output_shows_the_same_total_and_part_scores(grading):
    text, outcomes = grading
    with tempfile.TemporaryDirectory() as folder:
        rubric = rubric_file(Path(folder), text)
    run = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric), titles={p: p for p in rubric.parts})
    assert disagreements(run, rubric) == []
    # a part's checks share exactly its points, and the total is exactly the sum of the parts as shown
    for part in run.parts():
        assert same(part.max_score) == same(rubric.part_points(part.part))
    assert same(run.score) == same(sum(round(float(same(p.score)) * 100) for p in run.parts()) / 100)


# The checks of a grading on the CPU, and how many cases each has.
CPU_CHECKS = {
    "quiz::test_answer_is_a_choice": 2,
    "quiz::test_answer": 2,
    "combine::test_book_example": 1,
    "combine::test_concatenates_heads": 5,
    "combine::test_keeps_dtype": 1,
    "wrapper::test_book_example": 1,
    "wrapper::test_heads_run_once_in_order_on_same_input": 1,
    "wrapper::test_matches_reference": 8,
    "wrapper::test_input_not_modified": 1,
    "wrapper::test_gradients": 1,
    "wrapper::test_dropout": 1,
    "two_dim::test_two_heads_of_width_one": 2,
    "two_dim::test_book_example": 1,
    "two_dim::test_passes_dropout_and_bias_on": 1,
    "two_dim::test_output_is_the_heads_side_by_side": 2,
    "columns::test_head_column_ranges": 8,
    "columns::test_rejects_bad_splits": 7,
    "columns::test_eight_columns_four_heads": 1,
    "columns::test_split_columns": 5,
    "mha::test_book_example": 1,
    "mha::test_shorter_sequences": 1,
    "mha::test_matches_reference": 10,
    "mha::test_keeps_dtype": 1,
    "mha::test_input_not_modified": 1,
    "mha::test_new_inputs_new_answers": 1,
    "mha::test_gradients": 1,
    "mha::test_one_pass_for_all_heads": 1,
    "mha::test_no_ready_made_attention": 1,
    "mha::test_dropout": 1,
    "fuse::test_weights_placed_per_head": 4,
    "fuse::test_keeps_dtype_and_device": 1,
    "fuse::test_fused_output_equals_wrapper": 4,
    "fuse::test_wrapper_left_unchanged": 1,
    "speed::test_faster_than_the_wrapper": 1,
}


def test_a_fuse_mistake_worth_an_odd_share_is_one_score_everywhere():
    """The case that was found: three of fuse_heads' four weight cases failed (5.625 points by the former
    shares) and nothing else; results.json said 94.38, and grades.csv, the Canvas file and the feedback page,
    made from the stored results.json, said 94.37."""
    outcomes = []
    for key, cases in CPU_CHECKS.items():
        for case in range(cases):
            wrong = key == "fuse::test_weights_placed_per_head" and case > 0
            outcomes.append(
                Outcome(
                    key,
                    key.split("::")[0],
                    key,
                    FAILED if wrong else PASSED,
                    "wrong" if wrong else "",
                    case=str(case) if cases > 1 else "",
                )
            )
    rubric = load_rubric()
    run = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric), titles={p: p for p in rubric.parts})
    assert disagreements(run, rubric) == []


@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gradings())
def test_the_gradebook_and_nbgrader_export_show_the_same_scores(grading):
    """nbgrader's gradebook (each part a grade cell) adds the parts up itself, and `nbgrader export` writes
    that sum: the same total as results.json, to the hundredth, and the same text as grades.csv."""
    from nbgrader.api import Gradebook

    from autograder.course.gradebook import write_grades
    from autograder.course.nbgrader_export import export_rows

    text, outcomes = grading
    with tempfile.TemporaryDirectory() as folder:
        rubric = rubric_file(Path(folder), text)
        run = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric), titles={p: p for p in rubric.parts})
        stored = GradingRun.from_gradescope(json.loads(json.dumps(run.to_gradescope())))
        row = Row(Entry("ada", SUBMITTED, Path("mha.py")), stored)
        url = f"sqlite:///{folder}/gradebook.db"
        write_grades(url, "course", [row], rubric, "mha")
        with Gradebook(url) as gradebook:
            (header, line) = export_rows(gradebook, [], [])
            cells = dict(zip(header, line))
            submission = gradebook.find_submission_notebook("mha", "mha", "ada")
            parts = {grade.name: same(grade.score) for grade in submission.grades}
        grades = dict(zip(*csv.reader(io.StringIO(grades_csv([row], rubric)))))
    assert cells["score"] == grades["score"] and same(cells["score"]) == same(run.score)
    assert parts == {p.part: same(p.score) for p in run.parts() if p.max_score}  # nbgrader keeps no 0-point cell
