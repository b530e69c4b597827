"""The untrusted worker: loads one submission and answers the grader's requests over two pipes.

It runs as `python -I -c <this source> FD_IN FD_OUT CONFIG_JSON` in a fresh process, never imported
by the grader, and imports only the standard library and torch: nothing of `autograder` or
`reference`. Every message either way is a length-prefixed `torch.save` of plain data and tensors,
read with `torch.load(weights_only=True)`. Nothing said here is trusted: the grader checks each
answer against its own reference computation.
"""
import ctypes
import io
import json
import linecache
import os
import struct
import sys
import time
import traceback
import types

CONTRACT = (
    "CausalAttention", "combine", "MultiHeadAttentionWrapper", "make_2d_wrapper",
    "head_column_ranges", "split_columns", "EIGHT_COLUMNS_FOUR_HEADS", "HEADS_RUN",
    "OUTPUT_SHAPE_STEP", "MultiHeadAttention", "fuse_heads",
)


# ----------------------------------------------------------------------------------------------
# The sandbox: hide the grader's files, make the rest read-only, lock it in, before any student code.

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_REMOUNT, MS_RDONLY = 2, 4, 4096, 16384, 32, 1
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 1, 442


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_sandbox(hide, keep):
    """Inside fresh user, mount, pid and net namespaces (made by `unshare`): mask `hide` with empty
    tmpfs, re-expose `keep` read-only, make every other mount read-only, then enter a nested
    user+mount namespace so the student's code cannot undo any of it (the mounts become locked)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    keep_fds = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in keep if os.path.isdir(path)]

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    _check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr),
                        ctypes.sizeof(attr)), "mount_setattr / read-only")
    for path in hide:
        if os.path.isdir(path):
            _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                              b"size=256m,mode=0777"), f"mask {path}")
    for path, fd in keep_fds:
        os.makedirs(path, exist_ok=True)
        source = f"/proc/self/fd/{fd}".encode()
        _check(libc.mount(source, path.encode(), None, MS_BIND | MS_REC, None), f"keep {path}")
        _check(libc.mount(None, path.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None),
               f"read-only {path}")
        os.close(fd)
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "lock the mounts")


class GraderPackageBlocker:
    """Without the namespace sandbox, at least make `import reference` / `import autograder` fail.
    A speed bump, not a wall: code in this process can remove it (results.json says isolation=process)."""

    BLOCKED = ("reference", "autograder")

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def hide_grader_packages(hidden, keep):
    def inside(path, parents):
        path = os.path.abspath(path or ".")
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)

    sys.path[:] = [p for p in sys.path if inside(p, keep) or not inside(p, hidden)]
    sys.meta_path.insert(0, GraderPackageBlocker())


# ----------------------------------------------------------------------------------------------
# Messages

def read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the grader closed the channel")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(torch, fd):
    (size,) = struct.unpack(">Q", read_exact(fd, 8))
    return torch.load(io.BytesIO(read_exact(fd, size)), weights_only=True)


def send(torch, fd, message):
    buffer = io.BytesIO()
    torch.save(message, buffer)
    data = buffer.getvalue()
    view = memoryview(struct.pack(">Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


# ----------------------------------------------------------------------------------------------
# The session: the submission's namespace and the objects built for the grader.

class Session:
    def __init__(self, torch, config):
        self.torch = torch
        self.config = config
        self.namespace = None
        self.objects = {}

    # -- conversion between plain data and live objects
    def encode(self, value, depth=0):
        torch = self.torch
        if depth > 6:
            return {"type": "object", "class": type(value).__name__, "repr": "(nested too deeply)"}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"type": "plain", "value": value}
        if isinstance(value, torch.Tensor):
            return {"type": "tensor", "value": value.detach().cpu().clone(), "device": str(value.device),
                    "requires_grad": bool(value.requires_grad)}
        if isinstance(value, (list, tuple)) and len(value) <= 4096:
            return {"type": type(value).__name__ if type(value) in (list, tuple) else "list",
                    "items": [self.encode(v, depth + 1) for v in value]}
        if isinstance(value, torch.nn.Module):
            handle = f"h{len(self.objects)}"
            self.objects[handle] = value
            return self.describe(handle)
        try:
            text = repr(value)[:200]
        except Exception:  # a hostile __repr__
            text = "(unprintable)"
        return {"type": "object", "class": type(value).__name__, "repr": text}

    def decode(self, value):
        if isinstance(value, dict) and "__handle__" in value:
            return self.objects[value["__handle__"]]
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if isinstance(value, dict):
            return {k: self.decode(v) for k, v in value.items()}
        return value

    def describe(self, handle, state=True):
        module = self.objects[handle]
        instance_of = [name for name in CONTRACT
                       if isinstance(self.namespace.get(name), type) and isinstance(module, self.namespace[name])]
        description = {"type": "module", "handle": handle, "class": type(module).__name__,
                       "instance_of": instance_of, "training": bool(module.training)}
        if state:
            description["state_dict"] = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return description

    # -- requests
    def op_load(self, cells, filename, cell_seconds=None, skip=()):
        """Run the cells in order. A cell that raises is recorded and the next one runs; a cell still
        running after `cell_seconds` is stopped (SIGALRM), and once one has been, later cells get 1 s:
        the file is known to hang. Cells in `skip` (stopped in an earlier load) are not run again."""
        import signal

        module = types.ModuleType("submission")
        module.__file__ = filename
        sys.modules["submission"] = module
        self.namespace = module.__dict__
        errors = []
        budget = cell_seconds

        def stop(signum, frame):
            raise CellTimeout()

        signal.signal(signal.SIGALRM, stop)
        for number, source in cells:
            if number in skip:
                errors.append({"cell": number, "type": "TimeLimit", "timed_out": True, "traceback": "",
                               "message": "not run again: it did not finish in an earlier attempt"})
                continue
            name = f"<{filename}, cell {number}>"
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            try:
                try:
                    if budget:
                        signal.setitimer(signal.ITIMER_REAL, budget)
                    exec(compile(source, name, "exec"), self.namespace)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except CellTimeout as exc:
                errors.append({"cell": number, "type": "TimeLimit", "timed_out": True,
                               "message": f"stopped after {budget:g} s (an infinite loop?); the cells after it were still run",
                               "traceback": student_traceback(exc, filename)})
                budget = min(budget, 1.0)
            except BaseException as exc:  # SystemExit too: a cell that exits does not end the load
                errors.append({"cell": number, "type": type(exc).__name__, "message": safe_str(exc),
                               "traceback": student_traceback(exc, filename)})
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        defined = {name: type(self.namespace[name]).__name__ for name in CONTRACT if name in self.namespace}
        return {"errors": errors, "defined": defined}

    def op_get(self, name):
        if name not in self.namespace:
            return {"type": "missing"}
        return self.encode(self.namespace[name])

    def op_call(self, fn, args=(), kwargs=None):
        function = self.lookup(fn)
        return self.encode(function(*self.decode(list(args)), **self.decode(kwargs or {})))

    def op_build(self, cls, args=(), kwargs=None, state_dict=None, dtype=None, device="cpu", seed=0):
        torch = self.torch
        torch.manual_seed(seed)
        module = self.lookup(cls)(*self.decode(list(args)), **self.decode(kwargs or {}))
        if state_dict is not None:
            module.load_state_dict(state_dict)
        module = module.to(device=device, dtype=getattr(torch, dtype) if dtype else None)
        handle = f"h{len(self.objects)}"
        self.objects[handle] = module
        return self.describe(handle, state=state_dict is None)

    def op_describe(self, handle):
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
                    head_calls.append({
                        "index": index,
                        "same_object": first is x,
                        "same_values": isinstance(first, torch.Tensor) and first.shape == sent.shape
                        and bool(torch.equal(first.detach(), sent)),
                        "output": output.detach().cpu().clone() if isinstance(output, torch.Tensor) else None,
                    })
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
        answer = {"y": self.encode(y), "x_after": x.detach().cpu().clone(), "head_calls": head_calls}
        if recorder:
            answer["ops"] = recorder.ops
            answer["python_calls"] = recorder.python_calls
        if grad_out is not None and isinstance(y, torch.Tensor) and tuple(y.shape) != tuple(grad_out.shape):
            answer["grad_problem"] = (f"the output has shape {tuple(y.shape)}, not {tuple(grad_out.shape)}, "
                                      "so its gradients could not be checked")
        elif grad_out is not None and isinstance(y, torch.Tensor):
            module.zero_grad(set_to_none=True)
            y.backward(grad_out.to(y.device, y.dtype))
            grads = {"x": x.grad}
            grads.update({f"param:{name}": p.grad for name, p in module.named_parameters()})
            answer["grads"] = {k: None if g is None else g.detach().cpu().clone() for k, g in grads.items()}
        return answer

    def op_ping(self):
        return {"pid": os.getpid()}

    def lookup(self, name):
        if name not in self.namespace:
            raise NameError(f"{name} is not defined in your file")
        return self.namespace[name]


class CellTimeout(BaseException):
    """Raised by SIGALRM in a top-level cell that runs too long."""


class OpRecorder:
    """Records every ATen op a forward issues (whatever Python name it was called by), plus calls of
    nn.MultiheadAttention and flex attention, which are not single ATen ops."""

    def __init__(self, torch):
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.ops, self.python_calls = [], []

        class Mode(TorchDispatchMode):
            supports_higher_order_operators = True

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = getattr(getattr(func, "overloadpacket", None), "__name__", None) or getattr(func, "_name", str(func))
                recorder.ops.append(str(name))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mha_class = torch.nn.MultiheadAttention
        self.original_forward = self.mha_class.forward

    def __enter__(self):
        recorder, original = self, self.original_forward

        def counting_forward(module, *args, **kwargs):
            recorder.python_calls.append("nn.MultiheadAttention")
            return original(module, *args, **kwargs)

        self.mha_class.forward = counting_forward
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mha_class.forward = self.original_forward
        return self.mode.__exit__(*exc)


def safe_str(exc):
    try:
        return str(exc)[:2000]
    except Exception:
        return "(the exception could not be printed)"


def student_traceback(exc, filename):
    """The traceback's frames that are in the student's file, most recent last."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(f"<{filename}")]
        lines = traceback.format_list(frames[-6:]) + traceback.format_exception_only(type(exc), exc)
        return "".join(lines)[-4000:]
    except Exception:
        return ""


def main():
    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    config = json.loads(sys.argv[3])
    if config.get("sandbox"):
        enter_sandbox(config["hide"], config["keep"])
        os.chdir(config["workdir"])
    else:
        hide_grader_packages(config["hide"], config["keep"])
    import torch

    torch.set_num_threads(config.get("threads") or torch.get_num_threads())
    session = Session(torch, config)
    send(torch, fd_out, {"ok": True, "value": {"ready": True, "pid": os.getpid(),
                                                 "cuda": torch.cuda.is_available()}})
    while True:
        try:
            request = receive(torch, fd_in)
        except EOFError:
            return
        op = request.pop("op")
        started = time.perf_counter()
        try:
            value = getattr(session, f"op_{op}")(**request)
            reply = {"ok": True, "value": value}
        except BaseException as exc:
            reply = {"ok": False, "error": {"type": type(exc).__name__, "message": safe_str(exc),
                                             "traceback": student_traceback(exc, config["filename"])}}
        reply["seconds"] = time.perf_counter() - started
        try:
            send(torch, fd_out, reply)
        except Exception as exc:  # an answer that cannot be serialised is the submission's fault
            send(torch, fd_out, {"ok": False, "error": {"type": type(exc).__name__,
                                                         "message": f"the answer could not be sent: {safe_str(exc)}",
                                                         "traceback": ""}})


if __name__ == "__main__":
    main()
