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
from rich.progress import Progress
from rich.table import Table

from autograder.rubric import DEFAULT_RUBRIC

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


def up_to_date(job: Job, rubric: Path) -> bool:
    if not job.results.exists():
        return False
    newest_input = max(job.submission.stat().st_mtime, rubric.stat().st_mtime)
    return job.results.stat().st_mtime >= newest_input


def grade_one(job: Job, device: str, rubric: Path, timeout: float) -> dict:
    job.results.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "autograder", "grade", str(job.submission), "--out", str(job.results),
               "--device", device, "--rubric", str(rubric), "--quiet"]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        problem = None if run.returncode == 0 else (run.stderr.strip().splitlines() or ["no message"])[-1]
    except subprocess.TimeoutExpired:
        problem = f"grading took more than {timeout:g} s and was stopped"
    if problem or not job.results.exists():
        return {"score": 0, "max_score": 0, "problem": problem or "no results.json was written"}
    return json.loads(job.results.read_text())


def grade_class(course: Path, device: str = "auto", rubric: Path | None = None, jobs: int = 2,
                force: bool = False, timeout: float = 900) -> int:
    console = Console()
    rubric = rubric or DEFAULT_RUBRIC
    todo, empty = find_submissions(course)
    for student in empty:
        console.print(f"[yellow]{student}: no mha.ipynb or mha.py in submitted/{student}/{ASSIGNMENT}/[/]")
    results: dict[str, dict] = {}
    pending = []
    for job in todo:
        if not force and up_to_date(job, rubric):
            results[job.student] = json.loads(job.results.read_text())
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


def write_grades_csv(path: Path, results: dict[str, dict]):
    parts: list[str] = []
    for data in results.values():
        for test in data.get("tests", []):
            if test["tags"][0] not in parts:
                parts.append(test["tags"][0])
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "score", "max_score", *parts, "problem"])
        for student in sorted(results):
            data = results[student]
            by_part = {p: 0.0 for p in parts}
            for test in data.get("tests", []):
                by_part[test["tags"][0]] += test["score"]
            writer.writerow([student, data.get("score", 0), data.get("max_score", 0),
                             *(round(by_part[p], 2) for p in parts), data.get("problem", "")])


def print_class_table(console: Console, results: dict[str, dict]):
    table = Table(title="Class results")
    table.add_column("student")
    table.add_column("score", justify="right")
    table.add_column("note", overflow="fold")
    for student in sorted(results):
        data = results[student]
        note = data.get("problem") or next((line for line in data.get("output", "").splitlines()
                                            if line.startswith(("Your file", "Worker:"))), "")
        table.add_row(student, f"{data.get('score', 0):g} / {data.get('max_score', 0):g}", note[:160])
    console.print(table)
