"""Untrusted side: the worker's request loop, the only grader code that runs beside student code.

The grader starts it as a fresh `python -I -u -c BOOT ...` process (see `launcher.BOOT`), which loads
this module, `jail` and `protocol` from source under the package name `sandbox`; it imports nothing
else of the grader, and torch only after `jail` has shut the process in. It loads one submission cell
by cell and answers requests: load, get a name, call a function, build a module, describe it, run a
forward (with optional backward, head hooks and a dispatch trace), run forwards for timing, drop a module, ping.

Nothing said here is trusted: the grader validates every reply against the protocol's schema and
compares every value with its own reference computation.
"""

from __future__ import annotations

import ast
import gc
import linecache
import os
import signal
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same modules, as the grader's package names them; no worker imports this
    import torch

    from autograder.sandbox import protocol
    from autograder.sandbox.inside import jail
else:
    from . import jail, protocol

# What the worker sends: lists, tuples and dicts of at most this many items, nested at most this deep
# (beyond: the object's class and repr).
MAX_ITEMS, MAX_DEPTH = 4096, 6
# The cells' errors a load report lists (each message at most 2,000 characters), besides the cells stopped for
# running too long (all listed: they are skipped when the file is loaded again): the report stays far below
# the grader's limit on an answer's header.
MAX_LOAD_ERRORS = 200
MAX_MESSAGE_CHARS = 2000  # an exception's message, as the worker reports it
# The functions one forward's record names at most (`CallRecorder`); calls of others are not counted.
MAX_RECORDED_NAMES = 256
# The grader's frames are trusted; these bounds only stop a runaway request.
REQUEST_LIMITS = protocol.FrameLimits(
    header_bytes=256 << 20, blob_bytes=4 << 30, string_chars=1 << 24, list_items=1 << 20
)


class CellTimeout(BaseException):
    """Raised by SIGALRM in a top-level cell that runs too long."""


class Channel:
    def __init__(self, fd_in: int, fd_out: int):
        self.fd_in, self.fd_out = fd_in, fd_out

    def read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = os.read(self.fd_in, min(n, 1 << 20))
            if not chunk:
                raise EOFError("the grader closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self) -> tuple[dict[str, Any], list[bytes | bytearray]]:
        return protocol.read_frame(self.read_exact, REQUEST_LIMITS)

    def send(self, header: dict[str, Any], blobs: list[bytes | bytearray] | tuple[()] = ()) -> None:
        view = memoryview(protocol.pack_frame(header, list(blobs)))
        while view:
            view = view[os.write(self.fd_out, view) :]


class Session:
    """The submission's namespace and the objects built for the grader."""

    def __init__(self, library: types.ModuleType, setup: protocol.WorkerSetup, channel: Channel):
        self.torch = library  # torch, imported once the jail is in place
        self.setup = setup
        self.channel = channel  # for a request that answers in several frames (`op_forward_many`)
        self.contract = setup.contract
        self.codec = protocol.TensorCodec(library)
        self.namespace: dict[str, Any] = {}  # the submission's globals
        self.objects: dict[str, torch.nn.Module] = {}  # handle -> a module built or returned for the grader
        self.built = 0  # handles are never reused, even after a drop
        self.stood_in: dict[str, Any] = {}  # name -> the submission's own value (or MISSING) while a stand-in runs
        self._current = self.encoder()

    # -- values
    def encoder(self) -> protocol.Encoder:
        return protocol.Encoder(self.codec, on_other=self.other, max_items=MAX_ITEMS, max_depth=MAX_DEPTH)

    def other(self, value: Any, depth: int) -> Any:
        """What the encoder sends for anything but plain data and tensors: a module as a handle (registered
        for later requests), a list or tuple subclass as a list, anything else as its class and repr."""
        torch = self.torch
        if isinstance(value, torch.nn.Module):
            return self._current.encode(self.register(value))
        if isinstance(value, (list, tuple)):  # subclasses of list and tuple: their items, as a list
            if len(value) <= MAX_ITEMS and depth < MAX_DEPTH:
                return {"$": "list", "items": [self._current.encode(v, depth + 1) for v in list(value)]}
        return {"$": "object", "class": type(value).__name__[:200], "repr": safe_repr(value)}

    def reply(self, value: Any) -> tuple[dict[str, Any], list[bytes | bytearray]]:
        """Encode `value` (one of the protocol's reply types, or a plain value) for the ok-reply; returns
        (header, blobs)."""
        self._current = self.encoder()
        return {"ok": True, "value": protocol.reply_tree(value, self._current.encode)}, self._current.blobs

    def request(self, header: dict[str, Any], blobs: list[bytes | bytearray]) -> protocol.Request:
        """The typed request a frame holds (a ValueError for an unknown op or field)."""
        op = protocol.request_type(header.get("op")).op
        decoder = protocol.Decoder(blobs, REQUEST_LIMITS, self.codec.from_wire)
        return protocol.request_of(op, self.resolve(decoder.decode(header.get("args", {"$": "dict", "items": []}))))

    def handle(self, request: protocol.Request) -> Any:
        """Answer one request with its operation's `op_` method: its reply's value, or `Streamed` when it has sent
        its replies itself."""
        return getattr(self, f"op_{request.op}")(request)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, protocol.Handle):
            return self.objects[value.handle]
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        return value

    def register(self, module: torch.nn.Module, state: bool = True) -> protocol.ModuleInfo:
        handle = f"h{self.built}"
        self.built += 1
        self.objects[handle] = module
        return self.describe(handle, state)

    def describe(self, handle: str, state: bool = True) -> protocol.ModuleInfo:
        module = self.objects[handle]
        instance_of = [
            name
            for name in self.contract
            if isinstance(self.namespace.get(name), type) and isinstance(module, self.namespace[name])
        ]
        state_dict = None
        if state:
            state_dict = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return protocol.ModuleInfo(handle, type(module).__name__[:200], instance_of, bool(module.training), state_dict)

    # -- requests
    def op_load(self, request: protocol.LoadRequest) -> protocol.Loaded:
        """Run the cells in order. A cell that raises is recorded and the next one runs; a cell still
        running after `cell_seconds` is stopped (SIGALRM), and once one has been, later cells get
        `later_cell_seconds` each (the rubric's): the file is known to hang. Cells in `skip` (stopped in an
        earlier load) are not run again.
        Each cell is compiled with its line numbers shifted to where it starts in the file, so
        tracebacks point at the student's own lines."""
        filename, skip, later_cell_seconds = request.filename, request.skip, request.later_cell_seconds
        module = types.ModuleType("submission")
        module.__file__ = filename
        sys.modules["submission"] = module
        self.namespace = module.__dict__
        errors: list[protocol.CellProblem] = []
        budget = request.cell_seconds

        def stop(signum: int, frame: types.FrameType | None) -> None:
            raise CellTimeout()

        signal.signal(signal.SIGALRM, stop)
        for number, line, source in request.cells:
            if number in skip:
                errors.append(
                    protocol.CellProblem(
                        number, "TimeLimit", "not run again: it did not finish in an earlier attempt", timed_out=True
                    )
                )
                continue
            name = f"<{filename}, cell {number}>"
            lines = source.splitlines(True)
            linecache.cache[name] = (len(source), None, [""] * (line - 1) + lines, name)
            try:
                try:
                    if budget:
                        signal.setitimer(signal.ITIMER_REAL, budget)
                    tree = ast.parse(source, name)
                    ast.increment_lineno(tree, line - 1)
                    exec(compile(tree, name, "exec"), self.namespace)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except CellTimeout:
                errors.append(
                    protocol.CellProblem(
                        number,
                        "TimeLimit",
                        f"stopped after {budget:g} s (an infinite loop?); the cells after it were still run",
                        timed_out=True,
                    )
                )
                if budget is not None and later_cell_seconds is not None:
                    budget = min(budget, later_cell_seconds)
            except SyntaxError as exc:
                if exc.lineno is not None:
                    exc.lineno += line - 1
                errors.append(protocol.CellProblem(number, "SyntaxError", protocol.safe_str(exc, MAX_MESSAGE_CHARS)))
            except BaseException as exc:  # SystemExit too: a cell that exits does not end the load
                errors.append(
                    protocol.CellProblem(number, type(exc).__name__, protocol.safe_str(exc, MAX_MESSAGE_CHARS))
                )
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        listed = [e for n, e in enumerate(errors) if e.timed_out or n < MAX_LOAD_ERRORS]
        if len(listed) < len(errors):
            listed[-1].message += f" (and {len(errors) - len(listed)} more cells raised errors, not listed)"
        defined = {name: type(self.namespace[name]).__name__ for name in self.contract if name in self.namespace}
        return protocol.Loaded(listed, defined)

    def op_get(self, request: protocol.GetRequest) -> Any:
        return self.namespace.get(request.name, protocol.MISSING)

    def op_call(self, request: protocol.CallRequest) -> Any:
        return self.lookup(request.fn)(*request.args, **(request.kwargs or {}))

    def op_build(self, request: protocol.BuildRequest) -> protocol.ModuleInfo:
        torch = self.torch
        torch.manual_seed(request.seed)
        module = self.lookup(request.cls)(*request.args, **(request.kwargs or {}))
        if request.state_dict is not None:
            module.load_state_dict(request.state_dict)
        dtype = getattr(torch, request.dtype) if request.dtype else None
        module = module.to(device=request.device, dtype=dtype)
        return self.register(module, state=request.state_dict is None)

    def op_describe(self, request: protocol.DescribeRequest) -> protocol.ModuleInfo:
        return self.describe(request.handle)

    def op_to(self, request: protocol.ToRequest) -> protocol.ModuleInfo:
        """Move a module the student's code made (make_2d_wrapper's) to the grading device, as `build`
        does with the modules the grader builds."""
        self.objects[request.handle] = self.objects[request.handle].to(request.device)
        return self.describe(request.handle)

    def op_forward(self, request: protocol.ForwardRequest) -> protocol.ForwardReply:
        torch = self.torch
        module = self.objects[request.handle]
        module.train(request.train)
        grad_out = request.grad_out
        x = request.x.to(self.setup.device)
        sent = x.clone()
        if grad_out is not None:
            x.requires_grad_(True)
        head_calls: list[protocol.HeadCall] = []
        removers = []
        heads: Any = getattr(module, "heads", None)
        if request.hooks and isinstance(heads, torch.nn.ModuleList):
            for index, head in enumerate(heads):

                def record(mod: object, args: tuple[Any, ...], output: object, index: int = index) -> None:
                    first = args[0] if args else None
                    head_calls.append(
                        protocol.HeadCall(
                            index,
                            isinstance(first, torch.Tensor)
                            and first.shape == sent.shape
                            and bool(torch.equal(first.detach(), sent)),
                            output.detach().cpu().clone() if isinstance(output, torch.Tensor) else None,
                        )
                    )

                removers.append(head.register_forward_hook(record))
        torch.manual_seed(request.seed)
        recorder = OpRecorder(torch) if request.trace else None
        calls = CallRecorder(torch)
        try:
            if recorder:
                with recorder, calls:
                    y = module(x)
            else:
                with calls:
                    y = module(x)
        finally:
            for remover in removers:
                remover.remove()
        answer = protocol.ForwardReply(y, x.detach().cpu().clone(), head_calls, torch_calls=calls.counts)
        if recorder:
            answer.ops = recorder.ops
            answer.python_calls = recorder.python_calls
        if grad_out is not None and isinstance(y, torch.Tensor) and tuple(y.shape) != tuple(grad_out.shape):
            answer.grad_problem = (
                f"the output has shape {tuple(y.shape)}, not {tuple(grad_out.shape)}, "
                "so its gradients could not be checked"
            )
        elif grad_out is not None and isinstance(y, torch.Tensor):
            module.zero_grad(set_to_none=True)
            backward(y, grad_out.to(y.device, y.dtype))
            grads = {"x": x.grad}
            grads.update({f"param:{name}": p.grad for name, p in module.named_parameters()})
            answer.grads = {k: None if g is None else g.detach().cpu().clone() for k, g in grads.items()}
        return answer

    def op_forward_many(self, request: protocol.ForwardManyRequest) -> Streamed:
        """Forwards for timing (eval mode, no autograd), one seed at a time. This request carries only the
        settings: the worker answers that it is ready, then the grader sends one frame per call holding that
        call's seed, the next only once the previous call's answer has arrived, and times the whole exchange
        on its own clock. So no input exists before its call starts: no call can be batched with, or
        prepared for, a later one, whatever the submission does to this code (it runs beside it).
        Per seed: x of `shape` and a probe R of the output's shape, both standard normal from a generator
        seeded with it, on the device; y = module(x), under the call recorder when `record` (as every forward
        of `op_forward` is); the answer is, per token, (sum y*R, sum |y|, sum y*y) over the output's
        features, in float64. It takes the whole of y, so no call can answer before its forward is done; the
        grader compares it with the reference's answer for the same seed.
        Every call's output (a float64 copy) and record are kept: after the last call the grader sends one
        more frame, `show`, naming the calls whose whole outputs it wants, chosen only then; the answer holds
        those outputs and every call's record. So any timed call may turn out to be a checked one.
        On CUDA a buffer of `flush_bytes` is overwritten before each forward (a cold L2 cache) and the
        device is synchronised after each one (no forward overlaps the next). An exception ends the calls:
        its error reply answers the call (or the request) it happened in."""
        torch = self.torch
        module = self.objects[request.handle]
        module.eval()
        shape, calls, dtype, record = request.shape, request.calls, request.dtype, request.record
        device = self.setup.device
        cuda = device.startswith("cuda")
        if request.threads:
            torch.set_num_threads(request.threads)
        flush_bytes = request.flush_bytes
        flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if cuda and flush_bytes else None
        out_shape = (*shape[:-1], request.out_features)
        channel = self.channel
        outputs: list[Any] = []
        records: list[dict[str, int]] = []
        channel.send(*self.reply(None))  # ready: the grader's clock started before the request was sent
        with torch.no_grad():
            for _ in range(calls):
                frame, _blobs = channel.receive()
                seed = protocol.TimedCall.of(frame).seed
                generator = torch.Generator(device=device).manual_seed(seed)
                x = torch.randn(shape, generator=generator, device=device, dtype=getattr(torch, dtype))
                probe = torch.randn(out_shape, generator=generator, device=device).double()
                if flush is not None:
                    flush.fill_(seed & 0xFF)
                recorder = CallRecorder(torch) if record else None
                if recorder is not None:
                    with recorder:
                        y = module(x)
                    records.append(recorder.counts)
                else:
                    y = module(x)
                if not isinstance(y, torch.Tensor) or tuple(y.shape) != out_shape:
                    raise ValueError(
                        f"the forward returned {getattr(y, 'shape', type(y).__name__)} for an input of "
                        f"shape {tuple(shape)}; expected a tensor of shape {out_shape}"
                    )
                y = y.detach().to(torch.float64, copy=True)
                outputs.append(y)
                answer = torch.stack([(y * probe).sum(-1), y.abs().sum(-1), (y * y).sum(-1)], -1)
                if cuda:
                    torch.cuda.synchronize()
                channel.send(*self.reply(answer.cpu()))
        frame, _blobs = channel.receive()  # the grader's clock has stopped: which outputs it wants whole
        show = protocol.ShowOutputs.of(frame, calls).show
        channel.send(*self.reply(protocol.TimedShown([outputs[i].cpu() for i in show], records)))
        return Streamed()

    def op_drop(self, request: protocol.DropRequest) -> None:
        """Forget a module (a long-lived worker of the reference's frees what each grading built)."""
        self.objects.pop(request.handle, None)

    def op_ping(self, request: protocol.PingRequest) -> protocol.Pong:
        return protocol.Pong(os.getpid())

    def op_stand_in(self, request: protocol.StandInRequest) -> None:
        """Put the submission's own `name` back, then, with a table, stand in for it with a lookup of values
        (a part the check's part calls, wrong or missing in the submission): see `StandInRequest`."""
        own = self.stood_in.pop(request.name, None)
        if own is not None:
            if own is protocol.MISSING:
                self.namespace.pop(request.name, None)
            else:
                self.namespace[request.name] = own
        if request.table is None:
            return
        self.stood_in[request.name] = self.namespace.get(request.name, protocol.MISSING)
        torch, table, name = self.torch, [(list(args), value) for args, value in request.table], request.name

        def same(given: Any, expected: Any) -> bool:
            if isinstance(expected, torch.Tensor):
                return (
                    isinstance(given, torch.Tensor)
                    and given.shape == expected.shape
                    and torch.allclose(given.detach().cpu().double(), expected.double(), rtol=1e-4, atol=1e-6)
                )
            if isinstance(expected, (list, tuple)):
                return (
                    isinstance(given, (list, tuple))
                    and len(given) == len(expected)
                    and all(same(g, e) for g, e in zip(given, expected))
                )
            return bool(given == expected)

        def stand_in(*args: Any) -> Any:
            for inputs, value in table:
                if same(list(args), inputs):
                    if isinstance(value, torch.Tensor) and args and isinstance(args[0], (list, tuple)) and args[0]:
                        return value.to(args[0][0].device)
                    return value
            raise LookupError(f"{name} (a stand-in of the grader's) was called with other values than it expected")

        self.namespace[name] = stand_in

    def lookup(self, name: str) -> Any:
        if name not in self.namespace:
            raise NameError(f"{name} is not defined in your file")
        return self.namespace[name]


class Streamed:
    """What a request returns that has sent all its replies itself (`op_forward_many`)."""


class OpRecorder:
    """Records every ATen op a forward issues (whatever Python name it was called by), plus calls of
    nn.MultiheadAttention and F.multi_head_attention_forward, which are not single ATen ops."""

    def __init__(self, library: types.ModuleType):
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.ops: list[str] = []
        self.python_calls: list[str] = []

        class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch declares no types for it
            supports_higher_order_operators = True

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # torch wraps a mode's __torch_dispatch__ so that torch.compile does not trace into it, and
                # the wrapper's first call imports torch._dynamo: about a second of CPU in every worker, for
                # nothing unless the submission compiles. So the wrapper only where dynamo is loaded already.
                return "torch._dynamo" in sys.modules

            def __torch_dispatch__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                name = getattr(getattr(func, "overloadpacket", None), "__name__", None) or getattr(
                    func, "_name", str(func)
                )
                recorder.ops.append(str(name))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()  # type: ignore[no-untyped-call]  # torch declares no types for it
        self.torch = library
        self.patched: list[tuple[Any, str, str]] = [
            (library.nn.MultiheadAttention, "forward", "nn.MultiheadAttention"),
            (library.nn.functional, "multi_head_attention_forward", "F.multi_head_attention_forward"),
        ]
        self.originals = [getattr(owner, name) for owner, name, _ in self.patched]

    def __enter__(self) -> OpRecorder:
        recorder = self
        for (owner, name, label), original in zip(self.patched, self.originals):

            def counting(*args: Any, _original: Any = original, _label: str = label, **kwargs: Any) -> Any:
                recorder.python_calls.append(_label)
                return _original(*args, **kwargs)

            setattr(owner, name, counting)
        self.mode.__enter__()  # type: ignore[no-untyped-call]  # torch declares no types for it
        return self

    def __exit__(self, *exc: object) -> None:
        for (owner, name, _), original in zip(self.patched, self.originals):
            setattr(owner, name, original)
        self.mode.__exit__(*exc)  # type: ignore[no-untyped-call]  # torch declares no types for it


class CallRecorder:
    """Counts, by name, the PyTorch functions a forward calls (a `TorchFunctionMode`: `torch.Tensor.matmul`,
    `torch.nn.functional.linear`, ...). Every forward the grader asks of a module runs under one, checked and
    timed alike (`op_forward`, `op_forward_many`), so its presence tells a forward nothing about why it runs;
    the grader compares a timed forward's record with a checked one's. It costs a few microseconds per call
    (the reference's and the submission's timed forwards both pay it)."""

    names: dict[Any, str] = {}  # function -> its name, shared by every recorder (equal functions hash equal)

    def __init__(self, library: types.ModuleType):
        from torch.overrides import TorchFunctionMode, resolve_name

        recorder, names = self, self.names
        self.counts: dict[str, int] = {}

        class Mode(TorchFunctionMode):
            def __torch_function__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                try:
                    name = names[func]
                except (KeyError, TypeError):
                    name = function_name(func, resolve_name)
                    if len(names) < 4096:
                        try:
                            names[func] = name
                        except TypeError:
                            pass
                counts = recorder.counts
                if name in counts or len(counts) < MAX_RECORDED_NAMES:
                    counts[name] = counts.get(name, 0) + 1
                return func(*args, **(kwargs or {}))

        self.mode = Mode()

    def __enter__(self) -> CallRecorder:
        self.mode.__enter__()  # type: ignore[no-untyped-call]  # torch declares no types for it
        return self

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)  # type: ignore[no-untyped-call]  # torch declares no types for it


def function_name(func: Any, resolve_name: Any) -> str:
    """A PyTorch function's public name (`torch.Tensor.view`), or its qualified name."""
    try:
        name = resolve_name(func) or getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    except Exception:
        name = None
    return str(name or "?")[:200]


def backward(y: torch.Tensor, grad_out: torch.Tensor) -> None:
    """`y.backward(grad_out)`, as the backward of the scalar sum(y * grad_out): the same gradients to the last bit
    (that sum's gradient with respect to y is grad_out times ones), without what `backward` with an explicit
    gradient imports on its first call (torch's symbolic shapes and sympy: a quarter of a second of CPU)."""
    (y * grad_out).sum().backward()  # type: ignore[no-untyped-call]  # torch declares no types for it


def safe_repr(value: object) -> str:
    try:
        return repr(value)[:200]
    except Exception:  # a hostile __repr__
        return "(unprintable)"


def student_traceback(exc: BaseException, filename: str) -> str:
    """The traceback's frames that are in the student's file, most recent last."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(f"<{filename}")]
        lines = traceback.format_list(frames[-6:]) + traceback.format_exception_only(type(exc), exc)
        return "".join(lines)[-4000:]
    except Exception:
        return ""


def main(argv: list[str]) -> None:
    fd_in, fd_out = int(argv[0]), int(argv[1])
    setup = protocol.WorkerSetup.from_json(argv[2])
    del sys.argv[1:]  # the sources of the sandbox modules; nothing the submission needs
    if setup.uid is not None:
        jail.drop_privileges(setup.uid)
    jail.no_new_privileges()
    jail.hide_grader_packages(list(setup.hide), list(setup.keep))
    os.chdir(setup.workdir)
    import torch

    settle_imports()
    torch.set_num_threads(setup.threads or torch.get_num_threads())
    serve(torch, setup, fd_in, fd_out)


def settle_imports() -> None:
    """Move everything the imports made (torch's hundreds of thousands of objects) out of the garbage
    collector's reach: a full collection then walks only what was made after, so that no forward, timed or
    not, pays tens of milliseconds for walking torch. The same in every worker, fresh or forked (the fork
    server does it once, and its children inherit it)."""
    gc.collect()
    gc.freeze()


def serve(torch: types.ModuleType, setup: protocol.WorkerSetup, fd_in: int, fd_out: int) -> None:
    """Say `ready`, then answer the grader's requests until it closes the channel: the same for a worker
    started fresh (`main`) and for one forked from the fork server (`forkserver`)."""
    channel = Channel(fd_in, fd_out)
    session = Session(torch, setup, channel)
    channel.send(*session.reply(protocol.Ready(os.getpid(), bool(torch.cuda.is_available()))))
    while True:
        try:
            header, blobs = channel.receive()
        except EOFError:  # the grader is done: end now, whatever threads the submission left running
            os._exit(0)
        try:
            value = session.handle(session.request(header, blobs))
            if isinstance(value, Streamed):  # every reply already sent
                continue
            reply, reply_blobs = session.reply(value)
        except BaseException as exc:
            error = protocol.StudentError(
                type(exc).__name__,
                protocol.safe_str(exc, MAX_MESSAGE_CHARS),
                student_traceback(exc, setup.filename),
            )
            reply, reply_blobs = protocol.error_header(error), []
        try:
            channel.send(reply, reply_blobs)
        except Exception as exc:  # an answer that cannot be serialised is the submission's fault
            message = f"the answer could not be sent: {protocol.safe_str(exc, MAX_MESSAGE_CHARS)}"
            channel.send(protocol.error_header(protocol.StudentError(type(exc).__name__, message, "")))
