"""The grader's judgement of a captured forward (`grading/graphs.py`), and the graph's plain data (`protocol.Graph`).

Each forward here is captured as the worker captures it (`server.capture`, loaded as the worker boots it), in this
process: the reference's classes, the book's, the fast peers, and forwards the grader must refuse. The structure
checks count a graph's matrix multiplies for 2 and 12 heads; anything but the allow-listed ATen operations, or a
ready-made attention in any spelling, is refused before anything is replayed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autograder.grading import graphs
from autograder.rubric import GraphSettings, load_rubric
from autograder.sandbox import protocol
from reference import mha as ref
from reference.peers import CombinedQKVAttention, SDPAAttention, TorchMultiheadAttention
from test_protocol import worker_side

RUBRIC = load_rubric()


@pytest.fixture
def capture(monkeypatch):
    server = worker_side(monkeypatch)

    def captured(module: torch.nn.Module, shape=(2, 6, 12)) -> protocol.Graph:
        graph, _state = server.capture(torch, module.eval(), torch.randn(*shape), 20000)
        # as it crosses the wire: plain data, read back as the grader reads it
        encoder = protocol.Encoder(protocol.TensorCodec(torch))
        tree = encoder.encode(graph.to_wire())
        decoder = protocol.Decoder(encoder.blobs, protocol.FrameLimits(), protocol.TensorCodec(torch).from_wire)
        return protocol.Graph.from_wire(decoder.decode(tree), decoder.is_tensor)

    return captured


def test_the_reference_runs_as_many_matmuls_for_12_heads_as_for_2_and_the_wrapper_does_not(capture):
    two, twelve = (capture(ref.MultiHeadAttention(12, 24, 6, 0.0, h)) for h in (2, 12))
    assert graphs.matmuls(two) == graphs.matmuls(twelve) == 6 and len(two.nodes) == len(twelve.nodes)
    assert graphs.not_allowed(two, RUBRIC) is None and graphs.ready_made(two, RUBRIC) == []
    assert two.inputs == (
        "W_query.weight",
        "W_key.weight",
        "W_value.weight",
        "out_proj.weight",
        "out_proj.bias",
        "mask",
    )
    wrappers = [capture(ref.MultiHeadAttentionWrapper(12, 24 // h, 6, 0.0, h)) for h in (2, 12)]
    assert [graphs.matmuls(g) for g in wrappers] == [10, 60]
    assert all(graphs.not_allowed(g, RUBRIC) is None for g in wrappers)


def test_the_books_one_head_and_the_combined_projection_are_honest_graphs(capture):
    head = capture(ref.CausalAttention(12, 4, 6, 0.0), (2, 6, 12))
    assert graphs.not_allowed(head, RUBRIC) is None and graphs.matmuls(head) == 5
    for heads in (2, 12):
        torch.manual_seed(0)
        peer = CombinedQKVAttention.from_reference(ref.MultiHeadAttention(12, 24, 6, 0.0, heads))
        graph = capture(peer)
        assert graphs.not_allowed(graph, RUBRIC) is None and graphs.ready_made(graph, RUBRIC) == []
        assert graphs.matmuls(graph) == 4  # one projection for q, k and v, two batched matmuls, the output's


def test_a_ready_made_attention_is_found_in_any_spelling(capture):
    torch.manual_seed(0)
    sdpa = capture(SDPAAttention.from_reference(ref.MultiHeadAttention(12, 24, 6, 0.0, 4)))
    assert graphs.ready_made(sdpa, RUBRIC) == ["scaled_dot_product_attention"]
    problem = graphs.not_allowed(sdpa, RUBRIC)
    assert problem is not None and any("_scaled_dot_product" in t for t in problem.targets)  # never timed
    assert graphs.not_allowed(sdpa, RUBRIC, attention=True) is None  # but replayed for a structure check's values
    allowed = dataclasses.replace(RUBRIC, apis={**RUBRIC.apis, "scaled_dot_product_attention": True})
    assert graphs.ready_made(sdpa, allowed) == []
    torch.manual_seed(0)
    torch_mha = capture(
        TorchMultiheadAttention.from_reference(ref.MultiHeadAttention(24, 24, 6, 0.0, 4)), shape=(2, 6, 24)
    )
    assert graphs.ready_made(torch_mha, RUBRIC)  # its fast path or the kernel it calls: refused either way


def graph_of(*targets: str, constants=()) -> protocol.Graph:
    nodes = tuple(protocol.GraphNode(t, (protocol.GraphRef("input", 0),), {}) for t in targets)
    return protocol.Graph((), nodes, protocol.GraphRef("node", len(nodes) - 1), tuple(constants))


@pytest.mark.parametrize(
    "target",
    [
        "aten.as_strided.default",  # reads memory it was not given
        "aten.set_.source_Tensor",
        "mylib.attention.default",  # a custom operation
        "higher_order.flex_attention",
        "builtins.eval",  # a Python function
        "prims.mul.default",
    ],
)
def test_what_is_not_on_the_allow_list_is_refused_by_name(target):
    problem = graphs.not_allowed(graph_of("aten.mm.default", target), RUBRIC)
    assert problem is not None and problem.targets == (target,) and target in problem.message


def test_the_rubric_bounds_a_graph_and_may_allow_more():
    rubric = dataclasses.replace(RUBRIC, graph=GraphSettings(max_nodes=2, max_constant_mib=1.0, allow=("unfold",)))
    assert graphs.not_allowed(graph_of("aten.unfold.default"), rubric) is None
    assert "at most 2" in graphs.not_allowed(graph_of(*["aten.relu.default"] * 3), rubric).message
    big = torch.zeros(300_000, dtype=torch.float64)  # 2.3 MiB
    assert "MiB" in graphs.not_allowed(graph_of("aten.relu.default", constants=[big]), rubric).message
    assert graphs.not_allowed(graph_of("aten.add_.Tensor", "aten.masked_fill_.Scalar"), RUBRIC) is None  # in place


@pytest.mark.parametrize(
    "node",
    [
        ["aten.mm.default", [{"ref": "node", "index": 0}], {}],  # itself: not an earlier node
        ["aten.mm.default", [{"ref": "input", "index": 2}], {}],  # no such input (one state tensor, then x)
        ["aten.mm.default", [{"ref": "constant", "index": 0}], {}],
        ["aten.mm.default", [{"ref": "global", "index": 0}], {}],
        ["aten.mm.default", [{"special": "dtype", "name": "float32; import os"}], {}],
        ["aten.mm.default", [{"$": "object"}], {}],
        ["not a target!", [], {}],
        ["aten.mm.default", [], {"not-a-name": 1}],
        ["aten.mm.default", [[[[[[1]]]]]], {}],  # nested too deeply
    ],
)
def test_a_graph_that_refers_to_what_does_not_exist_is_the_workers_fault(node):
    wire = {"inputs": ["w"], "nodes": [node], "output": None, "constants": []}
    with pytest.raises(protocol.ProtocolError):
        protocol.Graph.from_wire(wire, lambda value: isinstance(value, torch.Tensor))


def test_a_graph_reads_back_as_it_was_sent():
    graph = protocol.Graph(
        ("w",),
        (
            protocol.GraphNode(
                "aten.full.default",
                ([2, 2], float("-inf")),
                {"dtype": protocol.GraphSpecial("dtype", "float32"), "device": protocol.GraphSpecial("device", "cpu")},
            ),
            protocol.GraphNode(
                "aten.cat.default", ([protocol.GraphRef("node", 0), protocol.GraphRef("input", 1)], -1), {}
            ),
        ),
        protocol.GraphRef("node", 1),
        (torch.ones(2),),
    )
    back = protocol.Graph.from_wire(graph.to_wire(), lambda value: isinstance(value, torch.Tensor))
    assert back.nodes == graph.nodes and back.inputs == graph.inputs and back.output == graph.output
