"""Virtualenvs made from the same wheels hold the same files: each of those becomes one file on disk.

PyPI's torch for Python 3.10 and for 3.12 carry the same CUDA runtime (2.7 GB) and much of torch's own
libraries; the CPU build for Python 3.11 is the same bytes in every virtualenv a run makes of it (the
project's, Debian's Python's, Gradescope's setup.sh's). `share_identical_files` makes each file of one
virtualenv's site-packages that another's has, at the same place, with the same bytes and mode, a hard link
to that file. pip never writes into an installed file (it replaces or removes it), so the virtualenvs stay
independent. Standard library only: tools/test_pythons.py runs before any virtualenv exists.
"""

from __future__ import annotations

import csv
import filecmp
import os
import re
from pathlib import Path


def site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def share_identical_files(venv: Path, others: list[Path]) -> int:
    """Make each file of `venv`'s site-packages that one of `others`' has at the same place, with the same
    bytes and mode, a hard link to that file; the bytes of disk this saves. Files already shared are passed
    over unread; a file that cannot be linked (another file system) stays a copy."""
    mine = site_packages(venv)
    theirs = [found for found in map(site_packages, others) if found and found != mine]
    if mine is None or not theirs:
        return 0
    saved = 0
    for folder, _, names in os.walk(mine):
        for name in names:
            path = Path(folder) / name
            relative = path.relative_to(mine)
            try:
                own = path.lstat()
            except OSError:
                continue
            if not path.is_file() or path.is_symlink() or own.st_size == 0:
                continue
            for other in theirs:
                twin = other / relative
                try:
                    found = twin.lstat()
                except OSError:
                    continue
                if (found.st_dev, found.st_ino) == (own.st_dev, own.st_ino):
                    break  # shared already
                if twin.is_symlink() or (found.st_size, found.st_mode) != (own.st_size, own.st_mode):
                    continue
                if not filecmp.cmp(path, twin, shallow=False):
                    continue
                staged = path.with_name(f".{name}.shared")
                try:
                    os.link(twin, staged)
                    os.replace(staged, path)
                except OSError:  # another file system, or a link limit: the copy stays
                    staged.unlink(missing_ok=True)
                    continue
                if own.st_nlink == 1:
                    saved += own.st_size
                break
    return saved


def python_independent(dist_info: Path) -> bool:
    """Whether a distribution was installed from a wheel for any Python 3 and a given platform (tag
    `py3-none-<platform>`): CUDA's runtime libraries, the same files whichever Python installs them. A
    pure-Python wheel (`py3-none-any`) is not counted: installed, it holds its Python's own bytecode."""
    try:
        lines = (dist_info / "WHEEL").read_text().splitlines()
    except OSError:
        return False
    tags = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:")]
    parts = [tag.split("-") for tag in tags]
    return bool(parts) and all(
        len(p) == 3 and p[0] in ("py3", "py2.py3") and p[1] == "none" and p[2] != "any" for p in parts
    )


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(site: Path) -> dict[str, tuple[str, Path]]:
    """{normalized name: (version, dist-info folder)} of the distributions installed in `site`."""
    found = {}
    for dist_info in site.glob("*.dist-info"):
        name, _, version = dist_info.name.removesuffix(".dist-info").rpartition("-")
        found[normalized(name)] = (version, dist_info)
    return found


def seed_distributions(venv: Path, wanted: dict[str, str], donors: list[Path]) -> list[str]:
    """Install into `venv` those of `wanted` ({name: version}, what pip is about to install there) that one of
    `donors` has installed at that version from a Python-independent wheel (`python_independent`), as hard
    links to the donor's files: pip then finds them installed and neither downloads nor unpacks them again
    (CUDA's runtime: 2.7 GB a Python). Only distributions whose files all lie in site-packages are taken, never
    one `venv` has at any version; their bytecode is left out. The names seeded."""
    mine = site_packages(venv)
    if mine is None:
        return []
    have = installed(mine)
    wanted = {normalized(name): version for name, version in wanted.items()}
    seeded = []
    for donor in filter(None, map(site_packages, donors)):
        for name, (version, dist_info) in installed(donor).items():
            if name in have or wanted.get(name) != version or not python_independent(dist_info):
                continue
            try:
                with open(dist_info / "RECORD", newline="") as record:
                    files = [row[0] for row in csv.reader(record) if row]
            except OSError:
                continue
            if any(Path(file).is_absolute() or ".." in Path(file).parts for file in files):
                continue  # scripts or data outside site-packages: pip installs it
            for file in files:
                if "__pycache__" in Path(file).parts or not (donor / file).is_file():
                    continue
                target = mine / file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                os.link(donor / file, target)
            have[name] = (version, mine / dist_info.name)
            seeded.append(name)
    return seeded
