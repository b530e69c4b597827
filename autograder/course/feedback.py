"""Feedback a student can read: `feedback/<student>/mha/feedback.html`, one self-contained file.

Made from the grading model alone (a `rows.Row`): the score, per part the checks (a row per check,
or per group of cases that came out the same way) with what failed and the diagnosis, or why a check was
not credited or waits for another part (`CheckResult.word`, docs/vocabulary.md); and when the speed part ran, its figures in words, the scored figure beside the bands that
score it, how it is scored, and a plot of the rounds. Everything is HTML-escaped (Jinja2's autoescape); the CSS is inline and the plot is
an inline PNG, so the file can be mailed, uploaded to an LMS or opened offline.

What a check shows follows its visibility in the rubric:

| visibility | before the due date | after (`released`: `--released`, `make grade RELEASED=1`) |
| --- | --- | --- |
| `visible` | name, result, message | the same |
| `after_due_date`, `after_published` | counted, not named | name, result, message |
| `hidden` | counted, not named | counted, not named |

A part's score always includes every check. What the submission printed is never shown: it can hold
the hidden inputs the checks passed to it.

A page is rewritten only when what it is made from changed (a fingerprint of the run, the student's
roster entry, `released` and this module's code and template, kept in the page's own `<meta>`), so a
class re-run with nothing changed writes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from autograder.atomic import write_text_atomically
from autograder.contract import ASSIGNMENT
from autograder.course.clean import clean_for_output
from autograder.course.rows import Row, feedback_path, page_is_current, shown
from autograder.course.store import COURSE_FILE_MODE
from autograder.model import (
    GradingRun,
    SpeedBands,
    SpeedFigures,
    WorkloadFigures,
    points_text,
)

TEMPLATES = Path(__file__).with_name("templates")
TEMPLATE = "feedback.html.j2"
_FINGERPRINT = re.compile(rb'<meta name="mha-feedback-fingerprint" content="([0-9a-f]+)">')


def template_environment() -> Environment:
    """The course outputs' templates (feedback pages, the class report), escaped as HTML."""
    return Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def withheld_text(count: int, never: int, released: bool, part: str = "") -> str:
    """What a part's page says of the checks it does not show (a check is one row, so the count is the same
    for every student). The quiz's answers are not checked on inputs: its checks are said otherwise."""
    texts = []
    plural = "s" if count > 1 else ""
    if count and part == "quiz":
        texts.append(
            f"{count} more check{plural} of your answers; {'their results are' if plural else 'its result is'} "
            "shown after the due date."
        )
    elif count:
        texts.append(
            f"{count} more check{plural} ran on hidden inputs; "
            f"{'their details are' if plural else 'its details are'} shown after the due date."
        )
    if never:
        texts.append(f"{never} check{'s' if never > 1 else ''} whose details are not shown.")
    return " ".join(texts)


# -- speed ----------------------------------------------------------------------------------------
# `run.speed` is the model's `SpeedFigures` (results.json's extra_data.speed): `bands` (the rubric's, as graded),
# and per workload (`workloads`) the figures of timing.summarize, or why its timing failed (`failed`).
ROLES = (("submission", "your forward"), ("reference", "the reference MultiHeadAttention"), ("wrapper", "the wrapper"))
SHOWN_UP_TO = 1.2  # the band bar runs from 0 to this fraction of the reference's speedup (or the figure, if more)


def speed_rule(bands: SpeedBands | None) -> str:
    """How the speed part scores, in words, from the bands the run was graded with."""
    if bands is None:
        return ""
    full, none = bands.full_credit_at, bands.no_credit_at
    text = (
        "Your forward and the reference's are timed against the same wrapper in the same run, so the machine "
        "cancels out: your speedup over the wrapper divided by the reference's is the figure that is scored. "
        f"Full points from {full:g}, none at {none:g} or below, in proportion in between."
    )
    give_up = bands.give_up_below
    if give_up:
        text += (
            f" A forward that, over its first measured rounds, runs at less than {give_up:g} of the reference's speed "
            f"even at its best (more than {1 / give_up:.3g} times slower than the reference) could not reach "
            f"{none:g}, so it is not timed further and earns no speed points."
        )
    return text


def band_bar(relative: float, bands: SpeedBands | None) -> dict[str, Any] | None:
    """Widths (percent) of the none / in proportion / full bands on a bar from 0, and where `relative` is."""
    if bands is None:
        return None
    top = max(SHOWN_UP_TO, relative * 1.05)
    none, full = bands.no_credit_at / top * 100, bands.full_credit_at / top * 100
    return {
        "none": round(none, 2),
        "partial": round(full - none, 2),
        "full": round(100 - full, 2),
        "mark": round(min(relative / top * 100, 100), 2),
    }


def workload_context(name: str, figures: WorkloadFigures, bands: SpeedBands | None) -> dict[str, Any]:
    """One timed workload: its figures as rows for people, the scored figure with the bands beside it."""
    if figures.relative is None:
        failed = figures.failed if figures.failed is not None else "not timed"
        return {"name": name, "failed": failed, "rows": [], "scored": None}
    times = figures.ms_per_call or {}
    rows = [(f"{label}, per call", f"{times[role]:.3g} ms") for role, label in ROLES]
    rows += [
        ("your speedup over the wrapper", f"{figures.speedup:.2f}x"),
        ("the reference's speedup over the wrapper, same run", f"{figures.reference_speedup:.2f}x"),
    ]
    spread = figures.relative_spread
    interval = figures.interval  # the verdict's interval for the median (`grading/verdict.py`)
    rounds = figures.rounds if figures.rounds is not None else "?"
    scored = {
        "label": f"yours divided by the reference's (median of {rounds} rounds)",
        "value": f"{figures.relative:.2f}",
        "spread": f"middle half of the rounds {spread.q1:.2f} to {spread.q3:.2f}" if spread else "",
        "interval": f"{interval[0]:.2f} to {interval[1]:.2f} ({interval[2]:.0%} interval)" if interval else "",
        "said": figures.said[:1000] if figures.said is not None else "",
        "bar": band_bar(figures.relative, bands),
        "bands": (
            f"full points from {bands.full_credit_at:g}, none at {bands.no_credit_at:g} or below" if bands else ""
        ),
        "credit": f"{figures.credit:.0%} of the speed points" if figures.credit is not None else "",
    }
    return {"name": name, "failed": "", "rows": rows, "scored": scored}


def speed_series(speed: SpeedFigures) -> dict[str, dict[str, list[float]]]:
    """Per workload, the per-round charged times (ms per call) of the three timed forwards."""
    series = {}
    for name, figures in speed.workloads.items():
        charged = (figures.per_round_ms or {}).get("charged") or {}
        rounds = {role: charged.get(role) or [] for role, _ in ROLES}
        if all(len(values) >= 2 and len(values) == len(rounds["submission"]) for values in rounds.values()):
            series[name] = rounds
    return series


def log_ticks(low: float, high: float) -> list[float]:
    """Ticks for a log axis from `low` to `high` (both > 0), at least two whatever the range: 1, 2 and 5
    times the powers of ten in it, else a few steps between them at two significant digits."""
    ticks = [
        m * 10.0**e
        for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
        for m in (1, 2, 5)
        if low <= m * 10.0**e <= high
    ]
    if len(ticks) >= 2:
        return ticks
    steps = [low * (high / low) ** (i / 3) for i in range(4)]
    return sorted({float(f"{t:.2g}") for t in steps if low <= float(f"{t:.2g}") <= high} | set(ticks)) or [low, high]


FIGURE_INCHES, ROW_INCHES = 9.0, 3.0  # a workload's row of the speed figure
MARGIN_INCHES = (0.9, 0.15, 0.6, 0.35, 0.95)  # left, right, bottom, top, and between rows
WSPACE = 0.2  # between a row's two plots, of a plot's width


def speed_plot(series: dict[str, dict[str, list[float]]], bands: SpeedBands | None) -> str:
    """`speed_figure` as a PNG, base64 for a data: URI."""
    figure = speed_figure(series, bands)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def speed_figure(series: dict[str, dict[str, list[float]]], bands: SpeedBands | None) -> Any:
    """Per workload, each round's time per call of the three (left, a log axis with at least two ticks),
    and each round's scored figure (the reference's time over yours: your speedup over the wrapper divided
    by the reference's) with the bands that score it (right)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, MaxNLocator, NullFormatter

    height = ROW_INCHES * len(series)
    figure = Figure(figsize=(FIGURE_INCHES, height), dpi=100)
    # Margins fixed in inches, wide enough for the widest labels the axes can get (a log axis's "0.0003", the
    # titles, the legends inside): `tight_layout` measured them for each figure, which drew it once more, half
    # of what a class run spent on its feedback pages' figures. tests/test_feedback.py checks that every label
    # of extreme figures stays inside the figure and clear of the other plot.
    left, right, bottom, top, gap = MARGIN_INCHES
    axes_height = (height - bottom - top - gap * (len(series) - 1)) / len(series)
    figure.subplots_adjust(
        left=left / FIGURE_INCHES,
        right=1 - right / FIGURE_INCHES,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=WSPACE,
        hspace=gap / axes_height,
    )
    axes = figure.subplots(len(series), 2, squeeze=False)
    for (name, rounds), (times, scored) in zip(series.items(), axes):
        x = range(1, len(rounds["submission"]) + 1)
        for role, label in ROLES:
            times.plot(x, rounds[role], marker="o", markersize=3, label=label)
        times.set_yscale("log")
        low, high = times.get_ylim()
        times.yaxis.set_major_locator(FixedLocator(log_ticks(low, high)))
        times.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        times.yaxis.set_minor_formatter(NullFormatter())
        times.set_ylabel("ms per call")
        times.set_title(name, fontsize=9)
        times.legend(fontsize=7)
        relative = [r / s for r, s in zip(rounds["reference"], rounds["submission"])]
        if bands is not None:
            top = max(SHOWN_UP_TO, max(relative) * 1.05)
            scored.axhspan(0, bands.no_credit_at, color="#ffcecb", label="no points")
            scored.axhspan(bands.no_credit_at, bands.full_credit_at, color="#fae17d", label="in proportion")
            scored.axhspan(bands.full_credit_at, top, color="#aceebb", label="full points")
            scored.set_ylim(0, top)
        scored.plot(x, relative, marker="o", markersize=3, color="#1f2328", label="yours / reference's")
        scored.set_ylabel("speedup, yours / reference's")
        scored.legend(fontsize=7, loc="lower right")
        for axis in (times, scored):
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.set_xlabel("round")
            axis.grid(alpha=0.3)
    return figure


def speed_context(speed: SpeedFigures) -> dict[str, Any]:
    bands = speed.bands
    series = speed_series(speed)
    return {
        "rule": speed_rule(bands),
        "workloads": [workload_context(n, f, bands) for n, f in speed.workloads.items()],
        "plot": speed_plot(series, bands) if series else "",
        "plot_alt": "per round, the time per call of your forward, the reference's and the wrapper's, and your "
        "speedup over the wrapper divided by the reference's, with the bands that score it: " + ", ".join(series),
    }


# -- the page --------------------------------------------------------------------------------------


def page_context(row: Row, released: bool) -> dict[str, Any]:
    run: GradingRun | None = row.run
    entry = row.entry
    parts: list[dict[str, Any]] = []
    context: dict[str, Any] = {  # names and notes are the student's: cleaned as worker strings are, then HTML-escaped
        "assignment": ASSIGNMENT,
        "student": clean_for_output(entry.shown, newlines=False),
        "submitted": entry.has_file,
        "file": clean_for_output(entry.file.name, newlines=False) if entry.file else "",
        "file_note": clean_for_output(entry.note) if entry.has_file else "",
        "file_note_missing": clean_for_output(entry.note),
        "graded": bool(run and run.graded),
        "reason": run.reason if run else "it has not been graded yet",
        "visibility_note": (
            "Every check counts in the score. Checks on hidden inputs are described after the due date."
            if not released
            else "Every check counts in the score. Some checks' details are never shown."
        ),
        "parts": parts,
    }
    if not (run and run.graded):
        return context
    context.update(
        score=points_text(run.score),
        max_score=points_text(run.max_score),
        headline=run.headline(lambda check: shown(check, released)),
        load_problems=run.load.loose_lines(),
        events=list(dict.fromkeys(run.events)),
    )
    not_done = run.not_done()  # said once, in the headline, with the load-time errors their stubs raised
    for part in run.parts():
        checks = [c for c in run.checks if c.part == part.part]
        visible = [c for c in checks if shown(c, released)]
        later = sum(not shown(c, released) and c.visibility != "hidden" for c in checks)
        never = sum(c.visibility == "hidden" for c in checks)
        parts.append(
            {
                "id": part.part,
                "title": part.title,
                "score": points_text(part.score),
                "max_score": points_text(part.max_score),
                "checks": [
                    {
                        "name": c.name,
                        "status": c.status,
                        "label": c.word,
                        "message": c.message,
                    }
                    for c in visible
                ],
                "withheld": withheld_text(later, never, released, part.part),
                # the load-time errors this part's mistake explains, once, here (its own checks say the mistake)
                "load": run.load.folded_line(part.part) if part.part not in not_done else "",
                "speed": None,
            }
        )
    if run.speed is not None:
        speed_part = next((p for p in parts if p["id"] == "speed"), None)
        if speed_part is None:
            speed_part = {
                "id": "speed",
                "title": run.titles.get("speed", "Speed"),
                "score": "-",
                "max_score": "-",
                "checks": [],
                "withheld": "",
                "speed": None,
            }
            parts.append(speed_part)
        speed_part["speed"] = speed_context(run.speed)
    return context


def renderer_fingerprint() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((TEMPLATES / TEMPLATE).read_bytes())
    digest.update(Path(__file__).with_name("rows.py").read_bytes())  # what a page may show (`rows.shown`)
    return digest.hexdigest()


def fingerprint(row: Row, released: bool, renderer: str) -> str:
    data = {
        "run": row.run.to_gradescope() if row.run else None,
        "entry": [row.entry.student, row.entry.status, row.entry.file.name if row.entry.file else None, row.entry.note],
        "released": released,
        "renderer": renderer,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def render(row: Row, released: bool = False, fingerprint_value: str = "") -> str:
    template = template_environment().get_template(TEMPLATE)
    return template.render(
        fingerprint=fingerprint_value or fingerprint(row, released, renderer_fingerprint()),
        **page_context(row, released),
    )


def write_feedback(course: Path, rows: list[Row], released: bool = False) -> int:
    """Write each student's page where it is missing or out of date; return how many were written."""
    return len(feedback_written(course, rows, released))


def feedback_written(course: Path, rows: list[Row], released: bool = False) -> list[str]:
    """Write each student's page where it is missing or out of date; return the students whose page was."""
    renderer = renderer_fingerprint()
    written = []
    for row in rows:
        path = feedback_path(course, row.student)
        value = fingerprint(row, released, renderer)
        if page_is_current(path, _FINGERPRINT, value):
            continue
        write_text_atomically(path, render(row, released, value), COURSE_FILE_MODE)
        written.append(row.student)
    return written
