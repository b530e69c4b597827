"""What capturing a forward and replaying its graph cost where the grader does both, and that the replayed graph
computes what the module computes (for `tools/gpu_check.sh`; `--device cpu` rehearses the same steps).

    .venv/bin/python tools/capture_check.py --device cuda --out gpu-check [--repeats 5]

For the reference `MultiHeadAttention` and `MultiHeadAttentionWrapper`, at the structure checks' sizes (2 and 12
heads) and on each speed workload of the device: the forward is built and captured in one trusted worker (as the
submission's is in its own), the graph checked as the grader checks it (`grading/graphs.py`), then rebuilt in a
second worker that never ran that code (`replay`) and run on a new input, whose output is compared with the
module's own, computed here. Reported: the graph's operations and matrix multiplies, the first capture in a worker
and the median of later ones, the replay's rebuild, and one forward of the replayed graph, each a request's
round trip on the grader's clock. Prints a table and writes `capture-check.json` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]


def timed(worker: Any, request: Any) -> tuple[Any, float]:
    """A request's answer, and its round trip on this clock."""
    started = time.perf_counter()
    answer = worker.request(request)
    return answer, time.perf_counter() - started


def measure(device: str, repeats: int) -> list[dict[str, Any]]:
    import torch

    from autograder.grading import graphs
    from autograder.grading.workers import trusted_worker, worker_config
    from autograder.rubric import load_rubric
    from autograder.sandbox.protocol import BuildRequest, CaptureRequest, DropRequest, ForwardRequest, ReplayRequest
    from reference import mha as ref

    rubric = load_rubric()
    config = worker_config(rubric, device, [], os.environ.get("AUTOGRADER_ISOLATION", "auto"))
    capturing, replaying = trusted_worker(config), trusted_worker(config)
    cases: list[tuple[str, str, list[Any], tuple[int, ...], str]] = [
        (f"MultiHeadAttention, {h} heads", "MultiHeadAttention", [12, 24, 6, 0.0, h], (2, 6, 12), "float64")
        for h in (2, 12)
    ]
    cases += [
        (f"wrapper, {h} heads", "MultiHeadAttentionWrapper", [12, 24 // h, 6, 0.0, h], (2, 6, 12), "float64")
        for h in (2, 12)
    ]
    assert rubric.speed is not None
    for w in rubric.speed.workloads_for(device):
        cases.append(
            (
                f"MultiHeadAttention, {w.name}",
                "MultiHeadAttention",
                [w.d_in, w.d_out, w.tokens, 0.0, w.heads],
                w.shape,
                w.dtype,
            )
        )
        cases.append(
            (
                f"wrapper, {w.name}",
                "MultiHeadAttentionWrapper",
                [w.d_in, w.d_out // w.heads, w.tokens, 0.0, w.heads],
                w.shape,
                w.dtype,
            )
        )
    rows = []
    try:
        builder, replayer = capturing.get(), replaying.get()
        for label, cls, args, shape, dtype in cases:
            torch.manual_seed(0)
            module = getattr(ref, cls)(*args).to(getattr(torch, dtype)).eval()
            state = {k: v.cpu() for k, v in module.state_dict().items()}
            info = builder.request(BuildRequest(cls, args, {}, state, dtype, device))
            captures = []
            for _ in range(repeats):
                captured, seconds = timed(
                    builder, CaptureRequest(info.handle, list(shape), dtype, 0, list(state), device=device)
                )
                captures.append(seconds)
            graph = captured.graph
            problem = graphs.not_allowed(graph, rubric)
            tensors = [state[name] if name in state else captured.state[name] for name in graph.inputs]
            replayed, rebuild = timed(replayer, ReplayRequest(graph.to_wire(), tensors, device))
            x = torch.randn(*shape, dtype=getattr(torch, dtype))
            answer, forward = timed(replayer, ForwardRequest(replayed.handle, x))
            with torch.no_grad():
                expected = module.to(device)(x.to(device)).cpu()
            rtol, atol = rubric.tolerance(dtype)
            rows.append(
                {
                    "what": label,
                    "device": device,
                    "operations": len(graph.nodes),
                    "matmuls": graphs.matmuls(graph),
                    "allowed": problem is None,
                    "first_capture_ms": round(captures[0] * 1e3, 1),
                    "capture_ms": round(statistics.median(captures[1:] or captures) * 1e3, 1),
                    "replay_build_ms": round(rebuild * 1e3, 1),
                    "replayed_forward_ms": round(forward * 1e3, 1),
                    "same_output": bool(torch.allclose(answer.y.double(), expected.double(), rtol=rtol, atol=atol)),
                }
            )
            for worker, handle in ((builder, info.handle), (replayer, replayed.handle)):
                worker.request(DropRequest(handle))
    finally:
        capturing.close()
        replaying.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = measure(args.device, max(2, args.repeats))
    header = f"{'what':58s} {'ops':>5s} {'mm':>4s} {'1st capture':>12s} {'capture':>8s} {'rebuild':>8s} {'forward':>8s}  same"
    print(header)
    for r in rows:
        print(
            f"{r['what'][:58]:58s} {r['operations']:5d} {r['matmuls']:4d} {r['first_capture_ms']:10.1f}ms "
            f"{r['capture_ms']:6.1f}ms {r['replay_build_ms']:6.1f}ms {r['replayed_forward_ms']:6.1f}ms  {r['same_output']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capture-check.json").write_text(json.dumps(rows, indent=2) + "\n")
    ok = all(r["same_output"] and r["allowed"] for r in rows)
    print("every replayed graph computes its module's output" if ok else "A REPLAYED GRAPH DIFFERS, OR WAS REFUSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
