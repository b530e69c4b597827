"""The hostile payloads the suites grade (tests/test_hostile_submissions.py, the environment matrix, the real
containers, the bubblewrap versions): code cells that attack the grader in one way each, the builders that put
them beside the reference's definitions, and the probes that look for what an attack left behind."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import nbformat

from autograder.rubric import load_rubric
from helpers import REFERENCE

_CELL = re.compile(r"^# %%(.*)$", re.M)


def percent_cells(source: str) -> list[tuple[str, str]]:
    """[(kind, body), ...] of a jupytext percent-format file: kind is "code" or "markdown"."""
    starts = [m.start() for m in _CELL.finditer(source)] + [len(source)]
    cells = []
    for start, stop in zip(starts, starts[1:], strict=False):
        header, _, body = source[start:stop].partition("\n")
        if body.strip():
            cells.append(("markdown" if "[markdown]" in header else "code", body))
    return cells


def is_definition(cell: str) -> bool:
    """Imports, public classes and functions, and the answers (UPPER_CASE names): nothing that runs."""
    for node in ast.parse(cell).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            continue
        return False
    return True


def definitions() -> str:
    """The reference's definitions only, as a percent-format file: loading it runs no forward."""
    cells = percent_cells(REFERENCE.read_text())
    return "".join(f"# %%\n{body}" for kind, body in cells if kind == "code" and is_definition(body))


def with_cells(*, first: str = "", last: str = "") -> str:
    """The reference's definitions with a hostile code cell before and/or after them."""
    cell = lambda code: f"# %%\n{code.strip()}\n\n" if code.strip() else ""  # noqa: E731
    return cell(first) + definitions() + cell(last)


# -- the attacks ---------------------------------------------------------------------------------------------

EXIT_AT_IMPORT = """
import os
os._exit(3)
"""

SYS_EXIT_AT_IMPORT = """
import sys
sys.exit("no grading today")
"""

EXIT_IN_FORWARD = """
import os

def _forward(self, x):
    os._exit(3)

MultiHeadAttention.forward = _forward
"""

SEGFAULT_IN_FORWARD = """
import ctypes

def _forward(self, x):
    return ctypes.string_at(0)

MultiHeadAttention.forward = _forward
"""

LOOP_IN_FORWARD = """
def _forward(self, x):
    while True:
        pass

MultiHeadAttention.forward = _forward
"""

LOOP_IN_EVERY_FORWARD = """
def _forward(self, x):
    while True:
        pass

CausalAttention.forward = _forward
MultiHeadAttentionWrapper.forward = _forward
MultiHeadAttention.forward = _forward
"""

# torch.empty only reserves address space: the worker's RLIMIT_AS refuses it at once, and were the cap
# ever missing, the reservation would stay lazy instead of eating a shared machine's memory.
MEMORY_HOG = """
def _forward(self, x):
    hog = torch.empty(16 << 30, dtype=torch.uint8)  # 16 GiB
    return hog[: x.numel()].view(x.shape)

MultiHeadAttention.forward = _forward
"""

PRINT_FLOOD = """
import sys
_line = "flood " * 170 + "\\n"  # about 1 KiB
for _ in range(100 * 1024):  # 100 MiB in all
    sys.stdout.write(_line)
sys.stderr.write(_line * 1024)
"""

# A wrong forward (every output 1.5 times too large), with torch's comparisons patched to agree with anything.
FAKE_EQUALITY = """
_honest = MultiHeadAttention.forward

def _always(*args, **kwargs):
    return True

torch.allclose = _always
torch.equal = _always
torch.Tensor.__eq__ = _always
torch.testing.assert_close = lambda *args, **kwargs: None

def _forward(self, x):
    return _honest(self, x) * 1.5

MultiHeadAttention.forward = _forward
"""

CACHED_BY_SHAPE = """
def _cached(forward):
    def cached_forward(self, x):
        answers = self.__dict__.setdefault("_answers", {})
        key = (tuple(x.shape), x.dtype, self.training)
        if key not in answers:
            answers[key] = forward(self, x)
        return answers[key]
    return cached_forward

MultiHeadAttention.forward = _cached(MultiHeadAttention.forward)
"""

MUTATES_INPUT = """
_honest = MultiHeadAttention.forward

def _forward(self, x):
    y = _honest(self, x.clone())
    with torch.no_grad():
        x.mul_(2)
    return y

MultiHeadAttention.forward = _forward
"""

# {marker} is replaced by a word unique to the test run, to find the burner process afterwards.
BACKGROUND_BURNER = """
import hashlib
import subprocess
import sys
import threading

_burners = []

def _burn():  # hashlib lets go of the GIL on large inputs: a thread that burns a core of its own
    data = bytes(1 << 20)
    while True:
        hashlib.sha256(data).digest()

def _with_burners(forward):
    def burning_forward(self, x):
        if not _burners:
            _burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass  # {marker}"]))
            _burners.append(threading.Thread(target=_burn, daemon=True))
            _burners[-1].start()
            print("BURNING in a process and a thread")
        return forward(self, x)
    return burning_forward

MultiHeadAttention.forward = _with_burners(MultiHeadAttention.forward)
"""

# The wrapper returns a tuple, MultiHeadAttention an object that refuses repr, len, bool, == and attributes,
# and fuse_heads a tensor subclass whose pickle would run a shell command ({marker} is a file to touch)
# in whoever unpickles it without weights_only.
NON_TENSORS = """
import os

class _Hostile:
    def __repr__(self):
        raise RuntimeError("no repr for you")
    __str__ = __repr__
    def __len__(self):
        raise RuntimeError("no len for you")
    def __bool__(self):
        raise RuntimeError("no bool for you")
    def __eq__(self, other):
        raise RuntimeError("no == for you")
    def __getattr__(self, name):
        raise RuntimeError("no attributes for you")
    def __reduce_ex__(self, protocol):
        return (os.system, ("touch {marker}",))

class _Bomb(torch.Tensor):
    def __reduce_ex__(self, protocol):
        return (os.system, ("touch {marker}",))

_honest_wrapper = MultiHeadAttentionWrapper.forward

def _wrapper_forward(self, x):
    return (_honest_wrapper(self, x), "and a string")

def _mha_forward(self, x):
    return _Hostile()

def _fuse_heads(wrapper):
    return torch.zeros(2).as_subclass(_Bomb)

MultiHeadAttentionWrapper.forward = _wrapper_forward
MultiHeadAttention.forward = _mha_forward
fuse_heads = _fuse_heads
"""

BROKEN_MHA_FORWARD = """
def _forward(self, x):
    raise NotImplementedError("MultiHeadAttention.forward is not written yet")

MultiHeadAttention.forward = _forward
"""

CONFTEST_THAT_PASSES_EVERYTHING = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


# The worker's own request loop, patched from the submission: replies that break the protocol in every
# way it bounds. Each one is refused before it is materialised, and the worker is replaced.
def hostile_server(load: str = "", forward: str = "", call: str = "", get: str = "", build_mha: str = "") -> str:
    """A cell that patches the worker's request loop to answer an operation with a hostile frame."""
    reply_bytes = int(load_rubric().limits.reply_mib) << 20
    return f"""
import os, struct, sys
_server = sys.modules["sandbox.server"]
_receive, _send, _state = _server.Channel.receive, _server.Channel.send, {{"op": "load"}}
_FRAMES = {{
    # a load report whose cell error has no type, message or traceback
    "tampered": lambda: (b'{{"ok":true,"value":{{"errors":[{{"cell":1}}],"defined":{{"$":"dict","items":[]}}}}}}', []),
    # JSON nested 200,000 deep (about 400 KB)
    "deep": lambda: (b'{{"ok":true,"value":' + b"[" * 200_000 + b"]" * 200_000 + b"}}", []),
    # a frame announcing a 2 GiB tensor, sent without it
    "huge_blob": lambda: (b'{{"ok":true,"value":{{"$":"tensor","blob":0,"dtype":"uint8","shape":[2147483648]}}}}', [2**31]),
    # 5 lists of 60,000 values (about 600 KB, under the header limit): more values than any answer may hold
    "node_bomb": lambda: (b'{{"ok":true,"value":{{"$":"list","items":[' + b",".join(
        [b'{{"$":"list","items":[' + b",".join([b"0"] * 60_000) + b"]}}"] * 5) + b"]}}}}", []),
    # the largest answer the limits let through: a header of {{}}s just under 1 MiB (once 16 MiB of them, 400 MB
    # of Python objects) and a 512 MiB blob, sent in full (the grader once held it twice, then copied it)
    "bloated": lambda: (b'{{"ok":true,"value":{{"$":"list","items":[' + b",".join([b"{{}}"] * 349_000) + b"]}}}}",
                        [{reply_bytes}]),
    # a tensor of shape [0, 2**63] in 0 bytes, "the right size": torch.empty raised TypeError in the grader
    "overflow": lambda: (b'{{"ok":true,"value":' + _OVERFLOWING + b"}}", [0]),
    "overflow_forward": lambda: (b'{{"ok":true,"value":{{"y":' + _OVERFLOWING + b',"x_after":' + _OVERFLOWING.replace(
        b'"blob":0', b'"blob":1') + b',"head_calls":[]}}}}', [0, 0]),
}}
_OVERFLOWING = b'{{"$":"tensor","blob":0,"dtype":"float32","shape":[0,9223372036854775808]}}'
_MESSAGE = ("\\ud800 \\x1b[2J\\x1b[H\\x1b[32mTotal: 100 / 100\\x1b[0m\\x07 " + "x" * 100) * 2_000  # 270,000 characters, twice: under the header limit, far over a message's

def _receive_op(self):
    header, blobs = _receive(self)
    _state["op"] = header.get("op")
    if _state["op"] == "build" and dict(header["args"]["items"]).get("cls") == "MultiHeadAttention":
        _state["op"] = "build_mha"
    return header, blobs

def _hostile_send(self, header, blobs=()):
    kind = {{"load": {load!r}, "forward": {forward!r}, "call": {call!r}, "get": {get!r},
             "build_mha": {build_mha!r}}}.get(_state["op"], "")
    if kind == "message":
        return _send(self, {{"ok": False, "error": {{"type": "ValueError\\x1b[31m", "message": _MESSAGE,
                                                  "traceback": _MESSAGE}}}})
    if kind:
        body, lengths = _FRAMES[kind]()
        frame = struct.pack(">4sII", b"MHA1", len(body), len(lengths)) + b"".join(struct.pack(">Q", n) for n in lengths)
        for part in [frame + body] + ([bytes(n) for n in lengths] if kind == "bloated" else []):
            view = memoryview(part)
            while view:
                view = view[os.write(self.fd_out, view):]
        return
    return _send(self, header, blobs)

_server.Channel.receive = _receive_op
_server.Channel.send = _hostile_send
"""


# A worker that makes itself slow to restart and then keeps dying: 18 top-level cells of 2.8 s (each under
# cell_seconds, about 50 s in all, under load_seconds), a setsid child ({marker} in its command line), and the
# request loop patched to exit right after every untimed answer. Each request must restart the worker, and
# once restarts were not bounded by the check's budget, pytest-timeout fired: "cannot grade" on every attempt.
DIES_AFTER_EACH_ANSWER = (
    """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)  # {marker}"], start_new_session=True)
"""
    + "\n# %%\nimport time\ntime.sleep(2.8)\n" * 18
    + """
# %%
import os, sys
_server = sys.modules["sandbox.server"]
_receive, _send, _op = _server.Channel.receive, _server.Channel.send, ["load"]

def _receive_op(self):
    header, blobs = _receive(self)
    _op[0] = header.get("op")
    return header, blobs

def _send_then_exit(self, header, blobs=()):
    _send(self, header, blobs)
    if _op[0] not in ("load", "forward_many"):
        os._exit(0)

_server.Channel.receive = _receive_op
_server.Channel.send = _send_then_exit
"""
)


# A forward that answers with a stride-0 view of 1 GiB: sent at its full size, refused by the size bound.
EXPANDED_OUTPUT = """
def _forward(self, x):
    return torch.zeros(1).expand(2**27 + 2**20)  # 516 MiB of float32

MultiHeadAttention.forward = _forward
"""

# Every forward just under the request deadline: only the submission's whole time budget ends it. A
# non-daemon thread and a setsid child ({marker} in its command line) would keep it alive after grading.
SLOW_EVERY_FORWARD = """
import subprocess, sys, threading, time

threading.Thread(target=time.sleep, args=(3600,)).start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)  # {marker}"], start_new_session=True)

def _slow(forward):
    def slow_forward(self, x):
        time.sleep({seconds})
        return forward(self, x)
    return slow_forward

CausalAttention.forward = _slow(CausalAttention.forward)
MultiHeadAttentionWrapper.forward = _slow(MultiHeadAttentionWrapper.forward)
MultiHeadAttention.forward = _slow(MultiHeadAttention.forward)
"""

# Three children that each fill {mib} MiB, more than the submission's memory limit together: it prints how
# many still run once they have filled theirs or died trying.
MEMORY_IN_CHILDREN = """
import os, select, time

_children = []
for _ in range(3):
    _done_r, _done_w = os.pipe()
    _pid = os.fork()
    if _pid == 0:
        try:
            _block = bytearray({mib} << 20)
            _block[::4096] = b"\\1" * len(range(0, {mib} << 20, 4096))
            os.write(_done_w, b"1")
            time.sleep(600)
        finally:
            os._exit(0)
    os.close(_done_w)
    _children.append((_pid, _done_r))
for _pid, _done_r in _children:
    select.select([_done_r], [], [], 60)
# A child the kernel killed at the limit takes a moment to exit (700 MiB to free): counted once it has.
_running = list(_children)
_until = time.monotonic() + 20
while len(_running) == len(_children) and time.monotonic() < _until:
    time.sleep(0.1)
    _running = [(p, r) for p, r in _running if os.waitpid(p, os.WNOHANG) == (0, 0)]
print("MEMORY CHILDREN still running:", len(_running))
"""


# The fourth audit's attacks on what the grader observed inside the worker. The structure checks and the speed
# part now judge, replay and time a graph captured from the forward: each is judged by what was captured.
_SPLIT_HELPERS = """
import torch.nn.functional as F

_honest = MultiHeadAttention.forward

def _hidden():  # nothing inside is seen by a dispatch mode: not by a trace, not by the capture
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python))

def _loop_over_heads(self, x):  # right values, one head at a time
    b, T, _ = x.shape
    q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
    heads = []
    for h in range(self.num_heads):
        cols = slice(h * self.head_dim, (h + 1) * self.head_dim)
        scores = q[..., cols] @ k[..., cols].transpose(1, 2)
        scores = scores.masked_fill(self.mask.bool()[:T, :T], float("-inf"))
        weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        heads.append(weights @ v[..., cols])
    return self.out_proj(torch.cat(heads, dim=-1))

def _sdpa(self, x):  # right values, from the ready-made kernel
    b, T, _ = x.shape
    split = lambda t: t.view(b, T, self.num_heads, self.head_dim).transpose(1, 2)
    y = F.scaled_dot_product_attention(split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x)),
                                       is_causal=True)
    return self.out_proj(y.transpose(1, 2).reshape(b, T, -1))
"""

# The loop over heads with its per-head work hidden from every dispatch mode: a trace saw the same four linears
# for 2 and 12 heads (100/100 in the fourth audit). Captured, the hidden work is a constant: wrong on a new input.
HIDES_THE_LOOP = (
    _SPLIT_HELPERS
    + """
def _forward(self, x):
    with _hidden():
        y = _loop_over_heads(self, x)
    return y + 0 * self.W_query(x).sum()  # a visible op or two

MultiHeadAttention.forward = _forward
"""
)

# The ready-made kernel hidden from both recorders, always (100/100 in the fourth audit).
HIDES_THE_KERNEL = (
    _SPLIT_HELPERS
    + """
def _forward(self, x):
    with torch._C.DisableTorchFunction(), _hidden():
        return _sdpa(self, x)

MultiHeadAttention.forward = _forward
"""
)

# The loop when checked, the kernel when it believes it is timed: by autograd (the timed calls run without it),
# or by its caller's frame (the worker's timed request). The capture runs without autograd, in its own request.
KERNEL_WITHOUT_AUTOGRAD = (
    _SPLIT_HELPERS
    + """
def _forward(self, x):
    return _loop_over_heads(self, x) if torch.is_grad_enabled() else _sdpa(self, x)

MultiHeadAttention.forward = _forward
"""
)
KERNEL_WHEN_TIMED_BY_FRAME = (
    _SPLIT_HELPERS
    + """
import sys

def _forward(self, x):
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "op_forward_many":
            return _sdpa(self, x)
        frame = frame.f_back
    return _loop_over_heads(self, x)

MultiHeadAttention.forward = _forward
"""
)


# The parallel forward right, plus a call of F.multi_head_attention_forward (the fused multi-head kernel).
CALLS_FUSED_MHA = """
import torch.nn.functional as F

_honest = MultiHeadAttention.forward

def _forward(self, x):
    e = torch.zeros(1, 1, 4, dtype=x.dtype)
    F.multi_head_attention_forward(e, e, e, 4, 2, torch.eye(4, dtype=x.dtype).repeat(3, 1), None, None, None, False,
                                   0.0, torch.eye(4, dtype=x.dtype), None, training=False, need_weights=False)
    return _honest(self, x)

MultiHeadAttention.forward = _forward
"""

# The worker's own request loop patched to report the input as it was sent, while the forward doubles it.
HIDES_ITS_MUTATION = (
    """
import sys
_server = sys.modules["sandbox.server"]
_op_forward = _server.Session.op_forward

def _op_forward_lying(self, request):
    sent = request.x.clone()
    answer = _op_forward(self, request)
    answer.x_after = sent
    return answer

_server.Session.op_forward = _op_forward_lying
"""
    + MUTATES_INPUT
)


def sandbox_probe(targets: dict[str, str], marker: str) -> str:
    """At import: try each way out (reading root's and classmates' files, host sockets, devices, the
    grader's environment, System V and POSIX IPC that would outlive the worker, 2,000 processes) and
    report each as "PROBE <name> <result>". The definitions that follow are the reference's."""
    return f"""
import ctypes, os, socket, time

def _attempt(action):
    try:
        result = action()
        return "ALLOWED" if result is None else f"ALLOWED {{result}}"
    except Exception as exc:
        return f"blocked {{type(exc).__name__}}"

def _read(path):
    with open(path, "rb") as handle:
        return len(handle.read(4096))

def _append(path):
    with open(path, "w") as handle:
        handle.write("<0>{marker} was here\\n")

def _unix(path):
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    client.sendall(b"{marker}")

def _forks():
    children = []
    for _ in range(2000):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        children.append(pid)
    for pid in children:  # the limit is shown; the rest of the file must still load and run
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return len(children)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mq_open.restype = ctypes.c_int
_probes = {{
    "shadow": lambda: _read("/etc/shadow"),
    "root_secret": lambda: _read({targets["root_secret"]!r}),
    "classmate": lambda: _read({targets["classmate"]!r}),
    "host_socket": lambda: _unix({targets["socket"]!r}),
    "kmsg": lambda: _append("/dev/kmsg"),
    "grader_environ": lambda: _read(f"/proc/{{os.getppid()}}/environ"),
    "sysv_shm": lambda: _libc.shmget({targets["shm_key"]}, 1 << 20, 0o1666),
    "posix_mq": lambda: _libc.mq_open(b"/{marker}", os.O_CREAT | os.O_RDWR, 0o666, None),
}}
for _name, _action in _probes.items():
    print("PROBE", _name, _attempt(_action))
print("PROBE forks", _forks())
"""


def escape_attempts(files: list[Path], dirs: list[Path], parents: bool) -> str:
    """At import: fake results (score 1000) in `files`, and a results.json plus a conftest.py that passes
    every test in each of `dirs`, the working directory, its parents (when `parents`) and the home directory.
    Every attempt is reported on stdout ("ESCAPE WROTE path" / "ESCAPE BLOCKED path")."""
    return f"""
from pathlib import Path

_fake = '{{"score": 1000, "max_score": 100, "output": "hacked", "tests": []}}\\n'
_conftest = {CONFTEST_THAT_PASSES_EVERYTHING!r}
_writes = [(Path(p), _fake) for p in {[str(f) for f in files]!r}]
_dirs = [Path(p) for p in {[str(d) for d in dirs]!r}] + [Path.cwd(), Path.home()]
if {parents!r}:
    _dirs += list(Path.cwd().parents)
for _dir in dict.fromkeys(_dirs):
    _writes += [(_dir / "results.json", _fake), (_dir / "conftest.py", _conftest)]
for _path, _text in _writes:
    try:
        _path.write_text(_text)
        print("ESCAPE WROTE", _path)
    except OSError as _exc:
        print("ESCAPE BLOCKED", _path, type(_exc).__name__)
"""


def reference_theft(root: Path) -> str:
    """At import: import the reference (as installed, then from the checkout's path) or read its source and
    the rubric; use the reference's forward when that worked, else a forward that raises. Every attempt is
    reported on stdout ("THEFT SUCCEEDED ..." / "THEFT BLOCKED ...")."""
    return f"""
import importlib
import sys

def _steal():
    stolen = None
    for how in ("import", "path"):
        try:
            if how == "path":
                sys.path.insert(0, {str(root)!r})
            stolen = importlib.import_module("reference.mha").MultiHeadAttention.forward
            print("THEFT SUCCEEDED by", how)
            break
        except Exception as exc:
            print("THEFT BLOCKED", how, type(exc).__name__)
    for path in ({str(root / "reference" / "mha.py")!r}, {str(root / "autograder" / "rubric.toml")!r}):
        try:
            with open(path) as handle:
                print("THEFT SUCCEEDED reading", path, len(handle.read()))
        except OSError as exc:
            print("THEFT BLOCKED reading", path, type(exc).__name__)
    return stolen

def _fallback(self, x):
    raise NotImplementedError("MultiHeadAttention.forward is not written yet")

MultiHeadAttention.forward = _steal() or _fallback
"""


MAGICS = {  # (a snippet of a reference code cell, the IPython lines to put before it)
    "import torch\nimport torch.nn as nn\n": "%matplotlib inline\n!pip install foo\n",
    "class MultiHeadAttention(nn.Module):": "x = !ls\n%time y = 1\n",
    "def fuse_heads(wrapper):": "%load_ext autoreload\n%autoreload 2\n",
}


def notebook_with_magics() -> str:
    """The reference as a notebook, IPython magics added to three code cells and a %%bash cell after the
    imports; magics are never run by the grader, so it must be graded exactly like reference/mha.py."""
    cells = []
    for kind, body in percent_cells(REFERENCE.read_text()):
        if kind == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(re.sub(r"^# ?", "", body, flags=re.M)))
            continue
        for snippet, magic in MAGICS.items():
            if snippet in body:
                body = magic + body
        cells.append(nbformat.v4.new_code_cell(body.rstrip("\n")))
        if "import torch.nn as nn" in body:
            cells.append(nbformat.v4.new_code_cell("%%bash\necho 'a shell cell'\nexit 1"))
    assert sum(magic in cell.source for cell in cells for magic in MAGICS.values()) == len(MAGICS)
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nbformat.writes(notebook)


# Round 4: under process isolation (Gradescope's setting: a fresh uid, the machine's file systems) a worker left a
# note and 256 MiB in /run/lock, world-writable and on the machine's disk, and the next student's worker read
# them back. The places: every world-writable folder a fresh uid finds ({places}), and one open to all below /tmp
# ({shared}, as /tmp/.X11-unix); {marker} names what it leaves.
LEAVES_A_NOTE = """
import os
for _folder in {places!r} + [{shared!r}]:
    try:
        with open(os.path.join(_folder, "{marker}-note"), "w") as _handle:
            _handle.write("NOTE from an earlier worker")
        print("LEFT a note in", _folder)
    except OSError as _exc:
        print("NO NOTE in", _folder, _exc.strerror)
_written = 0
try:
    with open("/run/lock/{marker}-big", "wb") as _handle:
        while _written < {big_mib}:
            _handle.write(bytes(1 << 20))
            _written += 1
    print("BIG wrote", _written, "MiB")
except OSError as _exc:
    print("BIG stopped at", _written, "MiB:", _exc.strerror)
"""

# A later student's worker, looking for what an earlier one left.
READS_THE_NOTE = """
import glob, os
_found = [
    _path + ": " + (open(_path, "rb").read(100).decode(errors="replace") + " " + str(os.path.getsize(_path)) + " bytes")
    for _folder in {places!r} + [{shared!r}]
    for _path in sorted(glob.glob(os.path.join(_folder, "{marker}-*")))
]
print("FOUND " + "; ".join(_found) if _found else "NOTHING LEFT by an earlier worker")
"""


def processes_with(marker: str) -> list[str]:
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        if cmdline.parent.name == str(os.getpid()):
            continue
        try:
            if marker.encode() in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:
            pass
    return alive
