"""bubblewraps of other versions than the one installed, for the tests of `bwrap.features`.

- `debian_bullseye()`: the real bubblewrap 0.4.1, Debian 11's package, fetched with apt-get (a sources list of
  its own, checked with Debian's keyring) and unpacked under `CACHE`: it has none of `--perms`, `--size` and
  `--disable-userns`.
- `emulated(version)`: a `bwrap` script standing for an older release over the installed bubblewrap: it says
  that version (`--version`), lists the installed one's options less those the release lacks (`--help`),
  refuses them as bubblewrap refuses an option it does not know ("bwrap: Unknown option --size", exit 1), and
  runs the installed one for everything else. What a release lacks is dated by `bwrap.NEWER_OPTIONS`, the
  options the grader's command uses; options it never uses are left as the installed one has them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from autograder.sandbox.bwrap import NEWER_OPTIONS

CACHE = Path("/var/tmp/mha-exercise-bwrap")  # readable by every user: the normal-user emulation runs them too
BULLSEYE = (
    "deb [signed-by=/usr/share/keyrings/debian-archive-bullseye-stable.gpg] http://deb.debian.org/debian bullseye main"
)


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def lacks(version: str) -> list[str]:
    """The options of the grader's command that bubblewrap `version` does not have."""
    return [option for option, (added, _) in NEWER_OPTIONS.items() if release(version) < release(added)]


def _folder(name: str) -> Path:
    folder = CACHE / name
    folder.mkdir(parents=True, exist_ok=True)
    for path in (CACHE, folder):
        path.chmod(0o755)
    return folder


def emulated(version: str, real: str = "/usr/bin/bwrap") -> Path:
    """A folder holding `bwrap`, bubblewrap `version` as emulated over `real`."""
    folder = _folder(f"emulated-{version}")
    missing = lacks(version)
    pattern = "|".join(missing) or "--no-such-option-at-all"
    script = f"""#!/bin/sh
# bubblewrap {version}, emulated over {real}: it lacks {", ".join(missing) or "nothing the grader uses"}
case "$1" in
    --version) echo "bubblewrap {version}"; exit 0 ;;
    --help) {real} --help | grep -v -E -- '^ +({pattern}) '; exit 0 ;;
esac
for argument in "$@"; do
    case "$argument" in
        --) break ;;
        {pattern}) echo "bwrap: Unknown option $argument" >&2; exit 1 ;;
    esac
done
exec {real} "$@"
"""
    path = folder / "bwrap"
    path.write_text(script)
    path.chmod(0o755)
    return folder


def debian_bullseye() -> Path | None:
    """A folder holding Debian 11's bubblewrap 0.4.1 as `bwrap`, or None when it cannot be fetched here."""
    folder = _folder("debian-bullseye")
    binary = folder / "bwrap"
    if binary.exists():
        return folder
    if os.geteuid() != 0 or not shutil.which("apt-get") or not Path(BULLSEYE.split("=")[1].split("]")[0]).exists():
        return None
    apt = folder / "apt"
    (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list").write_text(BULLSEYE + "\n")
    options = [
        f"-o=Dir::Etc::SourceList={apt / 'sources.list'}",
        "-o=Dir::Etc::SourceParts=/dev/null",
        f"-o=Dir::State::Lists={apt / 'lists'}",
        f"-o=Dir::Cache={apt}",
        "-o=Dir::State::status=/dev/null",
        "-o=APT::Sandbox::User=root",
    ]
    for command in (["apt-get", *options, "update", "-qq"], ["apt-get", *options, "download", "bubblewrap=0.4.1-3"]):
        if subprocess.run(command, cwd=apt, capture_output=True, timeout=600).returncode != 0:
            return None
    package = next(apt.glob("bubblewrap_0.4.1*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(package), str(apt / "unpacked")], check=True)
    shutil.copy2(apt / "unpacked" / "usr" / "bin" / "bwrap", binary)
    binary.chmod(0o755)
    return folder
