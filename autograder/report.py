"""The terminal summary: per part, points and the first failure's diagnosis."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autograder.rubric import Rubric
from autograder.scoring import part_summary


def print_summary(results: dict, rubric: Rubric, visible_only: bool = False, console: Console | None = None):
    console = console or Console(highlight=False)
    table = Table(title="Visible checks" if visible_only else "Score by part", show_lines=False)
    table.add_column("part")
    table.add_column("checks", justify="right")
    if not visible_only:
        table.add_column("points", justify="right")
    table.add_column("first problem", overflow="fold")
    for entry in part_summary(results):
        failure = entry["first_failure"]
        problem = "" if failure is None else f"{failure['name'].split(': ', 1)[-1]}\n{failure['output']}".strip()
        row = [entry["part"], f"{entry['passed']}/{entry['total']}"]
        if not visible_only:
            row.append(f"{entry['score']:.4g}/{entry['max_score']:.4g}")
        row.append(escape(_short(problem)))
        table.add_row(*row, style="green" if failure is None else None)
    console.print(table)
    if not visible_only:
        console.print(f"Total: {results['score']:g} / {results['max_score']:g}   "
                      f"({results['execution_time']:.1f} s, device {results['extra_data'].get('device')}, "
                      f"isolation {results['extra_data'].get('isolation')})")
    first_lines = [line for line in results.get("output", "").splitlines() if line.startswith(("Your file", "While loading"))]
    for line in first_lines[:5]:
        console.print(escape(line), style="yellow")


def _short(text: str, lines: int = 8) -> str:
    parts = text.splitlines()
    return "\n".join(parts[:lines] + (["..."] if len(parts) > lines else []))
