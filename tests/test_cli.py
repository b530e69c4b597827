"""The commands people type: grade, preview and grade-class, including how they fail."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from autograder.sandbox.protocol import clean_text
from helpers import REFERENCE, ROOT, autograder, mutated_reference


def test_missing_file_cannot_be_graded_but_still_gets_results(tmp_path):
    run = autograder("grade", tmp_path / "nope.py", "--out", tmp_path / "results.json", cwd=tmp_path)
    assert run.returncode == 2
    assert "no such submission file" in run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and "could not be graded" in results["output"]


@pytest.mark.slow  # a whole grading run
def test_an_unreadable_notebook_is_graded_zero_with_the_reason(tmp_path):
    notebook = tmp_path / "mha.ipynb"
    notebook.write_text("{ this is not json")
    run = autograder("grade", notebook, "--out", tmp_path / "results.json", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and results["max_score"] == 100
    assert all("not a readable Jupyter notebook" in t["output"] for t in results["tests"] if t["tags"][0] != "speed")
    (speed,) = [t for t in results["tests"] if t["tags"][0] == "speed"]  # it rests on the values, and says so
    assert "not-credited" in speed["tags"] and "counts only once the values" in speed["output"]


@pytest.mark.slow  # a whole grading run
def test_preview_runs_only_visible_checks_and_names_the_mistake(tmp_path):
    wrong = mutated_reference(tmp_path, "dim1", "return torch.cat(outputs, dim=-1)", "return torch.cat(outputs, dim=1)")
    run = autograder("preview", wrong, cwd=tmp_path)
    assert run.returncode == 1, run.stderr  # a visible check failed
    assert "Visible checks" in run.stdout
    assert "concatenated along the token dimension" in " ".join(run.stdout.split())
    assert not list(tmp_path.glob("**/results.json"))  # preview writes no results
    assert "points" not in run.stdout  # nor scores


@pytest.mark.slow  # a whole grading run
@pytest.mark.smoke  # the one whole grading every supported Python runs (make test-pythons)
def test_grade_prints_a_summary_per_part(tmp_path):
    run = autograder("grade", REFERENCE, "--out", tmp_path / "r.json", cwd=tmp_path)
    assert run.returncode == 0
    for part in ("quiz", "combine", "wrapper", "two_dim", "columns", "mha", "fuse", "speed"):
        assert part in run.stdout
    assert "Total: 100 / 100" in run.stdout


@pytest.mark.slow  # a whole grading run
def test_grade_one_part_only(tmp_path):
    out = tmp_path / "r.json"
    run = autograder("grade", REFERENCE, "--part", "speed", "--out", out, "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    assert {t["tags"][0] for t in results["tests"]} == {"speed"}
    assert results["score"] == results["max_score"] == 10
    assert results["leaderboard"][0]["value"] == round(results["extra_data"]["speed"]["speedup"], 3) > 1
    wrong = autograder("grade", REFERENCE, "--part", "sped", "--out", out, "--quiet", cwd=tmp_path)
    assert wrong.returncode == 2 and "no such part: sped" in wrong.stderr


@pytest.mark.slow  # a whole grading run
def test_grade_class_grades_everyone_survives_crashes_and_resumes(tmp_path):
    course = tmp_path / "course"
    for student, source in {"ann": REFERENCE.read_text(), "bob": "import os\nos._exit(1)\n"}.items():
        folder = course / "submitted" / student / "mha"
        folder.mkdir(parents=True)
        (folder / "mha.py").write_text(source)
    (course / "submitted" / "cat" / "mha").mkdir(parents=True)  # submitted nothing

    first = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "cat: no mha.ipynb or mha.py" in " ".join(first.stdout.split())
    ann = json.loads((course / "autograded/ann/mha/results.json").read_text())
    bob = json.loads((course / "autograded/bob/mha/results.json").read_text())
    assert ann["score"] == 100 and bob["score"] == 0
    assert "exited with status 1" in bob["output"]
    rows = (course / "grades.csv").read_text().splitlines()
    assert rows[0].startswith("student,score,max_score,quiz") and len(rows) == 4  # cat too: no submission

    second = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "2 submissions: 0 to grade, 2 already graded" in second.stdout

    shutil.copy(REFERENCE, course / "submitted" / "bob" / "mha" / "mha.py")  # bob resubmits
    third = autograder("grade-class", course, "--device", "cpu", cwd=tmp_path)
    assert "1 to grade" in third.stdout
    assert json.loads((course / "autograded/bob/mha/results.json").read_text())["score"] == 100


@pytest.mark.slow  # a whole grading run
def test_the_seed_is_recorded_and_a_run_can_be_reproduced(tmp_path):
    wrong = mutated_reference(
        tmp_path,
        "scale",
        "attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)\n"
        "        attn_weights = self.dropout(attn_weights)\n\n        # Back to",
        "attn_weights = torch.softmax(attn_scores / self.d_out ** 0.5, dim=-1)\n"
        "        attn_weights = self.dropout(attn_weights)\n\n        # Back to",
    )
    first = tmp_path / "first.json"
    autograder("grade", wrong, "--out", first, "--quiet", cwd=tmp_path)
    seed = json.loads(first.read_text())["extra_data"]["seed"]
    again = tmp_path / "again.json"
    autograder("grade", wrong, "--out", again, "--quiet", "--seed", seed, cwd=tmp_path)
    outputs = [[t["output"] for t in json.loads(p.read_text())["tests"]] for p in (first, again)]
    assert outputs[0] == outputs[1]  # the same hidden inputs, so the same largest differences
    assert any("largest difference" in text for text in outputs[0])


# Runs `python -m autograder grade` with an import hook that, at the first import of a module neither of the
# standard library nor of the grader's own package, reads results.json and ends the process: what a kill -9
# at that moment would leave behind.
AT_FIRST_IMPORT = """
import json, os, runpy, sys, sysconfig

out = sys.argv[1]
STDLIB = tuple(os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib"))

class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top == "autograder":
            return None
        found = [f.find_spec(name, path, target) for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
        spec = next((f for f in found if f is not None), None)  # (the standard library probes for some that do not)
        origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else ""
        if spec is not None and not origin.startswith(STDLIB):
            with open(out) as handle:
                data = json.load(handle)
            extra = data.get("extra_data") or {"status": "old", "reason": data["output"]}
            print(name, extra["status"], extra["reason"])
            sys.stdout.flush()
            os._exit(0)
        return None

sys.meta_path.insert(0, Watch())
sys.argv = ["autograder", "grade", sys.argv[2], "--out", out]
runpy.run_module("autograder", run_name="__main__", alter_sys=True)
"""


def test_the_placeholder_is_written_before_any_import_beyond_the_standard_library(tmp_path):
    """`grade --out` killed in its first seconds once left the previous run's score: the placeholder came after
    the early start and the imports of torch and pytest. It is now the first thing written, so a kill at any
    moment leaves either it or the full result."""
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"score": 100, "max_score": 100, "output": "an older run", "tests": []}))
    (tmp_path / "mha.py").write_text("x = 1\n")
    done = subprocess.run(
        [sys.executable, "-c", AT_FIRST_IMPORT, str(out), str(tmp_path / "mha.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    module, status, reason = done.stdout.split(" ", 2)
    assert status == "cannot_grade" and "grading did not finish" in reason, (module, done.stdout)


@pytest.mark.slow
@pytest.mark.long  # four gradings, each killed
def test_a_grader_killed_at_any_moment_leaves_the_placeholder_or_its_results(tmp_path):
    """kill -9 at moments spread over a grading (from the moment the placeholder appears to the end): what is
    left is the placeholder or the full results, never the older run's score nor half a file."""
    (tmp_path / "mha.py").write_text(REFERENCE.read_text())
    left = []
    for delay in (0.0, 0.5, 2.0, 5.0):
        out = tmp_path / f"results-{delay}.json"
        out.write_text(json.dumps({"score": 100, "max_score": 100, "output": "an older run", "tests": []}))
        grader = subprocess.Popen(
            [sys.executable, "-m", "autograder", "grade", str(tmp_path / "mha.py"), "--out", str(out), "--quiet"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        started = time.monotonic()
        while "an older run" in out.read_text() and grader.poll() is None and time.monotonic() - started < 60:
            time.sleep(0.01)
        time.sleep(delay)
        os.killpg(grader.pid, signal.SIGKILL)
        grader.wait()
        results = json.loads(out.read_text())
        assert results["output"] != "an older run"
        left.append(results["extra_data"]["status"])
        if results["extra_data"]["status"] == "cannot_grade":
            assert "grading did not finish" in results["extra_data"]["reason"]
        else:
            assert results["score"] == 100
    assert "cannot_grade" in left


def test_a_broken_installation_is_not_graded_as_zero(tmp_path, monkeypatch):
    """If the checks themselves cannot run, the grader says so and exits non-zero."""
    import autograder.grading.grade as grade

    checks = tmp_path / "broken_checks"  # a package name of its own: pytest runs twice in this process
    shutil.copytree(grade.CHECKS_DIR, checks, ignore=shutil.ignore_patterns("__pycache__"))
    (checks / "test_combine.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.setattr(grade, "CHECKS_DIR", checks)
    submission = tmp_path / "mha.py"
    submission.write_text("x = 1\n")
    out = tmp_path / "results.json"
    assert grade.grade_command(submission, grade.Options(device="cpu", out=out, quiet=True)) == grade.EXIT_CANNOT_GRADE
    assert "could not be graded" in json.loads(out.read_text())["output"]


def test_a_fault_in_a_check_is_the_graders_not_the_students(tmp_path, monkeypatch):
    """A check that raises anything but its own failure (here a KeyError, as a rubric missing a tolerance
    once caused) makes the run ungradable: no score, exit 2, the fault named; never points lost."""
    import autograder.grading.grade as grade

    checks = tmp_path / "faulty_checks"  # a package name of its own: pytest runs twice in this process
    shutil.copytree(grade.CHECKS_DIR, checks, ignore=shutil.ignore_patterns("__pycache__"))
    (checks / "test_quiz.py").write_text(
        (checks / "test_quiz.py")
        .read_text()
        .replace('    """the answer is right"""\n', '    """the answer is right"""\n    {}["float32"]\n')
    )
    monkeypatch.setattr(grade, "CHECKS_DIR", checks)
    out = tmp_path / "results.json"
    code = grade.grade_command(REFERENCE, grade.Options(device="cpu", out=out, quiet=True))
    results = json.loads(out.read_text())
    assert code == grade.EXIT_CANNOT_GRADE
    assert results["score"] == 0 and results["max_score"] == 0 and results["tests"] == []
    assert "the grader itself failed (not your submission's fault)" in results["output"]
    assert "KeyError" in results["extra_data"]["grader_errors"][0]


def test_a_grading_stopped_by_sigterm_says_so_and_scores_nothing(tmp_path, monkeypatch):
    """SIGTERM while the checks run (here sent by a check itself) stops pytest: the run cannot grade, results.json
    names the signal, and the process's own SIGTERM handler is back afterwards."""
    import signal

    import autograder.grading.grade as grade

    checks = tmp_path / "stopped_checks"  # a package name of its own: pytest runs twice in this process
    shutil.copytree(grade.CHECKS_DIR, checks, ignore=shutil.ignore_patterns("__pycache__"))
    (checks / "test_quiz.py").write_text(
        (checks / "test_quiz.py")
        .read_text()
        .replace(
            '    """the answer is right"""\n',
            '    """the answer is right"""\n    __import__("os").kill(__import__("os").getpid(), 15)\n',
        )
    )
    monkeypatch.setattr(grade, "CHECKS_DIR", checks)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "results.json"
    code = grade.grade_command(REFERENCE, grade.Options(device="cpu", out=out, quiet=True, parts=("quiz",)))
    results = json.loads(out.read_text())
    assert code == grade.EXIT_CANNOT_GRADE
    assert results["tests"] == [] and results["max_score"] == 0
    assert results["extra_data"]["grader_errors"][0] == "grading was stopped (SIGTERM) before it finished"
    assert signal.getsignal(signal.SIGTERM) == before
    monkeypatch.undo()  # the checks as they are
    again = grade.grade_submission(REFERENCE, grade.Options(device="cpu", out=None, quiet=True, parts=("quiz",)))
    assert again.graded  # the next grading in this process starts unstopped


@pytest.mark.slow  # gradings in processes of their own
def test_a_worker_that_cannot_import_torch_is_the_graders_fault_not_a_zero(tmp_path, swapped_interpreter):
    """The grader installed where its worker's Python has no torch (the worker fails before any of the
    submission's code runs): the reference is not graded 0 but cannot be graded, exit 2, saying why."""
    import os
    import tempfile

    import autograder.grading.grade as grade

    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests run outside a virtual environment: the base interpreter has torch")
    out = tmp_path / "results.json"
    with tempfile.TemporaryDirectory(prefix="no-torch-") as folder:  # readable by the worker's fresh uid
        os.chmod(folder, 0o755)
        python = f"{folder}/python"
        os.symlink(os.path.realpath(sys._base_executable), python)  # the base interpreter: no torch installed
        swapped_interpreter(python)
        options = grade.Options(device="cpu", out=out, quiet=True, isolation="process")
        code = grade.grade_command(REFERENCE, options)
    results = json.loads(out.read_text())
    assert code == grade.EXIT_CANNOT_GRADE
    assert results["score"] == 0 and results["max_score"] == 0 and results["tests"] == []
    assert "the grader itself failed (not your submission's fault)" in results["output"]
    errors = "\n".join(results["extra_data"]["grader_errors"])
    assert "could not start Python and torch" in errors and "No module named 'torch'" in errors


def test_the_names_say_which_command_runs_the_students_code_unsandboxed(tmp_path):
    """`preview` (sandboxed) replaced the CLI's `check`, which read like the kit's unsandboxed `make check`:
    the old name says where each went, and the help texts say which runs the code unsandboxed."""
    old = autograder("check", tmp_path / "mha.py", cwd=tmp_path)
    assert old.returncode == 2 and "`check` is now `preview`" in old.stderr and "make selfcheck" in old.stderr
    helped = autograder("--help", cwd=tmp_path)
    assert "preview" in helped.stdout and "check " not in helped.stdout
    assert "sandboxed" in " ".join(autograder("preview", "--help", cwd=tmp_path).stdout.split())
    make = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "help"], capture_output=True, text=True)
    lines = {line.split()[1]: line for line in make.stdout.splitlines() if line.startswith("make ")}
    assert "UNSANDBOXED" in lines["selfcheck"] and "same as make selfcheck" in lines["check"]
    assert "SANDBOXED" in lines["preview"] and "UNSANDBOXED" not in lines["preview"]


# -- names and files a student chose, on every path -----------------------------------------------------------

# An OSC 8 link (a file name holds no slash), an OSC 52 clipboard write (base64 of "rm -rf ~"), a CSI, a C1 CSI and a bidi override (U+202E:
# the name reads "mha.py"), all in one file name; a forged results.json carries the same in its fields.
HOSTILE_NAME = "\x1b]8;;https:evil.example\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b1mmha\u202eyp.py"
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.slow  # a grading run (of one part)
def test_a_file_name_with_escapes_reaches_neither_results_json_nor_the_summary_raw(tmp_path):
    """The file's name (its own, and in the messages that quote it) is cleaned in results.json and in `grade`'s
    summary: once results.json kept it raw and the summary printed it to the terminal."""
    path = tmp_path / HOSTILE_NAME
    path.write_bytes(b"x = 1\n\0\n")  # a NUL byte: the reader's message quotes the file's name
    out = tmp_path / "results.json"
    run = autograder("grade", path, "--out", out, "--part", "quiz", "--device", "cpu", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert not UNSAFE.search(text) and "\\u001b" not in text, text[:2000]
    results = json.loads(text)
    assert results["extra_data"]["submission"] == clean_text(HOSTILE_NAME, 200)
    assert "contains a NUL byte" in results["output"]
    assert "contains a NUL byte" in run.stdout and not UNSAFE.search(run.stdout + run.stderr), run.stdout


FORGED_RESULTS = {
    "score": 0,
    "max_score": 10,
    "output": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "tests": [
        {
            "name": "speed: \x1b]8;;https://evil.example\x07click\x1b]8;;\x07",
            "score": 0,
            "max_score": 10,
            "status": "failed",
            "output": "\x1b]52;c;cm0gLXJmIH4=\x07 \u202e",
            "tags": ["speed", "speed::test_\x1b[31mspeedup"],
        }
    ],
    "extra_data": {
        "model_version": 1,
        "status": "graded",
        "submission": HOSTILE_NAME,
        "seed": 7,
        "device": "cpu\x1b]52;c;cm0gLXJmIH4=\x07",
        "torch": "2.13\x1b]8;;https://evil.example\x07",
        "speed": {"workloads": {"\x1b]52;c;cm0gLXJmIH4=\x07cpu": {"relative": 0.5, "rounds": 5, "credit": 0}}},
    },
}


def test_explain_cleans_every_field_of_a_results_json_it_is_given(tmp_path):
    """A forged results.json (OSC 52 clipboard writes, OSC 8 links, a bidi override in its fields): explain's
    every line, on stdout and stderr, is cleaned; once it printed them raw."""
    forged = tmp_path / "results.json"
    forged.write_text(json.dumps(FORGED_RESULTS))
    (tmp_path / "mha.py").write_text("x = 1\n")
    shown = autograder("explain", forged, "--submission", tmp_path / "mha.py", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "not reproducible by seed" in shown.stdout and "cpu" in shown.stdout
    missing = autograder("explain", forged, cwd=tmp_path)  # it cannot find the forged file's name
    assert missing.returncode == 2 and "cannot find" in missing.stderr
    for said in (shown.stdout, shown.stderr, missing.stdout, missing.stderr):
        assert not UNSAFE.search(said), repr(said[:500])


# -- disputes: explain a failed hidden check from the recorded seed --------------------------------------------


@pytest.mark.slow
def test_explain_recomputes_a_failed_checks_inputs_and_values_from_the_seed(tmp_path):
    """A missing transpose, graded with a seed: `explain` regrades only the failed checks with it and shows each
    one's input, the reference's expected values and the submission's, and says the outcome was reproduced."""
    from helpers import grade, mutated_reference
    from reference import mha as ref

    path = mutated_reference(
        tmp_path,
        "transpose",
        "context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)",
        "context_vec = attn_weights @ values  # (b, H, T, hd)",
    )
    results, run = grade(path, tmp_path, "--seed", "12345", "--part", "mha")
    assert run.returncode == 0 and results["extra_data"]["seed"] == 12345
    out = tmp_path / "mha-results.json"
    case = "mha::test_matches_reference[float64-12 heads]"
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "explain", str(out), "--submission", str(path)]
        + ["--check", "mha::test_book_example", "--check", case],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "seed 12345" in text and "again:  failed" in text and "NOT what it was graded" not in text
    # the keys --check (CHECK=) takes, each case under its own key, with its own message
    assert f"\n{case}\n" in text and "\nmha::test_book_example\n" in text
    torch.manual_seed(123)
    expected = ref.MultiHeadAttention(3, 2, 6, 0.0, 2)(ref.batch)[0, 0]  # the book's first context vector
    assert f"its first row [{expected[0]:.4g}, {expected[1]:.4g}]" in text
    one_head = text[text.index(f"\n{case}\n") :]
    # the "12 heads" case: what was built (its sizes), its input (batch 1, 8 tokens), what it compares
    assert "built MultiHeadAttention(12, 24, 8, 0.0, 12, qkv_bias=True) with the hidden weights" in one_head
    assert "ran MultiHeadAttention.forward on x: (1, 8, 12) float64" in one_head
    assert "compares shape, dtype and values: output (12 heads)" in one_head and "largest difference" in one_head
    assert "why it failed: output (12 heads): values differ" in one_head
    assert "ModuleInfo(" not in text and "Handle(" not in text


@pytest.mark.slow
def test_explain_names_each_failed_case_by_its_key_and_says_nothing_failed_for_full_marks(tmp_path):
    """combine joined along the tokens: every failed case is explained under its own key, with its own
    message (never another case's); a passing case is not; a run with nothing failed says so."""
    from helpers import REFERENCE, grade, mutated_reference

    path = mutated_reference(
        tmp_path, "tokens", "return torch.cat(outputs, dim=-1)", "return torch.cat(outputs, dim=1)"
    )
    grade(path, tmp_path, "--seed", "7", "--part", "combine")
    explain = [sys.executable, "-m", "autograder", "explain", str(tmp_path / "mha-results.json"), "--submission"]
    text = subprocess.run(explain + [str(path)], capture_output=True, text=True, timeout=300).stdout
    sections = {part.split("\n", 1)[0]: part for part in text.split("\n\n")[1:]}
    for case, heads in (("2 heads", 2), ("4 heads", 4), ("12 heads", 12)):
        section = sections[f"combine::test_concatenates_heads[{case}]"]
        assert f"why it failed: combine of {case}: shape" in section and "dim=1" in section
        assert f"a list of {heads}:" in section
        assert section.count("why it failed") == 1
    assert "combine::test_concatenates_heads[1 head]" not in text  # it passed
    assert "  combine::test_concatenates_heads[4 heads]  (combine:" in text  # the keys, listed first

    reference = tmp_path / "ref" / "mha.py"
    reference.parent.mkdir()
    reference.write_text(REFERENCE.read_text())
    grade(reference, reference.parent, "--part", "columns")
    done = subprocess.run(
        [*explain[:4], str(reference.parent / "mha-results.json"), "--submission", str(reference)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "nothing failed: 10 of 10 points, every check passed" in done.stdout


# Right on its own, wrong once the speed part has built its module (64 heads): the speed part runs first in a
# grading, so every later check sees the wrong values; a check regraded alone does not.
WRONG_AFTER_THE_SPEED_BUILD = """
_seen = []
_init, _forward = MultiHeadAttention.__init__, MultiHeadAttention.forward

def _remember(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
    _seen.append(num_heads)
    _init(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)

def _after_speed(self, x):
    return _forward(self, x) * (1.5 if 64 in _seen else 1.0)

MultiHeadAttention.__init__ = _remember
MultiHeadAttention.forward = _after_speed
"""


@pytest.mark.slow
@pytest.mark.long  # three gradings: the first, and explain's (alone, then whole)
def test_explain_says_reproduced_when_a_check_fails_only_after_what_ran_before_it(tmp_path):
    """Regraded alone, mha's check passes (the speed part did not build its module first); explain once said
    "NOT what it was graded: the file or the grader changed" when neither had. It now grades the whole run
    again, finds the failure, and says why the check alone passed."""
    from helpers import grade
    from speed_variants import with_cell

    path = tmp_path / "mha.py"
    path.write_text(with_cell(WRONG_AFTER_THE_SPEED_BUILD))
    results, run = grade(path, tmp_path, "--seed", "77", "--part", "speed", "--part", "mha")
    assert run.returncode == 0, run.stderr
    failed = {t["tags"][1] for t in results["tests"] if t["status"] == "failed"}
    assert "mha::test_book_example" in failed, failed
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "explain", str(tmp_path / "mha-results.json"), "--submission", str(path)]
        + ["--check", "mha::test_book_example"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "NOT" not in text and "the file or the grader changed" not in text, text
    assert "again: failed (reproduced, graded whole as it was" in text
    assert "Graded alone it was passed" in text and "the speed part first" in text


def test_a_gradings_notes_are_its_own_and_name_each_check_by_its_id(tmp_path):
    """The notes explain reads are kept by the grading asked to keep them (`Options.notes`), each under the
    running check's id as the grading's plugin names it; nothing is noted outside a grading, or by one that
    keeps none."""
    import autograder.grading.grade as grade
    from autograder.grading.checks import harness

    notes = harness.Notes()
    run = grade.grade_submission(
        REFERENCE, grade.Options(device="cpu", out=None, quiet=True, parts=("combine",), notes=notes)
    )
    assert run.graded and {c.part for c in run.checks} == {"combine"}
    checks = {n["check"] for n in notes.items}
    assert checks and all(c.startswith("test_combine.py::test_") for c in checks), checks
    assert {c.key for c in run.checks} <= {c.replace("test_combine.py::", "combine::").split("[")[0] for c in checks}
    assert {"call", "returned", "compared"} <= {n["kind"] for n in notes.items}
    noted = len(notes.items)
    harness.note("call", what="outside any grading")
    grade.grade_submission(REFERENCE, grade.Options(device="cpu", out=None, quiet=True, parts=("combine",)))
    assert len(notes.items) == noted and notes.check == ""


def test_explain_says_not_reproduced_only_with_the_reason():
    """The verdict line: reproduced alone; reproduced only whole; not reproduced, because an input changed,
    or although the class record says nothing did."""
    from autograder.grading.explain import reproduction
    from autograder.model import FAILED, GRADED, PASSED, CheckResult, GradingRun

    row = CheckResult("mha::test_x", "mha", "x", FAILED, 0, 1, "wrong values")
    failing = GradingRun(GRADED, "mha.py", checks=[row])
    passing = GradingRun(GRADED, "mha.py", checks=[CheckResult("mha::test_x", "mha", "x", PASSED, 1, 1)])
    assert reproduction(row, "", failing, None, [], False) == "again:  failed"
    line = reproduction(row, "", passing, failing, [], False)
    assert line.startswith("again:  failed (reproduced, graded whole as it was") and "NOT" not in line
    line = reproduction(row, "", passing, passing, ["submission"], True)
    assert "NOT reproduced" in line and "the submission changed since it was graded" in line
    line = reproduction(row, "", passing, passing, [], True)
    assert "NOT reproduced" in line and "are as they were" in line and "varies between gradings" in line


def test_explain_says_why_the_speed_part_is_not_reproducible(tmp_path):
    from autograder.grading.explain import explain_speed
    from autograder.model import GRADED, GradingRun, SpeedFigures, WorkloadFigures

    run = GradingRun(
        GRADED,
        "mha.py",
        seed=7,
        speed=SpeedFigures(workloads={"w": WorkloadFigures(relative=0.93, rounds=21, credit=1)}),
    )
    text = explain_speed(run, "mha.py")
    assert "not reproducible by seed" in text and "--part speed --seed 7" in text and "0.930" in text


def test_make_grade_one_takes_the_seed_to_repeat_a_run():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), "grade-one", "SEED=4242", f"VENV={sys.prefix}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "--seed 4242" in done.stdout


def test_explain_finds_a_class_members_file_from_the_record(tmp_path):
    from autograder.grading.explain import submission_of

    record = tmp_path / "course" / "results" / "ada" / "mha" / "results.json"
    copy = tmp_path / "course" / "autograded" / "ada" / "mha" / "results.json"
    graded = tmp_path / "course" / "submitted" / "ada" / "mha" / "mha (1).ipynb"
    for path in (record, copy, graded):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    assert submission_of(record, "mha (1).ipynb") == graded.resolve()
    assert submission_of(copy, "mha (1).ipynb") == graded.resolve()
    assert submission_of(record, "mha.py") is None


def test_make_grade_echoes_one_line_with_only_the_options_given():
    """make echoes the command it runs: one line, no dangling backslashes, the options asked for."""
    for target, extra in (("grade", ["JOBS=3", "STUDENT=ada"]), ("merge", ["RELEASED=1"]), ("grade", [])):
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, *extra, f"VENV={sys.prefix}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        (command,) = [line for line in done.stdout.splitlines() if "grade-class" in line]
        assert not command.rstrip().endswith("\\") and "  " not in command.split("grade-class", 1)[1]
        assert all(not line.rstrip().endswith("\\") for line in done.stdout.splitlines())
    assert (
        '--jobs 3 --student "ada"'
        in subprocess.run(
            [
                "make",
                "-n",
                "--no-print-directory",
                "-C",
                str(ROOT),
                "grade",
                "JOBS=3",
                "STUDENT=ada",
                f"VENV={sys.prefix}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
