"""`make bench` runs end to end (on tiny shapes here): every module timed in both modes, the five compute the
same thing, the table, the JSON and the PNG are written. The figures themselves are the benchmark's to show."""

import json
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import bench  # noqa: E402  (tools/ is not a package)


@pytest.mark.slow
def test_bench_writes_its_table_json_and_plot(tmp_path, monkeypatch, capsys):
    tiny = [bench.Shape("tiny: 4 heads of width 4, 8 tokens", 2, 8, 16, 4, "float32")]
    monkeypatch.setattr(bench, "shapes_for", lambda device, quick: tiny)
    assert bench.main(["--device", "cpu", "--out", str(tmp_path), "--rounds", "2"]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    rows = data["rows"]
    assert {(r["module"], r["mode"]) for r in rows} == {(m, mode) for m in bench.MODULES for mode in bench.MODES}
    assert all(r["median_ms"] > 0 and r["gflops"] > 0 and r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] for r in rows)
    assert all(r["speedup_over_wrapper"] == 1 for r in rows if r["module"] == "wrapper")
    assert data["matmul_peak_gflops"]["float32"] > 0
    # the peak is a ceiling: no module does the work it needs faster than the best matrix product ran
    assert all(r["fraction_of_peak"] <= 1 for r in rows), [(r["module"], r["fraction_of_peak"]) for r in rows]
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "x wrapper" in out and "matrix-multiply peak" in out and "scaled_dot_product_attention" in out


def test_flops_count_the_projections_and_the_attention_the_mask_keeps():
    shape = bench.Shape("s", batch=2, tokens=8, d_model=16, heads=4, dtype="float32")
    tokens = 2 * 8
    pairs = 8 * 9 // 2  # query-key pairs of 8 tokens that the causal mask keeps
    assert shape.flops(wrapper=False) == 4 * 2 * tokens * 16 * 16 + 2 * 2 * 2 * pairs * 16
    assert shape.flops(wrapper=True) == shape.flops(wrapper=False) - 2 * tokens * 16 * 16  # no output projection


@pytest.mark.slow
def test_the_gpu_checks_tools_run_on_the_cpu():
    """`tools/gpu_check.sh`'s timing and fork-server tools, run on the CPU as they are rehearsed before a GPU is
    lent: they drive the grader's own workers, so a change of the workers' API that forgets them fails here,
    not on the GPU."""
    from dataclasses import replace

    import capture_check  # noqa: E402  (tools/ is not a package)
    import fork_check  # noqa: E402
    import gpu_timing  # noqa: E402
    import request_margin  # noqa: E402

    from autograder.rubric import load_rubric

    found = fork_check.forked_workers("cpu")
    assert len(found["answers"]) == 2 and (found["forked"] or found["why_fresh"])
    speed = load_rubric().speed
    workload = replace(speed.workloads_for("cpu")[0], calls=2)
    times = gpu_timing.grader_times(workload, "cpu", 1, None)
    assert times, times
    captured = capture_check.measure("cpu", 2)
    assert captured and all(row["same_output"] and row["allowed"] for row in captured), captured
    margins = request_margin.measure("cpu")
    assert {row["forward"] for row in margins} == {"reference", "loop over heads", "loop over tokens"}
    assert all(row["margin"] > 1 for row in margins), margins
