"""The grader forks from several threads (the reference's timing workers start in threads of their own while
the main thread imports torch). A module that registers a fork hook with a parent's half (`before`,
`after_in_parent`: logging's lock, concurrent.futures' shutdown lock) while another thread is inside a fork
gets only that half run: the parent then releases a lock it never took, and the interpreter prints
"Exception ignored in: <function _releaseLock ...> RuntimeError: cannot release un-acquired lock" on the
grader's stderr (seen in CI, about one grading in a few thousand). So every such module is imported before
the grader's first thread starts (`autograder.sandbox`), and this test holds the grader to it: it wraps
`os.register_at_fork` in a grading of the reference and fails on any such registration made while more than
one thread runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import REFERENCE, ROOT

WRAPPER = textwrap.dedent(
    """
    import json, os, runpy, sys, threading, traceback

    report = sys.argv.pop(1)
    register = os.register_at_fork

    def watched(**hooks):
        if ("before" in hooks or "after_in_parent" in hooks) and threading.active_count() > 1:
            names = {key: getattr(value, "__qualname__", repr(value)) for key, value in hooks.items()}
            where = "".join(traceback.format_stack(limit=8))
            line = {"threads": threading.active_count(), "hooks": names, "where": where}
            with open(report, "a") as handle:  # now: the grader may end without the interpreter's teardown
                handle.write(json.dumps(line) + "\\n")
        return register(**hooks)

    os.register_at_fork = watched
    sys.argv[0] = "autograder"
    runpy.run_module("autograder", run_name="__main__", alter_sys=True)
    """
)


@pytest.mark.slow
def test_no_fork_hook_with_a_parents_half_is_registered_once_the_grader_runs_threads(tmp_path: Path):
    report = tmp_path / "late-hooks.jsonl"
    out = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(report), "grade", str(REFERENCE), "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    results = json.loads(out.read_text())
    assert run.returncode == 0 and results["score"] == results["max_score"], (run.stderr, results.get("output"))
    late = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    assert not late, "registered while other threads may be forking:\n" + "\n".join(
        f"{entry['hooks']} with {entry['threads']} threads, at\n{entry['where']}" for entry in late
    )
    assert "Traceback" not in run.stderr, run.stderr
