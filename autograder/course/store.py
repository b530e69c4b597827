"""The class's record: each student's last grading run, and what it was made from.

`course/results/<student>/mha/` holds `results.json` (the grading run, Gradescope's format) and
`inputs.json` (the content hashes of everything that decided it). nbgrader never writes under
`results/`, so its commands (`autograde --force`, `generate_feedback --force`, `export`) cannot
destroy the record; the copies in nbgrader's folders (`autograded/`, `feedback/`) are rewritten
from it by every `grade-class` run.

A run is redone when any input changed (content hashes, never mtimes): the submission's bytes or
name, the rubric, the grader's code that decides a score (`grader_files`: the package's top-level
modules and the folders `grading/` and `sandbox/`; never the class workflow, the platform adapters or
the authoring tools), the reference, the torch version or the device asked for; or when the last run
could not grade.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autograder.atomic import write_text_atomically
from autograder.contract import ASSIGNMENT
from autograder.grading.submission import MAX_BYTES
from autograder.model import GradingRun

RECORD_DIR = "results"
# Every file a class run writes: the grader's user reads and writes, its group (TAs) reads, no one else.
# The course folder itself is closed to other users too (`close_to_others`).
COURSE_FILE_MODE = 0o640
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# What decides a score: the package's top-level modules (contract, rubric, model, ...) and these folders.
# The class workflow (course/), the platform adapters (platforms/) and the authoring tools (authoring/)
# only schedule, present or hand out results, so editing them never regrades a class.
SCORE_DECIDING_FOLDERS = ("grading", "sandbox")
# What each input is called when it is the reason for a regrade.
INPUT_NAMES = {
    "submission": "the submission changed",
    "file": "another file is graded now",
    "rubric": "the rubric changed",
    "grader": "the checks or the grader changed",
    "reference": "the reference changed",
    "torch": "the torch version changed",
    "device": "another device was asked for",
}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def submission_hash(path: Path) -> str:
    """What of a submission file decides its grading, as the reader sees it (`submission.read_cells`): the
    SHA-256 of its bytes when it is a regular file within the reader's size limit; else only that it is
    over the limit (the reader refuses it unread, whatever it holds), or that it cannot be read, and why.
    The size is checked by `stat` before any byte is read, and at most one byte past the limit is ever
    read (its real path opened without following a link and without blocking, as the reader opens it), so
    a sparse 20 GiB file costs a re-run nothing. Never raises."""
    try:
        target = os.path.realpath(path)
        if os.stat(target).st_size > MAX_BYTES:
            return "over the size limit"
        descriptor = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    digest = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return "not a regular file"
        size = 0
        while size <= MAX_BYTES and (block := os.read(descriptor, min(1 << 20, MAX_BYTES + 1 - size))):
            digest.update(block)
            size += len(block)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    finally:
        os.close(descriptor)
    return "over the size limit" if size > MAX_BYTES else digest.hexdigest()


def sha256_tree(files: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(sha256_file(path).encode() + b"\n")
    return digest.hexdigest()


def grader_files(package: Path = PACKAGE_DIR) -> list[Path]:
    """The grader's files that decide a score (the rubric in use is hashed on its own)."""
    top = list(package.glob("*.py"))
    folders = [
        p
        for folder in SCORE_DECIDING_FOLDERS
        for p in (package / folder).rglob("*")
        if p.is_file() and p.suffix in (".py", ".ini", ".toml") and "__pycache__" not in p.parts
    ]
    return sorted(top + folders)


def reference_files() -> list[Path]:
    spec = importlib.util.find_spec("reference")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations)))
    return [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


@dataclass(frozen=True)
class ClassInputs:
    """What every student's run shares: hashed once per class run."""

    rubric: str
    grader: str
    reference: str
    torch: str
    device: str

    @classmethod
    def compute(cls, rubric: Path, device: str) -> ClassInputs:
        reference = reference_files()
        return cls(
            rubric=sha256_file(rubric),
            grader=sha256_tree(grader_files(), PACKAGE_DIR),
            reference=sha256_tree(reference, reference[0].parent) if reference else "none",
            torch=torch_version(),
            device=device,
        )

    def for_file(self, file: Path) -> dict[str, str]:
        return {
            "submission": submission_hash(file),
            "file": file.name,
            "rubric": self.rubric,
            "grader": self.grader,
            "reference": self.reference,
            "torch": self.torch,
            "device": self.device,
        }


@dataclass(frozen=True)
class ForcedRun:
    """A forced regrade under way (`--force`, `make grade FORCE=1`): who it regrades, and the token each
    of their runs records in inputs.json once regraded. Its file stays until every one of them has been,
    so a forced run killed halfway is finished by the next run, forced or not."""

    path: Path
    token: str
    students: tuple[str, ...]


class Record:
    """`course/results/<student>/mha/`: read and written by student."""

    def __init__(self, course: Path, assignment: str = ASSIGNMENT):
        self.root = Path(course) / RECORD_DIR
        self.assignment = assignment

    def folder(self, student: str) -> Path:
        return self.root / student / self.assignment

    def results_path(self, student: str) -> Path:
        return self.folder(student) / "results.json"

    def inputs_path(self, student: str) -> Path:
        return self.folder(student) / "inputs.json"

    def run(self, student: str) -> GradingRun | None:
        """The stored grading run, or None when there is none or it cannot be read."""
        return read_run(self.results_path(student))

    def inputs(self, student: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.inputs_path(student).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _compare(self, student: str, inputs: dict[str, str]) -> tuple[GradingRun | None, str | None]:
        """The stored run, and None when it was made from `inputs` (whether it graded or not), else why not."""
        run = self.run(student)
        if run is None:
            if self.results_path(student).exists():
                return None, "its results.json is unreadable, or was not written by this grader"
            return None, "not graded yet"
        stored = self.inputs(student)
        if stored is None:
            return run, "its inputs were not recorded"
        changed = [INPUT_NAMES.get(key, f"{key} changed") for key in inputs if stored.get(key) != inputs[key]]
        return run, changed[0] if changed else None

    def why_stale(self, student: str, inputs: dict[str, str]) -> str | None:
        """None when a run is stored and was made from `inputs`, whether it graded or not; else why not."""
        return self._compare(student, inputs)[1]

    def why_regrade(self, student: str, inputs: dict[str, str]) -> str | None:
        """None when the stored run is up to date and graded; else the reason to grade again."""
        run, stale = self._compare(student, inputs)
        if stale is None and run is not None and not run.graded:
            return "its last run could not grade"
        return stale

    # -- forced regrades ----------------------------------------------------------------------------

    def forced_runs(self) -> list[ForcedRun]:
        """Every forced regrade not finished yet (one per shard that was forced, or the whole class)."""
        runs = []
        for path in sorted(self.root.glob(".forced*.json")):
            try:
                data = json.loads(path.read_text())
                runs.append(ForcedRun(path, str(data["token"]), tuple(str(s) for s in data["students"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return runs

    def start_forced(self, students: list[str]) -> ForcedRun:
        """Record that `students` are being regraded by force (each forced run has a file of its own)."""
        token = secrets.token_hex(8)
        run = ForcedRun(self.root / f".forced-{token}.json", token, tuple(students))
        write_text_atomically(
            run.path, json.dumps({"token": run.token, "students": run.students}) + "\n", COURSE_FILE_MODE
        )
        return run

    def still_forced(self, run: ForcedRun, submitted: set[str]) -> list[str]:
        """The students of a forced regrade not regraded by it yet (of those who still have a submission)."""
        return [s for s in run.students if s in submitted and (self.inputs(s) or {}).get("forced") != run.token]

    def save_inputs(self, student: str, inputs: dict[str, str]) -> None:
        write_text_atomically(
            self.inputs_path(student), json.dumps(inputs, indent=2, sort_keys=True) + "\n", COURSE_FILE_MODE
        )

    def save_run(self, student: str, run: GradingRun) -> None:
        write_text_atomically(
            self.results_path(student),
            json.dumps(run.to_gradescope(), indent=2, ensure_ascii=False) + "\n",
            COURSE_FILE_MODE,
        )


def close_to_others(course: Path) -> bool:
    """Close the course folder to other users (`chmod o-rwx`, group kept) when it is ours and open: a
    worker under process isolation runs as another uid, and must not read classmates' submissions,
    results.json (hidden checks' messages) or the gradebook. True when it was changed."""
    try:
        info = os.stat(course)
        if info.st_uid != os.geteuid() or not info.st_mode & 0o007:
            return False
        os.chmod(course, stat.S_IMODE(info.st_mode) & ~0o007)
    except OSError:
        return False
    return True


def read_run(path: Path) -> GradingRun | None:
    """The grading model stored in a results.json, or None when there is none (or it is unreadable)."""
    try:
        return GradingRun.from_gradescope(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
