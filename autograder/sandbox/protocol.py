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
Requests are typed, one frozen dataclass per operation (`REQUESTS`); the worker builds its replies from the
reply types here (`reply_tree` encodes them), and the grader checks each reply against its operation's
schema (`parse_reply`): anything that does not fit raises `ProtocolError`, the worker's fault, never the
grader's. The worker-side settings (`WorkerSetup`, `ChildSetup`, `ForkServerSetup`) are typed here too, the
only module both sides load.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import dataclass, field, fields, is_dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, get_args

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
        self.made: dict[int, Any] = {}  # the tensors it made, by id (kept, so that no id is reused)

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
            tensor = self.make_tensor(self.tensor(node))
            self.made[id(tensor)] = tensor
            return tensor
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

    def is_tensor(self, value: Any) -> bool:
        """Whether `value` is a tensor this decoder made (every one was checked)."""
        return self.made.get(id(value)) is value

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
# Typed records: requests, replies and settings, each a dataclass whose fields are what crosses


def field_values(record: Any) -> dict[str, Any]:
    """A dataclass's fields by name, shallow (values as they are: `dataclasses.asdict` would copy tensors)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def from_fields(cls: type[T], data: Any, what: str, noun: str = "field") -> T:
    """`cls(**data)`, refusing a `data` that is not a dict, that has a key `cls` has no field for, or that lacks
    a field without a default, each by name (a ValueError saying `what` it was, and calling a key `noun`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{what}: not an object of named fields")
    known = [f for f in fields(cls) if f.init]  # type: ignore[arg-type]  # cls is a dataclass
    unknown = sorted(str(k) for k in data if k not in {f.name for f in known})
    if unknown:
        raise ValueError(f"{what}: unknown {noun}{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}")
    missing = [
        f.name for f in known if f.name not in data and f.default is NO_DEFAULT and f.default_factory is NO_DEFAULT
    ]
    if missing:
        raise ValueError(f"{what}: missing {noun}{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}")
    return cls(**data)


# Requests: one type per operation (`REQUESTS`). The grader sends {"op": its op, "args": its fields, encoded as
# one dict value}; the worker decodes the dict and makes the request of it (`request_of`), refusing an unknown
# or missing field by name. Each asks for one type of answer (`Asks[V]`), which the parser registered for its op
# makes of the reply (`REPLIES`), so that a request sent (`client.Worker.request`) returns a V.

V = TypeVar("V")  # what a request asks for (`Asks`)


class Asks(Generic[V]):
    """A request whose answer is a V (its op's parser in `REPLIES` makes one of the reply's value)."""

    op: ClassVar[str]


@dataclass(frozen=True)
class LoadRequest(Asks["Loaded"]):
    """Run the submission's cells (each [number, first line in the file, source]) in order."""

    op: ClassVar[str] = "load"
    cells: list[list[Any]]
    filename: str
    cell_seconds: float | None = None
    later_cell_seconds: float | None = None
    skip: Sequence[int] = ()  # cells stopped in an earlier load: not run again


@dataclass(frozen=True)
class GetRequest(Asks[Any]):
    """The value the submission defines under `name` (`MISSING` when none)."""

    op: ClassVar[str] = "get"
    name: str


@dataclass(frozen=True)
class CallRequest(Asks[Any]):
    """The submission's function `fn`, called."""

    op: ClassVar[str] = "call"
    fn: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] | None = None


@dataclass(frozen=True)
class BuildRequest(Asks["ModuleInfo"]):
    """The submission's class `cls` built (torch seeded with `seed`), holding `state_dict` when given, and moved
    to `device` and `dtype`."""

    op: ClassVar[str] = "build"
    cls: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] | None = None
    state_dict: dict[str, Any] | None = None
    dtype: str | None = None
    device: str = "cpu"
    seed: int = 0


@dataclass(frozen=True)
class DescribeRequest(Asks["ModuleInfo"]):
    op: ClassVar[str] = "describe"
    handle: str


@dataclass(frozen=True)
class ToRequest(Asks["ModuleInfo"]):
    """A module the submission made, moved to `device`."""

    op: ClassVar[str] = "to"
    handle: str
    device: str


@dataclass(frozen=True)
class ForwardRequest(Asks["ForwardReply"]):
    """One forward of a module on `x` (answered by a `ForwardReply`), with a backward of `grad_out` when given,
    and what the wrapper's heads saw when `hooks`."""

    op: ClassVar[str] = "forward"
    handle: str
    x: Any  # a tensor
    train: bool = False
    seed: int = 0
    grad_out: Any = None  # a tensor, or None
    hooks: bool = False


@dataclass(frozen=True)
class ForwardManyRequest(Asks[None]):
    """`calls` timed forwards of a module, each on an input made from a seed the grader sends only when that call
    starts (`TimedCall`), then the outputs the grader names after the last (`ShowOutputs`)."""

    op: ClassVar[str] = "forward_many"
    handle: str
    calls: int
    shape: list[int]
    dtype: str
    out_features: int
    threads: int | None = None
    flush_bytes: int = 0


@dataclass(frozen=True)
class CaptureRequest(Asks["Captured"]):
    """A module's forward captured as the ATen operations it runs (answered by a `Captured`): in eval mode, without
    autograd, on an input of `shape` and `dtype` drawn from `seed` on `device` (where the module was built). The
    state tensors whose names are in `known` (the weights the grader loaded) are not sent back; at most
    `max_nodes` operations."""

    op: ClassVar[str] = "capture"
    handle: str
    shape: list[int]
    dtype: str
    seed: int = 0
    known: list[str] = field(default_factory=list)
    max_nodes: int = 20000
    device: str = "cpu"


@dataclass(frozen=True)
class ReplayRequest(Asks["ModuleInfo"]):
    """A captured graph (`Graph.to_wire()`), rebuilt as a module of its own whose forward(x) runs the graph on
    `state` (one tensor per graph input, in order) and x, on `device`: answered by its `ModuleInfo`. Sent only to
    a worker that never loaded a submission, which runs nothing but the graph's operations."""

    op: ClassVar[str] = "replay"
    graph: Any
    state: list[Any]
    device: str = "cpu"


@dataclass(frozen=True)
class DropRequest(Asks[None]):
    """Forget a module."""

    op: ClassVar[str] = "drop"
    handle: str


@dataclass(frozen=True)
class PingRequest(Asks["Pong"]):
    op: ClassVar[str] = "ping"


@dataclass(frozen=True)
class StandInRequest(Asks[None]):
    """Stand in for the submission's function `name` while one check runs: values, never code. Called with
    arguments equal (tensors within a float tolerance) to an entry's first item, the stand-in returns its second;
    with any others it raises LookupError. `table` None puts the submission's own `name` back (or none)."""

    op: ClassVar[str] = "stand_in"
    name: str
    table: Sequence[Sequence[Any]] | None = None  # [[args, value], ...]


Request = (
    LoadRequest
    | GetRequest
    | CallRequest
    | BuildRequest
    | DescribeRequest
    | ToRequest
    | ForwardRequest
    | ForwardManyRequest
    | CaptureRequest
    | ReplayRequest
    | DropRequest
    | PingRequest
    | StandInRequest
)
REQUEST_TYPES: tuple[type[Request], ...] = get_args(Request)
REQUESTS: dict[str, type[Request]] = {cls.op: cls for cls in REQUEST_TYPES}


def request_header(request: Asks[Any], encoder: Encoder) -> dict[str, Any]:
    """The header of a request's frame: its op, and its fields encoded as one dict value."""
    return {"op": request.op, "args": encoder.encode(field_values(request))}


def request_type(op: Any) -> type[Request]:
    """The request type of a frame's op (a ValueError for an unknown one)."""
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ValueError(f"unknown request {op!r}")
    return cls


def request_of(op: Any, args: Any) -> Request:
    """The request a frame's op and decoded arguments make: a ValueError for an unknown op, and for arguments
    that are not its type's fields (naming the unknown or missing field)."""
    return from_fields(request_type(op), args, f"the request {op!r}")


# The frames inside a timed request (`ForwardManyRequest`), each a plain JSON object of its fields.


@dataclass(frozen=True)
class TimedCall:
    """One timed call starts: its input is made from `seed`."""

    seed: int

    @classmethod
    def of(cls, header: dict[str, Any]) -> TimedCall:
        seed = header.get("seed")
        if type(seed) is not int or set(header) != {"seed"}:
            raise ValueError("a timed call without a seed")
        return cls(seed)


@dataclass(frozen=True)
class ShowOutputs:
    """After the last timed call: the calls whose whole outputs the grader wants (by index)."""

    show: list[int]

    @classmethod
    def of(cls, header: dict[str, Any], calls: int) -> ShowOutputs:
        show = header.get("show")
        if not (isinstance(show, list) and all(type(i) is int and 0 <= i < calls for i in show)) or set(header) != {
            "show"
        }:
            raise ValueError("the grader asked for timed outputs that do not exist")
        return cls(show)


# Replies: what the worker builds (`reply_tree` encodes them) and what `parse_reply` makes of a reply's header.
# A field marked RECORDS is a list of records (dataclasses or dicts), sent as a JSON list of objects whose
# values are encoded one by one; a field marked LOCAL is the grader's own (derived when the reply is parsed),
# never sent; a field marked WIRE is sent as its value's plain data (`to_wire()`).
RECORDS: dict[str, bool] = {"records": True}
LOCAL: dict[str, bool] = {"local": True}
WIRE: dict[str, bool] = {"wire": True}  # a field sent as its value's `to_wire()`


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
class Pong:
    pid: int


@dataclass
class Loaded:
    errors: list[CellProblem] = field(metadata=RECORDS)
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
    head_calls: list[HeadCall] = field(default_factory=list, metadata=RECORDS)
    grads: dict[str, Any] | None = None
    grad_problem: str | None = None
    y_device: str | None = field(default=None, metadata=LOCAL)  # where y was in the worker, when it is a tensor


@dataclass
class TimedShown:
    """What a timed request shows once its calls are done: the whole outputs of the calls the grader named
    (float64, in the order it named them)."""

    outputs: list[Any]


@dataclass
class Captured:
    """A forward captured as ATen operations: the graph (sent as `Graph.to_wire()`) and the module's state
    tensors that the request did not name as known, by name (each a graph input)."""

    graph: Graph = field(metadata=WIRE)
    state: dict[str, Any]


REPLY_TYPES: tuple[type[Any], ...] = (StudentError, Ready, Pong, Loaded, ForwardReply, TimedShown, Captured)


def reply_tree(value: Any, encode: Callable[[Any], Any]) -> Any:
    """The JSON tree a reply's value is sent as: a reply type (`REPLY_TYPES`) as an object of its fields, in
    order (RECORDS fields as lists of objects, LOCAL fields left out), each value `encode`d; any other value is
    `encode(value)`."""
    if not isinstance(value, REPLY_TYPES):
        return encode(value)
    tree: dict[str, Any] = {}
    for item in fields(value):
        if item.metadata.get("local"):
            continue
        found = getattr(value, item.name)
        if item.metadata.get("wire"):
            found = found.to_wire()
        if item.metadata.get("records"):
            tree[item.name] = [{k: encode(v) for k, v in _record(r).items()} for r in found]
        else:
            tree[item.name] = encode(found)
    return tree


def _record(record: Any) -> dict[str, Any]:
    if isinstance(record, dict):
        return record
    if is_dataclass(record) and not isinstance(record, type):
        return {f.name: getattr(record, f.name) for f in fields(record) if not f.metadata.get("local")}
    raise TypeError(f"a record that is neither a dataclass nor a dict: {type(record).__name__}")


def as_is(value: Any) -> Any:
    """The encoding of a reply whose fields are all plain JSON (an error reply's strings)."""
    return value


def error_header(error: StudentError) -> dict[str, Any]:
    """The header of an error reply."""
    return {"ok": False, "error": reply_tree(error, as_is)}


@dataclass
class Reply(Generic[V]):
    """A reply as `parse_reply` makes it: ok, with the value its request asks for (`Asks[V]`), or the error the
    student's code raised."""

    ok: bool
    value: V | None = None
    error: StudentError | None = None


# ----------------------------------------------------------------------------------------------
# Worker-side settings: made by the grader (`launcher`), read by the worker, the fork server and its children.
# Each crosses as JSON (a command line argument, a fork message); a key that is unknown or missing is refused by
# name. Lists come back as tuples.


def _settings_from(cls: type[T], data: Any, what: str) -> T:
    if isinstance(data, dict):
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return from_fields(cls, data, what, noun="key")


def _json_object(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what}: not JSON ({exc})") from None


@dataclass(frozen=True)
class WorkerSetup:
    """A worker's own settings (`server.main`, `server.Session`)."""

    filename: str  # the submission's file name, as its tracebacks say it
    device: str
    threads: int | None  # torch's threads (None: torch's default)
    sandbox: bool  # under the namespace sandbox
    uid: int | None  # the fresh uid it drops to itself (in the namespace sandbox of a root grader)
    hide: tuple[str, ...]  # folders it must not see (`jail.hide_grader_packages`)
    keep: tuple[str, ...]  # of those, what it keeps on sys.path (the interpreter and its packages)
    workdir: str
    contract: tuple[str, ...]  # the names the contract asks of the submission

    def to_json(self) -> str:
        return json.dumps(field_values(self))

    @classmethod
    def from_dict(cls, data: Any) -> WorkerSetup:
        return _settings_from(cls, data, "the worker's settings")

    @classmethod
    def from_json(cls, text: str) -> WorkerSetup:
        return cls.from_dict(_json_object(text, "the worker's settings"))


@dataclass(frozen=True)
class ChildSetup:
    """A worker forked from a fork server (`forkserver.Child`): a worker's settings and what a fresh worker gets
    from its launch instead (its environment, limits, uid and namespaces)."""

    worker: WorkerSetup
    uid: int | None  # its fresh uid, wherever it changes to it
    env: dict[str, str]
    memory_bytes: int | None  # RLIMIT_AS
    nproc: int | None  # RLIMIT_NPROC
    scratch_bytes: int  # its /tmp, under the namespace sandbox
    userns: bool  # in a user namespace (the namespace sandbox of a grader that is not root)
    separate_namespaces: bool  # its own network and IPC namespaces, outside the namespace sandbox

    def to_dict(self) -> dict[str, Any]:
        return {**field_values(self), "worker": field_values(self.worker)}

    @classmethod
    def from_dict(cls, data: Any) -> ChildSetup:
        what = "a forked worker's settings"
        if not isinstance(data, dict):
            raise ValueError(f"{what}: not an object of named fields")
        data = dict(data)
        if "worker" in data:
            data["worker"] = WorkerSetup.from_dict(data["worker"])
        return _settings_from(cls, data, what)


@dataclass(frozen=True)
class ForkServerSetup:
    """A fork server's settings (`forkserver.main`)."""

    hide: tuple[str, ...]
    keep: tuple[str, ...]
    workdir: str

    def to_json(self) -> str:
        return json.dumps(field_values(self))

    @classmethod
    def from_json(cls, text: str) -> ForkServerSetup:
        return _settings_from(cls, _json_object(text, "the fork server's settings"), "the fork server's settings")


# ----------------------------------------------------------------------------------------------
# Captured graphs. A forward captured by the worker (`CaptureRequest`) is a list of ATen operations over the
# module's state tensors (`inputs`, by name), the forward's input (the input after them), constant tensors and
# the operations before it. It crosses as plain data (`to_wire`, `from_wire`): an argument is a JSON scalar, a
# list or tuple of arguments, a reference ({"ref": kind, "index": i}: an input, an earlier node or a constant) or a
# torch value by name ({"special": kind, "name": name}: a dtype, a device, a layout, a memory format), flat so that
# an argument that is a list of references stays within the encoder's depth. `from_wire`
# checks the structure (every reference to something that exists and comes before it); which operations are
# allowed is the grader's judgement (`grading/graphs.py`), and only a worker that never ran student code
# rebuilds one (`ReplayRequest`).

GRAPH_REFS = ("input", "node", "constant")
GRAPH_SPECIALS = ("dtype", "device", "layout", "memory_format")
GRAPH_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){1,3}")
GRAPH_NAME = re.compile(r"[A-Za-z0-9_.:]{1,200}")
GRAPH_DEPTH = 4  # arguments nest at most this deep (an ATen argument is at most a list of lists)
GRAPH_NODES = 1 << 17  # operations in a graph at most, whatever the rubric allows


@dataclass(frozen=True)
class GraphRef:
    """An argument that is a graph input (the state's in order, then the forward's input), an earlier node's
    result or a constant."""

    kind: str
    index: int


@dataclass(frozen=True)
class GraphSpecial:
    """An argument that is a torch value named by its kind and name: `dtype` float32, `device` cpu, ..."""

    kind: str
    name: str


@dataclass(frozen=True)
class GraphNode:
    """One operation: its target (`aten.mm.default`, or `operator.getitem` of a result that is a tuple)."""

    target: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Graph:
    """A captured forward: the state tensors it takes, by name, in order (the forward's input follows them),
    its operations, its output (an argument: a reference to what it returns) and its constants (tensors)."""

    inputs: tuple[str, ...]
    nodes: tuple[GraphNode, ...]
    output: Any
    constants: tuple[Any, ...] = ()

    def targets(self) -> list[str]:
        return [node.target for node in self.nodes]

    def to_wire(self) -> dict[str, Any]:
        def wire(arg: Any) -> Any:
            if isinstance(arg, GraphRef):
                return {"ref": arg.kind, "index": arg.index}
            if isinstance(arg, GraphSpecial):
                return {"special": arg.kind, "name": arg.name}
            if isinstance(arg, list):
                return [wire(a) for a in arg]
            if isinstance(arg, tuple):
                return tuple(wire(a) for a in arg)
            return arg

        return {
            "inputs": list(self.inputs),
            "nodes": [
                [n.target, [wire(a) for a in n.args], {k: wire(v) for k, v in n.kwargs.items()}] for n in self.nodes
            ],
            "output": wire(self.output),
            "constants": list(self.constants),
        }

    @classmethod
    def from_wire(cls, value: Any, is_constant: Callable[[Any], bool]) -> Graph:
        """The graph a decoded wire value describes, its structure checked (a ProtocolError otherwise):
        `is_constant` says what may be a constant (a tensor)."""
        if not (isinstance(value, dict) and set(value) == {"inputs", "nodes", "output", "constants"}):
            raise ProtocolError("a graph that is not an object of inputs, nodes, output and constants")
        inputs, nodes, constants = value["inputs"], value["nodes"], value["constants"]
        if not (isinstance(inputs, list) and all(isinstance(n, str) and GRAPH_NAME.fullmatch(n) for n in inputs)):
            raise ProtocolError("a graph whose inputs are not a list of names")
        if not (isinstance(constants, list) and all(is_constant(c) for c in constants)):
            raise ProtocolError("a graph whose constants are not a list of tensors")
        if not (isinstance(nodes, list) and len(nodes) <= GRAPH_NODES):
            raise ProtocolError("a graph whose nodes are not a list, or too many")
        sizes = {"input": len(inputs) + 1, "constant": len(constants), "node": 0}

        def arg(node: Any, depth: int = 0) -> Any:
            if node is None or isinstance(node, (bool, int, float, str)):
                return node
            if depth >= GRAPH_DEPTH:
                raise ProtocolError("a graph argument nested too deeply")
            if isinstance(node, list):
                return [arg(a, depth + 1) for a in node]
            if isinstance(node, tuple):
                return tuple(arg(a, depth + 1) for a in node)
            if isinstance(node, dict) and set(node) == {"ref", "index"}:
                kind, index = node["ref"], node["index"]
                if kind in GRAPH_REFS and type(index) is int and 0 <= index < sizes[kind]:
                    return GraphRef(kind, index)
            if isinstance(node, dict) and set(node) == {"special", "name"}:
                kind, name = node["special"], node["name"]
                if kind in GRAPH_SPECIALS and isinstance(name, str) and GRAPH_NAME.fullmatch(name):
                    return GraphSpecial(kind, name)
            raise ProtocolError("a graph argument that is neither a value nor a reference to an earlier one")

        parsed = []
        for item in nodes:
            if not (isinstance(item, (list, tuple)) and len(item) == 3):
                raise ProtocolError("a graph node that is not [target, args, kwargs]")
            target, args, kwargs = item
            if not (isinstance(target, str) and GRAPH_TARGET.fullmatch(target)):
                raise ProtocolError("a graph node whose target is not a dotted name")
            if not (isinstance(args, (list, tuple)) and isinstance(kwargs, dict)):
                raise ProtocolError("a graph node whose arguments are not a list and a dict")
            if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
                raise ProtocolError("a graph node whose keyword arguments are not names")
            parsed.append(GraphNode(target, tuple(arg(a) for a in args), {k: arg(v) for k, v in kwargs.items()}))
            sizes["node"] += 1
        return cls(tuple(inputs), tuple(parsed), arg(value["output"]), tuple(constants))


def _field(obj: dict[str, Any], name: str, kind: type[T], what: str) -> T:
    """`obj[name]`, which must be a `kind` (a bool is not an int here)."""
    value = obj.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ProtocolError(f"{what}: field {name!r} is missing or of the wrong type")
    return value


def parse_reply(op: str, header: dict[str, Any], decoder: Decoder) -> Reply[Any]:
    """Check a reply against the schema of `op` (a request's, or one of `FRAMES`: the worker's first frame, and
    the answers inside a timed request) and decode it into its typed value (the op's parser in `REPLIES`): of
    the type `op`'s request asks for, which its caller knows (`channel.Channel.exchange`), not this dispatch."""
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
    parser = REPLIES.get(op) or FRAMES.get(op)
    if parser is None:
        raise ProtocolError(f"a reply to an unknown request {op!r}")
    return Reply(True, parser(header.get("value"), decoder, f"the answer to {op!r}"))


def _object(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(f"{what}: 'value' is missing or not a dict")
    return raw


def parse_ready(raw: Any, decoder: Decoder, what: str) -> Ready:
    raw = _object(raw, what)
    return Ready(_field(raw, "pid", int, what), bool(_field(raw, "cuda", bool, what)))


def parse_pong(raw: Any, decoder: Decoder, what: str) -> Pong:
    return Pong(_field(_object(raw, what), "pid", int, what))


def parse_loaded(raw: Any, decoder: Decoder, what: str) -> Loaded:
    raw = _object(raw, what)
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
    return Loaded(errors, {k: v for k, v in list(defined.items())[:64] if isinstance(v, str)})


def parse_forward(raw: Any, decoder: Decoder, what: str) -> ForwardReply:
    raw = _object(raw, what)
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
    grads = raw.get("grads")
    grads = None if grads is None else decoder.decode(grads)
    if grads is not None and not isinstance(grads, dict):
        raise ProtocolError(f"{what}: gradients that are not a dict")
    problem = raw.get("grad_problem")
    y_node = raw.get("y")
    y = decoder.decode(y_node)
    y_device = decoder.devices[-1] if isinstance(y_node, dict) and y_node.get("$") == "tensor" else None
    x_after = decoder.decode(_field(raw, "x_after", dict, what))
    return ForwardReply(y, x_after, calls, grads, None if problem is None else decoder.text(problem), y_device)


def parse_shown(raw: Any, decoder: Decoder, what: str) -> TimedShown:
    """After a timed request's calls: the outputs asked for."""
    listed = _object(raw, what).get("outputs")
    nodes = decoder.items(listed) if isinstance(listed, dict) and listed.get("$") == "list" else None
    if nodes is None or not all(isinstance(n, dict) and n.get("$") == "tensor" for n in nodes):
        raise ProtocolError(f"{what}: outputs that are not a list of tensors")
    return TimedShown([decoder.decode(node) for node in nodes])


def parse_captured(raw: Any, decoder: Decoder, what: str) -> Captured:
    raw = _object(raw, what)
    state = decoder.decode(raw.get("state"))
    if not (isinstance(state, dict) and all(decoder.is_tensor(v) for v in state.values())):
        raise ProtocolError(f"{what}: a state that is not a dict of tensors")
    graph = Graph.from_wire(decoder.decode(raw.get("graph")), decoder.is_tensor)
    return Captured(graph, {name: state[name] for name in graph.inputs if name in state})


def parse_module(raw: Any, decoder: Decoder, what: str) -> ModuleInfo:
    module = decoder.decode(raw)
    if not isinstance(module, ModuleInfo):
        raise ProtocolError(f"{what}: not a module")
    return module


def parse_value(raw: Any, decoder: Decoder, what: str) -> Any:
    """Whatever the student's code gave (a get, a call): any value the decoder accepts."""
    return decoder.decode(raw)


def parse_tensor(raw: Any, decoder: Decoder, what: str) -> Any:
    """One timed call's answer: a tensor."""
    if not (isinstance(raw, dict) and raw.get("$") == "tensor"):
        raise ProtocolError(f"{what}: not a tensor")
    return decoder.decode(raw)


def parse_acknowledged(raw: Any, decoder: Decoder, what: str) -> None:
    """A bare acknowledgement: nothing but that it was done."""
    if raw is not None:
        raise ProtocolError(f"{what}: not a bare acknowledgement")


Parser = Callable[[Any, Decoder, str], Any]
# The parser of each request's reply, by its op: it makes the request's answer type (`Asks[V]`) of the reply's
# value (tests/test_protocol.py checks that each returns its request's V), refusing anything else.
REPLIES: dict[str, Parser] = {
    LoadRequest.op: parse_loaded,
    GetRequest.op: parse_value,
    CallRequest.op: parse_value,
    BuildRequest.op: parse_module,
    DescribeRequest.op: parse_module,
    ToRequest.op: parse_module,
    ForwardRequest.op: parse_forward,
    ForwardManyRequest.op: parse_acknowledged,  # ready for the timed calls
    CaptureRequest.op: parse_captured,
    ReplayRequest.op: parse_module,
    DropRequest.op: parse_acknowledged,
    PingRequest.op: parse_pong,
    StandInRequest.op: parse_acknowledged,
}
# The frames that answer no request of their own: the worker's first, and those inside a timed request.
FRAMES: dict[str, Parser] = {"ready": parse_ready, "forward_call": parse_tensor, "forward_shown": parse_shown}
