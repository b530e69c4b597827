"""Grading a whole class: every assignments/submitted/<student>/mha/ submission, a few at a time.

Each submission is graded by its own `python -m autograder grade` process, so one that crashes,
hangs or floods its output never stops the others. Re-running grades only what changed.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from autograder.model import GradingRun
from autograder.rubric import DEFAULT_RUBRIC, RubricError, load_rubric

ASSIGNMENT = "mha"


@dataclass
class Job:
    student: str
    submission: Path
    results: Path


def find_submissions(course: Path) -> tuple[list[Job], list[str]]:
    """One job per student folder with a submission; the names of folders without one."""
    jobs, empty = [], []
    for folder in sorted((course / "submitted").glob(f"*/{ASSIGNMENT}")):
        student = folder.parent.name
        candidates = [folder / "mha.ipynb", folder / "mha.py"]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            empty.append(student)
            continue
        jobs.append(Job(student, found, course / "autograded" / student / ASSIGNMENT / "results.json"))
    return jobs, empty


def read_run(path: Path) -> GradingRun | None:
    """The grading model stored in a results.json, or None when there is none (or it is unreadable)."""
    try:
        return GradingRun.from_gradescope(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def up_to_date(job: Job, rubric: Path) -> GradingRun | None:
    """The last run, when it graded and is newer than its inputs; a run that could not grade is redone."""
    if not job.results.exists():
        return None
    newest_input = max(job.submission.stat().st_mtime, rubric.stat().st_mtime)
    if job.results.stat().st_mtime < newest_input:
        return None
    run = read_run(job.results)
    return run if run is not None and run.graded else None


def grade_one(job: Job, device: str, rubric: Path, timeout: float) -> GradingRun:
    job.results.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "autograder", "grade", str(job.submission), "--out", str(job.results),
               "--device", device, "--rubric", str(rubric), "--quiet"]
    try:
        subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        reason = "no readable results.json was written"
    except subprocess.TimeoutExpired:
        reason = f"grading took more than {timeout:g} s and was stopped"
    run = read_run(job.results)
    return run if run is not None else GradingRun(status="cannot_grade", submission=job.submission.name, reason=reason)


def grade_class(course: Path, device: str = "auto", rubric: Path | None = None, jobs: int = 2,
                force: bool = False) -> int:
    console = Console()
    rubric = rubric or DEFAULT_RUBRIC
    try:
        timeout = load_rubric(rubric).limit("class_seconds")
    except RubricError as exc:
        console.print(f"cannot grade: {exc}", style="red", markup=False)
        return 2
    todo, empty = find_submissions(course)
    for student in empty:
        console.print(f"[yellow]{student}: no mha.ipynb or mha.py in submitted/{student}/{ASSIGNMENT}/[/]")
    results: dict[str, GradingRun] = {}
    pending = []
    for job in todo:
        previous = None if force else up_to_date(job, rubric)
        if previous is not None:
            results[job.student] = previous
        else:
            pending.append(job)
    console.print(f"{len(todo)} submissions: {len(pending)} to grade, {len(todo) - len(pending)} already graded")
    with Progress(console=console) as progress, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        task = progress.add_task("grading", total=len(pending))
        futures = {pool.submit(grade_one, job, device, rubric, timeout): job for job in pending}
        for future in as_completed(futures):
            job = futures[future]
            results[job.student] = future.result()
            progress.advance(task)
    write_grades_csv(course / "grades.csv", results)
    print_class_table(console, results)
    return 0


def write_grades_csv(path: Path, results: dict[str, GradingRun]):
    parts: list[str] = []
    for run in results.values():
        for part in run.parts():
            if part.part not in parts:
                parts.append(part.part)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "score", "max_score", *parts, "status", "problem"])
        for student in sorted(results):
            run = results[student]
            by_part = {p.part: p.score for p in run.parts()}
            writer.writerow([student, run.score, run.max_score, *(by_part.get(p, 0.0) for p in parts), run.status,
                             run.reason or (run.load.lines() or [""])[0]])


def print_class_table(console: Console, results: dict[str, GradingRun]):
    table = Table(title="Class results")
    table.add_column("student")
    table.add_column("score", justify="right")
    table.add_column("note", overflow="fold")
    for student in sorted(results):
        run = results[student]
        note = run.reason or next(iter(run.load.lines() + [f"Worker: {e}" for e in run.events]), "")
        score = f"{run.score:g} / {run.max_score:g}" if run.graded else "could not grade"
        table.add_row(escape(student), score, escape(note[:160]))
    console.print(table)
