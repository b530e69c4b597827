"""The built wheel, installed in a fresh virtualenv, grades the reference solution to full marks.

Only the wheel's own files and the `mha-autograder` command are relied on, from a working directory
outside the repository, so the test holds whatever the package's internal modules are called.

torch is the one package not installed from an index: the wheel does not depend on it (TORCH_SPEC
chooses its build) and installing its 200 MB wheel again would take minutes. Instead the files of
the torch distribution this project's virtualenv already has (the build `make setup` chose) are
hard-linked into the new virtualenv's site-packages, dist-info included, as pip would have unpacked
them (copied where a hard link is impossible). pip then sees torch installed and installs its
dependencies, with the wheel's, at the versions requirements.lock pins. Nothing in the new
virtualenv points back into the checkout or the project's virtualenv.

The new virtualenv lives in the checkout's build/ folder (ignored by git), not under /tmp: the
sandbox gives the worker an empty /tmp of its own, so an interpreter installed there could not run.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

from helpers import REFERENCE, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1200)]

# Whatever the build copy must leave out: what setup, tests and grading write into a checkout.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "autograded",
    "feedback",
    "*.db",
)


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env, **kwargs)
    assert done.returncode == 0, f"{command}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
    print(f"{time.monotonic() - started:6.1f} s  {' '.join(map(str, command))[:120]}")
    return done


def link_torch_into(site_packages: Path) -> None:
    """The files of this environment's torch distribution, hard-linked into `site_packages`."""
    torch = distribution("torch")
    for file in torch.files:
        source = Path(torch.locate_file(file)).resolve()
        if ".." in file.parts or not source.is_file():
            continue  # console scripts in bin/, not needed to grade
        target = site_packages / file
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel built from a copy of the checkout and installed into a fresh virtualenv; the copy is gone."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    (ROOT / "build").mkdir(exist_ok=True)
    env_dir = Path(tempfile.mkdtemp(prefix="wheel-test-", dir=ROOT / "build"))
    env_dir.chmod(0o755)  # the worker runs as another user: it must be able to read the interpreter
    try:
        yield install_wheel(tmp_path, env_dir)
    finally:
        shutil.rmtree(env_dir, ignore_errors=True)


def install_wheel(tmp_path: Path, env_dir: Path) -> dict:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        tmp_path / "dist",
        source,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        packaged = set(archive.namelist())
    top_level = {name.split("/")[0] for name in packaged if "/" in name and ".dist-info/" not in name}
    in_source = {
        path.relative_to(source).as_posix()
        for package in top_level
        for path in (source / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    shutil.rmtree(source)  # from here on, the only copy of the grader is the installed one

    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site_packages = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    link_torch_into(site_packages)
    # Byte-compiled at install, as pip does by default: the worker's read-only sandbox could not write
    # the bytecode, and would compile the packages it imports (sympy) again at every start.
    run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--constraint",
        ROOT / "requirements.lock",
        wheel,
        f"torch=={distribution('torch').version}",
        cwd=tmp_path,
    )
    run(python, "-m", "pip", "check", cwd=tmp_path)
    return {
        "tmp": tmp_path,
        "env": env_dir,
        "python": python,
        "bin": env_dir / "bin",
        "site_packages": site_packages,
        "packaged": packaged,
        "top_level": top_level,
        "in_source": in_source,
    }


def grade_installed(installed, source: str, student: str) -> dict:
    """Grade `source` as `student`'s mha.py with the installed command, from a folder outside the checkout."""
    submission = installed["tmp"] / "class" / student / "mha.py"
    submission.parent.mkdir(parents=True)
    submission.write_text(source)
    out = installed["tmp"] / "out" / student / "results.json"
    cwd = installed["tmp"] / "cwd" / student
    cwd.mkdir(parents=True)
    grading = run(installed["bin"] / "mha-autograder", "grade", submission, "--out", out, cwd=cwd, timeout=600)
    return {**json.loads(out.read_text()), "stdout": grading.stdout}


def test_the_wheel_holds_every_file_of_its_packages(installed):
    """Data files too: the rubric and the checks' own pytest.ini, without which pytest cannot run them."""
    assert {"autograder", "reference"} <= installed["top_level"]
    assert installed["in_source"] - installed["packaged"] == set(), "files left out of the wheel"


def test_the_installed_grader_is_the_one_that_runs(installed):
    """Python finds modules only in the new virtualenv and the interpreter's standard library: not in the
    checkout, not in this project's virtualenv."""
    python = installed["python"]
    paths = json.loads(run(python, "-c", "import json, sys; print(json.dumps(sys.path))", cwd=installed["tmp"]).stdout)
    allowed = [installed["env"].resolve(), Path(sys.base_prefix).resolve()]
    assert [p for p in paths if p and not any(Path(p).resolve().is_relative_to(root) for root in allowed)] == []
    located = run(
        python,
        "-c",
        "from importlib.metadata import distribution as d; print(d('mha-exercise').locate_file(''))",
        cwd=installed["tmp"],
    ).stdout.strip()
    assert Path(located).resolve() == installed["site_packages"].resolve()


def test_the_installed_wheel_grades_the_reference_to_full_marks(installed):
    results = grade_installed(installed, REFERENCE.read_text(), "ada")
    failed = [t["name"] for t in results["tests"] if t["status"] != "passed"]
    assert results["max_score"] > 0 and results["score"] == results["max_score"], (failed, results["stdout"][-2000:])


THIEF = """\
try:
    import reference
    print("reference: stolen from", reference.__file__)
except ImportError:
    print("reference: hidden")
"""


def test_the_installed_grader_hides_its_reference_from_the_submission(installed):
    """Installed, the grader's packages sit in site-packages beside torch, which the worker must see."""
    results = grade_installed(installed, THIEF, "mallory")
    assert results["score"] == 0 and "reference: hidden" in results["output"], results["output"]
