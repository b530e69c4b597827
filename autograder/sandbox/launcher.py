"""Trusted side: start a worker process in its sandbox, and hold its whole process tree.

`launch` starts `python -I -u -c BOOT` (which loads `protocol`, `jail` and `server` from source) with
a scrubbed environment, in a scratch directory, in new namespaces where the machine allows it
(`namespace` isolation) or as a plain separate process (`process`). The returned `WorkerProcess`
controls every process the submission started, not just the worker's pid: it stops and resumes them
all (while the reference is timed), sums their CPU time, and kills them all.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

SANDBOX_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = SANDBOX_DIR.parent.parent
SERVER_MODULES = ("protocol", "jail", "server")  # loaded, in this order, inside the worker

# Loads the untrusted-side modules from the sources passed on the command line, as the package
# `sandbox`, then hands over to the server. argv: FD_IN FD_OUT CONFIG SOURCE...
BOOT = """
import sys, types
package = types.ModuleType("sandbox")
package.__path__ = []
sys.modules["sandbox"] = package
for name, source in zip(%r, sys.argv[4:]):
    module = types.ModuleType("sandbox." + name)
    module.__package__ = "sandbox"
    sys.modules[module.__name__] = module
    exec(compile(source, "<sandbox/" + name + ".py>", "exec"), module.__dict__)
    setattr(package, name, module)
sys.modules["sandbox.server"].main(sys.argv[1:4])
""" % (SERVER_MODULES,)


@lru_cache(maxsize=None)
def namespace_sandbox_available() -> bool:
    """Whether `unshare` can give the worker its own user, mount, pid and network namespaces."""
    unshare = shutil.which("unshare")
    if not unshare:
        return False
    try:
        probe = subprocess.run(_unshare_prefix(unshare) + ["true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _unshare_prefix(unshare: str) -> list[str]:
    return [unshare, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--mount-proc",
            "--net", "--kill-child"]


def choose_isolation(wanted: str) -> str:
    if wanted == "auto":
        return "namespace" if namespace_sandbox_available() else "process"
    if wanted == "namespace" and not namespace_sandbox_available():
        raise OSError("namespace isolation was asked for, but `unshare` cannot create namespaces here")
    if wanted not in ("namespace", "process"):
        raise ValueError(f"unknown isolation {wanted!r}")
    return wanted


@dataclass
class LaunchSettings:
    isolation: str  # "namespace" or "process", already chosen
    device: str
    threads: int
    memory_bytes: int | None
    hide: list[str] = field(default_factory=list)
    filename: str = "mha.py"
    contract: tuple[str, ...] = ()


class WorkerProcess:
    """One running worker and everything it started."""

    def __init__(self, process: subprocess.Popen, to_worker: int, from_worker: int, scratch: str, isolation: str):
        self.process, self.to_worker, self.from_worker = process, to_worker, from_worker
        self.scratch, self.isolation = scratch, isolation
        self.stopped = False
        self._namespace: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def pids(self) -> list[int]:
        """Every process of this worker: the session it was started in (setsid children leave it, so
        also every descendant of the first process, found through /proc) and, under namespace
        isolation, every process of its pid namespace."""
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
        """Stop every process of the worker (SIGSTOP), e.g. while the reference is being timed."""
        self.signal_all(signal.SIGSTOP)
        self.stopped = True

    def resume(self):
        self.signal_all(signal.SIGCONT)
        self.stopped = False

    def cpu_seconds(self) -> float:
        """User and system CPU time of every live process of the worker (and of its reaped children)."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.pids():
            stat = _stat(pid)
            if stat is not None:
                total += sum(stat[3:7])
        return total / ticks

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.signal_all(signal.SIGKILL)
        self.process.wait()
        for fd in (self.to_worker, self.from_worker):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)


def _ancestry() -> set[int]:
    """This process and its ancestors: never signalled, whatever /proc says."""
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        stat = _stat(pid)
        pid = stat[1] if stat else 0
    return chain


def _first_child(pid: int) -> int:
    """Under namespace isolation the worker's pid is `unshare`; the Python inside is its child."""
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


def _stat(pid: int) -> tuple[int, ...] | None:
    """(pid, ppid, pgid, utime, stime, cutime, cstime) from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return (pid, int(fields[1]), int(fields[2]), int(fields[11]), int(fields[12]), int(fields[13]), int(fields[14]))


def launch(settings: LaunchSettings) -> WorkerProcess:
    scratch = tempfile.mkdtemp(prefix="mha-worker-")
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    sandbox = settings.isolation == "namespace"
    hide = sorted({str(PROJECT_ROOT), "/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir(), *settings.hide})
    keep = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})
    config = {
        "filename": settings.filename,
        "device": settings.device,
        "threads": settings.threads,
        "sandbox": sandbox,
        "hide": [p for p in hide if os.path.isdir(p)],
        "keep": [k for k in keep if any(_inside(k, h) for h in hide)],  # the interpreter and its packages
        "workdir": "/tmp" if sandbox else scratch,
        "contract": list(settings.contract),
    }
    sources = [(SANDBOX_DIR / f"{name}.py").read_text() for name in SERVER_MODULES]
    # -u: unbuffered, so what the student's code printed is captured even when the worker is killed
    command = [sys.executable, "-I", "-u", "-c", BOOT, str(req_r), str(resp_w), json.dumps(config), *sources]
    if sandbox:
        command = _unshare_prefix(shutil.which("unshare")) + ["--"] + command
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": config["workdir"], "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            env[name] = os.environ[name]
    memory = settings.memory_bytes if settings.device == "cpu" else None

    def limits():
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    process = subprocess.Popen(
        command, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, pass_fds=(req_r, resp_w), start_new_session=True, preexec_fn=limits,
    )
    os.close(req_r)
    os.close(resp_w)
    return WorkerProcess(process, req_w, resp_r, scratch, settings.isolation)


def _inside(path: str, parent: str) -> bool:
    path, parent = os.path.abspath(path), os.path.abspath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")
