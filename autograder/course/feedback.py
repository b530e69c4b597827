"""Feedback a student can read: `feedback/<student>/mha/feedback.html`, one self-contained file.

Made from the grading model alone (a `rows.Row`): the score, per part the checks with what
failed and the diagnosis, and the speed figures with a plot of the per-round measurements when the
speed part ran. Everything is HTML-escaped (Jinja2's autoescape); the CSS is inline and the plot is
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
import re
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from autograder.atomic import write_text_atomically
from autograder.course.clean import clean_text
from autograder.course.roster import ASSIGNMENT
from autograder.course.rows import Row
from autograder.course.store import COURSE_FILE_MODE
from autograder.model import CheckResult, GradingRun

TEMPLATES = Path(__file__).with_name("templates")
TEMPLATE = "feedback.html.j2"
SHOWN_BEFORE = {"visible"}
SHOWN_AFTER = {"visible", "after_due_date", "after_published"}
_FINGERPRINT = re.compile(rb'<meta name="mha-feedback-fingerprint" content="([0-9a-f]+)">')


def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html", "j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def shown(check: CheckResult, released: bool) -> bool:
    return check.visibility in (SHOWN_AFTER if released else SHOWN_BEFORE)


def withheld_text(count: int, never: int, released: bool) -> str:
    texts = []
    if count:
        texts.append(
            f"{count} more check{'s' if count > 1 else ''} ran on hidden inputs; "
            "their details are shown after the due date."
        )
    if never:
        texts.append(f"{never} check{'s' if never > 1 else ''} whose details are not shown.")
    return " ".join(texts)


# -- speed ----------------------------------------------------------------------------------------


def speed_figures(speed: dict) -> list[tuple[str, str]]:
    """The speed part's scalar measurements, as (name, value) rows; nested dicts one level deep."""
    rows = []
    for key, value in speed.items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, item in items:
            name = key.replace("_", " ") + (f" ({sub.replace('_', ' ')})" if sub else "")
            if isinstance(item, bool) or isinstance(item, str):
                rows.append((name, str(item)))
            elif isinstance(item, (int, float)):
                rows.append((name, f"{item:.4g}"))
    return rows


def speed_series(speed: dict) -> dict[str, list[float]]:
    """Per-round measurements: any list of numbers, or list of dicts of numbers, in `speed`."""
    series: dict[str, list[float]] = {}
    for key, value in speed.items():
        if not isinstance(value, list) or len(value) < 2:
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            series[key.replace("_", " ")] = [float(v) for v in value]
        elif all(isinstance(v, dict) for v in value):
            names = {k for v in value for k, x in v.items() if isinstance(x, (int, float)) and not isinstance(x, bool)}
            for name in sorted(names):
                points = [v.get(name) for v in value]
                if all(isinstance(p, (int, float)) for p in points):
                    series[f"{key.replace('_', ' ')}: {name.replace('_', ' ')}"] = [float(p) for p in points]
    return series


def speed_plot(series: dict[str, list[float]]) -> str:
    """A PNG of the per-round series (one line each), base64 for a data: URI."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.2), dpi=100)
    axes = figure.add_subplot()
    for name, values in series.items():
        axes.plot(range(1, len(values) + 1), values, marker="o", markersize=3, label=name)
    axes.set_xlabel("round")
    axes.set_title("Speed: per-round measurements")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# -- the page --------------------------------------------------------------------------------------


def page_context(row: Row, released: bool) -> dict:
    run: GradingRun | None = row.run
    entry = row.entry
    context = {  # names and notes are the student's: cleaned as worker strings are, then HTML-escaped
        "assignment": ASSIGNMENT,
        "student": clean_text(entry.student, newlines=False),
        "submitted": entry.has_file,
        "file": clean_text(entry.file.name, newlines=False) if entry.file else "",
        "file_note": clean_text(entry.note) if entry.has_file else "",
        "file_note_missing": clean_text(entry.note),
        "graded": bool(run and run.graded),
        "reason": run.reason if run else "it has not been graded yet",
        "visibility_note": (
            "Every check counts in the score. Checks on hidden inputs are described after the due date."
            if not released
            else "Every check counts in the score. Some checks' details are never shown."
        ),
        "parts": [],
    }
    if not (run and run.graded):
        return context
    context.update(
        score=f"{run.score:g}",
        max_score=f"{run.max_score:g}",
        load_problems=run.load.lines(),
        events=list(dict.fromkeys(run.events)),
    )
    for part in run.parts():
        checks = [c for c in run.checks if c.part == part.part]
        visible = [c for c in checks if shown(c, released)]
        later = sum(not shown(c, released) and c.visibility != "hidden" for c in checks)
        never = sum(c.visibility == "hidden" for c in checks)
        context["parts"].append(
            {
                "id": part.part,
                "title": part.title,
                "score": f"{part.score:.4g}",
                "max_score": f"{part.max_score:.4g}",
                "checks": [{"name": c.name, "status": c.status, "message": c.message} for c in visible],
                "withheld": withheld_text(later, never, released),
                "speed": None,
            }
        )
    if run.speed:
        speed_part = next((p for p in context["parts"] if p["id"] == "speed"), None)
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
            context["parts"].append(speed_part)
        series = speed_series(run.speed)
        speed_part["speed"] = {
            "figures": speed_figures(run.speed),
            "plot": speed_plot(series) if series else "",
            "plot_alt": "per-round measurements: " + ", ".join(series),
        }
    return context


def renderer_fingerprint() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((TEMPLATES / TEMPLATE).read_bytes())
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
    template = _environment().get_template(TEMPLATE)
    return template.render(
        fingerprint=fingerprint_value or fingerprint(row, released, renderer_fingerprint()),
        **page_context(row, released),
    )


def feedback_path(course: Path, student: str) -> Path:
    return Path(course) / "feedback" / student / ASSIGNMENT / "feedback.html"


def write_feedback(course: Path, rows: list[Row], released: bool = False) -> int:
    """Write each student's page where it is missing or out of date; return how many were written."""
    renderer = renderer_fingerprint()
    written = 0
    for row in rows:
        path = feedback_path(course, row.student)
        value = fingerprint(row, released, renderer)
        try:
            with open(path, "rb") as handle:
                match = _FINGERPRINT.search(handle.read(4096))
        except OSError:
            match = None
        if match and match.group(1).decode() == value:
            continue
        write_text_atomically(path, render(row, released, value), COURSE_FILE_MODE)
        written += 1
    return written
