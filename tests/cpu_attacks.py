"""Submissions that try to make CPU time vanish from the speed part's charge where no control group counts it
(Gradescope's setting: process isolation as a fresh uid, no writable control groups).

Each is a loop over heads (`speed_variants.LOOP_OVER_HEADS`, which earns no speed points) with one trick
added. `{marker}` is replaced by a word unique to the test run, to find anything left running afterwards. Each
earned something once, when the submission's own worker was what was timed; now what is timed is a graph of its
forward replayed in a trusted worker, and its own worker is stopped throughout: each is graded as the loop it is,
and what each describes below is history.

- `vanishing_children_pinned_spinner`: children bank CPU time at import, then wait; SIGCHLD is ignored, so
  the kernel reaps a child the moment it is killed, and its CPU time goes with it. A timed forward kills one
  per round (its CPU time falls out of the round's, which goes negative); a spinning thread pinned to the
  main thread's CPU, at the lowest priority, waits whenever the main thread runs, so the round's waits
  cancel its wall time while the loop runs at full speed. Against a charge of `max(cpu, wall - waits)`,
  the CPU time summed over the live processes and the waits over all their threads, a loop like it earned
  full speed points (relative 1.39 to 1.46); on a 2-core machine at a load average of about 20, this one's
  rounds were charged 0.4 to 3 ms per call (the reference's 1.0 to 1.6, the loop's 6 to 7) until its
  children ran out.
- `vanishing_children_unpinned_spinners`: the same, and after the warm-up round three spinning threads on
  any CPU: their waits together exceed the wall time, the charge goes negative, and the statistics raised a
  math domain error (the grading could not grade, where the loop deserves 0).
- `escaped_setsid_helper`: a helper that leaves the worker's process tree (setsid, and its parent exits, so
  it is handed to the grader as their subreaper) and burns a CPU throughout: never stopped while the
  reference is timed (it slows the reference down), never charged.
- `wakes_and_kills_its_children`: against the rule that only the worker's main process runs while it is
  timed: a timed forward wakes its stopped children (SIGCONT) to spin beside it at the lowest priority, and
  kills one per round.
"""

from __future__ import annotations

from speed_variants import LOOP_OVER_HEADS, definitions

_LOOP = LOOP_OVER_HEADS.replace("MultiHeadAttention.forward = _forward", "_loop = _forward")

# Children that each burn some seconds of CPU, then wait; reaped by the kernel when they end. `_bank(n, s)`
# starts n that burn s seconds each and waits (within a cell's time limit) until they have; one cell per call.
# At the end of each timed round of 32 calls the forward makes as much CPU time vanish as it takes to bring
# the round's CPU time down to `_target(round)`, as the grader would measure it (a real attacker tunes its
# speed so; the warm-up round's charge must stay above zero, or the rounds are not measured).
_BANKED_CHILDREN = """
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps them: their CPU time reaches no parent
_BANK = "import sys, time\\nwhile time.process_time() < float(sys.argv[1]): pass\\ntime.sleep(3600)  # {marker}"
_banked = []
_timed_calls = [0]
_round_cpu = [0.0]
_spinners = []
_EVERY_CPU = os.sched_getaffinity(0)


def _cpu(pid):
    try:
        fields = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bank(count, seconds):
    new = [subprocess.Popen([sys.executable, "-c", _BANK, str(seconds)]) for _ in range(count)]
    _banked.extend(new)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(_cpu(child.pid) < seconds for child in new):
        time.sleep(0.05)


def _vanish(seconds):
    for bank, child in sorted(((_cpu(child.pid), child) for child in _banked), key=lambda banked: -banked[0]):
        if bank <= seconds:
            os.kill(child.pid, signal.SIGKILL)
            _banked.remove(child)
            seconds -= bank


def _spin():  # hashlib lets go of the GIL on large inputs: a thread that keeps a CPU busy, or wants to
    _spinners.append(threading.get_native_id())
    os.setpriority(os.PRIO_PROCESS, _spinners[-1], 19)  # runnable always, running only when nothing else is
    data = bytes(1 << 20)
    while True:
        hashlib.sha256(data).digest()


def _pin_beside_the_main_thread():
    os.sched_setaffinity(0, {{min(_EVERY_CPU)}})  # the main thread, on one CPU
    threading.Thread(target=_spin, daemon=True).start()  # a new thread inherits that one CPU


def _forward(self, x):
    if torch.is_grad_enabled():
        return _loop(self, x)
    _timed_calls[0] += 1  # a timed call
    number, index = _timed_calls[0] % 32, (_timed_calls[0] - 1) // 32
    if number == 1:
        _new_round(index)
        _round_cpu[0] = time.process_time()  # every thread of this process
    y = _loop(self, x)
    if number == 0:
        _vanish(time.process_time() - _round_cpu[0] - _target(index))
    return y


MultiHeadAttention.forward = _forward
"""

# The round's CPU time brought down to 30 ms, a little less than the reference's 32 calls take.
_PINNED = """
def _new_round(index):
    pass


def _target(index):
    return 0.03
"""

# The warm-up round (0) as the pinned one; then every thread on any CPU, more spinners, and CPU time far
# below zero.
_UNPINNED = """
def _new_round(index):
    if index == 1:
        for thread in [0, *_spinners]:
            os.sched_setaffinity(thread, _EVERY_CPU)
        for _ in range(2):
            threading.Thread(target=_spin, daemon=True).start()


def _target(index):
    return 0.03 if index == 0 else -0.5
"""

_ESCAPED = """
import subprocess
import sys

_HELPER = '''
import os
if os.fork():
    os._exit(0)  # its parent ends: the helper is handed to the grader, out of the worker's process tree
os.setsid()
print("HELPER escaped: pid", os.getpid(), flush=True)
while True:  # {marker}
    pass
'''
subprocess.Popen([sys.executable, "-c", _HELPER], start_new_session=True).wait()
MultiHeadAttention.forward = _loop
"""

_WAKES = """
import os
import signal
import subprocess
import sys

_SPIN = "import os\\nos.nice(19)\\nwhile True: pass  # {marker}"
_children = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(4)]
_timed_calls = [0]


def _forward(self, x):
    if not torch.is_grad_enabled():
        _timed_calls[0] += 1
        for child in _children:
            os.kill(child.pid, signal.SIGCONT)  # wake them: they were stopped for the round
        if _timed_calls[0] % 32 == 0 and len(_children) > 1:
            os.kill(_children.pop().pid, signal.SIGKILL)
    return _loop(self, x)


MultiHeadAttention.forward = _forward
"""


def _submission(*cells: str, marker: str) -> str:
    source = definitions() + "".join(f"# %%\n{cell.strip()}\n\n" for cell in cells)
    return source.replace("{marker}", marker)


def _vanishing_children(mode: str, banks: list[str], marker: str) -> str:
    banked = _BANKED_CHILDREN.format(marker="{marker}")
    cells = [*banks, "_bank(4, 0.05)", "_bank(4, 0.02)", "_pin_beside_the_main_thread()"]
    return _submission(_LOOP, banked, mode, *cells, marker=marker)


def vanishing_children_pinned_spinner(marker: str) -> str:
    return _vanishing_children(_PINNED, ["_bank(2, 0.15)"] * 8, marker)


def vanishing_children_unpinned_spinners(marker: str) -> str:
    return _vanishing_children(_UNPINNED, ["_bank(2, 0.3)"] * 6 + ["_bank(2, 0.15)"] * 4, marker)


def escaped_setsid_helper(marker: str) -> str:
    return _submission(_LOOP, _ESCAPED, marker=marker)


def wakes_and_kills_its_children(marker: str) -> str:
    return _submission(_LOOP, _WAKES, marker=marker)


def reference(marker: str) -> str:
    return _submission(marker=marker)


def loop_over_heads(marker: str) -> str:
    return _submission(LOOP_OVER_HEADS, marker=marker)


ATTACKS = {
    "vanishing_children_pinned_spinner": vanishing_children_pinned_spinner,
    "vanishing_children_unpinned_spinners": vanishing_children_unpinned_spinners,
    "escaped_setsid_helper": escaped_setsid_helper,
    "wakes_and_kills_its_children": wakes_and_kills_its_children,
}
