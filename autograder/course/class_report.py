"""The class report for the instructor: `class.html` in the course folder, one self-contained page.

Made from the record alone (`rows.Row`), like every class output: the score distribution per part and
in total, the speed part's relative speedups (the figure that is scored: the student's speedup over the
wrapper divided by the reference's) beside the bands that score them, the class's mistakes ranked by how
many students made each, and the students without a score, each linked to their feedback page.

A mistake is what a failed check named (`model.CheckResult.mistake`, set by the check where it names it,
never read back from a message), counted once per student and part; a failure that named none is counted
under its check. What the page says of a check follows the feedback pages' rule (`rows.shown`): before the
due date the mistakes found by checks on hidden inputs are only counted, after it (`released`) they are
named too, and a `hidden` check's are only ever counted.

The plots are inline PNGs drawn with matplotlib (as the feedback page's speed plot), so the page can be
opened offline. Every string a student chose (names, notes, what their code raised) is cleaned
(`clean.clean_for_output`) and HTML-escaped. The page is rewritten only when what it is made from changed
(a fingerprint in its own `<meta>`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from autograder.atomic import write_text_atomically
from autograder.contract import ASSIGNMENT, PART_IDS
from autograder.course.clean import clean_for_output
from autograder.course.feedback import TEMPLATES, template_environment
from autograder.course.rows import (
    SHOWN_AFTER,
    STATUSES,
    Row,
    feedback_path,
    graded_parts,
    page_is_current,
    shown,
    status_words,
)
from autograder.course.store import COURSE_FILE_MODE
from autograder.model import (
    FAILED,
    NOT_CREDITED,
    NOT_DONE_MISTAKES,
    NOT_DONE_YET,
    NOT_ONE_PASS,
    CheckResult,
    GradingRun,
)
from autograder.rubric import Rubric, SpeedSettings

TEMPLATE = "class.html.j2"
FILE_NAME = "class.html"
BINS = 10  # score bins per part, from 0 to the part's points (as the terminal's table)
SPEED_BIN = 0.05  # the width of a bin of the speed plot, in the scored figure's units
SHOWN_UP_TO = 1.2  # the speed plot's axis runs at least this far (past the full-credit band)
BAND_COLOURS = ("#ffcecb", "#fae17d", "#aceebb")  # no points, in proportion, full points (the feedback page's)
SCORE_COLOUR, TOTAL_COLOUR = "#0969da", "#1f2328"
_FINGERPRINT = re.compile(rb'<meta name="mha-class-fingerprint" content="([0-9a-f]+)">')


# -- what the page is made of ------------------------------------------------------------------------


@dataclass
class ScoreSeries:
    """The scores of the scored students in one part (or the total)."""

    part: str  # a part id, or "total"
    title: str
    points: float
    scores: list[float]

    @property
    def full_marks(self) -> int:
        return sum(score >= self.points - 1e-9 for score in self.scores)


def score_series(rows: list[Row], rubric: Rubric) -> list[ScoreSeries]:
    """Per part in the fixed part order, then the total: the scored students' scores."""
    scored = [run for run in (row.scored_run for row in rows) if run is not None]
    series = []
    for part in graded_parts(rubric):
        scores = [next((p.score for p in run.parts() if p.part == part), 0.0) for run in scored]
        series.append(ScoreSeries(part, rubric.part_title(part), rubric.part_points(part), scores))
    series.append(ScoreSeries("total", "Total", rubric.max_score, [run.score for run in scored]))
    return series


@dataclass
class Mistake:
    """One mistake of one part (or the part's failures that named none) and the students who made it."""

    part: str
    words: str  # the mistake as the check named it; "": the part's failures that named none
    checks: set[str] = field(default_factory=set)  # the keys of the checks that found it (what CHECK= takes)
    students: dict[str, None] = field(default_factory=dict)  # in roster order


@dataclass
class Withheld:
    """Mistakes found only by checks the page may not describe: how many, and how many students made them."""

    mistakes: int = 0
    students: int = 0


@dataclass
class Mistakes:
    ranked: list[Mistake]  # most students first
    later: Withheld  # found by checks described after the due date (none once released)
    never: Withheld  # found by hidden checks, never described


# A mistake one check names that is another's consequence, by the key of the check that names the cause: the
# speed part's "not one pass" is the loop over heads that the mha part's structure check already counts.
CONSEQUENCE_OF = {NOT_ONE_PASS: "mha::test_one_pass_for_all_heads"}


def counted_failures(checks: list[CheckResult]) -> list[tuple[CheckResult, str, str]]:
    """A student's failed checks, each with the part and the words it is counted under: a part not done yet
    (a stub, an answer left None) is one "not done yet", and its failures that name no mistake are not counted
    again as naming none; a mistake that is the consequence of one another failed check names (the speed of a
    loop over heads) is counted under that check's part and words, once."""
    failed = [check for check in checks if check.status == FAILED]
    not_done = {check.part for check in failed if check.mistake in NOT_DONE_MISTAKES}
    by_key = {check.key: check for check in failed}
    counted: list[tuple[CheckResult, str, str]] = []
    for check in failed:
        cause = by_key.get(CONSEQUENCE_OF.get(check.mistake, ""))
        if check.part in not_done and (check.mistake in NOT_DONE_MISTAKES or not check.mistake):
            counted.append((check, check.part, NOT_DONE_YET))
        elif cause is not None:
            counted.append((check, cause.part, cause.mistake))
        else:
            counted.append((check, check.part, check.mistake))
    return counted


def class_mistakes(rows: list[Row], released: bool) -> Mistakes:
    """The mistakes of the scored students, each counted once per student, ranked by how many students made
    it; the failures that named no mistake count as one per part, a part not done yet as one
    (`counted_failures`). One that only checks the page may not describe found, for a student, is counted
    apart and not named."""
    found: dict[tuple[str, str], Mistake] = {}
    unshown: dict[tuple[str, str], dict[str, bool]] = defaultdict(dict)  # (part, words) -> {student: never shown}
    for row in rows:
        run = row.scored_run
        for check, part, words in counted_failures(run.checks if run is not None else []):
            key = (part, words)
            if shown(check, released):
                mistake = found.setdefault(key, Mistake(part, words))
                mistake.checks.add(check.key)
                mistake.students[row.student] = None
            else:
                hidden = check.visibility not in SHOWN_AFTER
                unshown[key][row.student] = unshown[key].get(row.student, True) and hidden
    later, never = Withheld(), Withheld()
    later_students: set[str] = set()
    never_students: set[str] = set()
    for key, students in unshown.items():  # those a shown check also found for the student are counted there
        left = {s: hidden for s, hidden in students.items() if key not in found or s not in found[key].students}
        later.mistakes += any(not hidden for hidden in left.values())
        never.mistakes += any(left.values())
        later_students |= {s for s, hidden in left.items() if not hidden}
        never_students |= {s for s, hidden in left.items() if hidden}
    later.students, never.students = len(later_students), len(never_students)
    order = {part: i for i, part in enumerate(PART_IDS)}
    ranked = sorted(
        found.values(),
        key=lambda m: (-len(m.students), not m.words, order.get(m.part, len(order)), m.words, sorted(m.checks)),
    )
    return Mistakes(ranked, later, never)


@dataclass
class SpeedPoint:
    student: str
    relative: float  # the student's speedup over the wrapper divided by the reference's (the median of the rounds)
    scored: bool  # False: the speed part was not credited (a part it requires was wrong)


def speed_points(rows: list[Row]) -> tuple[dict[str, list[SpeedPoint]], dict[str, int]]:
    """Per timed workload, each scored student's relative speedup; and per workload how many were not timed."""
    points: dict[str, list[SpeedPoint]] = {}
    not_timed: dict[str, int] = {}
    for row in rows:
        run = row.scored_run
        if run is None or run.speed is None:
            continue
        scored = not any(c.part == "speed" and c.status == NOT_CREDITED for c in run.checks)
        for name, figures in run.speed.workloads.items():
            relative = figures.relative
            if relative is not None and math.isfinite(relative) and relative >= 0:
                points.setdefault(name, []).append(SpeedPoint(row.student, float(relative), scored))
            else:
                not_timed[name] = not_timed.get(name, 0) + 1
    return points, not_timed


# -- the plots ---------------------------------------------------------------------------------------


def png_of(figure: Any) -> str:
    """A matplotlib figure as a PNG, base64 for a data: URI."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def scores_plot(series: list[ScoreSeries]) -> str:
    """One histogram per part and one of the totals: how many students scored how much, in ten bins
    from 0 to the part's points."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    columns = 3
    lines = -(-len(series) // columns)
    figure = Figure(figsize=(10, 2.6 * lines), dpi=100)
    axes = figure.subplots(lines, columns, squeeze=False).flatten()
    for axis, part in zip(axes, series):
        top = part.points if part.points > 0 else 1.0
        axis.hist(part.scores, bins=BINS, range=(0, top), color=TOTAL_COLOUR if part.part == "total" else SCORE_COLOUR)
        axis.set_title(f"{part.part} ({part.points:g} points)", fontsize=9)
        axis.set_xlim(0, top)
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("points", fontsize=8)
        axis.set_ylabel("students", fontsize=8)
        axis.tick_params(labelsize=8)
        axis.grid(alpha=0.3)
    for axis in axes[len(series) :]:
        axis.set_visible(False)
    figure.tight_layout()
    return png_of(figure)


def speed_plot(points: dict[str, list[SpeedPoint]], bands: SpeedSettings | None) -> str:
    """Per workload, a histogram of the class's relative speedups over the bands that score them; the
    students whose speed part was not credited (a part it requires was wrong) stacked apart."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(10, 3.0 * len(points)), dpi=100)
    axes = figure.subplots(len(points), 1, squeeze=False)[:, 0]
    for axis, (name, found) in zip(axes, points.items()):
        top = max(SHOWN_UP_TO, max(p.relative for p in found) * 1.05)
        if bands is not None:
            none, full = bands.no_credit_at, bands.full_credit_at
            for (start, stop), colour, label in zip(
                ((0, none), (none, full), (full, top)), BAND_COLOURS, ("no points", "in proportion", "full points")
            ):
                axis.axvspan(start, stop, color=colour, label=label)
        edges = [i * SPEED_BIN for i in range(int(top / SPEED_BIN) + 2)]
        axis.hist(
            [[p.relative for p in found if p.scored], [p.relative for p in found if not p.scored]],
            bins=edges,
            stacked=True,
            color=["#1f2328", "#8c959f"],
            label=["scored", "waiting (part 6's values wrong first: no speed points)"],
        )
        axis.set_xlim(0, top)
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("speedup over the wrapper, yours / the reference's", fontsize=8)
        axis.set_ylabel("students", fontsize=8)
        axis.legend(fontsize=7, loc="upper left")
        axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    return png_of(figure)


# -- the page ----------------------------------------------------------------------------------------


def feedback_link(student: str) -> str:
    """The student's feedback page, relative to class.html (both in the course folder), as a URL."""
    return quote(feedback_path(Path("."), student).as_posix(), safe="/")


def _number(value: float) -> str:
    return f"{round(value, 2):g}"


def page_context(rows: list[Row], rubric: Rubric, released: bool) -> dict[str, Any]:
    labels = {row.student: row.shown for row in rows}  # as every output shows them: distinct, once cleaned

    def name(student: str) -> str:
        return clean_for_output(labels.get(student, student), newlines=False)

    series = score_series(rows, rubric)
    scored = len(series[-1].scores)
    mistakes = class_mistakes(rows, released)
    points, not_timed = speed_points(rows)
    bands = rubric.speed  # [speed]: the bands that score the speed part
    statuses = {status: sum(row.status == status for row in rows) for status in STATUSES}
    return {
        "assignment": ASSIGNMENT,
        "released": released,
        "students": len(rows),
        "scored": scored,
        "statuses": ", ".join(f"{n} {status_words(status)}" for status, n in statuses.items() if n),
        "parts": [
            {
                "id": s.part,
                "title": s.title,
                "points": _number(s.points),
                "mean": _number(statistics.fmean(s.scores)) if s.scores else "-",
                "median": _number(statistics.median(s.scores)) if s.scores else "-",
                "full": f"{s.full_marks} of {len(s.scores)}" if s.scores else "-",
            }
            for s in series
        ],
        "scores_plot": scores_plot(series) if scored else "",
        "speed": {
            "plot": speed_plot(points, bands) if points else "",
            "workloads": [
                {
                    "name": workload,
                    "timed": len(found),
                    "median": _number(statistics.median(p.relative for p in found)),
                    "not_credited": sum(not p.scored for p in found),
                    "not_timed": not_timed.get(workload, 0),
                }
                for workload, found in points.items()
            ],
            "not_timed_only": {w: n for w, n in not_timed.items() if w not in points},
            "bands": (
                f"full points from {bands.full_credit_at:g}, none at {bands.no_credit_at:g} or below" if bands else ""
            ),
        },
        "mistakes": [
            {
                "students": len(m.students),
                "part": m.part,
                "part_title": rubric.part_title(m.part),
                "words": clean_for_output(m.words, newlines=False),
                "checks": sorted(m.checks),
                "who": [{"name": name(s), "href": feedback_link(s)} for s in m.students],
            }
            for m in mistakes.ranked
        ],
        "withheld_later": mistakes.later,
        "withheld_never": mistakes.never,
        "unscored": [
            {
                "name": name(row.student),
                "href": feedback_link(row.student),
                "status": status_words(row.status),
                "note": row.note(),
            }
            for row in rows
            if not row.scored
        ],
        "flagged": [
            {"name": name(row.student), "href": feedback_link(row.student), "flags": run.flags}
            for row in rows
            if (run := row.scored_run) is not None and run.flags
        ],
    }


def renderer_fingerprint() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((TEMPLATES / TEMPLATE).read_bytes())
    digest.update(Path(__file__).with_name("rows.py").read_bytes())  # what a page may show (`rows.shown`)
    return digest.hexdigest()


def fingerprint(rows: list[Row], rubric: Rubric, released: bool) -> str:
    """Of everything the page is made from: each row (its run and roster entry), the rubric's parts and
    bands, `released`, and this module's code and template."""

    def run_data(run: GradingRun | None) -> Any:
        return run.to_gradescope() if run is not None else None

    data = {
        "rows": [
            [r.student, r.status, r.entry.file.name if r.entry.file else None, r.note(), run_data(r.run)] for r in rows
        ],
        "parts": {p: [rubric.part_title(p), rubric.part_points(p)] for p in graded_parts(rubric)},
        "bands": [rubric.speed.full_credit_at, rubric.speed.no_credit_at] if rubric.speed else None,
        "released": released,
        "renderer": renderer_fingerprint(),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def render(rows: list[Row], rubric: Rubric, released: bool = False, fingerprint_value: str = "") -> str:
    return (
        template_environment()
        .get_template(TEMPLATE)
        .render(
            fingerprint=fingerprint_value or fingerprint(rows, rubric, released),
            **page_context(rows, rubric, released),
        )
    )


def report_path(course: Path) -> Path:
    return Path(course) / FILE_NAME


def write_class_report(course: Path, rows: list[Row], rubric: Rubric, released: bool = False) -> bool:
    """Write class.html where it is missing or out of date; return whether it was written."""
    path = report_path(course)
    value = fingerprint(rows, rubric, released)
    if page_is_current(path, _FINGERPRINT, value):
        return False
    write_text_atomically(path, render(rows, rubric, released, value), COURSE_FILE_MODE)
    return True
