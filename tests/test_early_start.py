"""`python -m autograder grade` starts the grading's three workers before it imports torch, pytest and the
checks (`grading.workers.EarlyStart`): the grading adopts them only where they were started as it would
start them itself, runs nothing of the submission before a check asks, and closes what it did not adopt."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from autograder.grading import devices, workers
from autograder.grading.grade import Options, grade_submission
from autograder.sandbox import bwrap
from helpers import REFERENCE

SPEED_ONLY = ("speed",)


@pytest.fixture(autouse=True)
def own_timing_lock(tmp_path, monkeypatch):
    """The gradings here time in a lock folder of their own: another grading on the machine (another
    checkout's class, another test run) holding the machine's timing lock would make them "cannot time now"
    (`lock_seconds`), which is not what they are about."""
    folder = tmp_path / "timing-locks"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(devices.TIMING_LOCK_FOLDER_VARIABLE, str(folder))


def begin(path=REFERENCE, parts=SPEED_ONLY, **changes) -> workers.EarlyStart:
    settings = dict(device="cpu", rubric_path=None, isolation="auto", out=None, parts=parts)
    settings.update(changes)
    early = workers.EarlyStart.begin(path, **settings)
    assert early is not None and early.worker is not None and early.worker.prestarted
    return early


def test_without_torch_the_expected_allow_list_is_the_one_torch_leaves():
    """The early workers' sandbox is made before the grader imports torch (`grading/workers.py` imports neither
    torch nor pytest); here (a virtualenv of pip's torch), what it shows is what `allow_list` finds once
    torch is loaded, so the early workers are used."""
    probe = (
        "import json, sys; import autograder.grading.workers; from autograder.sandbox import bwrap; "
        "expected = bwrap.expected_allow_list(); loaded = [m for m in ('torch', 'pytest') if m in sys.modules]; "
        "print(json.dumps([loaded, expected == bwrap.allow_list()]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [[], True]


def test_a_grading_adopts_the_early_workers_and_loads_the_file_only_when_a_check_asks(tmp_path, monkeypatch):
    """The events themselves are watched (what `adopt` and `timing_for` handed over), not the speed verdict:
    how fast the reference runs beside a busy machine's other work is the speed part's business
    (tests/test_speed_verdicts.py), not this test's."""
    handed = []
    timing_for = workers.EarlyStart.timing_for
    monkeypatch.setattr(
        workers.EarlyStart, "timing_for", lambda self, config: handed.append(timing_for(self, config)) or handed[-1]
    )
    early = begin()
    worker, timing_workers = early.worker, dict(early.timing)
    assert set(timing_workers) == {workers.WRAPPER, workers.REFERENCE}
    assert worker.load_report is None and worker.starts == 0  # Python and torch only, so far
    run = grade_submission(REFERENCE, Options(device="cpu", out=None, parts=SPEED_ONLY, early=early))
    assert run.graded and [c.part for c in run.checks] == ["speed"] and run.speed is not None, run.reason
    # the grading timed with the early timing workers and loaded the file in the early worker, then closed them
    assert handed == [timing_workers] and all(handed[0][k] is timing_workers[k] for k in timing_workers)
    assert worker.starts == 1 and worker.load_report is not None and run.worker_starts == 1
    assert worker.process is None and all(t.worker.process is None for t in timing_workers.values())
    assert early.worker is None and early.timing == {}


@pytest.mark.parametrize("differs", ["settings", "allow list", "file"])
def test_early_workers_started_otherwise_than_the_grading_would_are_closed_unused(tmp_path, differs):
    """Another rubric's limits, a sandbox showing other folders than torch's, another file: the grading starts
    its own workers, and the early ones end without having loaded anything."""
    early = begin()
    if differs == "settings":
        early.config = dataclasses.replace(early.config, request_seconds=early.config.request_seconds + 1)
    elif differs == "allow list":
        shown = early.allowed or bwrap.allow_list()
        early.allowed = dataclasses.replace(shown, binds=(*shown.binds, str(tmp_path)))
    else:
        early.worker.filename = "other.py"
    worker, timing_workers = early.worker, dict(early.timing)
    run = grade_submission(REFERENCE, Options(device="cpu", out=None, parts=SPEED_ONLY, early=early))
    assert run.graded and [c.status for c in run.checks] == ["passed"], run.reason
    assert worker.load_report is None and worker.process is None  # never used, and gone
    if differs != "file":  # the timing workers were started like the grading's own: only a change of setting
        assert all(t.worker.process is None for t in timing_workers.values())
    assert early.worker is None and early.timing == {}


def test_a_submission_that_cannot_be_graded_leaves_no_early_worker(tmp_path):
    early = begin()
    worker, timing_workers = early.worker, dict(early.timing)
    run = grade_submission(REFERENCE, Options(device="cpu", out=None, parts=("no-such-part",), early=early))
    assert not run.graded and "no such part" in run.reason
    assert worker.process is None and all(t.worker.process is None for t in timing_workers.values())


def test_nothing_starts_early_for_a_missing_file_or_a_broken_rubric(tmp_path):
    broken = tmp_path / "rubric.toml"
    broken.write_text("this is not toml = = =")
    assert (
        workers.EarlyStart.begin(
            tmp_path / "missing.py", device="cpu", rubric_path=None, isolation="auto", out=None, parts=None
        )
        is None
    )
    assert (
        workers.EarlyStart.begin(REFERENCE, device="cpu", rubric_path=broken, isolation="auto", out=None, parts=None)
        is None
    )


def test_only_the_submissions_worker_starts_early_when_the_speed_part_is_not_graded():
    early = begin(parts=("combine",))
    try:
        assert early.timing == {}
    finally:
        early.close()
    assert early.worker is None


def test_the_command_line_adopts_its_early_workers(tmp_path, monkeypatch):
    """`grade` from the command line: the workers it started early are the ones the grading uses."""
    from autograder import cli

    adopted = []
    adopt = workers.EarlyStart.adopt

    def watched(self, *args, **kwargs):
        adopted.append(adopt(self, *args, **kwargs))
        return adopted[-1]

    monkeypatch.setattr(workers.EarlyStart, "adopt", watched)
    out = tmp_path / "results.json"
    code = cli.main(["grade", str(REFERENCE), "--out", str(out), "--quiet", "--device", "cpu", "--part", "combine"])
    assert code == 0 and json.loads(out.read_text())["extra_data"]["status"] == "graded"
    assert len(adopted) == 1 and adopted[0] is not None and adopted[0].process is None
