"""The fork server on a device: it never touches CUDA, each forked worker makes its own context, and what a
grading costs with it (for `tools/gpu_check.sh`; `--device cpu` rehearses the same steps).

    .venv/bin/python tools/fork_check.py --device cuda --out gpu-check [--gradings 3]

1. Two workers forked from one fork server, alive together, each running a forward on the device: the fork
   server's memory map must hold no CUDA driver (libcuda) and torch must report CUDA uninitialised in it, while
   each child holds a context of its own (its own pid among the device's compute processes, where nvidia-smi
   can say).
2. A correct submission (the reference's definitions) graded from the command line `--gradings` times: wall
   time, the CPU time of the grader and everything it started, and the grading's own `execution_time`;
   then the same gradings in one long-lived grading process (as `grade-class` grades), where only the first
   pays for the grader's and the fork server's start.

Prints a report and writes `fork-check.json` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

FORWARD = """
import os, torch
def run(device):
    x = torch.randn(8, 64, 256, device=device)
    layer = torch.nn.Linear(256, 256).to(device)
    y = layer(x)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"pid": os.getpid(), "sum": float(y.sum()), "cuda": torch.cuda.is_initialized()}
"""


def maps_hold_cuda(pid: int) -> bool | None:
    try:
        return "libcuda.so" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None


def compute_processes() -> list[int] | None:
    """The pids nvidia-smi lists as using a GPU (None where it cannot say)."""
    if not shutil.which("nvidia-smi"):
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
    )
    return [int(p) for p in done.stdout.split() if p.strip().isdigit()] if done.returncode == 0 else None


def forked_workers(device: str) -> dict:
    from autograder.grading.workers import worker_config
    from autograder.rubric import load_rubric
    from autograder.sandbox.client import Worker
    from autograder.sandbox.protocol import CallRequest

    config = worker_config(load_rubric(), device, [], os.environ.get("AUTOGRADER_ISOLATION", "auto"))
    started = time.monotonic()
    workers = [Worker([(1, 1, FORWARD)], "mha.py", config) for _ in range(2)]
    try:
        answers = [w.request(CallRequest("run", [device], {})) for w in workers]
        seconds = time.monotonic() - started
        processes = [w.process for w in workers]
        forked = all(p is not None and p.forked for p in processes)
        found: dict = {"forked": forked, "first_two_workers_seconds": round(seconds, 2), "answers": answers}
        if forked:
            server = processes[0].process.server  # type: ignore[union-attr]
            server_pid = server.process.pid if server.process else None
            inner = [int(p) for p in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()]
            # under bubblewrap the fork server is bubblewrap's grandchild; its pids: the whole tree
            tree = {server_pid, *inner}
            for pid in list(tree):
                try:
                    tree |= {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
                except OSError:
                    pass
            children = {pid for p in processes for pid in p.pids()}  # type: ignore[union-attr]
            server_side = sorted(tree - children)
            found["fork_server_pids"] = server_side
            found["fork_server_maps_hold_cuda"] = any(maps_hold_cuda(pid) for pid in server_side)
            found["children_hold_cuda"] = [
                any(maps_hold_cuda(pid) for pid in p.pids())  # type: ignore[union-attr]
                for p in processes
            ]
            gpu = compute_processes()
            if gpu is not None:
                found["gpu_processes"] = gpu
                found["fork_server_on_gpu"] = bool(set(gpu) & set(server_side))
        else:
            found["why_fresh"] = workers[0].fresh_because
        return found
    finally:
        for w in workers:
            w.close()


def cli_gradings(device: str, count: int, folder: Path) -> list[dict]:
    from speed_variants import definitions  # the reference's definitions (tests/speed_variants.py)

    path = folder / "correct" / "mha.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(definitions())
    rows = []
    for number in range(count):
        out = folder / f"cli-{number}.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "autograder", "grade", str(path), "--device", device, "--out", str(out), "--quiet"],
            cwd=ROOT,
            check=False,
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        results = json.loads(out.read_text())
        rows.append(
            {
                "wall": round(wall, 2),
                "cpu_reaped": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
                "execution_time": results["execution_time"],
                "score": results["score"],
                "worker_cpu_seconds": (results["extra_data"].get("resources") or {}).get("worker_cpu_seconds"),
                "workers": (results["extra_data"].get("machine") or {}).get("workers", "forked"),
                "load": round(os.getloadavg()[0], 2),
            }
        )
    return rows


def pool_gradings(device: str, count: int, folder: Path) -> list[dict]:
    from autograder.course.grading_pool import Grader
    from autograder.rubric import DEFAULT_RUBRIC

    path = folder / "correct" / "mha.py"
    grader = Grader()
    rows = []
    try:
        for number in range(count):
            out = folder / f"pool-{number}.json"
            job = {
                "id": str(number),
                "submission": str(path),
                "out": str(out),
                "device": device,
                "rubric": str(DEFAULT_RUBRIC),
                "parts": None,
            }
            answer = grader.grade(job, 600)
            results = json.loads(out.read_text())
            rows.append(
                {
                    "wall": round(answer.seconds, 2),
                    "execution_time": results["execution_time"],
                    "score": results["score"],
                    "load": round(os.getloadavg()[0], 2),
                }
            )
    finally:
        grader.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--gradings", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": args.device, "load_before": round(os.getloadavg()[0], 2)}
    print(f"== the fork server on {args.device} (load {report['load_before']})", flush=True)
    report["workers"] = forked_workers(args.device)
    print(json.dumps(report["workers"], indent=1), flush=True)
    with tempfile.TemporaryDirectory(prefix="fork-check-") as folder:
        report["cli"] = cli_gradings(args.device, args.gradings, Path(folder))
        report["pool"] = pool_gradings(args.device, args.gradings, Path(folder))
    for name in ("cli", "pool"):
        rows = report[name]
        print(
            f"{name}: wall {[r['wall'] for r in rows]} (median {statistics.median(r['wall'] for r in rows):.2f} s), "
            f"execution_time {[r['execution_time'] for r in rows]}, scores {[r['score'] for r in rows]}, "
            f"load {[r['load'] for r in rows]}"
            + (f", CPU of each grading {[r['cpu_reaped'] for r in rows]}" if name == "cli" else ""),
            flush=True,
        )
    (args.out / "fork-check.json").write_text(json.dumps(report, indent=1))
    problems = []
    workers = report["workers"]
    if not workers.get("forked"):
        problems.append(f"workers were not forked: {workers.get('why_fresh')}")
    if workers.get("fork_server_maps_hold_cuda") or workers.get("fork_server_on_gpu"):
        problems.append("the fork server holds CUDA")
    if args.device.startswith("cuda") and not all(workers.get("children_hold_cuda") or [False]):
        problems.append("a forked worker made no CUDA context of its own")
    if any(r["score"] != 100 for r in report["cli"] + report["pool"]):
        problems.append("a correct submission lost points")
    print("problems: " + ("; ".join(problems) if problems else "none"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
