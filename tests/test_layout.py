"""The package's layout is its architecture: imports run one way, down the layers docs/architecture.md
lists, and no modules import each other in a circle (not even through an import inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "autograder"
# What each part of the package may import, besides itself (docs/architecture.md, "The map").
TOP = {"contract", "rubric", "model", "atomic", "ending"}
MAY_IMPORT = {
    "contract": set(),
    "atomic": set(),
    "ending": set(),
    "rubric": {"contract"},
    "model": {"contract", "atomic", "sandbox"},
    "sandbox": set(),
    "grading": {"sandbox", "reference", *TOP},
    "course": {"grading", "sandbox", *TOP},
    "authoring": set(TOP),
    "platforms": {"grading", "course", "authoring", *TOP},
    "doctor": {"grading", "sandbox", *TOP},
    "cli": {"grading", "course", "authoring", "platforms", "doctor", *TOP},
    "__main__": {"cli", "ending"},
    "__init__": set(),
}
# The arrows that run back up, said in docs/architecture.md: a disputed grade says whether the grader
# changed since the class run that graded it, from the class record's own hashes.
# And the rubric, read first, checks [speed]'s rounds against the verdict's plan (verdict.py: standard library only
# at import; `Verdict.decision` imports the model when called).
UPWARD = {
    ("autograder.grading.explain", "autograder.course.store"),
    ("autograder.rubric", "autograder.grading"),
    ("autograder.rubric", "autograder.grading.verdict"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, type_only: bool = False) -> set[str]:
    """Every module of ours `path` imports, anywhere in it but under `if TYPE_CHECKING:` (there too with
    `type_only`)."""
    return imports_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py", type_only=type_only)


def imports_in(source: str, module: str, is_package: bool = False, type_only: bool = False) -> set[str]:
    """Every module of ours `source` (the module named `module`) imports, but under `if TYPE_CHECKING:` (there
    too with `type_only`)."""
    tree = ast.parse(source)
    skipped = (
        set()
        if type_only
        else {
            id(child)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for statement in node.body
            for child in ast.walk(statement)
        }
    )
    found = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative (the worker's `from . import jail, protocol`)
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                imported = f"{base}.{node.module}" if node.module else base
            else:
                imported = node.module or ""
            found.add(imported)
            found |= {f"{imported}.{alias.name}" for alias in node.names}  # `from package import module`
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")} | {"reference", "reference.mha", "reference.peers"}
    return {name for name in found if name in modules and name != module}


def layer(module: str) -> str:
    parts = module.split(".")
    return "reference" if parts[0] == "reference" else (parts[1] if len(parts) > 1 else "__init__")


def graph(type_only: bool = False) -> dict[str, set[str]]:
    return {module_name(p): imports(p, type_only) for p in sorted(PACKAGE.rglob("*.py"))}


def wrong_arrows(edges: dict[str, set[str]]) -> list[str]:
    """Every import from one part of the package into another that `MAY_IMPORT` does not allow."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in targets
        if layer(target) != layer(module)
        and layer(target) not in MAY_IMPORT[layer(module)]
        and (module, target) not in UPWARD
    )


def circle(edges: dict[str, set[str]]) -> list[str]:
    """Modules that import each other in a circle (the first found), or []."""
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        for target in sorted(edges.get(module, ())):
            found = walk(target, [*path, module])
            if found:
                return found
        done.add(module)
        return []

    for module in sorted(edges):
        found = walk(module, [])
        if found:
            return found
    return []


def test_imports_run_down_the_layers():
    assert wrong_arrows(graph()) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circle(graph()) == []


def test_no_circle_even_through_imports_for_the_type_checker():
    """Imports under `if TYPE_CHECKING:` count too: two modules that name each other's types are one unit."""
    assert circle(graph(type_only=True)) == []


def test_the_worker_side_imports_nothing_of_the_grader():
    """What the worker boots imports only itself and the protocol (`from . import jail, protocol`, and the fork
    server `server`, as the boot's package `sandbox` names them; the grader's names only for the type checker)."""
    for path in (PACKAGE / "sandbox" / "inside").glob("*.py"):
        inside = {"autograder.sandbox.inside", "autograder.sandbox.inside.jail", "autograder.sandbox.inside.server"}
        assert imports(path) <= inside, path.name


def test_the_checks_find_a_wrong_arrow_and_a_circle():
    """Shown failing: the sandbox importing grading (even inside a function), and two modules in a circle."""
    edges = {
        "autograder.sandbox.client": {"autograder.grading.grade"},
        "autograder.grading.grade": {"autograder.sandbox.client"},
        "autograder.course.store": {"autograder.model"},
    }
    assert wrong_arrows(edges) == ["autograder.sandbox.client imports autograder.grading.grade"]
    assert circle(edges) == ["autograder.grading.grade", "autograder.sandbox.client", "autograder.grading.grade"]
    assert circle({"autograder.a": {"autograder.b"}, "autograder.b": set()}) == []
    inside_a_function = "def f():\n    from autograder.grading import grade\n"
    assert imports_in(inside_a_function, "autograder.sandbox.x") == {"autograder.grading", "autograder.grading.grade"}
    for_the_type_checker = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import autograder.cli\n"
    assert imports_in(for_the_type_checker, "autograder.sandbox.x") == set()
    assert imports_in(for_the_type_checker, "autograder.sandbox.x", type_only=True) == {"autograder.cli"}


def test_the_standalone_self_check_names_the_same_assignment():
    """The self-check ships alone in the student kit (standard library only), so it spells out the
    assignment's id instead of importing it: it must be the contract's."""
    from autograder.authoring import selfcheck
    from autograder.contract import ASSIGNMENT

    assert selfcheck.ASSIGNMENT == ASSIGNMENT
