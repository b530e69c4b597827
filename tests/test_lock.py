"""requirements.lock: every package pinned, torch left to TORCH_SPEC, in step with pyproject.toml, for
every Python that pyproject.toml's requires-python admits."""

import re
import sys

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from autograder.rubric import tomllib
from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import lock  # noqa: E402  (tools/ is not a package)

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The Pythons a course may have: the oldest and newest of each supported minor version that matters here,
# Debian 12's (3.11.2, older than some releases allow) and Ubuntu 22.04's and 24.04's (3.10, 3.12).
PYTHONS = ["3.10.0", "3.10.12", "3.11.2", "3.11.7", "3.12.3", "3.13.0"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def environment(python: str) -> dict[str, str]:
    return {
        "python_version": ".".join(python.split(".")[:2]),
        "python_full_version": python,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def locked(python: str = "3.11.7") -> dict[str, str]:
    """The lock's pins that apply on Linux under `python` (a pin behind a marker applies only where it holds)."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if re.match(r"[A-Za-z0-9]", line):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(environment(python)):
                assert canonical(requirement.name) not in pins, f"{requirement.name} pinned twice for {python}"
                pins[canonical(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return pins


def wanted(python: str) -> list[Requirement]:
    requirements = PROJECT["dependencies"] + [
        r for extra in lock.EXTRAS for r in PROJECT["optional-dependencies"][extra]
    ]
    return [r for r in map(Requirement, requirements) if r.marker is None or r.marker.evaluate(environment(python))]


def test_requires_python_admits_every_python_the_lock_is_checked_for():
    assert all(SpecifierSet(PROJECT["requires-python"]).contains(python) for python in PYTHONS)
    assert not SpecifierSet(PROJECT["requires-python"]).contains("3.9.18")


@pytest.mark.parametrize("python", PYTHONS)
def test_every_pin_in_pyproject_is_in_the_lock_at_the_same_version(python):
    pins = locked(python)
    stale = [str(r) for r in wanted(python) if pins.get(canonical(r.name)) != str(r.specifier).removeprefix("==")]
    assert not stale, f"requirements.lock is out of date for {stale} on Python {python}: run `make lock`"


def test_debians_python_gets_a_soupsieve_it_can_install():
    """soupsieve 4.1.4 needs Python 3.11.5: Debian 12's 3.11.2 gets an older release from the same lock."""
    assert locked("3.11.2")["soupsieve"] != locked("3.11.7")["soupsieve"] == "4.1.4"


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
