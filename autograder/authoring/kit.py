"""The student kit: what students receive, and nothing of the answer key.

`python -m autograder student-kit --out dist` (`make student-kit`) writes `dist/mha-student-kit/` and
`dist/mha-student-kit.zip` with:

- `mha.ipynb` and `mha.py`: the release (`make release` makes them from reference/mha.py with every
  solution region replaced by a stub);
- `selfcheck.py`: runs the notebook's self-checks part by part (`autograder/authoring/selfcheck.py`, standard
  library only), the students' local check;
- `requirements.txt`: the grader's torch (its TORCH_SPEC, default the Makefile's) and numpy (requirements.lock,
  every Python's pin with its environment marker, so that pip installs the grader's numpy on each);
- `Makefile` with `make setup` and `make check`, and a short `README.md`.

Before anything is written, every file is searched for every line of a solution region of
reference/mha.py (lines that also occur outside a solution region are not secret); a kit that would
hold one is refused. The zip is deterministic (sorted names, fixed timestamps).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

from autograder.atomic import write_text_atomically, write_zip_atomically
from autograder.authoring.release import SOLUTION_BEGIN, SOLUTION_END, default_root
from autograder.contract import ASSIGNMENT
from autograder.rubric import load_rubric

KIT_NAME = f"{ASSIGNMENT}-student-kit"

README = """# Parallel attention heads: the {assignment} assignment

Files:

- `{assignment}.ipynb`: the assignment, to open in Jupyter (or VS Code, or Colab);
- `{assignment}.py`: the same cells as a plain Python file (`# %%` marks a cell), for an editor;
- `selfcheck.py`: runs the self-checks, part by part;
- `requirements.txt`: the versions of torch and numpy the grader runs;
- `Makefile`: `make setup` and `make check`, the steps below in two commands.

## Set up (once)

You need Python 3.10 or newer. Make a virtual environment in this folder and install the grader's
versions of torch and numpy into it (another torch may round differently, and a numpy of another
series warns on every run):

- {torch_words}
- {numpy_words}

```sh
python3 -m venv .venv
. .venv/bin/activate                      # Windows: .venv\\Scripts\\activate
python -m pip install -r requirements.txt
python -m pip install notebook            # only to work in {assignment}.ipynb in Jupyter
```

(`make setup` makes `.venv` and installs requirements.txt into it.) On Linux without a GPU,
`python -m pip install -r requirements.txt --index-url https://download.pytorch.org/whl/cpu
--extra-index-url https://pypi.org/simple` downloads a much smaller torch that computes the same.

## What to do

1. Work in **one** of the two files. Replace every `raise NotImplementedError()` with your code, and
   answer the two questions by setting `HEADS_RUN` and `OUTPUT_SHAPE_STEP` to a letter. Keep the given
   code as it is, constructors included: the grader loads its weights into the attributes they make.
2. Each part ends with a self-check cell; leave those cells as they are. Run them in the notebook,
   or all at once, in the virtual environment:

   ```sh
   make check                    # the file you work in (make check SUBMISSION=... for another)
   python selfcheck.py {assignment}.py    # the same, naming the file
   ```

   Its last line says how many parts passed. `make check` exits 0 whenever the self-checks ran,
   whatever they found, and 2 when they could not run (no file, no torch); `python selfcheck.py`
   exits 0 when every part passed (or is answered), 1 while one is not, 2 when it could not run.

   With no file named, it says which file it checks: the one with fewer stubs left (with as many,
   the one changed last). Each part reads:

   - `passed`;
   - `waiting`: its code looks right, but its result depends on a part that is not right yet,
     which the message names;
   - `answered`: the questions, whose answers only the grader knows;
   - `not done yet`: a stub is still there;
   - `failed`, with what went wrong and where: `File "<{assignment}.py, cell 41>", line 187` is cell 41
     of the file (markdown cells count, from 1) and line 187 of the file (of the cell, in a
     notebook): the place the grader's feedback names too.
3. Submit that one file, named `{assignment}.ipynb` or `{assignment}.py`.

## How it is graded

The grader runs your file in a sandbox and checks each part on inputs and weights you do not see
(several sizes, head counts and dtypes), that outputs keep the input's shape conventions, dtype and
device, that gradients flow, that nothing is cached between calls, that dropout acts once on the
attention weights, that your parallel `MultiHeadAttention` really computes every head in one pass,
and how much faster it is than the wrapper. The self-checks are a first test, not the grade: they
look at the book's example and a few small cases, and some of these requirements only the grader
checks. Your feedback names the likely mistake for each check that fails.

Time limits: when the grader loads your file, each top-level cell may run {cell:g} s (once one has
been stopped, the later ones {later:g} s each), so keep long experiments out of the file you submit.
Each call the grader makes into your code (a forward, a function) may run {request:g} s, and
{hung:g} s once your file has hung somewhere; the checks' inputs are small, so a right answer takes
milliseconds. Code that does not finish in time earns nothing for that check and is not called
again.
"""

REQUIREMENTS = """# The versions the grader runs: torch from its TORCH_SPEC, numpy from its requirements.lock
# (pip installs the line whose marker fits your Python).
{torch}
{numpy}
"""

MAKEFILE = """PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
# empty: selfcheck.py checks the one of {assignment}.ipynb and {assignment}.py worked in, and says which
SUBMISSION ?=

.PHONY: setup check
setup:
\tpython3 -m venv .venv
\t.venv/bin/python -m pip install -r requirements.txt

# exit 0 whenever the self-checks ran (the last line says how many passed), 2 when they could not run
check:
\t@$(PYTHON) selfcheck.py $(SUBMISSION) || [ $$? -eq 1 ]
"""


class KitError(RuntimeError):
    """The kit cannot be built; the message says why."""


def solution_lines(reference: Path) -> set[str]:
    """Every stripped line of a solution region that does not also occur outside one."""
    inside, secret, public = False, set[str](), set[str]()
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
    lines: set[str] = set()
    if name.endswith(".ipynb"):
        for cell in json.loads(text).get("cells", []):
            lines.update(line.strip() for line in "".join(cell.get("source", "")).splitlines())
            for output in cell.get("outputs", []):
                lines.update(line.strip() for line in "".join(output.get("text", "")).splitlines())
    lines.update(line.strip() for line in text.splitlines())
    return lines


def torch_requirement(spec: str) -> str:
    """TORCH_SPEC ('torch==2.13.0+cpu --index-url URL') as a requirement a student installs: 'torch==2.13.0'."""
    requirement = next((word for word in shlex.split(spec) if word.startswith("torch")), "")
    if "==" not in requirement:
        raise KitError(f"TORCH_SPEC must pin torch with ==, got {spec!r}")
    return requirement.split("+", 1)[0]


def makefile_torch_spec(root: Path) -> str:
    """The Makefile's default TORCH_SPEC (`TORCH_SPEC ?= ...`), the torch `make setup` installs."""
    for line in (root / "Makefile").read_text().splitlines():
        name, _, value = line.partition("?=")
        if name.strip() == "TORCH_SPEC":
            return value.strip()
    raise KitError(f"{root / 'Makefile'} sets no TORCH_SPEC")


def locked(root: Path, package: str) -> list[str]:
    """`package==version ; marker` as requirements.lock pins it, one line per pin (one per range of Pythons)."""
    pins = [
        line.strip()
        for line in (root / "requirements.lock").read_text().splitlines()
        if line.lower().startswith(f"{package}==")
    ]
    if not pins:
        raise KitError(f"requirements.lock pins no {package}")
    return pins


MARKER = re.compile(r"python_(?:full_)?version\s*(<=|>=|<|>|==)\s*['\"]([\d.]+)['\"]")
MARKER_WORDS = {"<": "before {}", "<=": "up to {}", ">": "after {}", ">=": "{} and newer", "==": "{}"}


def plain(pins: list[str]) -> str:
    """Pins as a person reads them: 'numpy 2.2.6 (Python before 3.11) or 2.4.6 (Python 3.11 and newer)'."""
    said: list[str] = []
    for pin in pins:
        requirement, _, marker = pin.partition(";")
        name, _, version = requirement.strip().partition("==")
        found = MARKER.fullmatch(marker.strip())
        where = f" (Python {MARKER_WORDS[found.group(1)].format(found.group(2))})" if found else ""
        if marker.strip() and not found:
            where = f" (where {marker.strip()})"
        said.append(f"{version}{where}" if said else f"{name} {version}{where}")
    return " or ".join(said)


def kit_files(root: Path, torch_spec: str | None = None) -> dict[str, bytes]:
    release = root / "assignments" / "release" / ASSIGNMENT
    files = {}
    for name in (f"{ASSIGNMENT}.ipynb", f"{ASSIGNMENT}.py"):
        if not (release / name).is_file():
            raise KitError(f"{release / name} is missing: run `make release` first")
        files[name] = (release / name).read_bytes()
    files["selfcheck.py"] = (Path(__file__).with_name("selfcheck.py")).read_bytes()
    torch = torch_requirement(torch_spec or makefile_torch_spec(root))
    numpy = locked(root, "numpy")
    limits = load_rubric().limits
    files["README.md"] = README.format(
        assignment=ASSIGNMENT,
        torch_words=plain([torch]),
        numpy_words=plain(numpy),
        cell=limits.cell_seconds,
        later=limits.later_cell_seconds,
        request=limits.request_seconds,
        hung=limits.hung_request_seconds,
    ).encode()
    files["requirements.txt"] = REQUIREMENTS.format(torch=torch, numpy="\n".join(numpy)).encode()
    files["Makefile"] = MAKEFILE.format(assignment=ASSIGNMENT).encode()
    return files


def leaks(files: dict[str, bytes], secret: set[str]) -> list[str]:
    found = []
    for name, data in files.items():
        for line in sorted(text_lines(name, data) & secret):
            found.append(f"{name}: {line}")
    return found


def build_kit(out: Path, root: Path | None = None, torch_spec: str | None = None) -> Path:
    """Write the kit folder and its zip under `out`; return the zip's path. `torch_spec` is the grader's
    TORCH_SPEC (default: the Makefile's)."""
    root = Path(root) if root else default_root()
    files = kit_files(root, torch_spec)
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
