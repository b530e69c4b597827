"""Submissions for the speed part's verdicts: the reference's definitions with one change each."""

from __future__ import annotations

from autograder import doctor
from autograder.grading.timing import reference_cells


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

        def _patched(self, handle, *args, _original=_original, **kwargs):
            seeds = kwargs.get("seeds")
            if isinstance(seeds, list):  # every seed at once: one batched forward of them all
                module, torch_ = self.objects[handle], self.torch
                shape, dtype = kwargs["shape"], getattr(torch_, kwargs["dtype"])
                inputs = [torch_.randn(shape, generator=torch_.Generator().manual_seed(s), dtype=dtype) for s in seeds]
                outputs = _honest_batched(module, torch_.cat(inputs)).split(shape[0])
                module.forward = lambda x, _rows=iter(outputs): next(_rows)
            return _original(self, handle, *args, **kwargs)

        _session.op_forward_many = _patched
"""
).replace(
    "MultiHeadAttention.forward = _forward",
    "_honest_batched = MultiHeadAttention.forward\nMultiHeadAttention.forward = _forward",
    1,
)


def slowed(fraction: float) -> str:
    """The reference's forward, then as long again as `fraction` of its own time spent busy: its speed is
    1 / (1 + fraction) of the reference's, a submission that sits where the bands score in proportion."""
    return with_cell(
        f"""
import time

_honest = MultiHeadAttention.forward

def _forward(self, x):
    started = time.perf_counter()
    y = _honest(self, x)
    until = time.perf_counter() + {fraction!r} * (time.perf_counter() - started)
    while time.perf_counter() < until:
        pass
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
