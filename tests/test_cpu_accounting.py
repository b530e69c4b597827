"""CPU time that cannot vanish, where no control group counts it (`launcher.WorkerProcess.cpu_seconds`,
`thread_waits`): the submission's CPU budget and the timed workers' charge rest on it.

The worker runs as a fresh uid: in the namespace sandbox here (bubblewrap under root), and, for a helper that
leaves the process tree, as a plain process in the Docker-like emulation of Gradescope's container
(`tools/emulate.py docker`), where a process that leaves the tree is out of reach of anything but its uid.
The end-to-end attacks, graded, are `test_vanishing_cpu.py`'s.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest

import environments
from autograder.sandbox import procfs
from autograder.sandbox.client import Worker
from autograder.sandbox.probe import is_root, namespace_sandbox_available
from autograder.sandbox.protocol import CallRequest
from autograder.sandbox.settings import WorkerConfig
from environments import emulate

pytestmark = [
    pytest.mark.slow,  # starts workers
    pytest.mark.skipif(not (is_root() and namespace_sandbox_available()), reason="needs root and bubblewrap"),
]

SOURCE = """
import os, signal, subprocess, sys, threading, time

signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children: their CPU time reaches no one
children = []


def start_children(count, bank):
    code = f"import time\\nwhile time.process_time() < {bank}: pass\\ntime.sleep(3600)"
    children.extend(subprocess.Popen([sys.executable, "-c", code]) for _ in range(count))
    return [child.pid for child in children]


def kill_children():
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
    children.clear()


def wake_children():
    for child in children:
        os.kill(child.pid, signal.SIGCONT)


def try_fork():
    try:
        pid = os.fork()
    except OSError as error:
        return type(error).__name__
    if pid == 0:
        os._exit(0)
    return "forked"


def try_thread():
    try:
        thread = threading.Thread(target=time.sleep, args=(0,))
        thread.start()
        thread.join()
    except RuntimeError:
        return "refused"
    return "started"


def raise_own_limit():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
    except (ValueError, OSError):
        return "refused"
    return "raised"
"""


@pytest.fixture
def worker():
    made = Worker(
        [(1, 1, textwrap.dedent(SOURCE))],
        "mha.py",
        WorkerConfig(isolation="namespace", use_cgroups=False, load_seconds=120, request_seconds=60),
    )
    made.start()
    yield made
    made.close()


def call(worker: Worker, fn: str, *args):
    return worker.request(CallRequest(fn=fn, args=list(args), kwargs={}))


def wait_for(condition, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def status(pid: int, field: str) -> list[int]:
    """A line of /proc/PID/status, as numbers ([] when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next((list(map(int, line.split()[1:])) for line in handle if line.startswith(field + ":")), [])
    except OSError:
        return []


def outside(worker: Worker, pids: list[int]) -> list[int]:
    """The grader's pids of processes the worker knows by `pids` in its own pid namespace."""
    inside = {pid: status(pid, "NSpid") for pid in worker.process.pids()}
    # the worker's own pid namespace is the deepest: a process of an outer one (a forked worker's fork server's
    # sandbox) may have the same number there
    depth = max(len(chain) for chain in inside.values())
    return sorted(pid for pid, chain in inside.items() if len(chain) == depth > 1 and chain[-1] in pids)


def banked(worker: Worker, count: int, bank: float) -> list[int]:
    """`count` children of the worker that have each used `bank` seconds of CPU and now wait (the grader's
    pids)."""
    pids = outside(worker, call(worker, "start_children", count, bank))
    assert len(pids) == count
    assert wait_for(lambda: all((procfs.read_stat(p) or procfs.read_stat(1)).state == "S" for p in pids))
    return pids


def test_cpu_time_does_not_leave_with_a_process_the_kernel_reaped(worker):
    """Children that banked CPU time and are killed with SIGCHLD ignored (reaped by the kernel, so their time
    reaches no parent) take nothing away: the worker's CPU time never falls. It fell by their whole time."""
    banked(worker, 3, 0.3)
    before = worker.cpu_seconds()
    assert before >= 0.9
    call(worker, "kill_children")
    assert worker.cpu_seconds() >= before


def test_the_waits_deducted_are_those_of_the_thread_that_answers(worker):
    children = banked(worker, 2, 0.05)
    main = worker.process.main
    assert main is not None and main not in children and main != worker.process.pid  # bwrap's child's child
    assert set(worker.thread_waits()) == {main}  # the waits of the thread that answers, no other's


# -- a helper that leaves the process tree, as a plain process of a fresh uid (Gradescope) -----------------

ESCAPES = """
import os, subprocess, sys

HELPER = '''
import os
if os.fork():
    os._exit(0)  # its parent ends: it is handed to the grader (the subreaper), out of the worker's tree
os.setsid()
open("helper.pid.part", "w").write(str(os.getpid()))
os.rename("helper.pid.part", "helper.pid")  # whole when it appears: the reader never sees it empty
while True:
    pass
'''
subprocess.Popen([sys.executable, "-c", HELPER], start_new_session=True).wait()


def helper_pid():
    import time
    while not os.path.exists("helper.pid"):
        time.sleep(0.05)
    return int(open("helper.pid").read())
"""

GRADER = """
import json, sys, time
from autograder.sandbox import procfs
from autograder.sandbox.client import Worker
from autograder.sandbox.protocol import CallRequest
from autograder.sandbox.settings import WorkerConfig

worker = Worker([(1, 1, sys.argv[1])], "mha.py", WorkerConfig(isolation="process", use_cgroups=False, load_seconds=120))
worker.start()
helper = worker.request(CallRequest("helper_pid"))
uids = next(line.split()[1:] for line in open(f"/proc/{helper}/status") if line.startswith("Uid:"))
seen = {"uid": worker.process.uid, "helper_uids": list(map(int, uids)), "found": helper in worker.process.pids()}
seen["outside_the_tree"] = helper not in procfs.descendants(worker.process.pid)
worker.suspend()
seen["stopped"] = procfs.read_stat(helper).state
worker.resume()
start = worker.cpu_seconds()
deadline = time.monotonic() + 60
while worker.cpu_seconds() - start < 0.3 and time.monotonic() < deadline:  # the main process waits idle
    time.sleep(0.1)
seen["charged"] = worker.cpu_seconds() - start
worker.close()
seen["alive_after"] = procfs.alive(helper)
print(json.dumps(seen))
"""


@pytest.mark.long  # the first run makes the readable copy of the project and its virtualenv
def test_a_helper_that_leaves_the_tree_is_found_stopped_and_charged_by_its_uid():
    """Gradescope's setting: a setsid helper whose parent ended is the grader's child, in no session or
    process group of the worker's. It is found by the worker's uid, stopped while another worker is timed,
    and its CPU time is the worker's; it was found only when the worker was killed (by its uid)."""
    project = environments.system_project()
    line = emulate.command_for("docker", [str(project / ".venv" / "bin" / "python"), "-c", GRADER, ESCAPES])
    done = subprocess.run(line, cwd=project, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["uid"] is not None and seen["uid"] in seen["helper_uids"], seen  # a fresh uid
    assert seen["outside_the_tree"], seen
    assert seen["found"] and seen["stopped"] == "T", seen
    assert seen["charged"] >= 0.3, seen
    assert not seen["alive_after"], seen
