"""The grading's workers: their settings, the reference's two timing workers, and starting them all early.

A worker takes about a second of CPU to start (Python and torch), and a grading needs three: the
submission's and, for the speed part, the reference's two timing workers (`timing.py` says why each has its
own). `python -m autograder grade` starts them before it imports torch, pytest and the checks (`EarlyStart`),
so that they load on the cores the grader's own imports leave idle; nothing of the submission's file runs
until the first check asks for it, as without an early start. This module imports neither torch nor pytest.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from autograder.contract import CONTRACT_NAMES
from autograder.grading import submission as reader
from autograder.rubric import Rubric, load_rubric
from autograder.sandbox import bwrap, protocol
from autograder.sandbox.client import WireCell, Worker, WorkerError
from autograder.sandbox.settings import WorkerConfig

REFERENCE_SOURCE = Path(__file__).resolve().parents[2] / "reference" / "mha.py"
WRAPPER, REFERENCE, SUBMISSION = "wrapper", "reference", "submission"


def worker_config(rubric: Rubric, device: str, hide: list[str], isolation: str) -> WorkerConfig:
    return WorkerConfig(
        device=device,
        memory_bytes=int(rubric.limits.memory_gib * (1 << 30)),
        load_seconds=rubric.limits.load_seconds,
        boot_seconds=rubric.limits.load_seconds,
        cell_seconds=rubric.limits.cell_seconds,
        later_cell_seconds=rubric.limits.later_cell_seconds,
        request_seconds=rubric.limits.request_seconds,
        hung_request_seconds=rubric.limits.hung_request_seconds,
        request_factor=rubric.limits.request_factor,
        request_floor_seconds=rubric.limits.request_floor_seconds,
        submission_seconds=rubric.limits.submission_seconds,
        submission_cpu_seconds=rubric.limits.submission_cpu_seconds,
        processes=rubric.limits.processes,
        cpus=rubric.limits.cpu_cores,
        output_bytes=int(rubric.limits.output_kib * 1024),
        crashes_before_giving_up=rubric.limits.crashes_before_giving_up,
        isolation=isolation,
        hide=hide,
        threads=rubric.limits.worker_threads,
        limits=protocol.FrameLimits(blob_bytes=int(rubric.limits.reply_mib * (1 << 20))),
        contract=CONTRACT_NAMES,
        forks_per_server=rubric.limits.forks_per_server,
    )


class CannotTime(RuntimeError):
    """The measurement itself cannot be trusted or run (never the submission's fault). `cause`: why, by name,
    where the run's record should say it (`model.GradingRun.cannot_grade_cause`), e.g. `model.TIMING_LOCK`."""

    def __init__(self, message: str, cause: str = ""):
        super().__init__(message)
        self.cause = cause


class BackgroundWorker:
    """A trusted timing worker (running only the reference's code), started in a thread as soon as it is
    made, so that its start overlaps the grading; `get()` waits for it. One that fails to start is the
    grader's fault (CannotTime).

    The starting thread lives until `close()`: the worker asks the kernel to kill it when the thread that
    started it ends (PR_SET_PDEATHSIG belongs to the thread, not the process)."""

    def __init__(
        self, cells: list[WireCell], filename: str, config: WorkerConfig, allowed: bwrap.AllowList | None = None
    ):
        self.worker = Worker(cells, filename, config)
        self.worker.allowed = allowed
        self.kept = False  # one of a grading process's kept workers (`timing.KeptWorkers`)
        self.error: str | None = None
        self.started = threading.Event()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._start, name=f"timing-worker-{filename}", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            loaded = self.worker.start()
            if loaded.errors:
                self.error = f"the reference did not load in its timing worker: {loaded.errors[0].message}"
        except WorkerError as exc:
            self.error = f"the reference's timing worker could not start: {exc}"
        finally:
            self.started.set()
        self.closing.wait()

    def get(self) -> Worker:
        self.started.wait()
        if self.error:
            raise CannotTime(self.error)
        return self.worker

    def healthy(self) -> bool:
        """Whether a kept worker can serve another grading: started, never timed out or crashed, running
        (not left stopped by a measurement that ended badly) and answering."""
        self.started.wait()
        if self.error or self.worker.hung or self.worker.crashes or not self.worker.alive():
            return False
        self.worker.resume()
        try:
            self.worker.request(protocol.PingRequest(), timeout=5.0)
        except WorkerError:
            return False
        return True

    def close(self) -> None:
        self.started.wait()
        self.worker.close()
        self.closing.set()
        self.thread.join()


def trusted_config(config: WorkerConfig) -> WorkerConfig:
    """A trusted timing worker's settings: the submission's kind of sandboxed process with its limits, so that
    process, protocol and serialisation costs are the same for the three timed modules; without the
    submission's time budgets (the submission's to spend), its requests' CPU deadlines (what runs there is the
    reference's or a checked graph, each bounded by its wall deadline) or its hidden folders (nothing of it is
    loaded)."""
    return dataclasses.replace(
        config, submission_seconds=math.inf, submission_cpu_seconds=None, request_floor_seconds=None, hide=[]
    )


def start_trusted_workers(config: WorkerConfig, allowed: bwrap.AllowList | None = None) -> dict[str, BackgroundWorker]:
    """The two timing workers, each loading only the reference's definitions and starting now, in the background:
    the wrapper's, which replays the wrapper's graph, and the reference's, which captures the reference's forwards
    and replays the reference's graph and the one captured from the submission's forward (which it also replays for
    the structure checks), so that the two compared most closely are timed in one process. No student code ever
    runs in either: the submission's own worker only answers the checks and is captured, and what is timed is a
    replayed graph in the same kind of process for all three."""
    return {name: trusted_worker(config, allowed) for name in (WRAPPER, REFERENCE)}


def trusted_worker(config: WorkerConfig, allowed: bwrap.AllowList | None = None) -> BackgroundWorker:
    """One trusted worker: the reference's definitions only, started now, in the background."""
    return BackgroundWorker(reference_cells(), "reference.py", trusted_config(config), allowed)


def reference_cells(path: Path = REFERENCE_SOURCE) -> list[tuple[int, int, str]]:
    """The reference's code cells that only define (imports, classes, functions, constants): what its timing
    worker loads, without the notebook's demonstrations and self-checks."""
    cells = []
    for number, line, source in reader.read_cells(path):
        body = ast.parse(source).body
        if body and all(
            isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
            or (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets))
            for node in body
        ):
            cells.append((number, line, source))
    return cells


def grades_speed(rubric: Rubric, parts: tuple[str, ...] | None) -> bool:
    """Whether a grading of these parts times the submission (and so needs the reference's timing workers)."""
    return rubric.speed is not None and (parts is None or "speed" in parts)


def hidden_folders(path: Path, out: Path | None) -> list[str]:
    """What the worker must not see: the submission's folder (other students' files may sit beside it) and
    where the results go."""
    return [str(Path(path).resolve().parent)] + ([str(Path(out).resolve().parent)] if out else [])


def guess_device(asked: str) -> str:
    """The device a grading will run on, without importing torch: the one asked for, or for `auto`, CUDA
    where the NVIDIA driver's device files exist. The grading checks the guess against torch."""
    if asked != "auto":
        return asked
    return "cuda" if Path("/dev/nvidiactl").exists() else "cpu"


@dataclass
class EarlyStart:
    """A grading's workers, started before the grader imports torch, pytest and its checks: the submission's
    worker prestarted (`Worker.prestart`: Python and torch only; its file loads when the first check asks)
    and, where the speed part is graded, the reference's two timing workers. `grade_submission` adopts
    them where the settings it computes are the ones they were started with (`adopt`, `timing_for`) and
    closes what it did not adopt (`close`); they are then as if it had started them itself."""

    config: WorkerConfig
    worker: Worker | None
    timing: dict[str, BackgroundWorker] = field(default_factory=dict)
    allowed: bwrap.AllowList | None = None  # the namespace sandbox's allow list they were started with

    @classmethod
    def begin(
        cls,
        path: Path,
        *,
        device: str,
        rubric_path: Path | None,
        isolation: str,
        out: Path | None,
        parts: tuple[str, ...] | None,
    ) -> EarlyStart | None:
        """Start them, or None where anything is amiss: the grading then meets the problem itself and says what
        it is. Only a saving of time: no failure here stops a grading."""
        if not Path(path).is_file():
            return None
        worker = None
        try:
            rubric = load_rubric(rubric_path)
            config = worker_config(rubric, guess_device(device), hidden_folders(path, out), isolation)
            worker = Worker([], Path(path).name, config)
            # torch is not loaded yet: the sandbox shows what it will load (checked on adoption)
            allowed = bwrap.expected_allow_list() if worker.isolation == "namespace" else None
            worker.allowed = allowed
            worker.prestart()
            if worker.process is None:
                return None
            timing = start_trusted_workers(config, allowed) if grades_speed(rubric, parts) else {}
            return cls(config, worker, timing, allowed)
        except Exception:  # rubric, sandbox or anything else: the grading meets it again, and says what it is
            if worker is not None:
                worker.close()
            return None

    def fits(self, config: WorkerConfig) -> bool:
        """Whether the workers were started as the grading would start them now (torch loaded): the same
        settings, and the same allow list in the namespace sandbox."""
        return config == self.config and (self.allowed is None or self.allowed == bwrap.allow_list())

    def adopt(self, config: WorkerConfig, cells: list[WireCell], filename: str) -> Worker | None:
        """The prestarted worker, for a grading of `filename`'s `cells` with these settings; None if they
        differ (the grading starts its own)."""
        worker, self.worker = self.worker, None
        if worker is None or filename != worker.filename or not self.fits(config):
            if worker is not None:
                worker.close()
            return None
        worker.cells = [list(c) for c in cells]
        worker.budget_end = time.monotonic() + config.submission_seconds  # the submission's time starts now
        return worker

    def timing_for(self, config: WorkerConfig) -> dict[str, BackgroundWorker]:
        """The timing workers, for a grading with these settings; none if they differ."""
        timing, self.timing = self.timing, {}
        if not self.fits(config):
            for worker in timing.values():
                worker.close()
            return {}
        return timing

    def close(self) -> None:
        """Close whatever was not adopted."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        for worker in self.timing.values():
            with contextlib.suppress(Exception):
                worker.close()
        self.timing = {}
