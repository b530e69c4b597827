"""The student kit: what students receive, and nothing of the answer key.

`python -m autograder student-kit --out dist` (`make student-kit`) writes `dist/mha-student-kit/` and
`dist/mha-student-kit.zip` with:

- `mha.ipynb` and `mha.py`: the release (`make release` makes them from reference/mha.py with every
  solution region replaced by a stub);
- `selfcheck.py`: runs the notebook's self-checks part by part (`autograder/authoring/selfcheck.py`, standard
  library only), the students' local check;
- `Makefile` with `make check`, and a short `README.md`.

Before anything is written, every file is searched for every line of a solution region of
reference/mha.py (lines that also occur outside a solution region are not secret); a kit that would
hold one is refused. The zip is deterministic (sorted names, fixed timestamps).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autograder.atomic import write_text_atomically, write_zip_atomically
from autograder.authoring.release import ASSIGNMENT, SOLUTION_BEGIN, SOLUTION_END, default_root
from autograder.rubric import load_rubric

KIT_NAME = f"{ASSIGNMENT}-student-kit"

README = """# Parallel attention heads: the {assignment} assignment

Files:

- `{assignment}.ipynb`: the assignment, to open in Jupyter (or VS Code, or Colab);
- `{assignment}.py`: the same cells as a plain Python file (`# %%` marks a cell), for an editor;
- `selfcheck.py`: runs the self-checks, part by part;
- `Makefile`: `make check` runs `selfcheck.py` on your file.

## What to do

1. Work in **one** of the two files. Replace every `raise NotImplementedError()` with your code, and
   answer the two questions by setting `HEADS_RUN` and `OUTPUT_SHAPE_STEP` to a letter.
2. Each part ends with a self-check cell; leave those cells as they are. Run them in the notebook,
   or all at once:

   ```sh
   python selfcheck.py {assignment}.ipynb      # or: python selfcheck.py {assignment}.py, or: make check
   ```

   A part reads `passed`, `not done yet` (a stub is still there) or `failed` with what went wrong.
3. Submit that one file, named `{assignment}.ipynb` or `{assignment}.py`.

You need Python 3.10 or newer and PyTorch (`pip install torch`), plus Jupyter for the notebook.

## How it is graded

The grader runs your file in a sandbox and checks each part on inputs and weights you do not see
(several sizes, head counts and dtypes), that outputs keep the input's shape conventions, dtype and
device, that gradients flow, that your parallel `MultiHeadAttention` really computes every head in
one pass, and how much faster it is than the wrapper. The self-checks are a first test, not the
grade: passing them does not guarantee full marks. Your feedback names the likely mistake for
each check that fails.

Time limits: when the grader loads your file, each top-level cell may run {cell:g} s (once one has
been stopped, the later ones {later:g} s each), so keep long experiments out of the file you submit.
Each call the grader makes into your code (a forward, a function) may run {request:g} s, and
{hung:g} s once your file has hung somewhere; the checks' inputs are small, so a right answer takes
milliseconds. Code that does not finish in time earns nothing for that check and is not called
again.
"""

MAKEFILE = """PYTHON ?= python3
SUBMISSION ?= $(firstword $(wildcard {assignment}.ipynb) {assignment}.py)

.PHONY: check
check:
\t$(PYTHON) selfcheck.py "$(SUBMISSION)"
"""


class KitError(RuntimeError):
    """The kit cannot be built; the message says why."""


def solution_lines(reference: Path) -> set[str]:
    """Every stripped line of a solution region that does not also occur outside one."""
    inside, secret, public = False, set(), set()
    for line in reference.read_text().splitlines():
        text = line.strip()
        if SOLUTION_BEGIN in text:
            inside = True
        elif SOLUTION_END in text:
            inside = False
        elif text:
            (secret if inside else public).add(text)
    return secret - public


def text_lines(name: str, data: bytes) -> set[str]:
    """The stripped lines of a kit file; a notebook's are those of its cells' sources and outputs."""
    text = data.decode("utf-8", errors="replace")
    lines = set()
    if name.endswith(".ipynb"):
        for cell in json.loads(text).get("cells", []):
            lines.update(line.strip() for line in "".join(cell.get("source", "")).splitlines())
            for output in cell.get("outputs", []):
                lines.update(line.strip() for line in "".join(output.get("text", "")).splitlines())
    lines.update(line.strip() for line in text.splitlines())
    return lines


def kit_files(root: Path) -> dict[str, bytes]:
    release = root / "assignments" / "release" / ASSIGNMENT
    files = {}
    for name in (f"{ASSIGNMENT}.ipynb", f"{ASSIGNMENT}.py"):
        if not (release / name).is_file():
            raise KitError(f"{release / name} is missing: run `make release` first")
        files[name] = (release / name).read_bytes()
    files["selfcheck.py"] = (Path(__file__).with_name("selfcheck.py")).read_bytes()
    limits = load_rubric().limit
    files["README.md"] = README.format(
        assignment=ASSIGNMENT,
        cell=limits("cell_seconds"),
        later=limits("later_cell_seconds"),
        request=limits("request_seconds"),
        hung=limits("hung_request_seconds"),
    ).encode()
    files["Makefile"] = MAKEFILE.format(assignment=ASSIGNMENT).encode()
    return files


def leaks(files: dict[str, bytes], secret: set[str]) -> list[str]:
    found = []
    for name, data in files.items():
        for line in sorted(text_lines(name, data) & secret):
            found.append(f"{name}: {line}")
    return found


def build_kit(out: Path, root: Path | None = None) -> Path:
    """Write the kit folder and its zip under `out`; return the zip's path."""
    root = Path(root) if root else default_root()
    files = kit_files(root)
    found = leaks(files, solution_lines(root / "reference" / f"{ASSIGNMENT}.py"))
    if found:
        raise KitError(
            "the kit would hold solution code; run `make release` and check the release:\n  " + "\n  ".join(found[:10])
        )
    out = Path(out)
    folder = out / KIT_NAME
    if folder.exists():
        shutil.rmtree(folder)
    for name, data in files.items():
        write_text_atomically(folder / name, data.decode("utf-8"))
    archive = out / f"{KIT_NAME}.zip"
    write_zip_atomically(archive, [(f"{KIT_NAME}/{name}", files[name], 0o644) for name in sorted(files)])
    print(f"student kit: {folder}/ and {archive} ({', '.join(sorted(files))}); no solution line in it")
    return archive
