"""The untrusted worker, from the grader's side: deadlines, crashes, restarts, limits, the sandbox."""

import time

import pytest
import torch

from autograder.sandbox.client import (
    BudgetSpent,
    LoadFailed,
    SubmissionError,
    Worker,
    WorkerConfig,
    WorkerCrashed,
    WorkerTimeout,
)
from autograder.sandbox.protocol import ModuleInfo


def worker(source: str, **config) -> Worker:
    settings = dict(load_seconds=30, request_seconds=3)
    settings.update(config)
    return Worker([(1, 1, source)], "mha.py", WorkerConfig(**settings))


@pytest.fixture
def make_worker():
    made = []

    def make(source, **config):
        made.append(worker(source, **config))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_answers_are_plain_data_and_tensors(make_worker):
    w = make_worker("import torch\ndef double(t):\n    return [t * 2, (1, 'a')]\n")
    value = w.request("call", fn="double", args=[torch.ones(2)], kwargs={})
    assert isinstance(value, list)
    assert torch.equal(value[0], torch.full((2,), 2.0))
    assert value[1] == (1, "a")


def test_a_module_the_students_code_made_is_moved_to_the_grading_device(make_worker):
    """make_2d_wrapper's module is made by the student's function, on the CPU; `to` moves it where the
    grader's own modules are built (on a CUDA grading, tests/test_cuda.py grades it there)."""
    w = make_worker("import torch\ndef make():\n    return torch.nn.Linear(2, 3)\n")
    made = w.request("call", fn="make", args=[], kwargs={})
    moved = w.request("to", handle=made.handle, device="cpu")
    assert isinstance(moved, ModuleInfo) and moved.handle == made.handle
    assert set(moved.state_dict) == {"weight", "bias"} and moved.state_dict["weight"].shape == (3, 2)
    with pytest.raises(SubmissionError):  # an unknown device is the request's error, reported, not a crash
        w.request("to", handle=made.handle, device="no-such-device")


def test_student_exceptions_come_back_with_their_traceback(make_worker):
    w = make_worker("def f():\n    raise ValueError('bad split')\n")
    with pytest.raises(SubmissionError) as info:
        w.request("call", fn="f", args=[], kwargs={})
    assert info.value.type == "ValueError" and info.value.message == "bad split"
    assert 'File "<mha.py, cell 1>", line 2, in f' in info.value.traceback


SPIN_AND_SPIN_AGAIN = (
    "def spin():\n    while True:\n        pass\n"
    "def spin_again():\n    while True:\n        pass\n"
    "def ok():\n    return 1\n"
)


@pytest.mark.slow  # waits out deadlines
def test_once_a_submission_has_hung_its_requests_get_the_shorter_deadline(make_worker):
    w = make_worker(SPIN_AND_SPIN_AGAIN, request_seconds=6, hung_request_seconds=1)
    assert w.request_limit() == 6 and not w.known_to_hang()
    with pytest.raises(WorkerTimeout, match=r"did not finish within 6 s \(an infinite loop\?\)"):
        w.request("call", target="spin", fn="spin", args=[], kwargs={})
    assert w.known_to_hang() and w.request_limit() == 1
    assert w.request_limit("build") == 6  # building may start CUDA: never shortened
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="within 1 s .*your file hung before, so a request now gets 1 s, not 6"):
        w.request("call", target="spin_again", fn="spin_again", args=[], kwargs={})
    assert time.monotonic() - started < 6  # cut at 1 s (plus a restart), not at 6
    assert w.request("call", target="ok", fn="ok", args=[], kwargs={}) == 1  # the rest is still graded


@pytest.mark.slow  # waits out deadlines
def test_a_cell_stopped_while_loading_makes_the_submission_known_to_hang(make_worker):
    w = make_worker("while True:\n    pass\n", request_seconds=6, hung_request_seconds=1, cell_seconds=1)
    w.start()
    assert w.skipped_cells == [1] and w.known_to_hang() and w.request_limit() == 1


@pytest.mark.slow  # waits out cell deadlines
def test_later_cells_get_the_rubrics_later_cell_limit_once_one_was_stopped(make_worker):
    """The later-cell limit is the rubric's (sent with the load request), not one built into the worker."""
    w = make_worker("while True:\n    pass\n", cell_seconds=2, later_cell_seconds=0.5, load_seconds=30)
    w.cells.append([2, 3, "while True:\n    pass\n"])
    errors = w.start().errors
    assert [(e.cell, e.timed_out) for e in errors] == [(1, True), (2, True)]
    assert "stopped after 2 s" in errors[0].message and "stopped after 0.5 s" in errors[1].message


@pytest.mark.slow  # waits out a deadline
def test_a_timed_request_past_its_deadline_does_not_shorten_the_others(make_worker):
    w = make_worker(SPIN_AND_SPIN_AGAIN, request_seconds=6, hung_request_seconds=1)
    with pytest.raises(WorkerTimeout, match="within 1 s"):
        w.request("call", timeout=1, timed=True, target="spin (timed)", fn="spin", args=[], kwargs={})
    assert not w.known_to_hang() and w.request_limit() == 6


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_a_hang_is_cut_at_the_deadline_and_not_retried(make_worker):
    w = make_worker("def spin():\n    while True:\n        pass\ndef ok():\n    return 1\n", request_seconds=1)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="did not finish within 1 s"):
        w.request("call", target="spin", fn="spin", args=[], kwargs={})
    assert time.monotonic() - started < 20  # spin() never returns: any bound shows the cut (loaded machines are slow)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="not tried again"):
        w.request("call", target="spin", fn="spin", args=[], kwargs={})
    assert time.monotonic() - started < 0.5  # remembered, not waited for again
    assert w.request("call", target="ok", fn="ok", args=[], kwargs={}) == 1
    assert w.starts == 2  # killed after the hang, restarted for the next request


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_an_exit_inside_a_call_is_reported_and_the_worker_restarts(make_worker):
    w = make_worker("import os\ndef die():\n    os._exit(7)\ndef ok():\n    return 2\n")
    with pytest.raises(WorkerCrashed, match="exited with status 7"):
        w.request("call", fn="die", args=[], kwargs={})
    assert w.request("call", fn="ok", args=[], kwargs={}) == 2
    assert w.starts == 2


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_a_segfault_is_named(make_worker):
    w = make_worker("import ctypes\ndef crash():\n    ctypes.string_at(0)\n")
    with pytest.raises(WorkerCrashed, match="SIGSEGV"):
        w.request("call", fn="crash", args=[], kwargs={})


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_a_load_that_hangs_fails_once_and_is_remembered(make_worker):
    w = make_worker("while True:\n    pass\n", load_seconds=2)
    with pytest.raises(LoadFailed, match="within 2 s"):
        w.request("ping")
    started = time.monotonic()
    with pytest.raises(LoadFailed):
        w.request("ping")
    assert time.monotonic() - started < 0.5 and w.starts == 1


def test_cells_that_raise_do_not_stop_the_load(make_worker):
    w = Worker(
        [(1, 1, "a = 1"), (2, 1, "raise NotImplementedError()"), (3, 1, "b = a + 1")],
        "mha.ipynb",
        WorkerConfig(request_seconds=3),
    )
    try:
        report = w.start()
        assert [e.cell for e in report.errors] == [2]
        assert w.request("get", name="b") == 2
    finally:
        w.close()


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_memory_cap_turns_a_huge_allocation_into_an_error(make_worker):
    w = make_worker(
        "import torch\ndef hog():\n    return torch.empty(16 * 2**30, dtype=torch.uint8).sum()\n", memory_bytes=4 << 30
    )
    with pytest.raises((SubmissionError, WorkerCrashed)) as info:
        w.request("call", fn="hog", args=[], kwargs={})
    assert "memory" in str(info.value).lower() or "allocate" in str(info.value).lower()


def test_output_is_captured_and_truncated(make_worker):
    w = make_worker("print('hello'); print('x' * 200_000)\n", output_bytes=1024)
    w.start()
    time.sleep(0.5)
    text = w.output()
    assert text.startswith("hello") and "more bytes of output not kept" in text and len(text) < 1200


def test_a_forged_answer_is_never_unpickled(make_worker, tmp_path):
    """Nothing from the worker is unpickled: a torch.save pickle written straight onto the answer pipe, in
    the framing of an older protocol, is refused as unreadable and never runs."""
    marker = tmp_path / "executed"
    source = (
        "import io, os, struct, torch\n"
        "class Evil:\n"
        f"    def __reduce__(self):\n        return (os.system, ('touch {marker}',))\n"
        "fd_out = int(open('/proc/self/cmdline').read().split(chr(0))[6])\n"
        "buffer = io.BytesIO()\n"
        "torch.save({'ok': True, 'value': Evil()}, buffer)\n"
        "os.write(fd_out, struct.pack('>Q', len(buffer.getvalue())) + buffer.getvalue())\n"
    )
    w = make_worker(source, isolation="process")
    with pytest.raises(LoadFailed, match="could not be read safely"):
        w.request("ping")
    assert not marker.exists()


def test_without_the_sandbox_the_grader_packages_still_do_not_import(make_worker):
    probe = (
        "def attempt(name):\n"
        "    try:\n        __import__(name)\n        return 'imported'\n"
        "    except ImportError as exc:\n        return type(exc).__name__\n"
        "results = [attempt('reference'), attempt('reference.mha'), attempt('autograder.rubric')]\n"
    )
    w = make_worker(probe, isolation="process")
    assert w.request("get", name="results") == ["ModuleNotFoundError"] * 3


def test_cells_keep_their_line_numbers_in_the_file(make_worker):
    w = Worker([(3, 40, "def f():\n    raise ValueError('here')\n")], "mha.py", WorkerConfig(request_seconds=3))
    try:
        with pytest.raises(SubmissionError) as info:
            w.request("call", fn="f", args=[], kwargs={})
        assert 'File "<mha.py, cell 3>", line 41, in f' in info.value.traceback
    finally:
        w.close()


# Submissions that stop the worker's request loop: it reads its requests with os.read, which these replace
# with a call that never returns, at once or after reading one page of the request (which frees room in the
# pipe for a write that then blocks unless the grader's end of the pipe never blocks).
STOPS_READING = {
    "at once": "def never(fd, n):\n    time.sleep(3600)\n",
    "after a page": (
        "read, pages = os.read, []\n"
        "def never(fd, n):\n"
        "    if not pages:\n"
        "        pages.append(read(fd, 4096))\n"
        "    time.sleep(3600)\n"
    ),
}


@pytest.mark.slow  # waits out a deadline
@pytest.mark.parametrize("by_budget", [False, True])
@pytest.mark.parametrize("stops", list(STOPS_READING))
def test_a_worker_that_stops_reading_is_a_timeout_charged_to_the_submission(make_worker, stops, by_budget):
    """The grader writes a request far larger than a pipe holds to a worker that no longer reads: the write
    is stopped at the request's deadline (or the submission's budget) as a timeout of the submission, never a
    fault of the grader's, and the worker is replaced."""
    source = "import os, time\n" + STOPS_READING[stops] + "os.read = never\ndef f(x):\n    return 1\n"
    w = make_worker(source, request_seconds=2)
    w.start()
    if by_budget:
        w.budget_end = time.monotonic() + 2  # as if the submission had used all but 2 s of its budget
    expected = "the time budget for the whole submission is used up" if by_budget else "the worker stopped reading"
    started = time.monotonic()
    with pytest.raises(BudgetSpent if by_budget else WorkerTimeout, match=expected) as info:
        w.request("call", target="f", fn="f", args=[torch.zeros(1 << 22)], kwargs={})
    assert by_budget or "did not finish within 2 s" in str(info.value)
    assert time.monotonic() - started < 20  # cut at the deadline, not left blocked in the write
    assert w.process is None and str(info.value) in w.events  # killed, to be restarted for the next request


@pytest.mark.slow  # waits out a budget or a suspension
def test_the_whole_submission_has_one_time_budget(make_worker):
    w = make_worker("import time\ndef slow():\n    time.sleep(30)\n", request_seconds=20, submission_seconds=300)
    w.start()
    w.budget_end = time.monotonic() + 3  # as if the submission had used all but 3 s of its budget
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="time budget for the whole submission"):
        w.request("call", fn="slow", args=[], kwargs={})
    with pytest.raises(WorkerTimeout, match="time budget for the whole submission"):
        w.request("call", fn="slow", args=[], kwargs={})
    assert time.monotonic() - started < 15


@pytest.mark.slow  # waits out a budget or a suspension
@pytest.mark.parametrize("use_cgroups", [True, False])
def test_suspend_stops_every_process_the_submission_started(make_worker, use_cgroups):
    """setsid children leave the worker's session but not its control group (or, without one, its process
    tree): all are stopped (frozen, else SIGSTOP) and resumed, their CPU time is counted, and kill ends
    them all."""
    source = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\n"
        "def pid():\n    return child.pid\n"
    )
    w = make_worker(source, isolation="process", use_cgroups=use_cgroups)
    w.start()
    pids = w.process.pids()
    assert len(pids) >= 2
    time.sleep(1.0)
    busy = w.cpu_seconds()
    assert busy > 0.3  # the child burns a core
    w.suspend()
    time.sleep(0.2)
    frozen = w.cpu_seconds()
    time.sleep(1.0)
    assert w.cpu_seconds() - frozen < 0.1  # nothing runs while suspended
    w.resume()
    w.close()
    import os

    def alive():
        return [
            pid
            for pid in pids
            if os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        ]

    # SIGKILL is certain but not instant: on a loaded machine a killed process can take a while to be
    # scheduled and end, so wait for it (a process still alive after this long was never killed)
    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()  # the setsid child too, which a kill of the worker first would hand to the grader
