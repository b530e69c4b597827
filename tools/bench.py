"""`make bench`: a benchmark, not a test. How fast are the wrapper, the weight split and fast peers?

It times five modules computing the same quantity with the same weights: the reference
`MultiHeadAttentionWrapper` (heads one after another), the reference `MultiHeadAttention` (the weight
split), the combined-QKV peer (one projection for queries, keys and values), the
`scaled_dot_product_attention` peer and the `nn.MultiheadAttention` peer; on the grading workload(s) of the
device (from the rubric) and at GPT-2 small's size (batch 1 on the CPU, 8 on CUDA); forward (eval, no
autograd) and forward+backward.

It prints a table (median time per call, the middle half of the rounds, the ratio to the wrapper, achieved
GFLOP/s and its fraction of the matrix-multiply peak measured in the same run) and writes the same figures
as JSON and as a PNG plot. Timing follows GPU kernel leaderboards: outputs checked first, warm-up, rounds in
which every module runs in turn, medians; on CUDA, CUDA events around each call, the device synchronised, and
a buffer larger than the L2 cache overwritten before each call. FLOPs are the work the layer needs: 2 per
multiply-add of every matrix product, and of the attention only the pairs the causal mask keeps (a module that
also computes the masked half, as all but scaled_dot_product_attention do, spends more than it is credited
for); forward+backward counts three times the forward. The peak they are compared with is the best rate of
several matrix products measured in the same run (large squares, and each shape's own projection), so that
no module can be above 100% of it.

    python tools/bench.py [--device auto|cpu|cuda] [--out bench] [--rounds 7] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from autograder.rubric import load_rubric
from reference import mha as ref
from reference.peers import PEERS

MODULES = ("wrapper", "reference", "combined_qkv", "sdpa", "nn_multihead")
LABELS = {
    "wrapper": "wrapper (heads in turn)",
    "reference": "weight split (reference)",
    "combined_qkv": "combined QKV",
    "sdpa": "scaled_dot_product_attention",
    "nn_multihead": "nn.MultiheadAttention",
}
MODES = ("forward", "forward+backward")


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    tokens: int
    d_model: int
    heads: int
    dtype: str

    def flops(self, wrapper: bool) -> float:
        """FLOPs one forward needs: the projections (no output projection in the wrapper) and the two attention
        products over the t(t+1)/2 query-key pairs the causal mask keeps."""
        b, t, d = self.batch, self.tokens, self.d_model
        projections = (3 if wrapper else 4) * 2 * b * t * d * d
        return projections + 2 * 2 * b * (t * (t + 1) // 2) * d


def shapes_for(device: str, quick: bool) -> list[Shape]:
    speed = load_rubric().speed
    grading = [
        Shape(f"grading: {w.name}", w.batch, w.tokens, w.d_in, w.heads, w.dtype)
        for w in speed.workloads_for(device)
        if w.d_in == w.d_out
    ]
    if device == "cpu":
        gpt2 = [
            Shape(
                f"GPT-2 small: 12 heads of width 64, {512 if quick else 1024} tokens",
                1,
                512 if quick else 1024,
                768,
                12,
                "float32",
            )
        ]
    else:
        gpt2 = [
            Shape(f"GPT-2 small ({dtype}): 12 heads of width 64, 1024 tokens", 8, 1024, 768, 12, dtype)
            for dtype in ("float32", "bfloat16")
        ]
    return grading + gpt2


def build(shape: Shape, device: str) -> dict[str, torch.nn.Module]:
    """The five modules, with the same weights (the wrapper's head h holds head h's columns)."""
    torch.manual_seed(0)
    dtype = getattr(torch, shape.dtype)
    mha = ref.MultiHeadAttention(shape.d_model, shape.d_model, shape.tokens, 0.0, shape.heads)
    width = shape.d_model // shape.heads
    wrapper = ref.MultiHeadAttentionWrapper(shape.d_model, width, shape.tokens, 0.0, shape.heads)
    with torch.no_grad():
        for h, head in enumerate(wrapper.heads):
            for name in ("W_query", "W_key", "W_value"):
                getattr(head, name).weight.copy_(getattr(mha, name).weight[h * width : (h + 1) * width])
        # the identity output projection makes every module's output the wrapper's (its cost stays)
        mha.out_proj.weight.copy_(torch.eye(shape.d_model))
        mha.out_proj.bias.zero_()
    modules = {"wrapper": wrapper, "reference": mha}
    modules.update({name: PEERS[name].from_reference(mha) for name in ("combined_qkv", "sdpa", "nn_multihead")})
    return {name: modules[name].to(device=device, dtype=dtype) for name in MODULES}


class Timer:
    """Seconds of one call: CUDA events on the GPU (L2 flushed first), the wall clock on the CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if self.cuda else None

    def __call__(self, fn) -> float:
        if self.cuda:
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started


def matmul_peak(device: str, dtype: torch.dtype, timer: Timer, rounds: int, shapes: list[Shape] = ()) -> float:
    """FLOP/s of matrix products at their best: the machine's practical ceiling for this work. A ceiling, so
    the fastest round of the fastest of several products: large squares, and each shape's own projection
    (batch x tokens rows of d_model), whose sizes may suit the machine's kernels better than a square does."""
    sizes = [(n, n, n) for n in ((4096, 8192) if device.startswith("cuda") else (512, 1024, 2048))]
    sizes += [(s.batch * s.tokens, s.d_model, s.d_model) for s in shapes]
    best = 0.0
    for m, k, n in dict.fromkeys(sizes):
        a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
        for _ in range(2):
            a @ b
        times = [timer(lambda a=a, b=b: a @ b) for _ in range(max(2 * rounds, 10))]
        best = max(best, 2 * m * k * n / min(times))
    return best


def call(module: torch.nn.Module, x: torch.Tensor, mode: str):
    if mode == "forward":

        def run():
            with torch.no_grad():
                module(x)
    else:

        def run():
            module.zero_grad(set_to_none=True)
            module(x).sum().backward()

    return run


def time_shape(shape: Shape, device: str, rounds: int, timer: Timer) -> list[dict]:
    modules = build(shape, device)
    dtype = getattr(torch, shape.dtype)
    x = torch.randn(shape.batch, shape.tokens, shape.d_model, device=device).to(dtype)
    with torch.no_grad():  # all five compute the same thing, or the comparison means nothing
        expected = modules["wrapper"].eval()(x).float()
        for name, module in modules.items():
            got = module.eval()(x).float()
            tolerance = 1e-3 if shape.dtype == "float32" else 5e-2
            if not torch.allclose(got, expected, rtol=tolerance, atol=tolerance):
                raise SystemExit(f"bench: {name} does not compute what the wrapper does on {shape.name}")
    rows = []
    for mode in MODES:
        for module in modules.values():
            module.train(mode != "forward")  # dropout is 0: training mode only keeps autograd honest
        runs = {name: call(module, x, mode) for name, module in modules.items()}
        for run in runs.values():  # warm-up
            run()
            run()
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(timer(run))
        flops_factor = 1 if mode == "forward" else 3
        for name, samples in times.items():
            q1, median, q3 = _quartiles(samples)
            ratios = [w / s for w, s in zip(times["wrapper"], samples)]
            flops = shape.flops(name == "wrapper") * flops_factor
            rows.append(
                {
                    "shape": shape.name,
                    "mode": mode,
                    "module": name,
                    "median_ms": median * 1e3,
                    "q1_ms": q1 * 1e3,
                    "q3_ms": q3 * 1e3,
                    "speedup_over_wrapper": statistics.median(ratios),
                    "gflops": flops / median / 1e9,
                }
            )
    return rows


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def print_table(rows: list[dict], peaks: dict[str, float], meta: dict):
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=max(Console().width, 110))
    console.print(
        f"device {meta['device']} ({meta['device_name']}), torch {meta['torch']}, {meta['threads']} "
        f"thread(s), {meta['rounds']} rounds; matrix-multiply peak "
        + ", ".join(f"{dtype} {gflops:,.0f} GFLOP/s" for dtype, gflops in peaks.items())
    )
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for mode in MODES:
            table = Table(title=f"{shape}: {mode}")
            for column in ("module", "median ms", "middle half ms", "x wrapper", "GFLOP/s", "% of peak"):
                table.add_column(column, justify="left" if column == "module" else "right")
            for row in rows:
                if row["shape"] == shape and row["mode"] == mode:
                    peak = peaks[row["dtype"]]
                    table.add_row(
                        LABELS[row["module"]],
                        f"{row['median_ms']:.3g}",
                        f"{row['q1_ms']:.3g}-{row['q3_ms']:.3g}",
                        f"{row['speedup_over_wrapper']:.2f}",
                        f"{row['gflops']:,.1f}",
                        f"{100 * row['gflops'] / peak:.1f}",
                    )
            console.print(table)


def plot(rows: list[dict], path: Path, meta: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(shape, mode) for shape in dict.fromkeys(r["shape"] for r in rows) for mode in MODES]
    figure, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False)
    for axis, (shape, mode) in zip(axes[:, 0], panels):
        selected = [r for r in rows if r["shape"] == shape and r["mode"] == mode]
        names = [LABELS[r["module"]] for r in selected]
        medians = [r["median_ms"] for r in selected]
        errors = [[r["median_ms"] - r["q1_ms"] for r in selected], [r["q3_ms"] - r["median_ms"] for r in selected]]
        bars = axis.barh(names, medians, xerr=errors, color=["#999999"] + ["#3b75af"] * (len(selected) - 1))
        for bar, row in zip(bars, selected):
            axis.text(
                max(bar.get_width(), row["q3_ms"]),
                bar.get_y() + bar.get_height() / 2,
                f"  {row['speedup_over_wrapper']:.2f}x, {row['gflops']:,.0f} GFLOP/s",
                va="center",
                fontsize=8,
            )
        axis.invert_yaxis()
        axis.set_xlabel("median ms per call (bars: middle half of the rounds)")
        axis.set_title(f"{shape}: {mode}", fontsize=9)
        axis.set_xlim(0, max(r["q3_ms"] for r in selected) * 1.6)
    figure.suptitle(f"{meta['device_name']}, torch {meta['torch']}, {meta['threads']} thread(s)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--out", type=Path, default=Path("bench"), help="folder for bench.json and bench.png")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads on the CPU (default: the rubric's [speed] threads, as the grader times)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and a smaller GPT-2 batch")
    args = parser.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda was asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32, as in grading
        torch.backends.cudnn.allow_tf32 = False
    threads = args.threads or load_rubric().speed.threads
    torch.set_num_threads(threads)
    rounds = 3 if args.quick else args.rounds
    timer = Timer(device)
    shapes = shapes_for(device, args.quick)
    peaks = {
        dtype: matmul_peak(device, getattr(torch, dtype), timer, rounds, [s for s in shapes if s.dtype == dtype]) / 1e9
        for dtype in dict.fromkeys(s.dtype for s in shapes)
    }
    rows = []
    for shape in shapes:
        for row in time_shape(shape, device, rounds, timer):
            row["dtype"] = shape.dtype
            row["fraction_of_peak"] = row["gflops"] / peaks[shape.dtype]
            rows.append(row)
    meta = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "CPU",
        "torch": torch.__version__,
        "threads": threads if device == "cpu" else None,
        "rounds": rounds,
        "tf32": False if device == "cuda" else None,
        "flops": "needed: 2 per multiply-add, causal pairs only, forward+backward = 3 x forward",
    }
    print_table(rows, peaks, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(
        json.dumps(
            {"meta": meta, "matmul_peak_gflops": peaks, "shapes": [asdict(s) for s in shapes], "rows": rows}, indent=1
        )
        + "\n"
    )
    plot(rows, args.out / "bench.png", meta)
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
