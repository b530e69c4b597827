"""Command line: `python -m autograder grade|preview|grade-class|release|student-kit|gradescope|doctor ...`.

`grade` and `preview` run the student's code only in the sandboxed worker. The notebook's self-check,
which runs the student's code on this machine unsandboxed, is another command: `make selfcheck`
(`python -m autograder.authoring.selfcheck`). `doctor` says what this machine allows the grader.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

RENAMED_CHECK = (
    "`check` is now `preview`: the grader's visible checks, the student's code sandboxed. The notebook's "
    "self-check, which runs the student's code on this machine unsandboxed, is `make selfcheck`."
)


def main(argv: list[str] | None = None) -> int:
    # Before torch is imported: its idle OpenMP threads sleep rather than spin after each of the grader's
    # small tensor operations (spinning cost about 0.7 s of CPU per grading, taken from the workers beside it).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    grade_help = "grade one submission (mha.py or mha.ipynb) into results.json; the student's code runs sandboxed"
    grade = sub.add_parser("grade", help=grade_help, description=grade_help)
    grade.add_argument("submission", type=Path)
    grade.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    grade.add_argument("--out", type=Path, default=Path("results.json"))
    grade.add_argument("--rubric", type=Path, default=None, help="rubric TOML (default: the packaged one)")
    grade.add_argument("--quiet", action="store_true", help="no summary on the terminal")
    isolation_help = (
        "how the student's code is kept apart: namespace (a sandbox; needs user namespaces), "
        "process (a separate process only) or auto (namespace where possible; default, or "
        "$AUTOGRADER_ISOLATION)"
    )
    isolation_default = os.environ.get("AUTOGRADER_ISOLATION", "auto")
    grade.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the hidden seed (recorded in results.json); only to reproduce a grading run",
    )
    grade.add_argument(
        "--isolation", choices=("auto", "namespace", "process"), default=isolation_default, help=isolation_help
    )
    grade.add_argument(
        "--part",
        action="append",
        default=None,
        dest="parts",
        metavar="PART",
        help="grade only this part (repeatable), e.g. to regrade the speed part; "
        "the others are not run and count for nothing",
    )

    preview_help = (
        "the grader's visible checks on one file, with their feedback and no score: the student's code "
        "runs sandboxed (exit 1 when one fails; needs reference/)"
    )
    preview = sub.add_parser("preview", help=preview_help, description=preview_help)
    preview.add_argument("submission", type=Path)
    preview.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    preview.add_argument("--rubric", type=Path, default=None)
    preview.add_argument(
        "--isolation", choices=("auto", "namespace", "process"), default=isolation_default, help=isolation_help
    )

    release = sub.add_parser("release", help="regenerate the student release from reference/mha.py")
    release.add_argument("--root", type=Path, default=None, help="project root (default: this checkout)")

    klass = sub.add_parser("grade-class", help="grade every submitted/<student>/mha/ of an nbgrader course")
    klass.add_argument("course", type=Path, nargs="?", default=Path("assignments"))
    klass.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    klass.add_argument("--rubric", type=Path, default=None)
    klass.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="submissions graded at once (default: twice the CPUs, at least 2 and at most 8: "
        "a submission waiting on a deadline leaves its CPU to the others)",
    )
    klass.add_argument("--force", action="store_true", help="regrade even what is up to date")
    klass.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="grade only shard K of N (K from 0 to N-1), recording only those students' runs and "
        "writing no class output; 'auto' or 'auto/N' reads K (and N) from a Slurm array task "
        "or a Kubernetes indexed job",
    )
    klass.add_argument(
        "--merge",
        action="store_true",
        help="grade nothing: write the class's outputs from the runs already recorded; "
        "exits 1, writing nothing, when a student's run is missing or out of date",
    )
    klass.add_argument(
        "--student",
        action="append",
        default=None,
        metavar="NAME",
        help="grade only this student (repeatable); the class outputs still cover everyone",
    )
    klass.add_argument(
        "--released",
        action="store_true",
        help="the due date has passed: feedback shows the checks the rubric shows after_due_date",
    )
    klass.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="the gradebook's SQLAlchemy URL (default: the course's nbgrader_config.py, "
        "else sqlite:///COURSE/gradebook.db)",
    )
    klass.add_argument(
        "--isolation", choices=("auto", "namespace", "process"), default=isolation_default, help=isolation_help
    )
    klass.add_argument(
        "--canvas-assignment",
        default=None,
        metavar="'NAME (ID)'",
        help="the Canvas file's column header: the assignment's name and Canvas id as a Canvas gradebook export "
        "heads its column, so Canvas fills that assignment (default: mha, which Canvas matches by exact name "
        "only, else it makes a new assignment)",
    )

    explain = sub.add_parser(
        "explain",
        help="a disputed grade: a failed check's hidden inputs, expected and actual values, from the recorded seed",
    )
    explain.add_argument("results", type=Path, help="a results.json written by the grader")
    explain.add_argument(
        "--check", action="append", default=None, metavar="KEY", help="mha::test_x or mha::test_x[case] (repeatable)"
    )
    explain.add_argument("--submission", type=Path, default=None, help="the graded file (default: found from RESULTS)")
    explain.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: the one it was graded on")

    kit = sub.add_parser("student-kit", help="build what students receive (release, self-check, README), no solution")
    kit.add_argument("--out", type=Path, default=Path("dist"))
    kit.add_argument("--torch", default=None, help="the grader's TORCH_SPEC (default: the Makefile's)")
    gradescope = sub.add_parser("gradescope", help="build Gradescope's autograder zip (setup.sh, run_autograder)")
    gradescope.add_argument("--out", type=Path, default=Path("dist"))

    doctor = sub.add_parser(
        "doctor",
        help="what this machine allows (sandbox, control groups, CUDA), what grading will have here, "
        "whether its speed part can be trusted, and the one change that would improve it",
    )
    import autograder.doctor as doctor_module

    doctor_module.add_arguments(doctor)

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["check"]:
        parser.error(RENAMED_CHECK)
    args = parser.parse_args(argv)
    if args.command == "grade":
        # First of all, before any import beyond the standard library (torch, pytest and the early start take
        # seconds): a grader killed from here on leaves this placeholder or its full results, never an older
        # run's score.
        from autograder.model import write_unfinished

        write_unfinished(args.out, args.submission.name)
    if args.command == "doctor":
        return doctor_module.run(args)
    if args.command == "explain":
        from autograder.grading.explain import explain as explain_run

        return explain_run(args.results, args.check, args.submission, args.device)
    if args.command == "student-kit":
        from autograder.authoring.kit import KitError, build_kit

        try:
            build_kit(args.out, torch_spec=args.torch)
        except KitError as exc:
            print(f"cannot build the kit: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "gradescope":
        from autograder.platforms.gradescope import build_zip

        build_zip(args.out)
        return 0
    if args.command == "grade-class":
        return grade_class_command(parser, args)
    if args.command == "release":
        from autograder.authoring.release import release_assignment
        from autograder.authoring.samples import write_samples

        release_assignment(args.root)
        written = write_samples(args.root)
        print(f"samples: {', '.join(p.parent.parent.name for p in written)} (the release plus each one's answers)")
        return 0

    from autograder.grading.workers import EarlyStart

    visible_only = args.command == "preview"
    out = None if visible_only else args.out
    parts = tuple(args.parts) if getattr(args, "parts", None) else None
    # The workers' Python and torch load while this process imports torch, pytest and the checks (about a
    # second each, on the cores the imports leave idle); nothing of the submission runs before a check asks.
    early = EarlyStart.begin(
        args.submission, device=args.device, rubric_path=args.rubric, isolation=args.isolation, out=out, parts=parts
    )
    from autograder.grading.grade import Options, grade_command

    options = Options(
        device=args.device,
        out=out,
        rubric_path=args.rubric,
        visible_only=visible_only,
        quiet=getattr(args, "quiet", False),
        isolation=args.isolation,
        seed=getattr(args, "seed", None),
        parts=parts,
        early=early,
        placeholder_written=out is not None,
    )
    return grade_command(args.submission, options)


def grade_class_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from autograder.contract import ASSIGNMENT
    from autograder.course.grade_class import grade_class, merge_class
    from autograder.course.shard import ShardError, parse_shard

    if not (args.course / "submitted").is_dir():
        parser.error(f"{args.course} is not a course folder: it has no submitted/ folder")
    if args.merge:
        if args.shard or args.force or args.student:
            parser.error("--merge grades nothing, so it takes neither --shard, --force nor --student")
        return merge_class(
            args.course,
            rubric=args.rubric,
            released=args.released,
            db_url=args.db,
            canvas_assignment=args.canvas_assignment or ASSIGNMENT,
        )
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ShardError as exc:
        parser.error(str(exc))
    return grade_class(
        args.course,
        device=args.device,
        rubric=args.rubric,
        jobs=args.jobs,
        force=args.force,
        students=args.student,
        released=args.released,
        db_url=args.db,
        isolation=args.isolation,
        shard=shard,
        canvas_assignment=args.canvas_assignment or ASSIGNMENT,
    )


if __name__ == "__main__":
    sys.exit(main())
