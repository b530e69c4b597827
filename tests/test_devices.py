"""Spreading a class over several GPUs and serialising timing per device, tested with made-up device
counts (no GPU needed); the CUDA test at the end runs it for real where a device is present."""

import contextlib
import fcntl
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from autograder.course import grade_class, placement
from autograder.course.placement import DevicePool, NoDevice, placement_for
from autograder.grading import devices
from autograder.grading.devices import timing_lock, timing_lock_path, visible_devices
from autograder.model import TIMING_LOCK, GradingRun
from helpers import REFERENCE, FakeGrader


def test_visible_devices_without_and_with_cuda_visible_devices():
    assert visible_devices({}, 3) == ["0", "1", "2"]
    assert visible_devices({}, 0) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2,5"}, 2) == ["2", "5"]
    uuids = "GPU-8f1c2a4e-0000-0000-0000-000000000001,MIG-5d1f0b3a-0000-0000-0000-000000000002"
    assert visible_devices({"CUDA_VISIBLE_DEVICES": uuids}, 2) == uuids.split(",")
    # CUDA stops at the first entry it cannot use; torch's count says how many it kept
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,7,2"}, 1) == ["1"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}, 0) == []


def test_the_pool_gives_each_process_the_least_busy_device():
    pool = DevicePool(["0", "1", "2"])
    with contextlib.ExitStack() as held:
        got = [held.enter_context(pool.device()) for _ in range(5)]
        assert got == ["0", "1", "2", "0", "1"]
        assert pool.running == {"0": 2, "1": 2, "2": 1}
    assert pool.running == {"0": 0, "1": 0, "2": 0}
    with pool.device(), pool.device() as second:
        assert second == "1"
        with pool.device():
            pass  # released at once: device 2 is free again
        with pool.device() as fourth:
            assert fourth == "2"


def test_placement_on_cpu_and_on_made_up_gpus():
    cpu = placement_for("cpu", environ={}, device_count=8)
    assert cpu.device == "cpu" and cpu.devices == []
    with cpu.slot() as env:
        assert env is None  # the grading process inherits the environment as it is
    assert placement_for("auto", environ={}, device_count=0).device == "cpu"
    with pytest.raises(NoDevice, match="torch sees no CUDA device"):
        placement_for("cuda", environ={}, device_count=0)
    gpus = placement_for("auto", environ={"CUDA_VISIBLE_DEVICES": "3,1", "HOME": "/home/x"}, device_count=2)
    assert gpus.device == "cuda" and gpus.devices == ["3", "1"]
    with gpus.slot() as first, gpus.slot() as second:
        assert (first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]) == ("3", "1")
        assert first["HOME"] == "/home/x"  # the rest of the environment is kept


def test_grade_class_pins_every_grading_process_to_one_device(tmp_path, monkeypatch):
    """A class of 12 on 3 made-up GPUs with 6 grading processes at once: each process is pinned to one
    device for its life, 2 per device, and asked for --device cuda. The grading processes are replaced,
    so nothing is graded for real."""
    course = tmp_path / "course"
    for number in range(12):
        folder = course / "submitted" / f"s{number:02d}" / "mha"
        folder.mkdir(parents=True)
        (folder / "mha.py").write_text("x = 1\n")
    monkeypatch.setattr(placement, "cuda_device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lock = threading.Lock()
    pinned: list[str] = []
    requests = []
    all_started = threading.Barrier(6, timeout=30)

    class Pinned(FakeGrader):
        def __init__(self, env=None):
            super().__init__(env)
            with lock:
                pinned.append(env["CUDA_VISIBLE_DEVICES"])
            self.first = True

        def run_for(self, request):
            if self.first:  # the six processes run at once, for certain
                self.first = False
                all_started.wait()
            with lock:
                requests.append(request)
            return super().run_for(request)

    monkeypatch.setattr(grade_class, "Grader", Pinned)
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cuda", jobs=6)) == 0
    assert len(requests) == 12 and {r.device for r in requests} == {"cuda"}
    assert sorted(pinned) == ["0", "0", "1", "1", "2", "2"]


def test_grade_class_says_so_when_cuda_is_asked_for_and_absent(tmp_path, monkeypatch, capsys):
    (tmp_path / "course" / "submitted").mkdir(parents=True)
    monkeypatch.setattr(placement, "cuda_device_count", lambda: 0)
    assert (
        grade_class.grade_class(grade_class.ClassOptions(tmp_path / "course", device="cuda"))
        == grade_class.EXIT_CANNOT_GRADE
    )
    assert "torch sees no CUDA device" in capsys.readouterr().out


# --- timing: one at a time per device, across processes --------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from autograder.grading.devices import timing_lock
    with timing_lock(sys.argv[1]):
        print("holding", flush=True)
        time.sleep(600)
""")


def try_lock(path) -> bool:
    """Whether the lock at `path` is free now (taken and released at once, without waiting)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def test_a_timing_lock_is_held_across_processes_per_device_and_freed_when_its_holder_dies(tmp_path, monkeypatch):
    folder = tmp_path / "locks"
    monkeypatch.setenv(devices.TIMING_LOCK_FOLDER_VARIABLE, str(folder))  # this process's, and the holder's
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "cuda-GPU-aaaa"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        held, other = timing_lock_path("cuda-GPU-aaaa"), timing_lock_path("cuda-GPU-bbbb")
        assert held.parent == folder and held != other
        assert not try_lock(held)  # the same device: busy
        assert try_lock(other)  # another device: free
        started = time.monotonic()
        with pytest.raises(devices.TimingLockBusy, match="cannot time now: another grading held .* for 0.3 s"):
            with timing_lock("cuda-GPU-aaaa", seconds=0.3):
                pass
        assert time.monotonic() - started >= 0.3
    finally:
        holder.kill()
        holder.wait()
    assert try_lock(held)  # the holder was killed mid-timing: the lock is free again
    with timing_lock("cuda-GPU-aaaa") as path:
        assert path == held and not try_lock(held)


def test_the_timing_lock_file_can_be_named(tmp_path):
    chosen = tmp_path / "locks" / "gpu0.lock"
    with timing_lock("cpu", environ={devices.TIMING_LOCK_VARIABLE: str(chosen)}) as path:
        assert path == chosen and not try_lock(chosen)
    assert try_lock(chosen)


def test_the_timing_locks_live_in_a_folder_only_the_graders_user_can_enter(tmp_path):
    """Not the machine's shared temp folder, where a worker running as another uid could hold the lock
    or plant a FIFO at its path: a 0700 folder of the grader's user, lock files 0600."""
    folder = devices.timing_lock_folder({})
    assert (
        folder != Path(tempfile.gettempdir())
        and folder.parent != Path(tempfile.gettempdir())
        or (folder.name == f"mha-autograder-{os.geteuid()}")
    )
    if os.geteuid() == 0:
        assert folder == Path("/run/mha-autograder")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o777)
    os.chmod(locks, 0o777)
    with timing_lock("cpu", environ={devices.TIMING_LOCK_FOLDER_VARIABLE: str(locks)}) as path:
        assert stat.S_IMODE(os.stat(locks).st_mode) == 0o700  # ours, left open: closed
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and path.parent == locks


def hostile_lock(tmp_path, kind: str) -> dict[str, str]:
    locks = tmp_path / kind
    if kind == "folder-link":
        (tmp_path / "elsewhere").mkdir()
        locks.symlink_to(tmp_path / "elsewhere")
        return {devices.TIMING_LOCK_FOLDER_VARIABLE: str(locks)}
    locks.mkdir(mode=0o700)
    lock = locks / "timing-cpu.lock"
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "link":
        lock.symlink_to(tmp_path / "target.lock")
    elif kind == "foreign-folder":
        os.chown(locks, 12345, 12345)
    return {devices.TIMING_LOCK_FOLDER_VARIABLE: str(locks)}


@pytest.mark.parametrize("kind", ["fifo", "link", "folder-link", "foreign-folder"])
def test_a_planted_lock_is_refused_at_once_as_cannot_time_now(tmp_path, kind):
    """A FIFO at the lock's path (it used to block the grader's open), a link in its place, a link as the
    folder, a folder another uid owns: refused at once, a retryable "cannot time now" (never a hang)."""
    if kind == "foreign-folder" and os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root")
    environ = hostile_lock(tmp_path, kind)
    started = time.monotonic()
    with pytest.raises(devices.TimingLockError, match="^cannot time now: "):
        with timing_lock("cpu", seconds=1, environ=environ):
            pass
    assert time.monotonic() - started < 30  # (at once; generous for a loaded machine)
    assert not (tmp_path / "target.lock").exists()  # the link was not followed to create its target


def test_the_timing_locks_wait_ends_before_pytest_timeout_would_stop_the_check(monkeypatch):
    """A busy lock must end as "cannot time now" (retryable), not as pytest-timeout killing the check:
    the lock's wait and the check's own budget together stay below the checks' pytest-timeout."""
    from types import SimpleNamespace

    from autograder.grading import grade
    from autograder.rubric import load_rubric

    rubric = load_rubric()
    seen = {}

    def fake_main(args, plugins):
        seen["args"] = args
        return 0

    monkeypatch.setattr(grade.pytest, "main", fake_main)
    grade.run_checks(SimpleNamespace(notes=None), rubric, visible_only=False)
    timeout = float(next(a for a in seen["args"] if a.startswith("--timeout=")).split("=", 1)[1])
    assert rubric.speed.lock_seconds + rubric.limits.check_seconds < timeout
    # and the speed check's longest path: the submission's first load (Python and torch, then the file) and
    # the reference's workers' start, the check's budget before and after the lock (a restart inside it
    # included), the lock's wait
    longest = 4 * rubric.limits.load_seconds + 2 * rubric.limits.check_seconds + rubric.speed.lock_seconds
    assert longest < timeout


# --- for real, where CUDA is present ---------------------------------------------------------------


@pytest.mark.cuda
def test_a_class_on_cuda_pins_each_process_to_a_visible_device(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    course = tmp_path / "course"
    for student in ("ann", "bob", "cat"):
        folder = course / "submitted" / student / "mha"
        folder.mkdir(parents=True)
        (folder / "mha.py").write_text(REFERENCE.read_text())
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade-class", course, "--device", "cuda", "--jobs", "3"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"on {torch.cuda.device_count()} CUDA device(s)" in " ".join(run.stdout.split())
    for student in ("ann", "bob", "cat"):
        results = json.loads((course / "autograded" / student / "mha" / "results.json").read_text())
        assert results["extra_data"]["device"] == "cuda" and results["score"] == results["max_score"]
    key = devices.device_key("cuda")
    assert key.startswith("cuda-") and key != "cuda-"


def test_a_class_run_grades_again_once_what_could_not_be_timed_now(tmp_path, monkeypatch):
    """A busy timing lock makes a run "cannot time now" (cannot_grade, never a zero); the class run grades
    those students again at its end, one at a time, and keeps what that gives."""
    course = tmp_path / "course"
    for student in ("ann", "bob", "cat"):
        folder = course / "submitted" / student / "mha"
        folder.mkdir(parents=True)
        (folder / "mha.py").write_text("x = 1\n")
    attempts: dict[str, int] = {}
    lock = threading.Lock()

    class BusyOnce(FakeGrader):
        def run_for(self, request):
            with lock:
                attempts[request.id] = attempts.get(request.id, 0) + 1
                busy = request.id != "ann" and attempts[request.id] == 1
            if not busy:
                return super().run_for(request)
            reason = f"the grader itself failed: CannotTime: {devices.CANNOT_TIME_NOW}: another grading held it"
            return GradingRun("cannot_grade", "mha.py", reason=reason, cannot_grade_cause=TIMING_LOCK)

    monkeypatch.setattr(grade_class, "Grader", BusyOnce)
    assert grade_class.grade_class(grade_class.ClassOptions(course, device="cpu", jobs=3)) == 0
    assert attempts == {"ann": 1, "bob": 2, "cat": 2}
    record = grade_class.Record(course)
    assert all(record.run(s).graded for s in attempts)
