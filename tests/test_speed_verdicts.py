"""The speed part's verdicts, each graded many times on a busy machine: they must never flake.

Every submission below is graded `GRADINGS` times (`grade --part speed`, one at a time) while another process
burns a core. The reference's own definitions must earn the speed points in every grading; a loop over heads
with the right values (two of them: the sample class's, and the tightest one, which loops over nothing but the
two attention matmuls), a forward that sleeps 50 ms, a submission that burns the CPU from import on, and
caching by shape or by input identity must earn none in any.

Long (about half a minute per grading on a loaded 2-core machine): marked `verdicts`, which only
`make test-speed` selects. Each test prints the measured figures: per grading, the submission's speedup as a
fraction of the reference's (`relative`), its median over the gradings, the middle half of the per-round
ratios, and the worst case (the lowest for the reference, the highest for the others).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from helpers import grade
from speed_variants import VARIANTS

GRADINGS = int(os.environ.get("SPEED_VERDICT_GRADINGS", "10"))
EARNS_ALL = {"reference"}
EARNS_NOTHING = set(VARIANTS) - EARNS_ALL

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.verdicts]


@pytest.fixture(scope="module")
def neighbour():
    """Another process burning one core for as long as the verdicts are graded."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield burner
    burner.kill()
    burner.wait()


def speed_figures(results: dict) -> dict:
    """The workload's figures; none when the check stopped before timing (e.g. a timed forward that
    overran its deadline)."""
    workloads = (results["extra_data"].get("speed") or {}).get("workloads") or {}
    return next(iter(workloads.values()), {})


@pytest.mark.timeout(GRADINGS * 300 + 60)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_verdict_holds_in_every_grading(tmp_path, neighbour, variant):
    path = tmp_path / variant / "mha.py"
    path.parent.mkdir()
    path.write_text(VARIANTS[variant]())
    rows = []
    for number in range(GRADINGS):
        out_dir = tmp_path / f"grading-{number}"
        out_dir.mkdir()
        results, run = grade(path, out_dir, "--part", "speed")
        assert run.returncode == 0, run.stderr
        assert neighbour.poll() is None, "the neighbour stopped burning"
        (check,) = results["tests"]
        figures = speed_figures(results)
        rows.append(
            {
                "score": check["score"],
                "max_score": check["max_score"],
                "status": check["status"],
                "relative": figures.get("relative"),
                "spread": figures.get("relative_spread"),
                "speedup": figures.get("speedup"),
                "reference_speedup": figures.get("reference_speedup"),
                "failed": figures.get("failed"),
                "output": check["output"],
            }
        )
    report(variant, rows, tmp_path)
    if variant in EARNS_ALL:
        assert all(r["status"] == "passed" and r["score"] == r["max_score"] > 0 for r in rows), rows
    else:
        assert all(r["status"] == "failed" and r["score"] == 0 for r in rows), rows


def report(variant: str, rows: list[dict], tmp_path):
    measured = [r["relative"] for r in rows if r["relative"] is not None]
    line = f"\n{variant}: {len(rows)} gradings, scores {sorted({r['score'] for r in rows})}"
    if measured:
        worst = min(measured) if variant in EARNS_ALL else max(measured)
        q1 = min(r["spread"]["q1"] for r in rows if r["spread"])
        q3 = max(r["spread"]["q3"] for r in rows if r["spread"])
        line += (
            f"; relative per grading {[round(v, 3) for v in measured]}, median {statistics.median(measured):.3f}, "
            f"worst {worst:.3f}; per-round middle half within {q1:.2f}-{q3:.2f}; reference speedup "
            f"{statistics.median(r['reference_speedup'] for r in rows if r['reference_speedup']):.2f}x"
        )
    unmeasured = [r["failed"] or r["output"] for r in rows if r["relative"] is None]
    if unmeasured:
        line += f"; not measured in {len(unmeasured)} (first: {unmeasured[0][:160]!r})"
    print(line)
    (tmp_path / "verdicts.json").write_text(json.dumps(rows, indent=1))
