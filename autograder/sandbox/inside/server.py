"""Untrusted side: the worker's request loop, the only grader code that runs beside student code.

The grader starts it as a fresh `python -I -u -c BOOT ...` process (see `launcher.BOOT`), which loads
this module, `jail` and `protocol` from source under the package name `sandbox`; it imports nothing
else of the grader, and torch only after `jail` has shut the process in. It loads one submission cell
by cell and answers requests: load, get a name, call a function, build a module, describe it, run a
forward (with optional backward and head hooks), run forwards for timing, capture a forward as a graph of ATen
operations, rebuild such a graph as a module (`replay`: sent only to workers that never loaded a submission), drop
a module, ping.

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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

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


def unhandled(request: NoReturn) -> NoReturn:
    """A request of no type `Session.handle` has a case for: mypy refuses any call of this that can be reached."""
    raise ValueError(f"no operation answers {request!r}")


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
        its replies itself. One case per request type, which mypy checks against the method and for every type of
        `protocol.Request` (`unhandled`)."""
        match request:
            case protocol.LoadRequest():
                return self.op_load(request)
            case protocol.GetRequest():
                return self.op_get(request)
            case protocol.CallRequest():
                return self.op_call(request)
            case protocol.BuildRequest():
                return self.op_build(request)
            case protocol.DescribeRequest():
                return self.op_describe(request)
            case protocol.ToRequest():
                return self.op_to(request)
            case protocol.ForwardRequest():
                return self.op_forward(request)
            case protocol.ForwardManyRequest():
                return self.op_forward_many(request)
            case protocol.CaptureRequest():
                return self.op_capture(request)
            case protocol.ReplayRequest():
                return self.op_replay(request)
            case protocol.DropRequest():
                return self.op_drop(request)
            case protocol.PingRequest():
                return self.op_ping(request)
            case protocol.StandInRequest():
                return self.op_stand_in(request)
            case _:
                unhandled(request)

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
        module = types.ModuleType("submission")
        module.__file__ = request.filename
        sys.modules["submission"] = module
        self.namespace = module.__dict__
        return run_cells(request, self.namespace, self.contract)

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
        removers = watch_heads(torch, module, sent, head_calls) if request.hooks else []
        torch.manual_seed(request.seed)
        try:
            y = module(x)
        finally:
            for remover in removers:
                remover.remove()
        answer = protocol.ForwardReply(y, x.detach().cpu().clone(), head_calls)
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
        seeded with it, on the device; y = module(x); the answer is, per token, (sum y*R, sum |y|, sum y*y)
        over the output's features, in float64. It takes the whole of y, so no call can answer before its
        forward is done; the grader compares it with the reference's answer for the same seed.
        Every call's output (a float64 copy) is kept: after the last call the grader sends one more frame,
        `show`, naming the calls whose whole outputs it wants, chosen only then. So any timed call may turn out
        to be a checked one.
        On CUDA a buffer of `flush_bytes` is overwritten before each forward (a cold L2 cache) and the
        device is synchronised after each one (no forward overlaps the next). An exception ends the calls:
        its error reply answers the call (or the request) it happened in."""
        module = self.objects[request.handle]
        module.eval()
        timed_forwards(self.torch, module, request, self.setup.device, self.channel, self.reply)
        return Streamed()

    def op_capture(self, request: protocol.CaptureRequest) -> protocol.Captured:
        """The module's forward as the ATen operations it runs (`make_fx` over `functional_call`, so that the
        module's parameters and buffers are the graph's inputs, by name), in eval mode without autograd, on an
        input drawn from the request's seed. Whatever the forward computes where the capture cannot see it
        becomes a constant of the graph: right only for this one input."""
        torch = self.torch
        module = self.objects[request.handle]
        module.eval()
        generator = torch.Generator(device=request.device).manual_seed(request.seed)
        x = torch.randn(request.shape, generator=generator, device=request.device, dtype=getattr(torch, request.dtype))
        graph, state = capture(torch, module, x, request.max_nodes)
        known = set(request.known)
        return protocol.Captured(graph, {k: v.detach().cpu() for k, v in state.items() if k not in known})

    def op_replay(self, request: protocol.ReplayRequest) -> protocol.ModuleInfo:
        """A captured graph rebuilt as a module of its own (`replayed`), registered like any module built."""
        torch = self.torch
        graph = protocol.Graph.from_wire(request.graph, lambda value: isinstance(value, torch.Tensor))
        if len(request.state) != len(graph.inputs):
            raise ValueError(f"{len(request.state)} state tensors for a graph of {len(graph.inputs)} inputs")
        return self.register(replayed(torch, graph, list(request.state), request.device), state=False)

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
        table = [(list(args), value) for args, value in request.table]
        self.namespace[request.name] = stand_in(self.torch, request.name, table)

    def lookup(self, name: str) -> Any:
        if name not in self.namespace:
            raise NameError(f"{name} is not defined in your file")
        return self.namespace[name]


def watch_heads(torch: types.ModuleType, module: Any, sent: Any, calls: list[protocol.HeadCall]) -> list[Any]:
    """Forward hooks on a wrapper's `heads` (a ModuleList; none otherwise) that note into `calls` each head's call:
    its index, whether it received the input `sent` unchanged, and its output; the hooks' removers."""
    heads: Any = getattr(module, "heads", None)
    if not isinstance(heads, torch.nn.ModuleList):
        return []
    removers = []
    for index, head in enumerate(heads):

        def record(mod: object, args: tuple[Any, ...], output: object, index: int = index) -> None:
            first = args[0] if args else None
            calls.append(
                protocol.HeadCall(
                    index,
                    isinstance(first, torch.Tensor)
                    and first.shape == sent.shape
                    and bool(torch.equal(first.detach(), sent)),
                    output.detach().cpu().clone() if isinstance(output, torch.Tensor) else None,
                )
            )

        removers.append(head.register_forward_hook(record))
    return removers


def timed_forwards(
    torch: types.ModuleType,
    module: Any,
    request: protocol.ForwardManyRequest,
    device: str,
    channel: Channel,
    reply: Callable[[Any], tuple[dict[str, Any], list[bytes | bytearray]]],
) -> None:
    """`Session.op_forward_many`'s exchange: ready, then one answer per call's seed, then the outputs shown."""
    shape, calls, dtype = request.shape, request.calls, request.dtype
    cuda = device.startswith("cuda")
    if request.threads:
        torch.set_num_threads(request.threads)
    flush_bytes = request.flush_bytes
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if cuda and flush_bytes else None
    out_shape = (*shape[:-1], request.out_features)
    outputs: list[Any] = []
    channel.send(*reply(None))  # ready: the grader's clock started before the request was sent
    with torch.no_grad():
        for _ in range(calls):
            frame, _blobs = channel.receive()
            seed = protocol.TimedCall.of(frame).seed
            generator = torch.Generator(device=device).manual_seed(seed)
            x = torch.randn(shape, generator=generator, device=device, dtype=getattr(torch, dtype))
            probe = torch.randn(out_shape, generator=generator, device=device).double()
            if flush is not None:
                flush.fill_(seed & 0xFF)
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
            channel.send(*reply(answer.cpu()))
    frame, _blobs = channel.receive()  # the grader's clock has stopped: which outputs it wants whole
    show = protocol.ShowOutputs.of(frame, calls).show
    channel.send(*reply(protocol.TimedShown([outputs[i].cpu() for i in show])))


def run_cells(request: protocol.LoadRequest, namespace: dict[str, Any], contract: Iterable[str]) -> protocol.Loaded:
    """`Session.op_load`'s cells, run in `namespace`: what raised or was stopped, and what the file defines of the
    names in `contract`, by type."""
    filename, skip, later_cell_seconds = request.filename, request.skip, request.later_cell_seconds
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
                exec(compile(tree, name, "exec"), namespace)
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
            errors.append(protocol.CellProblem(number, type(exc).__name__, protocol.safe_str(exc, MAX_MESSAGE_CHARS)))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    listed = [e for n, e in enumerate(errors) if e.timed_out or n < MAX_LOAD_ERRORS]
    if len(listed) < len(errors):
        listed[-1].message += f" (and {len(errors) - len(listed)} more cells raised errors, not listed)"
    defined = {name: type(namespace[name]).__name__ for name in contract if name in namespace}
    return protocol.Loaded(listed, defined)


def stand_in(torch: types.ModuleType, name: str, table: list[tuple[list[Any], Any]]) -> Callable[..., Any]:
    """A stand-in for the submission's `name` (`Session.op_stand_in`): it answers the calls whose arguments are
    those of a row of `table` with that row's value, and refuses any other."""

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

    def standing_in(*args: Any) -> Any:
        for inputs, value in table:
            if same(list(args), inputs):
                if isinstance(value, torch.Tensor) and args and isinstance(args[0], (list, tuple)) and args[0]:
                    return value.to(args[0][0].device)
                return value
        raise LookupError(f"{name} (a stand-in of the grader's) was called with other values than it expected")

    return standing_in


class Streamed:
    """What a request returns that has sent all its replies itself (`op_forward_many`)."""


def capture(
    torch: types.ModuleType, module: torch.nn.Module, x: torch.Tensor, max_nodes: int
) -> tuple[protocol.Graph, dict[str, torch.Tensor]]:
    """`module(x)` captured as a graph of ATen operations (`make_fx`, tracing real tensors): the module's
    parameters and buffers, by name, then x, are its inputs. A forward that branches on a tensor's value, or asks
    for one (`.item()`), cannot be captured: make_fx raises, at the student's line."""
    prepare_capture()
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    state: dict[str, Any] = dict(module.named_parameters())
    state.update(module.named_buffers())
    names = list(state)

    def forward(*args: Any) -> Any:
        return functional_call(module, dict(zip(names, args[:-1])), (args[-1],))

    with torch.no_grad():
        graph_module = make_fx(forward, tracing_mode="real")(*[t.detach() for t in state.values()], x)
    return graph_of(torch, graph_module, names, max_nodes), {k: v.detach() for k, v in state.items()}


def graph_of(torch: types.ModuleType, graph_module: Any, names: list[str], max_nodes: int) -> protocol.Graph:
    """A captured `torch.fx.GraphModule` as the protocol's plain data (`protocol.Graph`)."""
    import operator

    refs: dict[Any, protocol.GraphRef] = {}
    nodes: list[protocol.GraphNode] = []
    constants: list[Any] = []
    output: Any = None
    inputs = 0
    specials = (
        (torch.dtype, "dtype"),
        (torch.device, "device"),
        (torch.layout, "layout"),
        (torch.memory_format, "memory_format"),
    )

    def arg(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return refs[value]
        if isinstance(value, tuple):
            return tuple(arg(v) for v in value)
        if isinstance(value, list):
            return [arg(v) for v in value]
        for kind, name in specials:
            if isinstance(value, kind):
                return protocol.GraphSpecial(name, str(value).removeprefix("torch."))
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise ValueError(f"the captured forward has an argument the grader cannot send: {type(value).__name__}")

    for node in graph_module.graph.nodes:
        if node.op == "placeholder":
            refs[node] = protocol.GraphRef("input", inputs)
            inputs += 1
        elif node.op == "get_attr":
            refs[node] = protocol.GraphRef("constant", len(constants))
            constants.append(getattr(graph_module, node.target).detach().cpu().clone())
        elif node.op == "call_function":
            if len(nodes) >= max_nodes:
                raise ValueError(f"the captured forward runs more than {max_nodes} operations")
            target = "operator.getitem" if node.target is operator.getitem else str(node.target)
            refs[node] = protocol.GraphRef("node", len(nodes))
            nodes.append(
                protocol.GraphNode(target[:200], arg(tuple(node.args)), {k: arg(v) for k, v in node.kwargs.items()})
            )
        elif node.op == "output":
            output = arg(node.args[0])
    return protocol.Graph(tuple(names), tuple(nodes), output, tuple(constants))


def replayed(torch: types.ModuleType, graph: protocol.Graph, state: list[Any], device: str) -> Any:
    """A captured graph rebuilt as a `torch.fx.GraphModule` and wrapped in a module whose forward(x) runs it on
    `state` and x. Only ATen operations (and `operator.getitem` of their tuple results) are looked up, by name,
    in `torch.ops.aten`: nothing else a graph names can run."""
    import operator

    fx = torch.fx
    body = fx.Graph()
    root = torch.nn.Module()
    inputs = [body.placeholder(f"state_{i}") for i in range(len(graph.inputs))] + [body.placeholder("x")]
    constants = []
    for index, tensor in enumerate(graph.constants):
        root.register_buffer(f"constant_{index}", tensor.to(device))
        constants.append(body.get_attr(f"constant_{index}"))
    nodes: list[Any] = []
    by_kind = {"input": inputs, "node": nodes, "constant": constants}

    def arg(value: Any) -> Any:
        if isinstance(value, protocol.GraphRef):
            return by_kind[value.kind][value.index]
        if isinstance(value, protocol.GraphSpecial):
            return special(torch, value)
        if isinstance(value, tuple):
            return tuple(arg(v) for v in value)
        if isinstance(value, list):
            return [arg(v) for v in value]
        return value

    for node in graph.nodes:
        function = operator.getitem if node.target == "operator.getitem" else aten_operation(torch, node.target)
        nodes.append(body.call_function(function, arg(node.args), {k: arg(v) for k, v in node.kwargs.items()}))
    body.output(arg(graph.output))
    body.lint()
    return replay_module(torch)(fx.GraphModule(root, body), [t.to(device) for t in state])


def aten_operation(torch: types.ModuleType, target: str) -> Any:
    """`aten.NAME.OVERLOAD`, looked up in torch.ops.aten; anything else is refused."""
    namespace, _, rest = target.partition(".")
    name, _, overload = rest.partition(".")
    if namespace != "aten" or not name or not overload or "." in overload:
        raise ValueError(f"{target} is not an ATen operation")
    operation = getattr(getattr(torch.ops.aten, name), overload)
    if not isinstance(operation, torch._ops.OpOverload):
        raise ValueError(f"{target} is not an ATen operation")
    return operation


def special(torch: types.ModuleType, value: protocol.GraphSpecial) -> Any:
    """A dtype, device, layout or memory format, by name."""
    if value.kind == "device":
        return torch.device(value.name)
    found = getattr(torch, value.name, None)
    kinds = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}
    if not isinstance(found, kinds[value.kind]):
        raise ValueError(f"{value.name} is not a {value.kind}")
    return found


_REPLAY_MODULE: list[Any] = []


def replay_module(torch: types.ModuleType) -> Any:
    """The class of a replayed graph's module (made once torch is imported): forward(x) is graph(*state, x)."""
    if not _REPLAY_MODULE:

        class Replayed(torch.nn.Module):  # type: ignore[name-defined,misc]  # torch is passed in
            def __init__(self, graph: Any, state: list[Any]):
                super().__init__()
                self.graph = graph
                self.state = state

            def forward(self, x: Any) -> Any:
                return self.graph(*self.state, x)

        _REPLAY_MODULE.append(Replayed)
    return _REPLAY_MODULE[0]


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


def prepare_capture() -> None:
    """Import what capturing a forward needs (`make_fx` imports torch's compiler stack on its first call: a second
    or two of CPU), once, and settle it (`settle_imports`). The fork server does it before it forks, so that a
    forked worker's first capture costs only itself; a worker started fresh, at its first capture."""
    if "torch._dynamo" in sys.modules and "torch.fx.experimental.proxy_tensor" in sys.modules:
        return
    import torch._dynamo  # noqa: F401  (make_fx's first call imports it)
    import torch.func  # noqa: F401
    import torch.fx.experimental.proxy_tensor  # noqa: F401

    settle_imports()


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
