"""The speed part's clock against the standard tools, the GPU's state around each timed round, and whether a
frozen helper's queued GPU work slows the reference: the GPU figures `tools/gpu_check.sh` reports.

    .venv/bin/python tools/gpu_timing.py [--device auto|cpu|cuda] [--rounds 15] [--out gpu-check]

1. Per workload of the device (the rubric's), the grader's time per call for the wrapper and the reference,
   measured and charged as a grading does (their timing workers, `client.TimedCalls`, the grader's clock
   around each round's calls, less the waits for a CPU, `timing.charge`), beside `torch.utils.benchmark.Timer.adaptive_autorange` and, when triton can be
   imported, `triton.testing.do_bench` on the same modules and shapes in this process: the ratio of each,
   and of the speedup (wrapper over reference) each finds. The grader's time also holds what each of its
   calls does besides the forward (making the input from its seed, the probes, the L2 flush on CUDA, the
   exchange), so its ratio per call is above 1 by that much; the speedups are what the score rests on.
2. On CUDA with nvidia-ml-py (`pynvml`): the SM clock, the temperature and the throttle reasons sampled
   before and after each timed round, and how many rounds ran throttled (reasons other than idle).
3. On CUDA: a submission whose helper process (a CUDA context of its own) queues long kernels at import,
   graded `--part speed` beside the reference's twin: the reference's time per call in both gradings. The
   grader freezes the submission's processes while the reference is timed, but freezing stops CPU threads,
   not work already queued on the GPU; a ratio well above 1 means that work slowed the reference.

Without CUDA, parts 2 and 3 say "skipped: no CUDA" and part 1 runs on the CPU (a rehearsal).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autograder.contract import Workload  # noqa: E402
from autograder.grading import timing  # noqa: E402
from autograder.grading.workers import REFERENCE, WRAPPER, start_trusted_workers  # noqa: E402
from autograder.rubric import load_rubric  # noqa: E402
from autograder.sandbox import procfs  # noqa: E402
from autograder.sandbox.protocol import BuildRequest, ForwardManyRequest  # noqa: E402
from autograder.sandbox.settings import WorkerConfig  # noqa: E402
from reference import mha as ref  # noqa: E402


def nvml() -> Any:
    """pynvml's handle on this process's GPU, or None."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def gpu_state(handle: Any) -> dict[str, Any]:
    import pynvml

    reasons_of = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return {
        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "celsius": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "reasons": int(reasons_of(handle)),
    }


def modules(w: Workload, device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The reference MultiHeadAttention and a wrapper with the same weights, on the device."""
    torch.manual_seed(0)
    dtype = getattr(torch, w.dtype)
    mha = ref.MultiHeadAttention(w.d_in, w.d_out, w.tokens, 0.0, w.heads).to(dtype)
    width = w.d_out // w.heads
    wrapper = ref.MultiHeadAttentionWrapper(w.d_in, width, w.tokens, 0.0, w.heads).to(dtype)
    with torch.no_grad():
        for h, head in enumerate(wrapper.get_submodule("heads").children()):
            for name in ("W_query", "W_key", "W_value"):
                getattr(head, name).weight.copy_(getattr(mha, name).weight[h * width : (h + 1) * width])
    return wrapper.to(device).eval(), mha.to(device).eval()


def grader_times(w: Workload, device: str, rounds: int, handle: Any) -> dict[str, Any]:
    """Per call, as a grading times it: the wrapper's and the reference's timing workers, one timed request
    per round each, the other worker stopped."""
    settings = load_rubric().speed
    assert settings is not None
    workers = start_trusted_workers(WorkerConfig(device=device, threads=settings.threads, request_seconds=120))
    wrapper, mha = modules(w, device)
    built = {}
    try:
        for name, module, cls, args in (
            (
                WRAPPER,
                wrapper,
                "MultiHeadAttentionWrapper",
                [w.d_in, w.d_out // w.heads, w.tokens, 0.0, w.heads],
            ),
            (REFERENCE, mha, "MultiHeadAttention", [w.d_in, w.d_out, w.tokens, 0.0, w.heads]),
        ):
            worker = workers[name].get()
            state = {k: v.cpu() for k, v in module.state_dict().items()}
            info = worker.request(BuildRequest(cls, args, {}, state_dict=state, dtype=w.dtype, device=device))
            # timed as a grading times it: the forward captured and replayed as a graph
            replayed, _graph = timing.replay_in(worker, info.handle, w, state, device)
            built[name] = (worker, replayed, w.wrapper_calls if name == WRAPPER else w.calls)
        per_call: dict[str, list[float]] = {name: [] for name in built}
        states: list[dict[str, Any]] = []
        seed = 1
        with timing.Stage([worker for worker, _, _ in built.values()]) as stage:
            for index in range(rounds + settings.warmup_rounds):
                for name, (worker, module_handle, calls) in built.items():
                    stage.run(worker)
                    request = ForwardManyRequest(
                        handle=module_handle,
                        calls=calls,
                        shape=list(w.shape),
                        dtype=w.dtype,
                        out_features=w.d_out,
                        threads=settings.threads,
                        flush_bytes=int(w.flush_mib * (1 << 20)),
                    )
                    timed = worker.timed_calls(request, 120.0, ready_seconds=settings.ready_seconds)
                    before = gpu_state(handle) if handle is not None else None
                    cpu, waits, mine = worker.cpu_seconds(), worker.thread_waits(), procfs.own_wait()
                    start = time.perf_counter()
                    timed.open()
                    for _ in range(calls):
                        timed.call(seed)
                        seed += 1
                    wall = time.perf_counter() - start
                    wait = timing.waited(waits, worker.thread_waits()) + procfs.own_wait() - mine
                    # charged as a grading charges it (`timing.charge`)
                    seconds = timing.charge(wall, worker.cpu_seconds() - cpu, wait, settings.threads) / calls
                    after = gpu_state(handle) if handle is not None else None
                    timed.finish([])
                    if index >= settings.warmup_rounds:
                        per_call[name].append(seconds)
                        if before is not None and after is not None:
                            states.append({"target": name, "before": before, "after": after})
    finally:
        for worker in workers.values():
            worker.close()
    return {"per_call": {name: statistics.median(times) for name, times in per_call.items()}, "gpu": states}


def tool_times(w: Workload, device: str) -> dict[str, dict[str, float]]:
    """Per call, by the standard tools, in this process, on a fixed input."""
    from torch.utils.benchmark import Timer

    torch.set_num_threads(load_rubric().speed.threads)  # type: ignore[union-attr]
    wrapper, mha = modules(w, device)
    x = torch.randn(*w.shape, dtype=getattr(torch, w.dtype), device=device)
    found: dict[str, dict[str, float]] = {"Timer.adaptive_autorange": {}}
    with torch.no_grad():
        for name, module in ((WRAPPER, wrapper), (REFERENCE, mha)):
            found["Timer.adaptive_autorange"][name] = (
                Timer("m(x)", globals={"m": module, "x": x}).adaptive_autorange(min_run_time=1.0).median
            )
        if device.startswith("cuda"):
            try:
                from triton.testing import do_bench
            except ImportError:
                print("   triton.testing.do_bench: skipped (triton cannot be imported)")
            else:
                found["triton do_bench"] = {
                    name: do_bench(lambda m=module: m(x), return_mode="median") / 1e3
                    for name, module in ((WRAPPER, wrapper), (REFERENCE, mha))
                }
    return found


def compare(device: str, rounds: int) -> dict[str, Any]:
    settings = load_rubric().speed
    assert settings is not None
    handle = nvml() if device.startswith("cuda") else None
    report: dict[str, Any] = {}
    for w in settings.workloads_for(device):
        print(f"== {w.name}")
        grader = grader_times(w, device, rounds, handle)
        tools = tool_times(w, device)
        g = grader["per_call"]
        speedup = g[WRAPPER] / g[REFERENCE]
        print(
            f"   grader: wrapper {g[WRAPPER] * 1e3:.4g} ms, reference {g[REFERENCE] * 1e3:.4g} ms per call "
            f"(median of {rounds} rounds); speedup {speedup:.2f}x"
        )
        for tool, t in tools.items():
            tool_speedup = t[WRAPPER] / t[REFERENCE]
            print(
                f"   {tool}: wrapper {t[WRAPPER] * 1e3:.4g} ms, reference {t[REFERENCE] * 1e3:.4g} ms; "
                f"grader / tool: wrapper {g[WRAPPER] / t[WRAPPER]:.3f}, reference "
                f"{g[REFERENCE] / t[REFERENCE]:.3f}; speedup {tool_speedup:.2f}x, grader's / tool's "
                f"{speedup / tool_speedup:.3f} (goal: within 5%)"
            )
        if handle is None:
            print(
                "   GPU clocks, temperature, throttling: skipped: no CUDA"
                if not device.startswith("cuda")
                else "   GPU clocks, temperature, throttling: skipped: nvidia-ml-py (pynvml) cannot be imported"
            )
        else:
            states = grader["gpu"]
            clocks = [s[k]["sm_mhz"] for s in states for k in ("before", "after")]
            temps = [s[k]["celsius"] for s in states for k in ("before", "after")]
            idle = 0x1  # clocks_event_reason_gpu_idle: not a slowdown
            throttled = [s for s in states if (s["before"]["reasons"] | s["after"]["reasons"]) & ~idle]
            print(
                f"   SM clock {min(clocks)}-{max(clocks)} MHz, {min(temps)}-{max(temps)} C; {len(throttled)} of "
                f"{len(states)} timed requests with a throttle reason other than idle"
                + (f" (first: {throttled[0]})" if throttled else "")
            )
        report[w.name] = {"grader": grader, "tools": tools}
    return report


HOG = """
import subprocess, sys
# a helper with a CUDA context of its own, queuing long kernels (about a minute of GPU time), then idle
subprocess.Popen([sys.executable, "-c", "import torch, time\\n"
                  "for _ in range(120): torch.cuda._sleep(1_000_000_000)\\n"
                  "time.sleep(600)"])
"""


def frozen_helper(device: str, out: Path) -> dict[str, Any] | None:
    """Issue 19.10: the reference's time per call graded beside a clean twin and beside the helper."""
    if not device.startswith("cuda"):
        print("== a frozen helper's queued GPU work: skipped: no CUDA")
        return None
    print("== a frozen helper's queued GPU work")
    sys.path.insert(0, str(ROOT / "tests"))
    from speed_variants import definitions

    found = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, source in (("twin", definitions()), ("helper", definitions() + "# %%\n" + HOG.strip() + "\n")):
            path = Path(scratch) / name / "mha.py"
            path.parent.mkdir()
            path.write_text(source)
            results_path = out / f"frozen-helper-{name}.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "autograder",
                    "grade",
                    str(path),
                    "--device",
                    device,
                    "--part",
                    "speed",
                    "--out",
                    str(results_path),
                    "--quiet",
                ],
                cwd=ROOT,
                check=False,
                timeout=300,
            )
            results = json.loads(results_path.read_text())
            workloads = (results["extra_data"].get("speed") or {}).get("workloads") or {}
            found[name] = {k: (f.get("ms_per_call") or {}).get(REFERENCE) for k, f in workloads.items()} | {
                "score": results["score"]
            }
    for workload in found["twin"]:
        if workload == "score":
            continue
        clean, beside = found["twin"][workload], found["helper"].get(workload)
        if clean and beside:
            print(
                f"   {workload}: the reference {clean:.4g} ms per call beside the twin, {beside:.4g} ms beside the "
                f"helper: ratio {beside / clean:.2f} ({'the queued work slowed it' if beside / clean > 1.1 else 'fine'})"
            )
        else:
            print(f"   {workload}: not measured (twin {clean}, helper {beside})")
    print(f"   speed points: twin {found['twin']['score']}, helper {found['helper']['score']}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="gpu-check")
    options = parser.parse_args()
    device = options.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": device, "compare": compare(device, options.rounds), "frozen_helper": frozen_helper(device, out)}
    (out / "gpu-timing.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
