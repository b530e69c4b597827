"""Trusted side: what a worker in the namespace sandbox may see, and the bubblewrap command that builds it.

bubblewrap (`bwrap`) builds the worker a filesystem from an allow list (`allow_list`): the interpreter, its
standard library and packages, the shared libraries they load (read from this process's own memory map
after `import torch`), `/etc/ld.so.cache`, a minimal `/dev` (plus the NVIDIA devices for CUDA), a `/proc`
of its own pid namespace and an empty, size-limited `/tmp` to work in. The grader's packages are masked
even where they sit inside the interpreter's folders (`grader_folders`). `command` gives the worker its
own pid, network, IPC, UTS and cgroup namespaces, a new session, and death with its grader; as root,
without a user namespace (one would map the worker to root) and with only the capabilities it takes to
change uid, else with a user namespace that maps it to the grader's own unprivileged uid.

Not every bubblewrap has every option `command` would use (`features`, read from `bwrap --help`): 0.4 has
none of `--perms`, `--size` and `--disable-userns`, 0.5 adds `--perms`, 0.7 `--size` and 0.8 `--disable-userns`
(Ubuntu 22.04 ships 0.6.1, Debian 12 0.8.0). `command` uses only the options the installed one has;
`Features.refusal` says when what is missing leaves no sandbox worth the name (as root, without `--perms`, the
worker's fresh uid could not write its /tmp), and `Features.costs` what the others cost.

The environment is an allow list too (`worker_env`), for both isolations.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
# The project's source checkout, hidden from the worker whole; None when the grader is installed (a wheel),
# where the folder above the package is site-packages, which the worker needs: there only the grader's
# own packages are hidden.
PROJECT_ROOT = CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else None
GRADER_PACKAGES = ("autograder", "reference")
WORKDIR = "/tmp"  # the worker's empty scratch folder, inside the namespace sandbox
# The options of `command` that older bubblewraps lack, with the release that added each and what is lost
# without it; every other option it uses is in bubblewrap 0.4.0 (the oldest supported).
NEWER_OPTIONS = {
    "--perms": ("0.5.0", "the worker's /tmp and folders get bubblewrap's default modes"),
    "--size": ("0.7.0", "the worker's /tmp has no size limit of its own"),
    "--disable-userns": ("0.8.0", "the worker may make user namespaces of its own inside the sandbox"),
}


@dataclass(frozen=True)
class Features:
    """What one bubblewrap executable offers: its version and the options its `--help` lists."""

    executable: str
    version: str  # as `bwrap --version` says it ("0.8.0"), "" when it said nothing
    options: frozenset[str]

    @property
    def name(self) -> str:
        return f"bubblewrap {self.version or '(version unknown)'} ({self.executable})"

    def has(self, option: str) -> bool:
        return option in self.options

    def lacking(self, as_root: bool) -> list[str]:
        """The newer options `command` would use that this bubblewrap lacks (and so leaves out)."""
        wanted = [o for o in NEWER_OPTIONS if not (as_root and o == "--disable-userns")]  # no user namespace as root
        return [option for option in wanted if not self.has(option)]

    def refusal(self, as_root: bool) -> str | None:
        """Why the namespace sandbox cannot be built with this bubblewrap, or None when it can."""
        if not self.options:
            return f"{self.name} listed no options (`bwrap --help` failed)"
        if as_root and not self.has("--perms"):
            release = NEWER_OPTIONS["--perms"][0]
            return (
                f"{self.name} has no --perms, which the sandbox needs when the grader is root (its /tmp must be "
                f"writable by the worker's fresh uid); bubblewrap {release} and later have it"
            )
        return None

    def costs(self, as_root: bool) -> str:
        """What the options it lacks cost, in words ("" when it lacks none)."""
        return "; ".join(
            f"without {option} (bubblewrap {NEWER_OPTIONS[option][0]}), {NEWER_OPTIONS[option][1]}"
            for option in self.lacking(as_root)
        )


@cache
def features(executable: str) -> Features:
    """The version and options of the bubblewrap at `executable`, read from `--version` and `--help`."""

    def said(flag: str) -> str:
        try:
            run = subprocess.run([executable, flag], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return ""
        return run.stdout + run.stderr if run.returncode == 0 else ""

    version = said("--version").strip().removeprefix("bubblewrap").strip()
    options = frozenset(re.findall(r"^\s+(--[a-z0-9][a-z0-9-]*)", said("--help"), flags=re.MULTILINE))
    return Features(executable, version, options)


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader an ELF executable asks for (PT_INTERP), e.g. /lib64/ld-linux-x86-64.so.2."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return None
            fmt = "<" if head[5] == 1 else ">"
            phoff = struct.unpack_from(fmt + "Q", head, 32)[0]
            entry_size, count = struct.unpack_from(fmt + "HH", head, 54)
            for index in range(count):
                handle.seek(phoff + index * entry_size)
                header = handle.read(entry_size)
                if struct.unpack_from(fmt + "I", header, 0)[0] == 3:  # PT_INTERP
                    offset, size = (
                        struct.unpack_from(fmt + "Q", header, 8)[0],
                        struct.unpack_from(fmt + "Q", header, 32)[0],
                    )
                    handle.seek(offset)
                    return handle.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def _resolve(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path of `path`, recording every symlink met on the way (link path -> its text)."""
    current = "/"
    for part in Path(path).parts[1:]:
        candidate = os.path.join(current, part)
        if os.path.islink(candidate) and depth < 32:
            target = os.readlink(candidate)
            links[candidate] = target
            current = _resolve(os.path.normpath(os.path.join(current, target)), links, depth + 1)
        else:
            current = candidate
    return current


def inside(path: str, parent: str) -> bool:
    path, parent = os.path.abspath(path), os.path.abspath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@dataclass(frozen=True)
class AllowList:
    binds: tuple[str, ...]  # real paths, shown read-only at the same place
    links: tuple[tuple[str, str], ...]  # (path, target): symlinks to recreate
    masks: tuple[str, ...]  # folders inside `binds` hidden behind an empty tmpfs (the grader's packages)


@cache
def allow_list() -> AllowList:
    """What the worker may see besides /dev, /proc and /tmp: the interpreter and what it loads."""
    import torch  # noqa: F401  (its shared libraries must be in the memory map read below)

    return _allow_list()


@cache
def expected_allow_list() -> AllowList:
    """The allow list as it will be once torch is loaded, without loading it: for the workers started before
    the grader imports torch (`grading.workers.EarlyStart`), and for the probe of whether bubblewrap works.
    Where torch's libraries sit in folders allowed already (its own package's, the system's), it is
    `allow_list()`; workers started with it are used only where it is (the grading compares the two once
    torch is loaded)."""
    return _allow_list()


def _allow_list() -> AllowList:
    """What the memory map shows loaded now, and the interpreter's own folders (`allow_list`)."""
    links: dict[str, str] = {}
    wanted: list[str] = []
    venv = sys.prefix != sys.base_prefix
    if venv:
        wanted.append(sys.prefix)  # pyvenv.cfg, its packages
    base = {
        "base": sys.base_prefix,
        "platbase": sys.base_exec_prefix,
        "installed_base": sys.base_prefix,
        "installed_platbase": sys.base_exec_prefix,
    }
    keys = (
        ("stdlib", "platstdlib")
        if venv and not _system_site_packages()
        else ("stdlib", "platstdlib", "purelib", "platlib")
    )
    wanted += [sysconfig.get_paths(vars=base)[key] for key in keys]
    if venv:
        wanted += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    wanted.append(sys.executable)
    interpreter = elf_interpreter(os.path.realpath(sys.executable))
    if interpreter:
        wanted.append(interpreter)
    with open("/proc/self/maps") as handle:
        mapped = {line.split(None, 5)[5].strip() for line in handle if len(line.split(None, 5)) == 6}
    for path in mapped:
        if path.startswith("/") and ".so" in os.path.basename(path) and os.path.isfile(path):
            wanted.append(os.path.dirname(path))  # the folder: libraries loaded later sit beside these
    if os.path.exists("/etc/ld.so.cache"):
        wanted.append("/etc/ld.so.cache")
    for entry in os.scandir("/"):  # merged /usr: /lib -> usr/lib and the like
        if entry.is_symlink():
            links[entry.path] = os.readlink(entry.path)
    real = sorted({_resolve(os.path.abspath(p), links) for p in wanted if os.path.exists(p)}, key=len)
    binds: list[str] = []
    for path in real:
        if not any(inside(path, kept) for kept in binds):
            binds.append(path)
    shown_links = {link: target for link, target in links.items() if not any(inside(link, b) for b in binds)}
    masks = []
    for name in GRADER_PACKAGES:
        folder = _package_folder(name)
        if folder and any(inside(folder, b) for b in binds):
            masks.append(folder)
    if PROJECT_ROOT is not None and any(inside(str(PROJECT_ROOT), b) for b in binds):
        masks.append(str(PROJECT_ROOT))
    return AllowList(tuple(binds), tuple(sorted(shown_links.items())), tuple(masks))


def _system_site_packages() -> bool:
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    try:
        return "include-system-site-packages = true" in cfg.read_text().replace("\t", " ").lower()
    except OSError:
        return False


def grader_folders() -> list[str]:
    """What of the grader the worker must not see: the checkout, or, installed, the grader's packages."""
    if PROJECT_ROOT is not None:
        return [str(PROJECT_ROOT)]
    return [folder for folder in map(_package_folder, GRADER_PACKAGES) if folder]


def _package_folder(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0])


def command(
    executable: str,
    device: str,
    scratch_bytes: int,
    as_root: bool,
    allowed: AllowList | None = None,
    fork_server: bool = False,
) -> list[str]:
    """`executable` (bubblewrap, by its full path) and its options for a worker on `device` with a /tmp of
    `scratch_bytes`, started by a grader that is root (`as_root`) or not, showing it `allowed` (by default
    `allow_list()`); the interpreter's command line follows. Only the options this bubblewrap has are used
    (`features`). For the `fork_server`, the same sandbox, keeping what its children need to make their own
    namespaces and mounts before they drop it for good (`inside/forkserver.py`)."""
    allowed = allowed or allow_list()
    found = features(executable)

    def perms(mode: str) -> list[str]:
        return ["--perms", mode] if found.has("--perms") else []

    argv = [
        executable,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if as_root:
        # No user namespace (it would map the worker to root): real root makes the namespaces, keeps only
        # what it takes to change uid, and the worker drops to a fresh uid before student code runs.
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if fork_server:
            argv += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"]
    elif fork_server:
        # user namespaces are refused to the workers by each child itself, once it has made its own
        argv += ["--unshare-user", "--cap-drop", "ALL"]
        argv += ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP", "--cap-add", "CAP_SYS_RESOURCE"]
    else:
        argv += [
            "--unshare-user",
            *(["--disable-userns"] if found.has("--disable-userns") else []),
            "--cap-drop",
            "ALL",
        ]
    # The scratch folder first: the interpreter, its packages and the checkout may themselves live under
    # /tmp (a CI runner's clone), and their binds must land on top of it, not under it.
    argv += [*(["--size", str(scratch_bytes)] if found.has("--size") else []), *perms("1777"), "--tmpfs", WORKDIR]
    made: set[str] = {"/", WORKDIR}
    for path in [*allowed.binds, *(link for link, _ in allowed.links)]:
        for parent in map(str, list(Path(path).parents)[::-1]):
            if (
                parent not in made
                and not any(inside(parent, b) for b in allowed.binds)
                and parent not in dict(allowed.links)
            ):
                argv += [*perms("0755"), "--dir", parent]
                made.add(parent)
    for path in allowed.binds:
        argv += ["--ro-bind", path, path]
    for link, target in allowed.links:
        argv += ["--symlink", target, link]
    for path in allowed.masks:
        argv += ["--tmpfs", path]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    if device.startswith("cuda"):
        for entry in sorted(Path("/dev").glob("nvidia*")):
            argv += ["--dev-bind", str(entry), str(entry)]
    argv += ["--chdir", WORKDIR]
    return argv


def worker_env(workdir: str = WORKDIR) -> dict[str, str]:
    """The worker's whole environment: a scrubbed PATH, a home and TMPDIR in its scratch folder, and only
    the variables CUDA and the BLAS libraries need."""
    # OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning between requests, which
    # otherwise burns seconds of CPU per submission that other submissions graded at once need.
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "LANG": "C.UTF-8",
        "USER": "student",
        "LOGNAME": "student",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": workdir,
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env
