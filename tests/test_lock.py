"""requirements.lock: every package pinned, torch left to TORCH_SPEC, in step with pyproject.toml."""

import re
import sys
import tomllib

from packaging.requirements import Requirement

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import lock  # noqa: E402  (tools/ is not a package)

PIN = re.compile(r"^([A-Za-z0-9][\w.-]*)==([^\s;]+)", re.MULTILINE)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    return {canonical(name): version for name, version in PIN.findall((ROOT / "requirements.lock").read_text())}


def test_every_pin_in_pyproject_is_in_the_lock_at_the_same_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for extra in lock.EXTRAS for r in project["optional-dependencies"][extra]]
    pins = locked()
    stale = [
        r
        for r in wanted
        if pins.get(canonical(Requirement(r).name)) != str(Requirement(r).specifier).removeprefix("==")
    ]
    assert not stale, f"requirements.lock is out of date for {stale}: run `make lock`"


def test_the_lock_leaves_torch_and_its_cuda_runtime_to_torch_spec():
    pins = locked()
    assert not [name for name in pins if lock.BUILD_SPECIFIC.match(f"{name}==")]
    assert {"sympy", "networkx", "filelock", "setuptools"} <= pins.keys()  # torch's own dependencies are pinned


def test_the_lock_names_no_index_and_no_local_path():
    text = (ROOT / "requirements.lock").read_text()
    assert not re.search(r"^\s*-|file://|https?://|/(opt|etc|tmp|root|home|usr)/", text, re.MULTILINE)


def test_build_specific_pins_are_dropped_with_their_annotations():
    compiled = (
        "filelock==3.0\n    # via torch\ntorch==2.13.0\n    # via -r -\nnvidia-cublas-cu12==12.8.4.1\n"
        "    # via\n    #   nvidia-cudnn-cu12\n    #   torch\ntriton==3.5.0\n    # via torch\n"
        "typing-extensions==4.0\n    # via torch\n\n# The following packages are considered unsafe:\n"
        "setuptools==80.0\n    # via torch\n"
    )
    assert lock.drop_build_specific(compiled) == (
        "filelock==3.0\n    # via torch\ntyping-extensions==4.0\n    # via torch\n\n"
        "# The following packages are considered unsafe:\nsetuptools==80.0\n    # via torch\n"
    )


def test_torch_spec_gives_the_version_to_lock_against():
    assert lock.torch_requirement("torch==2.13.0") == "torch==2.13.0"
    assert lock.torch_requirement("torch==2.13.0+cu128 --index-url https://example.org/whl") == "torch==2.13.0"
