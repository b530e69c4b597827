"""Trusted side: what a worker's fresh uid left on the machine under process isolation, found and removed.

Outside the namespace sandbox a worker sees the machine's file systems, and its fresh uid, which owns nothing
and is in no group, can create entries only in the folders every user may write in (`o+w`, and `o+x` on
them and on every folder above them): /tmp, /var/tmp, /dev/shm, /dev/mqueue, /run/lock (and /var/lock, a
link to it), world-writable folders below those (/tmp/.X11-unix), and whatever else a machine has made so
(/var/crash on Ubuntu, a course's shared folder); and in the folders it made there itself. What it leaves
there a later worker, another student's, could read back. So when a worker ends, everything its uid owns in
those folders is removed (`remove_files_of`):

- `shared_folders` finds the machine's world-writable folders once per process, by a walk of every file
  system but /proc, /sys and those that are not the machine's own (network and automounted ones), pruned at
  every folder other users cannot enter (0.7 s of CPU for 330,000 entries), with the usual places
  (`USUAL_SHARED`) whether the walk reached them or not; it starts with the first worker
  (`find_shared_folders_now`), in a thread, and is done by the time that worker ends;
- at each worker's end, the grader (root) lists those folders, and every world-writable folder below them
  (made meanwhile, by anyone), for the entries the uid owns: a folder that lets others write but not read
  (`1733`) is listed too;
- a child that becomes the uid (`procfs.as_uid`) removes them: what it may remove is only what that uid may,
  so a link it left is removed and never followed and nothing of anyone else's can go; its own folders are
  opened whatever mode it left them in, and emptied without recursion (no depth of folders stops it).

How much a worker may write there is bounded by RLIMIT_FSIZE (`inside/forkserver.limits`, `launcher.launch`):
no file larger than the namespace sandbox's whole /tmp.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterable
from functools import cache

from autograder.sandbox import procfs

# Where any user may write on the machines courses grade on (Debian and Ubuntu containers, lab machines)
USUAL_SHARED = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock", "/var/lock")
NOT_WALKED = ("/proc", "/sys")  # and below them
# file systems that are not this machine's own, or that a walk would mount: never walked
FOREIGN_TYPES = frozenset({"autofs", "nfs", "nfs4", "cifs", "smb3", "smbfs", "afs", "ceph", "lustre", "gpfs"})
OPEN_TO_ALL = stat.S_IWOTH | stat.S_IXOTH  # a folder any user may create entries in


def open_to_all(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_mode & OPEN_TO_ALL == OPEN_TO_ALL


WALKING = threading.Lock()  # one walk of the machine at a time; the others wait for its answer


def shared_folders() -> tuple[str, ...]:
    """Every folder of this machine any user may create entries in, found once per process (`world_writable`
    from /), and the usual places; real paths, each once."""
    with WALKING:
        return _shared_folders()


@cache
def _shared_folders() -> tuple[str, ...]:
    found = [*world_writable("/", skip=not_walked()), *USUAL_SHARED]
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found if os.path.isdir(p)))


def find_shared_folders_now() -> None:
    """Start `shared_folders`' walk in a thread of its own (the launcher, at a worker's start), so that it runs
    while the worker does, not at its end."""
    if _shared_folders.cache_info().currsize == 0 and not WALKING.locked():
        threading.Thread(target=shared_folders, name="shared-folders", daemon=True).start()


def not_walked() -> frozenset[str]:
    """/proc, /sys, and the mount points of file systems that are not the machine's own (`FOREIGN_TYPES`)."""
    skip = set(NOT_WALKED)
    try:
        with open("/proc/self/mountinfo") as handle:
            for line in handle:
                fields = line.split()
                kind = fields[fields.index("-") + 1]
                if kind in FOREIGN_TYPES or kind.startswith("fuse."):
                    skip.add(fields[4].replace("\\040", " "))
    except (OSError, ValueError):
        pass
    return frozenset(skip)


def world_writable(top: str, skip: Iterable[str] = (), only_open: bool = False) -> list[str]:
    """The folders at or below `top` (never through a link) that any user may create entries in, `top` among
    them when it is one. The walk enters only folders other users may enter (`o+x`: nothing below another can
    be reached by them), none of `skip`, and with `only_open`, only folders open to all."""
    skipped = set(skip)
    found, stack = [], [top]
    while stack:
        folder = stack.pop()
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if folder in skipped or not stat.S_ISDIR(info.st_mode) or not info.st_mode & stat.S_IXOTH:
            continue
        if open_to_all(info):
            found.append(folder)
        elif only_open:
            continue
        try:
            with os.scandir(folder) as entries:
                stack += [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
    return found


def entries_of(uid: int, folders: Iterable[str]) -> list[str]:
    """The entries `uid` owns directly in `folders`, or in a folder open to all below one of them (what a
    worker made inside its own folders goes with them), as root sees them."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    for top in folders:
        for folder in world_writable(top, only_open=True):
            try:
                info = os.lstat(folder)
                names = os.listdir(folder)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if os.lstat(path).st_uid == uid:
                        found.append(path)
                except OSError:
                    continue
    return found


def remove_files_of(uid: int, folders: Iterable[str] | None = None) -> None:
    """Remove what `uid` (a fresh uid: one worker's, its processes all ended) left in the machine's world-writable
    folders (`shared_folders`, or `folders`), as that uid (`procfs.as_uid`). Root only."""
    if os.geteuid() != 0:
        return
    paths = entries_of(uid, shared_folders() if folders is None else folders)
    if paths:
        procfs.as_uid(uid, lambda: remove_all(paths, uid))


def remove_all(paths: list[str], uid: int) -> None:
    """`remove_own` each of `paths`: what goes wrong with one stops none of the others."""
    for path in paths:
        try:
            remove_own(path, uid)
        except OSError:
            continue


def remove_own(path: str, uid: int) -> None:
    """Remove `path` as `uid` (the calling process is that uid): a file or link by its name; a folder of `uid`'s
    with everything below it that `uid` may remove, depth first without recursion (entering each of its own
    folders by name, whatever mode it was left in). What cannot go (another uid's folder in one of its
    folders open to all, not empty) stays."""
    parent, name = os.path.split(path)
    try:
        os.chdir(parent)
    except OSError:
        return
    depth = 0
    names = [name]
    given_up: set[tuple[int, int]] = set()  # folders of its own left once: what is in them cannot go
    while True:
        entered = next((n for n in names if _enter_own(n, uid, given_up)), None)
        if entered is not None:
            depth += 1
            names = _listing()
            continue
        if depth == 0:
            return
        here = os.lstat(".")
        given_up.add((here.st_dev, here.st_ino))
        os.chdir("..")
        depth -= 1
        names = [name] if depth == 0 else _listing()


def _enter_own(name: str, uid: int, given_up: set[tuple[int, int]]) -> bool:
    """Remove `name` from the current folder if it can go at once (a file, a link, an empty folder); if it is a
    folder of `uid`'s with something in it and not given up on, enter it and say so."""
    try:
        info = os.lstat(name)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        _quietly(os.unlink, name)
        return False
    if _quietly(os.rmdir, name) or info.st_uid != uid or (info.st_dev, info.st_ino) in given_up:
        return False
    try:
        os.chmod(name, 0o700)  # its own: whatever mode it left, it may open it again
        os.chdir(name)
    except OSError:
        return False
    return True


def _listing() -> list[str]:
    try:
        return os.listdir(".")
    except OSError:
        return []


def _quietly(action: Callable[[str], object], name: str) -> bool:
    try:
        action(name)
        return True
    except OSError:
        return False
