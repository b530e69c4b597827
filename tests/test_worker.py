"""The untrusted worker, from the grader's side: deadlines, crashes, restarts, limits, the sandbox."""

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from autograder.sandbox.client import (
    BudgetSpent,
    CheckBudget,
    CheckTimeUp,
    Lifecycle,
    LoadFailed,
    RestartPolicy,
    SubmissionError,
    Worker,
    WorkerCannotStart,
    WorkerConfig,
    WorkerCrashed,
    WorkerTimeout,
)
from autograder.sandbox.protocol import (
    MISSING,
    BuildRequest,
    CallRequest,
    Captured,
    CaptureRequest,
    ForwardRequest,
    GetRequest,
    Graph,
    GraphNode,
    GraphRef,
    ModuleInfo,
    PingRequest,
    Pong,
    ReplayRequest,
    StandInRequest,
    ToRequest,
)

WORKER_DEFAULTS = dict(load_seconds=30, request_seconds=3)  # make_worker's (tests/conftest.py)


def test_answers_are_plain_data_and_tensors(make_worker):
    w = make_worker("import torch\ndef double(t):\n    return [t * 2, (1, 'a')]\n")
    value = w.request(CallRequest(fn="double", args=[torch.ones(2)], kwargs={}))
    assert isinstance(value, list)
    assert torch.equal(value[0], torch.full((2,), 2.0))
    assert value[1] == (1, "a")


def test_a_module_the_students_code_made_is_moved_to_the_grading_device(make_worker):
    """make_2d_wrapper's module is made by the student's function, on the CPU; `to` moves it where the
    grader's own modules are built (on a CUDA grading, tests/test_cuda.py grades it there)."""
    w = make_worker("import torch\ndef make():\n    return torch.nn.Linear(2, 3)\n")
    made = w.request(CallRequest("make"))
    moved = w.request(ToRequest(handle=made.handle, device="cpu"))
    assert isinstance(moved, ModuleInfo) and moved.handle == made.handle
    assert set(moved.state_dict) == {"weight", "bias"} and moved.state_dict["weight"].shape == (3, 2)
    with pytest.raises(SubmissionError):  # an unknown device is the request's error, reported, not a crash
        w.request(ToRequest(handle=made.handle, device="no-such-device"))


def test_a_stand_in_answers_its_values_only_and_the_students_own_comes_back(make_worker):
    """A stand-in for a function the student's code calls (combine, left a stub here) answers the calls of its
    table, within a float tolerance, and refuses any other; without a table the student's own is back, and a
    stand-in for a name the file lacks leaves it lacking again."""
    w = make_worker(
        "import torch\ndef combine(outputs):\n    raise NotImplementedError()\n"
        "def wrapper(a, b):\n    return combine([a, b])\n"
    )
    a, b = torch.ones(2, 3), torch.zeros(2, 1)
    value = torch.arange(8.0).reshape(2, 4)  # what the grader says the call should give: not a concatenation
    w.request(StandInRequest("combine", [[[[a, b]], value]]))
    assert torch.equal(w.request(CallRequest("wrapper", [a + 1e-9, b])), value)
    with pytest.raises(SubmissionError) as info:
        w.request(CallRequest("wrapper", [b, a]))
    assert info.value.type == "LookupError"
    w.request(StandInRequest("combine", None))
    with pytest.raises(SubmissionError) as info:
        w.request(CallRequest("wrapper", [a, b]))
    assert info.value.type == "NotImplementedError"
    w.request(StandInRequest("missing", [[[1], 2]]))
    assert w.request(CallRequest("missing", [1])) == 2
    w.request(StandInRequest("missing", None))
    assert w.request(GetRequest("missing")) is MISSING


def test_student_exceptions_come_back_with_their_traceback(make_worker):
    w = make_worker("def f():\n    raise ValueError('bad split')\n")
    with pytest.raises(SubmissionError) as info:
        w.request(CallRequest("f"))
    assert info.value.type == "ValueError" and info.value.message == "bad split"
    assert 'File "<mha.py, cell 1>", line 2, in f' in info.value.traceback


# Once called, the worker's request loop answers with a tensor of shape [0, 2**63] in 0 bytes: "the right size".
OVERFLOWING_ANSWER = """
import os, struct, sys
_server = sys.modules["sandbox.server"]
_BODY = b'{"ok":true,"value":{"$":"tensor","blob":0,"dtype":"float32","shape":[0,9223372036854775808]}}'

def _send(self, header, blobs=()):
    os.write(self.fd_out, struct.pack(">4sII", b"MHA1", len(_BODY), 1) + struct.pack(">Q", 0) + _BODY)

def overflow():
    _server.Channel.send = _send
    return 1
"""


def test_an_answer_that_cannot_be_decoded_is_the_workers_fault(make_worker, monkeypatch):
    """A shape that would overflow torch's sizes (torch.empty raised TypeError in the grader: cannot grade), and
    any exception at all while an answer is decoded: the request fails as the worker's, and the worker is
    replaced."""
    w = make_worker(OVERFLOWING_ANSWER)
    with pytest.raises(WorkerCrashed, match="could not be read safely: a tensor of shape .* larger than any answer"):
        w.request(CallRequest("overflow"))
    from autograder.sandbox import protocol

    parse_reply = protocol.parse_reply

    def broken(op, header, decoder):
        if op == "ping":
            raise KeyError("a decoding step that raised")
        return parse_reply(op, header, decoder)

    monkeypatch.setattr(protocol, "parse_reply", broken)
    with pytest.raises(WorkerCrashed, match=r"could not be read safely: it could not be decoded \(KeyError"):
        w.request(PingRequest())
    monkeypatch.undo()
    assert isinstance(w.request(PingRequest()), Pong)  # a fresh worker answers


SPIN_AND_SPIN_AGAIN = (
    "def spin():\n    while True:\n        pass\n"
    "def spin_again():\n    while True:\n        pass\n"
    "def ok():\n    return 1\n"
)


@pytest.mark.slow  # waits out deadlines
def test_once_a_submission_has_hung_its_requests_get_the_shorter_deadline(make_worker):
    # the wall deadlines only: no request CPU deadline to stop the spin first
    w = make_worker(SPIN_AND_SPIN_AGAIN, request_seconds=6, hung_request_seconds=1, request_floor_seconds=None)
    assert w.request_limit() == 6 and not w.known_to_hang()
    with pytest.raises(WorkerTimeout, match=r"did not finish within 6 s \(an infinite loop\?\)"):
        w.request(CallRequest("spin"), target="spin")
    assert w.known_to_hang() and w.request_limit() == 1
    assert w.request_limit("build") == 6  # building may start CUDA: never shortened
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="within 1 s .*your file hung before, so a request now gets 1 s, not 6"):
        w.request(CallRequest("spin_again"), target="spin_again")
    assert time.monotonic() - started < 6  # cut at 1 s (plus a restart), not at 6
    assert w.request(CallRequest("ok"), target="ok") == 1  # the rest is still graded


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
        w.request(CallRequest("spin"), timeout=1, timed=True, target="spin (timed)")
    assert not w.known_to_hang() and w.request_limit() == 6


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_a_hang_is_cut_at_the_deadline_and_not_retried(make_worker):
    w = make_worker("def spin():\n    while True:\n        pass\ndef ok():\n    return 1\n", request_seconds=1)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="did not finish within 1 s"):
        w.request(CallRequest("spin"), target="spin")
    assert time.monotonic() - started < 20  # spin() never returns: any bound shows the cut (loaded machines are slow)
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match="not tried again"):
        w.request(CallRequest("spin"), target="spin")
    assert time.monotonic() - started < 0.5  # remembered, not waited for again
    assert w.request(CallRequest("ok"), target="ok") == 1
    assert w.starts == 2  # killed after the hang, restarted for the next request


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_an_exit_inside_a_call_is_reported_and_the_worker_restarts(make_worker):
    w = make_worker("import os\ndef die():\n    os._exit(7)\ndef ok():\n    return 2\n")
    with pytest.raises(WorkerCrashed, match="exited with status 7"):
        w.request(CallRequest("die"))
    assert w.request(CallRequest("ok")) == 2
    assert w.starts == 2


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_a_segfault_is_named(make_worker):
    w = make_worker("import ctypes\ndef crash():\n    ctypes.string_at(0)\n")
    with pytest.raises(WorkerCrashed, match="SIGSEGV"):
        w.request(CallRequest("crash"))


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_a_load_that_hangs_fails_once_and_is_remembered(make_worker):
    w = make_worker("while True:\n    pass\n", load_seconds=2)
    with pytest.raises(LoadFailed, match="within 2 s"):
        w.request(PingRequest())
    started = time.monotonic()
    with pytest.raises(LoadFailed):
        w.request(PingRequest())
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
        assert w.request(GetRequest("b")) == 2
    finally:
        w.close()


def test_a_cells_error_is_reported_cut_short_even_when_printing_it_raises(make_worker):
    """The worker reports an exception's message through `protocol.safe_str`: at most 2,000 characters, and a
    placeholder where the exception's own `__str__` raises."""
    hostile = "class Hostile(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Hostile()"
    w = Worker(
        [(1, 1, "raise ValueError('x' * 5000)"), (2, 1, hostile), (3, 1, "b = 2")],
        "mha.ipynb",
        WorkerConfig(request_seconds=3),
    )
    try:
        report = w.start()
        assert [(e.cell, e.type, e.message) for e in report.errors] == [
            (1, "ValueError", "x" * 2000),
            (2, "Hostile", "(the exception could not be printed)"),
        ]
        assert w.request(GetRequest("b")) == 2
    finally:
        w.close()


@pytest.mark.slow  # restarts the worker or waits out a deadline
def test_memory_cap_turns_a_huge_allocation_into_an_error(make_worker):
    w = make_worker(
        "import torch\ndef hog():\n    return torch.empty(16 * 2**30, dtype=torch.uint8).sum()\n", memory_bytes=4 << 30
    )
    with pytest.raises((SubmissionError, WorkerCrashed)) as info:
        w.request(CallRequest("hog"))
    assert "memory" in str(info.value).lower() or "allocate" in str(info.value).lower()


def test_output_is_captured_and_truncated(make_worker):
    w = make_worker("print('hello'); print('x' * 200_000)\n", output_bytes=1024)
    w.start()
    w.kill()  # the output is read by a thread: once the worker ended, it has all of it
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
        "def writes(fd):  # the answer pipe: the one pipe it writes to, besides its output\n"
        "    try:\n"
        "        flags = open(f'/proc/self/fdinfo/{fd}').read().split('flags:')[1].split()[0]\n"
        "        return os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:') and int(flags, 8) & 3 == 1\n"
        "    except OSError:\n"
        "        return False\n"
        "fd_out = next(fd for fd in map(int, os.listdir('/proc/self/fd')) if fd > 2 and writes(fd))\n"
        "buffer = io.BytesIO()\n"
        "torch.save({'ok': True, 'value': Evil()}, buffer)\n"
        "os.write(fd_out, struct.pack('>Q', len(buffer.getvalue())) + buffer.getvalue())\n"
    )
    w = make_worker(source, isolation="process")
    with pytest.raises(LoadFailed, match="could not be read safely"):
        w.request(PingRequest())
    assert not marker.exists()


def test_without_the_sandbox_the_grader_packages_still_do_not_import(make_worker):
    probe = (
        "def attempt(name):\n"
        "    try:\n        __import__(name)\n        return 'imported'\n"
        "    except ImportError as exc:\n        return type(exc).__name__\n"
        "results = [attempt('reference'), attempt('reference.mha'), attempt('autograder.rubric')]\n"
    )
    w = make_worker(probe, isolation="process")
    assert w.request(GetRequest("results")) == ["ModuleNotFoundError"] * 3


def test_cells_keep_their_line_numbers_in_the_file(make_worker):
    w = Worker([(3, 40, "def f():\n    raise ValueError('here')\n")], "mha.py", WorkerConfig(request_seconds=3))
    try:
        with pytest.raises(SubmissionError) as info:
            w.request(CallRequest("f"))
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
        w.request(CallRequest(fn="f", args=[torch.zeros(1 << 22)], kwargs={}), target="f")
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
        w.request(CallRequest("slow"))
    with pytest.raises(WorkerTimeout, match="time budget for the whole submission"):
        w.request(CallRequest("slow"))
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
    deadline = time.monotonic() + 30  # on a loaded machine the child gets a share of a core
    while w.cpu_seconds() <= 0.3 and time.monotonic() < deadline:
        time.sleep(0.2)
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


# The worker's own request loop patched from the submission: the worker ends itself right after each answer
# but the load report (the "exits after an untimed reply").
EXITS_AFTER_EACH_ANSWER = """
import os, sys
_server = sys.modules["sandbox.server"]
_send, _sent = _server.Channel.send, []

def _send_then_exit(self, header, blobs=()):
    _send(self, header, blobs)
    _sent.append(1)
    if len(_sent) > 1:
        os._exit(0)

_server.Channel.send = _send_then_exit

def f():
    return 1
"""


def wait_until_ended(w: Worker) -> None:
    deadline = time.monotonic() + 10
    while w.process is not None and w.process.alive() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("wait", [True, False], ids=["ended-before-the-next-request", "ending-as-it-is-sent"])
def test_a_worker_that_ends_itself_between_requests_is_restarted_then_given_up_on(make_worker, wait):
    """Each answer comes back, then the worker exits: it is restarted for the next request (also when the
    request was already written to it, unread: that request is not what ended it), and after
    `crashes_before_giving_up` times not again: every later request fails at once, saying why."""
    w = make_worker(EXITS_AFTER_EACH_ANSWER, crashes_before_giving_up=2)
    answers = []
    for _ in range(2):
        answers.append(w.request(CallRequest("f"), target="f"))
        if wait:
            wait_until_ended(w)
    assert answers == [1, 1] and w.starts == 2
    for _ in range(2):
        with pytest.raises(WorkerCrashed, match="exited with status 0") as info:
            w.request(CallRequest("f"))
        assert "waiting for the grader's next request" in str(info.value)
        assert "this happened 2 times; the worker is not restarted again" in str(info.value)
    assert w.starts == 2 and w.process is None and not w.crashes  # never charged to the function called


def test_a_restart_inside_a_check_gets_at_most_what_is_left_of_the_checks_budget(make_worker):
    """A file whose loading takes 4 s and whose worker ends after each answer: the restart the next request
    needs is stopped when the check's budget ends (a timeout of that request, not a load failure for the
    whole run); with budget enough, the restart loads the file again and answers."""
    w = make_worker("import time\ntime.sleep(4)\n" + EXITS_AFTER_EACH_ANSWER, cell_seconds=10)
    assert w.request(CallRequest("f")) == 1
    wait_until_ended(w)
    check = CheckBudget(time.monotonic() + 1.0, 60.0)
    with pytest.raises(CheckTimeUp, match="this check used up its time budget \\(60 s\\)") as info:
        w.request(CallRequest("f"), check=check)
    assert "restarting it" in str(info.value)
    assert w.load_failure is None and w.process is None
    assert w.request(CallRequest("f"), check=CheckBudget(time.monotonic() + 60, 60)) == 1


def test_a_worker_environment_without_torch_is_the_graders_fault(make_worker, swapped_interpreter):
    """The worker's interpreter cannot import torch (a grader installed where the worker sees another
    Python): nothing of the submission has run, so this is WorkerCannotStart (the run cannot grade), never
    a load failure charged to the file."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment: the base interpreter has torch")
    with tempfile.TemporaryDirectory(prefix="no-torch-") as folder:  # not under pytest's 0700 tmp_path
        os.chmod(folder, 0o755)
        python = Path(folder) / "python"
        python.symlink_to(os.path.realpath(sys._base_executable))  # the base interpreter: no torch installed
        swapped_interpreter(str(python))
        w = make_worker("def f():\n    return 1\n", isolation="process")
        with pytest.raises(WorkerCannotStart, match="No module named 'torch'") as info:
            w.request(CallRequest("f"))
        assert "the grader's environment is at fault" in str(info.value)
        assert w.load_failure is None and w.load_report is None and w.process is None


def test_a_prestarted_worker_runs_nothing_of_the_submission_until_it_is_started(make_worker):
    """`prestart` (the grading's first worker, started while the checks are collected) loads Python and
    torch only: the file's top level runs at the first request, once, as without it."""
    with tempfile.TemporaryDirectory(prefix="prestart-") as folder:  # the worker may run as another uid
        os.chmod(folder, 0o777)
        marker = Path(folder) / "ran"
        w = make_worker(
            f"print('top level ran')\nopen({str(marker)!r}, 'a').write('x')\ndef f():\n    return 1\n",
            isolation="process",
        )
        w.prestart()
        assert w.process is not None and w.starts == 0 and not w.alive()
        ready, _, _ = select.select([w.process.from_worker], [], [], 60)  # it booted: its `ready` waits unread
        assert ready and not marker.exists() and w.load_report is None and "top level ran" not in w.output()
        assert w.request(CallRequest("f")) == 1
        assert marker.read_text() == "x" and w.starts == 1
        w.kill()  # the output is read by a thread: once the worker ended, it has all of it
        assert w.output().count("top level ran") == 1


@pytest.mark.parametrize("said_ready", [False, True], ids=["at-once", "after-it-said-ready"])
@pytest.mark.parametrize("forks", [0, 50], ids=["fresh", "forked"])
def test_a_prestarted_worker_that_dies_before_it_is_started_is_the_graders_fault(make_worker, forks, said_ready):
    """Killed before any of the submission ran (at once, or once it has said ready but before it read the file):
    never counted as the submission ending its own worker, nor as its file failing to load. A fresh one cannot
    start (the run cannot grade); a forked one is the fork server's trouble, and a fresh worker is started
    instead, saying why."""
    w = make_worker("def f():\n    return 1\n", isolation="process", forks_per_server=forks)
    w.prestart()
    assert w.process is not None and w.process.started(60) is None
    if said_ready:  # its `ready` waits unread in the pipe
        assert select.select([w.process.from_worker], [], [], 60)[0]
    os.kill(w.process.pid, 9)
    w.process.process.wait(timeout=30)  # gone before the request
    if forks:
        assert w.request(CallRequest("f")) == 1
        assert w.fresh_because is not None
        assert "before it read the file" in w.fresh_because if said_ready else "before it" in w.fresh_because
        assert not w.process.forked and w.starts == 1
    else:
        with pytest.raises(WorkerCannotStart):
            w.request(CallRequest("f"))
    assert w.ended_between == [] and w.given_up is None and w.load_failure is None


CAPTURED = """
import torch

class Loop(torch.nn.Module):
    def __init__(self, heads):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(heads))
    def forward(self, x):
        return torch.stack([h(x) for h in self.heads]).sum(0)

class Branches(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a branch on a value
            return x * 2
        return x

class Hides(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(4, 4)
    def forward(self, x):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
            hidden = self.w(x)  # where no dispatch mode sees it
        return hidden * 1
"""


def built(w, cls, *args):
    return w.request(BuildRequest(cls=cls, args=list(args), kwargs={}, state_dict=None, dtype=None, device="cpu"))


def test_a_captured_forward_is_its_aten_operations_and_a_loop_shows_in_their_count(make_worker):
    """The structure checks count a captured graph's matrix multiplies: a loop over 2 and over 5 heads captures
    2 and 5; the graph names its state by the module's own names, in order, the input after them."""
    from autograder.grading import graphs

    w = make_worker(CAPTURED, request_seconds=60)
    counts = []
    for heads in (2, 5):
        captured = w.request(CaptureRequest(built(w, "Loop", heads).handle, [2, 4], "float32"))
        assert isinstance(captured, Captured)
        counts.append(graphs.matmuls(captured.graph))
        assert captured.graph.inputs[:2] == ("heads.0.weight", "heads.0.bias")
        assert set(captured.state) == set(captured.graph.inputs)  # none was known: all sent
    assert counts == [2, 5]


def test_a_forward_that_branches_on_a_value_cannot_be_captured(make_worker):
    w = make_worker(CAPTURED, request_seconds=60)
    with pytest.raises(SubmissionError) as raised:
        w.request(CaptureRequest(built(w, "Branches").handle, [2, 4], "float32"))
    assert "if x.sum() > 0" in raised.value.traceback  # the student's line: the branch


def test_what_a_forward_hides_from_the_capture_is_frozen_in_the_graph_as_a_constant(make_worker):
    """Run where no student code runs, the graph of a forward that hid its work gives the captured input's answer
    on every input: the work it hid was never captured."""
    w = make_worker(CAPTURED, request_seconds=60)
    module = built(w, "Hides")
    captured = w.request(CaptureRequest(module.handle, [2, 4], "float32", seed=3, known=[]))
    assert len(captured.graph.constants) == 1 and not any("addmm" in t for t in captured.graph.targets())
    replay = make_worker("x = 1", request_seconds=60)  # a worker that never ran the module's code
    state = [captured.state[name] for name in captured.graph.inputs]
    replayed = replay.request(ReplayRequest(captured.graph.to_wire(), state, "cpu"))
    first = replay.request(ForwardRequest(replayed.handle, torch.randn(2, 4))).y
    second = replay.request(ForwardRequest(replayed.handle, torch.randn(2, 4))).y
    assert torch.equal(first, second)


def test_a_replayed_graph_runs_only_aten_operations(make_worker):
    """A graph naming any other function (a Python callable by its dotted name) is refused when it is rebuilt."""
    w = make_worker("x = 1", request_seconds=60)
    graph = Graph(("w",), (GraphNode("os.system", ("echo",), {}),), GraphRef("node", 0))
    with pytest.raises(SubmissionError, match="not an ATen operation"):
        w.request(ReplayRequest(graph.to_wire(), [torch.eye(2)], "cpu"))


# Run in a process of its own: the grader's side of one hostile answer, a header of {}s just under the
# protocol's limit and the largest blob it allows, with the process's peak resident memory measured from just
# before the request (clear_refs resets it).
PEAK_OF_ONE_HOSTILE_ANSWER = r"""
import json
from autograder.sandbox import protocol
from autograder.sandbox.client import Worker, WorkerError
from autograder.sandbox.settings import WorkerConfig

limits = protocol.FrameLimits()
HOSTILE = '''
import os, struct, sys
_server = sys.modules["sandbox.server"]
_send, _sent = _server.Channel.send, []

def _hostile_send(self, header, blobs=()):
    _sent.append(1)
    if len(_sent) == 1:  # the load report
        return _send(self, header, blobs)
    body = b'{"ok":true,"value":{"$":"list","items":[' + b",".join([b"{}"] * (HEADER // 3)) + b"]}}"
    blob = bytes(BLOB)
    for part in (struct.pack(">4sIIQ", b"MHA1", len(body), 1, len(blob)), body, blob):
        view = memoryview(part)
        while view:
            view = view[os.write(self.fd_out, view):]

_server.Channel.send = _hostile_send

def f():
    return 1
'''.replace("HEADER", str(limits.header_bytes - 64)).replace("BLOB", str(limits.blob_bytes))


def status(key):
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) << 10 for line in handle if line.startswith(key + ":"))


worker = Worker([(1, 1, HOSTILE)], "mha.py", WorkerConfig(load_seconds=60, request_seconds=60))
worker.start()
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")
before = status("VmRSS")
try:
    worker.request(protocol.CallRequest("f"))
    outcome = "answered"
except WorkerError as exc:
    outcome = str(exc)
peak = status("VmHWM")
worker.close()
print(json.dumps({"increase": peak - before, "blob_bytes": limits.blob_bytes, "outcome": outcome}))
"""


@pytest.mark.slow  # a 512 MiB answer
def test_the_graders_memory_for_one_answer_is_its_blobs_once_plus_a_bounded_header():
    """An answer with the largest header and blob the protocol allows (a header of empty objects, once 16 MiB
    and 400 MB of Python objects, and a 512 MiB blob, once held twice): the grader's peak grows by the blob's
    bytes once plus at most 64 MiB (the parsed header, a read chunk), and the answer is refused as the
    worker's fault. Measured on a 2-core machine: an increase of 1,410 MiB before, 538 MiB after."""
    run = subprocess.run(
        [sys.executable, "-c", PEAK_OF_ONE_HOSTILE_ANSWER], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    assert "could not be read safely" in measured["outcome"]
    extra = measured["increase"] - measured["blob_bytes"]
    assert extra < 64 << 20, f"reading one answer raised the grader's peak by {measured['increase'] >> 20} MiB"


def test_a_tensor_read_from_the_wire_is_its_buffer_not_a_copy():
    """`read_frame` with `read_into` reads each blob into a bytearray of its size, and `from_wire` makes the
    tensor on that very memory: no second copy of a blob is held."""
    from autograder.sandbox import protocol

    value = torch.arange(6, dtype=torch.float32)
    encoder = protocol.Encoder(protocol.TensorCodec(torch))
    frame = memoryview(protocol.pack_frame({"value": encoder.encode(value)}, encoder.blobs))
    position = [0]

    def read_exact(n: int) -> bytes:
        position[0] += n
        return bytes(frame[position[0] - n : position[0]])

    def read_into(view: memoryview) -> None:
        view[:] = read_exact(len(view))

    header, blobs = protocol.read_frame(read_exact, protocol.FrameLimits(), read_into)
    assert isinstance(blobs[0], bytearray)
    decoded = protocol.Decoder(blobs, protocol.FrameLimits(), protocol.TensorCodec(torch).from_wire).decode(
        header["value"]
    )
    assert torch.equal(decoded, value)
    blobs[0][4:8] = bytes(4)  # the tensor is the buffer itself: its second value becomes 0
    assert decoded[1].item() == 0 and decoded[2].item() == 2


# -- the restart policy and the lifecycle, alone (no process)


def test_one_failure_policy_for_untimed_and_timed_requests():
    """A timeout makes its target not tried again whether the request was timed or not; only an untimed one
    makes the submission known to hang; a spent budget is nobody's hang; a crash is counted per target, and
    refused once it happened `tries` times."""
    timed, untimed = RestartPolicy(tries=2), RestartPolicy(tries=2)
    timed.failed(WorkerTimeout("x did not finish"), "x (timed)", timed=True)
    untimed.failed(WorkerTimeout("x did not finish"), "x", timed=False)
    assert list(timed.hung) == ["x (timed)"] and not timed.stopped_request
    assert list(untimed.hung) == ["x"] and untimed.stopped_request
    with pytest.raises(WorkerTimeout, match="not tried again"):
        untimed.refuse("x")
    untimed.refuse("y")  # another target still runs

    spent = RestartPolicy(tries=2)
    spent.failed(BudgetSpent("the budget is used up"), "x", timed=False)
    assert not spent.hung and not spent.stopped_request
    spent.refuse("x")

    crashes = RestartPolicy(tries=2)
    crashes.failed(WorkerCrashed("ended"), "x", timed=True)
    crashes.refuse("x")  # once: tried again
    crashes.failed(WorkerCrashed("ended again"), "x", timed=False)
    with pytest.raises(WorkerCrashed, match="ended again .this happened 2 times"):
        crashes.refuse("x")
    assert crashes.ended("ended between requests") is None
    assert "not restarted again" in (crashes.ended("ended between requests again") or "")


def test_a_worker_whose_file_cannot_load_refuses_every_request_without_starting_a_process(make_worker):
    w = make_worker("x = 1", isolation="process")
    assert w.state is Lifecycle.IDLE and not w.alive() and w.load_failure is None
    w.refuse_load("that is not a Python file")
    assert w.state is Lifecycle.LOAD_FAILED and w.load_failure == "that is not a Python file"
    w.prestart()
    with pytest.raises(LoadFailed, match="not a Python file"):
        w.request(PingRequest())
    assert w.process is None and w.starts == 0
    w.kill()  # a final state stays final
    assert w.state is Lifecycle.LOAD_FAILED


# -- the CPU deadline of a request, which follows the reference's ---------------------------------------------

BURNS = """
import time

def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return seconds

def spin():
    while True:
        pass
"""


def test_a_requests_cpu_deadline_is_the_references_times_the_factor_within_the_floor_and_the_wall():
    """`RequestCpu.of`: the rubric's factor times the reference's CPU for the same request, never below the floor;
    none where it would not come before the wall deadline, none for a build, a move, a capture or a load (they may
    start CUDA or import the compiler), none where the rubric sets no floor."""
    from autograder.sandbox.client import RequestCpu

    config = WorkerConfig(request_factor=50, request_floor_seconds=3)
    assert RequestCpu.of(config, "forward", None, 10).limit == 3
    assert RequestCpu.of(config, "forward", 0.001, 10).limit == 3
    scaled = RequestCpu.of(config, "call", 0.1, 10)
    assert scaled.limit == pytest.approx(5) and "50 times what the reference's code needs" in scaled.why
    assert RequestCpu.of(config, "forward", 0.5, 10) is None  # 25 s of CPU: the wall deadline comes first
    assert RequestCpu.of(config, "forward", None, 2) is None
    assert all(RequestCpu.of(config, op, None, 10) is None for op in ("build", "to", "capture", "load"))
    assert RequestCpu.of(WorkerConfig(request_floor_seconds=None), "forward", None, 10) is None


@pytest.mark.slow  # burns seconds of CPU
def test_a_request_is_stopped_by_its_cpu_time_long_before_its_wall_deadline(make_worker):
    """An endless loop is stopped once it has used the floor's CPU time, whatever the wall deadline (the message
    says so, and what the reference would have needed); then the submission is known to hang, and the rest is
    still graded."""
    w = make_worker(BURNS, request_seconds=120, request_floor_seconds=1, hung_request_seconds=60)
    with pytest.raises(WorkerTimeout, match=r"spin did not finish within 1 s of CPU time, what any request gets"):
        w.request(CallRequest("spin"), target="spin")
    assert w.known_to_hang()
    assert w.request(CallRequest("burn", [0.1]), target="burn") == 0.1


@pytest.mark.slow  # burns seconds of CPU
def test_a_slow_request_gets_the_factor_times_the_references_cpu(make_worker):
    """A request that needs more CPU than the floor finishes when the reference needed enough for it (the factor
    times the reference's CPU), and is stopped when the reference needed far less. Measured in CPU time, so the
    machine's load changes nothing."""
    w = make_worker(BURNS, request_seconds=120, request_floor_seconds=0.5, request_factor=10)
    assert w.request(CallRequest("burn", [1.0]), target="burn", reference_cpu=0.3) == 1.0  # allowed 3 s
    with pytest.raises(WorkerTimeout, match=r"within 0.5 s of CPU time"):
        w.request(CallRequest("burn", [3.0]), target="burn", reference_cpu=0.01)  # allowed 0.5 s
    timed = make_worker(BURNS, request_seconds=120, request_floor_seconds=0.5)
    assert timed.request(CallRequest("burn", [1.0]), timeout=60, timed=True, target="burn (timed)") == 1.0
