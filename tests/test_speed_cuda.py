"""The speed part on a CUDA device: skipped without one, run by the GPU workflow and tools/gpu_check.sh."""

import pytest
import torch

from autograder.grading import timing, workers
from autograder.rubric import load_rubric
from autograder.sandbox.protocol import BuildRequest, ForwardManyRequest
from helpers import REFERENCE, grade
from speed_variants import VARIANTS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
SPEED = load_rubric().speed


def speed_only(path, tmp_path):
    results, run = grade(path, tmp_path, "--device", "cuda", "--part", "speed")
    assert run.returncode == 0, run.stderr
    assert results["extra_data"]["device"] == "cuda"
    return results


def test_the_reference_earns_the_speed_points_on_every_cuda_workload(tmp_path):
    results = speed_only(REFERENCE, tmp_path)
    names = {w.name for w in SPEED.workloads_for("cuda")}
    assert {case for t in results["tests"] for case in t["extra_data"]["cases"]} == names
    assert all(t["status"] == "passed" for t in results["tests"]), [t["output"] for t in results["tests"]]
    speed = results["extra_data"]["speed"]
    assert set(speed["workloads"]) == names
    for figures in speed["workloads"].values():
        assert figures["reference_speedup"] >= SPEED.min_reference_speedup
        assert figures["workload"]["flush_mib"] > 0
    assert results["leaderboard"][0]["value"] == pytest.approx(speed["speedup"], rel=1e-3)


@pytest.mark.parametrize("variant", ["loop_over_heads_matmuls_only", "sleeps_50ms", "cached_by_shape"])
def test_what_earns_nothing_on_the_cpu_earns_nothing_on_cuda(tmp_path, variant):
    path = tmp_path / variant / "mha.py"
    path.parent.mkdir()
    path.write_text(VARIANTS[variant]())
    results = speed_only(path, tmp_path)
    assert results["score"] == 0, [t["output"] for t in results["tests"]]


def test_forward_many_on_cuda_is_seeded_flushed_and_checked(tmp_path):
    from autograder.sandbox.settings import WorkerConfig
    from reference import mha as ref

    torch.manual_seed(0)
    module = ref.MultiHeadAttention(64, 64, 32, 0.0, 16).to("cuda").eval()
    started = workers.BackgroundWorker(
        workers.reference_cells(), "reference.py", WorkerConfig(device="cuda", threads=1, request_seconds=60)
    )
    try:
        worker = started.get()
        weights = {k: v.cpu() for k, v in module.state_dict().items()}
        info = worker.request(BuildRequest("MultiHeadAttention", [64, 64, 32, 0.0, 16], {}, weights, "float32", "cuda"))
        request = ForwardManyRequest(info.handle, 2, [2, 32, 64], "float32", 64, threads=1, flush_bytes=64 << 20)
        first, again = (worker.forward_many(request, [5, 6])[0] for _ in range(2))
    finally:
        started.close()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    generator = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(2, 32, 64, generator=generator, device="cuda")
    probe = torch.randn(2, 32, 64, generator=generator, device="cuda").double()
    with torch.no_grad():
        y = module(x).double()
    expected = torch.stack([(y * probe).sum(-1), y.abs().sum(-1), (y * y).sum(-1)], -1).cpu()
    rtol, atol = load_rubric().tolerance("float32")
    timing.check_probes(first[1], expected, rtol, atol, SPEED.probe_sigmas, 64)


def test_the_timing_lock_is_per_gpu():
    from autograder.grading.devices import device_key as lock_name

    assert lock_name("cpu") == "cpu"
    assert lock_name("cuda").startswith("cuda-")
    assert lock_name("cuda") == lock_name(f"cuda:{torch.cuda.current_device()}")
