"""Trusted side: one control group per worker, so limits and control cover every process it starts.

A worker is moved into its group before it runs anything (in the child, between fork and exec), and
every process it starts stays in it, `setsid` or not. The group gives:

- limits for the whole submission, not per process: memory (all processes together), the number of
  processes and threads, and a CPU quota; its CPU weight equals every other worker's, so a submission
  that starts 64 busy processes gets no more of the machine than a classmate graded at the same time;
- the worker's processes, listed by the kernel (`pids`): nothing else is ever signalled;
- freezing and thawing them all at once (`freeze`), their CPU time including exited ones
  (`cpu_seconds`), their peak memory and whether the kernel killed one for memory (`memory_kills`);
- killing them all at once (`kill`), then the group is removed.

Both cgroup versions are used: v2 (the unified hierarchy, at /sys/fs/cgroup or
/sys/fs/cgroup/unified) for what its controllers offer, v1 hierarchies for the rest. Where no group
can be made (not root, a read-only /sys/fs/cgroup, controllers not delegated), `create` returns what
it could, and `in_force()` says what that is; the launcher falls back on per-process limits.
Standard library only.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
GROUP_NAME = re.compile(r"mha-worker-(\d+)-[0-9a-f]{8}")  # mha-worker-<the grader's pid>-<random>


@dataclass
class ResourceLimits:
    memory_bytes: int | None
    processes: int | None  # processes and threads together
    cpus: float | None  # a CPU quota, in cores


def _own_paths() -> dict[str, str]:
    """This process's cgroup in each hierarchy: {"memory": "/a/b", ..., "": "/x"} ("" is v2)."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _v2_mount() -> Path | None:
    for candidate in (ROOT, ROOT / "unified"):
        if (candidate / "cgroup.procs").exists() and (candidate / "cgroup.controllers").exists():
            return candidate
    return None


def _write(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
        return True
    except OSError:
        return False


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _swap_present() -> bool:
    """Whether this machine has swap: then a memory limit that does not cover swap lets a worker swap
    past it, and the guarantee says so."""
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        if line.startswith("SwapTotal:"):
            return line.split()[1] != "0"
    return False


@dataclass
class WorkerGroup:
    """The control groups of one worker, one per hierarchy that could be used."""

    name: str
    dirs: dict[str, Path] = field(default_factory=dict)  # "memory", "pids", ..., "v2" -> the group's folder
    v2_controllers: set[str] = field(default_factory=set)  # controllers enabled in the v2 group
    limits_set: dict[str, str] = field(default_factory=dict)  # what was limited, for results.json

    # -- making and removing
    @classmethod
    def create(cls, limits: ResourceLimits) -> WorkerGroup:
        _sweep()
        group = cls(f"mha-worker-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        own = _own_paths()
        v2 = _v2_mount()
        if v2 is not None:
            parent = v2 / own.get("", "/").lstrip("/")
            folder = parent / group.name
            try:
                folder.mkdir()
                group.dirs["v2"] = folder
                available = set((_read(parent / "cgroup.subtree_control") or "").split())
                for controller in ("memory", "pids", "cpu"):
                    if (
                        controller not in available
                        and controller in (_read(parent / "cgroup.controllers") or "").split()
                    ):
                        # fails (EBUSY) when the parent holds processes and is not the root: then v1 or nothing
                        if _write(parent / "cgroup.subtree_control", f"+{controller}"):
                            available.add(controller)
                group.v2_controllers = available & set((_read(folder / "cgroup.controllers") or "").split())
            except OSError:
                pass
        made: dict[Path, Path] = {}  # a hierarchy's real folder -> the group in it (cpu,cpuacct share one)
        for controller in V1_CONTROLLERS:
            if controller in ("memory", "pids", "cpu") and controller in group.v2_controllers:
                continue
            mount = ROOT / controller
            if not (mount / "tasks").exists() or controller not in own:
                continue
            real = mount.resolve()
            if real in made:
                group.dirs[controller] = made[real]
                continue
            folder = mount / own[controller].lstrip("/") / group.name
            try:
                folder.mkdir()
            except OSError:
                continue
            group.dirs[controller] = made[real] = folder
        group._apply(limits)
        return group

    def _apply(self, limits: ResourceLimits) -> None:
        v2 = self.dirs.get("v2")

        def v2_set(controller: str, name: str, value: str) -> bool:
            return v2 is not None and controller in self.v2_controllers and _write(v2 / name, value)

        if limits.memory_bytes:
            gib = f"{limits.memory_bytes / (1 << 30):g} GiB for all processes"
            if v2_set("memory", "memory.max", str(limits.memory_bytes)):
                swap = v2_set("memory", "memory.swap.max", "0") or not _swap_present()
                self.limits_set["memory"] = f"{gib} (cgroup v2{'' if swap else ', swap not limited'})"
            elif "memory" in self.dirs and _write(
                self.dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes)
            ):
                swap = (
                    _write(self.dirs["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
                    or not _swap_present()
                )
                self.limits_set["memory"] = f"{gib} (cgroup v1{'' if swap else ', swap not limited'})"
        if limits.processes:
            if v2_set("pids", "pids.max", str(limits.processes)):
                self.limits_set["processes"] = f"{limits.processes} processes and threads (cgroup v2)"
            elif "pids" in self.dirs and _write(self.dirs["pids"] / "pids.max", str(limits.processes)):
                self.limits_set["processes"] = f"{limits.processes} processes and threads (cgroup v1)"
        if limits.cpus:
            period = 100_000
            quota = max(1000, int(limits.cpus * period))
            if v2_set("cpu", "cpu.max", f"{quota} {period}"):
                self.limits_set["cpu"] = f"{limits.cpus:g} cores, weighted like every other worker (cgroup v2)"
            elif (
                "cpu" in self.dirs
                and _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(period))
                and _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(quota))
            ):
                self.limits_set["cpu"] = f"{limits.cpus:g} cores, weighted like every other worker (cgroup v1)"

    def in_force(self) -> dict[str, str]:
        """What this group enforces and offers, in words (for results.json)."""
        facts = dict(self.limits_set)
        if self.can_kill():
            facts["control"] = "every process of the submission is in one cgroup: frozen, timed and killed together"
        return facts

    def can_kill(self) -> bool:
        return bool(self.dirs)

    def attach_self(self) -> None:
        """Move the calling process into every group (called in the child, between fork and exec)."""
        self.attach(os.getpid())

    def attach(self, process: int) -> None:
        """Move the process `process` (a worker forked from the fork server, before it goes on) into every group."""
        pid = str(process).encode()
        for folder in dict.fromkeys(self.dirs.values()):
            fd = os.open(folder / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def remove(self) -> None:
        """Kill what is left and remove every group (a group with processes cannot be removed)."""
        self.kill()
        for folder in dict.fromkeys(self.dirs.values()):
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        self.dirs = {}

    # -- control
    def pids(self) -> list[int]:
        """The processes in the group (in this process's pid namespace, as the kernel lists them)."""
        found: set[int] = set()
        for folder in self.dirs.values():
            text = _read(folder / "cgroup.procs")
            if text:
                found.update(int(p) for p in text.split())
        found.discard(os.getpid())  # never this process, whatever the file says
        return sorted(found)

    def freeze(self, frozen: bool) -> bool:
        """Freeze (or thaw) every process of the group; False when no freezer is available."""
        if "v2" in self.dirs and (self.dirs["v2"] / "cgroup.freeze").exists():
            if not _write(self.dirs["v2"] / "cgroup.freeze", "1" if frozen else "0"):
                return False
            return self._wait_frozen(frozen, lambda: "frozen 1" in (_read(self.dirs["v2"] / "cgroup.events") or ""))
        if "freezer" in self.dirs:
            state = self.dirs["freezer"] / "freezer.state"
            if not _write(state, "FROZEN" if frozen else "THAWED"):
                return False
            return self._wait_frozen(frozen, lambda: (_read(state) or "").strip() == "FROZEN")
        return False

    @staticmethod
    def _wait_frozen(frozen: bool, is_frozen: Callable[[], bool]) -> bool:
        if not frozen:
            return True
        return _wait_until(is_frozen, 2.0)  # freezing takes microseconds unless tasks are in D state

    def cpu_seconds(self) -> float | None:
        """User and system CPU time of every process that ever ran in the group."""
        if "v2" in self.dirs:
            for line in (_read(self.dirs["v2"] / "cpu.stat") or "").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        if "cpuacct" in self.dirs:
            text = _read(self.dirs["cpuacct"] / "cpuacct.usage")
            if text:
                return int(text) / 1e9
        return None

    def memory_peak(self) -> int | None:
        if "memory" in self.v2_controllers:
            text = _read(self.dirs["v2"] / "memory.peak")
            return int(text) if text and text.strip().isdigit() else None
        if "memory" in self.dirs:
            text = _read(self.dirs["memory"] / "memory.max_usage_in_bytes")
            return int(text) if text else None
        return None

    def memory_kills(self) -> int:
        """How many processes of the group the kernel killed for going over the memory limit."""
        source = None
        if "memory" in self.v2_controllers:
            source = _read(self.dirs["v2"] / "memory.events")
        elif "memory" in self.dirs:
            source = _read(self.dirs["memory"] / "memory.oom_control")
        for line in (source or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill(self) -> None:
        """SIGKILL every process of the group, and wait until the group is empty."""
        if not self.dirs:
            return
        v2 = self.dirs.get("v2")
        if v2 is not None and (v2 / "cgroup.kill").exists() and _write(v2 / "cgroup.kill", "1"):
            self._wait_empty()
            return
        # Without cgroup.kill: freeze, so nothing forks meanwhile, kill each listed process, thaw.
        frozen = self.freeze(True)
        for _ in range(100):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except (ProcessLookupError, PermissionError):
                    pass
            if frozen:
                self.freeze(False)
                frozen = False
            time.sleep(0.02)
        if frozen:
            self.freeze(False)
        self._wait_empty()

    def _wait_empty(self, seconds: float = 5.0) -> None:
        _wait_until(lambda: not self.pids(), seconds)


def _wait_until(done: Callable[[], bool], seconds: float) -> bool:
    """Whether `done()` holds within `seconds`, asked at once and then after waits that start at half a
    millisecond and double up to ten (a group freezes or empties within a scheduler tick or two: a fixed
    ten-millisecond wait cost every timed round twenty)."""
    end, pause = time.monotonic() + seconds, 0.0005
    while not done():
        if time.monotonic() >= end:
            return done()
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    return True


def _parents() -> list[Path]:
    """The folders this process's worker groups are made in, one per hierarchy."""
    own = _own_paths()
    found = []
    v2 = _v2_mount()
    if v2 is not None:
        found.append(v2 / own.get("", "/").lstrip("/"))
    for controller in V1_CONTROLLERS:
        if controller in own and (ROOT / controller / "tasks").exists():
            found.append(ROOT / controller / own[controller].lstrip("/"))
    return found


def _sweep() -> None:
    """Remove the groups of graders that were killed before they could (their worker died with them,
    but a process it started may not have): kill what is left in them, then remove them. Only groups
    named by this scheme whose grader's pid is not alive are touched."""
    for parent in _parents():
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for folder in entries:
            match = GROUP_NAME.fullmatch(folder.name)
            if not match or not folder.is_dir() or os.path.exists(f"/proc/{match.group(1)}"):
                continue
            key = (
                "v2"
                if (folder / "cgroup.events").exists()
                else "freezer"
                if (folder / "freezer.state").exists()
                else "other"
            )
            orphan = WorkerGroup(folder.name, {key: folder})
            orphan.remove()
