"""Untrusted side: the worker's request loop, the only grader code that runs beside student code.

The grader starts it as a fresh `python -I -u -c BOOT ...` process (see `client.BOOT`), which loads
this module, `jail` and `protocol` from source under the package name `sandbox`; it imports nothing
else of the grader, and torch only after `jail` has shut the process in. It loads one submission cell
by cell and answers requests: load, get a name, call a function, build a module, describe it, run a
forward (with optional backward, head hooks and a dispatch trace), run forwards for timing, drop a module, ping.

Nothing said here is trusted: the grader validates every reply against the protocol's schema and
compares every value with its own reference computation.
"""

import ast
import json
import linecache
import os
import signal
import sys
import traceback
import types

from . import jail, protocol

# What the worker sends: lists, tuples and dicts of at most this many items, nested at most this deep
# (beyond: the object's class and repr).
MAX_ITEMS, MAX_DEPTH = 4096, 6
# The grader's frames are trusted; these bounds only stop a runaway request.
REQUEST_LIMITS = protocol.FrameLimits(
    header_bytes=256 << 20, blob_bytes=4 << 30, string_chars=1 << 24, list_items=1 << 20
)


class CellTimeout(BaseException):
    """Raised by SIGALRM in a top-level cell that runs too long."""


class Channel:
    def __init__(self, fd_in, fd_out):
        self.fd_in, self.fd_out = fd_in, fd_out

    def read_exact(self, n):
        chunks = []
        while n:
            chunk = os.read(self.fd_in, min(n, 1 << 20))
            if not chunk:
                raise EOFError("the grader closed the channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self):
        return protocol.read_frame(self.read_exact, REQUEST_LIMITS)

    def send(self, header, blobs=()):
        view = memoryview(protocol.pack_frame(header, list(blobs)))
        while view:
            view = view[os.write(self.fd_out, view) :]


class Session:
    """The submission's namespace and the objects built for the grader."""

    def __init__(self, torch, config):
        self.torch = torch
        self.config = config
        self.contract = tuple(config.get("contract", ()))
        self.codec = protocol.TensorCodec(torch)
        self.namespace = {}
        self.objects = {}
        self.built = 0  # handles are never reused, even after a drop

    # -- values
    def other(self, value, depth):
        """What the encoder sends for anything but plain data and tensors: a module as a handle (registered
        for later requests), a list or tuple subclass as a list, anything else as its class and repr."""
        torch = self.torch
        if isinstance(value, torch.nn.Module):
            return self._current.encode(self.register(value))
        if isinstance(value, (list, tuple)):  # subclasses of list and tuple: their items, as a list
            if len(value) <= MAX_ITEMS and depth < MAX_DEPTH:
                return {"$": "list", "items": [self._current.encode(v, depth + 1) for v in list(value)]}
        return {"$": "object", "class": type(value).__name__[:200], "repr": safe_repr(value)}

    def reply(self, value):
        """Encode `value` for the ok-reply; returns (header, blobs)."""
        self._current = protocol.Encoder(self.codec, on_other=self.other, max_items=MAX_ITEMS, max_depth=MAX_DEPTH)
        if isinstance(value, Raw):  # a typed reply: named fields, lists of field records, values
            tree = {
                key: [{k: self._current.encode(v) for k, v in item.items()} for item in field]
                if isinstance(field, RawList)
                else self._current.encode(field)
                for key, field in value.value.items()
            }
        else:
            tree = self._current.encode(value)
        return {"ok": True, "value": tree}, self._current.blobs

    def decode(self, tree, blobs):
        decoder = protocol.Decoder(blobs, REQUEST_LIMITS, self.codec.from_wire)
        return self.resolve(decoder.decode(tree))

    def resolve(self, value):
        if isinstance(value, protocol.Handle):
            return self.objects[value.handle]
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        return value

    def register(self, module, state=True):
        handle = f"h{self.built}"
        self.built += 1
        self.objects[handle] = module
        return self.describe(handle, state)

    def describe(self, handle, state=True):
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
    def op_load(self, cells, filename, cell_seconds=None, later_cell_seconds=None, skip=()):
        """Run the cells in order. A cell that raises is recorded and the next one runs; a cell still
        running after `cell_seconds` is stopped (SIGALRM), and once one has been, later cells get
        `later_cell_seconds` each (the rubric's): the file is known to hang. Cells in `skip` (stopped in an
        earlier load) are not run again.
        Each cell is compiled with its line numbers shifted to where it starts in the file, so
        tracebacks point at the student's own lines."""
        module = types.ModuleType("submission")
        module.__file__ = filename
        sys.modules["submission"] = module
        self.namespace = module.__dict__
        errors = []
        budget = cell_seconds

        def stop(signum, frame):
            raise CellTimeout()

        signal.signal(signal.SIGALRM, stop)
        for number, line, source in cells:
            if number in skip:
                errors.append(
                    {
                        "cell": number,
                        "type": "TimeLimit",
                        "timed_out": True,
                        "message": "not run again: it did not finish in an earlier attempt",
                    }
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
                    {
                        "cell": number,
                        "type": "TimeLimit",
                        "timed_out": True,
                        "message": f"stopped after {budget:g} s (an infinite loop?); the cells after it were still run",
                    }
                )
                budget = min(budget, later_cell_seconds or budget)
            except SyntaxError as exc:
                if exc.lineno is not None:
                    exc.lineno += line - 1
                errors.append(
                    {
                        "cell": number,
                        "type": "SyntaxError",
                        "message": safe_str(exc),
                    }
                )
            except BaseException as exc:  # SystemExit too: a cell that exits does not end the load
                errors.append(
                    {
                        "cell": number,
                        "type": type(exc).__name__,
                        "message": safe_str(exc),
                    }
                )
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        defined = {name: type(self.namespace[name]).__name__ for name in self.contract if name in self.namespace}
        return Raw({"errors": RawList(errors), "defined": defined})

    def op_get(self, name):
        return self.namespace.get(name, protocol.MISSING)

    def op_call(self, fn, args=(), kwargs=None):
        return self.lookup(fn)(*args, **(kwargs or {}))

    def op_build(self, cls, args=(), kwargs=None, state_dict=None, dtype=None, device="cpu", seed=0):
        torch = self.torch
        torch.manual_seed(seed)
        module = self.lookup(cls)(*args, **(kwargs or {}))
        if state_dict is not None:
            module.load_state_dict(state_dict)
        module = module.to(device=device, dtype=getattr(torch, dtype) if dtype else None)
        return self.register(module, state=state_dict is None)

    def op_describe(self, handle):
        return self.describe(handle)

    def op_to(self, handle, device):
        """Move a module the student's code made (make_2d_wrapper's) to the grading device, as `build`
        does with the modules the grader builds."""
        self.objects[handle] = self.objects[handle].to(device)
        return self.describe(handle)

    def op_forward(self, handle, x, train=False, seed=0, grad_out=None, trace=False, hooks=False):
        torch = self.torch
        module = self.objects[handle]
        module.train(train)
        x = x.to(self.config["device"])
        sent = x.clone()
        if grad_out is not None:
            x.requires_grad_(True)
        head_calls = []
        removers = []
        if hooks and isinstance(getattr(module, "heads", None), torch.nn.ModuleList):
            for index, head in enumerate(module.heads):

                def record(mod, args, output, index=index):
                    first = args[0] if args else None
                    head_calls.append(
                        {
                            "index": index,
                            "same_values": isinstance(first, torch.Tensor)
                            and first.shape == sent.shape
                            and bool(torch.equal(first.detach(), sent)),
                            "output": output.detach().cpu().clone() if isinstance(output, torch.Tensor) else None,
                        }
                    )

                removers.append(head.register_forward_hook(record))
        torch.manual_seed(seed)
        recorder = OpRecorder(torch) if trace else None
        try:
            if recorder:
                with recorder:
                    y = module(x)
            else:
                y = module(x)
        finally:
            for remover in removers:
                remover.remove()
        answer = {"y": y, "x_after": x.detach().cpu().clone(), "head_calls": RawList(head_calls)}
        if recorder:
            answer["ops"] = recorder.ops
            answer["python_calls"] = recorder.python_calls
        if grad_out is not None and isinstance(y, torch.Tensor) and tuple(y.shape) != tuple(grad_out.shape):
            answer["grad_problem"] = (
                f"the output has shape {tuple(y.shape)}, not {tuple(grad_out.shape)}, "
                "so its gradients could not be checked"
            )
        elif grad_out is not None and isinstance(y, torch.Tensor):
            module.zero_grad(set_to_none=True)
            y.backward(grad_out.to(y.device, y.dtype))
            grads = {"x": x.grad}
            grads.update({f"param:{name}": p.grad for name, p in module.named_parameters()})
            answer["grads"] = {k: None if g is None else g.detach().cpu().clone() for k, g in grads.items()}
        return Raw(answer)

    def op_forward_many(self, handle, seeds, shape, dtype, out_features, threads=None, flush_bytes=0):
        """Forwards for timing (eval mode, no autograd), on inputs made here from the grader's seeds, so
        no tensor crosses the pipe while the grader's clock runs and no input exists before its request.
        Per seed: x of `shape` and a probe R of the output's shape, both standard normal from a generator
        seeded with it, on the device; y = module(x); the answer is, per token, (sum y*R, sum |y|, sum y*y)
        over the output's features, in float64. It takes the whole of y, so no call can answer before its
        forward is done; the grader compares it with the reference's answer for the same seed.
        On CUDA a buffer of `flush_bytes` is overwritten before each forward (a cold L2 cache) and the
        device is synchronised after each one (no forward overlaps the next)."""
        torch = self.torch
        module = self.objects[handle]
        module.eval()
        device = self.config["device"]
        cuda = device.startswith("cuda")
        if threads:
            torch.set_num_threads(threads)
        flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device) if cuda and flush_bytes else None
        out_shape = (*shape[:-1], out_features)
        answers = []
        with torch.no_grad():
            for seed in seeds:
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
                y = y.double()
                answers.append(torch.stack([(y * probe).sum(-1), y.abs().sum(-1), (y * y).sum(-1)], -1))
                if cuda:
                    torch.cuda.synchronize()
        return [answer.cpu() for answer in answers]

    def op_drop(self, handle):
        """Forget a module (a long-lived worker of the reference's frees what each grading built)."""
        self.objects.pop(handle, None)

    def op_ping(self):
        return {"pid": os.getpid()}

    def lookup(self, name):
        if name not in self.namespace:
            raise NameError(f"{name} is not defined in your file")
        return self.namespace[name]


class Raw:
    """A reply whose top level is a dict of named fields, not a single value."""

    def __init__(self, value):
        self.value = value


class RawList(list):
    """A list of records (dicts of named fields) inside a Raw reply."""


class OpRecorder:
    """Records every ATen op a forward issues (whatever Python name it was called by), plus calls of
    nn.MultiheadAttention and F.multi_head_attention_forward, which are not single ATen ops."""

    def __init__(self, torch):
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.ops, self.python_calls = [], []

        class Mode(TorchDispatchMode):
            supports_higher_order_operators = True

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = getattr(getattr(func, "overloadpacket", None), "__name__", None) or getattr(
                    func, "_name", str(func)
                )
                recorder.ops.append(str(name))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.torch = torch
        self.patched = [
            (torch.nn.MultiheadAttention, "forward", "nn.MultiheadAttention"),
            (torch.nn.functional, "multi_head_attention_forward", "F.multi_head_attention_forward"),
        ]
        self.originals = [getattr(owner, name) for owner, name, _ in self.patched]

    def __enter__(self):
        recorder = self
        for (owner, name, label), original in zip(self.patched, self.originals):

            def counting(*args, _original=original, _label=label, **kwargs):
                recorder.python_calls.append(_label)
                return _original(*args, **kwargs)

            setattr(owner, name, counting)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        for (owner, name, _), original in zip(self.patched, self.originals):
            setattr(owner, name, original)
        return self.mode.__exit__(*exc)


def safe_str(exc):
    try:
        return str(exc)[:2000]
    except Exception:
        return "(the exception could not be printed)"


def safe_repr(value):
    try:
        return repr(value)[:200]
    except Exception:  # a hostile __repr__
        return "(unprintable)"


def student_traceback(exc, filename):
    """The traceback's frames that are in the student's file, most recent last."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(f"<{filename}")]
        lines = traceback.format_list(frames[-6:]) + traceback.format_exception_only(type(exc), exc)
        return "".join(lines)[-4000:]
    except Exception:
        return ""


def main(argv):
    fd_in, fd_out = int(argv[0]), int(argv[1])
    config = json.loads(argv[2])
    del sys.argv[1:]  # the sources of the sandbox modules; nothing the submission needs
    if config.get("uid") is not None:
        jail.drop_privileges(config["uid"])
    jail.no_new_privileges()
    jail.hide_grader_packages(config["hide"], config["keep"])
    os.chdir(config["workdir"])
    import torch

    torch.set_num_threads(config.get("threads") or torch.get_num_threads())
    channel = Channel(fd_in, fd_out)
    session = Session(torch, config)
    channel.send({"ok": True, "value": {"pid": os.getpid(), "cuda": bool(torch.cuda.is_available())}})
    while True:
        try:
            header, blobs = channel.receive()
        except EOFError:  # the grader is done: end now, whatever threads the submission left running
            os._exit(0)
        op = header.get("op")
        try:
            if op not in protocol.OPS or op == "ready":
                raise ValueError(f"unknown request {op!r}")
            kwargs = session.decode(header.get("args", {"$": "dict", "items": []}), blobs)
            reply, reply_blobs = session.reply(getattr(session, f"op_{op}")(**kwargs))
        except BaseException as exc:
            reply, reply_blobs = (
                {
                    "ok": False,
                    "error": {
                        "type": type(exc).__name__,
                        "message": safe_str(exc),
                        "traceback": student_traceback(exc, config["filename"]),
                    },
                },
                [],
            )
        try:
            channel.send(reply, reply_blobs)
        except Exception as exc:  # an answer that cannot be serialised is the submission's fault
            channel.send(
                {
                    "ok": False,
                    "error": {
                        "type": type(exc).__name__,
                        "message": f"the answer could not be sent: {safe_str(exc)}",
                        "traceback": "",
                    },
                }
            )
