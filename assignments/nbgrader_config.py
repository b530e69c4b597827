"""nbgrader's configuration for this course directory, which holds the `mha` assignment.

`make release` (autograder/authoring/release.py) runs nbgrader with a throwaway gradebook; the default
gradebook below is the one `make grade` fills (any SQLAlchemy URL can replace it).
"""

import importlib.util
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config when it loads this file)

# The course directory is the folder of this file, wherever nbgrader is started from.
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(c.CourseDirectory.root, "gradebook.db")
# `make grade` writes grades.csv here (per-part scores and each student's status); `nbgrader export`
# would overwrite it by default, so its CSV goes to a file of its own.
c.ExportPlugin.to = os.path.join(c.CourseDirectory.root, "nbgrader-grades.csv")
# nbgrader's CSV export with every cell cleaned (no formulas), where the grader is installed (found, not
# imported: importing it imports nbgrader, seconds, each time this file is read)
if importlib.util.find_spec("autograder") is not None:
    c.ExportApp.plugin_class = "autograder.course.nbgrader_export.SafeCsvExportPlugin"
