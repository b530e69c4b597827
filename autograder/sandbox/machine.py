"""Trusted side: what this machine allows the grader, found by trying, once per process.

`survey()` looks at everything the sandbox and the timing rest on and says why each is or is not
there: who the grader runs as; whether a new user namespace (what bubblewrap needs when the grader is
not root) or the other namespaces (what it needs as root) can be made here, tried for real, and what
refuses them (the sysctls `kernel.unprivileged_userns_clone` and `user.max_user_namespaces`,
AppArmor's `kernel.apparmor_restrict_unprivileged_userns`, a seccomp filter); bubblewrap, its version
and whether it starts the worker's interpreter; a fresh unprivileged uid; control groups (v1 or v2,
which controllers the grader may use: a real group is made and removed); CUDA and its devices. From
those it derives what grading will have here (`isolation`, `guarantees`) and the one change that
would improve it most (`advice`).

The isolation itself is chosen by the launcher's own probe (`probe.choose_isolation`,
`namespace_sandbox_problem`, `separate_uid_available`); this module only reads it, so the doctor, the
refusal message and results.json (`extra_data.machine`, from `summary()`) can never disagree with
what grading does. Standard library only, but for torch's view of CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from autograder.sandbox import bwrap, exposure, probe
from autograder.sandbox.cgroups import ROOT as CGROUP_ROOT
from autograder.sandbox.cgroups import ResourceLimits, WorkerGroup

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
# What bubblewrap makes: as root, the namespaces themselves; otherwise a user namespace first.
ROOT_NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
SYSCTLS = (
    "kernel.unprivileged_userns_clone",  # Debian and older Ubuntu kernels: 0 refuses unprivileged users
    "user.max_user_namespaces",  # 0 refuses everyone
    "kernel.apparmor_restrict_unprivileged_userns",  # Ubuntu 23.10 and later: 1 restricts unprivileged users
)
SECCOMP_MODES = {"0": "none", "1": "strict", "2": "a filter"}
PROBE_LIMITS = ResourceLimits(memory_bytes=1 << 30, processes=64, cpus=1.0)


@dataclass
class Namespaces:
    allowed: bool  # whether bubblewrap's namespaces can be made here, by this user
    tried: str  # what was tried: "a user namespace" or "mount, pid, network, IPC and UTS namespaces"
    error: str  # the error of the attempt, when refused
    sysctls: dict[str, str] = field(default_factory=dict)  # the settings that exist on this kernel
    seccomp: str = "none"  # this process's seccomp mode
    refused_by: str = ""  # what refuses them, in words, when known


@dataclass
class Bubblewrap:
    path: str | None
    version: str
    problem: str | None  # why it cannot start the worker's interpreter here; None when it can
    lacks: str = ""  # what the newer options it lacks cost (`bwrap.Features.costs`), "" when it lacks none
    needs: str = ""  # the release the sandbox needs when this one is too old for it ("0.5.0"), else ""


@dataclass
class Container:
    """Signs that the grader runs in a container, and what of it keeps bubblewrap from starting there."""

    kind: str = ""  # "Docker", "Podman", "Kubernetes": what marks it (`/.dockerenv`, ...); "" when nothing does
    missing_capabilities: list[str] = field(default_factory=list)  # what bubblewrap needs as root, not held
    proc_masked: bool = False  # paths of /proc masked over (a normal user's bubblewrap cannot mount a /proc)
    apparmor: str = ""  # the AppArmor profile confining the grader, "" when none


@dataclass
class ControlGroups:
    mounted: list[str]  # "v2 at /sys/fs/cgroup/unified", "v1: memory, pids, ..."
    writable: bool  # a group for a worker could be made here
    hierarchies: list[str]  # where the probe's group was made: "v2", "memory", ...
    controllers: list[str]  # what the grader may use in it: "memory", "pids", "cpu", "freezer", "kill", ...
    limits: dict[str, str]  # what a worker's group enforces, as results.json says it
    problem: str  # why not, when not writable


@dataclass
class Cuda:
    available: bool
    devices: list[str]
    device_files: list[str]  # /dev/nvidia*
    torch: str  # torch's version and build


@dataclass
class Machine:
    user: str  # "root" or "uid 1000"
    root: bool
    python: str
    namespaces: Namespaces
    bubblewrap: Bubblewrap
    fresh_uid: bool  # a worker can run as a fresh unprivileged uid (root only)
    fresh_uid_problem: str
    cgroups: ControlGroups
    isolation: str | None  # what `auto` chooses here; None: it refuses
    refusal: str  # why `auto` refuses, when it does
    guarantees: dict[str, str]  # limits, control and timing, in words
    advice: str  # the one change that would improve grading here most, with its command ("" if none)
    container: Container = field(default_factory=Container)
    cuda_found: Cuda | None = None  # found when first asked for (`cuda`): finding it imports torch

    @property
    def cuda(self) -> Cuda:
        """CUDA as torch sees it, found on first use: a class run's coordinator, which asks only which isolation
        the machine allows, never imports torch (a second or two)."""
        if self.cuda_found is None:
            self.cuda_found = find_cuda()
        return self.cuda_found

    def summary(self, used: str | None = None) -> dict[str, str]:
        """What results.json carries (`extra_data.machine`): short, one line per fact. `used`: the isolation
        the grading used, when it was asked for (`--isolation`) rather than chosen by `auto`; the isolation and
        guarantees said are then that one's."""
        isolation, guarantees = self.isolation or f"none: {self.refusal}", self.guarantees
        if used and used != self.isolation:
            guarantees = _guarantees(used, self.root, self.fresh_uid, self.cgroups)
            isolation = f"{used} (asked for; `auto` would " + (
                f"choose {self.isolation})" if self.isolation else "refuse here)"
            )
        return {
            "user": self.user,
            "user_namespaces": _namespaces_line(self.namespaces),
            "bubblewrap": _bubblewrap_line(self.bubblewrap),
            "fresh_uid": "yes" if self.fresh_uid else f"no ({self.fresh_uid_problem})",
            "control_groups": _cgroups_line(self.cgroups),
            "cuda": _cuda_line(self.cuda),
            "isolation": isolation,
            **{f"guarantee_{key}": value for key, value in guarantees.items()},
            "advice": self.advice,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the facts -----------------------------------------------------------------------------------


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def _seccomp_mode() -> str:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Seccomp:"):
                return SECCOMP_MODES.get(line.split()[1], line.split()[1])
    except (OSError, IndexError):
        pass
    return "unknown"


UNSHARE = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "sys.exit(0 if libc.unshare(int(sys.argv[1])) == 0 else ctypes.get_errno() or 255)\n"
)


def _try_unshare(flags: int) -> str:
    """Make the namespaces in a throwaway process: "" when it worked, else the error."""
    try:
        run = subprocess.run(
            [sys.executable, "-I", "-S", "-c", UNSHARE, str(flags)], capture_output=True, timeout=20, cwd="/"
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not be tried: {exc}"
    if run.returncode == 0:
        return ""
    return os.strerror(run.returncode) if 0 < run.returncode < 255 else f"exit status {run.returncode}"


def namespaces(root: bool) -> Namespaces:
    flags, tried = (
        (ROOT_NAMESPACES, "mount, pid, network, IPC and UTS namespaces")
        if root
        else (CLONE_NEWUSER, "a user namespace")
    )
    error = _try_unshare(flags)
    found = Namespaces(
        allowed=not error,
        tried=tried,
        error=error,
        sysctls={name: value for name in SYSCTLS if (value := _sysctl(name)) is not None},
        seccomp=_seccomp_mode(),
    )
    if error:
        found.refused_by = _refused_by(found, root)
    return found


def _refused_by(found: Namespaces, root: bool) -> str:
    settings = found.sysctls
    if not root:
        if settings.get("user.max_user_namespaces") == "0":
            return "the sysctl user.max_user_namespaces is 0"
        if settings.get("kernel.unprivileged_userns_clone") == "0":
            return "the sysctl kernel.unprivileged_userns_clone is 0"
        if settings.get("kernel.apparmor_restrict_unprivileged_userns") == "1":
            return "AppArmor (kernel.apparmor_restrict_unprivileged_userns is 1)"
    if found.seccomp == "a filter":
        return "a seccomp filter (a container's: Docker's and Kubernetes' default profiles refuse new namespaces)"
    if root:
        return "the kernel, for this process (a container without CAP_SYS_ADMIN?)"
    return "the kernel, for this user"


def bubblewrap(root: bool) -> Bubblewrap:
    path = probe.bwrap_path()
    if not path:
        return Bubblewrap(None, "", probe.namespace_sandbox_problem())
    found = bwrap.features(path)
    needs = bwrap.NEWER_OPTIONS["--perms"][0] if found.refusal(root) and found.options else ""
    return Bubblewrap(path, found.version or "unknown", probe.namespace_sandbox_problem(), found.costs(root), needs)


CAPABILITIES = {"SYS_ADMIN": 21, "NET_ADMIN": 12}  # what bubblewrap needs as root: mounts, and the loopback
CONTAINER_MARKS = (("/.dockerenv", "Docker"), ("/run/.containerenv", "Podman"))


def container(root: bool) -> Container:
    """What marks a container here, and what of it bubblewrap would miss: as root, the capabilities it needs
    (`CAPABILITIES`); as a normal user, an unmasked /proc (the kernel lets a user namespace mount a /proc only
    where no path of the container's is masked over); and either way AppArmor's profile."""
    kind = next((name for mark, name in CONTAINER_MARKS if os.path.exists(mark)), "")
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        kind = "Kubernetes"
    held = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                held = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    missing = [name for name, bit in CAPABILITIES.items() if root and not held >> bit & 1]
    return Container(kind, missing, _proc_masked(), _apparmor_profile())


def _proc_masked() -> bool:
    """Whether something is mounted over a path of /proc (a container's masked paths), other than the empty
    folder of binfmt_misc, which the kernel allows."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    return any(p.startswith("/proc/") and not p.startswith("/proc/sys/fs/binfmt_misc") for p in points)


def _apparmor_profile() -> str:
    for path in ("/proc/self/attr/apparmor/current", "/proc/self/attr/current"):
        try:
            profile = Path(path).read_text().strip("\0\n ")
        except OSError:
            continue
        return "" if profile in ("", "unconfined") else profile
    return ""


def _mounted_cgroups() -> list[str]:
    found = []
    for candidate in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (candidate / "cgroup.controllers").exists():
            found.append(f"v2 at {candidate}")
    v1 = sorted(
        entry.name for entry in _scandir(CGROUP_ROOT) if entry.name != "unified" and Path(entry.path, "tasks").exists()
    )
    if v1:
        found.append("v1: " + ", ".join(v1))
    return found


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(path))
    except OSError:
        return []


def control_groups() -> ControlGroups:
    """Make a worker's group as grading would (`WorkerGroup.create`), read what it got, remove it."""
    mounted = _mounted_cgroups()
    group = WorkerGroup.create(PROBE_LIMITS)
    try:
        hierarchies = sorted(group.dirs)
        controllers = sorted(
            {*group.v2_controllers, *(name for name in group.dirs if name != "v2")}
            | ({"freezer", "kill", "cpu accounting"} if "v2" in group.dirs else set())
        )
        limits = dict(group.limits_set)
    finally:
        group.remove()
    if not mounted:
        problem = f"no control group filesystem is mounted at {CGROUP_ROOT}"
    elif not hierarchies:
        problem = (
            f"{CGROUP_ROOT} is not writable by this user (read-only in a container, or not delegated to a normal user)"
        )
    else:
        problem = ""
    return ControlGroups(mounted, bool(hierarchies), hierarchies, controllers, limits, problem)


def find_cuda() -> Cuda:
    import torch

    devices = []
    available = torch.cuda.is_available()
    if available:
        devices = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    files = sorted(str(p) for p in Path("/dev").glob("nvidia*"))
    return Cuda(available, devices, files, torch.__version__)


def _fresh_uid_problem(root: bool) -> str:
    if not root:
        return "the grader is not root"
    return "a fresh unprivileged uid cannot read the interpreter, its standard library or torch (a 0700 home?)"


# -- what follows from them ----------------------------------------------------------------------


def _guarantees(isolation: str | None, root: bool, fresh: bool, groups: ControlGroups) -> dict[str, str]:
    if isolation is None:
        return {"isolation": "none: grading refuses unless --isolation process is given"}

    def held(kind: str) -> str | None:  # "(cgroup v1)" when a worker's group limits `kind` here
        said = groups.limits.get(kind)
        return said[said.rfind("(") :] if said else None

    found = {
        "isolation": (
            "bubblewrap's allow list: the worker sees the interpreter and its libraries, nothing of the grader"
            if isolation == "namespace"
            else "a separate process as a fresh unprivileged uid: it reads what any user may"
            if fresh
            else "a separate process as the grader's own user (chosen explicitly): it can read what the grader can"
        ),
        "memory": f"the rubric's memory_gib for all the worker's processes together {held('memory')}"
        if held("memory")
        else "the rubric's memory_gib per process only (RLIMIT_AS): its processes together may use more",
        "processes": f"the rubric's processes, all the worker's together {held('processes')}"
        if held("processes")
        else "the rubric's processes (RLIMIT_NPROC of the fresh uid)"
        if root and (fresh or isolation == "namespace")
        else "no limit on the number of processes",
        "cpu": f"the rubric's cpu_cores as a quota for all the worker's processes {held('cpu')}"
        if held("cpu")
        else "no CPU quota: a busy submission can slow others graded at the same time",
    }
    if groups.writable:
        found["control"] = "one control group per worker: frozen, CPU-timed and killed together"
    else:
        found["control"] = (
            "no control group: the worker's processes are found, stopped and killed through /proc "
            "(SIGSTOP while the reference is timed; CPU time of processes that already ended is not counted)"
        )
    found["timing"] = (
        "CPU time read from the worker's control group"
        if groups.writable
        else "CPU time summed over the worker's processes through /proc: slower to read, which the speed "
        "self-test (`python -m autograder doctor`) checks"
    )
    return found


def _advice(machine: Machine) -> str:
    """The one change that would improve grading here most, with the command to make it: what it takes to
    get the namespace sandbox (every step of it, so that following the advice is enough), else to get
    control groups, else nothing."""
    groups = machine.cgroups
    if machine.isolation == "namespace" and groups.writable:
        return ""
    if machine.isolation != "namespace":
        steps = _sandbox_steps(machine)
        if steps and machine.isolation is None:
            steps.append(
                "or " + _fresh_uid_step(machine) + ", or accept the grader's own user with `--isolation process`"
            )
        if steps:
            return "; ".join(steps)
        if machine.isolation is None:
            return _fresh_uid_step(machine) + ", or pass `--isolation process` to grade as your own user"
    if not groups.writable and not _in_container(machine):
        if machine.root:
            return f"make {CGROUP_ROOT} writable for the grader, so limits hold for a submission's processes together"
        return (
            "grade in a control group delegated to you, so limits hold for a submission's processes together "
            "(on a systemd machine: `systemd-run --user --scope -p Delegate=yes make grade`)"
        )
    return ""


def _fresh_uid_step(machine: Machine) -> str:
    """What gives each worker a fresh uid here: root, for a normal user; for root, whose fresh uid cannot read the
    interpreter, the command that opens it to other users (never "run as root" to root)."""
    if not machine.root:
        return (
            "run the grader as root, which gives each worker a fresh uid (Kubernetes: root of the pod's own user "
            "namespace, `hostUsers: false`, deploy/kubernetes/)"
        )
    command = exposure.opening(exposure.interpreter_paths())
    where = f"`{command}`" if command else "make the interpreter's folders readable by other users"
    return f"let each worker's fresh uid read and run the interpreter, its standard library and torch: {where}"


def _in_container(machine: Machine) -> bool:
    return bool(machine.container.kind) or machine.namespaces.seccomp == "a filter"


def _sandbox_steps(machine: Machine) -> list[str]:
    """What it takes to get the namespace sandbox here, step by step; [] when nothing known would."""
    ns, bwrap_found = machine.namespaces, machine.bubblewrap
    steps = []
    if not bwrap_found.path:
        steps.append(
            "install bubblewrap, the namespace sandbox: `apt-get install -y bubblewrap` as root (Debian, Ubuntu"
            + ("; in a container, in its image)" if _in_container(machine) else ")")
        )
    elif bwrap_found.needs:
        steps.append(f"install bubblewrap {bwrap_found.needs} or later: {bwrap_found.problem}")
    if _in_container(machine):
        flags = _container_flags(machine)
        if flags:
            steps.append(
                "run the container with what bubblewrap needs: `docker run "
                + " ".join(docker for docker, _ in flags)
                + "` (Kubernetes: in the container's securityContext, "
                + ", ".join(dict.fromkeys(pod for _, pod in flags))
                + "; docs/clusters.md)"
            )
        return steps
    if not ns.allowed and not machine.root:
        settings = ns.sysctls
        if settings.get("kernel.apparmor_restrict_unprivileged_userns") == "1":
            steps.append(
                "allow unprivileged user namespaces (Ubuntu 24.04's AppArmor restricts them): "
                "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or give bwrap an AppArmor "
                "profile that allows `userns` (docs/clusters.md)"
            )
        elif settings.get("kernel.unprivileged_userns_clone") == "0":
            steps.append("allow unprivileged user namespaces: `sudo sysctl -w kernel.unprivileged_userns_clone=1`")
        elif settings.get("user.max_user_namespaces") == "0":
            steps.append("allow user namespaces: `sudo sysctl -w user.max_user_namespaces=15000`")
    elif bwrap_found.path and bwrap_found.problem and not bwrap_found.needs and not steps:
        steps.append(f"find out why bubblewrap fails here ({bwrap_found.problem})")
    return steps


def _container_flags(machine: Machine) -> list[tuple[str, str]]:
    """What the container must allow for bubblewrap, as (`docker run` option, pod securityContext field)."""
    ns, found = machine.namespaces, machine.container
    flags = []
    if not ns.allowed and ns.seccomp == "a filter":
        flags.append(("--security-opt seccomp=unconfined", "`seccompProfile: {type: Unconfined}`"))
    capabilities = ", ".join(found.missing_capabilities)
    for name in found.missing_capabilities:
        flags.append((f"--cap-add {name}", f"`capabilities: {{add: [{capabilities}]}}`"))
    if not machine.root and found.proc_masked:
        flags.append(("--security-opt systempaths=unconfined", "`procMount: Unmasked`"))
    if found.apparmor:
        flags.append(("--security-opt apparmor=unconfined", "`appArmorProfile: {type: Unconfined}`"))
    return flags


@cache
def survey() -> Machine:
    """Everything above, found once per process."""
    root = probe.is_root()
    try:
        isolation, refusal = probe.choose_isolation("auto"), ""
    except (OSError, ValueError) as exc:
        isolation, refusal = None, str(exc)
    fresh = probe.separate_uid_available()
    groups = control_groups()
    machine = Machine(
        user="root" if root else f"uid {os.geteuid()}",
        root=root,
        python=f"{sys.executable} ({sys.version.split()[0]})",
        namespaces=namespaces(root),
        bubblewrap=bubblewrap(root),
        fresh_uid=fresh,
        fresh_uid_problem="" if fresh else _fresh_uid_problem(root),
        cgroups=groups,
        isolation=isolation,
        refusal=refusal,
        guarantees=_guarantees(isolation, root, fresh, groups),
        advice="",
        container=container(root),
    )
    machine.advice = _advice(machine)
    return machine


# -- in words ------------------------------------------------------------------------------------


def _namespaces_line(ns: Namespaces) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in ns.sysctls.items())
    head = f"yes ({ns.tried} made)" if ns.allowed else f"no: {ns.tried} refused ({ns.error}) by {ns.refused_by}"
    return f"{head}; seccomp: {ns.seccomp}" + (f"; {settings}" if settings else "")


def _bubblewrap_line(found: Bubblewrap) -> str:
    if not found.path:
        return "not installed"
    said = f"{found.version} at {found.path}: " + ("starts the worker" if found.problem is None else found.problem)
    return said + (f" ({found.lacks})" if found.lacks and found.problem is None else "")


def _cgroups_line(groups: ControlGroups) -> str:
    mounted = "; ".join(groups.mounted) or "none mounted"
    if groups.writable:
        return f"writable ({mounted}); the grader may use: {', '.join(groups.controllers)}"
    return f"not writable ({mounted}): {groups.problem}"


def _cuda_line(found: Cuda) -> str:
    if found.available:
        return f"{len(found.devices)} device(s): {', '.join(found.devices)} (torch {found.torch})"
    return f"none (torch {found.torch}" + (f"; {', '.join(found.device_files)} present)" if found.device_files else ")")
