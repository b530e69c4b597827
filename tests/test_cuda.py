"""Checks that need a CUDA device: skipped without one, run by the GPU workflow (`pytest -m cuda`)."""

import pytest
import torch

from helpers import REFERENCE, grade, part_scores

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_reference_gets_full_marks_on_cuda(tmp_path):
    results, run = grade(REFERENCE, tmp_path, "--device", "cuda")
    assert run.returncode == 0, run.stderr
    assert results["extra_data"]["device"] == "cuda"
    assert results["score"] == results["max_score"] == 100, [t for t in results["tests"] if t["status"] != "passed"]


def test_cuda_grading_keeps_the_part_split(tmp_path, reference_results):
    results, _ = grade(REFERENCE, tmp_path, "--device", "cuda")
    assert part_scores(results) == part_scores(reference_results)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_peers_agree_with_the_reference_on_cuda(dtype):
    from reference.mha import MultiHeadAttention
    from reference.peers import PEERS

    torch.manual_seed(0)
    module = MultiHeadAttention(64, 64, 32, 0.0, 4).to("cuda", dtype).eval()
    x = torch.randn(2, 32, 64, device="cuda", dtype=dtype)
    expected = module(x).float()
    tolerance = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dtype]
    for name, peer in PEERS.items():
        got = peer.from_reference(module)(x).float()
        assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance), name
