"""Grading a whole class: every assignments/submitted/<student>/mha/ submission, a few at a time.

Each submission is graded by its own `python -m autograder grade` process, so one that crashes,
hangs or floods its output never stops the others. Re-running grades only what changed.

A class can be split into shards graded on many machines (`--shard K/N`, see `autograder.shard`):
a shard writes only its own students' results. `merge_class` (`--merge`) then writes the class's
outputs from everyone's results without grading anything; `write_class_outputs` is the one step
that writes them, whether after a merge or after grading the whole class in one run.
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

from autograder.atomic import open_atomically
from autograder.devices import NoDevice, Placement, placement_for
from autograder.model import GradingRun
from autograder.rubric import DEFAULT_RUBRIC, RubricError, load_rubric
from autograder.shard import Shard, engine_index_in

ASSIGNMENT = "mha"
EXIT_DONE, EXIT_MERGE_INCOMPLETE, EXIT_CANNOT_GRADE = 0, 1, 2


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


def warn_empty(console: Console, empty: list[str]):
    for student in empty:
        console.print(f"[yellow]{student}: no mha.ipynb or mha.py in submitted/{student}/{ASSIGNMENT}/[/]")


def is_current(job: Job, rubric: Path) -> bool:
    """The student's results.json exists and is newer than its inputs (the submission and the rubric)."""
    if not job.results.exists():
        return False
    newest_input = max(job.submission.stat().st_mtime, rubric.stat().st_mtime)
    return job.results.stat().st_mtime >= newest_input


def up_to_date(job: Job, rubric: Path) -> GradingRun | None:
    """The last run, when it graded and is newer than its inputs; a run that could not grade is redone."""
    if not is_current(job, rubric):
        return None
    run = read_run(job.results)
    return run if run is not None and run.graded else None


def grade_one(job: Job, device: str, rubric: Path, timeout: float, env: dict[str, str] | None = None) -> GradingRun:
    job.results.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "autograder", "grade", str(job.submission), "--out", str(job.results),
               "--device", device, "--rubric", str(rubric), "--quiet"]
    try:
        subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        reason = "no readable results.json was written"
    except subprocess.TimeoutExpired:
        reason = f"grading took more than {timeout:g} s and was stopped"
    run = read_run(job.results)
    return run if run is not None else GradingRun(status="cannot_grade", submission=job.submission.name, reason=reason)


def grade_placed(placement: Placement, job: Job, rubric: Path, timeout: float) -> GradingRun:
    with placement.slot() as env:
        return grade_one(job, placement.device, rubric, timeout, env)


def grade_class(course: Path, device: str = "auto", rubric: Path | None = None, jobs: int | None = None,
                force: bool = False, shard: Shard | None = None) -> int:
    console = Console()
    rubric = rubric or DEFAULT_RUBRIC
    try:
        timeout = load_rubric(rubric).limit("class_seconds")
        placement = placement_for(device)
    except (RubricError, NoDevice) as exc:
        console.print(f"cannot grade: {exc}", style="red", markup=False)
        return EXIT_CANNOT_GRADE
    jobs = jobs or max(2, len(placement.devices))
    todo, empty = find_submissions(course)
    if shard is not None:
        todo, empty = shard_share(console, shard, todo, empty)
    elif engine_variable := engine_index_in():
        console.print(f"[yellow]{engine_variable} is set, but without --shard this grades the whole class; "
                      "--shard auto grades this task's share[/]")
    if placement.devices:
        console.print(f"{jobs} at a time on {len(placement.devices)} CUDA device(s): "
                      f"{', '.join(placement.devices)}, one per grading process")
    warn_empty(console, empty)
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
        futures = {pool.submit(grade_placed, placement, job, rubric, timeout): job for job in pending}
        for future in as_completed(futures):
            job = futures[future]
            results[job.student] = future.result()
            progress.advance(task)
    if shard is not None:
        print_class_table(console, results, title=f"Shard {shard}")
        console.print(f"shard {shard} done; once every shard is, `grade-class {course} --merge` writes the class's outputs")
        return EXIT_DONE
    write_class_outputs(course, results, console)
    return EXIT_DONE


def shard_share(console: Console, shard: Shard, todo: list[Job], empty: list[str]) -> tuple[list[Job], list[str]]:
    """The jobs and empty folders of this shard's students (the split is over every student folder)."""
    everyone = [job.student for job in todo] + empty
    mine = set(shard.select(everyone))
    console.print(f"shard {shard}: {len(mine)} of the class's {len(everyone)} students")
    return [job for job in todo if job.student in mine], [student for student in empty if student in mine]


def merge_class(course: Path, rubric: Path | None = None) -> int:
    """Write the class's outputs from the results already there (shards' or earlier runs'), grading
    nothing. A run that could not grade counts as it does after a whole-class run (a row saying so).
    When a student with a submission has no current results, say who, write nothing, and return
    EXIT_MERGE_INCOMPLETE: grade them (their shard again, or plain grade-class) and merge again."""
    console = Console()
    rubric = rubric or DEFAULT_RUBRIC
    todo, empty = find_submissions(course)
    warn_empty(console, empty)
    results: dict[str, GradingRun] = {}
    missing: dict[str, str] = {}
    for job in todo:
        if not job.results.exists():
            missing[job.student] = "not graded"
        elif not is_current(job, rubric):
            missing[job.student] = "graded before its submission or the rubric changed"
        elif (run := read_run(job.results)) is None:
            missing[job.student] = "its results.json is unreadable, or was not written by this grader"
        else:
            results[job.student] = run
    if missing:
        console.print(f"[red]cannot merge: {len(missing)} of {len(todo)} students have no up-to-date results; "
                      "nothing was written[/]")
        for student, why in sorted(missing.items()):
            console.print(f"  {escape(student)}: {why}")
        console.print(f"grade them (their shard again, or `grade-class {escape(str(course))}`, which grades only "
                      "what is missing) and merge again")
        return EXIT_MERGE_INCOMPLETE
    console.print(f"merged the results of {len(results)} students")
    write_class_outputs(course, results, console)
    return EXIT_DONE


def write_class_outputs(course: Path, results: dict[str, GradingRun], console: Console):
    """Every output about the whole class, from every student's grading run: the one place a class
    output is written (after grading the whole class, and by a merge of shards alike)."""
    write_grades_csv(course / "grades.csv", results)
    print_class_table(console, results)


def write_grades_csv(path: Path, results: dict[str, GradingRun]):
    parts: list[str] = []
    for run in results.values():
        for part in run.parts():
            if part.part not in parts:
                parts.append(part.part)
    with open_atomically(path) as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "score", "max_score", *parts, "status", "problem"])
        for student in sorted(results):
            run = results[student]
            by_part = {p.part: p.score for p in run.parts()}
            writer.writerow([student, run.score, run.max_score, *(by_part.get(p, 0.0) for p in parts), run.status,
                             run.reason or (run.load.lines() or [""])[0]])


def print_class_table(console: Console, results: dict[str, GradingRun], title: str = "Class results"):
    table = Table(title=title)
    table.add_column("student")
    table.add_column("score", justify="right")
    table.add_column("note", overflow="fold")
    for student in sorted(results):
        run = results[student]
        note = run.reason or next(iter(run.load.lines() + [f"Worker: {e}" for e in run.events]), "")
        score = f"{run.score:g} / {run.max_score:g}" if run.graded else "could not grade"
        table.add_row(escape(student), score, escape(note[:160]))
    console.print(table)
