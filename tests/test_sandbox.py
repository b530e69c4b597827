"""The sandbox, attack by attack, at the level of one worker: what it can see and reach, the limits on
all its processes together, and that none of them outlives the grader's hold on it.

Tests that need bubblewrap or control groups are skipped where the machine has neither; results.json
says which of these held in a grading run (`extra_data.sandbox`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from functools import cache
from pathlib import Path

import pytest

from autograder.sandbox.bwrap import PROJECT_ROOT, allow_list
from autograder.sandbox.cgroups import ResourceLimits, WorkerGroup
from autograder.sandbox.client import BudgetSpent, WorkerCrashed
from autograder.sandbox.probe import is_root, namespace_sandbox_available, separate_uid_available
from autograder.sandbox.protocol import CallRequest, GetRequest


@cache
def cgroups_available() -> bool:
    group = WorkerGroup.create(ResourceLimits(1 << 30, 64, 1.0))
    try:
        return group.can_kill() and {"memory", "processes", "cpu"} <= set(group.limits_set)
    finally:
        group.remove()


needs_sandbox = pytest.mark.skipif(not namespace_sandbox_available(), reason="bubblewrap cannot run here")
needs_cgroups = pytest.mark.skipif(not cgroups_available(), reason="no control groups can be made here")


WORKER_DEFAULTS = dict(load_seconds=60, request_seconds=20)  # make_worker's (tests/conftest.py)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


ATTEMPT = """
import os, socket

def attempt(action):
    try:
        result = action()
        return "allowed" if result is None else result
    except Exception as exc:
        return type(exc).__name__

def read(path):
    with open(path, "rb") as handle:
        return "read %d bytes" % len(handle.read(100))

def write(path):
    with open(path, "w") as handle:
        handle.write("x")

def connect_unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return "connected"
"""


@needs_sandbox
def test_the_worker_sees_only_an_allow_list(make_worker, tmp_path):
    """Root's files, another checkout, a classmate's folder, host sockets and devices: none is there."""
    secret = tmp_path / "secret"
    secret.write_text("grader's secret")
    secret.chmod(0o600)
    classmate = tmp_path / "classmate" / "mha" / "mha.py"
    classmate.parent.mkdir(parents=True)
    classmate.write_text("def solution(): pass\n")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "host.sock"))
    server.listen(1)
    probe = (
        ATTEMPT
        + f"""
results = {{
    "shadow": attempt(lambda: read("/etc/shadow")),
    "secret": attempt(lambda: read({str(secret)!r})),
    "classmate": attempt(lambda: read({str(classmate)!r})),
    "reference": attempt(lambda: read({str(PROJECT_ROOT / "reference" / "mha.py")!r})),
    "root_home": attempt(lambda: os.listdir("/root/.ssh") and None),
    "host_socket": attempt(lambda: connect_unix({str(tmp_path / "host.sock")!r})),
    "kmsg": attempt(lambda: write("/dev/kmsg")),
    "write_etc": attempt(lambda: write("/etc/mha-probe")),
    "network": attempt(lambda: socket.create_connection(("1.1.1.1", 80), timeout=1) and None),
    "init_environ": attempt(lambda: read("/proc/1/environ")),
    "scratch": attempt(lambda: write("/tmp/mine")),
    "import_reference": attempt(lambda: __import__("reference") and None),
    "import_autograder": attempt(lambda: __import__("autograder.rubric") and None),
}}
top = sorted(os.listdir("/"))
etc = sorted(os.listdir("/etc"))
dev = sorted(os.listdir("/dev"))
ids = [os.getresuid(), os.getresgid(), os.getgroups()]
caps = [line.split()[1] for line in open("/proc/self/status") if line.startswith(("CapEff", "CapPrm"))]
"""
    )
    w = make_worker(probe, isolation="namespace")
    results = w.request(GetRequest("results"))
    try:
        blocked = {key: value for key, value in results.items() if key != "scratch"}
        assert all(
            value
            in ("FileNotFoundError", "PermissionError", "OSError", "ConnectionRefusedError", "ModuleNotFoundError")
            for value in blocked.values()
        ), blocked
        assert results["scratch"] == "allowed"
        shown = {Path(p).parts[1] for p in allow_list().binds} | {
            "bin",
            "dev",
            "etc",
            "lib",
            "lib32",
            "lib64",
            "libx32",
            "proc",
            "sbin",
            "tmp",
            "usr",
        }
        assert set(w.request(GetRequest("top"))) <= shown
        assert set(w.request(GetRequest("etc"))) <= {"ld.so.cache"}
        assert set(w.request(GetRequest("dev"))) <= {
            "null",
            "zero",
            "full",
            "random",
            "urandom",
            "tty",
            "ptmx",
            "pts",
            "shm",
            "fd",
            "stdin",
            "stdout",
            "stderr",
            "core",
        }
        (uids, gids, groups) = w.request(GetRequest("ids"))
        assert 0 not in uids and 0 not in gids and groups == []
        if is_root():
            assert os.getuid() not in uids  # a fresh uid, never the grader's root
        assert set(w.request(GetRequest("caps"))) == {"0000000000000000"}
    finally:
        server.close()


@needs_sandbox
def test_shared_memory_and_queues_stay_inside(make_worker):
    """System V shared memory and POSIX message queues live in the worker's IPC namespace: the host never
    sees them, and they end with the worker."""
    key = 0x6D68_6100 + os.getpid() % 256
    source = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget({key}, 1 << 20, 0o1666)
libc.mq_open.restype = ctypes.c_int
queue = libc.mq_open(b"/mha-probe-{key}", os.O_CREAT | os.O_RDWR, 0o666, None)
"""
    w = make_worker(source, isolation="namespace")
    assert w.request(GetRequest("shm")) >= 0 and w.request(GetRequest("queue")) >= 0  # made, inside
    host_keys = [line.split()[0] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert str(key) not in host_keys
    assert not Path(f"/dev/mqueue/mha-probe-{key}").exists()


@pytest.mark.slow  # waits out a limit, a budget or a death
@needs_cgroups
@pytest.mark.parametrize("isolation", ["namespace", "process"])
def test_a_process_limit_holds_and_every_process_is_killed(make_worker, isolation):
    if isolation == "namespace" and not namespace_sandbox_available():
        pytest.skip("bubblewrap cannot run here")
    source = """
import os, time
def fork_many(n):
    made = 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        made += 1
    return made
"""
    w = make_worker(source, isolation=isolation, processes=48)
    made = w.request(CallRequest(fn="fork_many", args=[500], kwargs={}))
    assert 0 < made < 48
    pids = w.process.pids()
    assert len(pids) > made  # every child is listed, with the worker itself
    w.close()
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.slow  # waits out a limit, a budget or a death
@needs_cgroups
def test_memory_is_limited_for_all_processes_together(make_worker):
    """Three children of 768 MiB each stay under a 2 GiB limit for the whole worker: the kernel ends
    some, and says so."""
    source = """
import os, select, time
def children_using(count, mib):
    children = []
    for _ in range(count):
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            block = bytearray(mib << 20)
            block[::4096] = b"\\1" * len(range(0, mib << 20, 4096))
            os.write(done_w, b"1")  # all its memory is in use
            time.sleep(60)
            os._exit(0)
        os.close(done_w)
        children.append((pid, done_r))
    for pid, done_r in children:  # each has either filled its memory or been killed
        select.select([done_r], [], [], 60)
    time.sleep(0.5)
    return sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid, _ in children)
"""
    w = make_worker(
        source,
        memory_bytes=2 << 30,
        request_seconds=120,
        isolation="namespace" if namespace_sandbox_available() else "process",
    )
    try:
        still_running = w.request(CallRequest(fn="children_using", args=[3, 768], kwargs={}))
        assert still_running < 3
    except WorkerCrashed as exc:  # the kernel may pick the worker itself
        assert "memory" in str(exc)
    assert w.process.went_over_memory()
    w.close()
    assert w.memory_peak is not None and w.memory_peak <= (2 << 30) + (64 << 20)


@pytest.mark.slow  # waits out a limit, a budget or a death
@needs_cgroups
def test_a_cpu_quota_holds_for_all_processes_together(make_worker):
    source = """
import os
def burners(n):
    for _ in range(n):
        if os.fork() == 0:
            while True:
                pass
    return n
"""
    w = make_worker(source, cpus=0.5, isolation="namespace" if namespace_sandbox_available() else "process")
    w.request(CallRequest(fn="burners", args=[6], kwargs={}))
    before, started = w.cpu_seconds(), time.monotonic()
    time.sleep(3)
    used, wall = w.cpu_seconds() - before, time.monotonic() - started
    assert used <= 0.5 * wall + 0.3, f"{used:.2f} CPU seconds in {wall:.2f} s with a quota of half a core"


@pytest.mark.slow  # waits out a limit, a budget or a death
def test_the_cpu_budget_of_the_submission_stops_a_burner(make_worker):
    source = """
def burn():
    while True:
        pass
"""
    # starting torch takes 2-3; the submission's budget alone, no request CPU deadline to stop the burner first
    w = make_worker(source, submission_cpu_seconds=8, request_seconds=120, request_floor_seconds=None)
    w.start()
    started = time.monotonic()
    with pytest.raises(BudgetSpent, match="CPU time budget"):
        w.request(CallRequest("burn"))
    assert time.monotonic() - started < 100
    with pytest.raises(BudgetSpent, match="CPU time budget"):
        w.request(CallRequest("burn"))
    assert w.cpu_spent >= 8


GRADER_SCRIPT = """
import json, sys, time
from autograder.sandbox.client import Worker
from autograder.sandbox.settings import WorkerConfig
source = '''
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
threading.Thread(target=time.sleep, args=(300,)).start()  # not a daemon
'''
worker = Worker([(1, 1, source)], "mha.py", WorkerConfig(isolation=sys.argv[1], load_seconds=60))
worker.start()
print(json.dumps({"pids": worker.process.pids(), "worker": worker.process.pid}), flush=True)
time.sleep(300)
"""


@pytest.mark.slow  # waits out a limit, a budget or a death
@pytest.mark.parametrize("isolation", ["namespace", "process"])
def test_the_worker_dies_with_its_grader(tmp_path, isolation):
    """A grader killed with SIGKILL takes its worker along (bwrap's --die-with-parent, PR_SET_PDEATHSIG);
    under namespace isolation that is every process of the submission (its pid namespace ends), and the
    next grader removes what is left of a dead grader's control group."""
    if isolation == "namespace" and not namespace_sandbox_available():
        pytest.skip("bubblewrap cannot run here")
    grader = subprocess.Popen(
        [sys.executable, "-c", GRADER_SCRIPT, isolation], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        started = json.loads(grader.stdout.readline())
    finally:
        grader.kill()
        grader.wait()
    pids = started["pids"]
    assert len(pids) >= 2 and started["worker"] in pids
    worker = pids if isolation == "namespace" else [started["worker"]]  # process isolation: the worker itself
    deadline = time.monotonic() + 10
    while [p for p in worker if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in worker if alive(p)]
    if cgroups_available():
        WorkerGroup.create(ResourceLimits(None, None, None)).remove()  # the next grader sweeps the dead one's group
        deadline = time.monotonic() + 10
        while [p for p in pids if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)]


@pytest.mark.slow  # waits out a limit, a budget or a death
@pytest.mark.parametrize("use_cgroups", [True, False])
def test_orphans_and_setsid_children_are_killed(make_worker, use_cgroups):
    """A double-forked daemon (its parent gone) and a setsid child: both are killed when the worker is.
    Without control groups, the namespace's pid list (or, under process isolation, the process tree
    with the grader as subreaper) finds them."""
    if use_cgroups and not cgroups_available():
        pytest.skip("no control groups can be made here")
    source = """
import os, subprocess, sys, time
setsid_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(300)
    os._exit(0)
time.sleep(0.5)
"""
    isolation = "namespace" if namespace_sandbox_available() else "process"
    w = make_worker(source, isolation=isolation, use_cgroups=use_cgroups)
    w.start()
    pids = w.process.pids()
    assert len(pids) >= 3, pids
    assert os.getpid() not in pids and os.getppid() not in pids
    w.close()
    assert not [pid for pid in pids if alive(pid)]


def test_the_scratch_folder_is_mounted_before_the_binds(monkeypatch):
    """A checkout and its virtualenv under /tmp (a CI runner's clone): the worker's empty /tmp must not
    cover the interpreter's binds, so it is mounted before them."""
    from autograder.sandbox import bwrap

    allowed = bwrap.AllowList(binds=("/tmp/ci/.venv/lib/python3.11/site-packages", "/usr"), links=(), masks=())
    monkeypatch.setattr(bwrap, "allow_list", lambda: allowed)
    command = bwrap.command("/usr/bin/bwrap", "cpu", 1 << 20, as_root=False)
    scratch = command.index(bwrap.WORKDIR, command.index("--tmpfs"))
    assert command[scratch - 1] == "--tmpfs" and scratch < command.index("--ro-bind")
    assert ["--ro-bind", allowed.binds[0], allowed.binds[0]] == command[command.index(allowed.binds[0]) - 1 :][:3]


@pytest.mark.skipif(not separate_uid_available(), reason="no fresh uid here: process isolation runs as the grader")
@pytest.mark.parametrize("forks_per_server", [0, 50], ids=["fresh", "forked"])
def test_what_a_fresh_uid_left_in_the_machines_world_writable_folders_goes_with_its_worker(
    make_worker, forks_per_server
):
    """Under process isolation the machine's world-writable folders are the machine's: what the worker's fresh
    uid left in any of them (/tmp, /var/tmp, /dev/shm, /run/lock, /dev/mqueue, and folders open to all below
    them, one that lets others write but not list among them) is removed when its worker ends, its own folders
    whatever their mode and depth; and nothing of anyone else's, not even what a link it left points at."""
    marker = f"mha-leftover-{uuid.uuid4().hex[:12]}"
    places = [p for p in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue") if os.path.isdir(p)]
    shared, drop = Path("/tmp", f"{marker}-shared"), Path("/tmp", f"{marker}-drop")  # as .X11-unix, as a 1733 spool
    kept = shared / f"{marker}-the-graders"  # the grader's own file in a shared folder, linked to by the worker
    shared.mkdir()
    drop.mkdir()
    shared.chmod(0o1777)
    drop.chmod(0o1733)
    kept.write_text("keep")
    source = f"""
import os
for folder in {[*places, str(shared), str(drop)]!r}:
    with open(os.path.join(folder, "{marker}"), "w") as handle:
        handle.write("left")
os.makedirs("/run/lock/{marker}-tree/closed")
with open("/run/lock/{marker}-tree/closed/note", "w") as handle:
    handle.write("left")
os.chmod("/run/lock/{marker}-tree/closed", 0)
os.chdir("/tmp")
for _ in range(2500):  # deeper than any path may be long
    os.mkdir("{marker}-deep")
    os.chdir("{marker}-deep")
os.symlink("{kept}", "/tmp/{marker}-link")
os.symlink("/tmp", "/tmp/{marker}-folder-link")
"""

    graders = {str(kept), str(shared), str(drop)}

    def left() -> set[str]:
        return {str(p) for folder in [*places, shared, drop] for p in Path(folder).glob(f"{marker}*")} - graders

    try:
        w = make_worker(source, isolation="process", forks_per_server=forks_per_server)
        w.start()
        uid = w.process.uid
        found = left()
        # a file in each place, the shared folder and the drop; the tree, the deep chain and the two links
        assert len(found) == len(places) + 2 + 4 and {os.lstat(p).st_uid for p in found} == {uid}, found
        w.close()
        assert left() == set() and kept.read_text() == "keep"
    finally:
        kept.unlink()
        shared.rmdir()
        subprocess.run(["rm", "-rf", str(drop)], check=True)


@pytest.mark.skipif(not separate_uid_available(), reason="no fresh uid here: process isolation runs as the grader")
@pytest.mark.parametrize("forks_per_server", [0, 50], ids=["fresh", "forked"])
def test_no_file_a_worker_writes_is_larger_than_the_sandboxs_scratch_folder(make_worker, forks_per_server):
    """RLIMIT_FSIZE: a file in /run/lock (on the machine's disk) or in its own scratch folder stops at the
    namespace sandbox's whole /tmp; a file up to that size is written whole."""
    marker = f"mha-big-{uuid.uuid4().hex[:12]}"
    source = """
import os

def write(path, size):
    try:
        with open(path, "wb") as handle:
            handle.write(bytes(size))
        return "written"
    except OSError as exc:
        return exc.strerror
    finally:
        if os.path.exists(path):
            os.unlink(path)
"""
    w = make_worker(source, isolation="process", forks_per_server=forks_per_server, scratch_bytes=1 << 20)
    w.start()
    said = {
        (folder, size): w.request(CallRequest("write", (f"{folder}/{marker}", size)))
        for folder in ("/run/lock", ".")
        for size in (1 << 20, (1 << 20) + 1)
    }
    assert said == {
        ("/run/lock", 1 << 20): "written",
        ("/run/lock", (1 << 20) + 1): "File too large",
        (".", 1 << 20): "written",
        (".", (1 << 20) + 1): "File too large",
    }
