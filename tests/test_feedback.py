"""feedback.html: what a student reads. Valid, self-contained, escaped, rendered by a real browser, and
never showing what the rubric withholds."""

from __future__ import annotations

import base64
import re
from dataclasses import replace

import html5lib
import pytest

from autograder.course.feedback import feedback_path, render, write_feedback
from autograder.course.roster import read_roster
from autograder.course.rows import Row
from autograder.model import (
    CANNOT_GRADE,
    FAILED,
    NOT_CHARGED,
    NOT_CREDITED,
    PASSED,
    CheckResult,
    LoadReport,
    SpeedBands,
    WorkloadFigures,
)
from browser import headless
from classkit import make_course, synthetic_run


def recorded_speed():
    """extra_data.speed as a grading writes it (`speed_figures`, as the speed check makes them) for the rubric's
    CPU workload, and a second workload whose timing failed."""
    import dataclasses

    from autograder.grading import speed_figures, timing, verdict, workers
    from autograder.rubric import load_rubric

    rubric = load_rubric()
    (workload,) = rubric.speed.workloads_for("cpu")
    rounds = 21
    seconds = {
        workers.WRAPPER: [6.3e-3 + i * 1e-5 for i in range(rounds)],
        workers.REFERENCE: [0.63e-3 + (i % 3) * 1e-5 for i in range(rounds)],
        workers.SUBMISSION: [0.95e-3 + (i % 5) * 2e-5 for i in range(rounds)],
    }
    measurement = timing.Measurement(seconds, seconds, seconds, {k: [0.0] * rounds for k in seconds})
    measurement.verdict = verdict.final(timing.relatives(measurement), rubric.speed, rubric.part_points("speed"))
    figures = speed_figures.measured(measurement, workload, rubric.speed, measurement.verdict)
    speed = speed_figures.add(None, "cpu", rubric.speed, workload, figures)
    second = dataclasses.replace(workload, name="a second workload")
    return speed_figures.add(speed, "cpu", rubric.speed, second, WorkloadFigures(failed="TIMING-FAILED: too slow"))


SPEED = recorded_speed()
SPEED_JSON = SPEED.to_json()  # as results.json says it


def marked_run():
    """A run whose every check and output carries a marker, by visibility."""
    checks = [
        CheckResult(
            "combine::test_visible",
            "combine",
            "heads side by side [VISIBLE-NAME]",
            FAILED,
            0.0,
            5.0,
            "VISIBLE-MESSAGE: <script>alert('x')</script> & \"quotes\"",
        ),
        CheckResult(
            "combine::test_after",
            "combine",
            "hidden widths [AFTER-NAME]",
            FAILED,
            0.0,
            5.0,
            "AFTER-SECRET: largest difference 0.123456 at input[3, 1]",
            visibility="after_due_date",
        ),
        CheckResult(
            "mha::test_hidden",
            "mha",
            "the secret check [HIDDEN-NAME]",
            FAILED,
            0.0,
            10.0,
            "HIDDEN-SECRET: expected 42.4242",
            visibility="hidden",
        ),
        CheckResult("mha::test_ok", "mha", "dtype kept", PASSED, 15.0, 15.0),
        CheckResult("speed::test_speedup", "speed", "faster than the wrapper", PASSED, 10.0, 10.0),
    ]
    return replace(
        synthetic_run("mha.py", checks=checks, speed=SPEED),
        student_output="PRINTED-SECRET tensor([[0.1234, 0.5678]])",
        load=LoadReport(cells=[]),
        events=["forward of MultiHeadAttention did not finish within 10 s (an infinite loop?)"],
    )


def row_for(tmp_path, run, name="mha.py", student="ann") -> Row:
    course = make_course(tmp_path / student, {student: {name: ""}})
    return Row(read_roster(course)[0], run)


def parse_strict(page: str):
    """html5lib's parser in strict mode raises on any parse error of the HTML standard."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse(page)


def test_hidden_details_are_withheld_before_the_due_date(tmp_path):
    page = render(row_for(tmp_path, marked_run()), released=False)
    assert "VISIBLE-NAME" in page and "VISIBLE-MESSAGE" in page
    for secret in (
        "AFTER-NAME",
        "AFTER-SECRET",
        "0.123456",
        "HIDDEN-NAME",
        "HIDDEN-SECRET",
        "42.4242",
        "PRINTED-SECRET",
        "0.1234",
    ):
        assert secret not in page, secret
    assert "1 more check ran on hidden inputs; its details are shown after the due date." in page
    assert "1 check whose details are not shown." in page


def test_after_the_due_date_only_hidden_checks_stay_withheld(tmp_path):
    page = render(row_for(tmp_path, marked_run()), released=True)
    assert "AFTER-NAME" in page and "AFTER-SECRET" in page
    for secret in ("HIDDEN-NAME", "HIDDEN-SECRET", "42.4242", "PRINTED-SECRET"):
        assert secret not in page, secret


def test_every_string_is_escaped(tmp_path):
    page = render(row_for(tmp_path, marked_run(), student="eve<b>&amp"))
    tree = parse_strict(page)
    assert tree.findall(".//script") == [] and tree.findall(".//b") == []
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    texts = "".join(tree.itertext())
    assert "<script>alert('x')</script> & \"quotes\"" in texts and "eve<b>&amp" in texts


@pytest.mark.parametrize("case", ["graded", "released", "cannot_grade", "no_submission"])
def test_every_page_is_valid_html_and_self_contained(tmp_path, case):
    if case == "no_submission":
        course = make_course(tmp_path, {"zed": {}})
        row = Row(read_roster(course)[0], None)
    elif case == "cannot_grade":
        row = row_for(tmp_path, synthetic_run("mha.py", status=CANNOT_GRADE, reason="grading took more than 900 s"))
    else:
        row = row_for(tmp_path, marked_run())
    page = render(row, released=case == "released")
    tree = parse_strict(page)
    assert page.startswith("<!DOCTYPE html>") and tree.get("lang") == "en"
    assert tree.find("head/meta[@charset='utf-8']") is not None and tree.find("head/title").text.strip()
    assert not re.search(r"<link|<script|@import|url\(", page)  # nothing fetched: one file says it all
    assert all(img.get("src", "").startswith("data:image/png;base64,") and img.get("alt") for img in tree.iter("img"))
    assert not [a for a in tree.iter("a") if a.get("href")]
    expected = {
        "graded": "Score: 25 / 45",
        "released": "Score: 25 / 45",
        "cannot_grade": "could not be graded yet",
        "no_submission": "No submission was found",
    }[case]
    assert expected in " ".join("".join(tree.itertext()).split())


def test_the_speed_part_shows_its_figures_beside_the_bands_and_a_plot_of_the_rounds(tmp_path):
    """On the layout a grading writes (per workload, under `workloads`): the figures in words, the scored
    figure with the bands that score it, the rule (the give-up rule included) in words, and the plot."""
    tree = parse_strict(render(row_for(tmp_path, marked_run())))
    section = tree.find(".//section[@id='part-speed']")
    text = " ".join("".join(section.itertext()).split())
    figures = SPEED_JSON["workloads"][next(iter(SPEED_JSON["workloads"]))]
    rows = [" ".join("".join(td.itertext()).split()) for tr in section.iter("tr") for td in tr.findall("td")]
    assert f"{figures['speedup']:.2f}x" in rows and f"{figures['reference_speedup']:.2f}x" in rows
    bands = SPEED_JSON["bands"]
    scored = next(r for r in rows if r.startswith("yours divided by the reference's"))
    assert f"full points from {bands['full_credit_at']:g}, none at {bands['no_credit_at']:g} or below" in scored
    value = next(r for r in rows if r.startswith(f"{figures['relative']:.2f}"))
    assert f"{figures['credit']:.0%} of the speed points" in value
    interval = figures["relative_interval"]
    assert f"{interval['low']:.2f} to {interval['high']:.2f} (90% interval)" in scored
    assert f"In words: {figures['verdict']['said']}." in text
    assert f"your forward is {figures['relative']:.2f} of the reference's speedup" in text
    bar = section.find(".//div[@class='bar']")
    mark = next(span for span in bar if span.get("class") == "mark")
    assert 0 < float(mark.get("style").split("left:")[1].strip(" %")) < 100
    assert f"more than {1 / bands['give_up_below']:.3g} times slower than the reference" in text
    assert "Not timed: TIMING-FAILED: too slow" in text
    image = section.find(".//img")
    png = base64.b64decode(image.get("src").removeprefix("data:image/png;base64,"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert "your speedup over the wrapper divided by the reference's" in image.get("alt")
    assert "test_" not in text and "::" not in text  # no check is named by its key


def test_a_gated_check_is_shown_as_not_credited(tmp_path):
    run = marked_run()
    run.checks.append(
        CheckResult("mha::test_loop", "mha", "no loop over heads", NOT_CREDITED, 0.0, 5.0, "not credited: GATED-REASON")
    )
    tree = parse_strict(render(row_for(tmp_path, run)))
    rows = [["".join(td.itertext()).strip() for td in tr.findall("td")] for tr in tree.iter("tr")]
    row = next(r for r in rows if r and r[0].startswith("no loop over heads"))
    assert row[1] == "not credited" and "GATED-REASON" in row[0]


def test_a_check_that_waits_for_another_part_is_shown_as_waiting(tmp_path):
    """The self-check's word for the same situation (docs/vocabulary.md): a check not charged (it earns its
    points), and the speed part gated by the values it requires (it earns none, by its declared rule)."""
    run = marked_run()
    run = replace(
        run,
        checks=[
            *run.checks,
            CheckResult("fuse::test_w", "fuse", "fused weights", NOT_CHARGED, 5.0, 5.0, "waiting: WAITS-FOR-MHA"),
            CheckResult("speed::test_fast", "speed", "speed", NOT_CREDITED, 0.0, 5.0, "waiting: SPEED-WAITS"),
        ],
    )
    tree = parse_strict(render(row_for(tmp_path, run)))
    rows = [["".join(td.itertext()).strip() for td in tr.findall("td")] for tr in tree.iter("tr")]
    fused = next(r for r in rows if r and r[0].startswith("fused weights"))
    speed = next(r for r in rows if r and r[0].startswith("speed") and "SPEED-WAITS" in r[0])
    assert fused[1] == speed[1] == "waiting" and "WAITS-FOR-MHA" in fused[0]
    assert "not credited" not in fused[0] + speed[0]


def test_a_page_is_rewritten_only_when_what_it_shows_changed(tmp_path):
    course = make_course(tmp_path, {"ann": {"mha.py": ""}, "bob": {}})
    rows = [Row(e, synthetic_run("mha.py") if e.has_file else None) for e in read_roster(course)]
    assert write_feedback(course, rows) == 2
    assert write_feedback(course, rows) == 0
    assert write_feedback(course, rows, released=True) == 2
    feedback_path(course, "ann").unlink()  # as `nbgrader generate_feedback --force` does to the folder
    assert write_feedback(course, rows, released=True) == 1
    rows[0].run.checks[0].status, rows[0].run.checks[0].score = FAILED, 0.0
    assert write_feedback(course, rows, released=True) == 1


# -- in a real browser ------------------------------------------------------------------------------


def test_chromium_renders_the_page_and_takes_a_screenshot(chromium, tmp_path):
    import matplotlib.image

    page = tmp_path / "feedback.html"
    page.write_text(render(row_for(tmp_path, marked_run())))
    shot = tmp_path / "shot.png"
    done = headless(
        chromium,
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1000,1600",
        "--hide-scrollbars",
        page.as_uri(),
    )
    assert shot.is_file(), done.stderr[-2000:]
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1000)
    assert pixels[..., :3].std() > 0.05  # text, tables and the plot, not a blank page
    dom = headless(chromium, tmp_path / "profile2", "--dump-dom", page.as_uri()).stdout
    assert "Score: 25 / 45" in dom and "VISIBLE-MESSAGE" in dom and "HIDDEN-SECRET" not in dom
    # the speed part as a browser shows it: the plot of the rounds, the bands beside the scored figure, the rule
    assert 'src="data:image/png;base64,' in dom and 'class="bar"' in dom
    assert f"Full points from {SPEED_JSON['bands']['full_credit_at']:g}" in dom


def test_the_quizs_withheld_answers_are_not_said_to_run_on_hidden_inputs_and_every_student_reads_one_count(tmp_path):
    """The quiz's answer check is shown after the due date: it is counted as a check of the answers, and a part's
    count is of checks (one row each), the same for a student whose cases came out differently."""
    from autograder.grading.scoring import Outcome, score
    from autograder.rubric import load_rubric

    rubric = load_rubric()
    pages = []
    for statuses in ((PASSED, PASSED), (PASSED, FAILED)):
        outcomes = [
            Outcome("quiz::test_answer_is_a_choice", "quiz", "a letter", PASSED, case=name) for name in ("A", "B")
        ]
        outcomes += [
            Outcome("quiz::test_answer", "quiz", "right", status, "wrong", case=name)
            for name, status in zip(("A", "B"), statuses)
        ]
        outcomes += [
            Outcome("wrapper::test_matches_reference", "wrapper", "values", status, "wrong", case=name)
            for name, status in zip(("1", "2"), statuses)
        ]
        run = synthetic_run("mha.py", checks=score(outcomes, rubric))
        pages.append(render(row_for(tmp_path / str(len(pages)), run)))
    for page in pages:
        assert "1 more check of your answers; its result is shown after the due date." in page
        assert page.count("ran on hidden inputs") == 1  # the wrapper's, not the quiz's
        assert "1 more check ran on hidden inputs; its details are shown after the due date." in page


def test_the_timing_plots_log_axis_has_at_least_two_ticks_whatever_the_range():
    from autograder.course.feedback import log_ticks, speed_figure

    for low, high in ((1.1, 1.9), (0.52, 0.61), (0.6, 6.5), (0.003, 40.0)):
        ticks = log_ticks(low, high)
        assert len(ticks) >= 2 and all(low <= t <= high for t in ticks), (low, high, ticks)
    rounds = {"submission": [1.2, 1.25, 1.3], "reference": [1.1, 1.15, 1.12], "wrapper": [1.8, 1.85, 1.9]}
    figure = speed_figure({"a narrow workload": rounds}, SpeedBands(full_credit_at=0.75, no_credit_at=0.55))
    times = figure.axes[0]
    low, high = times.get_ylim()
    labelled = [t for t in times.get_yticks() if low <= t <= high]
    assert len(labelled) >= 2, labelled


def test_every_label_of_the_speed_figure_fits_inside_it_and_clear_of_the_other_plot():
    """The figure's margins are fixed (measuring them cost a second drawing of each figure): with the widest
    labels its axes can get, every title, label, tick label and legend lies inside the figure, and a row's
    right plot's labels stay clear of its left plot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from autograder.course.feedback import speed_figure

    bands = SpeedBands(full_credit_at=0.75, no_credit_at=0.55)

    def rounds(submission, reference, wrapper, n=12):
        return {"submission": [submission] * n, "reference": [reference] * n, "wrapper": [wrapper] * n}

    extremes = {
        "tiny times": {"64 heads of width 4, 16 tokens": rounds(0.0003, 0.0002, 0.0041)},
        "huge times": {"a workload": rounds(123456.0, 2.0, 14.0, n=60)},
        "far faster": {"a workload": rounds(0.01, 1.0, 9.0, n=2)},
        "three rows": {
            "64 heads of width 4, 16 tokens": rounds(1.1, 1.0, 7.4),
            "8 heads of width 64, 512 tokens, a long name": rounds(950.0, 900.0, 4000.0),
            "one": rounds(0.05, 0.04, 0.3, n=1),
        },
    }
    for name, series in extremes.items():
        figure = speed_figure(series, bands)
        canvas = FigureCanvasAgg(figure)  # what savefig draws with
        canvas.draw()
        renderer = canvas.get_renderer()
        drawn = figure.get_tightbbox(renderer)  # inches: every artist drawn, tick labels and legends included
        width, height = figure.get_size_inches()
        assert drawn.x0 >= 0 and drawn.y0 >= 0 and drawn.x1 <= width and drawn.y1 <= height, (name, drawn)
        rows = list(zip(figure.axes[0::2], figure.axes[1::2]))
        for times, scored in rows:
            assert scored.yaxis.get_tightbbox(renderer).x0 > times.get_window_extent(renderer).x1, name
            assert times.get_legend().get_window_extent(renderer).x1 <= times.get_window_extent(renderer).x1
        for (upper, _), (lower, _) in zip(rows, rows[1:]):
            assert upper.get_tightbbox(renderer).y0 > lower.get_tightbbox(renderer).y1, name
    assert len(figure.findobj(Text)) > 30
