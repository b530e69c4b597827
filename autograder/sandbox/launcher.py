"""Trusted side: start a worker process in its sandbox, and hold its whole process tree.

`launch` starts `python -I -u -c BOOT` (which loads `protocol`, `jail` and `server` from source) with
a scrubbed environment, in one of two isolations:

- `namespace`: bubblewrap (`bwrap`) builds the worker a filesystem from an allow list: the interpreter,
  its standard library and packages, the shared libraries they load (read from this process's own
  memory map after `import torch`), `/etc/ld.so.cache`, a minimal `/dev` (plus the NVIDIA devices for
  CUDA), a `/proc` of its own pid namespace and an empty, size-limited `/tmp` to work in. The grader's
  packages are masked even where they sit inside the interpreter's folders. The worker has its own
  pid, network, IPC, UTS and cgroup namespaces (so no host sockets, no shared memory that outlives
  it, no network), a new session, and dies with its grader (`--die-with-parent`). It never runs as
  root: when the grader is root, bwrap runs without a user namespace and the worker drops to a fresh
  unprivileged uid before any student code (`jail.drop_privileges`); otherwise a user namespace maps
  it to the grader's own, unprivileged, uid.
- `process`: a separate process in a scratch directory. When the grader is root, it runs as a fresh
  unprivileged uid (so it cannot read root's files, signal the grader or read its environment), with
  its own network and IPC namespaces where the kernel allows; otherwise as the grader's own user,
  which only an explicit choice (`--isolation process`) allows (`separate_uid_available`).

In both, the worker's processes live in one control group (`cgroups.WorkerGroup`): memory, process
and CPU limits for all of them together, and the kernel's own list of them, which is what `suspend`,
`resume`, `cpu_seconds` and `kill` act on. Where no control group can be made, per-process limits
(RLIMIT_AS, RLIMIT_NPROC for a fresh uid) and a walk of /proc stand in, and `WorkerProcess.in_force`
says so. The grader is made a child subreaper, so a worker's orphans stay its descendants.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from autograder.sandbox.cgroups import Limits, WorkerGroup

SANDBOX_DIR = Path(__file__).resolve().parent
CHECKOUT = SANDBOX_DIR.parents[1]
# The project's source checkout, hidden from the worker whole; None when the grader is installed (a wheel),
# where the folder above the package is site-packages, which the worker needs: there only the grader's
# own packages are hidden.
PROJECT_ROOT = CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else None
SERVER_MODULES = ("protocol", "jail", "server")  # loaded, in this order, inside the worker
GRADER_PACKAGES = ("autograder", "reference")
WORKDIR = "/tmp"  # the worker's empty scratch folder, inside the namespace sandbox
UID_RANGE = (1_500_000_000, 1 << 22)  # fresh uids for workers: start, count (far from any real user)

# Loads the untrusted-side modules from the sources passed on the command line, as the package
# `sandbox`, then hands over to the server. argv: FD_IN FD_OUT CONFIG SOURCE...
BOOT = f"""
import sys, types
package = types.ModuleType("sandbox")
package.__path__ = []
sys.modules["sandbox"] = package
for name, source in zip({SERVER_MODULES!r}, sys.argv[4:]):
    module = types.ModuleType("sandbox." + name)
    module.__package__ = "sandbox"
    sys.modules[module.__name__] = module
    exec(compile(source, "<sandbox/" + name + ".py>", "exec"), module.__dict__)
    setattr(package, name, module)
sys.modules["sandbox.server"].main(sys.argv[1:4])
"""

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWUTS = 0x08000000, 0x40000000, 0x04000000


# -- what the machine offers ---------------------------------------------------------------------


def is_root() -> bool:
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
    """Why bubblewrap cannot start this interpreter in the sandbox here, or None when it can."""
    if not bwrap_path():
        return "bubblewrap (`bwrap`) is not installed"
    try:
        probe = subprocess.run(
            _bwrap_command("cpu", scratch_bytes=1 << 20) + [sys.executable, "-I", "-S", "-c", "pass"],
            env=_worker_env(),
            capture_output=True,
            timeout=30,
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not be run: {exc}"
    if probe.returncode != 0:
        said = " ".join(probe.stderr.decode(errors="replace").split())[-300:]
        return f"bubblewrap exited with status {probe.returncode}" + (f": {said}" if said else "")
    return None


@cache
def separate_uid_available() -> bool:
    """Whether a process-isolated worker can run as a fresh unprivileged uid: the grader is root and
    that uid can read the interpreter, its standard library and torch."""
    if not is_root():
        return False
    import torch  # the grader's own; its folder must be readable by the worker

    paths = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], os.path.dirname(torch.__file__)]
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
            preexec_fn=lambda: _become(uid),
            capture_output=True,
            timeout=30,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


@cache
def _say_once(message: str):
    print(message, file=sys.stderr)


def choose_isolation(wanted: str) -> str:
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
        raise OSError(
            f"no sandbox is available here: {namespace_sandbox_problem()}, and {instead}, so the "
            "student's code would run as the grader's own user. Install bubblewrap "
            "(Debian/Ubuntu: apt-get install bubblewrap), or pass --isolation process (or set "
            "AUTOGRADER_ISOLATION=process) to grade without a sandbox anyway"
        )
    if wanted == "namespace" and not namespace_sandbox_available():
        raise OSError(f"namespace isolation was asked for, but it cannot start here: {namespace_sandbox_problem()}")
    if wanted not in ("namespace", "process"):
        raise ValueError(f"unknown isolation {wanted!r}")
    return wanted


def fresh_uid() -> int:
    """A uid no user has: from UID_RANGE, or, in a user namespace that does not map it (a container's, a
    Kubernetes pod with `hostUsers: false`, where root is root of 65,536 uids), from the upper half of
    the largest range it maps, uid and gid alike."""
    start, count = fresh_uid_range()
    return start + secrets.randbelow(count)


@cache
def fresh_uid_range() -> tuple[int, int]:
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


# -- the allow list ------------------------------------------------------------------------------


def _elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF executable asks for (PT_INTERP), e.g. /lib64/ld-linux-x86-64.so.2."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return None
            fmt = "<" if head[5] == 1 else ">"
            phoff = struct.unpack_from(fmt + "Q", head, 32)[0]
            entry_size, count = struct.unpack_from(fmt + "HH", head, 54)
            for index in range(count):
                handle.seek(phoff + index * entry_size)
                header = handle.read(entry_size)
                if struct.unpack_from(fmt + "I", header, 0)[0] == 3:  # PT_INTERP
                    offset, size = (
                        struct.unpack_from(fmt + "Q", header, 8)[0],
                        struct.unpack_from(fmt + "Q", header, 32)[0],
                    )
                    handle.seek(offset)
                    return handle.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path of `path`, recording every symlink met on the way (link path -> its text)."""
    current = "/"
    for part in Path(path).parts[1:]:
        candidate = os.path.join(current, part)
        if os.path.islink(candidate) and depth < 32:
            target = os.readlink(candidate)
            links[candidate] = target
            current = _resolve(os.path.normpath(os.path.join(current, target)), links, depth + 1)
        else:
            current = candidate
    return current


def _inside(path: str, parent: str) -> bool:
    path, parent = os.path.abspath(path), os.path.abspath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@dataclass(frozen=True)
class AllowList:
    binds: tuple[str, ...]  # real paths, shown read-only at the same place
    links: tuple[tuple[str, str], ...]  # (path, target): symlinks to recreate
    masks: tuple[str, ...]  # folders inside `binds` hidden behind an empty tmpfs (the grader's packages)


@cache
def allow_list() -> AllowList:
    """What the worker may see besides /dev, /proc and /tmp: the interpreter and what it loads."""
    import torch  # noqa: F401  (its shared libraries must be in the memory map read below)

    links: dict[str, str] = {}
    wanted: list[str] = []
    venv = sys.prefix != sys.base_prefix
    if venv:
        wanted.append(sys.prefix)  # pyvenv.cfg, its packages
    base = {
        "base": sys.base_prefix,
        "platbase": sys.base_exec_prefix,
        "installed_base": sys.base_prefix,
        "installed_platbase": sys.base_exec_prefix,
    }
    keys = (
        ("stdlib", "platstdlib")
        if venv and not _system_site_packages()
        else ("stdlib", "platstdlib", "purelib", "platlib")
    )
    wanted += [sysconfig.get_paths(vars=base)[key] for key in keys]
    if venv:
        wanted += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    wanted.append(sys.executable)
    interpreter = _elf_interpreter(os.path.realpath(sys.executable))
    if interpreter:
        wanted.append(interpreter)
    with open("/proc/self/maps") as handle:
        mapped = {line.split(None, 5)[5].strip() for line in handle if len(line.split(None, 5)) == 6}
    for path in mapped:
        if path.startswith("/") and ".so" in os.path.basename(path) and os.path.isfile(path):
            wanted.append(os.path.dirname(path))  # the folder: libraries loaded later sit beside these
    if os.path.exists("/etc/ld.so.cache"):
        wanted.append("/etc/ld.so.cache")
    for entry in os.scandir("/"):  # merged /usr: /lib -> usr/lib and the like
        if entry.is_symlink():
            links[entry.path] = os.readlink(entry.path)
    real = sorted({_resolve(os.path.abspath(p), links) for p in wanted if os.path.exists(p)}, key=len)
    binds: list[str] = []
    for path in real:
        if not any(_inside(path, kept) for kept in binds):
            binds.append(path)
    shown_links = {link: target for link, target in links.items() if not any(_inside(link, b) for b in binds)}
    masks = []
    for name in GRADER_PACKAGES:
        folder = _package_folder(name)
        if folder and any(_inside(folder, b) for b in binds):
            masks.append(folder)
    if PROJECT_ROOT is not None and any(_inside(str(PROJECT_ROOT), b) for b in binds):
        masks.append(str(PROJECT_ROOT))
    return AllowList(tuple(binds), tuple(sorted(shown_links.items())), tuple(masks))


def _system_site_packages() -> bool:
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    try:
        return "include-system-site-packages = true" in cfg.read_text().replace("\t", " ").lower()
    except OSError:
        return False


def grader_folders() -> list[str]:
    """What of the grader the worker must not see: the checkout, or, installed, the grader's packages."""
    if PROJECT_ROOT is not None:
        return [str(PROJECT_ROOT)]
    return [folder for folder in map(_package_folder, GRADER_PACKAGES) if folder]


def _package_folder(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def _bwrap_command(device: str, scratch_bytes: int) -> list[str]:
    """bwrap and its options; the interpreter's command line follows."""
    allowed = allow_list()
    command = [
        bwrap_path() or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if is_root():
        # No user namespace (it would map the worker to root): real root makes the namespaces, keeps only
        # what it takes to change uid, and the worker drops to a fresh uid before student code runs.
        command += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    # The scratch folder first: the interpreter, its packages and the checkout may themselves live under
    # /tmp (a CI runner's clone), and their binds must land on top of it, not under it.
    command += ["--size", str(scratch_bytes), "--perms", "1777", "--tmpfs", WORKDIR]
    made: set[str] = {"/", WORKDIR}
    for path in [*allowed.binds, *(link for link, _ in allowed.links)]:
        for parent in list(Path(path).parents)[::-1]:
            parent = str(parent)
            if (
                parent not in made
                and not any(_inside(parent, b) for b in allowed.binds)
                and parent not in dict(allowed.links)
            ):
                command += ["--perms", "0755", "--dir", parent]
                made.add(parent)
    for path in allowed.binds:
        command += ["--ro-bind", path, path]
    for link, target in allowed.links:
        command += ["--symlink", target, link]
    for path in allowed.masks:
        command += ["--tmpfs", path]
    command += ["--dev", "/dev", "--proc", "/proc"]
    if device.startswith("cuda"):
        for entry in sorted(Path("/dev").glob("nvidia*")):
            command += ["--dev-bind", str(entry), str(entry)]
    command += ["--chdir", WORKDIR]
    return command


def _worker_env(workdir: str = WORKDIR) -> dict[str, str]:
    # OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning between requests, which
    # otherwise burns seconds of CPU per submission that other submissions graded at once need.
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "LANG": "C.UTF-8",
        "USER": "student",
        "LOGNAME": "student",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": workdir,
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


# -- in the child, between fork and exec ---------------------------------------------------------


def _become(uid: int):
    """Turn the calling (forked, root) process into the unprivileged `uid`, for good."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise OSError("could not change to the worker's uid")


def _die_with(parent: int):
    """SIGKILL this process when the grader ends (set after any uid change, which clears it)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the grader is already gone
        os._exit(1)


def make_grader_a_subreaper():
    """Orphans of the worker (setsid children whose parent exited) become the grader's children, not
    init's: they stay in the tree the grader kills and reaps. Also keeps this process's /proc files
    (its environment) away from processes of the same user."""
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


# -- the worker ----------------------------------------------------------------------------------


@dataclass
class LaunchSettings:
    isolation: str  # "namespace" or "process", already chosen
    device: str
    threads: int
    memory_bytes: int | None
    processes: int | None = 256  # processes and threads, all together
    cpus: float | None = None  # CPU quota for all the worker's processes together, in cores
    scratch_bytes: int = 256 << 20
    hide: list[str] = field(default_factory=list)
    filename: str = "mha.py"
    contract: tuple[str, ...] = ()
    use_cgroups: bool = True


class WorkerProcess:
    """One running worker and everything it started."""

    def __init__(
        self,
        process: subprocess.Popen,
        to_worker: int,
        from_worker: int,
        scratch: str | None,
        isolation: str,
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

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def pids(self) -> list[int]:
        """Every process of this worker: its control group's list where there is one; otherwise the
        session it was started in, every descendant of its first process, found through /proc (setsid
        children leave the session, not the tree: the grader is their subreaper), and, under namespace
        isolation, every process of its pid namespace."""
        if self.group is not None and self.group.can_kill():
            return [pid for pid in self.group.pids() if pid not in _ancestry()]
        found = set()
        children: dict[int, list[int]] = {}
        namespace = self.namespace()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _stat(pid)
            if stat is None:
                continue
            ppid, pgid = stat[1], stat[2]
            children.setdefault(ppid, []).append(pid)
            if pgid == self.pid or (namespace is not None and _pid_namespace(pid) == namespace):
                found.add(pid)
        todo, seen = [self.pid, *found], set()
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo.extend(children.get(pid, []))
        return sorted(seen - _ancestry())

    def namespace(self) -> str | None:
        """The worker's own pid namespace (namespace isolation only): never the grader's."""
        if self._namespace is None and self.isolation == "namespace":
            child = _first_child(self.pid)
            namespace = _pid_namespace(child) if child != self.pid else None
            if namespace is not None and namespace != _pid_namespace(os.getpid()):
                self._namespace = namespace
        return self._namespace

    def signal_all(self, signum: int):
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def suspend(self):
        """Stop every process of the worker (the cgroup freezer, else SIGSTOP), e.g. while the reference
        is being timed."""
        if not (self.group is not None and self.group.freeze(True)):
            self.signal_all(signal.SIGSTOP)
        self.stopped = True

    def resume(self):
        if not (self.group is not None and self.group.freeze(False)):
            self.signal_all(signal.SIGCONT)
        self.stopped = False

    def cpu_seconds(self) -> float:
        """User and system CPU time of every process of the worker: with a control group, including
        processes that already ended; otherwise the live ones (and their reaped children), each to the
        nanosecond from its live threads' schedstat, or its clock ticks when larger (threads that ended)."""
        if self._cpu_at_exit is not None:
            return self._cpu_at_exit
        if self.group is not None:
            seconds = self.group.cpu_seconds()
            if seconds is not None:
                return seconds
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.pids():
            stat = _stat(pid)
            if stat is not None:
                total += max(sum(stat[3:5]) / ticks, _threads_runtime(pid)) + sum(stat[5:7]) / ticks
        return total

    def went_over_memory(self) -> bool:
        """Whether the kernel killed a process of the worker for going over the memory limit."""
        if self.group is not None and self.group.dirs:
            self.memory_kills = self.group.memory_kills()
        return self.memory_kills > 0

    def stop_tree(self) -> list[int]:
        """Stop (SIGSTOP) every process of the worker found by walking /proc, and walk again until no new
        one appears: a stopped process neither forks nor exits, so the tree holds still while it is read."""
        stopped: set[int] = set()
        for _ in range(16):
            found = set(self.pids()) - stopped
            if not found:
                break
            for pid in found:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except (ProcessLookupError, PermissionError):
                    pass
            stopped |= found
        return sorted(stopped)

    def kill(self):
        """Kill every process of the worker, reap them, and remove its control group and scratch folder."""
        if self.group is not None and self.group.dirs:
            self.group.kill()
            self.memory_kills = self.group.memory_kills()
            self.memory_peak = self.group.memory_peak()
            self._cpu_at_exit = self.group.cpu_seconds()
        walked = self.group is None or not self.group.can_kill()
        if walked:
            # Without a control group the processes are found through the tree, so the whole tree is stopped
            # before any of it dies: a process killed first hands its children to the grader (their
            # subreaper), out of the tree, and a setsid child of the worker would outlive it.
            tree = self.stop_tree()
            self._cpu_at_exit = self.cpu_seconds()
        if self.uid is not None:
            _kill_uid(self.uid)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if walked:
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for _ in range(3):  # a few rounds more, for anything that started while the tree was walked
                self.signal_all(signal.SIGKILL)
        self.process.wait()
        _reap_orphans()
        if self.group is not None:
            self.group.remove()
        for fd in (self.to_worker, self.from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _kill_uid(uid: int):
    """SIGKILL every process of `uid` (a fresh uid: only this worker's), from a child that becomes it:
    kill(-1) reaches exactly the processes that uid may signal, which are its own."""
    if not is_root():
        return
    pid = os.fork()
    if pid == 0:
        try:
            _become(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _reap_orphans():
    """Reap children of the grader that are zombies and are no Popen's: the worker's orphans, which came
    to the grader as their subreaper."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == os.getpid() and _state(int(entry.name)) == "Z":
                try:
                    os.waitpid(int(entry.name), os.WNOHANG)
                except ChildProcessError:
                    pass


def _ancestry() -> set[int]:
    """This process and its ancestors: never signalled, whatever /proc says."""
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        stat = _stat(pid)
        pid = stat[1] if stat else 0
    return chain


def _first_child(pid: int) -> int:
    """Under namespace isolation the worker's pid is `bwrap`; the process inside is its child."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            kids = handle.read().split()
        return int(kids[0]) if kids else pid
    except (OSError, ValueError):
        return pid


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()[0]


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


def _threads_runtime(pid: int) -> float:
    """Seconds on a CPU of the live threads of `pid`."""
    return sum(ran for ran, _ in thread_schedstats(pid).values()) / 1e9


def _stat(pid: int) -> tuple[int, ...] | None:
    """(pid, ppid, pgid, utime, stime, cutime, cstime) from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return (pid, int(fields[1]), int(fields[2]), int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14]))


def launch(settings: LaunchSettings) -> WorkerProcess:
    sandbox = settings.isolation == "namespace"
    uid = fresh_uid() if is_root() and (sandbox or separate_uid_available()) else None
    make_grader_a_subreaper()
    scratch = None if sandbox else tempfile.mkdtemp(prefix="mha-worker-")
    if scratch and uid is not None:
        os.chown(scratch, uid, uid)
        os.chmod(scratch, 0o700)
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    hide = sorted({*grader_folders(), tempfile.gettempdir(), *settings.hide})
    keep = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})
    workdir = WORKDIR if sandbox else scratch
    config = {
        "filename": settings.filename,
        "device": settings.device,
        "threads": settings.threads,
        "sandbox": sandbox,
        "uid": uid if sandbox else None,  # in the sandbox the worker drops to it itself
        "hide": hide,
        "keep": [k for k in keep if any(_inside(k, h) for h in hide)],  # the interpreter and its packages
        "workdir": workdir,
        "contract": list(settings.contract),
    }
    sources = [
        (SANDBOX_DIR / ("" if name == "protocol" else "inside") / f"{name}.py").read_text() for name in SERVER_MODULES
    ]
    # -u: unbuffered, so what the student's code printed is captured even when the worker is killed
    command = [sys.executable, "-I", "-u", "-c", BOOT, str(req_r), str(resp_w), json.dumps(config), *sources]
    if sandbox:
        command = _bwrap_command(settings.device, settings.scratch_bytes) + ["--", *command]
    # RLIMIT_AS makes a huge allocation a clean MemoryError/RuntimeError; it breaks CUDA, where only the
    # control group's limit holds
    memory = settings.memory_bytes if settings.device == "cpu" else None
    group = None
    if settings.use_cgroups:
        group = WorkerGroup.create(Limits(settings.memory_bytes, settings.processes, settings.cpus))
        if not group.dirs:
            group = None
    grader = os.getpid()

    def in_child():
        if group is not None:
            group.attach_self()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if uid is not None and settings.processes and group is None:
            # counts the fresh uid's processes only; the worker drops to it (here, or in the sandbox)
            resource.setrlimit(resource.RLIMIT_NPROC, (settings.processes, settings.processes))
        if not sandbox and uid is not None:
            # best effort: no network, own IPC (shared memory and queues vanish with the worker)
            _libc.unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
            _become(uid)
        _die_with(grader)

    process = subprocess.Popen(
        command,
        cwd="/" if sandbox else scratch,
        env=_worker_env(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=(req_r, resp_w),
        start_new_session=True,
        preexec_fn=in_child,
    )
    os.close(req_r)
    os.close(resp_w)
    in_force = describe_isolation(settings, sandbox, uid, group, memory)
    return WorkerProcess(process, req_w, resp_r, scratch, settings.isolation, group, uid, in_force)


def describe_isolation(
    settings: LaunchSettings, sandbox: bool, uid: int | None, group: WorkerGroup | None, rlimit_memory: int | None
) -> dict[str, str]:
    """What holds the worker in, in words, for results.json."""
    facts: dict[str, str] = {}
    if sandbox:
        facts["filesystem"] = (
            "an allow list (bubblewrap): the interpreter and its libraries read-only, a private "
            f"{settings.scratch_bytes >> 20} MiB /tmp, a minimal /dev, its own /proc"
        )
        facts["namespaces"] = "pid, network, IPC, UTS and cgroup namespaces of its own; dies with the grader"
        facts["user"] = (
            "a fresh unprivileged uid (the grader is root)"
            if uid is not None
            else "the grader's own unprivileged uid, through a user namespace"
        )
    else:
        facts["filesystem"] = "the grader's, as the worker's user may read it; a private scratch folder"
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
            f"{settings.processes} (RLIMIT_NPROC of the fresh uid)"
            if uid is not None and settings.processes
            else "no limit on the number of processes"
        )
    if "cpu" not in facts:
        facts["cpu"] = "no CPU quota: a busy submission can slow others graded at the same time"
    return facts
