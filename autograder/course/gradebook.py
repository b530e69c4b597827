"""The class's scores in nbgrader's gradebook, through nbgrader's own API (`nbgrader.api.Gradebook`).

The database is the one nbgrader's own commands use: `CourseDirectory.db_url` from the course's
`nbgrader_config.py` (SQLite `gradebook.db` in the course folder by default; any SQLAlchemy URL
there, or `--db URL`). What is recorded, so that `nbgrader export` gives the totals we give:

- the assignment `mha` with its notebook `mha` and one grade cell per part of the rubric, named by
  the part id, with the part's points: the release's autograder-test cells have exactly these
  grade_ids and points (the release is generated from the rubric), so nbgrader's view of the
  notebook and ours agree;
- every student of the roster, and a submission for everyone who submitted a file;
- each part's score as that grade cell's auto score. A run that could not grade leaves the auto
  scores empty and marks the cells for manual grading, so the formgrader shows them. An
  instructor's manual score in the formgrader is never touched (nbgrader counts it over ours).

Every `grade-class` run writes every student's scores again, so a gradebook that another command
changed (`nbgrader autograde` records its own scores) agrees with the record again afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autograder.atomic import write_text_atomically
from autograder.contract import ASSIGNMENT
from autograder.course.rows import Row, graded_parts
from autograder.course.store import COURSE_FILE_MODE, Record, sha256_file
from autograder.rubric import Rubric

CONFIG_FILE = "nbgrader_config.py"
EXPORT_FILE = "nbgrader-grades.csv"
# What `grade-class` writes into a course folder that has no nbgrader configuration of its own.
CONFIG_TEMPLATE = f'''"""nbgrader's configuration for this course folder (written by `grade-class`, which found none).

`grade-class` writes grades.csv here (per-part scores and each student's status); `nbgrader export`
would overwrite it by default, so its CSV goes to a file of its own, {EXPORT_FILE}.
"""
import importlib.util
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config when it loads this file)

# The course directory is the folder of this file, wherever nbgrader is started from.
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(c.CourseDirectory.root, "gradebook.db")
c.ExportPlugin.to = os.path.join(c.CourseDirectory.root, "{EXPORT_FILE}")
# nbgrader's CSV export with every cell cleaned (no formulas), where the grader is installed (found, not
# imported: importing it imports nbgrader, seconds, each time this file is read)
if importlib.util.find_spec("autograder") is not None:
    c.ExportApp.plugin_class = "autograder.course.nbgrader_export.SafeCsvExportPlugin"
'''


class GradebookError(RuntimeError):
    """The gradebook cannot be written; the message says why."""


def ours_unchanged(path: Path) -> bool:
    """Whether the course's nbgrader_config.py is the one `grade-class` writes, as written."""
    try:
        return path.read_text(errors="replace") == CONFIG_TEMPLATE
    except OSError:
        return False


def course_settings(course: Path) -> tuple[str, str]:
    """(db_url, course_id) as nbgrader's own commands see them for this course folder: its
    nbgrader_config.py, else nbgrader's defaults (importing nbgrader itself takes seconds, so the
    defaults of `nbgrader.coursedir.CourseDirectory` are repeated here)."""
    if ours_unchanged(course / CONFIG_FILE):  # what loading it would give, without importing nbgrader
        return "sqlite:///" + os.path.join(os.path.abspath(course), "gradebook.db"), ""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = Config()
    if (course / CONFIG_FILE).is_file():
        config = PyFileConfigLoader(CONFIG_FILE, path=str(course)).load_config()
    settings = config.get("CourseDirectory", {})
    root = settings.get("root") or str(course.resolve())
    db_url = settings.get("db_url") or "sqlite:///{}".format(os.path.abspath(os.path.join(root, "gradebook.db")))
    return db_url, settings.get("course_id", "")


def ensure_configuration(course: Path) -> str:
    """Make `nbgrader export` in the course folder harmless to grades.csv: write an nbgrader_config.py
    where there is none (its export goes to nbgrader-grades.csv); where there is one that leaves the
    export at its default (grades.csv), say so. Returns what to tell the instructor ("" if nothing)."""
    course = Path(course)
    path = course / CONFIG_FILE
    if not path.exists():
        write_text_atomically(path, CONFIG_TEMPLATE, COURSE_FILE_MODE)
        return (
            f"wrote {path}: nbgrader's commands use this course's gradebook, and `nbgrader export` writes {EXPORT_FILE}"
        )
    if ours_unchanged(path):  # nothing to load (loading it imports nbgrader, a second or more)
        return ""
    from traitlets.config.loader import PyFileConfigLoader

    try:
        target = PyFileConfigLoader(CONFIG_FILE, path=str(course)).load_config().get("ExportPlugin", {}).get("to")
    except Exception as exc:  # a configuration nbgrader itself could not load: say so, change nothing
        return f"{path} could not be read ({type(exc).__name__}: {exc}); nbgrader's commands will fail there too"
    if not target or Path(course, target).resolve() == (course / "grades.csv").resolve():
        return (
            f"{path} leaves `nbgrader export` writing grades.csv, over ours: add "
            f'c.ExportPlugin.to = "{EXPORT_FILE}" to it'
        )
    return ""


def sqlite_path(db_url: str) -> Path | None:
    return Path(db_url.removeprefix("sqlite:///")) if db_url.startswith("sqlite:///") else None


def state(db_url: str, rows: list[Row], rubric: Rubric) -> dict[str, Any]:
    """What the gradebook was last written from, and the SQLite file's hash after writing it."""
    scores = [
        [r.student, r.status, r.entry.file.name if r.entry.file else None, r.part_scores(), str(r.entry.timestamp)]
        for r in rows
    ]
    digest = hashlib.sha256(
        json.dumps([db_url, scores, {p: rubric.part_points(p) for p in rubric.parts}], sort_keys=True).encode()
    ).hexdigest()
    path = sqlite_path(db_url)
    return {
        "db_url": db_url,
        "scores": digest,
        "database": sha256_file(path) if path is not None and path.is_file() else None,
    }


def record_grades(
    course: Path, rows: list[Row], rubric: Rubric, db_url: str | None = None, assignment: str = ASSIGNMENT
) -> str:
    """Write the roster's students and scores into the gradebook; return its URL. Skipped when the
    scores are those last written and the SQLite file is as we left it (byte for byte); any other
    database is written every time."""
    course = Path(course)
    configured_url, course_id = course_settings(course)
    db_url = db_url or configured_url
    stamp_path = Record(course).root / ".gradebook.json"
    before = state(db_url, rows, rubric)
    try:
        last = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        last = None
    if before["database"] is not None and last == before:
        keep_private(db_url)
        return db_url
    write_grades(db_url, course_id, rows, rubric, assignment)
    keep_private(db_url)
    write_text_atomically(stamp_path, json.dumps(state(db_url, rows, rubric), sort_keys=True) + "\n", COURSE_FILE_MODE)
    return db_url


def keep_private(db_url: str) -> None:
    """A SQLite gradebook of ours gets the mode of every course output (SQLite makes it by the umask)."""
    path = sqlite_path(db_url)
    try:
        if (
            path is not None
            and path.stat().st_uid == os.geteuid()
            and (path.stat().st_mode & 0o777) != COURSE_FILE_MODE
        ):
            os.chmod(path, COURSE_FILE_MODE)
    except OSError:
        pass


@contextlib.contextmanager
def opened(db_url: str, course_id: str) -> Iterator[Any]:
    """nbgrader's `Gradebook` on `db_url`, made (tables and alembic's version) where it is missing, quiet."""
    from nbgrader.api import Gradebook

    logging.getLogger("nbgrader").setLevel(logging.WARNING)
    with contextlib.redirect_stderr(io.StringIO()):
        stamp_new_database(db_url)  # so `Gradebook` never starts `alembic` (it would only for a new database)
        with Gradebook(db_url, course_id) as gradebook:
            yield gradebook


def alembic_head() -> str:
    """The revision of nbgrader's newest gradebook schema, read from its migration scripts (alembic's
    `ScriptDirectory`, in this process). nbgrader asks the same of an `alembic heads` it starts, which imports
    all of nbgrader again: three seconds of CPU that a class run spent while it graded."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    config = Config()
    config.set_main_option("script_location", ALEMBIC_DIR)
    head = ScriptDirectory.from_config(config).get_current_head()
    if head is None:
        raise RuntimeError("nbgrader's migration scripts name no head revision")
    return head


def stamp_new_database(db_url: str) -> None:
    """Where `db_url` has no table yet, record alembic's version as nbgrader's `Gradebook` would on making it
    (a table `alembic_version` holding the head revision); `Gradebook` then finds a database that exists,
    makes the missing tables and leaves the version as it is."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(db_url, future=True)
    try:
        if inspect(engine).get_table_names():
            return
        head = alembic_head()
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            connection.execute(text("INSERT INTO alembic_version (version_num) VALUES (:head)"), {"head": head})
    finally:
        engine.dispose()


def make_ahead(course: Path, db_url: str | None = None) -> None:
    """Import nbgrader and, where the course's gradebook is a SQLite file that does not exist yet, make it
    (empty): seconds that a class run spends while it grades (`class_outputs.OutputsAhead`) rather than after.
    `record_grades` then writes into it as into any existing gradebook."""
    configured_url, course_id = course_settings(Path(course))
    db_url = db_url or configured_url
    path = sqlite_path(db_url)
    if path is None or path.exists():
        import nbgrader.api  # noqa: F401  # imported ahead: a second or two

        return
    with opened(db_url, course_id):
        pass
    keep_private(db_url)


def write_grades(db_url: str, course_id: str, rows: list[Row], rubric: Rubric, assignment: str) -> None:
    from nbgrader.api import Grade, InvalidEntry, MissingEntry
    from sqlalchemy.exc import SQLAlchemyError

    parts = [p for p in graded_parts(rubric) if rubric.part_points(p) > 0]
    try:
        with opened(db_url, course_id) as gradebook:
            gradebook.update_or_create_assignment(assignment)
            gradebook.update_or_create_notebook(assignment, assignment)
            cells = {
                part: gradebook.update_or_create_grade_cell(
                    part, assignment, assignment, cell_type="code", max_score=rubric.part_points(part)
                )
                for part in parts
            }
            for row in rows:
                try:
                    gradebook.find_student(row.student)
                except MissingEntry:
                    gradebook.add_student(row.student)
                if not row.entry.has_file:
                    continue
                stamp = row.entry.timestamp  # read by the roster, bounded (`roster.read_timestamp`)
                submission = gradebook.update_or_create_submission(
                    assignment, row.student, **({"timestamp": stamp} if stamp else {})
                )
                notebook = next(n for n in submission.notebooks if n.name == assignment)
                grades = {g.name: g for g in notebook.grades}
                scores = row.part_scores()
                for part, cell in cells.items():
                    grade = grades.get(part)
                    if grade is None:  # a cell added after the submission was first recorded
                        grade = Grade(cell_id=cell.id, notebook=notebook)
                        gradebook.db.add(grade)
                    grade.auto_score = scores.get(part, 0.0) if row.scored else None
                    grade.needs_manual_grade = not row.scored
            gradebook.db.commit()
    except (SQLAlchemyError, InvalidEntry, OSError) as exc:
        raise GradebookError(f"{db_url}: {exc}") from None
