"""The fork server: each worker forked from it is what a fresh worker is, item by item of `AFTER_FORK`; nothing a
child does reaches a later child, a sibling or the fork server; the fork server is replaced by its rule, and
where it cannot serve, workers start fresh and say why.

A worker's portrait (`PORTRAIT`, taken inside it) is compared between a fresh worker and forked ones, under each
isolation this machine offers. Slow: each portrait is a worker's start, and the first fork a fork server's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from autograder.sandbox import forks, launcher, probe
from autograder.sandbox.client import Worker, WorkerCrashed
from autograder.sandbox.protocol import CallRequest, PingRequest, Pong
from autograder.sandbox.settings import WorkerConfig

pytestmark = [pytest.mark.slow, pytest.mark.smoke]  # make test-pythons runs these on every Python


def inside(name: str) -> types.ModuleType:
    """A module of the worker's side, loaded as the worker boots it (the package `sandbox`, from source)."""
    saved = {key: module for key, module in sys.modules.items() if key == "sandbox" or key.startswith("sandbox.")}
    package = types.ModuleType("sandbox")
    package.__path__ = []
    sys.modules["sandbox"] = package
    try:
        for module_name, source in zip(launcher.FORK_SERVER_MODULES, launcher.sources(launcher.FORK_SERVER_MODULES)):
            module = types.ModuleType("sandbox." + module_name)
            module.__package__ = "sandbox"
            sys.modules[module.__name__] = module
            exec(compile(source, f"<sandbox/{module_name}.py>", "exec"), module.__dict__)
            setattr(package, module_name, module)
        return sys.modules["sandbox." + name]
    finally:
        for key in [key for key in sys.modules if key == "sandbox" or key.startswith("sandbox.")]:
            del sys.modules[key]
        sys.modules.update(saved)


FORKSERVER = inside("forkserver")
AFTER_FORK, unsafe_to_fork = FORKSERVER.AFTER_FORK, FORKSERVER.unsafe_to_fork

ISOLATIONS = [
    pytest.param(
        "namespace",
        marks=pytest.mark.skipif(not probe.namespace_sandbox_available(), reason="bubblewrap cannot run here"),
    ),
    # without a fresh uid that can read the interpreter (a root grader's), `process` runs the worker as the
    # grader's own user: no test here lets a submission signal what that user may
    "process",
]

PORTRAIT = textwrap.dedent(
    """
    import ctypes, gc, os, random, resource, signal, sys, torch

    def _portrait():
        libc = ctypes.CDLL(None)
        value = ctypes.c_int(0)
        libc.prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        status = {key: value.strip() for key, value in status.items()}
        fds = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                fds[int(name)] = os.readlink(f"/proc/self/fd/{name}").split(":[")[0]
            except OSError:
                pass
        writable = {}
        for folder in ["/", "/tmp", "/dev", "/dev/shm", "/etc", os.path.dirname(torch.__file__), sys.prefix, "/proc/sys"]:
            try:
                path = os.path.join(folder, ".probe-%d" % os.getpid())
                open(path, "w").close()
                os.unlink(path)
                writable[folder] = True
            except OSError:
                writable[folder] = False
        mounts = {}
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            mounts[fields[4]] = (fields[fields.index("-") + 1], fields[5].split(",")[0])
        def blocked(name):
            try:
                __import__(name)
                return "imported"
            except ImportError as exc:
                return type(exc).__name__
        return {
            "pid": os.getpid(),
            "death signal": value.value,
            "signals": [status["SigBlk"], status["SigIgn"], status["SigCgt"], signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL],
            "cgroup": open("/proc/self/cgroup").read(),
            "fds": sorted(fds.values()),
            "session": [os.getsid(0) == os.getpid(), os.getpgrp() == os.getsid(0), os.getsid(0) if os.getpid() < 10 else None],
            "limits": {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_STACK")},
            "namespaces": {kind: os.readlink("/proc/self/ns/" + kind) for kind in ("pid", "net", "ipc", "uts", "mnt", "cgroup")},
            "hostname": os.uname().nodename,
            "mounts": {target: kind for target, (kind, _) in mounts.items()},
            "writable": writable,
            "tmp": sorted(os.listdir("/tmp")) if writable["/tmp"] else None,
            "shm": sorted(os.listdir("/dev/shm")),
            "uid": [os.getresuid(), os.getresgid(), os.getgroups()],
            "caps": [status["CapEff"], status["CapPrm"], status["CapAmb"], status["CapInh"], status["CapBnd"]],
            "dumpable": libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
            "no_new_privs": status["NoNewPrivs"],
            "environment": dict(os.environ),
            "argv": list(sys.argv),
            "cwd": os.getcwd(),
            "sys_path": list(sys.path),
            "meta_path": [type(finder).__name__ for finder in sys.meta_path],
            "imports": [blocked("autograder"), blocked("reference")],
            "seeds": [torch.initial_seed(), random.random(), torch.rand(1).item()],
            "threads": torch.get_num_threads(),
            "sums": [float(torch.ones(3) @ torch.ones(3)), float(torch.softmax(torch.zeros(2), 0)[0])],
            "frozen": gc.get_freeze_count(),
        }

    def portrait():
        return _portrait()
    """
)


def normal(text: str) -> str:
    """A portrait's text with what names one worker in particular (its group, its scratch folder) made generic."""
    return re.sub(r"mha-worker-[\w-]+", "WORKER", text)


def worker(isolation: str, forks_per_server: int, source: str = PORTRAIT, **settings) -> Worker:
    config = WorkerConfig(isolation=isolation, forks_per_server=forks_per_server, load_seconds=60, **settings)
    return Worker([(1, 1, source)], "mha.py", config)


# The portraits' workers have a /tmp of a size no other test asks for: a fork server of their own (a
# `forks.ServerKey` of their own), which no earlier test's workers brought near its 50 forks, so that both
# siblings are surely forked from one server.
PORTRAITS_SCRATCH = (256 << 20) + 4096


@pytest.fixture(scope="module", params=ISOLATIONS)
def portraits(request):
    """A fresh worker's portrait and two forked siblings', alive at the same time, under one isolation."""
    isolation = request.param
    own = {"scratch_bytes": PORTRAITS_SCRATCH}
    fresh = worker(isolation, 0, **own)
    first, second = worker(isolation, 50, **own), worker(isolation, 50, **own)
    try:
        found = {
            "isolation": isolation,
            "fresh": fresh.request(CallRequest("portrait")),
            "forked": first.request(CallRequest("portrait")),
            "sibling": second.request(CallRequest("portrait")),
            "forked_pids": first.process.pids(),
            "forked_group": first.process.group.pids() if first.process.group is not None else None,
        }
        assert first.process.forked and second.process.forked and not fresh.process.forked
        assert first.process.process.server is second.process.process.server
        yield found
    finally:
        for each in (fresh, first, second):
            each.close()


def same(found: dict, *keys: str) -> None:
    for key in keys:
        assert normal(repr(found["forked"][key])) == normal(repr(found["fresh"][key])), key


def test_the_death_signal(portraits):
    """A forked worker asks the kernel to kill it with its parent (the init of its pid namespace, which ends
    with the fork server's child outside); a fresh one does too, or, inside bubblewrap, dies with the pid
    namespace that bubblewrap's init holds (the kernel kills it whole). Both end with their grader:
    `test_the_fork_server_dies_with_its_grader`, and test_sandbox's `test_the_worker_dies_with_its_grader`."""
    assert portraits["forked"]["death signal"] == signal.SIGKILL
    assert portraits["fresh"]["death signal"] in (0, signal.SIGKILL)


def test_the_signals(portraits):
    same(portraits, "signals")


def test_the_control_group(portraits):
    same(portraits, "cgroup")
    if portraits["forked_group"] is not None:  # every process of the worker is in its own group
        assert set(portraits["forked_pids"]) <= set(portraits["forked_group"])


def test_the_file_descriptors(portraits):
    same(portraits, "fds")


def test_the_session(portraits):
    same(portraits, "session")


def test_the_limits(portraits):
    same(portraits, "limits")
    scratch = PORTRAITS_SCRATCH  # no file larger than the sandbox's whole /tmp: the machine's disk too
    assert tuple(portraits["forked"]["limits"]["RLIMIT_FSIZE"]) == (scratch, scratch)


def test_the_namespaces(portraits):
    forked, sibling, fresh = portraits["forked"], portraits["sibling"], portraits["fresh"]
    same(portraits, "hostname", "shm")
    # writable: no more than a fresh worker (/tmp and /dev/shm its own), nothing of the interpreter or torch
    assert {k for k, v in forked["writable"].items() if v} <= {k for k, v in fresh["writable"].items() if v}
    assert forked["writable"]["/tmp"]
    if portraits["isolation"] == "namespace" or not probe.is_root():
        assert not forked["writable"][sys.prefix]
    if portraits["isolation"] == "namespace":
        same(portraits, "tmp")  # empty: its own (under process isolation, /tmp is the machine's)
        for kind in ("pid", "net", "ipc", "uts", "mnt", "cgroup"):
            assert forked["namespaces"][kind] != sibling["namespaces"][kind], kind
            assert forked["namespaces"][kind] != os.readlink(f"/proc/self/ns/{kind}"), kind
        # the same mount points (stacked ones count once), and its own /dev/shm, and /proc's parts read-only that
        # bubblewrap leaves as they are where its user cannot write them anyway
        protected = {f"/proc/{name}" for name in FORKSERVER.PROTECTED_PROC}
        assert set(fresh["mounts"]) <= set(forked["mounts"]) <= {*fresh["mounts"], "/dev/shm", *protected}
        assert forked["mounts"]["/tmp"] == forked["mounts"]["/dev/shm"] == "tmpfs"
        assert forked["pid"] == fresh["pid"] == 2  # pid 1 is the init of its own pid namespace
    else:
        assert forked["namespaces"] == fresh["namespaces"] or probe.separate_uid_available()


def test_the_uid(portraits):
    forked, sibling, fresh = portraits["forked"], portraits["sibling"], portraits["fresh"]
    same(portraits, "caps")
    uids = {forked["uid"][0][0], sibling["uid"][0][0], fresh["uid"][0][0]}
    if probe.is_root() and (portraits["isolation"] == "namespace" or probe.separate_uid_available()):
        assert len(uids) == 3 and 0 not in uids  # a fresh uid each
    else:
        assert len(uids) == 1


def test_dumpable(portraits):
    same(portraits, "dumpable")


def test_no_new_privs(portraits):
    same(portraits, "no_new_privs")
    assert portraits["forked"]["no_new_privs"] == "1"


def test_the_environment(portraits):
    same(portraits, "environment", "argv")


def test_the_working_folder(portraits):
    same(portraits, "cwd")


def test_the_grader_packages(portraits):
    same(portraits, "sys_path", "meta_path", "imports")
    assert portraits["forked"]["imports"] == ["ModuleNotFoundError", "ModuleNotFoundError"]


def test_the_random_generators(portraits):
    forked, sibling = portraits["forked"], portraits["sibling"]
    assert all(a != b for a, b in zip(forked["seeds"], sibling["seeds"], strict=True))


def test_the_torch_threads(portraits):
    same(portraits, "threads", "sums")


def test_what_the_imports_made_is_out_of_the_collectors_reach(portraits):
    """Fresh or forked, a worker has frozen what its imports made (`server.settle_imports`): a full collection
    during a timed forward walks only what came after, not torch (tens of milliseconds otherwise)."""
    counts = [portraits[key]["frozen"] for key in ("fresh", "forked", "sibling")]
    assert min(counts) > 50_000, counts


TESTED = {
    "death signal": test_the_death_signal,
    "signals": test_the_signals,
    "control group": test_the_control_group,
    "file descriptors": test_the_file_descriptors,
    "session": test_the_session,
    "limits": test_the_limits,
    "namespaces": test_the_namespaces,
    "uid": test_the_uid,
    "dumpable": test_dumpable,
    "no_new_privs": test_no_new_privs,
    "environment": test_the_environment,
    "working folder": test_the_working_folder,
    "grader packages": test_the_grader_packages,
    "random generators": test_the_random_generators,
    "torch threads": test_the_torch_threads,
}


def test_every_item_re_established_after_the_fork_has_a_test():
    assert [name for name, _why, _step in AFTER_FORK] == list(TESTED)


# -- nothing carries over -----------------------------------------------------------------------------------

HOSTILE = textwrap.dedent(
    """
    import ctypes, os, signal, subprocess, sys, threading, time, torch

    done = {}

    def results():
        return done

    def attempt(name, action):
        try:
            result = action()
            done[name] = "allowed" if result is None else result
        except BaseException as exc:
            done[name] = type(exc).__name__

    def attack():
        # monkeypatch torch and the worker's own modules (the fork server's copies live in another process)
        def patch():
            torch.matmul = lambda *a, **k: torch.zeros(1)
            torch.Tensor.__matmul__ = lambda *a, **k: torch.zeros(1)
            torch.softmax = lambda *a, **k: torch.zeros(2)
            forkserver, jail = sys.modules["sandbox.forkserver"], sys.modules["sandbox.jail"]
            forkserver.AFTER_FORK = ()
            for name in ("own_namespaces", "drop_privileges", "close_inherited", "reseed", "become_worker"):
                setattr(forkserver, name, None)
            jail.drop_privileges = jail.no_new_privileges = jail.hide_grader_packages = lambda *a: None
            sys.modules["sandbox.server"].Session.op_ping = lambda self, request: {"patched": True}
        attempt("patch", patch)

        # fill /tmp and /dev/shm
        def fill(folder):
            with open(os.path.join(folder, "filler"), "wb") as handle:
                for _ in range(1024):
                    handle.write(b"x" * (1 << 20))
        attempt("fill_tmp", lambda: fill("/tmp"))
        attempt("fill_shm", lambda: fill("/dev/shm"))

        # write into torch's and the interpreter's folders
        attempt("write_torch", lambda: open(torch.__file__, "a").write("raise SystemExit\\n"))
        attempt("write_torch_folder", lambda: open(os.path.join(os.path.dirname(torch.__file__), "evil.py"), "w").close())
        attempt("write_prefix", lambda: open(os.path.join(sys.prefix, "evil.pth"), "w").close())

        # signal and trace every other process it can see (its init and whatever else), and its parent
        libc = ctypes.CDLL(None, use_errno=True)
        seen = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
        def signal_all():
            for pid in seen:
                for signum in (signal.SIGSTOP, signal.SIGKILL):
                    try:
                        os.kill(pid, signum)
                    except OSError:
                        pass
        attempt("signal", signal_all)
        attempt("ptrace", lambda: [libc.ptrace(16, pid, 0, 0) for pid in seen] and None)  # PTRACE_ATTACH
        attempt("kill_parent", lambda: os.kill(os.getppid(), signal.SIGKILL))

        # leave threads and processes behind (a setsid child that wakes up later and writes into /tmp)
        threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
        attempt("orphan", lambda: subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(2); open('/tmp/late', 'w').write('x'); time.sleep(3600)"],
            start_new_session=True) and None)

        # exhaust the process limit, then the memory limit
        children = []
        def fork_many():
            for _ in range(200):
                pid = os.fork()
                if pid == 0:
                    time.sleep(3600)
                    os._exit(0)
                children.append(pid)
        attempt("fork_bomb", fork_many)
        hoard = []
        def allocate():
            for _ in range(64):
                hoard.append(bytearray(64 << 20))
        attempt("memory", allocate)
        hoard.clear()
        return done

    def corrupt():
        # garbage on every descriptor it holds (its reply pipe among them): its own answers break
        for fd in range(3, 256):
            try:
                os.write(fd, b"\\xff" * 4096)
            except OSError:
                pass
    """
)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_hostile_child_changes_nothing_a_later_child_or_a_sibling_sees(isolation):
    """A child attacks everything it can reach while a sibling is alive; the sibling still answers, and the next
    child of the same fork server is the same as the one before the attack."""
    import torch

    if torch.version.cuda is not None:  # PyPI's build, which `make test-pythons` installs for other Pythons
        pytest.skip("this test's 1 GiB memory limit cannot hold a CUDA build of torch (about 3 GB of libraries)")
    if isolation == "process" and not (probe.is_root() and probe.separate_uid_available()):
        pytest.skip("process isolation runs the worker as the grader's own user here: it could signal the grader")
    before, sibling = worker(isolation, 50), worker(isolation, 50)
    hostile = worker(isolation, 50, source=HOSTILE, memory_bytes=1 << 30, processes=64, request_seconds=120)
    try:
        first = before.request(CallRequest("portrait"))
        sibling.request(PingRequest())
        said = hostile.request(CallRequest("attack"))
        assert said["write_torch"] != "allowed" and said["write_prefix"] != "allowed", said
        assert said["memory"] == "MemoryError", said
        if "no limit" not in hostile.in_force["processes"]:  # none without control groups or a fresh uid
            assert said["fork_bomb"] != "allowed", said
        assert sibling.request(CallRequest("portrait"))["sums"] == first["sums"]  # alive and unpatched
        server = hostile.process.process.server
        with pytest.raises(WorkerCrashed, match="could not be read safely"):
            hostile.request(CallRequest("corrupt"))
        hostile.close()
        after = worker(isolation, 50)
        try:
            second = after.request(CallRequest("portrait"))
            assert isinstance(after.request(PingRequest()), Pong)  # unpatched: a patched one answers a dict
            assert after.process.process.server is server and server.usable()
        finally:
            after.close()
    finally:
        for each in (before, sibling, hostile):
            each.close()
    for key in ("signals", "fds", "session", "limits", "hostname", "mounts", "writable", "caps"):
        assert normal(repr(second[key])) == normal(repr(first[key])), key
    for key in ("dumpable", "no_new_privs", "environment", "argv", "cwd", "sys_path", "meta_path", "imports"):
        assert normal(repr(second[key])) == normal(repr(first[key])), key
    assert second["sums"] == first["sums"] == [3.0, 0.5]
    if isolation == "namespace":  # its own; under process isolation they are the machine's, as for a fresh worker
        assert second["shm"] == first["shm"] == []
        # nothing of the hostile child's: what the sandbox bound under /tmp (a checkout made with mktemp) only
        assert second["tmp"] == first["tmp"] == sorted({p.split("/")[2] for p in forkserver_mounts_under_tmp()})


# -- the replacement rule and the fall-back ------------------------------------------------------------------


def test_a_fork_server_is_replaced_after_its_forks_and_when_it_dies(monkeypatch):
    """After `forks_per_server` forks, the next worker comes from a new fork server, and the old one ends with
    its last child; one that died is replaced too."""
    monkeypatch.setattr(forks, "SERVERS", forks.ForkServers())  # a registry of its own: its limit is 2
    made = [worker("process", 2, "def f():\n    return 1\n") for _ in range(3)]
    try:
        for each in made:
            assert each.request(CallRequest("f")) == 1 and each.process.forked
        servers = [each.process.process.server for each in made]
        assert servers[0] is servers[1] is not servers[2] and servers[0].retired
        old = servers[0].process
        made[0].close()
        made[1].close()
        assert worker("process", 2, "def f():\n    return 1\n").request(CallRequest("f")) == 1  # ends the idle one
        assert old is not None and old.wait(timeout=30) is not None
        servers[2].process.kill()  # the current fork server dies
        servers[2].process.wait()
        replaced = worker("process", 2, "def f():\n    return 1\n")
        made.append(replaced)
        assert replaced.request(CallRequest("f")) == 1
        assert replaced.process.forked and replaced.process.process.server is not servers[2]
    finally:
        for each in made:
            each.close()
        forks.SERVERS.close()


def test_where_the_fork_server_cannot_start_workers_start_fresh_and_say_why(monkeypatch, tmp_path):
    def broken(key, control, log):
        raise OSError("no such interpreter")

    monkeypatch.setattr(launcher, "start_fork_server", broken)
    monkeypatch.setattr(forks, "SERVERS", forks.ForkServers())
    first = worker("process", 50, "def f():\n    return 1\n")
    try:
        assert first.request(CallRequest("f")) == 1
        assert not first.process.forked and "no such interpreter" in (first.fresh_because or "")
    finally:
        first.close()
    second = worker("process", 50, "def f():\n    return 1\n")
    try:
        assert second.request(CallRequest("f")) == 1 and not second.process.forked
        assert "no such interpreter" in (second.fresh_because or "")  # not tried again
    finally:
        second.close()


def test_a_grading_whose_fork_server_cannot_start_grades_with_fresh_workers_and_says_so(monkeypatch):
    """The fall-back, end to end: the same checks pass, and results.json's `extra_data.machine` says why the
    workers started fresh."""
    from autograder.grading.grade import Options, grade_submission
    from helpers import REFERENCE

    def broken(key, control, log):
        raise OSError("no such interpreter")

    monkeypatch.setattr(launcher, "start_fork_server", broken)
    monkeypatch.setattr(forks, "SERVERS", forks.ForkServers())
    run = grade_submission(REFERENCE, Options(device="cpu", out=None, parts=("wrapper",)))
    assert run.graded and run.checks and all(check.status == "passed" for check in run.checks), run.reason
    note = run.machine.get("workers", "")
    assert note.startswith("started fresh") and "could not be started: no such interpreter" in note, note


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_fresh_worker_starts_when_the_grader_has_more_address_space_than_a_worker_may(isolation, monkeypatch):
    """The address-space limit is set last in the child that becomes a fresh worker: until its exec that child
    is a copy of the grader, which (torch, many threads) may already have more address space than a worker may
    have, so that any allocation after the limit can fail ("Exception occurred in preexec_fn", seen once in CI
    under Python 3.13). Here the grader reserves 16 GiB more than a worker may have (the rubric's limit, which a
    worker's torch, a CUDA build too, starts in), never touched, and the child's last step before the limit
    allocates 16 MB (what Python's allocator does when it needs a new arena); with the limit set earlier, the
    worker cannot start."""
    import mmap

    from autograder.sandbox import procfs

    original = procfs.die_with_parent

    def then_allocate(*args, **kwargs):
        original(*args, **kwargs)
        assert len([bytes(4000) for _ in range(4000)]) == 4000

    monkeypatch.setattr(procfs, "die_with_parent", then_allocate)
    limit = WorkerConfig().memory_bytes or 4 << 30
    reserved = mmap.mmap(-1, limit + (16 << 30), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
    try:
        fresh = worker(isolation, 0, "def f():\n    return 1\n", memory_bytes=limit)
        try:
            assert fresh.request(CallRequest("f")) == 1 and not fresh.process.forked
        finally:
            fresh.close()
    finally:
        reserved.close()


def test_a_fork_server_that_misbehaves_is_let_go_and_the_worker_starts_fresh(monkeypatch):
    """A fork server that says it is ready but hands over garbage: the worker starts fresh, saying why."""
    fake = (
        "import json, socket, sys\n"
        "control = socket.socket(fileno=int(sys.argv[1]))\n"
        "control.send(json.dumps({'ready': {}}).encode())\n"
        "while True:\n"
        "    data, fds, _, _ = socket.recv_fds(control, 1 << 16, 8)\n"
        "    if not data:\n"
        "        break\n"
        "    socket.socket(fileno=fds[3]).send(b'garbage')\n"
    )

    def misbehaving(key, control, log):
        return subprocess.Popen(
            [sys.executable, "-c", fake, str(control.fileno())], pass_fds=(control.fileno(),), stdout=log
        )

    monkeypatch.setattr(launcher, "start_fork_server", misbehaving)
    monkeypatch.setattr(forks, "SERVERS", forks.ForkServers())
    w = worker("process", 50, "def f():\n    return 1\n")
    try:
        assert w.request(CallRequest("f")) == 1 and not w.process.forked
        assert "answered something else" in (w.fresh_because or "")
    finally:
        w.close()
        forks.SERVERS.close()


def test_a_forked_worker_let_go_before_it_is_handed_over_ran_nothing(tmp_path):
    """A worker started early and closed unused (a grading that did not adopt it) is let go before it joins its
    group: it ends by itself, having run nothing, and costs nothing of the submission's time (or, where the
    hand-over came first, only the child's own steps: still nothing of the file ran)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    marker = folder / "ran"
    warm = worker("process", 50, "def f():\n    return 1\n")  # the fork server, started and ready
    try:
        assert warm.request(CallRequest("f")) == 1 and warm.process.forked
        server = warm.process.process.server.process
        before = _children(server.pid)
        w = worker("process", 50, f"open({str(marker)!r}, 'w').write('x')\n")
        w.prestart()
        process = w.process
        assert process is not None and process.forked
        w.close()
        if process.process.handed_over():  # the hand-over won the race with close: killed before any load
            assert w.cpu_spent < 0.5, w.cpu_spent  # only the child's own steps after the fork
        else:
            assert w.cpu_spent == 0.0 and process.pids() == []
        deadline = time.monotonic() + 30
        while not _children(server.pid) <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _children(server.pid) <= before  # the child the fork server made for it is gone
        assert not marker.exists()
    finally:
        warm.close()


def _children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_forking_is_refused_with_a_second_thread_or_cuda():
    import threading

    import torch

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert "threads" in (unsafe_to_fork(torch) or "")
    finally:
        stop.set()
        thread.join()


LINK_PROBE = """
import os

def seen(link):
    return [os.path.islink(link), os.readlink(link) if os.path.islink(link) else None, len(os.listdir(link))]
"""


@pytest.mark.skipif(not probe.namespace_sandbox_available(), reason="bubblewrap cannot run here")
def test_a_symbolic_link_the_sandbox_makes_under_tmp_is_there_in_a_forked_worker_as_in_a_fresh_one():
    """The allow list recreates the symbolic links on the way to the interpreter and its packages (a virtualenv
    reached through one); where such a link lies under /tmp, a forked worker's fresh /tmp keeps it, as a fresh
    worker's does: else every import not done before the fork fails there."""
    from dataclasses import replace

    from autograder.sandbox import bwrap
    from autograder.sandbox.protocol import CallRequest

    allowed = bwrap.allow_list()
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    assert any(bwrap.inside(stdlib, b) for b in allowed.binds)
    link = f"/tmp/mha-link-{os.getpid()}/stdlib"
    linked = replace(allowed, links=(*allowed.links, (link, stdlib)))
    found = []
    for forks_per_server in (0, 50):
        made = worker("namespace", forks_per_server, LINK_PROBE)
        made.allowed = linked
        try:
            found.append(made.request(CallRequest("seen", [link])))
            assert made.process.forked == (forks_per_server > 0)
        finally:
            made.close()
    assert found[0] == found[1] and found[0][:2] == [True, stdlib] and found[0][2] > 10, found


def test_the_fork_server_dies_with_its_grader(tmp_path):
    """A grader killed outright takes its fork server and every forked worker with it."""
    script = tmp_path / "grader.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from autograder.sandbox.client import Worker, WorkerCrashed
            from autograder.sandbox.protocol import PingRequest
            from autograder.sandbox.settings import WorkerConfig
            w = Worker([(1, 1, "import os\\ndef pid():\\n    return os.getpid()\\n")], "mha.py",
                       WorkerConfig(isolation=sys.argv[1], forks_per_server=50))
            w.request(PingRequest())
            print(w.process.pid, w.process.process.server.process.pid, flush=True)
            time.sleep(3600)
            """
        )
    )
    isolation = "namespace" if probe.namespace_sandbox_available() else "process"
    grader = subprocess.Popen([sys.executable, str(script), isolation], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in grader.stdout.readline().split()]
        assert len(pids) == 2 and all(Path(f"/proc/{p}").exists() for p in pids)
    finally:
        grader.kill()
        grader.wait()
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- end to end: hostile gradings, then an honest one, through one grading process's fork server -------------

ATTACKS = [
    # torch and the worker's own modules patched
    "import sys, torch\n"
    "torch.matmul = lambda *a, **k: torch.zeros(1)\n"
    "torch.Tensor.__matmul__ = lambda *a, **k: torch.zeros(1)\n"
    "torch.softmax = lambda *a, **k: torch.zeros(2)\n"
    "sys.modules['sandbox.forkserver'].AFTER_FORK = ()\n"
    "sys.modules['sandbox.jail'].drop_privileges = lambda uid: None\n",
    # /tmp and /dev/shm filled
    "for _folder in ('/tmp', '/dev/shm'):\n"
    "    try:\n"
    "        with open(_folder + '/filler', 'wb') as _handle:\n"
    "            for _ in range(300):\n"
    "                _handle.write(b'x' * (1 << 20))\n"
    "    except OSError:\n"
    "        pass\n",
    # torch's and the interpreter's folders written into
    "import os, sys, torch\n"
    "for _path in (torch.__file__, os.path.join(os.path.dirname(torch.__file__), 'evil.py'), sys.prefix + '/x.pth'):\n"
    "    try:\n"
    "        open(_path, 'a').write('raise SystemExit\\n')\n"
    "    except OSError:\n"
    "        pass\n",
    # every process it can see signalled and traced, its parent killed
    "import ctypes, os, signal\n"
    "for _pid in [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]:\n"
    "    for _signum in (signal.SIGSTOP, signal.SIGKILL):\n"
    "        try:\n"
    "            os.kill(_pid, _signum)\n"
    "        except OSError:\n"
    "            pass\n"
    "    ctypes.CDLL(None).ptrace(16, _pid, 0, 0)\n"
    "try:\n"
    "    os.kill(os.getppid(), signal.SIGKILL)\n"
    "except OSError:\n"
    "    pass\n",
    # threads and setsid processes left behind, one writing into /tmp later
    "import subprocess, sys, threading, time\n"
    "threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()\n"
    'subprocess.Popen([sys.executable, \'-c\', \'import time; time.sleep(5); open("/tmp/late", "w").write("x"); '
    "time.sleep(3600)'], start_new_session=True)\n",
    # the process limit, then memory
    "import os, time\n"
    "try:\n"
    "    for _ in range(400):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(3600)\n"
    "            os._exit(0)\n"
    "except OSError:\n"
    "    pass\n"
    "_hoard = []\n"
    "try:\n"
    "    for _ in range(100):\n"
    "        _hoard.append(bytearray(64 << 20))\n"
    "except MemoryError:\n"
    "    pass\n"
    "del _hoard\n",
]
# garbage on every descriptor it holds, its reply pipe among them: its own load breaks
CORRUPTS_THE_CHANNEL = "import os\nfor _fd in range(3, 256):\n    try:\n        os.write(_fd, b'\\xff' * 4096)\n    except OSError:\n        pass\n"


def comparable(results: dict) -> list[tuple]:
    """What must be the same in two gradings of one submission: every check's name, status and points, and its
    message but for the speed part's (its figures are measurements)."""
    return [
        (t["name"], t["status"], t["score"], t["max_score"], None if t["tags"][0] == "speed" else t["output"])
        for t in results["tests"]
    ]


@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not probe.namespace_sandbox_available(), reason="the attacks need the namespace sandbox here")
def test_hostile_gradings_change_nothing_of_an_honest_one_graded_after_them_by_the_same_fork_server(tmp_path):
    """Hostile submissions graded one after another in one grading process (so through one fork server), then
    a correct one: its results are those of a grading with fresh workers (the rubric's forks_per_server = 0)."""
    from helpers import SAMPLES, GradingPool, grade
    from rubric_text import required_sections
    from speed_variants import definitions

    hostile = {
        "attacks": definitions() + "".join(f"# %%\n{cell}\n" for cell in ATTACKS),
        "corrupts": definitions() + f"# %%\n{CORRUPTS_THE_CHANNEL}\n",
    }
    honest = SAMPLES / "ada" / "mha" / "mha.ipynb"
    pool = GradingPool()
    try:
        for name, source in hostile.items():
            path = tmp_path / name / "mha.py"
            path.parent.mkdir()
            path.write_text(source)
            results, outcome = pool.grade(path, path.parent)
            assert outcome.ok and results["extra_data"]["status"] == "graded", outcome.problem
            assert "workers" not in results["extra_data"]["machine"]  # forked, not started fresh
        after, outcome = pool.grade(honest, tmp_path)
        assert outcome.ok and "workers" not in after["extra_data"]["machine"]
    finally:
        pool.close()
    rubric = tmp_path / "fresh-rubric.toml"
    default = (Path(launcher.__file__).parents[1] / "rubric.toml").read_text()
    assert "forks_per_server = 50" in default and required_sections()
    rubric.write_text(default.replace("forks_per_server = 50", "forks_per_server = 0"))
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    fresh, run = grade(honest, fresh_dir, "--rubric", str(rubric))
    assert run.returncode == 0, run.stderr
    assert comparable(after) == comparable(fresh)
    assert after["score"] == fresh["score"] == after["max_score"]


def forkserver_mounts_under_tmp() -> list[str]:
    """What a worker's sandbox binds under /tmp: the interpreter, its packages and the checkout, where they
    live there (a clone made with mktemp), as the fork server's children keep them (`_mounts_under`)."""
    places = {sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parent.parent)}
    return [p for p in places if p.startswith("/tmp/")]
