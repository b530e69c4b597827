"""Untrusted side, before any student code: shut the worker in.

Runs inside the worker process, right after it starts and before torch or the submission is
imported. Standard library only.

- `enter_sandbox`: inside the fresh user, mount, pid and network namespaces that `unshare` made,
  mask the grader's folders with empty tmpfs, re-expose the interpreter read-only, make every other
  mount read-only, then enter a nested user+mount namespace so the mounts are locked and the
  student's code cannot undo any of it.
- `hide_grader_packages`: without namespaces (process isolation), at least make
  `import reference` / `import autograder` fail. A speed bump, not a wall; results.json says which
  isolation was in force.
"""
import ctypes
import os
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_REMOUNT, MS_RDONLY = 2, 4, 4096, 16384, 32, 1
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 1, 442


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_sandbox(hide, keep):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    keep_fds = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in keep if os.path.isdir(path)]

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr)), "mount_setattr / read-only")
    for path in hide:
        if os.path.isdir(path):
            _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                              b"size=256m,mode=0777"), f"mask {path}")
    for path, fd in keep_fds:
        os.makedirs(path, exist_ok=True)
        source = f"/proc/self/fd/{fd}".encode()
        _check(libc.mount(source, path.encode(), None, MS_BIND | MS_REC, None), f"keep {path}")
        _check(libc.mount(None, path.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
               f"read-only {path}")
        os.close(fd)
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "lock the mounts")


class GraderPackageBlocker:
    BLOCKED = ("reference", "autograder")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def hide_grader_packages(hidden, keep):
    def inside(path, parents):
        path = os.path.abspath(path or ".")
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)

    sys.path[:] = [p for p in sys.path if inside(p, keep) or not inside(p, hidden)]
    sys.meta_path.insert(0, GraderPackageBlocker())
