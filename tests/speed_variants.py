"""Submissions for the speed part's verdicts: the reference's definitions with one change each."""

from __future__ import annotations

from autograder import doctor
from autograder.grading.workers import reference_cells


def definitions() -> str:
    """The reference's code cells that only define (no demonstrations, no self-checks): what the grader's
    reference timing worker loads."""
    return "".join(f"# %%\n{source.strip()}\n\n" for _number, _line, source in reference_cells())


def with_cell(code: str) -> str:
    return definitions() + f"# %%\n{code.strip()}\n"


# Heads one at a time inside the weight split: the projections once, then scores, mask, softmax and the
# weighted sum per head (the sample class's brook); the same loop `autograder doctor` times.
LOOP_OVER_HEADS = doctor.LOOP_OVER_HEADS

# The tightest loop: everything batched but the two attention matmuls, one head at a time.
LOOP_OVER_HEADS_MATMULS_ONLY = """
def _forward(self, x):
    b, num_tokens, _ = x.shape
    split = lambda t: t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
    keys, queries, values = split(self.W_key(x)), split(self.W_query(x)), split(self.W_value(x))
    scores = torch.stack([queries[:, h] @ keys[:, h].transpose(1, 2) for h in range(self.num_heads)], dim=1)
    scores = scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
    weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
    context = torch.stack([weights[:, h] @ values[:, h] for h in range(self.num_heads)], dim=2)
    return self.out_proj(context.reshape(b, num_tokens, self.d_out))

MultiHeadAttention.forward = _forward
"""

# Honest and slow: a Python loop over the tokens, each query attending to the keys up to its own position (all
# heads at once), as a student might write causal attention before knowing masks.
LOOP_OVER_TOKENS = """
def _forward(self, x):
    b, num_tokens, _ = x.shape
    split = lambda t: t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
    keys, queries, values = split(self.W_key(x)), split(self.W_query(x)), split(self.W_value(x))
    rows = []
    for t in range(num_tokens):
        scores = queries[:, :, t : t + 1] @ keys[:, :, : t + 1].transpose(2, 3)
        weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        rows.append(weights @ values[:, :, : t + 1])
    context = torch.cat(rows, dim=2).transpose(1, 2)
    return self.out_proj(context.reshape(b, num_tokens, self.d_out))

MultiHeadAttention.forward = _forward
"""

SLEEPS = """
import time

_honest = MultiHeadAttention.forward

def _forward(self, x):
    time.sleep(0.05)
    return _honest(self, x)

MultiHeadAttention.forward = _forward
"""

# Burns the CPU from import on, in two threads (hashlib lets go of the GIL) and two processes, hoping to
# slow the reference down while it is timed.
BURNERS = """
import hashlib
import subprocess
import sys
import threading

def _burn():
    data = bytes(1 << 20)
    while True:
        hashlib.sha256(data).digest()

for _ in range(2):
    threading.Thread(target=_burn, daemon=True).start()
    subprocess.Popen([sys.executable, "-c", "while True: pass"])
"""

CACHED_BY_SHAPE = """
_honest = MultiHeadAttention.forward

def _forward(self, x):
    answers = self.__dict__.setdefault("_answers", {})
    key = (tuple(x.shape), x.dtype, self.training)
    if key not in answers:
        answers[key] = _honest(self, x)
    return answers[key]

MultiHeadAttention.forward = _forward
"""

# Keyed by the input's identity and storage address: new inputs that reuse an old one's memory get its answer.
CACHED_BY_IDENTITY = """
_honest = MultiHeadAttention.forward

def _forward(self, x):
    answers = self.__dict__.setdefault("_answers", {})
    key = (id(x), x.data_ptr(), tuple(x.shape))
    if key not in answers:
        answers[key] = _honest(self, x)
    return answers[key]

MultiHeadAttention.forward = _forward
"""

# The batching cheat of the second audit: a loop over heads that, on a timed call, looks up the seeds of
# the calls still to come in its callers' frames, builds their inputs exactly as the worker does, runs one
# batched forward of them all and answers the later calls from that. With every seed of a request sent
# before the first call, this loop earned full speed points; with one seed per call there is nothing to
# find, and it is the loop it is.
LOOKS_UP_SEEDS = (
    LOOP_OVER_HEADS.replace("MultiHeadAttention.forward = _forward", "_loop = _forward")
    + """
import sys

_honest_batched = MultiHeadAttention.forward

def _inputs(names):
    seeds, shape, dtype = names.get("seeds"), names.get("shape"), names.get("dtype")
    if not (isinstance(seeds, list) and len(seeds) > 1 and shape and dtype):
        return None
    device = names.get("device", "cpu")
    made = []
    for seed in seeds:
        generator = torch.Generator(device=device).manual_seed(seed)
        made.append(torch.randn(shape, generator=generator, device=device, dtype=getattr(torch, dtype)))
    return seeds, made

def _forward(self, x):
    cache = self.__dict__.setdefault("_cached_rows", {})
    frame = sys._getframe(1)
    while frame is not None:
        names = frame.f_locals
        seed = names.get("seed")
        if isinstance(seed, int) and seed in cache:
            return cache.pop(seed)
        found = _inputs(names)
        if found is not None:
            seeds, made = found
            rows = _honest_batched(self, torch.cat(made)).split(made[0].shape[0])
            cache.update(zip(seeds, rows))
            return cache.pop(seed) if isinstance(seed, int) and seed in cache else _loop(self, x)
        frame = frame.f_back
    return _loop(self, x)

MultiHeadAttention.forward = _forward
"""
)

# The same loop, with the worker's timed request patched from the submission's module: given the seeds of
# the calls to come, it answers them all from one batched forward. The seeds never come: the grader sends
# each only once the previous call is answered, and times the exchange on its own clock.
PATCHES_THE_SERVER = (
    LOOP_OVER_HEADS
    + """
import sys

for _module in list(sys.modules.values()):
    _session = getattr(_module, "Session", None)
    if isinstance(_session, type) and hasattr(_session, "op_forward_many"):
        _original = _session.op_forward_many

        def _patched(self, request, *args, _original=_original, **kwargs):
            seeds = getattr(request, "seeds", None)
            if isinstance(seeds, list):  # every seed at once: one batched forward of them all
                module, torch_ = self.objects[request.handle], self.torch
                shape, dtype = request.shape, getattr(torch_, request.dtype)
                inputs = [torch_.randn(shape, generator=torch_.Generator().manual_seed(s), dtype=dtype) for s in seeds]
                outputs = _honest_batched(module, torch_.cat(inputs)).split(shape[0])
                module.forward = lambda x, _rows=iter(outputs): next(_rows)
            return _original(self, request, *args, **kwargs)

        _session.op_forward_many = _patched
"""
).replace(
    "MultiHeadAttention.forward = _forward",
    "_honest_batched = MultiHeadAttention.forward\nMultiHeadAttention.forward = _forward",
    1,
)


def slowed(fraction: float) -> str:
    """The reference's forward, then about `fraction` of its own time again in real tensor work, captured with it
    (a busy loop in Python would not be: what is timed is the captured graph): its speed is about
    1 / (1 + fraction) of the reference's, a submission that sits where the bands score in proportion. How many
    element-wise operations that takes is measured on this machine, one thread, on the first forward (which is
    not captured: the speed check's values come first)."""
    return with_cell(
        f"""
import time

_honest = MultiHeadAttention.forward

def _calibrate(self, x):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            y = _honest(self, x)
            started = time.perf_counter()
            for _ in range(20):
                _honest(self, x)
            forward = (time.perf_counter() - started) / 20
            started = time.perf_counter()
            for _ in range(2000):
                y = y * 1.0
            step = (time.perf_counter() - started) / 2000
    finally:
        torch.set_num_threads(threads)
    self.__dict__["_steps"] = max(1, round({fraction!r} * forward / step))

def _forward(self, x):
    if "_steps" not in self.__dict__ and torch._C._len_torch_dispatch_stack() == 0:
        _calibrate(self, x)
    y = _honest(self, x)
    for _ in range(self.__dict__.get("_steps", 0)):
        y = y * 1.0
    return y

MultiHeadAttention.forward = _forward
"""
    )


# Near the bands' edges (no_credit_at 0.55, full_credit_at 0.75, in proportion between): the reference slowed
# by a fixed fraction, so that its speed sits near each (`make test-speed` reports their credit's spread).
NEAR_EDGES = {f"slowed_to_{target:g}": round(1 / target - 1, 3) for target in (0.55, 0.65, 0.75)}

VARIANTS = {
    "reference": definitions,
    "loop_over_heads": lambda: with_cell(LOOP_OVER_HEADS),
    "loop_over_heads_matmuls_only": lambda: with_cell(LOOP_OVER_HEADS_MATMULS_ONLY),
    "sleeps_50ms": lambda: with_cell(SLEEPS),
    "burners_at_import": lambda: with_cell(BURNERS),
    "cached_by_shape": lambda: with_cell(CACHED_BY_SHAPE),
    "cached_by_identity": lambda: with_cell(CACHED_BY_IDENTITY),
    "looks_up_seeds": lambda: with_cell(LOOKS_UP_SEEDS),
    "patches_the_server": lambda: with_cell(PATCHES_THE_SERVER),
}


# -- telling a timed forward from a checked one --------------------------------------------------------------
# Each is the reference's forward when it believes it is checked, and the forbidden (and fast)
# scaled_dot_product_attention when it believes it is timed, by one signal alone. Before every timed call was
# also a checked one, each of these earned full speed points; now what is timed is the graph captured from the
# forward, which the grader refuses when it holds the kernel (tests/test_timed_is_checked.py).

_TWO_FACED = """
import sys
import time

import torch

_honest = MultiHeadAttention.forward


def _fast(self, x):
    b, t, _ = x.shape
    split = lambda z: z.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
    q, k, v = split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x))
    context = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.out_proj(context.transpose(1, 2).reshape(b, t, self.d_out))


def _timed(self, x):
{test}


def _forward(self, x):
    return _fast(self, x) if _timed(self, x) else _checked(self, x)


_checked = _honest
MultiHeadAttention.forward = _forward
"""

TELLS = {
    # autograd: the checks' forwards run with it on, the timed ones under no_grad
    "autograd": "    return not torch.is_grad_enabled()",
    # train/eval mode (the checks' forwards are mostly in eval mode too)
    "eval_mode": "    return not self.training",
    # the request: the worker's timed request loop is on the stack
    "request": """    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "op_forward_many":
            return True
        frame = frame.f_back
    return False""",
    # the frame pattern: the functions on the stack are not those of the first forward's
    "frame_pattern": """    names, frame = [], sys._getframe(1)
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    first = self.__dict__.setdefault("_first_stack", names)
    return names != first""",
    # the caller's frame: the grader's code that called the module (past the file's own frames and torch's) is
    # not the checks' forward request
    "caller_frame": """    frame = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.startswith("<sandbox/"):
        frame = frame.f_back
    return frame is None or frame.f_code.co_name != 'op_forward'""",
    # the shapes: the speed workload's input
    "shapes": "    return tuple(x.shape) == (2, 16, 256)",
    # the order of calls: the timed calls come after the checks' first forwards of a module
    "order": """    calls = self.__dict__["_calls"] = self.__dict__.get("_calls", 0) + 1
    return calls > 2""",
    # the time since the module's first forward
    "time_since_load": """    first = self.__dict__.setdefault("_first_forward", time.monotonic())
    return time.monotonic() - first > 0.05""",
    # an active dispatch mode: the checks' traced forwards run under one, the timed ones do not
    "dispatch_mode": "    return torch._C._len_torch_dispatch_stack() == 0",
}


def two_faced(tell: str) -> str:
    """The reference's definitions, with a forward that uses scaled_dot_product_attention when `TELLS[tell]`
    says it is timed."""
    return with_cell(_TWO_FACED.format(test=TELLS[tell]))


# The third audit's: a loop over heads when autograd is on (every checked forward), scaled_dot_product_attention
# when it is off (every timed one). It earned 10/10 for speed.
LOOPS_WHEN_CHECKED = with_cell(
    LOOP_OVER_HEADS.replace("MultiHeadAttention.forward = _forward", "_loop = _forward")
    + _TWO_FACED.format(test=TELLS["autograd"]).replace("_checked = _honest", "_checked = _loop")
)


# Knows the grader's generator: graded with `--seed RUN_SEED`, it replays the speed check's hidden inputs
# (`harness.check_seed`, `Inputs`), confirms the replay by the weights it was given, predicts the timing seeds
# as they were once drawn (from the same generator, after the weights and one or two checked inputs), and
# answers every predicted input from a table made on its first forward; any other input gets a loop over
# heads. Now that the timing seeds come from the operating system, it is the loop it is.
_PREDICTS_SEEDS = """
import hashlib

import torch

RUN_SEED = {run_seed}
CHECK_IDS = [
    "test_speed.py::test_faster_than_the_wrapper[64 heads of width 4, 16 tokens]",
    "test_speed.py::test_faster_than_the_wrapper[speed_workload0]",
]
_batched = _honest
_table = {{}}


def _key(x):
    return hashlib.sha1(x.detach().cpu().contiguous().numpy().tobytes()).digest()


def _predict(self):
    for check_id in CHECK_IDS:
        seed = int.from_bytes(hashlib.sha256(f"{{RUN_SEED}}:{{check_id}}".encode()).digest()[:8], "big") >> 1
        generator = torch.Generator().manual_seed(seed)
        shapes = [p.shape for p in MultiHeadAttention(256, 256, 16, 0.0, 64).parameters()]
        draws = []
        for shape in shapes:
            fan_in = shape[-1] if len(shape) > 1 else shape[0]
            draws.append(torch.randn(*shape, generator=generator, dtype=torch.float64) / fan_in**0.5 * 1.5)
        if not torch.allclose(draws[0].float(), self.W_query.weight.detach().float()):
            continue
        after_weights = generator.get_state()
        for checked_inputs in (1, 2):
            generator.set_state(after_weights)
            for _ in range(checked_inputs):
                torch.randn(2, 16, 256, generator=generator, dtype=torch.float64)
            for _ in range(36 * 32):
                timed_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
                timed = torch.Generator().manual_seed(timed_seed)
                x = torch.randn([2, 16, 256], generator=timed, dtype=torch.float32)
                _table[_key(x)] = _batched(self, x)
        return


def _forward(self, x):
    if not self.__dict__.get("_predicted"):
        self.__dict__["_predicted"] = True
        if tuple(x.shape) == (2, 16, 256):
            with torch.no_grad():
                _predict(self)
    answer = _table.get(_key(x))
    return answer if answer is not None else _loop(self, x)


MultiHeadAttention.forward = _forward
"""


def predicts_seeds(run_seed: int) -> str:
    return with_cell(
        "_honest = MultiHeadAttention.forward\n"
        + LOOP_OVER_HEADS.replace("MultiHeadAttention.forward = _forward", "_loop = _forward")
        + _PREDICTS_SEEDS.format(run_seed=run_seed)
    )


# Right in every timed call, but what the worker shows afterwards of the calls the grader picks is not what
# it computed: the whole outputs are checked against the probes the calls answered.
SHOWS_OTHER_OUTPUTS = with_cell(
    """
import sys

for _module in list(sys.modules.values()):
    _session = getattr(_module, "Session", None)
    if isinstance(_session, type) and hasattr(_session, "op_forward_many"):
        _original = _session.reply

        def _reply(self, value, _original=_original):
            outputs = getattr(value, "outputs", None)
            if isinstance(outputs, list):
                value.outputs = [output * 1.01 for output in outputs]
            return _original(self, value)

        _session.reply = _reply
"""
)


# Works (or holds the device's timing lock) between a timed request's settings and its ready, once free time.
def holds_before_ready(seconds: float) -> str:
    return with_cell(
        f"""
import sys
import time

for _module in list(sys.modules.values()):
    _session = getattr(_module, "Session", None)
    if isinstance(_session, type) and hasattr(_session, "op_forward_many"):
        _original = _session.op_forward_many

        def _late(self, *args, _original=_original, **kwargs):
            time.sleep({seconds!r})
            return _original(self, *args, **kwargs)

        _session.op_forward_many = _late
"""
    )
