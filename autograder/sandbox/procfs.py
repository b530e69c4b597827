"""Trusted side: process control through /proc and prctl, the one place the grader finds, stops, kills,
reaps and accounts for processes.

- Finding: `read_stat` parses /proc/PID/stat (the only parser of it), `processes` lists every live process,
  `descendants` walks the parent links, `owned_by` finds every process of a uid whatever its parentage,
  `ancestry` is this process and its ancestors (never signalled).
- Stopping and killing a tree: `stop_tree` sends SIGSTOP to everything a finder returns and asks it again
  until nothing new appears (a stopped process neither forks nor exits, so the tree holds still while it
  is read); `kill_tree` stops the whole tree before it kills any of it, since a process killed first hands
  its children to their subreaper, out of the tree the walk follows, where a setsid child would survive;
  `wait_stopped` waits until SIGSTOP has taken effect.
- Reaping and dying together: `reap_orphans` waits for zombie children that are no Popen's (orphans that
  came to this process as their subreaper, `become_child_subreaper`); `die_with_parent` asks the kernel to
  signal a process when its parent dies (PR_SET_PDEATHSIG).
- Accounting: `process_cpu_ns`, a process's CPU time to the nanosecond, its ended threads included (its
  CPU-time clock); `CpuLedger`, the CPU time of every process a worker ever had, each as last seen, so that
  a process that ended takes nothing with it and the total never falls; `thread_schedstats` /
  `thread_wait`: nanoseconds a thread ran and waited for a CPU; `own_wait`: the calling thread's wait (the
  grader's, while it times a request).

Linux only; standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWUTS = 0x08000000, 0x40000000, 0x04000000
STOP_ROUNDS = 16  # walks of a tree while stopping it; each finds only what started during the one before


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> bool:
    """prctl(option, value, 0, 0, 0); whether the kernel accepted it."""
    result: int = _libc().prctl(option, value, 0, 0, 0)
    return result == 0


# -- reading /proc -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the grader uses; times are in clock ticks (`TICKS` a second)."""

    pid: int
    state: str  # R, S, D, Z, T, ...
    ppid: int
    pgid: int
    utime: int  # user and system time of the process itself
    stime: int
    cutime: int  # of its children that ended and were reaped
    cstime: int
    start: int = 0  # when it started, in clock ticks since boot: with the pid, names one process for good

    @property
    def key(self) -> tuple[int, int]:
        """(pid, start): unlike a pid, never another process's."""
        return self.pid, self.start

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (T) or for a tracer (t): it runs nothing until continued."""
        return self.state in "Tt"


TICKS = os.sysconf("SC_CLK_TCK")


def read_stat(pid: int) -> ProcStat | None:
    """/proc/PID/stat, parsed once; None when the process is gone. The command name, which may hold any
    character (spaces and parentheses too), ends at the last ')'."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return ProcStat(
            pid,
            fields[0],
            int(fields[1]),
            int(fields[2]),
            int(fields[11]),
            int(fields[12]),
            int(fields[13]),
            int(fields[14]),
            int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


def processes() -> list[ProcStat]:
    """Every live process this process can see."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                found.append(stat)
    return found


def uids_of(pid: int) -> tuple[int, ...]:
    """The real, effective, saved and filesystem uids of `pid` (/proc/PID/status: unlike the owner of
    /proc/PID, which a process that makes itself not dumpable hands to root); () when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return tuple(int(field) for field in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


def owned_by(uid: int) -> list[int]:
    """Every live process any of whose uids is `uid`, whatever its parentage, session or process group: for
    a fresh uid, which nothing else has and which no process can leave, every process of one worker."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and uid in uids_of(int(entry.name)):
            found.append(int(entry.name))
    return found


def namespace_pids(pid: int) -> list[int]:
    """`pid`'s pid in each pid namespace it is in, outermost first (/proc/PID/status's NSpid); [] when gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return [int(field) for field in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def children_of(stats: Iterable[ProcStat]) -> dict[int, list[int]]:
    """Parent pid -> the pids of its children."""
    children: dict[int, list[int]] = {}
    for stat in stats:
        children.setdefault(stat.ppid, []).append(stat.pid)
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every live descendant of `pid` (through /proc's parent links), nearest first; not `pid` itself."""
    children = children_of(processes()) if children is None else children
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def ancestry() -> set[int]:
    """This process and its ancestors: never signalled, whatever /proc says."""
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        stat = read_stat(pid)
        pid = stat.ppid if stat else 0
    return chain


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def first_child(pid: int) -> int:
    """The first child of `pid`, or `pid` itself when it has none."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            kids = handle.read().split()
        return int(kids[0]) if kids else pid
    except (OSError, ValueError):
        return pid


# -- signals -------------------------------------------------------------------------------------


def signal_all(pids: Iterable[int], signum: int) -> None:
    """Send `signum` to each of `pids`, passing over those that are gone or not ours to signal."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop_tree(find: Callable[[], Iterable[int]], known: Iterable[tuple[int, int]] = ()) -> list[int]:
    """SIGSTOP every process `find()` returns, and ask it again until no new one appears: a stopped
    process neither forks nor exits, so the tree holds still while it is read. The `known` processes (by
    (pid, start): each only if it is still that process) are stopped first, before any walk: when nothing
    new has started since they were seen, one walk finds nothing more, where two were needed. Returns what
    was stopped."""
    stopped = {pid for pid, start in known if (stat := read_stat(pid)) is not None and stat.start == start}
    signal_all(stopped, signal.SIGSTOP)
    for _ in range(STOP_ROUNDS):
        found = set(find()) - stopped
        if not found:
            break
        signal_all(found, signal.SIGSTOP)
        stopped |= found
    return sorted(stopped)


def kill_tree(find: Callable[[], Iterable[int]]) -> list[int]:
    """Stop the whole tree `find()` returns (`stop_tree`), then kill it (`kill_stopped`). Nothing is killed
    before everything is stopped: a process killed first hands its children to their subreaper, out of the
    tree the walk follows, where a setsid child would survive. Returns what was stopped."""
    tree = stop_tree(find)
    kill_stopped(tree, find)
    return tree


def wait_stopped(pids: Iterable[int], seconds: float = 2.0) -> list[int]:
    """Wait, at most `seconds`, until each of `pids` is stopped, every thread of it (or gone, or a zombie):
    SIGSTOP is certain but not instant, a thread running on another CPU stops when it next enters the kernel,
    and one in an uninterruptible wait only when that ends; /proc/PID/stat says only the first thread's state.
    Returns those still running."""
    pending = list(pids)
    deadline = time.monotonic() + seconds
    while True:
        pending = [pid for pid in pending if not all_threads_stopped(pid)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.002)


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped, or the process is gone or a zombie."""
    stat = read_stat(pid)
    if stat is None or stat.state == "Z":
        return True
    if not stat.stopped:
        return False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # gone since
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                text = handle.read()
        except OSError:
            continue  # that thread has ended
        state = text[text.rfind(")") + 2 :].split(" ", 1)[0]
        if state not in ("t", "T", "Z", "X"):
            return False
    return True


def kill_stopped(tree: Iterable[int], find: Callable[[], Iterable[int]], rounds: int = 3) -> None:
    """SIGKILL every process of a `tree` that `stop_tree(find)` stopped, then, a few `rounds` more, anything
    `find()` still returns (what started while the tree was walked)."""
    signal_all(tree, signal.SIGKILL)
    for _ in range(rounds):
        signal_all(find(), signal.SIGKILL)


def wait_gone(pids: Iterable[int], seconds: float = 5.0) -> list[int]:
    """Wait, at most `seconds`, until none of `pids` is alive (a zombie counts as gone), reaping the orphans
    that come to this process as their subreaper. SIGKILL is certain but not instant: a killed process with
    a large address space can take a while to be scheduled and torn down. Returns what is still alive."""
    pending = list(pids)
    deadline = time.monotonic() + seconds
    while True:
        reap_orphans()
        pending = [pid for pid in pending if alive(pid)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.01)


def tree_of(pid: int, include_self: bool = True) -> Callable[[], list[int]]:
    """A finder for `stop_tree` and `kill_tree`: `pid`'s live descendants, the members of any process group
    one of them leads (a worker leads its own session), and `pid` itself when `include_self`; never this
    process or its ancestors."""

    def find() -> list[int]:
        stats = processes()
        tree = set(descendants(pid, children_of(stats)))
        tree |= {stat.pid for stat in stats if stat.pgid in tree}
        if include_self:
            tree.add(pid)
        return sorted(tree - ancestry())

    return find


def as_uid(uid: int, action: Callable[[], object]) -> None:
    """Run `action` in a child that becomes `uid` (a fresh uid: only one worker's), and wait for it: what it
    may do is only what that uid may. Any failure in it is its own. Root only."""
    if os.geteuid() != 0:
        return
    pid = os.fork()
    if pid == 0:
        try:
            become_uid(uid)
            action()
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a fresh uid: only one worker's): kill(-1) from a child that becomes it
    reaches exactly the processes that uid may signal, which are its own. Root only."""
    as_uid(uid, lambda: os.kill(-1, signal.SIGKILL))


def reap_orphans() -> None:
    """Reap children of this process that are zombies and are no Popen's: orphans that came to it as
    their subreaper."""
    me = os.getpid()
    for stat in processes():
        if stat.ppid == me and stat.state == "Z":
            try:
                os.waitpid(stat.pid, os.WNOHANG)
            except ChildProcessError:
                pass


# -- in a child, between fork and exec ------------------------------------------------------------


def become_uid(uid: int) -> None:
    """Turn the calling (forked, root) process into the unprivileged `uid`, for good."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise OSError("could not change to the worker's uid")


def unshare(flags: int) -> bool:
    """Move the calling process into new namespaces (CLONE_NEW* `flags`); whether the kernel allowed it."""
    result: int = _libc().unshare(flags)
    return result == 0


def die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Ask the kernel to send `signum` to this process when its parent dies (PR_SET_PDEATHSIG; a change of
    uid clears it, so set it after one). The request belongs to the thread that started this process. When
    `parent` is given and is already gone (this process was handed to another), exit at once."""
    prctl(PR_SET_PDEATHSIG, signum)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def become_child_subreaper() -> None:
    """Orphans among this process's descendants (setsid children whose parent exited) become its children,
    not init's: they stay in the tree it kills and reaps."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def hide_own_proc_files() -> None:
    """Make this process not dumpable: its /proc files (its environment, its memory) are root's alone."""
    prctl(PR_SET_DUMPABLE, 0)


# -- CPU time and waits --------------------------------------------------------------------------


def thread_schedstats(pid: int) -> dict[int, tuple[int, int]]:
    """Per live thread of `pid`, by thread id: nanoseconds on a CPU and nanoseconds ready to run but
    waiting for one (the first two fields of /proc/PID/task/TID/schedstat)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    found = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                ran, waited = handle.read().split()[:2]
            found[int(tid)] = (int(ran), int(waited))
        except (OSError, ValueError):
            pass
    return found


def own_wait() -> float:
    """Seconds the calling thread has spent ready to run but waiting for a CPU (0 where it cannot be read)."""
    try:
        with open("/proc/thread-self/schedstat") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def thread_wait(pid: int, tid: int) -> dict[int, int]:
    """{tid: nanoseconds} thread `tid` of process `pid` has spent ready to run but waiting for a CPU; {} when
    it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
            return {tid: int(handle.read().split()[1])}
    except (OSError, ValueError, IndexError):
        return {}


CPUCLOCK_SCHED = 2  # the kernel's process CPU-time clock of a pid: ((~pid) << 3) | CPUCLOCK_SCHED


def process_cpu_ns(pid: int) -> int | None:
    """User and system CPU time of process `pid`, every thread it ever had included, in nanoseconds (its
    CPU-time clock, clock_getcpuclockid's, which any process may read); None when it is gone or the clock
    cannot be read."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | CPUCLOCK_SCHED)
    except (OSError, OverflowError):
        return None


def process_cpu(stat: ProcStat) -> float | None:
    """Seconds of CPU time of the process `stat` describes (`process_cpu_ns`; where that clock cannot be
    read, its clock ticks or its live threads' nanoseconds, whichever is larger); None when its pid no
    longer names that process (it ended, and its pid was given to another)."""
    nanoseconds = process_cpu_ns(stat.pid)
    seconds = (
        nanoseconds / 1e9
        if nanoseconds is not None
        else max((stat.utime + stat.stime) / TICKS, sum(ran for ran, _ in thread_schedstats(stat.pid).values()) / 1e9)
    )
    after = read_stat(stat.pid)
    return seconds if after is not None and after.start == stat.start else None


@dataclass
class _Seen:
    own: float  # seconds of its own CPU time, as last seen
    reaped: float  # seconds of CPU time of the children it reaped, as last seen
    ppid: int


class CpuLedger:
    """The CPU time of every process a worker ever had, each as last seen: `update(pids)` reads the live ones
    and returns the total, which never falls. A process that ended keeps what it had when last seen, so
    killing a process, or having the kernel reap it (SIGCHLD ignored), takes nothing away; what it used after
    it was last seen is lost, unless a parent of the worker's reaped it, which then counts it (less what was
    already counted of the children that ended since). Where a process may run unseen matters: while a
    worker is timed, the others are stopped (`launcher.WorkerProcess.hold`), so nothing is lost there."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], _Seen] = {}
        self.reaped_total = 0.0  # children's CPU time that reached a parent of the worker, counted once

    def update(self, pids: Iterable[int]) -> float:
        alive: dict[tuple[int, int], ProcStat] = {}
        for pid in pids:
            stat = read_stat(pid)
            if stat is not None:
                alive[stat.key] = stat
        ended = [key for key in self.seen if key not in alive]
        for key, stat in alive.items():
            own = process_cpu(stat)
            reaped = (stat.cutime + stat.cstime) / TICKS
            before = self.seen.get(key)
            if before is None:
                self.seen[key] = _Seen(own or 0.0, reaped, stat.ppid)
                self.reaped_total += reaped  # children never seen: reaped before this process was first seen
                continue
            # children of this one that ended since, whose time is in the ledger already
            counted = sum(self.seen[k].own + self.seen[k].reaped for k in ended if self.seen[k].ppid == stat.pid)
            self.reaped_total += max(0.0, reaped - before.reaped - counted)
            before.own = max(before.own, own or 0.0)
            before.reaped = max(before.reaped, reaped)
        for key in ended:
            self.seen[key].ppid = -1  # ended: no later parent's reaping is its
        return self.total()

    def total(self) -> float:
        return sum(seen.own for seen in self.seen.values()) + self.reaped_total

    def of(self, key: tuple[int, int]) -> float | None:
        """Seconds of CPU time of one process, as last seen."""
        seen = self.seen.get(key)
        return seen.own if seen is not None else None
