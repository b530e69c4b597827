#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu 22.04 or 24.04).
# The zip is unpacked in $ROOT/source: the grader (autograder/, reference/), requirements.lock (every
# package pinned, for Python 3.10 to 3.13) and requirements.txt (the grader's own dependencies).
# It installs bubblewrap, the sandbox (which Gradescope's container may not let start: then each
# worker runs as a fresh unprivileged uid), and makes $ROOT/venv with the system's python3 (Ubuntu
# 22.04: 3.10, 24.04: 3.12), torch and exactly the locked dependencies.
#
# TORCH_SPEC: torch's pip arguments. The default is the CPU build (`+cpu`: only PyTorch's own index has it, so
# pip cannot fall back to PyPI's torch, a CUDA build that loads far more than the 768 MB a Gradescope container
# has by default, with no GPU to use it). For a GPU image: TORCH_SPEC="torch==2.13.0", and more memory.
# AUTOGRADER_ROOT (default /autograder) and PYTHON (default python3): to try it elsewhere.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu}"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends python3 python3-venv bubblewrap
fi
"$PYTHON" -c '
import sys
if not (3, 10) <= sys.version_info[:2] <= (3, 13):
    sys.exit(f"setup.sh: the grader needs Python 3.10 to 3.13; {sys.executable} is {sys.version.split()[0]}")
'
"$PYTHON" -m venv "$ROOT/venv"
PIP=("$ROOT/venv/bin/python" -m pip install --disable-pip-version-check --constraint "$SOURCE/requirements.lock")
# shellcheck disable=SC2086  # TORCH_SPEC is a list of pip arguments
"${PIP[@]}" $TORCH_SPEC
"${PIP[@]}" --requirement "$SOURCE/requirements.txt"
# Say which torch this is: a CUDA build loads far more than the CPU build, more than the default container holds.
"$ROOT/venv/bin/python" -c '
import torch
if torch.version.cuda:
    print(f"setup.sh: installed torch {torch.__version__}, a CUDA {torch.version.cuda} build: it may not fit in "
          "the 768 MB a Gradescope container has by default (raise the memory in the autograder settings)")
else:
    print(f"setup.sh: installed torch {torch.__version__}, the CPU build")
'
# The grader's bytecode, compiled once here: run_autograder writes none (each run starts from this image).
"$ROOT/venv/bin/python" -m compileall -q "$SOURCE" > /dev/null
# The student's code runs as another, unprivileged uid, never as root: it cannot read the grader's source.
chmod -R go-rwx "$SOURCE"
