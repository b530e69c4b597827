"""Grading one submission: read it, start its worker, run the checks, write results, summarise.

The steps are small functions; the data between them is plain (cells, a rubric, a results dict).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from autograder.checks.fixtures import GradingContext, GradingFixtures
from autograder.checks.harness import Inputs, Submission
from autograder.plugin import ResultsPlugin, write_json_atomically
from autograder.report import print_summary
from autograder.rubric import Rubric, RubricError, load_rubric
from autograder.submission import SubmissionFormatError, read_cells
from autograder.worker import Worker, WorkerConfig, WorkerError

CHECKS_DIR = Path(__file__).with_name("checks")


class GraderBroken(RuntimeError):
    """The grader itself cannot grade (a broken installation): exit non-zero, say so in results.json."""
EXIT_GRADED, EXIT_CANNOT_GRADE = 0, 2


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def worker_config(rubric: Rubric, device: str, hide: list[str], isolation: str) -> WorkerConfig:
    return WorkerConfig(
        device=device,
        memory_bytes=int(rubric.limit("memory_gib") * (1 << 30)),
        load_seconds=rubric.limit("load_seconds"),
        cell_seconds=rubric.limit("cell_seconds"),
        request_seconds=rubric.limit("request_seconds"),
        output_bytes=int(rubric.limit("output_kib") * 1024),
        isolation=isolation,
        hide=hide,
    )


def run_checks(context: GradingContext, rubric: Rubric, visible_only: bool,
               meta: dict, verbose: bool = False) -> dict:
    """Run the pytest checks in this (trusted) process; the plugin builds and writes results."""
    timeout = rubric.limit("load_seconds") + 4 * rubric.limit("request_seconds") + 30
    results_plugin = ResultsPlugin(rubric, visible_only, meta)
    args = [str(CHECKS_DIR), "-c", str(CHECKS_DIR / "pytest.ini"), "--rootdir", str(CHECKS_DIR),
            "--noconftest", "-p", "no:cacheprovider", "-p", "pytest_timeout", f"--timeout={timeout:g}",
            "-q", "--no-header", "-rN"]
    stream = io.StringIO()
    previous = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        with contextlib.redirect_stdout(stream):
            code = pytest.main(args, plugins=[GradingFixtures(context), results_plugin])
    finally:
        if previous is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = previous
    if verbose or results_plugin.results is None or code not in (0, 1):
        sys.stderr.write(stream.getvalue())
    if results_plugin.results is None or code not in (0, 1):
        # 0: all passed, 1: some failed. Anything else is the grader's own trouble (a check module
        # that does not import, a usage error), never the submission's.
        raise GraderBroken(f"the checks could not run (pytest exit code {int(code)}); see the log above")
    return results_plugin.results


def grade_submission(path: Path, device: str = "auto", out: Path | None = Path("results.json"),
                     rubric_path: Path | None = None, visible_only: bool = False, quiet: bool = False,
                     isolation: str = "auto", seed: int | None = None) -> int:
    started = time.monotonic()
    path = Path(path)
    try:
        rubric = load_rubric(rubric_path)
        device = resolve_device(device)
    except (RubricError, RuntimeError) as exc:
        return cannot_grade(out, str(exc), started)
    if not path.is_file():
        return cannot_grade(out, f"no such submission file: {path}", started)

    load_problem = None
    try:
        cells = read_cells(path)
    except SubmissionFormatError as exc:
        cells, load_problem = [], str(exc)
    hide = [str(path.resolve().parent)] + ([str(Path(out).resolve().parent)] if out else [])
    try:
        worker = Worker(cells, path.name, worker_config(rubric, device, hide, isolation))
    except WorkerError as exc:
        return cannot_grade(out, str(exc), started)
    if load_problem:
        worker.load_failure = load_problem
    inputs = Inputs(seed)
    context = GradingContext(Submission(worker, device), rubric, device, inputs)
    meta = {"submission": path.name, "device": device, "isolation": worker.isolation, "seed": inputs.seed,
            "torch": torch.__version__, "visible_only": visible_only}
    try:
        results = run_checks(context, rubric, visible_only, meta)
    except GraderBroken as exc:
        return cannot_grade(out, str(exc), started)
    finally:
        worker.close()
    results["execution_time"] = round(time.monotonic() - started, 2)
    results["output"] = student_output(worker)
    results["extra_data"]["worker_starts"] = worker.starts
    if out is not None:
        write_json_atomically(out, results)
    if not quiet:
        print_summary(results, rubric, visible_only=visible_only)
    return EXIT_GRADED


def student_output(worker: Worker) -> str:
    lines = [f"Isolation: {worker.isolation}."]
    if worker.load_failure:
        lines.append(f"Your file could not be loaded: {worker.load_failure}")
    for error in (worker.load_report or {}).get("errors", []):
        lines.append(f"While loading, cell {error['cell']} raised {error['type']}: {error['message']}")
    lines += [f"Worker: {event}" for event in dict.fromkeys(worker.events)]
    captured = worker.output().strip()
    if captured:
        lines.append("What your code printed (truncated):\n" + captured)
    return "\n".join(lines)


def cannot_grade(out: Path | None, message: str, started: float) -> int:
    print(f"cannot grade: {message}", file=sys.stderr)
    if out is not None:
        write_json_atomically(out, {"score": 0, "max_score": 0, "execution_time": round(time.monotonic() - started, 2),
                                    "output": f"This submission could not be graded: {message}", "tests": []})
    return EXIT_CANNOT_GRADE
