"""The terminal summary of one grading run: per part, points and the first problem's diagnosis."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autograder.model import GradingRun, points_text


def print_summary(run: GradingRun, visible_only: bool = False, console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    table = Table(title="Visible checks" if visible_only else "Score by part", show_lines=False)
    table.add_column("part")
    table.add_column("checks", justify="right")
    if not visible_only:
        table.add_column("points", justify="right")
    table.add_column("first problem", overflow="fold")
    for part in run.parts():
        failure = part.first_failure
        problem = "" if failure is None else f"{failure.name}\n{failure.message}".strip()
        row = [part.part, f"{part.passed}/{part.total}"]
        if not visible_only:
            row.append(f"{points_text(part.score)}/{points_text(part.max_score)}")
        row.append(escape(_short(problem)))
        table.add_row(*row, style="green" if failure is None else None)
    console.print(table)
    if not visible_only:
        console.print(
            f"Total: {points_text(run.score)} / {points_text(run.max_score)}   ({run.execution_time:.1f} s, device {run.device}, "
            f"isolation {run.isolation})"
        )
    if not visible_only and (run.load.problem or run.load.cells) and (headline := run.headline()):
        console.print(escape(headline), style="yellow")
    for line in run.load.loose_lines()[:5]:
        console.print(escape(line), style="yellow")
    not_done = run.not_done()
    for part in run.parts():
        if part.part not in not_done and (folded := run.load.folded_line(part.part)):
            console.print(escape(f"{folded}: they use part {part.part}, whose first problem is above"), style="yellow")
    for flag in run.flags:
        console.print(escape(f"Flagged for the instructor: {flag}"), style="yellow")
    if visible_only:
        parts = run.parts()
        done = [p.part for p in parts if p.first_failure is None]
        console.print(
            f"{sum(p.passed for p in parts)} of {sum(p.total for p in parts)} visible checks passed; "
            f"{len(done)} of {len(parts)} parts passed every one"
            + (f" ({', '.join(done)})" if done and len(done) < len(parts) else "")
            + ". The grader runs more checks, on inputs you do not see."
        )


def _short(text: str, lines: int = 8) -> str:
    parts = text.splitlines()
    return "\n".join(parts[:lines] + (["..."] if len(parts) > lines else []))
