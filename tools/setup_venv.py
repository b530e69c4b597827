"""Create or refresh the project's virtualenv, only when it is missing or its inputs changed.

The inputs are pyproject.toml and the torch requirement (TORCH_SPEC), so a GPU runner can ask for
a CUDA build while the default stays the CPU wheel. Standard library only: it runs before the
virtualenv exists.
"""
import argparse
import hashlib
import shlex
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", default=".venv")
    parser.add_argument("--torch", default="torch==2.13.0",
                        help="pip arguments for torch, e.g. 'torch==2.13.0 --index-url URL' on a GPU runner")
    args = parser.parse_args()

    env_dir = (ROOT / args.venv).resolve()
    python = env_dir / "bin" / "python"
    stamp = env_dir / ".inputs"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + args.torch.encode()).hexdigest()

    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return 0
    if not python.exists():
        print(f"setup: creating {args.venv}", flush=True)
        venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    print(f"setup: installing {args.torch}", flush=True)
    subprocess.run([*pip, *shlex.split(args.torch)], check=True)
    print("setup: installing the project and its pinned dependencies", flush=True)
    subprocess.run([*pip, "--editable", str(ROOT)], check=True)
    stamp.write_text(digest + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
