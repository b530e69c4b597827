"""How the grader's commands end: without the interpreter's teardown.

Once a command has returned, everything it writes is written and every worker is closed. What a normal exit
still does is run the `atexit` handlers (the fork servers' close among them), and then tear the interpreter
down: with torch loaded, a third of a second of collecting and freeing objects whose memory the exit hands back
anyway. `end(main)` runs the command; where no thread but this one is left (a thread that is not a daemon would
be waited for), it runs the handlers itself and ends the process with `os._exit`, its output flushed; else it
exits as usual.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def end(main: Callable[[], int]) -> NoReturn:
    try:
        status = main()
    except SystemExit as stop:  # argparse's usage errors and --help, and a command that exits
        if stop.code is not None and not isinstance(stop.code, int):
            raise
        status = stop.code or 0
    if any(t is not threading.current_thread() and not t.daemon for t in threading.enumerate()):
        raise SystemExit(status)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
