"""How far the slowest honest forwards stay from a request's CPU deadline (`[limits] request_factor`,
`request_floor_seconds`; `client.RequestCpu`), on a device (for `tools/gpu_check.sh`; `--device cpu` here).

    .venv/bin/python tools/request_margin.py --device cuda --out gpu-check

For the reference's MultiHeadAttention forward, a loop over the heads and a Python loop over the tokens, at the
structure checks' size and on each speed workload of the device: the reference's CPU for the forward, measured in
this process as the grader measures it (`harness.reference_cost`), the deadline the rubric gives the request, and
the CPU the request used in a worker of that forward (the first forward of the worker, and the most of three
later ones), all processes of the worker together. The margin is the deadline over the CPU used: above 1, the
forward is never stopped. Prints a table and writes `request-margin.json` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def measure(device: str) -> list[dict[str, Any]]:
    import torch

    from autograder.grading.checks.harness import reference_cost, reference_forward
    from autograder.grading.workers import reference_cells, worker_config
    from autograder.rubric import load_rubric
    from autograder.sandbox.client import RequestCpu, Worker
    from autograder.sandbox.protocol import BuildRequest, ForwardRequest
    from reference import mha as ref
    from speed_variants import LOOP_OVER_HEADS, LOOP_OVER_TOKENS

    rubric = load_rubric()
    config = worker_config(rubric, device, [], os.environ.get("AUTOGRADER_ISOLATION", "auto"))
    sizes: list[tuple[str, list[Any], tuple[int, ...], str]] = [
        ("the checks' size, 12 heads", [12, 24, 6, 0.0, 12], (2, 6, 12), "float64")
    ]
    assert rubric.speed is not None
    sizes += [
        (w.name, [w.d_in, w.d_out, w.tokens, 0.0, w.heads], w.shape, w.dtype)
        for w in rubric.speed.workloads_for(device)
    ]
    variants = {"reference": "", "loop over heads": LOOP_OVER_HEADS, "loop over tokens": LOOP_OVER_TOKENS}
    rows = []
    for variant, code in variants.items():
        cells = reference_cells() + ([(1000, 1, code)] if code else [])
        worker = Worker(cells, "mha.py", config)
        try:
            worker.start()
            for label, args, shape, dtype in sizes:
                torch.manual_seed(0)
                module = ref.MultiHeadAttention(*args).to(getattr(torch, dtype)).eval()
                state = {k: v.cpu() for k, v in module.state_dict().items()}
                info = worker.request(BuildRequest("MultiHeadAttention", args, {}, state, dtype, device))
                on_device = module.to(device)
                x = torch.randn(*shape, dtype=getattr(torch, dtype))
                on_device_x = x.to(device)
                reference_forward(on_device, on_device_x)  # the grader's first forward is no reference's cost
                _, reference_cpu = reference_cost(partial(reference_forward, on_device, on_device_x))
                used = []
                for _ in range(4):
                    before = worker.budgets.cpu_used(fresh=True)
                    worker.request(ForwardRequest(info.handle, x), reference_cpu=reference_cpu)
                    used.append(worker.budgets.cpu_used(fresh=True) - before)
                deadline = RequestCpu.of(config, "forward", reference_cpu, config.request_seconds)
                limit = deadline.limit if deadline is not None else config.request_seconds
                worst = max(used)
                rows.append(
                    {
                        "forward": variant,
                        "size": label,
                        "device": device,
                        "reference_cpu_s": round(reference_cpu, 5),
                        "limit_cpu_s": round(limit, 3),
                        "first_cpu_s": round(used[0], 3),
                        "later_cpu_s": round(max(used[1:]), 3),
                        "margin": round(limit / max(worst, 0.001), 1),
                    }
                )
        finally:
            worker.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    args = parser.parse_args()
    rows = measure(args.device)
    print(f"{'forward':18s} {'size':58s} {'reference':>10s} {'limit':>7s} {'first':>7s} {'later':>7s} {'margin':>7s}")
    for r in rows:
        print(
            f"{r['forward']:18s} {r['size'][:58]:58s} {r['reference_cpu_s'] * 1e3:8.2f}ms {r['limit_cpu_s']:6.2f}s "
            f"{r['first_cpu_s']:6.3f}s {r['later_cpu_s']:6.3f}s {r['margin']:7.1f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "request-margin.json").write_text(json.dumps(rows, indent=2) + "\n")
    ok = all(r["margin"] > 1 for r in rows)
    print("no honest forward reaches its CPU deadline" if ok else "AN HONEST FORWARD REACHES ITS CPU DEADLINE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
