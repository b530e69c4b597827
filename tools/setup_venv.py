"""Create or refresh the project's virtualenv, only when it is missing or its inputs changed.

The inputs are pyproject.toml, requirements.lock, the torch requirement (TORCH_SPEC), so a GPU
runner can ask for a CUDA build while the default stays the CPU wheel, and the interpreter that runs
this script (`make setup PYTHON=python3.12`): a virtualenv made by another Python is made anew. Every package but torch is
installed at the version requirements.lock pins (as pip constraints), so a grade does not change
when a dependency releases; `make lock` regenerates the lock. Standard library only: it runs before
the virtualenv exists.
"""

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", default=".venv")
    parser.add_argument(
        "--torch",
        default="torch==2.13.0",
        help="pip arguments for torch, e.g. 'torch==2.13.0 --index-url URL' on a GPU runner",
    )
    args = parser.parse_args()

    ensure_bubblewrap()
    env_dir = (ROOT / args.venv).resolve()
    python = env_dir / "bin" / "python"
    stamp = env_dir / ".inputs"
    interpreter = f"{base_interpreter()} {sys.version}"
    inputs = [
        (ROOT / "pyproject.toml").read_bytes(),
        LOCK.read_bytes(),
        args.torch.encode(),
        interpreter.encode(),
        str(ROOT).encode(),  # the tree the project is installed from (editable): another tree installs anew
    ]
    digest = hashlib.sha256(b"\0".join(hashlib.sha256(part).digest() for part in inputs)).hexdigest()

    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return 0
    if sys.version_info < (3, 10):  # noqa: UP036 (this script runs before the virtualenv, under any Python)
        print(f"setup: Python 3.10 or later is needed, {sys.executable} is {sys.version.split()[0]}", file=sys.stderr)
        return 2
    if python.exists() and not made_by_this_python(env_dir):
        print(f"setup: {args.venv} was made by another Python: making it anew with {sys.executable}", flush=True)
        shutil.rmtree(env_dir)
    if not python.exists():
        print(f"setup: creating {args.venv}", flush=True)
        venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--constraint", str(LOCK)]
    print(f"setup: installing {args.torch}", flush=True)
    subprocess.run([*pip, *shlex.split(args.torch)], check=True)
    print("setup: installing the project and its locked dependencies", flush=True)
    subprocess.run([*pip, "--editable", f"{ROOT}[test]"], check=True)
    stamp.write_text(digest + "\n")
    return 0


def made_by_this_python(env_dir: Path) -> bool:
    """Whether the virtualenv's pyvenv.cfg names this interpreter's version and home."""
    try:
        cfg = dict(line.split("=", 1) for line in (env_dir / "pyvenv.cfg").read_text().splitlines() if "=" in line)
    except OSError:
        return False
    cfg = {key.strip(): value.strip() for key, value in cfg.items()}
    version = ".".join(map(str, sys.version_info[:3]))
    home = os.path.realpath(cfg.get("home", ""))
    return cfg.get("version", cfg.get("version_info", "")).startswith(version) and home in (
        os.path.dirname(base_interpreter()),
        os.path.realpath(os.path.dirname(getattr(sys, "_base_executable", sys.executable))),
    )


def base_interpreter() -> str:
    """The interpreter running this script, or the one its virtualenv was made from."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def ensure_bubblewrap():
    """The grader's sandbox is bubblewrap (`bwrap`). As root on Debian or Ubuntu it is installed here;
    otherwise say what grading will do without it."""
    if shutil.which("bwrap"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("setup: installing bubblewrap (the grader's sandbox)", flush=True)
        import apt_packages  # tools/apt_packages.py, beside this file

        if not apt_packages.install(["bubblewrap"]):
            return
    print(
        "setup: bubblewrap (bwrap) is not installed, so grading has no sandbox here: as root, the student's "
        "code runs as a fresh unprivileged uid; otherwise `grade` needs --isolation process to run it as "
        "your own user. Install the `bubblewrap` package to sandbox it.",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
