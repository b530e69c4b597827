"""Trusted side: what this machine offers to hold a worker in, and that isolation described in words.

The public names below are stable (tools that report on a machine's readiness build on them):

- `is_root()`: whether the grader runs as root (then every worker runs as a fresh unprivileged uid).
- `bwrap_path()`: bubblewrap's full path on the grader's PATH, or None.
- `namespace_sandbox_problem()`: why bubblewrap cannot start this interpreter in the namespace sandbox
  here (it is tried once, for real), or None when it can; `namespace_sandbox_available()` is its negation.
- `separate_uid_available()`: whether a process-isolated worker can run as a fresh unprivileged uid.
- `choose_isolation(wanted)`: the isolation a worker gets for `auto`, `namespace` or `process`, or an
  `OSError` saying why none is available.
- `fresh_uid()`: a uid no user has, for one worker; inside a user namespace that maps only a few uids (a
  Kubernetes pod with `hostUsers: false`), one of those (`fresh_uid_range()`).
- `describe_isolation(...)`: what holds a worker in, in words (results.json's `sandbox`).

Two isolations exist. `namespace`: bubblewrap's allow list and namespaces (`bwrap`). `process`: a separate
process in a scratch folder, as a fresh unprivileged uid when the grader is root (with its own network and
IPC namespaces where the kernel allows), or as the grader's own user, which only an explicit choice
(`--isolation process`) allows. The probes run the interpreter for real and are cached for the process.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from autograder.sandbox import bwrap, procfs

if TYPE_CHECKING:
    from autograder.sandbox.cgroups import WorkerGroup

__all__ = [
    "bwrap_path",
    "choose_isolation",
    "describe_isolation",
    "fresh_uid",
    "fresh_uid_range",
    "is_root",
    "namespace_sandbox_available",
    "namespace_sandbox_problem",
    "separate_uid_available",
]

UID_RANGE = (1_500_000_000, 1 << 22)  # fresh uids for workers: start, count (far from any real user)
Isolation = Literal["namespace", "process"]  # what a worker runs in, once chosen
ISOLATIONS: tuple[Isolation, ...] = ("namespace", "process")


def is_root() -> bool:
    """Whether the grader runs as root."""
    return os.geteuid() == 0


@cache
def bwrap_path() -> str | None:
    """bubblewrap's full path, found on the grader's PATH (the worker's scrubbed PATH may not hold it)."""
    return shutil.which("bwrap")


def namespace_sandbox_available() -> bool:
    """Whether bubblewrap can start this interpreter in the sandbox here (tried once, for real)."""
    return namespace_sandbox_problem() is None


@cache
def namespace_sandbox_problem() -> str | None:
    """Why bubblewrap cannot start this interpreter in the sandbox here, or None when it can: not installed,
    too old for what the sandbox needs (`bwrap.Features.refusal`), or refused when tried (its own words)."""
    executable = bwrap_path()
    if not executable:
        return "bubblewrap (`bwrap`) is not installed"
    too_old = bwrap.features(executable).refusal(is_root())
    if too_old:
        return too_old
    try:
        probe = subprocess.run(
            bwrap.command(
                executable, "cpu", scratch_bytes=1 << 20, as_root=is_root(), allowed=bwrap.expected_allow_list()
            )
            + [sys.executable, "-I", "-S", "-c", "pass"],
            env=bwrap.worker_env(),
            capture_output=True,
            timeout=30,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not be run: {exc}"
    if probe.returncode != 0:
        said = bubblewrap_said(probe.stderr.decode(errors="replace"))
        return f"bubblewrap exited with status {probe.returncode}" + (f" ({said})" if said else "")
    return None


def bubblewrap_said(stderr: str) -> str:
    """bubblewrap's complaint, whole, on one line and without its closing full stop: it is quoted inside
    our own sentences (its last 400 characters when longer)."""
    said = " ".join(stderr.split())
    said = said if len(said) <= 400 else "..." + said[-400:]
    return said.rstrip(".")


@cache
def separate_uid_available() -> bool:
    """Whether a process-isolated worker can run as a fresh unprivileged uid: the grader is root and
    that uid can read the interpreter, its standard library and torch."""
    if not is_root():
        return False
    import importlib.util

    spec = importlib.util.find_spec("torch")  # the grader's own (not imported): its folder must be readable
    torch_folders = list(spec.submodule_search_locations or []) if spec else []
    paths = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], *torch_folders]
    uid = fresh_uid()
    try:
        probe = subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                "import os, sys; sys.exit(0 if all(os.access(p, os.R_OK | os.X_OK) for p in sys.argv[1:]) else 1)",
                *paths,
            ],
            preexec_fn=lambda: procfs.become_uid(uid),
            capture_output=True,
            timeout=30,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


@cache
def _say_once(message: str) -> None:
    print(message, file=sys.stderr)


def choose_isolation(wanted: str) -> Isolation:
    """`auto`: the namespace sandbox where bubblewrap works, else a process as a fresh uid. A process
    as the grader's own user is only ever chosen explicitly (`process`)."""
    if wanted == "auto":
        if namespace_sandbox_available():
            return "namespace"
        if separate_uid_available():
            _say_once(
                f"note: grading without the namespace sandbox ({namespace_sandbox_problem()}); each "
                "worker runs as a fresh unprivileged uid instead"
            )
            return "process"
        instead = (
            "a fresh unprivileged uid cannot read the interpreter and torch" if is_root() else "the grader is not root"
        )
        # What would fix it depends on the machine: `machine.survey().advice` says it, beside this refusal.
        raise OSError(
            f"no sandbox is available here: {namespace_sandbox_problem()}; and {instead}, so the student's code "
            "would run as the grader's own user. --isolation process (or AUTOGRADER_ISOLATION=process) grades "
            "it so anyway"
        )
    if wanted == "namespace" and not namespace_sandbox_available():
        raise OSError(f"namespace isolation was asked for, but it cannot start here: {namespace_sandbox_problem()}")
    for isolation in ISOLATIONS:
        if wanted == isolation:
            return isolation
    raise ValueError(f"unknown isolation {wanted!r}")


def fresh_uid() -> int:
    """A uid no user has, for one worker: from UID_RANGE, or, in a user namespace that does not map it (a
    container's, a Kubernetes pod with `hostUsers: false`, where root is root of 65,536 uids), from the
    upper half of the largest range it maps, uid and gid alike."""
    start, count = fresh_uid_range()
    return start + secrets.randbelow(count)


@cache
def fresh_uid_range() -> tuple[int, int]:
    """The (start, count) range fresh uids are drawn from here."""
    mapped = _mapped_ids("/proc/self/uid_map") & _mapped_ids("/proc/self/gid_map")
    start, count = UID_RANGE
    if mapped.contains(start, count):
        return UID_RANGE
    low, size = mapped.largest()
    upper = low + size // 2
    return upper, max(1, low + size - upper - 2)  # never the last two (the overflow ids, nobody and nogroup)


@dataclass(frozen=True)
class _IdRanges:
    ranges: tuple[tuple[int, int], ...]  # (first id, count), as this namespace sees them

    def __and__(self, other: _IdRanges) -> _IdRanges:
        found = []
        for a, n in self.ranges:
            for b, m in other.ranges:
                low, high = max(a, b), min(a + n, b + m)
                if high > low:
                    found.append((low, high - low))
        return _IdRanges(tuple(found))

    def contains(self, start: int, count: int) -> bool:
        return any(a <= start and start + count <= a + n for a, n in self.ranges)

    def largest(self) -> tuple[int, int]:
        return max(self.ranges, key=lambda r: r[1], default=(0, 1))


def _mapped_ids(path: str) -> _IdRanges:
    """The ids a user namespace maps ("inside outside count" lines); everything when unreadable."""
    try:
        lines = Path(path).read_text().split("\n")
    except OSError:
        return _IdRanges(((0, 1 << 32),))
    return _IdRanges(tuple((int(f[0]), int(f[2])) for f in (line.split() for line in lines) if len(f) == 3))


def describe_isolation(
    *,
    sandbox: bool,
    uid: int | None,
    group: WorkerGroup | None,
    rlimit_memory: int | None,
    scratch_bytes: int,
    processes: int | None,
) -> dict[str, str]:
    """What holds a worker in, in words, for results.json: under the namespace sandbox (`sandbox`) or as a
    process; as the fresh `uid` or not; in its control `group` or not; with an address-space limit per
    process (`rlimit_memory`), a private /tmp of `scratch_bytes` and a limit of `processes`."""
    facts: dict[str, str] = {}
    if sandbox:
        found = bwrap.features(bwrap_path() or "bwrap")
        tmp = f"{scratch_bytes >> 20} MiB /tmp" if found.has("--size") else "/tmp (no size limit of its own)"
        facts["filesystem"] = (
            f"an allow list (bubblewrap): the interpreter and its libraries read-only, a private {tmp}, "
            "a minimal /dev, its own /proc"
        )
        facts["namespaces"] = "pid, network, IPC, UTS and cgroup namespaces of its own; dies with the grader"
        if found.lacking(uid is not None):
            facts["bubblewrap"] = f"{found.name}: {found.costs(uid is not None)}"
        facts["user"] = (
            "a fresh unprivileged uid (the grader is root)"
            if uid is not None
            else "the grader's own unprivileged uid, through a user namespace"
        )
    else:
        facts["filesystem"] = (
            f"the grader's, as the worker's user may read it; a private scratch folder; no file over "
            f"{scratch_bytes >> 20} MiB (RLIMIT_FSIZE)"
            + (
                "; what its uid leaves in the machine's world-writable folders removed when it ends"
                if uid is not None
                else ""
            )
        )
        facts["user"] = (
            "a fresh unprivileged uid (the grader is root); its own network and IPC namespaces where the kernel allows"
            if uid is not None
            else "the grader's own user (chosen explicitly: the worker can read what the grader can)"
        )
    if group is not None:
        facts.update(group.in_force())
    else:
        facts["control"] = "no control group could be made here: processes are found through /proc"
    if "memory" not in facts:
        facts["memory"] = (
            f"{rlimit_memory / (1 << 30):g} GiB of address space per process (RLIMIT_AS)"
            if rlimit_memory
            else "no memory limit"
        )
    elif rlimit_memory:
        facts["memory"] += f"; {rlimit_memory / (1 << 30):g} GiB of address space per process"
    if "processes" not in facts:
        facts["processes"] = (
            f"{processes} (RLIMIT_NPROC of the fresh uid)"
            if uid is not None and processes
            else "no limit on the number of processes"
        )
    if "cpu" not in facts:
        facts["cpu"] = "no CPU quota: a busy submission can slow others graded at the same time"
    facts["timing"] = _timing_guarantees(sandbox, uid, group)
    return facts


def _timing_guarantees(sandbox: bool, uid: int | None, group: WorkerGroup | None) -> str:
    """What the speed part's timing rests on, in words: nothing timed is the submission's code (a graph of its
    forward, checked by the grader, is replayed and timed in a trusted worker), and its own worker, with every
    process of it that can be found, is stopped while anything is timed and between its own requests."""
    timed = "what is timed is a graph of its forward, replayed in a worker that never ran its code"
    if group is not None and group.cpu_seconds() is not None:
        return f"{timed}; all of its processes frozen by its control group while anything is timed"
    if uid is not None:
        return f"{timed}; every process of its uid found whatever its parentage, stopped while anything is timed"
    if sandbox:
        return f"{timed}; every process of its pid namespace found, stopped while anything is timed"
    return (
        f"{timed}; without a fresh uid its processes are found through its process tree and process group only: "
        "one that leaves both (a new session whose parent ended) is not stopped while anything is timed"
    )
