"""The trust boundary. Student code runs only in the worker process.

Trusted, in the grader's process:  client.py (requests, deadlines, restarts), launcher.py (a worker's
                                   lifecycle: starting it in its sandbox, holding its process tree),
                                   probe.py (what the machine offers, the isolation chosen), bwrap.py
                                   (the namespace sandbox's allow list and command), procfs.py (process
                                   control: find, stop, kill, reap, account), cgroups.py (control groups)
Untrusted, inside the worker:      server.py (the request loop beside student code), jail.py (shuts
                                   the worker in before any student code runs)
Both sides:                        protocol.py (standard library only: frames, values, typed replies)

The untrusted side is never imported by the grader: the launcher hands its sources to a fresh
interpreter, which loads them as the package `sandbox` (see `launcher.BOOT`).
"""

# Imported before anything here forks, so before the grader's first thread starts: each registers a fork hook
# with a parent's half (`before`: take a lock, `after_in_parent`: release it). Registered while another thread
# is inside a fork (the reference's timing workers start in threads while the main thread imports torch, which
# imports logging), only the parent's release would run for that fork, and the interpreter would print
# "cannot release un-acquired lock" on the grader's stderr. tests/test_grader_forks.py holds the rule.
import concurrent.futures.thread  # noqa: F401
import logging  # noqa: F401
