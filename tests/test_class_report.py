"""class.html, the class report for the instructor: scores per part, the speed part's relative speedups, the
class's mistakes ranked from the checks' structured diagnoses, the students without a score linked to their
feedback pages, hidden details withheld until the release; valid, escaped, and drawn by a real browser."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import html5lib
import pytest

from autograder.course.class_report import (
    BAND_COLOURS,
    SCORE_COLOUR,
    class_mistakes,
    render,
    report_path,
    speed_points,
)
from autograder.course.feedback import write_feedback
from autograder.course.roster import read_roster
from autograder.course.rows import Row, feedback_path
from autograder.course.store import COURSE_FILE_MODE
from autograder.grading.checks import harness  # torch, imported before pytester runs checks that import it
from autograder.grading.plugin import ResultsPlugin
from autograder.grading.scoring import Outcome, score
from autograder.model import (
    CANNOT_GRADE,
    FAILED,
    NOT_CREDITED,
    NOT_DONE_STUB,
    NOT_DONE_UNANSWERED,
    NOT_DONE_YET,
    NOT_ONE_PASS,
    PASSED,
    CheckResult,
    GradingRun,
)
from autograder.rubric import load_rubric
from browser import plots_in, quantised
from classkit import ROOT, fill_record, make_course, synthetic_run
from helpers import SAMPLES, autograder, grade
from rubric_text import rubric_file

pytest_plugins = ["pytester"]

TYPO = "a typo in the head split (common mistake: a half-done weight split)"
DTYPE = "the output does not keep the input's dtype"


def failed(key: str, mistake: str = "", visibility: str = "visible", message: str = "") -> CheckResult:
    part = key.split("::")[0]
    return CheckResult(
        key, part, key.split("::")[1], FAILED, 0.0, 5.0, message or "it went wrong", visibility, mistake=mistake
    )


def passed(key: str) -> CheckResult:
    return CheckResult(key, key.split("::")[0], key.split("::")[1], PASSED, 5.0, 5.0)


def rows_of(tmp_path: Path, runs: dict[str, GradingRun | None], without_file: tuple[str, ...] = ()) -> list[Row]:
    course = make_course(tmp_path, {s: ({} if s in without_file else {"mha.py": ""}) for s in runs})
    return [Row(entry, runs[entry.student]) for entry in read_roster(course)]


def parse_strict(page: str):
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(page)


def text_of(element) -> str:
    return " ".join("".join(element.itertext()).split())


def mistake_rows(page: str) -> list[tuple[int, str, str, list[str]]]:
    """The page's mistakes table: (students, mistake, part, the students linked) per row, top to bottom."""
    table = parse_strict(page).find(".//section[@id='mistakes']/table")
    rows = []
    for tr in table.find("tbody").findall("tr"):
        cells = tr.findall("td")
        who = [a.text for a in cells[1].iter("a")]
        words = " ".join((cells[1].text or "").split()) or text_of(cells[1].find("span"))
        rows.append((int(text_of(cells[0])), words, text_of(cells[2]), who))
    return rows


# -- the mistakes, from the structured diagnoses ----------------------------------------------------------


def test_mistakes_are_ranked_by_students_once_per_student_and_part_from_the_structured_key(tmp_path):
    """The count comes from `CheckResult.mistake`, never from the message: a message that says another mistake
    changes nothing. A mistake met by several checks (and cases) of one student's part counts that student once;
    the same words in another part are another row; failures that named no mistake count once per part; a check
    that was not credited counts nothing."""
    runs: dict[str, GradingRun | None] = {
        "ann": synthetic_run(
            "mha.py",
            checks=[
                failed("mha::test_values", TYPO, message=f"Likely mistake: {DTYPE}"),  # the message misleads
                failed("mha::test_dropout", TYPO),
                failed("wrapper::test_values", DTYPE),
            ],
        ),
        "bob": synthetic_run("mha.py", checks=[failed("mha::test_values", TYPO), failed("mha::test_dtype", DTYPE)]),
        "cat": synthetic_run(
            "mha.py",
            checks=[
                failed("mha::test_values", TYPO),
                failed("quiz::test_answer"),
                failed("quiz::test_other"),
                CheckResult(
                    "mha::test_loop", "mha", "loop", NOT_CREDITED, 0.0, 5.0, "not credited: ...", mistake="gated"
                ),
            ],
        ),
        "dan": synthetic_run("mha.py", checks=[passed("mha::test_values")]),
    }
    ranked = class_mistakes(rows_of(tmp_path, runs), released=False).ranked
    assert [(m.part, m.words, list(m.students)) for m in ranked] == [
        ("mha", TYPO, ["ann", "bob", "cat"]),
        ("wrapper", DTYPE, ["ann"]),
        ("mha", DTYPE, ["bob"]),
        ("quiz", "", ["cat"]),
    ]
    assert ranked[0].checks == {"mha::test_values", "mha::test_dropout"}
    assert ranked[-1].checks == {"quiz::test_answer", "quiz::test_other"}
    page = render(rows_of(tmp_path / "page", runs), load_rubric())
    assert mistake_rows(page) == [
        (3, TYPO, "mha", ["ann", "bob", "cat"]),
        (1, DTYPE, "wrapper", ["ann"]),
        (1, DTYPE, "mha", ["bob"]),
        (1, "failed checks that named no known mistake", "quiz", ["cat"]),
    ]
    assert "gated" not in page


def test_a_part_not_done_and_a_loop_over_heads_count_once_per_student(tmp_path):
    """A part left a stub is one "not done yet" (its failures that named no mistake are not counted again as
    naming none), an answer left None is "not done yet" (not a failed check), and a loop over heads, which
    the mha structure check names and the speed part pays for, is one mistake, found by both checks. A part
    that fails without a stub keeps its row of failures that named none."""
    loop = "the heads are computed one at a time (a loop over heads)"
    runs: dict[str, GradingRun | None] = {
        "ann": synthetic_run(
            "mha.py",
            checks=[
                failed("columns::test_head_column_ranges", NOT_DONE_STUB),
                failed("columns::test_eight_columns_four_heads"),  # met the stub through another function
                failed("quiz::test_answer_is_a_choice", NOT_DONE_UNANSWERED),
                failed("quiz::test_answer"),
            ],
        ),
        "bob": synthetic_run(
            "mha.py",
            checks=[
                failed("mha::test_one_pass_for_all_heads", loop),
                failed("speed::test_faster_than_the_wrapper", NOT_ONE_PASS),
                failed("fuse::test_values"),
            ],
        ),
        "cat": synthetic_run("mha.py", checks=[failed("speed::test_faster_than_the_wrapper", NOT_ONE_PASS)]),
    }
    ranked = class_mistakes(rows_of(tmp_path, runs), released=False).ranked
    assert sorted((m.part, m.words, list(m.students)) for m in ranked) == [
        ("columns", NOT_DONE_YET, ["ann"]),
        ("fuse", "", ["bob"]),
        ("mha", loop, ["bob"]),
        ("quiz", NOT_DONE_YET, ["ann"]),
        ("speed", NOT_ONE_PASS, ["cat"]),  # too slow without the loop the structure check names: its own
    ]
    by_words = {(m.part, m.words): m for m in ranked}
    assert by_words[("mha", loop)].checks == {"mha::test_one_pass_for_all_heads", "speed::test_faster_than_the_wrapper"}
    assert by_words[("columns", NOT_DONE_YET)].checks == {
        "columns::test_head_column_ranges",
        "columns::test_eight_columns_four_heads",
    }
    rows = mistake_rows(render(rows_of(tmp_path / "page", runs), load_rubric()))
    assert sum(students for students, *_ in rows) == 5
    assert ("quiz", "failed checks that named no known mistake") not in {(part, words) for _, words, part, _ in rows}


def test_hidden_checks_mistakes_are_counted_before_the_release_and_named_after_it(tmp_path):
    """As on the feedback pages: what a check `after_due_date` found is named only once released; a `hidden`
    check's mistake is never named. Before, the page counts them, and a student whose mistake a visible check
    also found is counted under it, not twice."""
    runs: dict[str, GradingRun | None] = {
        "ann": synthetic_run("mha.py", checks=[failed("mha::test_hidden_sizes", "LATER-MISTAKE", "after_due_date")]),
        "bob": synthetic_run(
            "mha.py",
            checks=[failed("mha::test_values", TYPO), failed("mha::test_hidden_sizes", TYPO, "after_due_date")],
        ),
        "cat": synthetic_run(
            "mha.py",
            checks=[
                failed("mha::test_hidden_sizes", TYPO, "after_due_date"),
                failed("mha::test_secret", "NEVER-MISTAKE", "hidden"),
            ],
        ),
    }
    before = render(rows_of(tmp_path / "before", runs), load_rubric(), released=False)
    after = render(rows_of(tmp_path / "after", runs), load_rubric(), released=True)
    assert "LATER-MISTAKE" not in before and "NEVER-MISTAKE" not in before and "test_hidden_sizes" not in before
    assert mistake_rows(before) == [(1, TYPO, "mha", ["bob"])]
    withheld = [text_of(p) for p in parse_strict(before).iterfind(".//section[@id='mistakes']/p[@class='withheld']")]
    assert withheld == [
        "Checks on hidden inputs found 2 more mistakes, made by 2 students: named after the due date.",
        "Checks whose details are never shown found 1 more mistake, made by 1 student.",
    ]
    assert mistake_rows(after) == [(2, TYPO, "mha", ["bob", "cat"]), (1, "LATER-MISTAKE", "mha", ["ann"])]
    assert "NEVER-MISTAKE" not in after and "test_secret" not in after
    assert [text_of(p) for p in parse_strict(after).iterfind(".//p[@class='withheld']")] == [
        "Checks whose details are never shown found 1 more mistake, made by 1 student."
    ]


def test_a_failure_carries_its_named_mistake_into_results_json_and_a_hidden_one_is_not_credited(pytester, tmp_path):
    """The check names its mistake where it fails (`harness.fail(..., mistake=)`, or a `harness.Failure` passed
    on through `attempt`); the plugin and the scoring keep it on the row, results.json keeps it, and it reads
    back. A row that is not credited (speed waiting on wrong values, a shared cause said elsewhere) names none."""
    pytester.makepyfile(
        test_mha='''
import pytest
from autograder.grading.checks.harness import Failure, attempt, fail

@pytest.mark.part("mha")
def test_named():
    """a check that names its mistake"""
    fail("values differ.\\nLikely mistake: SAID-IN-THE-MESSAGE", mistake="the-named-mistake")

@pytest.mark.part("mha")
def test_passed_on():
    """a check that passes on a request's problem"""
    def request():
        fail(Failure("the request failed", mistake="the-request-mistake"))
    _, problem = attempt(request)
    fail(problem)

@pytest.mark.part("mha")
def test_unnamed():
    """a check that names none"""
    fail("wrong")
''',
    )
    rubric = rubric_file(tmp_path, "[parts.mha]\npoints = 10\n")
    plugin = ResultsPlugin(rubric, visible_only=False)
    pytester.inline_run("-p", "no:cacheprovider", plugins=[plugin])
    assert plugin.grader_errors == []
    checks = score(list(plugin.outcomes.values()), rubric)
    by_key = {c.key: c for c in checks}
    assert by_key["mha::test_named"].mistake == "the-named-mistake"
    assert by_key["mha::test_passed_on"].mistake == "the-request-mistake"
    assert by_key["mha::test_unnamed"].mistake == ""
    results = GradingRun("graded", "mha.py", checks=checks).to_gradescope()
    assert [(t.get("extra_data") or {}).get("mistake") for t in results["tests"]] == [
        "the-named-mistake",
        "the-request-mistake",
        None,
    ]
    assert [c.mistake for c in GradingRun.from_gradescope(json.loads(json.dumps(results))).checks] == [
        c.mistake for c in checks
    ]
    # a failure reworded keeps its mistake; words alone (a str) carry none
    problem = harness.Failure("the request failed", mistake="m")
    assert harness.mistake_of(problem.reworded(f"{problem} (and more)")) == "m"
    assert harness.mistake_of(f"{problem} (and more)") == ""
    # a problem many checks share is named by the first check that meets it, and by no other
    shared = [Outcome(f"mha::test_{n}", "mha", n, FAILED, "the story", cause="CAUSE") for n in "ab"]
    assert [(c.status, c.mistake) for c in score(shared, rubric)] == [(FAILED, "CAUSE"), (NOT_CREDITED, "")]
    # speed waiting on wrong values is not credited, and names nothing of its own
    packaged = load_rubric()
    required = packaged.speed.requires[0]  # the values
    waiting = [
        Outcome(required, required.split("::")[0], "values", FAILED, "wrong", mistake="a-typo"),
        Outcome("speed::test_faster_than_the_wrapper", "speed", "fast", FAILED, "slow", mistake="a-loop"),
    ]
    assert [(c.status, c.mistake) for c in score(waiting, packaged)] == [(FAILED, "a-typo"), (NOT_CREDITED, "")]


@pytest.mark.slow
def test_a_real_grading_names_the_samples_combine_mistake_in_results_json(tmp_path):
    """casey's sample concatenates the heads along the token dimension: every combine check that fails on it
    names that mistake (the check's own words, `mistakes.WRONG_DIMENSION`), and the class report counts it."""
    from autograder.grading.checks.mistakes import WRONG_DIMENSION
    from autograder.model import NOT_CREDITED_TAG

    results, run = grade(SAMPLES / "casey" / "mha" / "mha.py", tmp_path, "--part", "combine")
    assert run.returncode == 0, run.stderr
    combine = [
        t
        for t in results["tests"]
        if t["status"] == "failed" and t["tags"][0] == "combine" and NOT_CREDITED_TAG not in t["tags"]
    ]
    assert combine and all((t.get("extra_data") or {}).get("mistake") == WRONG_DIMENSION[1] for t in combine)
    row = rows_of(tmp_path / "course", {"casey": GradingRun.from_gradescope(results)})
    (mistake,) = class_mistakes(row, released=True).ranked
    assert (mistake.part, mistake.words, list(mistake.students)) == ("combine", WRONG_DIMENSION[1], ["casey"])


@pytest.mark.slow
def test_a_real_grading_names_a_loop_over_heads_in_the_speed_part_however_the_timing_ends(tmp_path):
    """brook's sample loops over the heads: however its timing ends (given up as too slow, past the deadline
    the reference's time sets, or timed and scored below the bands), the speed part names that mistake."""
    from autograder.grading.checks.mistakes import NOT_ONE_PASS

    results, run = grade(SAMPLES / "brook" / "mha" / "mha.py", tmp_path, "--part", "speed")
    if results["extra_data"]["status"] == CANNOT_GRADE:
        pytest.skip(f"this machine could not time the speed part now: {results['extra_data']['reason'][:300]}")
    (speed,) = [t for t in results["tests"] if t["tags"][0] == "speed"]
    assert speed["status"] == "failed" and (speed.get("extra_data") or {}).get("mistake") == NOT_ONE_PASS, speed


# -- the rest of the page -------------------------------------------------------------------------------


def speed_of(relatives: dict[str, float | None]) -> dict:
    """extra_data.speed as a grading writes it (`speed_figures`, as the speed check makes them), for workloads
    whose rounds give the scored figure `relatives[name]`, or that could not be timed (None)."""
    import dataclasses

    from autograder.grading import speed_figures, timing, verdict, workers

    rubric = load_rubric()
    (workload,) = rubric.speed.workloads_for("cpu")
    speed = None
    for name, relative in relatives.items():
        named = dataclasses.replace(workload, name=name)
        if relative is None:
            figures = speed_figures.failed(named, "too slow to time")
        else:
            rounds = 9
            seconds = {
                workers.WRAPPER: [6.3e-3] * rounds,
                workers.REFERENCE: [0.63e-3] * rounds,
                workers.SUBMISSION: [0.63e-3 / relative] * rounds,
            }
            measurement = timing.Measurement(seconds, seconds, seconds, {k: [0.0] * rounds for k in seconds})
            said = verdict.final(timing.relatives(measurement), rubric.speed, rubric.part_points("speed"))
            measurement.verdict = said
            figures = speed_figures.measured(measurement, named, rubric.speed, said)
        speed = speed_figures.add(speed, "cpu", rubric.speed, named, figures)
    return speed


def mixed_class(tmp_path: Path) -> list[Row]:
    rubric = load_rubric()
    runs: dict[str, GradingRun | None] = {
        "ann": synthetic_run("mha.py", speed=speed_of({"cpu workload": 1.02})),
        "bob": synthetic_run("mha.py", {"mha": 5.0, "speed": 0.0}, speed=speed_of({"cpu workload": 0.41})),
        "cat": synthetic_run(
            "mha.py", {"quiz": 0.0, "speed": rubric.part_points("speed") / 2}, speed=speed_of({"cpu workload": 0.66})
        ),
        "dan": synthetic_run("mha.py", {"speed": 0.0}, speed=speed_of({"cpu workload": None})),
        "eve": synthetic_run("mha.py", status=CANNOT_GRADE, reason="grading took more than 900 s and was stopped"),
        "fay": None,  # not graded yet
        "gus": None,  # no submission
    }
    return rows_of(tmp_path, runs, without_file=("gus",))


def test_the_scores_table_and_the_speed_figures_are_the_rows_own(tmp_path):
    rows = mixed_class(tmp_path)
    rubric = load_rubric()
    tree = parse_strict(render(rows, rubric))
    table = {
        text_of(tr.find("td")): [text_of(td) for td in tr.findall("td")[1:]]
        for tr in tree.find(".//section[@id='scores']/table/tbody").findall("tr")
    }
    scored = [r.scored_run for r in rows if r.scored_run is not None]
    for part in rubric.parts:
        scores = [next(p.score for p in run.parts() if p.part == part) for run in scored]
        full = sum(s == rubric.part_points(part) for s in scores)
        expected = [
            f"{rubric.part_points(part):g}",
            f"{round(statistics.fmean(scores), 2):g}",
            f"{statistics.median(scores):g}",
            f"{full} of 4",
        ]
        assert table[f"{rubric.part_title(part)} ({part})"] == expected, part
    totals = [run.score for run in scored]
    assert table["Total"][1:3] == [f"{round(statistics.fmean(totals), 2):g}", f"{statistics.median(totals):g}"]
    points, not_timed = speed_points(rows)
    recorded = {
        r.student: r.run.speed.workloads["cpu workload"].relative
        for r in rows
        if r.scored and r.run.speed.workloads["cpu workload"].relative is not None
    }
    assert recorded == pytest.approx({"ann": 1.02, "bob": 0.41, "cat": 0.66})
    assert {p.student: p.relative for p in points["cpu workload"]} == recorded
    assert not_timed == {"cpu workload": 1}
    said = text_of(tree.find(".//section[@id='speed']"))
    median = statistics.median(recorded.values())
    assert f"cpu workload: 3 students timed, median {median:.2f}; 1 could not be timed" in said
    assert f"full points from {rubric.speed.full_credit_at:g}, none at {rubric.speed.no_credit_at:g} or below" in said
    for plot in ("scores", "speed"):
        image = tree.find(f".//img[@data-plot='{plot}']")
        png = base64.b64decode(image.get("src").removeprefix("data:image/png;base64,"))
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and image.get("alt")
    intro = text_of(tree.find("body/p"))
    assert intro == "7 students: 4 graded, 1 cannot grade, 1 no submission, 1 not graded. 4 with a score."


def test_the_students_without_a_score_are_listed_with_why_and_linked_to_their_feedback_pages(tmp_path):
    rows = mixed_class(tmp_path / "course")
    course = tmp_path / "course"
    write_feedback(course, rows)
    tree = parse_strict(render(rows, load_rubric()))
    listed = {
        text_of(tr.find("td")): (
            tr.find("td/a").get("href"),
            text_of(tr.findall("td")[1]),
            text_of(tr.findall("td")[2]),
        )
        for tr in tree.find(".//section[@id='unscored']/table/tbody").findall("tr")
    }
    assert list(listed) == ["eve", "fay", "gus"]
    assert [status for _, status, _ in listed.values()] == ["cannot grade", "not graded", "no submission"]
    assert "900 s" in listed["eve"][2] and listed["gus"][2]
    for student, (href, _, _) in listed.items():
        assert (course / unquote(href)).resolve() == feedback_path(course, student).resolve()
        assert feedback_path(course, student).is_file()


def test_every_string_a_student_chose_is_cleaned_escaped_and_quoted_in_links(tmp_path):
    student = 'eve<b>&amp "\x1b[31m#?'
    runs: dict[str, GradingRun | None] = {
        student: synthetic_run(
            "mha.py", checks=[failed("mha::test_values", "your code raises <script>alert(1)</script>\x1b]0;x\x07")]
        ),
        "zed<i>": synthetic_run("mha.py", status=CANNOT_GRADE, reason="no"),
    }
    page = render(rows_of(tmp_path, runs), load_rubric())
    tree = parse_strict(page)
    assert tree.findall(".//script") == [] and tree.findall(".//b") == [] and tree.findall(".//i") == []
    assert "\x1b" not in page and "\x07" not in page
    texts = text_of(tree)
    assert "your code raises <script>alert(1)</script>" in texts and "eve<b>&amp" in texts
    hrefs = [a.get("href") for a in tree.iter("a")]
    assert all(re.fullmatch(r"feedback/[A-Za-z0-9%._~-]+/mha/feedback\.html", h) for h in hrefs), hrefs
    assert unquote(hrefs[-1]) == "feedback/zed<i>/mha/feedback.html"


def test_the_page_is_valid_html_and_self_contained(tmp_path):
    for rows in (mixed_class(tmp_path / "a"), rows_of(tmp_path / "b", {"nobody": None}, without_file=("nobody",))):
        page = render(rows, load_rubric())
        tree = parse_strict(page)
        assert page.startswith("<!DOCTYPE html>") and tree.get("lang") == "en" and tree.find("head/title").text
        assert not re.search(r"<link|<script|@import|url\(|https?:", page)  # nothing fetched from anywhere
        assert all(img.get("src").startswith("data:image/png;base64,") and img.get("alt") for img in tree.iter("img"))


@pytest.mark.slow
def test_make_grade_writes_class_html_from_the_record_names_it_and_merge_writes_it_too(tmp_path):
    """From the record alone: a class whose runs are all stored grades nothing and still writes class.html
    (0640, like every output), says where it is, rewrites it only when something it shows changed, and a
    merge of shards writes it too."""
    course = make_course(tmp_path / "course", {"ann": {"mha.py": "x = 1\n"}, "bob": {"mha.py": "x = 2\n"}, "cat": {}})
    fill_record(
        course,
        {"ann": synthetic_run("mha.py"), "bob": synthetic_run("mha.py", checks=[failed("mha::test_values", TYPO)])},
    )
    first = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    out = " ".join(first.stdout.split())
    assert "0 to grade" in out and f"class report: {report_path(course)} (written)" in out, first.stdout + first.stderr
    page = report_path(course)
    assert page.stat().st_mode & 0o777 == COURSE_FILE_MODE
    assert mistake_rows(page.read_text()) == [(1, TYPO, "mha", ["bob"])]
    before = page.stat().st_mtime_ns
    second = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert f"class report: {report_path(course)} (unchanged)" in " ".join(second.stdout.split())
    assert page.stat().st_mtime_ns == before
    released = autograder("grade-class", course, "--device", "cpu", "--released", cwd=tmp_path)
    assert "(written)" in " ".join(released.stdout.split()).split("class report:")[1]
    page.unlink()
    merged = autograder("grade-class", course, "--merge", cwd=tmp_path)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert page.is_file() and "<h1>The class: mha</h1>" in page.read_text()


# -- in a real browser ---------------------------------------------------------------------------------


def blank_png(width: int = 1000, height: int = 700) -> str:
    """A white PNG of a plot's size: what a plot that drew nothing would look like."""
    from matplotlib.figure import Figure

    buffer = io.BytesIO()
    Figure(figsize=(width / 100, height / 100), dpi=100).savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@pytest.mark.slow
def test_chromium_draws_the_score_and_speed_plots(chromium, tmp_path):
    """Screenshots of the page as Chromium draws it: each plot's box holds a decoded image of a plot's size,
    with marks in several colours. The same check fails on a plot that drew nothing and on one that is broken."""
    page = render(mixed_class(tmp_path / "course"), load_rubric())
    plots = plots_in(chromium, page, tmp_path / "drawn")
    assert set(plots) == {"scores", "speed"}
    for plot in plots.values():
        assert plot.drawn(), plot
    # the speed plot shows the bands that score it, the scores plot its bars, in the colours they are drawn in
    assert {quantised(colour) for colour in BAND_COLOURS} <= plots["speed"].colours
    assert quantised(SCORE_COLOUR) in plots["scores"].colours
    sources = re.findall(r'data-plot="scores" src="data:image/png;base64,([^"]+)"', page)
    assert len(sources) == 1
    blank = plots_in(chromium, page.replace(sources[0], blank_png()), tmp_path / "blank")
    broken = plots_in(chromium, page.replace(sources[0], "bm90IGEgcG5n"), tmp_path / "broken")
    assert not blank["scores"].drawn() and blank["speed"].drawn()
    assert not broken["scores"].drawn() and broken["scores"].natural == 0


# -- a class of 100 ------------------------------------------------------------------------------------


def counted_in_file(results: dict) -> set[tuple[str, str]]:
    """The (part, mistake) rows one student's results.json puts in the class's mistakes table, read from the
    file as the page's own words say it counts: the visible, scored failures; a part with a stub or an answer
    left None is one "not done yet" (its failures that name no mistake with it); the speed of a loop over heads
    is the mha part's structure mistake when that check failed too."""
    failed = [
        (t["tags"][0], t["tags"][1], (t.get("extra_data") or {}).get("mistake") or "")
        for t in results["tests"]
        if t["status"] == "failed" and "not-credited" not in t["tags"] and t["visibility"] == "visible"
    ]
    not_done = {part for part, _, mistake in failed if mistake.startswith("not done yet")}
    by_key = {key: (part, mistake) for part, key, mistake in failed}
    rows = set()
    for part, _, mistake in failed:
        if part in not_done and (mistake.startswith("not done yet") or not mistake):
            rows.add((part, "not done yet"))
        elif part == "speed" and "one batched pass" in mistake and "mha::test_one_pass_for_all_heads" in by_key:
            rows.add(by_key["mha::test_one_pass_for_all_heads"])
        else:
            rows.add((part, mistake))
    return rows


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(3600)  # 100 gradings: about 4 minutes on an idle 2-core machine, far more on a busy one
def test_a_class_of_100_gets_one_report_of_everyone_drawn_by_chromium(chromium, tmp_path):
    """100 copies of the sample class: class.html accounts for every student, counts each mistake for exactly
    the students whose results.json name it (read here from the files, not through the grader's model),
    links every student it names to an existing feedback page, and Chromium draws its plots. The first 10
    (two copies of each sample) are graded by `grade-class` as `make grade` does; each of the other 90 holds
    the same file as one of them, whose record it is given (what grading it would write but for the timings),
    and `grade-class --merge` writes the class's outputs from the record of all 100, as after a sharded run."""
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_class import make_class

    course = tmp_path / "class100"
    make_class(course, 100)
    graded = sorted(p.name for p in (course / "submitted").iterdir())
    hidden = tmp_path / "not-yet"
    hidden.mkdir()
    for student in graded[10:]:
        (course / "submitted" / student).rename(hidden / student)
    run = autograder("grade-class", course, "--device", "cpu", "--jobs", "4", cwd=tmp_path, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for k, student in enumerate(graded[10:], start=10):
        (hidden / student).rename(course / "submitted" / student)
        twin = graded[k % 10]  # the same sample: make_class gives student k the sample k % 5
        assert twin.split("-", 1)[1] == student.split("-", 1)[1]
        shutil.copytree(course / "results" / twin, course / "results" / student)
    run = autograder("grade-class", course, "--merge", cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"class report: {report_path(course)} (written)" in " ".join(run.stdout.split())
    page = report_path(course).read_text()
    tree = parse_strict(page)
    assert text_of(tree.find("body/p")).startswith("100 students: ")
    expected: Counter[tuple[str, str]] = Counter()  # (part, mistake) -> students, from the results files
    for results_file in sorted((course / "results").glob("*/mha/results.json")):
        expected.update(counted_in_file(json.loads(results_file.read_text())))
    shown = mistake_rows(page)
    words = {"failed checks that named no known mistake": ""}
    assert Counter({(part, words.get(w, w)): n for n, w, part, _ in shown}) == expected
    assert [n for n, *_ in shown] == sorted((n for n, *_ in shown), reverse=True)
    assert max(n for n, *_ in shown) >= 20  # each sample is 20 students: a sample's mistake is theirs
    for _, _, _, who in shown:
        for student in who:
            assert feedback_path(course, student).is_file(), student
    plots = plots_in(chromium, page, tmp_path / "browser")
    assert set(plots) == {"scores", "speed"} and all(p.drawn() for p in plots.values()), plots
    shutil.rmtree(course / "submitted")


def test_every_way_a_request_to_the_worker_fails_names_a_mistake_of_the_student():
    """A new kind of worker failure (a subclass) is named by its parent's mistake, never a KeyError in
    the grader (which would be scored as the grader's own failure: `cannot_grade`)."""
    from autograder.grading.checks.harness import worker_mistake
    from autograder.sandbox import client

    failures = [
        cls
        for cls in vars(client).values()
        if isinstance(cls, type) and issubclass(cls, (client.LoadFailed, client.WorkerTimeout, client.WorkerCrashed))
    ]
    assert client.BudgetSpent in failures and client.CheckTimeUp in failures
    for cls in failures:
        assert worker_mistake(cls.__new__(cls)), cls.__name__
