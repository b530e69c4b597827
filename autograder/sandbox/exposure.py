"""Trusted side: whether a worker's fresh uid could read the grader's own files, under process isolation.

In the namespace sandbox a worker sees only its allow list, with the grader's checkout (or, installed, its
packages) masked (`bwrap`). Under process isolation it sees the machine's filesystem as its user may: as
a fresh uid when the grader is root (Gradescope's and Docker's setting), which owns no file and is in no
group. A checkout readable by every user (the usual 0755 folders and 0644 files) then hands it the
reference's solution (`reference/mha.py`, the nbgrader source, the sample class), the rubric and the
hidden checks; a reading of the reference once put the solution into a visible check's message.

For such a uid the kernel decides by the "other" permission bits alone: it is not the owner, the group
is not its own group, it has no supplementary groups and no ACL names it (ACL entries for named users and
groups, and the mask, never apply to it), and it has no capabilities. So a file is readable to it exactly
when the file has `o+r` and every folder above it `o+x`, which `readable_by_others` checks without becoming
that uid. Security modules (AppArmor, SELinux) only ever refuse more.

Before a grading starts a worker there, `close_own` closes those files itself (`chmod o-rwx` on the fewest
paths: never the interpreter's own folders, which the worker runs, nor the folders on the way to them) when
the grader owns every one of them on a writable file system, and says which it closed, as a class run closes
its course folder. Where it cannot (another user's checkout, a read-only one), `refusal` says which files
such a worker could read and the command that closes them, and grading refuses to start until then.
Deployments close them when they are built: `deploy/gradescope/setup.sh` (`chmod -R go-rwx` on the source)
and `deploy/kubernetes/Dockerfile` (all but the virtualenv).

The other way round, a fresh uid must read and run the interpreter: `opening` gives the command that lets it
(`chmod o+x` on the closed folders on the way, `chmod -R o+rX` where its files are closed), for the advice of
a root grader that has no fresh uid for that reason.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import stat
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from autograder.sandbox import bwrap, probe


def _others_may(info: os.stat_result, bit: int) -> bool:
    return bool(info.st_mode & bit)


def reachable_by_others(folder: str) -> bool:
    """Whether every folder from / down to `folder` (its real path) lets other users through (`o+x`)."""
    real = Path(os.path.realpath(folder))
    try:
        return all(_others_may(os.stat(p), stat.S_IXOTH) for p in [*reversed(real.parents), real])
    except OSError:
        return False


def first_readable(path: str) -> str | None:
    """The first file at or below `path` (never through a link) whose bits let other users read it, given
    that they can reach `path`'s folder; None when there is none."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISREG(info.st_mode):
        return path if _others_may(info, stat.S_IROTH) else None
    if not stat.S_ISDIR(info.st_mode) or not _others_may(info, stat.S_IXOTH):
        return None  # a link (its target is checked where it lies), or a folder they cannot enter
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    for name in names:
        found = first_readable(os.path.join(path, name))
        if found is not None:
            return found
    return None


def to_close(roots: Iterable[str], keep: tuple[str, ...]) -> dict[str, str]:
    """The fewest paths whose `chmod o-rwx` leaves no file under `roots` readable by other users, each with
    a file it would close. A folder of `keep` (the interpreter's: the worker must run it) inside a root is
    left open, and so is each folder holding one, whose other entries are closed instead; a root inside a
    folder of `keep` (the grader's packages installed in the interpreter's site-packages) is checked."""
    closing: dict[str, str] = {}

    def visit(path: str) -> None:
        if not any(bwrap.inside(folder, path) and folder != path for folder in keep):
            found = first_readable(path)
            if found is not None:
                closing[path] = found
            return
        try:
            if not _others_may(os.lstat(path), stat.S_IXOTH):
                return  # closed already: nothing below it can be reached
            names = sorted(os.listdir(path))
        except OSError:
            return
        for name in names:
            child = os.path.join(path, name)
            if not os.path.islink(child) and not any(bwrap.inside(child, folder) for folder in keep):
                visit(child)

    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        if os.path.exists(root) and reachable_by_others(os.path.dirname(root) or "/"):
            visit(root)
    return {p: f for p, f in closing.items() if not any(q != p and bwrap.inside(p, q) for q in closing)}


def grader_secrets(rubric: Path) -> list[str]:
    """What a worker must never read: the checkout (or, installed, the grader's packages, the reference
    among them) and the rubric in use."""
    return [*bwrap.grader_folders(), str(rubric)]


def reference_folder() -> str | None:
    """The real path of the reference's package, as the grader imports it; None when there is none."""
    try:
        spec = importlib.util.find_spec("reference")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def interpreter_folders() -> tuple[str, ...]:
    """What the worker runs, and so must read: the interpreter's prefixes (a virtualenv inside a checkout), and
    the checkout's own virtualenv (`make setup`'s `.venv`) where there is one, whichever interpreter grades."""
    prefixes = [sys.prefix, sys.exec_prefix, sys.base_prefix]
    if bwrap.PROJECT_ROOT is not None and (bwrap.PROJECT_ROOT / ".venv" / "pyvenv.cfg").is_file():
        prefixes.append(str(bwrap.PROJECT_ROOT / ".venv"))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in prefixes))


def why_not_closable(path: str) -> str:
    """Why the grader does not close `path` to other users itself; "" when it does: it owns it, on a file
    system it may write (root could change another user's files, but they are that user's to change)."""
    try:
        info = os.lstat(path)
        if info.st_uid != os.geteuid():
            return f"owned by uid {info.st_uid}, not the grader's"
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


class CannotClose(OSError):
    """A `chmod` of the grader's own files failed: grading must not start (the message says which and why)."""


def close(paths: Iterable[str]) -> None:
    """`chmod o-rwx` on each of `paths` (never through a link), the owner's and the group's bits kept."""
    for path in paths:
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~0o007, follow_symlinks=False)


def close_own(isolation: str, rubric: Path) -> list[str]:
    """Where a worker asked for with `isolation` would run as a fresh uid outside the namespace sandbox, close
    the grader's own files it could read, when the grader may close every one of them (`why_not_closable`);
    the paths closed, [] when none were (nothing to close, or `problem` refuses instead)."""
    if not fresh_uid_outside_sandbox(isolation):
        return []
    closing = to_close(grader_secrets(rubric), interpreter_folders())
    if not closing or any(why_not_closable(path) for path in closing):
        return []
    try:
        close(closing)
    except OSError as exc:
        raise CannotClose(f"could not close the grader's own files to other users ({exc})") from None
    return list(closing)


def refusal(rubric: Path) -> str:
    """Why a worker running as a fresh uid outside the namespace sandbox must not start here, with the
    command that fixes it; "" when it could read none of the grader's files, or when the grader closes them
    itself (`close_own`)."""
    closing = to_close(grader_secrets(rubric), interpreter_folders())
    blocked = {path: why for path in closing if (why := why_not_closable(path))}
    if not blocked:
        return ""
    named = {"the reference's solution": reference_folder(), "the rubric": os.path.realpath(rubric)}
    what = [
        f"{name} ({path})"
        for name, path in named.items()
        if path and reachable_by_others(os.path.dirname(path)) and first_readable(path) is not None
    ] or [f"such as {next(iter(closing.values()))}"]
    path, why = next(iter(blocked.items()))
    return (
        "each worker runs as a fresh unprivileged uid outside the namespace sandbox here, and that uid could "
        f"read the grader's own files: {', '.join(what)}. The grader closes them itself only when it owns them "
        f"on a writable file system, and {path} is {why}. {how_to_close(list(closing), blocked)}"
    )


def how_to_close(closing: list[str], blocked: dict[str, str]) -> str:
    """The command that closes `closing`, as it can be run: here, or, on a read-only file system, where the
    checkout is writable (paths relative to its top folder, which is the same there)."""
    top = str(bwrap.PROJECT_ROOT) if bwrap.PROJECT_ROOT is not None else None
    read_only = any(why.startswith("on a read-only") for why in blocked.values())
    if read_only and top and all(bwrap.inside(path, top) for path in closing):
        relative = " ".join(shlex.quote(os.path.relpath(path, top)) for path in closing)
        return (
            "Close them to other users where the checkout is writable (the machine it is mounted from), in its top "
            f"folder: chmod o-rwx {relative}"
        )
    return f"Close them to other users first: chmod o-rwx {' '.join(shlex.quote(p) for p in closing)}"


def fresh_uid_outside_sandbox(isolation: str) -> bool:
    """Whether a worker asked for with `isolation` (auto, namespace or process) would run as a fresh uid
    outside the namespace sandbox (the launcher's rule)."""
    try:
        chosen = probe.choose_isolation(isolation)
    except (OSError, ValueError):
        return False
    return chosen == "process" and probe.is_root() and probe.separate_uid_available()


def problem(isolation: str, rubric: Path) -> str:
    """`refusal(rubric)` where a worker asked for with `isolation` would run as a fresh uid outside the
    namespace sandbox; else "". Where no isolation can be chosen at all, the worker's own start says why."""
    return refusal(rubric) if fresh_uid_outside_sandbox(isolation) else ""


# -- the interpreter, which a fresh uid must read ------------------------------------------------------------


def interpreter_paths() -> list[str]:
    """What a worker's interpreter reads: the executable, its standard library and extension modules, its
    packages and torch (the paths `probe.separate_uid_available` tries as a fresh uid)."""
    import importlib.util

    paths = sysconfig.get_paths()
    found = [sys.executable, paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"]]
    spec = importlib.util.find_spec("torch")
    found += list(spec.submodule_search_locations or []) if spec else []
    return list(dict.fromkeys(os.path.realpath(p) for p in found if os.path.exists(p)))


def closed_below(path: str) -> bool:
    """Whether some file or folder at or below `path` (never through a link) is closed to other users."""
    for folder, _folders, files in os.walk(path):
        if not _others_may(os.stat(folder), stat.S_IROTH | stat.S_IXOTH):
            return True
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(info.st_mode) and not _others_may(info, stat.S_IROTH):
                return True
    return False


def opening(paths: Iterable[str]) -> str:
    """The command that lets a fresh uid read and run what `paths` hold: `chmod o+x` on every closed folder on
    the way to them, `chmod -R o+rX` on those with closed files or folders; "" when nothing is closed."""
    wanted = list(dict.fromkeys(os.path.realpath(p) for p in paths))
    way = [
        str(folder)
        for path in wanted
        for folder in reversed(Path(path).parents)
        if not _others_may(os.stat(folder), stat.S_IXOTH)
    ]
    below = [path for path in wanted if os.path.isdir(path) and closed_below(path)]
    below = [p for p in below if not any(q != p and bwrap.inside(p, q) for q in below)]
    files = [p for p in wanted if os.path.isfile(p) and not _others_may(os.stat(p), stat.S_IROTH | stat.S_IXOTH)]
    commands = []
    if way:
        commands.append("chmod o+x " + " ".join(shlex.quote(p) for p in dict.fromkeys(way)))
    if below or files:
        commands.append("chmod -R o+rX " + " ".join(shlex.quote(p) for p in [*below, *files]))
    return " && ".join(commands)


# -- other copies of the reference on the machine (`doctor`) ------------------------------------------------

COPY_DEPTH = 3  # folders below each place: /home/ta/courses/reference, /tmp/clone/reference
COPY_FOLDERS_SEEN = 20_000  # at most this many folders looked at in all: a second or so on a slow disk
NOT_COPIES = frozenset({"site-packages", "node_modules", "__pycache__"})  # never entered (nor hidden folders)


def places_for_copies() -> list[str]:
    """Where a second copy of the reference would sit: beside the checkout (another clone, a release built from
    it), in home folders, and in the temporary folders."""
    checkout = [str(bwrap.PROJECT_ROOT.parent)] if bwrap.PROJECT_ROOT is not None else []
    return [*checkout, "/home", "/root", "/srv", "/opt", "/tmp", "/var/tmp"]


def readable_copies(places: Iterable[str], depth: int = COPY_DEPTH, most: int = COPY_FOLDERS_SEEN) -> list[str]:
    """Folders named `reference` holding the reference's `mha.py`, at most `depth` folders below `places`, that
    another user, a worker's fresh uid under process isolation among them, could read; never the grader's own
    (closed before any grading starts) and never below a folder other users cannot enter. At most `most`
    folders are looked at."""
    own = reference_folder()
    found: list[str] = []
    stack = [(os.path.realpath(p), 0) for p in reversed(list(places)) if reachable_by_others(p)]
    seen: set[str] = set()
    while stack and len(seen) < most:
        folder, level = stack.pop()
        if folder in seen:
            continue
        seen.add(folder)
        copy = os.path.join(folder, "reference")
        if copy != own and os.path.isfile(os.path.join(copy, "mha.py")) and first_readable(copy) is not None:
            found.append(copy)
        if level < depth:
            stack += [(child, level + 1) for child in reversed(_enterable(folder))]
    return found


def _enterable(folder: str) -> list[str]:
    """The folders in `folder` other users may enter, but for hidden ones and `NOT_COPIES`; never a link."""
    try:
        with os.scandir(folder) as entries:
            return sorted(
                e.path
                for e in entries
                if not e.name.startswith(".")
                and e.name not in NOT_COPIES
                and e.is_dir(follow_symlinks=False)
                and _others_may(e.stat(follow_symlinks=False), stat.S_IXOTH)
            )
    except OSError:
        return []
