"""Trusted side: a worker's lifecycle. Start it in its sandbox, hold its whole process tree, and end it.

`launch` starts `python -I -u -c BOOT` (which loads `protocol`, `jail` and `server` from source) with a
scrubbed environment, in the isolation `probe.choose_isolation` chose:

- `namespace`: under bubblewrap, with the allow list and namespaces of `bwrap`. It never runs as root: when
  the grader is root, bwrap runs without a user namespace and the worker drops to a fresh unprivileged uid
  before any student code (`jail.drop_privileges`); otherwise a user namespace maps it to the grader's own,
  unprivileged, uid.
- `process`: a separate process in a scratch directory; when the grader is root, as a fresh unprivileged uid
  (so it cannot read root's files, signal the grader or read its environment), with its own network and
  IPC namespaces where the kernel allows; otherwise as the grader's own user.

In both, the worker's processes live in one control group (`cgroups.WorkerGroup`): memory, process and CPU
limits for all of them together, and the kernel's own list of them, which is what `suspend`, `resume`,
`cpu_seconds` and `kill` act on. Where no control group can be made, per-process limits (RLIMIT_AS,
RLIMIT_NPROC for a fresh uid) and a walk of /proc (`procfs`) stand in, and `WorkerProcess.in_force` says so
(`probe.describe_isolation`). The grader is made a child subreaper, so a worker's orphans stay its
descendants.

CPU time without a control group's count (`cpu_seconds`, `thread_waits`): every process of the worker's fresh
uid is found whatever its parentage (`procfs.owned_by`), and each one's CPU time is kept in a ledger as last
seen (`procfs.CpuLedger`), so none can take it away by ending. (What is timed runs only in trusted workers,
which replay a graph the grader checked: no timed worker runs student code, so none needs holding to its main
process while it is timed.)
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from autograder.sandbox import bwrap, forks, leftovers, probe, procfs
from autograder.sandbox.cgroups import ResourceLimits, WorkerGroup
from autograder.sandbox.protocol import ChildSetup, ForkServerSetup, WorkerSetup
from autograder.sandbox.settings import WorkerConfig

SANDBOX_DIR = Path(__file__).resolve().parent
SERVER_MODULES = ("protocol", "jail", "server")  # loaded, in this order, inside the worker
FORK_SERVER_MODULES = (*SERVER_MODULES, "forkserver")  # and inside the fork server


def boot_code(modules: tuple[str, ...], entry: str, arguments: int) -> str:
    """Loads the untrusted-side `modules` from the sources passed on the command line after its `arguments`, as
    the package `sandbox`, then hands over to `entry`'s `main` with those arguments."""
    return f"""
import sys, types
package = types.ModuleType("sandbox")
package.__path__ = []
sys.modules["sandbox"] = package
for name, source in zip({modules!r}, sys.argv[{arguments + 1}:]):
    module = types.ModuleType("sandbox." + name)
    module.__package__ = "sandbox"
    sys.modules[module.__name__] = module
    exec(compile(source, "<sandbox/" + name + ".py>", "exec"), module.__dict__)
    setattr(package, name, module)
sys.modules["sandbox.{entry}"].main(sys.argv[1:{arguments + 1}])
"""


BOOT = boot_code(SERVER_MODULES, "server", 3)  # a worker's; argv: FD_IN FD_OUT CONFIG SOURCE...
FORK_SERVER_BOOT = boot_code(FORK_SERVER_MODULES, "forkserver", 2)  # argv: CONTROL_FD CONFIG SOURCE...


def sources(modules: tuple[str, ...]) -> list[str]:
    return [(SANDBOX_DIR / ("" if name == "protocol" else "inside") / f"{name}.py").read_text() for name in modules]


@dataclass(frozen=True)
class LaunchSettings:
    """One start of a worker process: the worker's settings, and what this start decides."""

    config: WorkerConfig
    isolation: probe.Isolation  # already chosen
    filename: str = "mha.py"
    allowed: bwrap.AllowList | None = None  # what the namespace sandbox shows (None: `bwrap.allow_list()`)
    fork: bool = True  # from this process's fork server, where the settings allow forks (`forks_per_server`)

    @property
    def forks_per_server(self) -> int:
        return self.config.forks_per_server if self.fork else 0


class WorkerProcess:
    """One running worker and everything it started."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | forks.ForkedProcess,
        to_worker: int,
        from_worker: int,
        scratch: str | None,
        isolation: probe.Isolation,
        group: WorkerGroup | None,
        uid: int | None,
        in_force: dict[str, str],
    ):
        self.process, self.to_worker, self.from_worker = process, to_worker, from_worker
        self.scratch, self.isolation, self.group, self.uid = scratch, isolation, group, uid
        self.in_force = in_force
        self.stopped = False
        self.memory_kills = 0
        self.memory_peak: int | None = None
        self._cpu_at_exit: float | None = None
        self._namespace: str | None = None
        self.main: int | None = None  # the process that answers requests (`find_main`)
        self.ledger = procfs.CpuLedger()
        self._stopped: list[tuple[int, int]] | None = None  # (pid, start) of each process `suspend` stopped
        self._seen: list[tuple[int, int]] = []  # the same, of the last `suspend` by SIGSTOP, kept after `resume`
        self.fresh_because: str | None = None  # why it was started fresh although a fork was asked for

    @property
    def forked(self) -> bool:
        return isinstance(self.process, forks.ForkedProcess)

    def started(self, seconds: float) -> str | None:
        """None once the worker runs in its control group (at once for a fresh one); for a forked one, why its
        fork server did not hand it over within `seconds`, when it did not."""
        if isinstance(self.process, forks.ForkedProcess):
            return self.process.started(seconds)
        return None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def output(self) -> IO[bytes]:
        """What the worker writes to its stdout and stderr, together (a pipe)."""
        if self.process.stdout is None:  # never: `launch` pipes it
            raise OSError("the worker's output is not a pipe")
        return self.process.stdout

    def alive(self) -> bool:
        return self.process.poll() is None

    def pids(self) -> list[int]:
        """Every process of this worker: its control group's list where there is one; otherwise, for a
        process of a fresh uid, every process of that uid; otherwise the session it was started in, every
        descendant of its first process, found through /proc (setsid children leave the session, not the
        tree: the grader is their subreaper), and, under namespace isolation, every process of its pid
        namespace (which none can leave)."""
        if isinstance(self.process, forks.ForkedProcess) and not self.process.handed_over():
            return []  # not yet handed over: it has run nothing, and its process id is not known yet
        never = procfs.ancestry()
        if self.group is not None and self.group.can_kill():
            return [pid for pid in self.group.pids() if pid not in never]
        if self.uid is not None and self.isolation != "namespace":
            # a fresh uid from its first instruction on, which no process can leave: every process it has,
            # whatever its parentage (a setsid helper whose parent ended is the grader's child, in no
            # session or tree of the worker's)
            return sorted(set(procfs.owned_by(self.uid)) - never)
        stats = procfs.processes()
        namespace = self.namespace()
        found = {
            stat.pid
            for stat in stats
            if stat.pgid == self.pid or (namespace is not None and procfs.pid_namespace(stat.pid) == namespace)
        }
        children = procfs.children_of(stats)
        tree = {self.pid, *procfs.descendants(self.pid, children)}
        for pid in found - tree:
            tree |= {pid, *procfs.descendants(pid, children)}
        return sorted(tree - never)

    def find_main(self, pid_inside: int) -> None:
        """Note which process answers requests: the one that said it was ready as `pid_inside` (its pid in its
        own pid namespace), found before any code of the submission has run. Under process isolation that is
        the process started; in the namespace sandbox, bubblewrap's child's child."""
        if self.isolation != "namespace":
            self.main = self.pid
            return
        for pid in self.pids():
            inside = procfs.namespace_pids(pid)
            if pid != self.pid and len(inside) > 1 and inside[-1] == pid_inside:
                self.main = pid
                return

    def namespace(self) -> str | None:
        """The worker's own pid namespace (namespace isolation only): never the grader's."""
        if self._namespace is None and self.isolation == "namespace":
            child = procfs.first_child(self.pid)  # the worker's pid is bwrap's; the process inside is its child
            namespace = procfs.pid_namespace(child) if child != self.pid else None
            if namespace is not None and namespace != procfs.pid_namespace(os.getpid()):
                self._namespace = namespace
        return self._namespace

    def suspend(self) -> None:
        """Stop every process of the worker (the cgroup freezer, else SIGSTOP, asking again until no new one
        appears, and waiting until each has stopped), e.g. while the reference is being timed, or between
        requests (`client.Worker.quiet`)."""
        if not (self.group is not None and self.group.freeze(True)):
            stopped = procfs.stop_tree(self.pids, known=self._seen)  # those of the last time first: one walk less
            procfs.wait_stopped(stopped)
            self._stopped = self._seen = [stat.key for stat in map(procfs.read_stat, stopped) if stat is not None]
        self.stopped = True

    def resume(self) -> None:
        if not (self.group is not None and self.group.freeze(False)):
            procfs.signal_all(self._to_continue(), signal.SIGCONT)
        self._stopped = None
        self.stopped = False

    def _to_continue(self) -> list[int]:
        """What `resume` continues: the processes `suspend` stopped, where it stopped them all by SIGSTOP and
        nothing ran since (a stopped process starts none, so no walk of /proc is needed: between requests it
        would cost one per request), each only if it is still the process stopped (not a pid used again);
        otherwise every process of the worker."""
        if self._stopped is None:
            return self.pids()
        now = {pid: procfs.read_stat(pid) for pid, _ in self._stopped}
        return [pid for pid, start in self._stopped if (stat := now[pid]) is not None and stat.start == start]

    def cpu_seconds(self) -> float:
        """User and system CPU time of every process of the worker, ended ones included: its control group's
        count where there is one; otherwise the ledger's (`procfs.CpuLedger`: each process to the nanosecond,
        as last seen), which never falls."""
        if self._cpu_at_exit is not None:
            return self._cpu_at_exit
        if self.group is not None:
            seconds = self.group.cpu_seconds()
            if seconds is not None:
                return seconds
        return self.ledger.update(self.pids())

    def thread_waits(self) -> dict[int, int]:
        """Nanoseconds the thread that answers requests (the main process's first thread) has spent ready to
        run but waiting for a CPU, by thread id: the waits deducted from its charge. Not the waits of its other
        threads or processes: the worker may cause them itself (a thread that spins beside another makes each
        wait), and together they can exceed the wall time."""
        if self.main is None:
            return {}
        return procfs.thread_wait(self.main, self.main)

    def went_over_memory(self) -> bool:
        """Whether the kernel killed a process of the worker for going over the memory limit."""
        if self.group is not None and self.group.dirs:
            self.memory_kills = self.group.memory_kills()
        return self.memory_kills > 0

    def kill(self) -> None:
        """Kill every process of the worker, reap them, and remove its control group and scratch folder."""
        if isinstance(self.process, forks.ForkedProcess) and self.process.cancel():
            self._cpu_at_exit = 0.0
            self._release()  # never handed over: it ends by itself, having run nothing
            return
        if self.group is not None and self.group.dirs:
            self.group.kill()
            self.memory_kills = self.group.memory_kills()
            self.memory_peak = self.group.memory_peak()
            self._cpu_at_exit = self.group.cpu_seconds()
        walked = self.group is None or not self.group.can_kill()
        tree: list[int] = []
        if walked:
            # Without a control group the processes are found through the tree, so the whole tree is stopped
            # before any of it dies (`procfs.kill_tree`), and its CPU time read while it holds still.
            tree = procfs.stop_tree(self.pids)
            self._cpu_at_exit = self.cpu_seconds()
        if self.uid is not None:
            procfs.kill_uid(self.uid)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if walked:
            procfs.kill_stopped(tree, self.pids)
        self.process.wait()
        procfs.reap_orphans()
        if walked:
            procfs.wait_gone(tree)  # a control group's kill waits for it to empty; a walked tree is waited here
        if self.uid is not None and self.isolation == "process":
            leftovers.remove_files_of(self.uid)  # the machine's world-writable folders: no later worker sees it
        self._release()

    def _release(self) -> None:
        """Remove its control group and scratch folder, and close the grader's ends of its channel."""
        if self.group is not None:
            self.group.remove()
        for fd in (self.to_worker, self.from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def hidden_and_kept(extra: Iterable[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a worker (or a fork server) must not see, `jail.hide_grader_packages`' folders: the grader's packages,
    the temporary folder and `extra`; and of those, what it keeps on sys.path: the interpreter and its packages."""
    hide = tuple(sorted({*bwrap.grader_folders(), tempfile.gettempdir(), *extra}))
    prefixes = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})
    return hide, tuple(k for k in prefixes if any(bwrap.inside(k, h) for h in hide))


def launch(settings: LaunchSettings) -> WorkerProcess:
    sandbox = settings.isolation == "namespace"
    uid = probe.fresh_uid() if probe.is_root() and (sandbox or probe.separate_uid_available()) else None
    procfs.become_child_subreaper()
    procfs.hide_own_proc_files()
    scratch = None if sandbox else tempfile.mkdtemp(prefix="mha-worker-")
    if scratch and uid is not None:
        os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
        leftovers.find_shared_folders_now()  # where its uid could leave files, found while it runs
    req_r, req_w = os.pipe()
    os.set_blocking(req_w, False)  # a write never waits on a worker that stopped reading (channel._write_all)
    resp_r, resp_w = os.pipe()
    hide, keep = hidden_and_kept(settings.config.hide)
    workdir = bwrap.WORKDIR if scratch is None else scratch
    setup = WorkerSetup(
        filename=settings.filename,
        device=settings.config.device,
        threads=settings.config.threads,
        sandbox=sandbox,
        uid=uid if sandbox else None,  # in the sandbox the worker drops to it itself
        hide=hide,
        keep=keep,
        workdir=workdir,
        contract=tuple(settings.config.contract),
    )
    # RLIMIT_AS makes a huge allocation a clean MemoryError/RuntimeError; it breaks CUDA, where only the
    # control group's limit holds
    memory = settings.config.memory_bytes if settings.config.device == "cpu" else None
    group = control_group(settings.config) if settings.config.use_cgroups else None
    in_force = probe.describe_isolation(
        sandbox=sandbox,
        uid=uid,
        group=group,
        rlimit_memory=memory,
        scratch_bytes=settings.config.scratch_bytes,
        processes=settings.config.processes,
    )
    fresh_because = None
    if settings.forks_per_server > 0:
        child = ChildSetup(
            worker=setup,
            uid=uid,
            env={**bwrap.worker_env(workdir), **({"PWD": workdir} if sandbox else {})},  # bubblewrap sets PWD
            memory_bytes=memory,
            nproc=settings.config.processes if uid is not None and group is None else None,
            scratch_bytes=settings.config.scratch_bytes,
            userns=sandbox and not probe.is_root(),
            separate_namespaces=not sandbox and uid is not None,
        )
        forked = fork_worker(settings, child, (req_r, resp_w), group)
        if isinstance(forked, forks.ForkedProcess):
            os.close(req_r)
            os.close(resp_w)
            return WorkerProcess(forked, req_w, resp_r, scratch, settings.isolation, group, uid, in_force)
        fresh_because = forked
    process = start_fresh(settings, setup, uid, memory, group, scratch, (req_r, resp_w))
    os.close(req_r)
    os.close(resp_w)
    worker = WorkerProcess(process, req_w, resp_r, scratch, settings.isolation, group, uid, in_force)
    worker.fresh_because = fresh_because
    return worker


def start_fresh(
    settings: LaunchSettings,
    setup: WorkerSetup,
    uid: int | None,
    memory: int | None,
    group: WorkerGroup | None,
    scratch: str | None,
    fds: tuple[int, int],
) -> subprocess.Popen[bytes]:
    """A fresh worker process (`BOOT`, then the server's sources), in bubblewrap's sandbox where `setup` says so,
    its limits set in the child before it runs Python: the control group, core and file sizes, its address
    space on the CPU, the fresh uid's process count, the namespaces it can have without the sandbox, and death
    with the grader. `fds`: the request pipe's read end and the reply pipe's write end, passed to it."""
    sandbox = setup.sandbox
    # -u: unbuffered, so what the student's code printed is captured even when the worker is killed
    command = [
        *(sys.executable, "-I", "-u", "-c", BOOT, *map(str, fds), setup.to_json()),
        *sources(SERVER_MODULES),
    ]
    if sandbox:
        executable = probe.bwrap_path() or "bwrap"
        command = bwrap.command(
            executable, settings.config.device, settings.config.scratch_bytes, probe.is_root(), settings.allowed
        ) + ["--", *command]
    grader = os.getpid()

    def in_child() -> None:
        if group is not None:
            group.attach_self()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (settings.config.scratch_bytes, settings.config.scratch_bytes))
        if uid is not None and settings.config.processes and group is None:
            # counts the fresh uid's processes only; the worker drops to it (here, or in the sandbox)
            resource.setrlimit(resource.RLIMIT_NPROC, (settings.config.processes, settings.config.processes))
        if not sandbox and uid is not None:
            # best effort: no network, own IPC (shared memory and queues vanish with the worker)
            procfs.unshare(procfs.CLONE_NEWNET | procfs.CLONE_NEWIPC | procfs.CLONE_NEWUTS)
            procfs.become_uid(uid)
        # SIGKILL when the grader ends (set after any uid change, which clears it)
        procfs.die_with_parent(signal.SIGKILL, parent=grader)
        if memory:
            # last: this child is still a copy of the grader, whose address space may be larger than the limit,
            # so any allocation after it (a new arena, ctypes' first call) could fail; exec starts small
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.Popen(
        command,
        cwd="/" if sandbox else scratch,
        env=bwrap.worker_env(setup.workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=fds,
        start_new_session=True,
        preexec_fn=in_child,
    )


def control_group(config: WorkerConfig) -> WorkerGroup | None:
    """A control group holding the worker's processes to its memory, process count and CPU quota together;
    None where none can be made here."""
    group = WorkerGroup.create(ResourceLimits(config.memory_bytes, config.processes, config.cpus))
    return group if group.dirs else None


def fork_worker(
    settings: LaunchSettings, child: ChildSetup, channel: tuple[int, int], group: WorkerGroup | None
) -> forks.ForkedProcess | str:
    """The worker as a child of this process's fork server for its kind (`forks.SERVERS`), or why it cannot be
    one. The child gets the channel's two ends and an output pipe of its own."""
    key = forks.ServerKey(
        sys.executable,
        settings.isolation,
        settings.config.device,
        settings.config.scratch_bytes,
        (settings.allowed or bwrap.allow_list()) if settings.isolation == "namespace" else None,
    )
    out_r, out_w = os.pipe()
    try:
        forked = forks.SERVERS.fork(
            key,
            settings.forks_per_server,
            functools.partial(start_fork_server, key),
            child,
            (*channel, out_w),
            group,
            settings.config.boot_seconds,
        )
    finally:
        os.close(out_w)
    if isinstance(forked, str):
        os.close(out_r)
        return forked
    forked.stdout = os.fdopen(out_r, "rb", buffering=0)
    return forked


def start_fork_server(key: forks.ServerKey, control: socket.socket, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a fork server by exec, where and as a worker of `key`'s kind starts: in the namespace sandbox
    with the same allow list (keeping, for its children, what it takes to make their own namespaces), or as a
    separate process (as root under a root grader, so that each child can take a fresh uid); with a fresh
    worker's environment, the grader's packages hidden, dying with the grader. Its children re-establish the
    rest (`inside/forkserver.py`)."""
    sandbox = key.isolation == "namespace"
    workdir = bwrap.WORKDIR if sandbox else "/"
    setup = ForkServerSetup(*hidden_and_kept(), workdir)
    command = [
        *(sys.executable, "-I", "-u", "-c", FORK_SERVER_BOOT, str(control.fileno()), setup.to_json()),
        *sources(FORK_SERVER_MODULES),
    ]
    if sandbox:
        executable = probe.bwrap_path() or "bwrap"
        command = bwrap.command(
            executable, key.device, key.scratch_bytes, probe.is_root(), key.allowed, fork_server=True
        ) + ["--", *command]
    grader = os.getpid()

    def in_child() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        procfs.die_with_parent(signal.SIGKILL, parent=grader)

    return subprocess.Popen(
        command,
        cwd="/",
        env=bwrap.worker_env(workdir),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        pass_fds=(control.fileno(),),
        start_new_session=True,
        preexec_fn=in_child,
    )
