"""The wire protocol, alone: frames and values round-trip; every bound holds before anything is read;
whatever the worker sends is decoded into typed values or refused with a ProtocolError, never more."""

import collections
import io
import json
import re
import struct
import sys
import types

import pytest
import torch

from autograder.sandbox import launcher, protocol
from autograder.sandbox.protocol import (
    Decoder,
    Encoder,
    FrameLimits,
    ModuleInfo,
    ProtocolError,
    TensorCodec,
    pack_frame,
    parse_reply,
    read_frame,
)

CODEC = TensorCodec(torch)


class CountingReader:
    def __init__(self, data: bytes):
        self.stream = io.BytesIO(data)
        self.read = 0

    def __call__(self, n: int) -> bytes:
        chunk = self.stream.read(n)
        if len(chunk) != n:
            raise EOFError
        self.read += n
        return chunk


DEFAULT_LIMITS = FrameLimits()


def roundtrip(value, limits=DEFAULT_LIMITS):
    encoder = Encoder(CODEC)
    frame = pack_frame({"ok": True, "value": encoder.encode(value)}, encoder.blobs)
    header, blobs = read_frame(CountingReader(frame), limits)
    return parse_reply("call", header, Decoder(blobs, limits, CODEC.from_wire)).value


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8]
)
def test_tensors_of_every_allowed_dtype_round_trip(dtype):
    tensor = (torch.randn(2, 3, 4) * 10).to(dtype)
    back = roundtrip([tensor, tensor[:, 1:].transpose(0, 1), torch.empty(0, 3, dtype=dtype)])
    assert torch.equal(back[0], tensor) and back[0].dtype == dtype
    assert torch.equal(back[1], tensor[:, 1:].transpose(0, 1)) and back[1].is_contiguous()
    assert back[2].shape == (0, 3)


def test_plain_values_keep_their_types():
    value = {"a": [1, 2.5, None, True, "x"], "b": (1, (2, 3)), "c": float("nan"), "d": float("-inf")}
    back = roundtrip(value)
    assert back["a"] == [1, 2.5, None, True, "x"] and back["b"] == (1, (2, 3))
    assert back["c"] != back["c"] and back["d"] == float("-inf")


def test_the_grader_sends_subclasses_of_plain_types_as_those_types_and_nothing_else():
    """One encoder for both sides. The grader's own values: an OrderedDict state dict goes as a dict, a
    namedtuple as a tuple; an object of any other kind is a ProtocolError, never a repr."""
    point = collections.namedtuple("point", "x y")
    state = collections.OrderedDict(weight=torch.ones(2))
    back = roundtrip({"state": state, "point": point(1, 2)})
    assert torch.equal(back["state"]["weight"], torch.ones(2)) and back["point"] == (1, 2)
    with pytest.raises(ProtocolError, match="type object cannot be sent"):
        Encoder(CODEC).encode([object()])
    with pytest.raises(ProtocolError, match="nested too deeply"):
        Encoder(CODEC, max_depth=2).encode([[[[1]]]])


def test_the_worker_sends_what_cannot_be_sent_as_an_object_saying_why():
    """With a policy for other values (the worker's), bounds and unsendable tensors give an object saying
    why, and the policy decides the rest; exact plain types never reach it."""
    seen = []

    def other(value, depth):
        seen.append(value)
        return {"$": "object", "class": type(value).__name__, "repr": "other"}

    encoder = Encoder(CODEC, on_other=other, max_items=3, max_depth=2)
    values = [torch.zeros(2, dtype=torch.complex64), [[[1]]], [1, 2, 3, 4], {1: 2}, "x", 1.5, None]
    decoder = Decoder(encoder.blobs, FrameLimits(), CODEC.from_wire)
    decoded = [decoder.decode(encoder.encode(value)) for value in values]
    assert (decoded[0].cls, decoded[0].text) == (
        "Tensor",
        f"(cannot be sent: a tensor of dtype complex64 cannot be sent (allowed: {', '.join(protocol.DTYPES)}))",
    )
    assert decoded[1][0][0][0].text == "(nested too deeply)"  # the 1, at depth 3
    assert seen == [[1, 2, 3, 4], {1: 2}] and decoded[4:] == ["x", 1.5, None]
    assert Decoder([], FrameLimits(), CODEC.from_wire).decode(Encoder(CODEC).encode(protocol.MISSING)) is (
        protocol.MISSING
    )


def frame_with(header: dict, blobs=()) -> bytes:
    return pack_frame(header, list(blobs))


def test_sizes_are_refused_before_their_bytes_are_read():
    limits = FrameLimits(header_bytes=1000, blobs=4, blob_bytes=1000)
    huge_header = struct.pack(">4sII", b"MHA1", 10**9, 0)
    reader = CountingReader(huge_header)
    with pytest.raises(ProtocolError, match="header of 1,000,000,000 bytes"):
        read_frame(reader, limits)
    assert reader.read == 12
    many_blobs = struct.pack(">4sII", b"MHA1", 2, 10**6)
    with pytest.raises(ProtocolError, match="1,000,000 tensors"):
        read_frame(CountingReader(many_blobs), limits)
    big_blob = struct.pack(">4sII", b"MHA1", 2, 1) + struct.pack(">Q", 2**40)
    reader = CountingReader(big_blob)
    with pytest.raises(ProtocolError, match="bytes of tensors"):
        read_frame(reader, limits)
    assert reader.read == 12 + 8


def test_anything_but_a_frame_is_refused():
    pickle_like = struct.pack(">Q", 100) + b"\x80\x04" + b"x" * 100
    with pytest.raises(ProtocolError, match="could not be read safely"):
        read_frame(CountingReader(pickle_like), FrameLimits())
    not_json = struct.pack(">4sII", b"MHA1", 3, 0) + b"{x}"
    with pytest.raises(ProtocolError, match="not JSON"):
        read_frame(CountingReader(not_json), FrameLimits())


def decode(tree, blobs=(), limits=DEFAULT_LIMITS):
    return Decoder(list(blobs), limits, CODEC.from_wire).decode(tree)


def tensor_node(shape, dtype="float32", blob=0):
    return {"$": "tensor", "blob": blob, "dtype": dtype, "shape": shape}


@pytest.mark.parametrize(
    "node,blobs,message",
    [
        (tensor_node([2, 2]), [b"\0" * 15], "sent with 15 bytes, not 16"),
        (tensor_node([2**26]), [b"\0" * 4], "not 268,435,456"),  # a stride-0 expand cannot be sent as one
        (tensor_node([2, 2], dtype="complex64"), [b"\0" * 32], "dtype that is not allowed"),
        (tensor_node([2, -1]), [b""], "malformed shape"),
        (tensor_node([1], blob=3), [b"\0" * 4], "missing or already used blob"),
        ({"$": "list", "items": [tensor_node([1]), tensor_node([1])]}, [b"\0" * 4], "already used blob"),
        ({"$": "pickle", "data": "..."}, [], "unknown kind"),
        ({"$": "float", "repr": "__import__('os')"}, [], "nan or inf"),
        ({"$": "dict", "items": [[1, 2]]}, [], "not a [key, value] pair"),
        ([1, 2, 3], [], "bare list"),
    ],
)
def test_malformed_values_are_refused(node, blobs, message):
    with pytest.raises(ProtocolError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode(node, blobs)


@pytest.mark.parametrize(
    "shape",
    [
        [0, 2**63],  # 0 bytes, "the right size": torch.empty raised TypeError in the grader (cannot grade)
        [2**63, 0],
        [0, 2**40, 2**40],  # torch: "Stride calculation overflowed" (RuntimeError)
        [0, 2**31, 2**31, 2**31],
        [0] * 7 + [2**64],
        [2**62, 0],  # frombuffer's reshape would refuse it after the bytes were taken
    ],
)
def test_shapes_are_bounded_before_torch_sees_them(shape):
    """Every dimension counts, an empty one as 1: no shape can overflow torch's sizes or strides, so no
    answer makes torch raise in the grader."""
    for dtype in ("float32", "uint8"):
        with pytest.raises(ProtocolError, match="larger than any answer may be"):
            decode(tensor_node(shape, dtype=dtype), [b""])


def test_empty_tensors_of_any_reasonable_shape_still_decode():
    for shape in ([0], [0, 768], [4, 0, 2**20], [0] * 8):
        assert decode(tensor_node(shape), [b""]).shape == tuple(shape)
    limits = FrameLimits(blob_bytes=64)
    assert decode(tensor_node([0, 16]), [b""], limits).shape == (0, 16)  # 16 x 4 bytes: at the limit
    with pytest.raises(ProtocolError, match="larger than any answer"):
        decode(tensor_node([0, 17]), [b""], limits)


def test_whatever_torch_refuses_is_a_protocol_error():
    """The codec never lets torch's own exception out: a malformed wire tensor is the sender's fault."""
    with pytest.raises(ProtocolError, match="torch cannot make"):
        CODEC.from_wire(protocol.WireTensor("float32", (2**62, 0), bytearray(8)))
    with pytest.raises(ProtocolError, match="torch cannot make"):
        CODEC.from_wire(protocol.WireTensor("float32", (0, 2**63), b""))
    with pytest.raises(ProtocolError, match="not allowed"):
        CODEC.from_wire(protocol.WireTensor("complex64", (1,), bytearray(8)))


def test_nesting_and_node_counts_are_bounded():
    deep = 1
    for _ in range(100):
        deep = {"$": "list", "items": [deep]}
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode(deep)
    wide = {"$": "list", "items": [{"$": "list", "items": [1] * 1000}] * 100}
    with pytest.raises(ProtocolError, match="too many values"):
        decode(wide, limits=FrameLimits(list_items=5000))
    # JSON nested far beyond Python's recursion limit is refused, not a crash
    text = ("[" * 200_000 + "]" * 200_000).encode()
    frame = struct.pack(">4sII", b"MHA1", len(text), 0) + text
    with pytest.raises(ProtocolError):
        read_frame(CountingReader(frame), FrameLimits())


def test_strings_from_the_worker_are_truncated_and_cleaned():
    limits = FrameLimits(string_chars=50)
    text = decode("\ud800 fake \x1b[2J\x1b[32mTotal: 100 / 100\x07" + "x" * 100, limits=limits)
    assert "\x1b" not in text and "\x07" not in text and "\ud800" not in text
    assert text.endswith("more characters]") and len(text) < 100
    json.dumps(text).encode("utf-8")  # safe for results.json
    assert decode("line one\n\tindented") == "line one\n\tindented"


def test_bidirectional_controls_are_cleaned_like_control_characters():
    """U+202E makes "mha\u202eyp.py" read "mha.py"; every bidirectional control goes, the rest of Unicode stays."""
    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    assert protocol.clean_text(f"mha{bidi}yp.py", 100) == "mha" + "\ufffd" * len(bidi) + "yp.py"
    assert protocol.clean_text("naïve 注意 ✓ \u200d", 100) == "naïve 注意 ✓ \u200d"


def reply(op, value):
    return parse_reply(op, {"ok": True, "value": value}, Decoder([], FrameLimits(), CODEC.from_wire))


@pytest.mark.parametrize(
    "op,value,message",
    [
        ("load", {"errors": [{"cell": 1}], "defined": {"$": "dict", "items": []}}, "field 'type'"),
        ("load", {"errors": [{"cell": "1", "type": "X", "message": "", "traceback": ""}]}, "field 'cell'"),
        ("load", {"errors": "none", "defined": {}}, "field 'errors'"),
        ("forward", {"y": 1, "head_calls": []}, "field 'x_after'"),
        ("forward", {"y": 1, "x_after": tensor_node([1]), "head_calls": [{"index": True}]}, "field 'index'"),
        ("ready", {"pid": "1", "cuda": False}, "field 'pid'"),
        ("forward_many", {"$": "dict", "items": []}, "not a bare acknowledgement"),
        ("forward_call", [1.0], "not a tensor"),
    ],
)
def test_replies_are_checked_against_their_schema(op, value, message):
    with pytest.raises(ProtocolError, match=message):
        reply(op, value)


def test_an_error_reply_is_typed_and_cleaned():
    answer = parse_reply(
        "call",
        {"ok": False, "error": {"type": "ValueError", "message": "bad\x1b[0m" * 2000}},
        Decoder([], FrameLimits(), CODEC.from_wire),
    )
    assert not answer.ok and answer.error.type == "ValueError"
    assert "\x1b" not in answer.error.message and len(answer.error.message) < 5000
    with pytest.raises(ProtocolError):
        parse_reply("call", {"ok": "yes"}, Decoder([], FrameLimits(), CODEC.from_wire))


def test_modules_come_back_as_module_info_with_their_state():
    info = ModuleInfo("h3", "MultiHeadAttention", ["MultiHeadAttention"], False, {"w": torch.ones(2, 2)})
    back = roundtrip(info)
    assert isinstance(back, ModuleInfo) and back.handle == "h3" and torch.equal(back.state_dict["w"], torch.ones(2, 2))


def test_the_protocol_module_needs_only_the_standard_library():
    import ast
    import sys

    tree = ast.parse(open(protocol.__file__).read())
    for node in ast.walk(tree):  # imports for the type checker alone never run
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    assert "torch" not in vars(protocol)  # torch is passed in, never imported


def test_an_exceptions_message_is_cut_to_its_limit_and_survives_a_hostile_str():
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert protocol.safe_str(ValueError("short")) == "short"
    assert protocol.safe_str(ValueError("x" * 500), 200) == "x" * 200
    assert protocol.safe_str(Hostile()) == "(the exception could not be printed)"


# -- typed requests, replies and settings ----------------------------------------------------------------------


def worker_side(monkeypatch) -> types.ModuleType:
    """The worker's `server` module, loaded as the worker boots it (`launcher.BOOT`: protocol, jail and server from
    source, as the package `sandbox`); the package leaves sys.modules after the test."""
    package = types.ModuleType("sandbox")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "sandbox", package)
    for name, source in zip(launcher.SERVER_MODULES, launcher.sources(launcher.SERVER_MODULES)):
        module = types.ModuleType("sandbox." + name)
        module.__package__ = "sandbox"
        monkeypatch.setitem(sys.modules, module.__name__, module)
        exec(compile(source, f"<sandbox/{name}.py>", "exec"), module.__dict__)
        setattr(package, name, module)
    return sys.modules["sandbox.server"]


SETUP = protocol.WorkerSetup("mha.py", "cpu", 1, False, None, ("/grader",), (), "/tmp", ("MultiHeadAttention",))
ONE_OF_EACH = [
    protocol.LoadRequest([[1, 1, "x = 1\n"]], "mha.py", 3.0, 1.0, [2]),
    protocol.GetRequest("results"),
    protocol.CallRequest("f", [torch.ones(2), protocol.Handle("h0")], {"k": (1, "a")}),
    protocol.BuildRequest("MultiHeadAttention", [16, 8], {}, {"w": torch.eye(2)}, "float32", "cpu", 7),
    protocol.DescribeRequest("h0"),
    protocol.ToRequest("h0", "cpu"),
    protocol.ForwardRequest("h0", torch.ones(2, 3), True, 5, torch.zeros(2, 3), True),
    protocol.ForwardManyRequest("h0", 3, [2, 6, 16], "float32", 8, 1, 1024),
    protocol.CaptureRequest("h0", [2, 6, 16], "float32", 3, ["W_query.weight"], 100),
    protocol.ReplayRequest(
        protocol.Graph(
            ("w",),
            (
                protocol.GraphNode(
                    "aten.mm.default", (protocol.GraphRef("input", 1), protocol.GraphRef("input", 0)), {}
                ),
            ),
            protocol.GraphRef("node", 0),
        ).to_wire(),
        [torch.eye(2)],
        "cpu",
    ),
    protocol.DropRequest("h0"),
    protocol.PingRequest(),
    protocol.StandInRequest("combine", [[[[torch.ones(2), torch.zeros(2)]], torch.ones(4)]]),
]


def test_there_is_one_request_type_per_operation_and_a_method_of_the_worker_per_type(monkeypatch):
    assert set(protocol.REQUESTS) == {type(r).op for r in ONE_OF_EACH}
    assert len({type(r) for r in ONE_OF_EACH}) == len(ONE_OF_EACH) == len(protocol.REQUESTS)
    # the worker answers each with its `op_` method (`Session.handle`), which takes that type
    server = worker_side(monkeypatch)
    for op, kind in protocol.REQUESTS.items():
        method = getattr(server.Session, f"op_{op}")
        assert method.__annotations__["request"] == f"protocol.{kind.__name__}", op


def test_each_request_asks_for_the_type_its_replys_parser_makes():
    """Every request type names what it asks for (`Asks[V]`), every op has one reply parser (`REPLIES`), and that
    parser is declared to return the V of its request: `Worker.request` returns what the parser made."""
    import typing

    assert set(protocol.REPLIES) == set(protocol.REQUESTS)
    assert not set(protocol.FRAMES) & set(protocol.REQUESTS)
    for op, kind in protocol.REQUESTS.items():
        (asked,) = typing.get_args(kind.__orig_bases__[0])
        name = (
            asked.__forward_arg__ if isinstance(asked, typing.ForwardRef) else getattr(asked, "__name__", repr(asked))
        )
        name = {"NoneType": "None", "typing.Any": "Any"}.get(name, name)
        assert protocol.REPLIES[op].__annotations__["return"] == name, op


@pytest.mark.parametrize(
    "op, value, refused",
    [
        ("drop", {"$": "list", "items": []}, "not a bare acknowledgement"),
        ("build", 3, "not a module"),
        ("ping", [1], "'value' is missing or not a dict"),
        ("no_such_op", None, "a reply to an unknown request 'no_such_op'"),
    ],
)
def test_a_reply_that_is_not_what_its_request_asks_for_is_refused(op, value, refused):
    """A reply is parsed by its request's parser alone: anything else is the worker's fault (`ProtocolError`)."""
    decoder = protocol.Decoder([], protocol.FrameLimits(), lambda *a: None)
    with pytest.raises(protocol.ProtocolError, match=refused):
        protocol.parse_reply(op, {"ok": True, "value": value}, decoder)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("request_", ONE_OF_EACH, ids=lambda r: type(r).__name__)
def test_every_request_type_reaches_the_worker_as_itself(request_, monkeypatch):
    """What the grader sends (`Channel.frame`) is read back inside the worker (`Session.request`) as the same
    request type with the same fields; a handle becomes the module it names."""
    server = worker_side(monkeypatch)
    session = server.Session(torch, server.protocol.WorkerSetup(**protocol.field_values(SETUP)), None)
    module = torch.nn.Linear(2, 2)
    session.objects["h0"] = module
    encoder = Encoder(CODEC)
    header, blobs = read_frame(
        CountingReader(pack_frame(protocol.request_header(request_, encoder), encoder.blobs)), DEFAULT_LIMITS
    )
    received = session.request(header, blobs)
    assert type(received).__name__ == type(request_).__name__ and type(received).op == type(request_).op
    sent = protocol.field_values(request_)
    if isinstance(request_, protocol.CallRequest):
        assert received.args[1] is module
        sent["args"] = [sent["args"][0], module]
    assert same(sent, protocol.field_values(received)), (sent, received)


@pytest.mark.parametrize(
    "op,args,message",
    [
        ("call", {"fn": "f", "bogus": 1}, "the request 'call': unknown field 'bogus'"),
        ("forward", {"handle": "h0"}, "the request 'forward': missing field 'x'"),
        ("forward_many", {"handle": "h0", "calls": 1}, "missing fields 'shape', 'dtype', 'out_features'"),
        ("ready", {}, "unknown request 'ready'"),
        ("exec", {}, "unknown request 'exec'"),
    ],
)
def test_a_request_with_an_unknown_or_missing_field_is_refused_by_name(op, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        protocol.request_of(op, args)


def test_the_worker_answers_a_request_with_an_unknown_or_missing_field_with_an_error_naming_it(make_worker):
    """The worker's request loop: such a request is an error reply that names the field (nothing runs), and the
    worker goes on answering."""
    from autograder.sandbox.client import Deadline

    w = make_worker("def f():\n    return 1\n")
    w.start()
    channel = w._channel("a test")
    for header, message in (
        ({"op": "call", "args": Encoder(CODEC).encode({"fn": "f", "bogus": 1})}, "unknown field 'bogus'"),
        ({"op": "forward", "args": Encoder(CODEC).encode({"handle": "h0"})}, "missing field 'x'"),
    ):
        deadline = Deadline.within(30, float("inf"))
        channel.send(pack_frame(header, []), deadline, "a test")
        answer = channel.receive(header["op"], deadline, "a test")
        assert not answer.ok and answer.error.type == "ValueError" and message in answer.error.message, answer
    assert w.request(protocol.CallRequest("f")) == 1


CHILD = protocol.ChildSetup(SETUP, 1234, {"HOME": "/tmp"}, 1 << 30, 64, 256 << 20, False, True)


def test_settings_round_trip_through_json():
    assert protocol.WorkerSetup.from_json(SETUP.to_json()) == SETUP
    assert protocol.ChildSetup.from_dict(json.loads(json.dumps(CHILD.to_dict()))) == CHILD
    server = protocol.ForkServerSetup(("/grader", "/tmp"), ("/usr",), "/")
    assert protocol.ForkServerSetup.from_json(server.to_json()) == server


@pytest.mark.parametrize(
    "read,data,message",
    [
        (protocol.WorkerSetup.from_json, {**json.loads(SETUP.to_json()), "colour": "red"}, "unknown key 'colour'"),
        (
            protocol.WorkerSetup.from_json,
            {k: v for k, v in json.loads(SETUP.to_json()).items() if k != "device"},
            "the worker's settings: missing key 'device'",
        ),
        (
            lambda text: protocol.ChildSetup.from_dict(json.loads(text)),
            {**CHILD.to_dict(), "nprocs": 1},
            "a forked worker's settings: unknown key 'nprocs'",
        ),
        (
            lambda text: protocol.ChildSetup.from_dict(json.loads(text)),
            {**CHILD.to_dict(), "worker": {k: v for k, v in CHILD.to_dict()["worker"].items() if k != "workdir"}},
            "the worker's settings: missing key 'workdir'",
        ),
        (
            protocol.ForkServerSetup.from_json,
            {"hide": [], "keep": []},
            "the fork server's settings: missing key 'workdir'",
        ),
    ],
)
def test_settings_with_an_unknown_or_missing_key_are_refused_by_name(read, data, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read(json.dumps(data))


def sent_and_parsed(op, value):
    """`value` as the worker sends it (`reply_tree`, with the worker's encoder), then read and parsed as the
    grader does: (the reply's tree, the parsed value)."""
    encoder = Encoder(CODEC, on_other=lambda value, depth: {"$": "object", "class": "?", "repr": "?"})
    tree = protocol.reply_tree(value, encoder.encode)
    header, blobs = read_frame(CountingReader(pack_frame({"ok": True, "value": tree}, encoder.blobs)), DEFAULT_LIMITS)
    return tree, parse_reply(op, header, Decoder(blobs, DEFAULT_LIMITS, CODEC.from_wire)).value


def test_a_reply_the_worker_builds_is_what_the_grader_parses_and_a_local_field_never_crosses():
    forward = protocol.ForwardReply(
        torch.ones(2, 3),
        torch.zeros(2, 3),
        [protocol.HeadCall(0, True, torch.ones(2)), protocol.HeadCall(1, False, None)],
        {"x": torch.ones(2, 3), "param:w": None},
        None,
        y_device="cuda:7",  # the grader's to derive: never sent
    )
    tree, parsed = sent_and_parsed("forward", forward)
    assert "y_device" not in tree and "cuda:7" not in json.dumps(tree)
    assert isinstance(parsed, protocol.ForwardReply) and parsed.y_device == "cpu"  # where y was, from the wire
    assert same(
        protocol.field_values(parsed),
        {**protocol.field_values(forward), "head_calls": parsed.head_calls, "y_device": "cpu"},
    )
    assert [(c.index, c.same_values) for c in parsed.head_calls] == [(0, True), (1, False)]
    assert torch.equal(parsed.head_calls[0].output, torch.ones(2)) and parsed.head_calls[1].output is None

    loaded = protocol.Loaded([protocol.CellProblem(2, "TimeLimit", "stopped", True)], {"MultiHeadAttention": "type"})
    assert sent_and_parsed("load", loaded)[1] == loaded
    shown = protocol.TimedShown([torch.ones(2, dtype=torch.float64)])
    _, back = sent_and_parsed("forward_shown", shown)
    assert same(back.outputs, shown.outputs)
    assert sent_and_parsed("ready", protocol.Ready(12, False))[1] == protocol.Ready(12, False)
    assert sent_and_parsed("ping", protocol.Pong(12))[1] == protocol.Pong(12)
    error = protocol.StudentError("ValueError", "bad", "line 2")
    assert (
        parse_reply("call", protocol.error_header(error), Decoder([], DEFAULT_LIMITS, CODEC.from_wire)).error == error
    )
