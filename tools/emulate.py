"""Run a command as it would run where courses run graders, emulated on this machine (as root).

    python3 tools/emulate.py ENVIRONMENT [--uid 1000] -- COMMAND...

ENVIRONMENT is one of:

- `root`: as it is (a lab machine or VM as root, writable control groups).
- `docker`: root in a Docker-like container (Gradescope): the cgroup filesystem read-only, Docker's
  default capabilities only, and a seccomp filter that refuses new namespaces as Docker's default
  profile does (`unshare`, `clone` with a namespace flag, `setns`, `mount`, `umount2`, `pivot_root`;
  `clone3` answers ENOSYS so that the C library falls back to `clone`).
- `slurm`: a normal user (uid 1000 unless --uid) with user namespaces; the control groups are mounted
  but root's, so none is writable, like a Slurm job or a lab account.
- `kubernetes`: a normal user in a pod under the default seccomp profile (`RuntimeDefault`, which
  refuses new namespaces as Docker's does) with the cgroup filesystem read-only.
- `kubernetes-userns`: root in a pod with a user namespace of its own (`hostUsers: false`): uids 0 to
  65535 inside are 100000 to 165535 outside, with a container's capabilities, the default seccomp
  profile and the cgroup filesystem read-only (the deploy/kubernetes/ manifests' pods).

What a real one adds is said by `REAL` below. How: the command runs in a mount namespace of its own
(`unshare -m`), where, in a container, /sys/fs/cgroup is bind-mounted read-only; the capability bounding set is cut
down (what `capsh --drop=...` does) and the seccomp filter loaded with Debian's `python3-seccomp`; a
normal user is entered with `setresuid` after that (what `setpriv --reuid --regid --clear-groups`
does), with HOME set to a folder of its own. Needs root, util-linux's `unshare`, and `python3-seccomp`
for /usr/bin/python3 (installed here with apt-get when missing, as `ensure_tools` does).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import shutil
import subprocess
import sys
import tempfile

ENVIRONMENTS = ("root", "docker", "slurm", "kubernetes", "kubernetes-userns")
# What a real environment has that the emulation does not.
REAL = {
    "root": "nothing: this is the machine itself",
    "docker": (
        "a container's own root filesystem, pid and network namespaces, Docker's whole seccomp profile "
        "(about 50 more system calls refused: keyctl, bpf, perf_event_open, ...) and AppArmor's docker-default "
        "profile; Gradescope's image is Ubuntu 22.04 or 24.04, not Debian 12"
    ),
    "slurm": (
        "the job's own control group made by slurmd (its CPU and memory limits held by Slurm, not the "
        "grader), a real home directory and the cluster's shared filesystem"
    ),
    "kubernetes-userns": (
        "the pod's own root filesystem and pid namespace, the whole RuntimeDefault seccomp profile, id-mapped "
        "volume mounts, and a container runtime and kernel that support `hostUsers: false` (Kubernetes 1.33 "
        "or later by default, containerd 2 or CRI-O 1.25, Linux 6.3)"
    ),
    "kubernetes": (
        "a container's own root filesystem and pid namespace, the whole RuntimeDefault seccomp profile, "
        "and the pod's control group limits held by the kubelet"
    ),
}
DOCKER_CAPABILITIES = {  # Docker's default set (moby's oci/caps/defaults.go)
    "chown": 0,
    "dac_override": 1,
    "fowner": 3,
    "fsetid": 4,
    "kill": 5,
    "setgid": 6,
    "setuid": 7,
    "setpcap": 8,
    "net_bind_service": 10,
    "net_raw": 13,
    "sys_chroot": 18,
    "mknod": 27,
    "audit_write": 29,
    "setfcap": 31,
}
PR_CAPBSET_DROP = 24
CLONE_NEWUSER = 0x10000000
POD_IDS = (100000, 65536)  # a pod user namespace: 0..65535 inside are 100000..165535 outside
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
SYSTEM_PYTHON = "/usr/bin/python3"


def ensure_tools():
    """Debian's python3-seccomp (and util-linux) for the emulation, installed when missing (root, apt)."""
    have = subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"], capture_output=True).returncode == 0
    if have and shutil.which("unshare"):
        return
    import apt_packages  # tools/apt_packages.py, beside this file

    why = apt_packages.install(["python3-seccomp", "util-linux"])
    if why:
        raise SystemExit(f"emulate: python3-seccomp and util-linux are needed: {why}")


def command_for(environment: str, command: list[str], uid: int = 1000, home: str | None = None) -> list[str]:
    """The command line that runs `command` in `environment` (for subprocess)."""
    if environment not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {environment!r}: one of {', '.join(ENVIRONMENTS)}")
    if environment == "root":
        return list(command)
    inner = [SYSTEM_PYTHON, os.path.abspath(__file__), environment, "--inside", "--uid", str(uid)]
    if home:
        inner += ["--home", home]
    return ["unshare", "--mount", "--propagation", "private", "--", *inner, "--", *command]


def read_only_cgroups():
    """/sys/fs/cgroup read-only in this mount namespace: a read-only bind of it, without what is mounted
    under it (every hierarchy is then an empty folder), as in a container."""
    subprocess.run(["mount", "-o", "bind,ro", "/sys/fs/cgroup", "/sys/fs/cgroup"], check=True)


def drop_capabilities(keep: set[int]):
    libc = ctypes.CDLL(None, use_errno=True)
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if cap not in keep and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"could not drop capability {cap}")


def refuse_namespaces():
    """Load a seccomp filter refusing what Docker's default profile refuses to make namespaces."""
    import seccomp

    refused = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in ("unshare", "setns", "mount", "umount2", "pivot_root"):
        rules.add_rule(refused, name)
    for flag in CLONE_NAMESPACE_FLAGS:
        rules.add_rule(refused, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.load()


def enter_pod_user_namespace():
    """Become root of a new user namespace that maps 0..65535 to POD_IDS outside (as a container runtime
    does for `hostUsers: false`). The maps are written by a helper
    process that stays outside (writing them needs privileges in the parent namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        os.close(done_r)
        os.read(ready_r, 1)
        parent = os.getppid()
        outside, count = POD_IDS
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{parent}/{name}", "w") as handle:
                handle.write(f"0 {outside} {count}\n")
        os.write(done_w, b"1")
        os._exit(0)
    os.close(ready_r)
    os.close(done_w)
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    os.write(ready_w, b"1")
    if os.read(done_r, 1) != b"1":
        raise OSError("the user namespace's maps were not written")
    os.waitpid(helper, 0)
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setgroups([])


def become(uid: int, home: str):
    os.makedirs(home, exist_ok=True)
    os.chown(home, uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.environ.update(HOME=home, USER=f"user{uid}", LOGNAME=f"user{uid}")


def inside(environment: str, uid: int, home: str | None, command: list[str]):
    """In the new mount namespace, as root: shape the environment, then become the command."""
    if environment in ("docker", "kubernetes", "kubernetes-userns"):
        read_only_cgroups()
    if environment == "kubernetes-userns":
        enter_pod_user_namespace()
    if environment in ("docker", "kubernetes-userns"):
        drop_capabilities(set(DOCKER_CAPABILITIES.values()))
    if environment in ("docker", "kubernetes", "kubernetes-userns"):
        refuse_namespaces()
    if environment in ("slurm", "kubernetes"):
        become(uid, home or tempfile.mkdtemp(prefix=f"home-{uid}-"))
    os.execvp(command[0], command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("environment", choices=ENVIRONMENTS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--uid", type=int, default=1000)
    parser.add_argument("--home", default=None, help="the normal user's HOME (default: a new folder)")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    if args.inside:
        inside(args.environment, args.uid, args.home, args.command)
        return 127  # not reached
    if os.geteuid() != 0:
        parser.error("the emulation needs root (it makes a mount namespace and drops to the user itself)")
    ensure_tools()
    return subprocess.run(command_for(args.environment, args.command, args.uid, args.home)).returncode


if __name__ == "__main__":
    sys.exit(main())
