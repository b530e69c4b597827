"""Process control (`sandbox/procfs.py`): reading /proc, and killing a whole tree, as the grading pool does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from autograder.course.grading_pool import Grader
from autograder.sandbox import procfs
from helpers import wait_until

# A stand-in for a grading process (`pool`) whose worker (`worker`) started a setsid child (`child`). The
# child is hostile: when its parent dies, it starts another setsid process, out of the tree. Each process
# notes its pid in the folder given.
TREE = """
import ctypes, os, signal, subprocess, sys, time

folder, role = sys.argv[1], sys.argv[2]


def start(role, **options):
    return subprocess.Popen([sys.executable, __file__, folder, role], **options)


if role == "pool":
    start("worker")
elif role == "worker":
    start("child", start_new_session=True)
elif role == "child":
    signal.signal(signal.SIGUSR1, lambda signum, frame: start("escaped", start_new_session=True))
    ctypes.CDLL(None).prctl(1, signal.SIGUSR1, 0, 0, 0)  # PR_SET_PDEATHSIG
open(os.path.join(folder, str(os.getpid())), "w").close()
while True:
    time.sleep(1)
"""


def noted(folder: Path) -> list[int]:
    return sorted(int(path.name) for path in folder.iterdir())


def test_a_stat_line_is_read_whatever_the_command_name_holds():
    """The command name in /proc/PID/stat may hold spaces and parentheses; the fields after it are still
    read right."""
    child = subprocess.Popen(
        [sys.executable, "-c", "open('/proc/self/comm', 'w').write('a) b (c'); import time; time.sleep(30)"]
    )
    try:
        assert wait_until(lambda: Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) b (c")
        stat = procfs.read_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid() and stat.state in "RS"
        assert child.pid in procfs.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert procfs.read_stat(child.pid) is None


def test_the_grading_pools_kill_stops_the_whole_tree_before_killing_any_of_it(tmp_path, monkeypatch):
    """A grading process is killed with everything it started: every process of the tree is stopped
    before any is killed, so a setsid grandchild that reacts to its parent's death cannot escape, and none
    of them survives."""
    script, folder = tmp_path / "tree.py", tmp_path / "pids"
    script.write_text(TREE)
    folder.mkdir()
    grader = Grader(env={})
    grader.process = subprocess.Popen(
        [sys.executable, str(script), str(folder), "pool"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert wait_until(lambda: len(noted(folder)) == 3), "the tree did not start"
    tree = noted(folder)

    signals: list[tuple[int, int]] = []
    real_kill, real_killpg = os.kill, os.killpg

    def kill(pid, signum):
        signals.append((pid, signum))
        real_kill(pid, signum)

    def killpg(group, signum):
        signals.append((group, signum))
        real_killpg(group, signum)

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(os, "killpg", killpg)
    grader.close()
    monkeypatch.undo()

    stops = [index for index, (_, signum) in enumerate(signals) if signum == signal.SIGSTOP]
    kills = [index for index, (_, signum) in enumerate(signals) if signum == signal.SIGKILL]
    assert set(tree) <= {signals[index][0] for index in stops}, f"not every process was stopped: {signals}"
    assert kills and max(stops) < min(kills), f"a process was killed before the tree was stopped: {signals}"
    assert wait_until(lambda: not [pid for pid in noted(folder) if procfs.alive(pid)]), (
        f"processes outlived the kill: {[pid for pid in noted(folder) if procfs.alive(pid)]}"
    )
    assert len(noted(folder)) == 3  # the grandchild never got to start another process
