"""`make test-pythons`: set up the project and run its smoke set on every supported Python found here.

For each supported minor version (3.10 to 3.13) it looks for an interpreter: `python3.X` on PATH, then
pyenv's (`$PYENV_ROOT/versions/3.X.*`); and the system's own `/usr/bin/python3` (Debian 12's 3.11.2,
Ubuntu 22.04's 3.10, 24.04's 3.12), which may be older than a release of 3.X that a package needs. Each
gets its own virtualenv (`.venvs/<name>`, made by `make setup PYTHON=... VENV=...` in a copy of the tree,
`.venvs/<name>.src`, remade only when its inputs change; `--setup-only` makes them and runs nothing, as
`.ci/run` does in the background while its first suites run) and runs the smoke set in it (`SMOKE`): what differs from one Python to another is what
installs and what the interpreter does at the trust boundary, so the lock's tests, the worker's and the
sandbox's quick tests, the fork server's tests and one whole grading; `make test` runs everything else on the
default Python. A table says, per Python, whether the setup and the smoke set passed. Pythons not on this
machine are listed, not failed; any setup or smoke set that fails makes the whole run fail.

torch 2.13.0 for Python 3.11 is the CPU wheel where pip finds one; for the others, pip takes PyPI's
build, which carries CUDA's runtime, and runs on the CPU all the same: 4.7 GB a virtualenv, of which 3.6 GB
are the same bytes in every Python's (CUDA's runtime, 2.7 GB, and much of torch's own libraries). So a
virtualenv started once another is made first takes CUDA's runtime from those made before it, as
hard links (`seed`: pip finds it installed and neither downloads nor unpacks it), and once made, each of its
files that another virtualenv here has byte for byte, at the same place, becomes a hard link to that file
(tools/shared_files.py). Three Pythons' CUDA builds took 8.5 GB of disk in CI, not 16. `--discard` removes each
Python's virtualenv and copy of the tree once its smoke set has run (`.ci/run`: a CI machine's disk may be
small).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from shared_files import seed_distributions, share_identical_files

ROOT = Path(__file__).resolve().parent.parent
MINORS = ("3.10", "3.11", "3.12", "3.13")
# The smoke set: these files' tests but the slow ones not marked `smoke` (the fork server's tests, one whole
# grading), and never a long or a CUDA one.
SMOKE_MARKERS = "not long and not cuda and (not slow or smoke)"
SMOKE = [
    "tests/test_lock.py",
    "tests/test_worker.py",
    "tests/test_sandbox.py",
    "tests/test_forkserver.py",
    "tests/test_cli.py::test_grade_prints_a_summary_per_part",
]


def version_of(python: str) -> str | None:
    try:
        run = subprocess.run(
            [python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def find_pythons() -> dict[str, str | None]:
    """{name: interpreter or None}: one per supported minor version, and the system's python3."""
    found: dict[str, str | None] = {}
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for minor in MINORS:
        candidates = [shutil.which(f"python{minor}")] + sorted(
            glob.glob(str(pyenv / "versions" / f"{minor}.*" / "bin" / "python")), reverse=True
        )
        found[minor] = next((c for c in candidates if c and (version_of(c) or "").startswith(minor + ".")), None)
    system = "/usr/bin/python3"
    found["system"] = system if os.path.exists(system) and version_of(system) else None
    return found


def real_interpreter(python: str) -> str | None:
    """The real path of the interpreter `python` runs: through a pyenv shim or a link, and a virtualenv's
    own copy (`make` puts .venv/bin first on PATH) resolved to the Python it was made from."""
    try:
        run = subprocess.run(
            [python, "-c", "import os, sys; print(os.path.realpath(getattr(sys, '_base_executable', sys.executable)))"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() or None


def base_of(venv: Path) -> str | None:
    """The real path of the interpreter `venv` was made from."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    run = subprocess.run(
        [str(python), "-c", "import os, sys; print(os.path.realpath(sys._base_executable))"],
        capture_output=True,
        text=True,
    )
    return run.stdout.strip() or None


def copy_of_tree(name: str) -> Path:
    """A copy of the working tree (the files git tracks, and those it does not ignore) at
    `.venvs/<name>.src`, made afresh: a Python run beside others (`--jobs`) writes its build files and
    caches there, never into another's."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    copy = ROOT / ".venvs" / f"{name}.src"
    shutil.rmtree(copy, ignore_errors=True)
    git = ROOT / ".git"  # the repository too (a folder, or a worktree's pointer file): tests ask git what it tracks
    if git.is_dir():
        shutil.copytree(git, copy / ".git", symlinks=True)
    elif git.exists():
        copy.mkdir(parents=True, exist_ok=True)
        shutil.copy2(git, copy / ".git")
    for relative in filter(None, listed.decode().split("\0")):
        source = ROOT / relative
        if source.is_file():
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / relative)
    return copy


def seed(venv: Path, python: str, torch: str, where: Path, donors: list[Path]) -> list[str]:
    """Before a new virtualenv's `make setup`: make it, ask its pip what installing torch there would install
    (`--dry-run --report`), and install those distributions that a virtualenv of `donors` has from a
    Python-independent wheel as hard links to its files (`seed_distributions`: CUDA's runtime, which pip then
    neither downloads nor unpacks again). The names seeded; none where the virtualenv was made already."""
    if not donors or (venv / ".inputs").exists():
        return []
    if not (venv / "bin" / "python").exists():
        if subprocess.run([python, "-m", "venv", str(venv)], capture_output=True).returncode:
            return []  # make setup says why
    asked = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        + ["--dry-run", "--ignore-installed", "--report", "-", "--constraint", str(where / "requirements.lock")]
        + shlex.split(torch),
        capture_output=True,
        text=True,
        cwd=where,
    )
    try:
        install = json.loads(asked.stdout)["install"] if asked.returncode == 0 else []
        wanted = {item["metadata"]["name"]: item["metadata"]["version"] for item in install}
    except (ValueError, KeyError, TypeError):
        return []
    return seed_distributions(venv, wanted, donors)


_sharing = threading.Lock()  # one Python's virtualenv shared with the others at a time
_made: list[Path] = []  # the virtualenvs made (or found made) so far: what the next one may share with


def run_one(
    name: str,
    python: str,
    torch: str,
    pytest_args: list[str],
    log: Path | None = None,
    setup_only: bool = False,
    share_with: tuple[Path, ...] = (),
    discard: bool = False,
) -> tuple[str, str, float]:
    """`make setup` and the smoke set (or `pytest_args`) for one Python, in a copy of the tree
    (`copy_of_tree`: the virtualenv installs the project from it, so that one made by `--setup-only` serves a
    later run). Once made, the virtualenv shares its identical files with the virtualenvs of `share_with` and
    those made before it (`share_identical_files`). With a `log`, everything it prints goes to the log; with
    `discard`, the virtualenv and the copy are removed once the smoke set has run."""
    venv = ROOT / ".venvs" / name
    started = time.monotonic()
    where = copy_of_tree(name)
    try:
        with ExitStack() as stack:
            out = stack.enter_context(open(log, "w")) if log else None
            err = subprocess.STDOUT if out else None
            with _sharing:
                donors = [*share_with, *_made]
            seeded = seed(venv, python, torch, where, donors)
            if seeded:
                print(f"setup: {len(seeded)} distributions taken from other virtualenvs: {', '.join(seeded)}", file=out)
                if out:
                    out.flush()
            setup = subprocess.run(
                ["make", "--no-print-directory", "setup", f"PYTHON={python}", f"VENV={venv}", f"TORCH_SPEC={torch}"],
                cwd=where,
                stdout=out,
                stderr=err,
            )
            if setup.returncode:
                return "failed", "not run", time.monotonic() - started
            with _sharing:
                saved = share_identical_files(venv, [*share_with, *_made])
                if venv not in _made:
                    _made.append(venv)
            if saved:
                print(f"setup: {saved / 2**30:.1f} GB of {venv.name}'s files shared with other virtualenvs", file=out)
            if setup_only:
                return "passed", "not run (--setup-only)", time.monotonic() - started
            suite = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-m", SMOKE_MARKERS, *(pytest_args or SMOKE)],
                cwd=where,
                stdout=out,
                stderr=err,
            )
        return (
            "passed",
            "passed" if suite.returncode == 0 else f"failed (exit {suite.returncode})",
            time.monotonic() - started,
        )
    finally:
        if discard:
            with _sharing:
                if venv in _made:
                    _made.remove(venv)  # nothing more shares with it
            shutil.rmtree(venv, ignore_errors=True)
            shutil.rmtree(where, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch", default="torch==2.13.0", help="TORCH_SPEC for every virtualenv")
    parser.add_argument("--only", action="append", help="only this name (3.10, ..., system); repeatable")
    parser.add_argument(
        "--skip-venv",
        default=None,
        help="a virtualenv whose Python runs the full suite already (make test): that Python is not run again",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="Pythons run at once, each in its own copy of the tree as always, its output shown when it ends (default 1)",
    )
    parser.add_argument(
        "--setup-only",
        action="store_true",
        help="make each Python's virtualenv, run no test (.ci/run does it in the background, early)",
    )
    parser.add_argument(
        "--discard",
        action="store_true",
        help="remove each Python's virtualenv and copy of the tree once its smoke set has run (.ci/run)",
    )
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest")
    args = parser.parse_args(argv)
    rows: dict[str, tuple[str, str, str, str, float]] = {}
    default = base_of(ROOT / args.skip_venv) if args.skip_venv else None
    runs: list[tuple[str, str, str, list[str]]] = []  # name, interpreter, its label, pytest args
    for name, python in find_pythons().items():
        if args.only and name not in args.only:
            continue
        if python is None:
            rows[name] = (name, "not on this machine", "", "", 0.0)
            continue
        version = version_of(python) or ""
        label = f"{python} ({version})"
        if default and real_interpreter(python) == default:
            rows[name] = (name, label, "the default", "make test: the full suite", 0.0)
            continue
        runs.append((name, python, label, args.pytest_args))

    def run(job: tuple[str, str, str, list[str]]) -> None:
        name, python, label, pytest_args = job
        title = f"\n== Python {name}: {label}"
        if args.jobs <= 1:
            print(title, flush=True)
        log = ROOT / ".venvs" / f"{name}.log" if args.jobs > 1 else None
        setup, suite, seconds = run_one(
            name,
            python,
            args.torch,
            pytest_args,
            log,
            args.setup_only,
            share_with=(ROOT / args.skip_venv,) if args.skip_venv else (),
            discard=args.discard,
        )
        if log:
            print(title + f" (in .venvs/{name}.src, beside others)\n" + log.read_text(errors="replace"), flush=True)
        rows[name] = (name, label, setup, suite, seconds)

    (ROOT / ".venvs").mkdir(exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(run, runs))
    ordered = [rows[name] for name in (*MINORS, "system") if name in rows]
    print("\nPython   interpreter                                        make setup  smoke set")
    for name, python, setup, suite, seconds in ordered:
        print(f"{name:<8} {python:<50} {setup:<11} {suite}" + (f"  ({seconds:.0f} s)" if seconds else ""))
    failed = [row for row in ordered if row[2] == "failed" or row[3].startswith("failed")]
    return 1 if failed or not any(row[2] for row in ordered) else 0


if __name__ == "__main__":
    sys.exit(main())
