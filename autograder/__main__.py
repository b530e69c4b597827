"""`python -m autograder`: the command line (`cli.main`), ended without the interpreter's teardown (`ending`)."""

from autograder.cli import main
from autograder.ending import end

end(main)
