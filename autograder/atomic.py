"""Writing a file so that a reader (or a crash) sees the old contents or the new, never half of either."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def open_atomically(path: Path, mode: int = 0o644) -> Iterator[TextIO]:
    """A text file to write `path` through: a temporary file beside it, renamed over `path`
    (os.replace) only when the block ends without an exception. Newlines are written as given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        os.fchmod(descriptor, mode)  # mkstemp makes it private; these files are read by people and tools
        with os.fdopen(descriptor, "w", newline="") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_text_atomically(path: Path, text: str, mode: int = 0o644):
    with open_atomically(path, mode) as handle:
        handle.write(text)
