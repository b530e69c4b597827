"""Trusted side: process control through /proc and prctl, the one place the grader finds, stops, kills,
reaps and accounts for processes.

- Finding: `read_stat` parses /proc/PID/stat (the only parser of it), `processes` lists every live process,
  `descendants` walks the parent links, `ancestry` is this process and its ancestors (never signalled).
- Stopping and killing a tree: `stop_tree` sends SIGSTOP to everything a finder returns and asks it again
  until nothing new appears (a stopped process neither forks nor exits, so the tree holds still while it
  is read); `kill_tree` stops the whole tree before it kills any of it, since a process killed first hands
  its children to their subreaper, out of the tree the walk follows, where a setsid child would survive.
- Reaping and dying together: `reap_orphans` waits for zombie children that are no Popen's (orphans that
  came to this process as their subreaper, `become_child_subreaper`); `die_with_parent` asks the kernel to
  signal a process when its parent dies (PR_SET_PDEATHSIG).
- Accounting: `cpu_seconds` of a set of processes (from their stat and their threads' schedstat), and
  `thread_schedstats` / `thread_waits`: nanoseconds each thread ran and waited for a CPU; `own_wait`: the
  calling thread's wait (the grader's, while it times a request).

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


def stop_tree(find: Callable[[], Iterable[int]]) -> list[int]:
    """SIGSTOP every process `find()` returns, and ask it again until no new one appears: a stopped
    process neither forks nor exits, so the tree holds still while it is read. Returns what was stopped."""
    stopped: set[int] = set()
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


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a fresh uid: only one worker's), from a child that becomes it:
    kill(-1) reaches exactly the processes that uid may signal, which are its own. Root only."""
    if os.geteuid() != 0:
        return
    pid = os.fork()
    if pid == 0:
        try:
            become_uid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


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


def thread_waits(pids: Iterable[int]) -> dict[int, int]:
    """Nanoseconds each live thread of `pids` has spent ready to run but waiting for a CPU, by thread id."""
    return {tid: waited for pid in pids for tid, (_ran, waited) in thread_schedstats(pid).items()}


def cpu_seconds(pids: Iterable[int]) -> float:
    """User and system CPU time of the live processes `pids` and their reaped children: each process to the
    nanosecond from its live threads' schedstat, or its clock ticks when larger (threads that ended)."""
    total = 0.0
    for pid in pids:
        stat = read_stat(pid)
        if stat is not None:
            own = max((stat.utime + stat.stime) / TICKS, _threads_runtime(pid))
            total += own + (stat.cutime + stat.cstime) / TICKS
    return total


def _threads_runtime(pid: int) -> float:
    """Seconds on a CPU of the live threads of `pid`."""
    return sum(ran for ran, _ in thread_schedstats(pid).values()) / 1e9
