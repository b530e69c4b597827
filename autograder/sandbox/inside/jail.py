"""Untrusted side, before any student code: shut the worker in.

Runs inside the worker process, right after it starts and before torch or the submission is
imported. Standard library only. The walls themselves (the filesystem allow list, the namespaces, the
control group) are built by the grader's launcher, with bubblewrap; what is left to do from inside:

- `drop_privileges`: in the sandbox of a root grader, the worker starts as root without a user
  namespace (one would map it to the real root), holding only the capabilities to change uid; it
  changes to the fresh unprivileged uid it was given, and checks that no capability is left.
- `no_new_privileges`: nothing the worker executes can gain privileges (setuid binaries, file
  capabilities).
- `hide_grader_packages`: `import reference` / `import autograder` fail, also under process isolation,
  where the files may be readable.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_NO_NEW_PRIVS = 38


def drop_privileges(uid: int) -> None:
    if os.getuid() == 0 or os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        raise SystemExit("the worker could not change to its unprivileged uid")
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle if ":" in line)
    if any(int(status[key].strip(), 16) for key in ("CapEff", "CapPrm", "CapAmb") if key in status):
        raise SystemExit("the worker still holds capabilities after changing uid")


def no_new_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit("the worker could not set no_new_privs")


class GraderPackageBlocker:
    BLOCKED = ("reference", "autograder")

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def hide_grader_packages(hidden: list[str], keep: list[str]) -> None:
    def inside(path: str, parents: list[str]) -> bool:
        path = os.path.abspath(path or ".")
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)

    sys.path[:] = [p for p in sys.path if inside(p, keep) or not inside(p, hidden)]
    if not any(isinstance(finder, GraderPackageBlocker) for finder in sys.meta_path):  # a forked worker's is there
        sys.meta_path.insert(0, GraderPackageBlocker())
