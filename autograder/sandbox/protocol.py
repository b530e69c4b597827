"""The wire protocol between the grader (trusted) and the worker (untrusted): frames, values, replies.

Standard library only: this module runs on both sides of the trust boundary, and inside the worker
it is loaded before any student code. torch is passed in where tensors are converted
(`TensorCodec(torch)`), never imported here.

A frame is

    b"MHA1" | u32 header length | u32 blob count | u64 blob length x count | header | blobs

The header is UTF-8 JSON; blobs are the raw bytes of contiguous tensors, referred to from the header
by index. No pickle, on either side: a tensor is a dtype name, a shape and exactly
`numel * itemsize` bytes, so there is nothing to execute, nothing compressed, no shared storage and
no strides to fake. Every size is checked against `FrameLimits` before it is read, and every string the
worker sends is truncated and cleaned of control characters and lone surrogates when it is decoded.
The grader reads each blob once, into a buffer of its announced size that becomes the tensor's memory
(`read_frame`'s `read_into`, then `TensorCodec.from_wire`): a reply costs the grader its blobs' bytes
once, plus its header parsed (at most `header_bytes` of JSON).

Values (what a request's arguments and a reply's answer are made of) are JSON scalars, or objects
tagged with "$": tensor, list, tuple, dict (string keys), module (a handle to a module living in the
worker), handle (the grader naming such a module), object (anything else: its class and repr).
Replies are typed per operation (`parse_reply`), and anything that does not fit its schema raises
`ProtocolError`: the worker's fault, never the grader's.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch  # for annotations only: torch is passed in (`TensorCodec`), never imported here

T = TypeVar("T")

FRAME_MAGIC = b"MHA1"
_PREFIX = struct.Struct(">4sII")
_BLOB_LENGTH = struct.Struct(">Q")

# dtype name -> bytes per element; the only dtypes that cross the wire
DTYPES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


class ProtocolError(Exception):
    """A frame or reply that breaks the protocol: malformed, oversized or of the wrong shape."""


@dataclass(frozen=True)
class FrameLimits:
    """Bounds on one frame, checked before anything is materialised."""

    header_bytes: int = 1 << 20  # JSON: about 25 times its size in Python objects once parsed
    blobs: int = 4096
    blob_bytes: int = 512 << 20  # all blobs of one frame together
    depth: int = 32  # nesting of values
    string_chars: int = 4000  # any one string from the worker
    list_items: int = 1 << 16  # any one list, and all of a frame's value nodes together x 4


# Unicode's bidirectional controls: they reorder what a terminal, an editor or a page shows (U+202E makes
# "mha\u202eyp.py" read "mha.py"), so they are replaced like control characters.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


# What must not reach a terminal, a page or a file as it is: a control character (C0 but newline and tab,
# DEL, C1) or a bidirectional control. One pattern, so that a whole string is cleaned in one pass.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + "".join(sorted(BIDI_CONTROLS)) + "]")


def unsafe_char(ch: str) -> bool:
    """Whether the character `ch` is one `UNSAFE` matches."""
    return UNSAFE.fullmatch(ch) is not None


def clean_text(text: Any, limit: int) -> str:
    """A string safe for a terminal, HTML, JSON and a CSV cell: at most `limit` characters, no lone
    surrogates, no control characters but newline and tab and no bidirectional controls (each becomes
    U+FFFD)."""
    if not isinstance(text, str):
        raise ProtocolError(f"expected a string, got {type(text).__name__}")
    cut = text[:limit]
    cut = cut.encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> "?"
    cleaned = UNSAFE.sub("\ufffd", cut)
    return cleaned + (f"... [{len(text) - limit:,} more characters]" if len(text) > limit else "")


# ----------------------------------------------------------------------------------------------
# Frames


def pack_frame(header: dict[str, Any], blobs: list[bytes | bytearray]) -> bytes:
    body = json.dumps(header, separators=(",", ":"), allow_nan=True).encode()
    lengths = b"".join(_BLOB_LENGTH.pack(len(b)) for b in blobs)
    return _PREFIX.pack(FRAME_MAGIC, len(body), len(blobs)) + lengths + body + b"".join(blobs)


def read_frame(
    read_exact: Callable[[int], bytes],
    limits: FrameLimits,
    read_into: Callable[[memoryview], None] | None = None,
) -> tuple[dict[str, Any], list[bytes | bytearray]]:
    """Read one frame with `read_exact(n)`; sizes are checked before their bytes are read. With
    `read_into(view)` (which fills `view`), each blob is read straight into a bytearray of its size, made
    once: no second copy of it is ever held."""
    magic, header_length, count = _PREFIX.unpack(read_exact(_PREFIX.size))
    if magic != FRAME_MAGIC:
        raise ProtocolError("the answer could not be read safely: it is not a frame of this protocol")
    if header_length > limits.header_bytes:
        raise ProtocolError(f"an answer header of {header_length:,} bytes (the limit is {limits.header_bytes:,})")
    if count > limits.blobs:
        raise ProtocolError(f"an answer with {count:,} tensors (the limit is {limits.blobs:,})")
    lengths = [_BLOB_LENGTH.unpack(read_exact(8))[0] for _ in range(count)]
    if sum(lengths) > limits.blob_bytes:
        raise ProtocolError(f"an answer of {sum(lengths):,} bytes of tensors (the limit is {limits.blob_bytes:,})")
    try:
        header = json.loads(read_exact(header_length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"the answer could not be read safely: its header is not JSON ({exc})"[:300]) from None
    if not isinstance(header, dict):
        raise ProtocolError("the answer could not be read safely: its header is not an object")
    blobs: list[bytes | bytearray] = []
    for n in lengths:
        if not n or read_into is None:
            blobs.append(read_exact(n) if n else b"")
            continue
        buffer = bytearray(n)
        read_into(memoryview(buffer))
        blobs.append(buffer)
    return header, blobs


# ----------------------------------------------------------------------------------------------
# Values


@dataclass
class ModuleInfo:
    """A module that lives in the worker, known to the grader by its handle."""

    handle: str
    cls: str
    instance_of: list[str]
    training: bool
    state_dict: dict[str, Any] | None = None  # name -> tensor, when asked for


@dataclass
class Foreign:
    """A value from the submission that is neither plain data nor a tensor: only its class and repr."""

    cls: str
    text: str

    def __repr__(self) -> str:
        return f"<{self.cls} {self.text}>"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()  # the submission does not define the name asked for


@dataclass
class Handle:
    """The grader naming a module that lives in the worker (in a request)."""

    handle: str


@dataclass
class WireTensor:
    """A tensor as it crosses the wire; `TensorCodec` turns it into a torch tensor and back."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | bytearray  # a bytearray read from the wire becomes the tensor's memory (`from_wire`)
    device: str = "cpu"
    requires_grad: bool = False


class TensorCodec:
    """Conversions between torch tensors and `WireTensor`, with the torch module passed in."""

    def __init__(self, torch: ModuleType):
        self.torch = torch

    def to_wire(self, tensor: torch.Tensor) -> WireTensor:
        library = self.torch
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ProtocolError(f"a tensor of dtype {name} cannot be sent (allowed: {', '.join(DTYPES)})")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(library.uint8).numpy().tobytes() if flat.numel() else b""
        return WireTensor(name, tuple(tensor.shape), data, str(tensor.device), bool(tensor.requires_grad))

    def from_wire(self, wire: WireTensor) -> torch.Tensor:
        """The tensor of a `WireTensor` that `Decoder.tensor` has checked; whatever torch still refuses is a
        ProtocolError (the sender's fault), never another exception."""
        library = self.torch
        if wire.dtype not in DTYPES:
            raise ProtocolError(f"a tensor of a dtype that is not allowed: {wire.dtype[:40]}")
        dtype = getattr(library, wire.dtype)
        tensor: torch.Tensor
        try:
            if not wire.data:
                tensor = library.empty(wire.shape, dtype=dtype)
            else:  # a bytearray is used as it is (each blob makes one tensor: `Decoder.tensor`); bytes are copied
                data = wire.data if isinstance(wire.data, bytearray) else bytearray(wire.data)
                tensor = library.frombuffer(data, dtype=dtype).reshape(wire.shape)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise ProtocolError(f"a tensor torch cannot make ({type(exc).__name__}: {safe_str(exc, 200)})") from None
        return tensor


# What a subclass of a plain type is sent as, on the grader's side (`Encoder`)
PLAIN_TYPES: tuple[type[Any], ...] = (bool, int, float, str, list, tuple, dict)


class Encoder:
    """Turns a value into a JSON-able tree, collecting tensors as blobs. The same rules on both sides:

    - None, and values of exactly bool, int, str or float, as they are (a float that is not finite tagged);
    - tensors (a `WireTensor`, or a torch tensor through the codec) as blobs; `Handle`, `ModuleInfo` and
      `MISSING` as their tagged objects;
    - lists, tuples and dicts with string keys, of exactly those types, item by item: at most `max_items`
      items each and nested at most `max_depth` deep, when these are set;
    - anything else is `on_other(value, depth)`'s to send (the worker sends modules as handles and other
      objects as their class and repr). Without `on_other` (the grader, sending its own values), a subclass
      of a plain type is sent as that type (an OrderedDict state dict as a dict) and anything else is a
      ProtocolError. With it, a value that cannot be sent (nested too deeply, a tensor the codec refuses) is
      sent as an object saying why."""

    def __init__(
        self,
        codec: TensorCodec | None,
        on_other: Callable[[Any, int], Any] | None = None,
        max_items: int | None = None,
        max_depth: int | None = None,
    ):
        self.codec, self.on_other = codec, on_other
        self.max_items, self.max_depth = max_items, max_depth
        self.blobs: list[bytes | bytearray] = []

    def tensor(self, wire: WireTensor) -> dict[str, Any]:
        self.blobs.append(wire.data)
        return {
            "$": "tensor",
            "blob": len(self.blobs) - 1,
            "dtype": wire.dtype,
            "shape": list(wire.shape),
            "device": wire.device,
            "requires_grad": wire.requires_grad,
        }

    def encode(self, value: Any, depth: int = 0) -> Any:
        if self.max_depth is not None and depth > self.max_depth:
            return self.unsendable(value, "nested too deeply")
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$": "float", "repr": repr(value)}
        if isinstance(value, WireTensor):
            return self.tensor(value)
        if self.codec is not None and isinstance(value, self.codec.torch.Tensor):
            try:
                wire = self.codec.to_wire(value)
            except Exception as exc:  # an unsupported dtype, a hostile subclass
                return self.unsendable(value, f"cannot be sent: {safe_str(exc, 200)}")
            return self.tensor(wire)
        if isinstance(value, Handle):
            return {"$": "handle", "handle": value.handle}
        if isinstance(value, ModuleInfo):
            state = None if value.state_dict is None else self.encode(value.state_dict, depth + 1)
            return {
                "$": "module",
                "handle": value.handle,
                "class": value.cls,
                "instance_of": value.instance_of,
                "training": value.training,
                "state": state,
            }
        if value is MISSING:
            return {"$": "missing"}
        if type(value) in (list, tuple) and self._fits(value):
            return {"$": type(value).__name__, "items": [self.encode(v, depth + 1) for v in value]}
        if type(value) is dict and self._fits(value) and all(isinstance(k, str) for k in value):
            return {"$": "dict", "items": [[k, self.encode(v, depth + 1)] for k, v in value.items()]}
        if self.on_other is not None:
            return self.on_other(value, depth)
        plain = next((kind for kind in PLAIN_TYPES if isinstance(value, kind)), None)
        if plain is not None and type(value) is not plain:
            return self.encode(plain(value), depth)
        raise ProtocolError(f"a value of type {type(value).__name__} cannot be sent")

    def _fits(self, items: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> bool:
        return self.max_items is None or len(items) <= self.max_items

    def unsendable(self, value: Any, why: str) -> dict[str, str]:
        """What is sent for a value that cannot be: an object saying why (or, on the grader's side, where
        there is no `on_other`, a ProtocolError)."""
        if self.on_other is None:
            raise ProtocolError(f"a value of type {type(value).__name__} cannot be sent: {why}")
        tensor = self.codec is not None and isinstance(value, self.codec.torch.Tensor)
        return {"$": "object", "class": "Tensor" if tensor else type(value).__name__[:200], "repr": f"({why})"}


def safe_str(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message (its first `limit` characters), even when printing it raises (a hostile
    `__str__`); the worker reports its exceptions with it too."""
    try:
        return str(exc)[:limit]
    except Exception:
        return "(the exception could not be printed)"


class Decoder:
    """Turns a tree and its blobs back into values, checking every node. Strings are cleaned and
    truncated; tensors must have an allowed dtype and exactly the bytes their shape needs;
    `make_tensor(WireTensor)` makes the final object (a torch tensor, on either side)."""

    def __init__(self, blobs: list[bytes | bytearray], limits: FrameLimits, make_tensor: Callable[[WireTensor], Any]):
        self.blobs, self.limits, self.make_tensor = blobs, limits, make_tensor
        self.nodes = 0
        self.used: set[int] = set()
        self.devices: list[str] = []  # the device each decoded tensor was on in the worker, in order

    def text(self, value: Any) -> str:
        return clean_text(value, self.limits.string_chars)

    def decode(self, node: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > 4 * self.limits.list_items:
            raise ProtocolError("an answer with too many values")
        if depth > self.limits.depth:
            raise ProtocolError("an answer nested too deeply")
        if node is None or isinstance(node, (bool, int, float)):
            return node
        if isinstance(node, str):
            return self.text(node)
        if not isinstance(node, dict):
            raise ProtocolError(f"an answer with a bare {type(node).__name__}")
        kind = node.get("$")
        if kind == "tensor":
            return self.make_tensor(self.tensor(node))
        if kind in ("list", "tuple"):
            items = self.items(node)
            values = [self.decode(v, depth + 1) for v in items]
            return values if kind == "list" else tuple(values)
        if kind == "dict":
            pairs = self.items(node)
            result = {}
            for pair in pairs:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                    raise ProtocolError("a dict entry that is not a [key, value] pair")
                result[self.text(pair[0])] = self.decode(pair[1], depth + 1)
            return result
        if kind == "module":
            state = node.get("state")
            state = None if state is None else self.decode(state, depth + 1)
            if state is not None and not isinstance(state, dict):
                raise ProtocolError("a module whose state is not a dict")
            instance_of = node.get("instance_of")
            if not isinstance(instance_of, list):
                raise ProtocolError("a module without instance_of")
            return ModuleInfo(
                self.text(node.get("handle")),
                self.text(node.get("class")),
                [self.text(n) for n in instance_of[:64]],
                bool(node.get("training")),
                state,
            )
        if kind == "handle":
            return Handle(self.text(node.get("handle")))
        if kind == "missing":
            return MISSING
        if kind == "object":
            return Foreign(self.text(node.get("class")), self.text(node.get("repr")))
        if kind == "float":
            text = node.get("repr")
            if text not in ("nan", "inf", "-inf"):
                raise ProtocolError("a float that is not nan or inf")
            return float(text)
        raise ProtocolError(f"an answer with an unknown kind of value: {self.text(str(kind))[:40]}")

    def items(self, node: dict[str, Any]) -> list[Any]:
        items = node.get("items")
        if not isinstance(items, list) or len(items) > self.limits.list_items:
            raise ProtocolError("a list that is missing or too long")
        return items

    def tensor(self, node: dict[str, Any]) -> WireTensor:
        dtype, shape, index = node.get("dtype"), node.get("shape"), node.get("blob")
        if dtype not in DTYPES:
            raise ProtocolError(f"a tensor of a dtype that is not allowed: {self.text(str(dtype))[:40]}")
        if not (
            isinstance(shape, list)
            and len(shape) <= 8
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
        ):
            raise ProtocolError("a tensor with a malformed shape")
        # Bounded before anything is multiplied out or handed to torch: every dimension, a zero one counted as
        # one, so that no shape (a [0, 2**63] of 0 bytes, say) can overflow torch's sizes or strides.
        span = 1
        for n in shape:
            span *= max(n, 1)
            if span * DTYPES[dtype] > self.limits.blob_bytes:
                raise ProtocolError(
                    f"a tensor of shape {shape[:8]} is larger than any answer may be "
                    f"({self.limits.blob_bytes:,} bytes, counting an empty dimension as 1)"
                )
        if not (isinstance(index, int) and 0 <= index < len(self.blobs)) or index in self.used:
            raise ProtocolError("a tensor that refers to a missing or already used blob")
        self.used.add(index)
        data = self.blobs[index]
        expected = math.prod(shape) * DTYPES[dtype]
        if len(data) != expected:
            raise ProtocolError(
                f"a tensor of shape {shape} and dtype {dtype} sent with {len(data):,} bytes, not {expected:,}"
            )
        device = node.get("device", "cpu")
        device = self.text(device)[:40] if isinstance(device, str) else "?"
        self.devices.append(device)
        return WireTensor(dtype, tuple(shape), data, device, bool(node.get("requires_grad", False)))


# ----------------------------------------------------------------------------------------------
# Requests and replies

OPS = ("ready", "load", "get", "call", "build", "describe", "to", "forward", "forward_many", "drop", "ping")


@dataclass
class StudentError:
    """An exception the student's code raised while answering (reported by the worker)."""

    type: str
    message: str
    traceback: str


@dataclass
class CellProblem:
    """A cell of the submission that raised, or was stopped, while the file was loaded (in a load reply, and
    in the grading model's load report)."""

    cell: int
    type: str
    message: str
    timed_out: bool = False


@dataclass
class Ready:
    pid: int
    cuda: bool


@dataclass
class Loaded:
    errors: list[CellProblem]
    defined: dict[str, str]  # contract name -> the type of what the file defines under it


@dataclass
class HeadCall:
    """One call of a wrapper head, seen by a forward hook inside the worker (worker-reported)."""

    index: int
    same_values: bool  # the head received the wrapper's input unchanged
    output: Any  # the head's output, a tensor, or None when it was not one


@dataclass
class ForwardReply:
    """The answer to a forward: the output, the input after it (to see whether it was modified), what the
    worker saw of the wrapper's heads, its trace, and the gradients when asked for."""

    y: Any
    x_after: Any
    head_calls: list[HeadCall] = field(default_factory=list)
    ops: list[str] | None = None  # worker-reported trace
    python_calls: list[str] | None = None  # worker-reported
    grads: dict[str, Any] | None = None
    grad_problem: str | None = None
    y_device: str | None = None  # where y was in the worker, when it is a tensor
    torch_calls: dict[str, int] | None = None  # worker-reported: the PyTorch functions the forward called


@dataclass
class TimedShown:
    """What a timed request shows once its calls are done: the whole outputs of the calls the grader named
    (float64, in the order it named them) and every call's record of the PyTorch functions it called
    (worker-reported; empty when the request did not record)."""

    outputs: list[Any]
    calls: list[dict[str, int]]


@dataclass
class Reply:
    ok: bool
    value: Any = None
    error: StudentError | None = None


def _field(obj: dict[str, Any], name: str, kind: type[T], what: str) -> T:
    """`obj[name]`, which must be a `kind` (a bool is not an int here)."""
    value = obj.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ProtocolError(f"{what}: field {name!r} is missing or of the wrong type")
    return value


def parse_reply(op: str, header: dict[str, Any], decoder: Decoder) -> Reply:
    """Check a reply against the schema of `op` and decode it into typed values."""
    ok = header.get("ok")
    if ok is False:
        error = _field(header, "error", dict, "an error reply")
        return Reply(
            False,
            error=StudentError(
                decoder.text(_field(error, "type", str, "an error")),
                decoder.text(error.get("message") if isinstance(error.get("message"), str) else ""),
                decoder.text(error.get("traceback") if isinstance(error.get("traceback"), str) else ""),
            ),
        )
    if ok is not True:
        raise ProtocolError("a reply that is neither ok nor an error")
    raw = header.get("value")
    what = f"the answer to {op!r}"
    if op == "ready":
        raw = _field(header, "value", dict, what)
        return Reply(True, Ready(_field(raw, "pid", int, what), bool(_field(raw, "cuda", bool, what))))
    if op == "load":
        raw = _field(header, "value", dict, what)
        errors = []
        for item in _field(raw, "errors", list, what)[: decoder.limits.list_items]:
            if not isinstance(item, dict):
                raise ProtocolError(f"{what}: a cell error that is not an object")
            errors.append(
                CellProblem(
                    _field(item, "cell", int, what),
                    decoder.text(_field(item, "type", str, what)),
                    decoder.text(_field(item, "message", str, what)),
                    bool(item.get("timed_out") is True),
                )
            )
        defined = decoder.decode(raw.get("defined"))
        if not isinstance(defined, dict):
            raise ProtocolError(f"{what}: 'defined' is not a dict")
        return Reply(True, Loaded(errors, {k: v for k, v in list(defined.items())[:64] if isinstance(v, str)}))
    if op == "forward":
        raw = _field(header, "value", dict, what)
        calls = []
        for item in _field(raw, "head_calls", list, what)[:4096]:
            if not isinstance(item, dict):
                raise ProtocolError(f"{what}: a head call that is not an object")
            output = item.get("output")
            decoded = None if output is None else decoder.decode(output)
            calls.append(
                HeadCall(
                    _field(item, "index", int, what),
                    bool(item.get("same_values") is True),
                    decoded if isinstance(output, dict) and output.get("$") == "tensor" else None,
                )
            )
        ops = _strings(raw.get("ops"), decoder, what)
        python_calls = _strings(raw.get("python_calls"), decoder, what)
        grads = raw.get("grads")
        grads = None if grads is None else decoder.decode(grads)
        if grads is not None and not isinstance(grads, dict):
            raise ProtocolError(f"{what}: gradients that are not a dict")
        problem = raw.get("grad_problem")
        y_node = raw.get("y")
        y = decoder.decode(y_node)
        y_device = decoder.devices[-1] if isinstance(y_node, dict) and y_node.get("$") == "tensor" else None
        return Reply(
            True,
            ForwardReply(
                y,
                decoder.decode(_field(raw, "x_after", dict, what)),
                calls,
                ops,
                python_calls,
                grads,
                None if problem is None else decoder.text(problem),
                y_device,
                _counts(None if raw.get("torch_calls") is None else decoder.decode(raw["torch_calls"]), decoder, what),
            ),
        )
    if op == "forward_many":  # ready for the timed calls
        if raw is not None:
            raise ProtocolError(f"{what}: not a bare acknowledgement")
        return Reply(True, None)
    if op == "forward_call":  # one timed call's answer
        if not (isinstance(raw, dict) and raw.get("$") == "tensor"):
            raise ProtocolError(f"{what}: not a tensor")
        return Reply(True, decoder.decode(raw))
    if op == "forward_shown":  # after the timed calls: the outputs asked for, every call's record
        raw = _field(header, "value", dict, what)
        listed = raw.get("outputs")
        nodes = decoder.items(listed) if isinstance(listed, dict) and listed.get("$") == "list" else None
        if nodes is None or not all(isinstance(n, dict) and n.get("$") == "tensor" for n in nodes):
            raise ProtocolError(f"{what}: outputs that are not a list of tensors")
        outputs = [decoder.decode(node) for node in nodes]
        records = []
        for item in _field(raw, "calls", list, what)[: decoder.limits.list_items]:
            counts = _counts(item, decoder, what)
            records.append(counts if counts is not None else {})
        return Reply(True, TimedShown(outputs, records))
    return Reply(True, decoder.decode(raw))


def _counts(value: Any, decoder: Decoder, what: str) -> dict[str, int] | None:
    """A record of calls by name: a dict of names to non-negative counts (at most 256 names)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: a record of calls that is not an object")
    counts = {}
    for name, count in list(value.items())[:256]:
        if not (isinstance(name, str) and type(count) is int and 0 <= count < 1 << 40):
            raise ProtocolError(f"{what}: a record of calls with a count that is not a number")
        counts[decoder.text(name)[:200]] = count
    return counts


def _strings(value: Any, decoder: Decoder, what: str) -> list[str] | None:
    if value is None:
        return None
    value = decoder.decode(value)
    if not isinstance(value, list):
        raise ProtocolError(f"{what}: a trace that is not a list of names")
    return [v[:200] if isinstance(v, str) else "?" for v in value]
