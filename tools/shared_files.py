"""Virtualenvs made from the same wheels hold the same files: each of those becomes one file on disk.

PyPI's torch for Python 3.10 and for 3.12 carry the same CUDA runtime (2.7 GB) and much of torch's own
libraries; the CPU build for Python 3.11 is the same bytes in every virtualenv a run makes of it (the
project's, Debian's Python's, Gradescope's setup.sh's). `share_identical_files` makes each file of one
virtualenv's site-packages that another's has, at the same place, with the same bytes and mode, a hard link
to that file. pip never writes into an installed file (it replaces or removes it), so the virtualenvs stay
independent. Standard library only: tools/test_pythons.py runs before any virtualenv exists.
"""

from __future__ import annotations

import filecmp
import os
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
