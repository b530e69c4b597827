"""Submissions that try to make CPU time vanish from the speed part's charge where no control group counts it
(Gradescope's setting: process isolation as a fresh uid, no writable control groups).

Each is a loop over heads (`speed_variants.LOOP_OVER_HEADS`, which earns no speed points) with one trick
added. `{marker}` is replaced by a word unique to the test run, to find anything left running afterwards.

- `VANISHING_CHILDREN_PINNED_SPINNER`: children bank CPU time at import, then wait; SIGCHLD is ignored, so
  the kernel reaps a child the moment it is killed, and its CPU time goes with it. A timed forward kills one
  per round (its CPU time falls out of the round's, which goes negative); a spinning thread pinned to the
  main thread's CPU makes each wait for the other, so the round's waits cancel its wall time. Measured
  against a charge of `max(cpu, wall - waits)` summed over the live processes, it earned full speed points.
- `VANISHING_CHILDREN_UNPINNED_SPINNERS`: the same children, and three spinning threads on any CPU: the
  threads' waits together exceed the wall time, the charge goes negative, and the statistics raised a math
  domain error (the grading could not grade, where the loop deserves 0).
- `ESCAPED_SETSID_HELPER`: a helper that leaves the worker's process tree (setsid, and its parent exits, so
  it is handed to the grader as their subreaper) and burns a CPU throughout: never stopped while the
  reference is timed (it slows the reference down), never charged.
- `WAKES_AND_KILLS_ITS_CHILDREN`: against the rule that only the worker's main process runs while it is
  timed: a timed forward wakes its stopped children (SIGCONT) to spin beside it, and kills one per round.
"""

from __future__ import annotations

from speed_variants import LOOP_OVER_HEADS, definitions

_LOOP = LOOP_OVER_HEADS.replace("MultiHeadAttention.forward = _forward", "_loop = _forward")

# Children that each burn `bank` seconds of CPU, then wait; reaped by the kernel when they end. `_bank(n)`
# starts n and waits (within a cell's time limit) until they have; one cell per call.
_BANKED_CHILDREN = """
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps them: their CPU time reaches no parent
_BANK = "import time\\nwhile time.process_time() < {bank}: pass\\ntime.sleep(3600)  # {marker}"
_banked = []
_timed_calls = [0]
_spinners = []
_EVERY_CPU = os.sched_getaffinity(0)


def _cpu(pid):
    try:
        fields = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bank(count):
    new = [subprocess.Popen([sys.executable, "-c", _BANK]) for _ in range(count)]
    _banked.extend(new)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline and any(_cpu(child.pid) < {bank} for child in new):
        time.sleep(0.05)


def _spin():  # hashlib lets go of the GIL on large inputs: a thread that keeps a CPU busy
    _spinners.append(threading.get_native_id())
    data = bytes(1 << 20)
    while True:
        hashlib.sha256(data).digest()


def _pin_beside_the_main_thread():
    os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})  # the main thread, on one CPU
    threading.Thread(target=_spin, daemon=True).start()  # a new thread inherits that one CPU


def _forward(self, x):
    if not torch.is_grad_enabled():  # a timed call: in the first of each round of 32, a child vanishes
        _timed_calls[0] += 1
        if _timed_calls[0] % 32 == 1:
            _new_round(_timed_calls[0] // 32)
            if _banked:
                os.kill(_banked.pop().pid, signal.SIGKILL)
    return _loop(self, x)


MultiHeadAttention.forward = _forward
"""

# The warm-up round (0) as the pinned spinner, so that its charge is small but not below zero (the rounds
# would not be measured: too slow); then every thread on any CPU, with more spinners.
_PINNED = """
_pin_beside_the_main_thread()


def _new_round(index):
    pass
"""

_UNPINNED = """
_pin_beside_the_main_thread()


def _new_round(index):
    if index == 1:
        for thread in [0, *_spinners]:
            os.sched_setaffinity(thread, _EVERY_CPU)
        for _ in range(2):
            threading.Thread(target=_spin, daemon=True).start()
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

_SPIN = "while True: pass  # {marker}"
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


def _vanishing_children(bank: float, mode: str, marker: str) -> str:
    banked = _BANKED_CHILDREN.format(bank=bank, marker="{marker}")
    return _submission(_LOOP, banked, *["_bank(2)"] * 4, mode, marker=marker)


def vanishing_children_pinned_spinner(marker: str) -> str:
    return _vanishing_children(0.8, _PINNED, marker)


def vanishing_children_unpinned_spinners(marker: str) -> str:
    return _vanishing_children(1.2, _UNPINNED, marker)


def escaped_setsid_helper(marker: str) -> str:
    return _submission(_LOOP, _ESCAPED, marker=marker)


def wakes_and_kills_its_children(marker: str) -> str:
    return _submission(_LOOP, _WAKES, marker=marker)


def loop_over_heads(marker: str) -> str:
    return _submission(LOOP_OVER_HEADS, marker=marker)


ATTACKS = {
    "vanishing_children_pinned_spinner": vanishing_children_pinned_spinner,
    "vanishing_children_unpinned_spinners": vanishing_children_unpinned_spinners,
    "escaped_setsid_helper": escaped_setsid_helper,
    "wakes_and_kills_its_children": wakes_and_kills_its_children,
}
