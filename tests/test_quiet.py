"""Quiet timing: while anything is timed on the machine, no other submission's code runs. The lock (one per
device: exclusive for a timing hold, shared for a submission's requests, a turnstile so that requests cannot
starve a hold, every wait bounded, released by the kernel when its holder dies), and a submission's worker
stopped outside its own requests. No assertion here depends on how fast anything runs: a bounded wait that
must fail fails whatever the machine's speed, and the generous bounds are only there so a broken lock fails
rather than hangs."""

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from autograder.grading import devices
from autograder.grading.checks.harness import Submission
from autograder.grading.devices import QuietLock, TimingLockBusy
from autograder.sandbox.client import BudgetSpent, CheckBudget, CheckTimeUp
from autograder.sandbox.protocol import CallRequest
from helpers import wait_until
from test_devices import try_lock

WORKER_DEFAULTS = dict(load_seconds=30, request_seconds=10)  # make_worker's (tests/conftest.py)
GENEROUS = 60.0  # seconds: only for a broken lock, which would otherwise hang the test


@pytest.fixture
def environ(tmp_path):
    """A lock folder of the test's own, for this process and the ones it starts."""
    return {**os.environ, devices.TIMING_LOCK_FOLDER_VARIABLE: str(tmp_path / "locks")}


def until(condition, what: str) -> None:
    """Wait for `condition()`, at most GENEROUS seconds."""
    assert wait_until(condition, GENEROUS, 0.01), f"never: {what}"


def held(path) -> bool:
    """Whether someone holds the lock file at `path` (tried without waiting, released at once)."""
    return not try_lock(path)


# -- the lock -----------------------------------------------------------------------------------------------


def test_requests_share_the_lock_and_a_hold_excludes_them_on_every_device(environ):
    first, second = QuietLock(environ=environ), QuietLock(environ=environ)
    with first.request(), second.request():  # two gradings' submissions run side by side
        for device in ("cpu", "cuda-GPU-new"):  # (a device whose lock file these requests could not know of)
            with pytest.raises(TimingLockBusy, match="cannot time now"):
                with QuietLock(environ=environ).hold(device, seconds=0.2):
                    pass
    with QuietLock(environ=environ).hold("cuda-GPU-aaaa"):  # a timing on any device of the machine ...
        with pytest.raises(TimingLockBusy, match="cannot time now: the submission's code waited 0.2 s"):
            with QuietLock(wait_seconds=0.2, environ=environ).request():  # ... keeps every submission stopped
                pass
        with QuietLock(environ=environ).hold("cuda-GPU-bbbb", seconds=GENEROUS):  # but not another device's timing
            pass
        with pytest.raises(TimingLockBusy):
            with QuietLock(environ=environ).hold("cuda-GPU-aaaa", seconds=0.2):  # nor the same device's
                pass


def test_a_gradings_own_requests_pass_while_it_holds_the_lock(environ):
    """What a grading times is its own: its requests inside its hold do not wait for it."""
    quiet = QuietLock(wait_seconds=0.2, environ=environ)
    with quiet.hold("cpu", seconds=GENEROUS):
        with quiet.request() as waited:
            assert waited == 0.0
    assert quiet.held > 0 and quiet.waited == 0.0


def test_a_waiting_hold_is_not_starved_by_other_gradings_requests(environ):
    """Once a hold waits, no new request starts (it waits behind the turnstile), so the requests running end
    and the hold gets the lock, however many gradings keep sending requests."""
    running = QuietLock(environ=environ).request()
    running.__enter__()
    timing, got, done = QuietLock(environ=environ), threading.Event(), threading.Event()

    def time_it():
        with timing.hold("cpu", seconds=GENEROUS):
            got.set()
            done.wait(GENEROUS)

    thread = threading.Thread(target=time_it)
    thread.start()
    try:
        folder = timing.folder()
        until(lambda: held(folder / devices.TURNSTILE), "the hold waits at the turnstile")
        assert not got.is_set()  # a request still runs
        with pytest.raises(TimingLockBusy):  # another grading's next request waits for the hold
            with QuietLock(wait_seconds=0.3, environ=environ).request():
                pass
        running.__exit__(None, None, None)
        until(got.is_set, "the hold gets the lock once the running request ends")
    finally:
        done.set()
        thread.join()
        with contextlib.suppress(Exception):
            running.__exit__(None, None, None)


def test_a_gradings_requests_wait_for_others_timing_at_most_so_long_in_all(environ, monkeypatch):
    quiet = QuietLock(wait_seconds=0.3, environ=environ)
    with QuietLock(environ=environ).hold("cpu"):
        with pytest.raises(TimingLockBusy):
            with quiet.request():
                pass
        assert quiet.waited >= 0.3

        def no_more_waiting(seconds):
            raise AssertionError("a request waited again once its grading's allowance was spent")

        monkeypatch.setattr(devices.time, "sleep", no_more_waiting)
        with pytest.raises(TimingLockBusy):  # tried once, not waited for
            with quiet.request():
                pass
    with quiet.request():  # the lock free again: its requests run (they need no wait)
        pass


HOLDER = textwrap.dedent("""
    import sys, time
    from autograder.grading.devices import QuietLock
    quiet = QuietLock()
    with (quiet.hold(sys.argv[2]) if sys.argv[1] == "hold" else quiet.request()):
        print("holding", flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("how", ["hold", "request"])
def test_the_lock_is_released_when_its_holder_dies(environ, how):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, how, "cpu"], stdout=subprocess.PIPE, text=True, env=environ
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(TimingLockBusy):
            with QuietLock(environ=environ).hold("cpu", seconds=0.2):
                pass
    finally:
        holder.kill()  # SIGKILL, mid-timing or mid-request
        holder.wait()
    with QuietLock(environ=environ).hold("cpu", seconds=GENEROUS):
        pass
    with QuietLock(wait_seconds=GENEROUS, environ=environ).request():
        pass


# -- the worker: stopped outside its own requests -------------------------------------------------------------

DAEMONS = """
import os, threading, time
counted = [0]

def count():
    while True:
        counted[0] += 1

def start():
    threading.Thread(target=count, daemon=True).start()
    if os.fork() == 0:  # a process of its own, counting too
        while True:
            pass

def advances():
    seen, end = counted[0], time.monotonic() + 30
    while counted[0] == seen and time.monotonic() < end:
        time.sleep(0.001)
    if os.fork() == 0:  # and one more process, new since the worker was last stopped
        while True:
            pass
    return counted[0] != seen
"""


@pytest.mark.parametrize(
    "settings",
    [{}, {"use_cgroups": False}, {"use_cgroups": False, "isolation": "process"}],
    ids=["as-the-machine-allows", "no-control-group", "process-isolation-no-control-group"],
)
def test_what_a_submission_left_running_runs_only_during_its_own_requests(make_worker, environ, settings):
    worker = make_worker(DAEMONS, **settings)
    worker.quiet = QuietLock(environ=environ)
    worker.request(CallRequest("start"))
    assert len(worker.process.pids()) >= 2
    for _ in range(2):  # the second time, those stopped the first time are stopped first (`procfs.stop_tree`)
        used = worker.cpu_seconds()
        time.sleep(0.5)  # a classmate's timing: the thread and the process would spin through it
        assert worker.cpu_seconds() == used  # not a nanosecond more: every process of the worker is stopped
        assert worker.request(CallRequest("advances")) is True  # and runs again in a request of its own
        assert worker.cpu_seconds() > used


def test_the_wait_for_the_lock_is_charged_to_no_budget_of_the_submission(make_worker, monkeypatch):
    """A classmate's timing held the lock for 1000 s before the file's load, and again before the request (on a
    clock of the worker's client that jumps while it waits): neither the submission's budget (600 s) nor the
    check's (5 s) is spent, and the check's end moves with the waits."""
    from types import SimpleNamespace

    from autograder.sandbox import budgets, errors

    jumped = [0.0]
    clock = SimpleNamespace(
        monotonic=lambda: time.monotonic() + jumped[0], sleep=time.sleep, perf_counter=time.perf_counter
    )
    for module in (budgets, errors):  # the client's clocks: the budgets' and the deadlines'
        monkeypatch.setattr(module, "time", clock)

    class Waiting:
        @contextlib.contextmanager
        def request(self):
            jumped[0] += 1000.0
            yield 1000.0

    worker = make_worker("def ok():\n    return 1\n", submission_seconds=600)
    worker.quiet = Waiting()
    assert worker.request(CallRequest("ok"), check=CheckBudget(clock.monotonic() + 5.0, 5.0)) == 1
    assert worker.quiet_waited == 2000.0  # the load's wait and the request's
    submission = Submission(worker, "cpu", check_seconds=5.0)
    worker.quiet_waited += 1000.0  # the check's requests waited: its end moves with them
    assert submission.check_end > time.monotonic() + 900
    worker.quiet = None  # and without the waits moving them, both budgets are spent by such a jump
    jumped[0] += 1000.0
    with pytest.raises((BudgetSpent, CheckTimeUp)):
        worker.request(CallRequest("ok"), check=CheckBudget(clock.monotonic() - 1, 5.0))


def test_a_grading_runs_its_submission_only_in_its_own_requests(tmp_path, monkeypatch):
    """`grade_submission` gives the submission's worker the grading's quiet lock (the one its speed check
    holds), with the rubric's allowance for waits."""
    from autograder.grading import grade
    from autograder.grading.plugin import ResultsPlugin

    seen = {}

    def checks(context, rubric, visible_only, **options):
        worker = context.submission.worker
        seen["the grading's lock"] = worker.quiet is context.quiet
        seen["the rubric's allowance"] = context.quiet.wait_seconds == rubric.speed.lock_seconds
        context.submission.call("start")
        used = worker.cpu_seconds()
        time.sleep(0.5)
        seen["stopped between requests"] = worker.cpu_seconds() == used
        return ResultsPlugin(rubric, visible_only)

    monkeypatch.setattr(grade, "run_checks", checks)
    monkeypatch.setenv(devices.TIMING_LOCK_FOLDER_VARIABLE, str(tmp_path / "locks"))
    submission = tmp_path / "mha.py"
    submission.write_text(DAEMONS)
    grade.grade_submission(submission, grade.Options(device="cpu", out=None, quiet=True, parts=("quiz",)))
    assert seen == dict.fromkeys(["the grading's lock", "the rubric's allowance", "stopped between requests"], True)
