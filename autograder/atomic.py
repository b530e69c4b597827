"""Writing a file so that a reader (or a crash) sees the old contents or the new, never half of either."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str, mode: int = 0o644):
    """Write `text` to a temporary file beside `path`, then rename it over `path` (os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        os.fchmod(descriptor, mode)  # mkstemp makes it private; these files are read by people and tools
        with os.fdopen(descriptor, "w", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
