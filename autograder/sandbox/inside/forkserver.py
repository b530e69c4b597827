"""Untrusted side: the fork server, and what each worker forked from it re-establishes before any student code.

A grading process starts one fork server, by exec, where and as it starts a worker: inside the namespace
sandbox (bubblewrap's allow list and namespaces), or as a separate process in a scratch folder, with a fresh
worker's environment. The launcher boots it as it boots a worker (`protocol`, `jail`, `server` and this module,
from source); it hides the grader's packages, imports torch, and from then on only forks. It runs no torch
operation, initialises no CUDA, has one thread when it forks (checked before every fork), and holds nothing
secret: no reference, rubric, seed, input or student file ever reaches it. A fork request carries what a fresh
worker's command line carries (its settings: file name, device, threads, uid, hidden folders) and the file
descriptors of the worker's channel, output and status.

Each child becomes exactly what a fresh worker is, before any student code runs, by the steps of `AFTER_FORK`,
in order: that list is the one place that says what is re-established after the fork, and why. Under the
namespace sandbox the child makes its own mount, network, IPC, UTS, cgroup and pid namespaces; in its pid
namespace, as in bubblewrap's, a small init is pid 1 and the worker pid 2, while the first process stays
outside to report how it ended (`own_namespaces`). What no step can renew: the address layout and the hash
secret of `str` are the fork server's, shared by its children, which is why the grader replaces the fork
server after a number of forks (the rubric's `forks_per_server`).

Messages (a SOCK_SEQPACKET socket pair; JSON):

- the fork server to the grader, once, on its control socket: `{"ready": {...}}`, or `{"unsafe": why}` and it
  exits;
- the grader to the fork server: `{"op": "fork", "config": {...}}` (a `protocol.ChildSetup`; one with an unknown
  or missing key is refused, and no child is forked) with four file descriptors: the worker's request pipe (read
  end), its reply pipe (write end), its output pipe (write end) and its status socket;
- on the status socket: the child says `forked` (the kernel attaches its process id, as the grader sees it),
  the grader answers `go` once the child is in its control group (anything else: the child exits, having run
  nothing), and the fork server reports `{"exit": code}` when the child has ended, or `{"error": why}` when it
  could not fork.

Standard library only, but for torch.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
import select
import signal
import socket
import struct
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # the same modules, as the grader's package names them; no worker imports this
    from autograder.sandbox import protocol
    from autograder.sandbox.inside import jail, server
else:
    from . import jail, protocol, server

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE = 32, 1024, 2048, 4096, 8192
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 1, 4, 24, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_SETGID_SETUID = (1 << 6) | (1 << 7)  # what bubblewrap keeps for a root grader's worker (`bwrap.command`)
PROTECTED_PROC = ("sys", "sysrq-trigger", "irq", "bus")  # read-only in the child's /proc, as bubblewrap's --proc
MESSAGE_BYTES = 1 << 20


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _prctl(option: int, value: int) -> None:
    _check(_libc().prctl(option, value, 0, 0, 0), f"prctl({option})")


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc().mount(_bytes(source), _bytes(target), _bytes(kind), flags, _bytes(data)), f"mount {target}")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def unsafe_to_fork(torch: types.ModuleType) -> str | None:
    """Why this process must not fork now, or None: a fork copies only the thread that calls it, so a second
    thread (holding a lock the child would wait on forever) makes forking unsafe, and a child must make its
    own CUDA context."""
    if torch.cuda.is_initialized():
        return "CUDA was initialised in the fork server"
    count = threads()
    if count != 1:
        return f"the fork server has {count} threads (a fork is safe from one only)"
    return None


# -- the fork server -------------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    """The fork server: argv is CONTROL_FD CONFIG (JSON)."""
    control = socket.socket(fileno=int(argv[0]))
    setup = protocol.ForkServerSetup.from_json(argv[1])
    del sys.argv[1:]  # the sources of the sandbox modules
    _prctl(PR_SET_DUMPABLE, 0)  # its /proc files are not its user's to read, nor is it theirs to trace
    jail.no_new_privileges()
    jail.hide_grader_packages(list(setup.hide), list(setup.keep))
    os.chdir(setup.workdir)
    import torch

    server.settle_imports()
    server.prepare_capture()
    problem = unsafe_to_fork(torch)
    if problem is not None and threads() > 1:
        # A library's thread pool started at import (numpy's OpenBLAS) is shut down by its own fork handler:
        # one fork that exits at once, running nothing, lets it; then the count is asked again.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        problem = unsafe_to_fork(torch)
    if problem is not None:
        _send(control, {"unsafe": problem})
        os._exit(3)
    _send(control, {"ready": {"pid": os.getpid(), "threads": threads(), "modules": len(sys.modules)}})
    serve_forks(control, torch)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass


def serve_forks(control: socket.socket, torch: types.ModuleType) -> NoReturn:
    """Fork a worker per request; report each child's end on its status socket. Ends with the grader."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 4096):
                        break
                except BlockingIOError:
                    break
            _reap(children)
        if control.fileno() not in ready:
            continue
        try:
            data, fds, _flags, _address = socket.recv_fds(control, MESSAGE_BYTES, 8)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the grader is gone; every child dies with this process
        try:
            request = json.loads(data)
            if not isinstance(request, dict) or request.get("op") != "fork" or len(fds) != 4:
                raise ValueError("not a fork request")
            setup = protocol.ChildSetup.from_dict(request.get("config"))
        except ValueError:
            for fd in fds:
                os.close(fd)
            continue
        status = socket.socket(fileno=fds[3])
        problem = unsafe_to_fork(torch)
        if problem is not None:
            _send(status, {"error": problem})
            _send(control, {"unsafe": problem})
            os._exit(3)
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            become_worker(Child(setup, fds[0], fds[1], fds[2], status, torch, me), control)
        for fd in fds[:3]:
            os.close(fd)
        children[pid] = status


def _reap(children: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock = children.pop(pid, None)
        if sock is not None:
            _send(sock, {"exit": os.waitstatus_to_exitcode(status)})
            sock.close()


# -- the child -------------------------------------------------------------------------------------


@dataclass
class Child:
    """One forked worker, on its way to being a fresh one."""

    setup: protocol.ChildSetup
    fd_in: int  # the grader's requests
    fd_out: int  # the replies
    output: int  # becomes stdout and stderr
    status: socket.socket | None  # until the grader says `go`
    torch: types.ModuleType
    server_pid: int


def become_worker(child: Child, control: socket.socket) -> NoReturn:
    """Run every step of `AFTER_FORK`, then serve the grader as a worker started fresh does. A step that fails
    ends the child before any student code ran: the grader then starts a fresh worker instead."""
    try:
        del control  # closed with every other inherited descriptor ("file descriptors")
        for _name, _why, step in AFTER_FORK:
            step(child)
    except BaseException:
        try:
            os.write(2, f"a forked worker could not become a fresh one: {traceback.format_exc()}".encode())
        finally:
            os._exit(70)
    try:
        server.serve(child.torch, child.setup.worker, child.fd_in, child.fd_out)
    finally:
        os._exit(0)
    raise AssertionError("unreachable")  # pragma: no cover


def die_with_parent(child: Child) -> None:
    """SIGKILL when the fork server ends: no worker outlives it (nor, through it, its grader)."""
    _die_with_parent(child.server_pid)


def _die_with_parent(parent: int | None) -> None:
    """SIGKILL when the parent ends (a change of uid clears the request: it is made again after one); when
    `parent` is given and is no longer the parent, end now."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def fresh_signals(child: Child) -> None:
    """The fork server's SIGCHLD handler and wake-up descriptor, undone: a fresh interpreter's dispositions."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def join_control_group(child: Child) -> None:
    """Wait until the grader has moved this process into the worker's own control group (it learns the
    process's id from the kernel, with the message), so that nothing of the worker runs outside it."""
    status = child.status
    if status is None:
        raise OSError("no status socket")
    try:
        status.send(b"forked")
        answer = status.recv(16)
    except OSError:
        os._exit(0)
    if answer != b"go":
        os._exit(0)  # the grader has let this worker go (closed, or refused): it ran nothing
    status.close()
    child.status = None


def close_inherited(child: Child) -> None:
    """Standard input from /dev/null, standard output and error to the worker's output pipe, and every other
    descriptor closed but the channel's two: nothing of the fork server's (its control socket, other children's
    status sockets) stays open in a worker."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(child.output, 1)
    os.dup2(child.output, 2)
    keep = {0, 1, 2, child.fd_in, child.fd_out}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    child.output = 1


def new_session(child: Child) -> None:
    """A session and process group of its own (as `start_new_session` and bubblewrap's --new-session give)."""
    os.setsid()


def limits(child: Child) -> None:
    """No core files; no file larger than the sandbox's whole /tmp (RLIMIT_FSIZE: under process isolation it
    writes on the machine's disks); the address-space limit on the CPU (RLIMIT_AS: a huge allocation is a clean
    error); the fresh uid's process limit where no control group counts the worker's processes."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (child.setup.scratch_bytes, child.setup.scratch_bytes))
    memory = child.setup.memory_bytes
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    processes = child.setup.nproc
    if processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def own_namespaces(child: Child) -> None:
    """Under the namespace sandbox: mount, network, IPC, UTS, cgroup and pid namespaces of its own, so that no
    sibling shares its loopback, its shared memory or its /proc. In its mount namespace, a fresh /tmp (the
    scratch folder, size-limited), /dev/shm and /dev/pts, and every other mount read-only: no file it writes
    outlives it or reaches a sibling. In its pid namespace a small init is pid 1 (reaping orphans; when the
    worker ends it ends, and the kernel kills whatever is left), the worker pid 2, and the first process waits
    outside and ends as the worker did, for the fork server to report. As a process (no sandbox) under a root
    grader: its own network and IPC namespaces where the kernel allows, as for a fresh worker."""
    setup = child.setup
    if not setup.worker.sandbox:
        if setup.separate_namespaces:
            _libc().unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)  # best effort, as a fresh worker's
        return
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID | CLONE_NEWCGROUP
    _check(_libc().unshare(flags), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for target, kept in _writable_mounts():
        if target != "/proc" and not target.startswith("/proc/"):  # /proc: its own, below
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    size = int(setup.scratch_bytes)
    for folder in ("/dev/shm", "/tmp"):  # empty, as the fork server's were, with the same owner and mode
        # What the sandbox bound under /tmp (the interpreter, its packages, the checkout: a clone made with
        # mktemp) is kept: moved aside into the fresh /dev/shm, then back on top of the fresh /tmp; and so are the
        # symbolic links it made there (a virtualenv reached through one), made again.
        aside = _mounts_under("/tmp") if folder == "/tmp" else []
        links = _links_under("/tmp", aside) if folder == "/tmp" else []
        for index, target in enumerate(aside):
            os.makedirs(f"/dev/shm/.kept/{index}")
            _mount(target, f"/dev/shm/.kept/{index}", None, MS_MOVE)
        found = os.stat(folder)
        owner = f"mode={found.st_mode & 0o7777:o},uid={found.st_uid},gid={found.st_gid}"
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},{owner}")
        for index, target in enumerate(aside):
            os.makedirs(target, mode=0o755, exist_ok=True)
            _mount(f"/dev/shm/.kept/{index}", target, None, MS_MOVE)
            os.rmdir(f"/dev/shm/.kept/{index}")
        if aside:
            os.rmdir("/dev/shm/.kept")
        for link, target in links:
            os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
            os.symlink(target, link)
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    init = os.fork()
    if init:
        _wait_and_end_as(init)
    _die_with_parent(None)  # pid 1 here: its parent, outside, has no pid in this namespace
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if setup.userns:
        # no user namespaces below this one (as bubblewrap's --disable-userns): its limit is set while this
        # process still may, and no worker may raise it again
        with open("/proc/sys/user/max_user_namespaces", "w") as handle:
            handle.write("0")
    for name in PROTECTED_PROC:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    drop_privileges(child)  # the init as well: it holds nothing a worker could use
    os.setsid()  # a new session, led by the init, as bubblewrap's --new-session makes it
    worker = os.fork()
    if worker:
        _init(worker)
    _die_with_parent(1)


def _mounts_under(folder: str) -> list[str]:
    """The outermost mount points below `folder` (a mount inside one of them moves with it)."""
    with open("/proc/self/mountinfo") as handle:
        points = sorted({line.split()[4].replace("\\040", " ") for line in handle})
    below = [p for p in points if p.startswith(folder + "/")]
    return [p for p in below if not any(p.startswith(q + "/") for q in below)]


def _links_under(folder: str, mounts: list[str]) -> list[tuple[str, str]]:
    """(path, target) of every symbolic link below `folder`, but inside the mounts in `mounts`: what the sandbox
    made there (`bwrap.command`'s `--symlink`). No student code has run where this is read."""
    found = []
    for parent, folders, files in os.walk(folder):
        folders[:] = [f for f in folders if os.path.join(parent, f) not in mounts]
        for name in folders + files:
            path = os.path.join(parent, name)
            if os.path.islink(path):
                found.append((path, os.readlink(path)))
    return found


def _writable_mounts() -> list[tuple[str, int]]:
    """(mount point, the flags to keep on a remount) of every mount this process sees read-write."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            target, options = fields[4].replace("\\040", " "), fields[5].split(",")
            if "rw" not in options:
                continue
            flags = 0
            for option, flag in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
                if option in options:
                    flags |= flag
            if "noatime" in options:
                flags |= MS_NOATIME
            elif "relatime" in options:
                flags |= MS_RELATIME
            else:
                flags |= MS_STRICTATIME
            if "nodiratime" in options:
                flags |= MS_NODIRATIME
            found.append((target, flags))
    return found


def _quiet() -> None:
    """A waiting process holds none of the worker's descriptors (so the grader sees the worker's end at once)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 1 << 16)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as bubblewrap reports it


def _wait_and_end_as(pid: int) -> NoReturn:
    """The first process, outside the worker's pid namespace: wait for it, end as it ended."""
    _quiet()
    _, status = os.waitpid(pid, 0)
    os._exit(_exit_code(status))


def _init(worker: int) -> NoReturn:
    """pid 1 of the worker's pid namespace: reap every orphan, end when the worker does (the kernel then kills
    whatever it left behind). Signals from the worker's side are ignored."""
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(signum, signal.SIG_IGN)
            except (OSError, ValueError):
                pass
    _quiet()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == worker:
            os._exit(_exit_code(status))


def drop_privileges(child: Child) -> None:
    """A fresh unprivileged uid under a root grader (`jail.drop_privileges`, which checks that no capability is
    left); in a user namespace, every capability the fork server held to make namespaces, dropped for good."""
    uid = child.setup.uid
    if uid is not None:
        if child.setup.worker.sandbox and os.geteuid() == 0:  # not changed yet (the init's worker inherits it)
            # what bubblewrap leaves a fresh worker of a root grader before it changes uid: the change clears the
            # effective and permitted sets, not the inheritable one, which must not keep the fork server's extras
            _set_capabilities(CAP_SETGID_SETUID)
        jail.drop_privileges(uid)
    elif child.setup.userns:
        _drop_capabilities()


def _set_capabilities(mask: int) -> None:
    """The effective, permitted and inheritable sets, each `mask` (capabilities 0 to 31)."""
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0))  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(struct.pack("6I", mask, mask, mask, 0, 0, 0))
    _check(_libc().capset(header, data), "capset")


def _drop_capabilities() -> None:
    libc = _libc()
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for capability in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _set_capabilities(0)
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle if ":" in line)
    if any(int(status[key].strip(), 16) for key in ("CapEff", "CapPrm", "CapAmb", "CapBnd") if key in status):
        raise OSError("the worker still holds capabilities")


def unprivileged(child: Child) -> None:
    """Its unprivileged uid (or, in a user namespace, no capability): done by the init under the namespace
    sandbox, whose worker inherits it, and checked here again."""
    drop_privileges(child)
    _die_with_parent(1 if child.setup.worker.sandbox else child.server_pid)  # a change of uid cleared it


def dumpable(child: Child) -> None:
    """Dumpable or not as a fresh worker is: not where it changes to its uid itself, after exec (in the namespace
    sandbox of a root grader: the change clears it), dumpable elsewhere (exec makes it so). The fork server is
    not dumpable, and a change of uid without exec would clear it where a fresh worker's is set."""
    setup = child.setup
    _prctl(PR_SET_DUMPABLE, 0 if setup.worker.sandbox and setup.uid is not None else 1)


def no_new_privileges(child: Child) -> None:
    """Nothing it executes can gain privileges (setuid binaries, file capabilities)."""
    jail.no_new_privileges()


def environment(child: Child) -> None:
    """A fresh worker's environment exactly (its home and TMPDIR in its own scratch folder), and its argv."""
    os.environ.clear()
    os.environ.update(child.setup.env)
    sys.argv[:] = ["-c"]


def working_folder(child: Child) -> None:
    os.chdir(child.setup.worker.workdir)


def grader_packages_hidden(child: Child) -> None:
    """`import reference` and `import autograder` fail, and the folders the worker must not see (the
    submission's own, where the results go) leave sys.path, as in a fresh worker."""
    jail.hide_grader_packages(list(child.setup.worker.hide), list(child.setup.worker.keep))


def reseed(child: Child) -> None:
    """Random generators from the operating system's randomness, as in a fresh process: `random` (which its own
    fork handler reseeds too), NumPy's global generator if anything loaded it, and torch's default generator,
    which a fresh torch seeds at random; all children of one fork server would otherwise share its state."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed(int.from_bytes(os.urandom(4), "little"))
    child.torch.manual_seed(int.from_bytes(os.urandom(8), "little"))


def torch_threads(child: Child) -> None:
    """torch's threads, as the worker's settings say (the fork server never set them)."""
    torch = child.torch
    torch.set_num_threads(child.setup.worker.threads or torch.get_num_threads())


# What a child re-establishes after the fork, in order: (name, why, step). Each has a test (tests/test_forkserver.py).
AFTER_FORK: tuple[tuple[str, str, Callable[[Child], None]], ...] = (
    ("death signal", "no worker outlives the fork server", die_with_parent),
    ("signals", "a fresh interpreter's signal dispositions and mask", fresh_signals),
    ("control group", "in the worker's own control group before it does anything else", join_control_group),
    ("file descriptors", "only its channel and output: nothing of the fork server or a sibling", close_inherited),
    ("session", "its own session and process group", new_session),
    ("limits", "no core files, its file size, address-space and process limits", limits),
    ("namespaces", "its own mount (/tmp, /dev/shm), network, IPC, UTS, cgroup and pid namespaces", own_namespaces),
    ("uid", "its fresh unprivileged uid, or no capability in a user namespace", unprivileged),
    ("dumpable", "as a fresh worker is", dumpable),
    ("no_new_privs", "nothing it runs can gain privileges", no_new_privileges),
    ("environment", "a fresh worker's environment and argv", environment),
    ("working folder", "its own scratch folder", working_folder),
    ("grader packages", "the grader's packages and the hidden folders out of reach", grader_packages_hidden),
    ("random generators", "random, NumPy and torch reseeded from the operating system", reseed),
    ("torch threads", "torch.set_num_threads as the settings say", torch_threads),
)
