"""Writing a file so that a reader (or a crash) sees the old contents or the new, never half of either."""

from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every zip entry's timestamp: the same files always make the same zip


@contextlib.contextmanager
def open_atomically(path: Path, mode: int = 0o644, binary: bool = False) -> Iterator[IO[Any]]:
    """A file to write `path` through (text, or bytes when `binary`): a temporary file beside it, renamed
    over `path` (os.replace) only when the block ends without an exception. Newlines are written as given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        os.fchmod(descriptor, mode)  # mkstemp makes it private; these files are read by people and tools
        with os.fdopen(descriptor, "wb") if binary else os.fdopen(descriptor, "w", newline="") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_text_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    with open_atomically(path, mode) as handle:
        handle.write(text)


def write_zip_atomically(path: Path, entries: Iterable[tuple[str, bytes | str, int]]) -> None:
    """A zip of `entries`, each (name, contents, file mode), deflated, with fixed timestamps (the same
    entries give the same bytes), written atomically."""
    with open_atomically(path, binary=True) as handle, zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, contents, mode in entries:
            info = zipfile.ZipInfo(name, ZIP_TIME)
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, contents)
