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

# Children that each burn `bank` seconds of CPU, then wait; reaped by the kernel when they end.
_BANKED_CHILDREN = """
import hashlib
import os
import signal
import subprocess
import sys
import threading

signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps them: their CPU time reaches no parent
_BANK = "import time\\nwhile time.process_time() < {bank}: pass\\ntime.sleep(3600)  # {marker}"
_banked = [subprocess.Popen([sys.executable, "-c", _BANK]) for _ in range({children})]
_timed_calls = [0]


def _spin():  # hashlib lets go of the GIL on large inputs: a thread that keeps a CPU busy
    data = bytes(1 << 20)
    while True:
        hashlib.sha256(data).digest()


def _forward(self, x):
    if not torch.is_grad_enabled():  # a timed call: one child per round of 32 of them vanishes
        _timed_calls[0] += 1
        if _timed_calls[0] % 32 == 1 and _banked:
            os.kill(_banked.pop().pid, signal.SIGKILL)
    return _loop(self, x)


MultiHeadAttention.forward = _forward
"""

_PINNED = """
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # the main thread, on one CPU
threading.Thread(target=_spin, daemon=True).start()  # a new thread inherits that one CPU
"""

_UNPINNED = """
for _ in range(3):
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


def vanishing_children_pinned_spinner(marker: str) -> str:
    return _submission(_LOOP, _BANKED_CHILDREN.format(bank=1.5, children=12, marker="{marker}"), _PINNED, marker=marker)


def vanishing_children_unpinned_spinners(marker: str) -> str:
    return _submission(
        _LOOP, _BANKED_CHILDREN.format(bank=1.5, children=12, marker="{marker}"), _UNPINNED, marker=marker
    )


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
