#!/usr/bin/env bash
# Grade a class on a Slurm cluster: a job array with one task per shard, then a merge job that
# starts when every task has ended. Run it from a login node of the cluster, in a checkout of this
# project on a filesystem the compute nodes share, after `make setup` (or use `make grade-slurm`).
#
#   deploy/slurm/submit.sh
#   SHARDS=16 PARTITION=gpu deploy/slurm/submit.sh
#
# Settings, from the environment:
#   SHARDS       array tasks, i.e. shards of the class (default 4)
#   COURSE       the nbgrader course folder, relative to the project root or absolute (default assignments)
#   PARTITION    the partition (default: the cluster's default partition)
#   GPUS         GPUs per array task: auto (default) asks for one when the partition's nodes have a
#                gpu GRES and none otherwise; or a number (0: CPU only)
#   GRES         what to ask for instead of gpu:$GPUS, e.g. gpu:a100:1
#   DEVICE       what grading uses: cuda when GPUs were asked for, cpu otherwise (default), or auto
#   CPUS         CPUs per array task (default 2); JOBS submissions graded at once per task (default CPUS)
#   TIME         time limit of an array task (default 02:00:00)
#   LOGS         folder for the jobs' logs (default slurm-logs, under the project root)
#   VENV         the project's virtualenv (default .venv)
#   SBATCH_ARGS  more sbatch arguments for both jobs, e.g. "--account=course --qos=normal"
#   WAIT=1       wait for the merge job: exit 0 when it completed, 1 when it failed
#   DRY_RUN=1    print the sbatch commands instead of running them; works without Slurm (then, unless
#                PARTITION and GPUS are given, the default partition and no GPU are assumed)
#
# Why afterany and not afterok: with afterok, one failed or timed-out task leaves the merge job
# pending forever (its dependency can never be satisfied) and nobody is told who is missing. With
# afterany the merge always runs; it fails when results are missing and its log names the students.
# Re-running this script grades only what is missing (shards skip students already graded).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

SHARDS="${SHARDS:-4}"
COURSE="${COURSE:-assignments}"
PARTITION="${PARTITION:-}"
GPUS="${GPUS:-auto}"
GRES="${GRES:-}"
CPUS="${CPUS:-2}"
JOBS="${JOBS:-$CPUS}"
TIME="${TIME:-02:00:00}"
LOGS="${LOGS:-slurm-logs}"
VENV="${VENV:-.venv}"
SBATCH_ARGS="${SBATCH_ARGS:-}"

fail() { echo "submit.sh: $*" >&2; exit 2; }
positive() {
    if ! [[ "$2" =~ ^[0-9]+$ ]] || (( $2 < 1 )); then fail "$1 must be a whole number of at least 1, not '$2'"; fi
}
positive SHARDS "$SHARDS"
positive CPUS "$CPUS"
positive JOBS "$JOBS"
[[ -x "$VENV/bin/python" ]] || fail "no virtualenv at $VENV: run 'make setup' first (on a filesystem the nodes share)"
[[ -d "$COURSE/submitted" ]] || fail "$COURSE is not a course folder: it has no submitted/ folder"

have_sinfo=1
if ! command -v sinfo >/dev/null; then
    [[ -n "${DRY_RUN:-}" ]] || fail "sinfo is not found: run this on a login node of a Slurm cluster (or try DRY_RUN=1)"
    have_sinfo=""
    if [[ "$GPUS" == auto ]]; then
        echo "submit.sh: no Slurm here (a dry run): GPUS=auto is taken as 0; set GPUS to see a GPU request" >&2
        GPUS=0
    fi
fi
if [[ -z "$PARTITION" && -n "$have_sinfo" ]]; then
    # sinfo marks the default partition with a '*'
    PARTITION="$(sinfo --noheader --format=%P | sed -n 's/\*$//p' | head -n 1)"
fi
partition_args=()
[[ -n "$PARTITION" ]] && partition_args=(--partition="$PARTITION")

if [[ "$GPUS" == auto ]]; then
    gres="$(sinfo --noheader "${partition_args[@]}" --format=%G)"
    if grep -q 'gpu' <<<"$gres"; then GPUS=1; else GPUS=0; fi
fi
[[ "$GPUS" =~ ^[0-9]+$ ]] || fail "GPUS must be auto or a whole number, not '$GPUS'"
gpu_args=()
if (( GPUS > 0 )) || [[ -n "$GRES" ]]; then
    gpu_args=(--gres="${GRES:-gpu:$GPUS}")
    DEVICE="${DEVICE:-cuda}"
else
    DEVICE="${DEVICE:-cpu}"
fi
export COURSE DEVICE JOBS VENV

mkdir -p "$LOGS"
read -r -a extra <<<"$SBATCH_ARGS"
run() {
    if [[ -n "${DRY_RUN:-}" ]]; then echo "$*" >&2; echo "${dry_id:-ARRAY_JOB_ID}"; else "$@"; fi
}

array_id="$(run sbatch --parsable --export=ALL --chdir="$root" --array="0-$((SHARDS - 1))" \
    --cpus-per-task="$CPUS" --time="$TIME" --output="$LOGS/grade-%A_%a.out" \
    "${partition_args[@]}" "${gpu_args[@]}" "${extra[@]}" "$here/grade-shard.sbatch")"
array_id="${array_id%%;*}"  # --parsable prints "id;cluster" on a federation
echo "array job $array_id: $SHARDS shards of $COURSE on ${PARTITION:-the default partition}," \
     "device $DEVICE${gpu_args:+, ${gpu_args[*]} per task}; logs in $LOGS/"

merge_args=(--parsable --export=ALL --chdir="$root" --dependency="afterany:$array_id" --kill-on-invalid-dep=yes
            --output="$LOGS/merge-%j.out" "${partition_args[@]}" "${extra[@]}")
dry_id=MERGE_JOB_ID
merge_id="$(run sbatch "${merge_args[@]}" "$here/merge.sbatch")"
merge_id="${merge_id%%;*}"
echo "merge job $merge_id: writes the class's outputs once the array has ended; log: $LOGS/merge-$merge_id.out"

if [[ -n "${WAIT:-}" && -z "${DRY_RUN:-}" ]]; then
    # Polled every few seconds (sbatch --wait backs off to half a minute between polls).
    while :; do
        state="$(scontrol --oneliner show job "$merge_id" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)" \
            || fail "cannot see merge job $merge_id any more"
        case "$state" in
            PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | RESIZING) sleep "${POLL:-3}" ;;
            COMPLETED) echo "merge job $merge_id completed"; exit 0 ;;
            *) echo "merge job $merge_id ended $state: see $LOGS/merge-$merge_id.out" >&2; exit 1 ;;
        esac
    done
fi
