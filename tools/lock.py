"""Regenerate requirements.lock, the exact version of every package the project installs but torch.

`make setup` installs with the lock as pip constraints, so a grade does not change when a
transitive dependency releases. uv (`uv pip compile --universal`) resolves pyproject.toml's
dependencies with its `test` and `lock` extras, plus torch at TORCH_SPEC's version, so that torch's
own dependencies (sympy, networkx, filelock, ...) are pinned too. The lines of torch itself and of
the CUDA runtime that only a CUDA build of torch brings (nvidia-*, triton, cuda-*) are then dropped:
TORCH_SPEC chooses the build (the CPU wheel here, a CUDA one on a GPU runner) and each build pins its
own CUDA libraries.

One lock serves every Python that pyproject.toml's `requires-python` admits (3.10 to 3.13): where a
package's newest release drops an older Python, the lock pins an older release for it behind an
environment marker (`numpy==2.2.6 ; python_full_version < '3.11'`), which pip applies when it reads
the lock as constraints. Pins already in the lock are kept unless `--upgrade` is given.

It runs uv from the project's virtualenv (creating it when missing), at the version pinned in
pyproject.toml's `lock` extra; it does not need `make setup` to have succeeded, so a lock that no
longer fits pyproject.toml can always be regenerated. uv reads no pip configuration: it resolves
against the package index alone, and no index URL or local path is written into the file.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LOCK = "requirements.lock"
EXTRAS = ("test", "lock")
HEADER = (
    "# Every package `make setup` installs, pinned, used as pip constraints. torch is not here:\n"
    "# TORCH_SPEC chooses its build, and its own dependencies are pinned below. Regenerate with\n"
    "# `make lock` (tools/lock.py) after changing pyproject.toml or the torch version.\n"
    "#\n"
)
BUILD_SPECIFIC = re.compile(r"^(torch|triton|nvidia-[\w.-]+|cuda-[\w.-]+)==", re.IGNORECASE)


def torch_requirement(spec: str) -> str:
    """'torch==2.13.0+cpu --index-url URL' -> 'torch==2.13.0': the version without the build."""
    requirement = next((word for word in shlex.split(spec) if word.startswith("torch")), None)
    if requirement is None or "==" not in requirement:
        raise SystemExit(f"lock: TORCH_SPEC must pin torch with ==, got {spec!r}")
    return requirement.split("+", 1)[0]


def drop_build_specific(text: str) -> str:
    """The lock without the pins of torch and of its CUDA runtime (each pin and its `# via` lines)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if not line.startswith((" ", "#")) and line.strip():
            skipping = bool(BUILD_SPECIFIC.match(line))
        elif not line.startswith(" "):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch", default="torch==2.13.0", help="TORCH_SPEC, whose torch version is locked against")
    parser.add_argument("--upgrade", action="store_true", help="move every pin to its newest release")
    parser.add_argument("--venv", default=".venv")
    args = parser.parse_args()

    python = (ROOT / args.venv).resolve() / "bin" / "python"
    if not python.exists():
        print(f"lock: creating {args.venv}", flush=True)
        venv.EnvBuilder(with_pip=True).create(python.parent.parent)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *project["optional-dependencies"]["lock"],
        ],
        check=True,
        env=dict(os.environ, PIP_CONSTRAINT=""),
    )
    oldest = re.search(r">=\s*(3\.\d+)", project["requires-python"]).group(1)
    env = dict(os.environ, UV_CUSTOM_COMPILE_COMMAND="make lock")
    # Written to the lock itself: uv keeps its current pins unless --upgrade is given.
    command = [
        str(python.parent / "uv"),
        "pip",
        "compile",
        "--quiet",
        "--universal",
        "--python-version",
        oldest,
        "--strip-extras",
        "--no-emit-index-url",
        "--no-emit-find-links",
        *[f"--extra={extra}" for extra in EXTRAS],
        *(["--upgrade"] if args.upgrade else []),
        "--output-file",
        LOCK,
        "pyproject.toml",
        "-",
    ]
    run = subprocess.run(command, input=torch_requirement(args.torch) + "\n", text=True, cwd=ROOT, env=env)
    if run.returncode:
        return run.returncode
    path = ROOT / LOCK
    lock = drop_build_specific(path.read_text())
    if not lock.startswith(HEADER):
        lock = HEADER + lock
    path.write_text(lock)
    pins = [line for line in lock.splitlines() if re.match(r"[\w.-]+==", line)]
    print(f"lock: wrote {LOCK}, {len(pins)} packages pinned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
