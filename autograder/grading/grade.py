"""Grading one submission, as a sequence of small steps:

    load the rubric -> choose the device -> read the file -> start its worker -> run the checks
    -> assemble the grading model -> write results.json -> print the summary

Each step is a function of plain data; the model (`model.GradingRun`) is built once, at the end, and
everything written or printed is made from it. A run that cannot grade (a broken rubric, a file that
is not a submission, a fault of the grader's own in a check) says so in results.json and exits 2.
"""

from __future__ import annotations

import contextlib
import io
import resource
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import NoReturn

import pytest
import torch

from autograder.grading import submission as reader
from autograder.grading import timing
from autograder.grading.checks.fixtures import GradingContext, GradingFixtures
from autograder.grading.checks.harness import Notes, Submission, new_run_seed, noting
from autograder.grading.devices import QuietLock
from autograder.grading.load_parts import cell_parts
from autograder.grading.plugin import ResultsPlugin
from autograder.grading.report import print_summary
from autograder.grading.scoring import score
from autograder.grading.workers import EarlyStart, grades_speed, hidden_folders, start_trusted_workers, worker_config
from autograder.model import (
    CANNOT_GRADE,
    FAILED,
    GRADED,
    CheckResult,
    GradingRun,
    LoadReport,
    RunStatus,
    clean_strings,
    write_results,
    write_unfinished,
)
from autograder.rubric import Rubric, RubricError, load_rubric
from autograder.sandbox import exposure, machine
from autograder.sandbox.client import WireCell, Worker, WorkerError
from autograder.sandbox.settings import WorkerConfig

CHECKS_DIR = Path(__file__).with_name("checks")
EXIT_GRADED, EXIT_CHECKS_FAILED, EXIT_CANNOT_GRADE = 0, 1, 2
# torch threads of the grader itself. Its tensors are the checks' small inputs, which one thread computes
# faster than two can agree on them: each operation with a second thread waits for it to be scheduled, which
# on a busy machine costs far more than the work (a grading of the reference's twin took 6 to 8 s of the
# grader's CPU with 2 threads, 1.8 s with one, on a 2-core machine at load 19). Timing runs in the workers.
GRADER_THREADS = 1


class CannotGrade(Exception):
    """The run cannot grade; the message says why (never the student's fault)."""


@dataclass
class Options:
    device: str = "auto"
    out: Path | None = Path("results.json")
    rubric_path: Path | None = None
    visible_only: bool = False
    quiet: bool = False
    isolation: str = "auto"
    seed: int | None = None
    parts: tuple[str, ...] | None = None  # grade only these parts (None: all)
    checks: tuple[str, ...] | None = None  # run only these checks, "module::function[case]" (explain; None: all)
    kept_workers: timing.KeptWorkers | None = None  # a long-lived grading process's reference timing workers
    early: EarlyStart | None = None  # workers started before the grader's imports (`python -m autograder grade`)
    placeholder_written: bool = False  # `out` already says the grading did not finish (`model.write_unfinished`)
    notes: Notes | None = None  # keep what the checks sent and compared (explain)
    stop: StopSignal | None = None  # what stops this grading on SIGTERM, and which signal did (`grade_command`)


# -- the steps ----------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CannotGrade("--device cuda was asked for, but torch sees no CUDA device")
    if device not in ("cpu", "cuda"):
        raise CannotGrade(f"unknown device {device!r}")
    return device


def read_submission(path: Path) -> tuple[list[WireCell], str | None]:
    """The file's code cells as [number, first line, source], or no cells and why the file cannot be
    loaded (the student's problem: graded, 0 points). A path that is not a submission file at all
    (missing, a directory) cannot be graded."""
    try:
        cells = reader.read_cells(path)
    except reader.SubmissionFormatError as exc:
        return [], str(exc)
    except reader.NotASubmission as exc:
        raise CannotGrade(str(exc)) from None
    return [(cell.number, cell.line, cell.source) for cell in cells], None


def check_timeout(rubric: Rubric) -> float:
    """pytest-timeout's limit on one check. It is only a backstop for the grader's own hangs (when it fires,
    the run cannot grade), so it lies above every budget a check can use, and never fires first. The longest
    check is the speed part's, run first: the worker's first start (Python and torch, then the file, within
    `load_seconds` each), the check's budget before the timing lock, the reference's timing workers' start
    (`load_seconds` twice) and their two builds (`request_seconds` each), the lock's wait (`lock_seconds`),
    the check's budget again once it is held, and 30 s for killing and cleaning up; and what the submission's
    requests may wait for other gradings' timing, in all (`lock_seconds` again: `devices.QuietLock`), which
    no budget is charged. A restart of the worker inside a check gets at most what is left of the check's
    budget (`Submission`)."""
    limits = rubric.limits
    load, check, request = limits.load_seconds, limits.check_seconds, limits.request_seconds
    lock = rubric.speed.lock_seconds if rubric.speed is not None else 0.0
    return 2 * load + check + 2 * load + 2 * request + lock + check + 30 + lock


def run_checks(
    context: GradingContext,
    rubric: Rubric,
    visible_only: bool,
    verbose: bool = False,
    parts: tuple[str, ...] | None = None,
    checks: tuple[str, ...] | None = None,
) -> ResultsPlugin:
    """Run the pytest checks in this (trusted) process, with the grader's own configuration only."""
    timeout = check_timeout(rubric)
    plugin = ResultsPlugin(rubric, visible_only, parts, checks)
    args = [
        str(CHECKS_DIR),
        "-c",
        str(CHECKS_DIR / "pytest.ini"),
        "--rootdir",
        str(CHECKS_DIR),
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "--disable-plugin-autoload",  # no plugin installed beside the grader joins in: only these
        "-p",
        "pytest_timeout",
        f"--timeout={timeout:g}",
        # its gc.collect() at the end of every session costs about a second in a grader holding torch
        "-p",
        "no:unraisableexception",
        "-p",
        "no:logging",  # no check logs; its handlers, added and removed around every phase of every check, cost CPU
        "-q",
        "--no-header",
        "-rN",
    ]
    stream = io.StringIO()
    with contextlib.redirect_stdout(stream), noting(context.notes):
        code = pytest.main(args, plugins=[GradingFixtures(context), plugin])
    if verbose:
        sys.stderr.write(stream.getvalue())
    if code not in (0, 1) and not plugin.grader_errors:
        # 0: all passed, 1: some failed. Anything else (a check module that does not import, a usage
        # error) is the grader's own trouble.
        tail = "\n".join(stream.getvalue().strip().splitlines()[-15:])
        plugin.error(f"the checks could not run (pytest exit code {int(code)}):\n{tail}")
    return plugin


def start_worker(cells: list[WireCell], filename: str, config: WorkerConfig, options: Options) -> Worker:
    """The submission's worker. Without any sandbox on this machine, `grade` refuses unless process
    isolation was asked for explicitly; `check` (a student running the visible checks on their own
    code) goes on without one, and says so."""
    try:
        return Worker(cells, filename, config)
    except WorkerError:
        if not (options.visible_only and config.isolation == "auto"):
            raise
    worker = Worker(cells, filename, replace(config, isolation="process"))
    worker.events.append("no sandbox is available on this machine: your code ran as your own user")
    return worker


def say_closed(paths: list[str]) -> None:
    """What the grader closed of its own files before a worker could read them (`exposure.close_own`)."""
    if paths:
        print(
            f"note: closed the grader's own files to other users (chmod o-rwx), the virtualenv kept: {', '.join(paths)}: "
            "each worker runs as a fresh uid outside the sandbox here",
            file=sys.stderr,
        )


def resources(worker: Worker) -> dict[str, float]:
    """What the grading used: the grader's own peak memory, the worker's (all its processes together,
    where a control group measured it) and the worker's CPU time."""
    used = {
        "grader_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "worker_cpu_seconds": round(worker.cpu_spent, 2),
    }
    if worker.memory_peak is not None:
        used["worker_peak_mib"] = round(worker.memory_peak / (1 << 20), 1)
    return used


def load_report(worker: Worker, problem: str | None) -> LoadReport:
    report = worker.load_report
    cells = list(report.errors) if report else []
    return LoadReport(
        problem=problem or worker.load_failure, cells=cells, defined=dict(report.defined) if report else {}
    )


# -- the pipeline ------------------------------------------------------------------------------


def grade_submission(path: Path, options: Options) -> GradingRun:
    """Grade one file into a `GradingRun` (status graded or cannot_grade). Never raises for the
    submission's sake; only a broken installation escapes as an exception. Each step returns what it found;
    the run is made once, from them, where the grading ends."""
    started = time.monotonic()
    torch.set_num_threads(GRADER_THREADS)
    path = Path(path)
    here = machine.survey()
    device = ""
    try:
        rubric = load_rubric(options.rubric_path)
        unknown = sorted(set(options.parts or ()) - set(rubric.parts))
        if unknown:
            raise CannotGrade(f"no such part: {', '.join(unknown)} (the rubric's parts: {', '.join(rubric.parts)})")
        device = resolve_device(options.device)
        cells, problem = read_submission(path)
        config = worker_config(rubric, device, hidden_folders(path, options.out), options.isolation)
        exposed = exposure.problem(config.isolation, rubric.path)
        if exposed:  # a worker could read the reference's solution: no student code runs here until it cannot
            raise CannotGrade(exposed)
        say_closed(exposure.close_own(config.isolation, rubric.path))
        worker = (options.early and options.early.adopt(config, cells, path.name)) or start_worker(
            cells, path.name, config, options
        )
    except (RubricError, CannotGrade, WorkerError, exposure.CannotClose) as exc:
        if options.early:
            options.early.close()
        reason = str(exc)
        if isinstance(exc, WorkerError) and here.isolation is None and here.advice:
            reason += f". What would fix it here: {here.advice}"
        return GradingRun(
            status=CANNOT_GRADE,
            submission=path.name,
            device=device,
            seed=options.seed,
            torch=torch.__version__,
            visible_only=options.visible_only,
            reason=reason,
            execution_time=time.monotonic() - started,
            machine=here.summary(),
        )
    if problem:
        worker.refuse_load(problem)
    seed = new_run_seed() if options.seed is None else options.seed
    context = grading_context(worker, rubric, device, seed, options)
    plugin = checked(context, worker, rubric, options)
    used = here.summary(used=worker.isolation)  # the machine as this grading used it
    if worker.fresh_because:
        used["workers"] = f"started fresh, not forked from a fork server: {worker.fresh_because}"
    used_resources = resources(worker)
    load = load_report(worker, problem)
    execution_time = time.monotonic() - started
    outcome = scored(plugin, rubric, worker, load)
    return GradingRun(
        status=outcome.status,
        submission=path.name,
        device=device,
        isolation=worker.isolation,  # after the run: a fallback may have changed it
        sandbox=dict(worker.in_force),
        seed=seed,
        torch=torch.__version__,
        visible_only=options.visible_only,
        reason=outcome.reason,
        cannot_grade_cause=outcome.cause,
        checks=outcome.checks,
        load=outcome.load,
        events=list(dict.fromkeys(worker.events)),
        student_output=worker.output(),
        execution_time=execution_time,
        worker_starts=worker.starts,
        resources=used_resources,
        speed=context.speed,
        flags=list(context.flags),
        grader_errors=outcome.grader_errors,
        titles=outcome.titles,
        machine=used,
    )


@dataclass(frozen=True)
class Scored:
    """What the checks' outcomes come to: graded, with the scored checks, the rubric's part titles and the load
    report with the cells each part explains; or, where the grader itself failed, why (and no score)."""

    status: RunStatus
    load: LoadReport
    checks: list[CheckResult] = field(default_factory=list)
    titles: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    cause: str = ""
    grader_errors: list[str] = field(default_factory=list)


def grading_context(worker: Worker, rubric: Rubric, device: str, seed: int, options: Options) -> GradingContext:
    """What the checks share: the submission's door (its worker prestarted: Python and torch load while the checks
    are collected), the quiet lock where someone may time on this machine, and the reference's timing workers
    when the speed part is graded, started now in the background (or adopted, or kept from the last grading)."""
    worker.prestart()  # the file waits for a check
    context = GradingContext(
        Submission(worker, device, rubric.limits.check_seconds), rubric, device, seed, notes=options.notes
    )
    if rubric.speed is not None:  # someone may time on this machine: the submission's code runs only in its requests
        context.quiet = worker.quiet = QuietLock(rubric.speed.lock_seconds)
    if grades_speed(rubric, options.parts):
        start = options.kept_workers.get if options.kept_workers else start_trusted_workers
        context.timing_workers = (options.early and options.early.timing_for(worker.config)) or start(worker.config)
    if options.early:
        options.early.close()  # what this grading did not adopt
    return context


def checked(context: GradingContext, worker: Worker, rubric: Rubric, options: Options) -> ResultsPlugin:
    """The checks run (`run_checks`); then every process of the submission is gone before anything is written,
    the timing workers not kept are closed (all of them after any trouble: the next grading starts them afresh),
    and a grading stopped by a signal says so first."""
    plugin = None
    try:
        plugin = run_checks(context, rubric, options.visible_only, parts=options.parts, checks=options.checks)
    finally:
        worker.close()
        for timing_worker in context.timing_workers.values():
            if not timing_worker.kept:
                timing_worker.close()
        if options.kept_workers and (plugin is None or plugin.grader_errors):
            options.kept_workers.close()
    if options.stop and options.stop.signum is not None:
        stopped = signal.Signals(options.stop.signum).name
        plugin.error(f"grading was stopped ({stopped}) before it finished", first=True)
    return plugin


def scored(plugin: ResultsPlugin, rubric: Rubric, worker: Worker, load: LoadReport) -> Scored:
    """The checks' outcomes scored by the rubric, or, after a fault of the grader's own, why it cannot grade."""
    if plugin.grader_errors:
        return Scored(
            status=CANNOT_GRADE,
            load=load,
            reason=(
                "the grader itself failed (not your submission's fault); it will be graded again: "
                + plugin.grader_errors[0].splitlines()[0]
            ),
            cause=plugin.errors[0].cause,  # why, when the first says
            grader_errors=plugin.grader_errors,
        )
    checks = score(list(plugin.outcomes.values()), rubric)
    failing = {check.part for check in checks if check.status == FAILED}
    return Scored(
        status=GRADED,
        load=replace(load, cell_parts=cell_parts(worker.cells, load.cells, failing)),
        checks=checks,
        titles={part: rubric.part_title(part) for part in rubric.parts},
    )


class Stopped(KeyboardInterrupt):
    """The grading process was asked to stop (SIGTERM): pytest stops, the worker is killed, and
    results.json says the run did not finish."""


@dataclass
class StopSignal:
    """The handler of the signal that stops one grading (`grade_command`'s SIGTERM): it remembers the signal,
    for results.json to say, and raises `Stopped`."""

    signum: int | None = None  # the signal that stopped the grading, once one has

    def __call__(self, signum: int, frame: FrameType | None) -> NoReturn:
        if self.signum is None:
            self.signum = signum
        raise Stopped()


def grade_command(path: Path, options: Options) -> int:
    """`grade` and `preview`: grade, write results.json (grade only), print the summary, exit code.

    Before anything runs, results.json already says that grading did not finish (`model.write_unfinished`;
    `python -m autograder grade` writes it before it imports anything beyond the standard library): a grader
    that is killed leaves that behind, never an old score. SIGTERM stops the run cleanly, with the same
    result."""
    if options.out is not None and not options.placeholder_written:
        write_unfinished(options.out, Path(path).name)
    stop = StopSignal()
    options = replace(options, stop=stop)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        run = clean_strings(grade_submission(path, options))  # the summary quotes the file's name, the student's
    finally:
        signal.signal(signal.SIGTERM, previous)
    if options.out is not None:
        write_results(options.out, run)
    if not run.graded:
        print(f"cannot grade: {run.reason}", file=sys.stderr)
        for error in run.grader_errors[:3]:
            print(error, file=sys.stderr)
        return EXIT_CANNOT_GRADE
    if not options.quiet:
        print_summary(run, visible_only=options.visible_only)
    if options.visible_only and any(c.status != "passed" for c in run.checks):
        return EXIT_CHECKS_FAILED
    return EXIT_GRADED
