"""The rubric: one TOML file an instructor edits (points, visibility, tolerances, limits, allowed APIs).

It is validated in full when loaded: an unknown section or key, a missing value or a value of the
wrong type is a `RubricError` naming the key and the file, and the run cannot grade (exit 2) rather
than scoring a student against a broken rubric. The only defaults are the documented ones: a part's
title (its id), a check's weight (1) and visibility (`[defaults] visibility`, itself "visible").
Check keys in `[tests]` and `[speed] requires` are validated against the checks that exist
(`check_test_keys`), so a misspelt key is an error, not a silently ignored setting.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib as tomllib  # re-exported: the one TOML parser of the package, on every Python
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from autograder.contract import PART_IDS, Workload, means
from autograder.grading import verdict

DEFAULT_RUBRIC = Path(__file__).with_name("rubric.toml")
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
DTYPE_NAMES = ("float64", "float32", "bfloat16", "float16")
API_NAMES = ("scaled_dot_product_attention", "nn_multihead_attention", "flex_attention")


@dataclass(frozen=True)
class Limits:
    """[limits]: every limit a submission is held to and every timeout of a run, each a typed field (its
    `meaning` says what it bounds). Every one is required; an unknown key is refused by name."""

    load_seconds: float = means("importing the submission and running its cells, in all")
    cell_seconds: float = means("one top-level cell, until one is stopped")
    later_cell_seconds: float = means(
        "each later top-level cell, once one has been stopped (the file is known to hang)"
    )
    request_seconds: float = means("any single request to the worker (a forward, a call)")
    hung_request_seconds: float = means(
        "the same, once the submission is known to hang (a cell or a request was stopped)"
    )
    request_factor: float = means(
        "a request is stopped once it has used this many times the reference's CPU time for the same request"
    )
    request_floor_seconds: float = means(
        "... but never before this much CPU time (all its processes), nor after request_seconds"
    )
    check_seconds: float = means("one check, all its requests together")
    submission_seconds: float = means("the whole submission: every request, restart and check")
    class_seconds: float = means("grade-class: one submission's grading process, start to end")
    crashes_before_giving_up: int = means("a function that ended the worker this often is not called again")
    submission_cpu_seconds: float = means("CPU time of all the worker's processes, for the whole submission")
    memory_gib: float = means("memory of all the worker's processes together (and each one's address space on the CPU)")
    processes: int = means("processes and threads the worker may have at once, all together")
    cpu_cores: float = means("CPU quota of all the worker's processes together, in cores")
    output_kib: float = means("how much of the worker's stdout/stderr is kept")
    reply_mib: float = means("the largest answer the grader reads from the worker")
    worker_threads: int = means("torch threads in the worker (and in the reference's, when timing)")
    forks_per_server: int = means("workers forked from one fork server before a new one replaces it (0: none forked)")


# [limits]: name -> (type, meaning), in the rubric's order, from `Limits`.
LIMITS: dict[str, tuple[type[int] | type[float], str]] = {
    f.name: (int if f.type in (int, "int") else float, f.metadata["meaning"]) for f in fields(Limits)
}
LIMIT_MINIMUM = {"forks_per_server": 0}  # the others: 1 for a count, 0.001 for a number


DEVICES = ("cpu", "cuda")


class RubricError(ValueError):
    """The rubric file is malformed; the message names the key to fix and the file."""


@dataclass(frozen=True)
class Part:
    id: str
    points: float
    title: str


@dataclass(frozen=True)
class CheckSettings:
    weight: float = 1.0
    visibility: str | None = None  # None: the rubric's default


def _setting(minimum: float, meaning: str) -> Any:
    """A required field of `SpeedSettings`: its smallest allowed value and what it sets (the rubric's
    documentation of the key)."""
    return field(metadata={"minimum": minimum, "meaning": meaning})


@dataclass(frozen=True)
class SpeedSettings:
    """[speed]: how the speed part times and scores, each a typed field (its `meaning` says what it sets, its
    `minimum` the smallest value allowed), after the checks it requires and its [[speed.workloads]]."""

    requires: tuple[str, ...]  # check keys that must pass for the speed part to earn points
    workloads: tuple[Workload, ...]
    threads: int = _setting(1, "torch threads of every timed worker; CPU time beyond this many threads is charged")
    warmup_rounds: int = _setting(1, "rounds run before the measured ones and not counted")
    confidence: float = _setting(0.0, "of the interval for the median relative speedup, all looks together (below 1)")
    min_rounds: int = _setting(1, "measured rounds before the verdict is first asked")
    batch_rounds: int = _setting(1, "measured rounds between later looks")
    max_rounds: int = _setting(1, "measured rounds at most; there an unsettled verdict is close, scored on the median")
    settle_points: float = _setting(
        0.0, "a verdict is settled when the credit its interval implies varies by this many points"
    )
    full_credit_at: float = _setting(
        0.0, "full points when the submission's speedup is at least this fraction of the reference's"
    )
    no_credit_at: float = _setting(0.0, "no points at or below this fraction; linear in between")
    give_up_below: float = _setting(
        0.0, "after min_rounds measured rounds, below this fraction the rest are not run (too slow)"
    )
    flag_above: float = _setting(
        0.0, "a speedup more than this many times the reference's is flagged for the instructor"
    )
    min_reference_speedup: float = _setting(
        1.0, "below this, the run cannot tell parallel from sequential: a grader fault"
    )
    probe_sigmas: float = _setting(
        1.0,
        "a timed output's per-token probe may differ from the reference's by this many "
        "standard deviations of an output within the dtype's tolerance",
    )
    lock_seconds: float = _setting(
        1.0,
        "the longest wait for the device's timing lock (other gradings' timing sections), and the longest a "
        "grading's requests wait for other gradings' timing in all",
    )
    hold_seconds: float = _setting(
        1.0,
        "a grading's timing holds in all (no other student's code runs meanwhile); past it the rounds stop at "
        "the next round from min_rounds on, an unsettled verdict scored on the top of its interval",
    )
    ready_seconds: float = _setting(
        0.01, "a timed request's longest wait for the worker to be ready for its calls (timed, so it is charged too)"
    )

    def workloads_for(self, device: str) -> list[Workload]:
        return [w for w in self.workloads if w.device == device.split(":")[0]]


# [speed]: name -> (type, smallest allowed value, meaning), in the rubric's order, from `SpeedSettings`. Every one is
# required when there is a speed part.
SPEED_SETTINGS: dict[str, tuple[type[int] | type[float], float, str]] = {
    f.name: (int if f.type in (int, "int") else float, f.metadata["minimum"], f.metadata["meaning"])
    for f in fields(SpeedSettings)
    if "meaning" in f.metadata
}
# [[speed.workloads]]: name -> (type, meaning), from `Workload`.
WORKLOAD_SETTINGS: dict[str, tuple[type[str] | type[int] | type[float], str]] = {
    f.name: ({"str": str, "int": int}.get(str(f.type), float), f.metadata["meaning"]) for f in fields(Workload)
}


@dataclass(frozen=True)
class GraphSettings:
    """[graph]: what a captured forward may be for the grader to replay it (the structure checks and the speed
    part judge and time the graph of the student's forward: `grading/graphs.py`). Optional; these are its
    defaults."""

    max_nodes: int = 20000  # operations of one forward (a loop over 64 heads runs about 3,000)
    max_constant_mib: float = 64.0  # tensors a forward holds that are neither its input nor the module's state
    allow: tuple[str, ...] = ()  # ATen operations allowed beyond the grader's list (by name: "unfold")


GRAPH_KEYS = ("max_nodes", "max_constant_mib", "allow")


@dataclass(frozen=True)
class Rubric:
    parts: dict[str, Part]
    tests: dict[str, CheckSettings]
    default_visibility: str
    tolerances: dict[str, tuple[float, float]]
    limits: Limits
    apis: dict[str, bool]
    path: Path = DEFAULT_RUBRIC
    speed: SpeedSettings | None = None  # [speed]: required when there is a speed part
    graph: GraphSettings = GraphSettings()  # [graph]

    def part_points(self, part: str) -> float:
        return self.parts[part].points if part in self.parts else 0.0

    def part_title(self, part: str) -> str:
        return self.parts[part].title if part in self.parts else part

    def weight(self, key: str) -> float:
        return self.tests.get(key, CheckSettings()).weight

    def visibility(self, key: str) -> str:
        return self.tests.get(key, CheckSettings()).visibility or self.default_visibility

    def tolerance(self, dtype_name: str) -> tuple[float, float]:
        return self.tolerances[dtype_name]

    @property
    def max_score(self) -> float:
        return sum(p.points for p in self.parts.values())

    def check_test_keys(self, known: set[str]) -> None:
        """Every key of [tests], and every check [speed] requires, must name a check that exists."""
        where = {key: f'[tests."{key}"]' for key in self.tests}
        where.update({key: f'[speed] requires "{key}"' for key in (self.speed.requires if self.speed else ())})
        unknown = sorted(set(where) - known)
        if unknown:
            close = {key: _closest(key, known) for key in unknown}
            hints = "; ".join(where[k] + (f' (did you mean "{c}"?)' if c else "") for k, c in close.items())
            raise RubricError(f"{self.path}: no check has the key {hints}")


def _closest(key: str, known: set[str]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return matches[0] if matches else None


def _number(
    value: object, where: str, path: Path, minimum: float = 0.0, kind: type[int] | type[float] = float
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RubricError(f"{path}: {where} must be {'an integer' if kind is int else 'a number'}, not {value!r}")
    if value < minimum:
        raise RubricError(f"{path}: {where} must be at least {minimum:g}, not {value!r}")
    return kind(value)


def _table(data: dict[str, Any], name: str, path: Path, required: bool = True) -> dict[str, Any]:
    value = data.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise RubricError(f"{path}: missing section [{name}]" if value is None else f"{path}: [{name}] must be a table")
    return value


def _no_unknown(table: dict[str, Any], allowed: Collection[str], where: str, path: Path) -> None:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise RubricError(f"{path}: unknown key {where}{unknown[0]!r} (allowed: {', '.join(allowed)})")


def load_rubric(path: str | Path | None = None) -> Rubric:
    """Read and validate a rubric."""
    path = Path(path) if path else DEFAULT_RUBRIC
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RubricError(f"cannot read rubric {path}: {exc}") from exc
    _no_unknown(data, ("parts", "tests", "defaults", "tolerances", "limits", "apis", "speed", "graph"), "", path)

    parts = {}
    for part, settings in _table(data, "parts", path).items():
        if part not in PART_IDS:
            raise RubricError(f"{path}: unknown part [parts.{part}]; part ids are {', '.join(PART_IDS)}")
        if not isinstance(settings, dict):
            raise RubricError(f"{path}: [parts.{part}] must be a table")
        _no_unknown(settings, ("points", "title"), f"in [parts.{part}]: ", path)
        if "points" not in settings:
            raise RubricError(f"{path}: [parts.{part}] needs points = a number >= 0")
        title = settings.get("title", part)
        if not isinstance(title, str):
            raise RubricError(f"{path}: [parts.{part}] title must be a string")
        points = _number(settings["points"], f"[parts.{part}] points", path)
        if abs(points * 100 - round(points * 100)) > 1e-6:  # every score is a whole number of hundredths
            raise RubricError(f"{path}: [parts.{part}] points must be a whole number of hundredths, not {points!r}")
        parts[part] = Part(part, points, title)

    defaults = _table(data, "defaults", path, required=False)
    _no_unknown(defaults, ("visibility",), "in [defaults]: ", path)
    default_visibility = defaults.get("visibility", "visible")
    if default_visibility not in VISIBILITIES:
        raise RubricError(f"{path}: [defaults] visibility must be one of {', '.join(VISIBILITIES)}")

    tests = {}
    for key, settings in _table(data, "tests", path, required=False).items():
        where = f'[tests."{key}"]'
        if not isinstance(settings, dict):
            raise RubricError(f"{path}: {where} must be a table")
        _no_unknown(settings, ("weight", "visibility"), f"in {where}: ", path)
        visibility = settings.get("visibility")
        if visibility is not None and visibility not in VISIBILITIES:
            raise RubricError(
                f"{path}: {where} visibility must be one of {', '.join(VISIBILITIES)}, not {visibility!r}"
            )
        tests[key] = CheckSettings(_number(settings.get("weight", 1.0), f"{where} weight", path), visibility)

    tolerances = {}
    table = _table(data, "tolerances", path)
    _no_unknown(table, DTYPE_NAMES, "in [tolerances]: ", path)
    for dtype in DTYPE_NAMES:
        value = table.get(dtype)
        if not (isinstance(value, list) and len(value) == 2):
            raise RubricError(f"{path}: [tolerances] {dtype} must be [rtol, atol]" + ("" if value else " (missing)"))
        tolerances[dtype] = (
            _number(value[0], f"[tolerances] {dtype} rtol", path),
            _number(value[1], f"[tolerances] {dtype} atol", path),
        )

    values: dict[str, Any] = {}
    table = _table(data, "limits", path)
    _no_unknown(table, tuple(LIMITS), "in [limits]: ", path)
    for name, (kind, meaning) in LIMITS.items():
        if name not in table:
            raise RubricError(f"{path}: [limits] {name} is missing ({meaning})")
        least = LIMIT_MINIMUM.get(name, 1 if kind is int else 1e-3)
        values[name] = _number(table[name], f"[limits] {name}", path, minimum=least, kind=kind)
    limits = Limits(**values)

    table = _table(data, "apis", path)
    _no_unknown(table, API_NAMES, "in [apis]: ", path)
    apis = {}
    for name in API_NAMES:
        if not isinstance(table.get(name), bool):
            raise RubricError(f"{path}: [apis] {name} must be true or false")
        apis[name] = table[name]

    speed = None
    if "speed" in data or "speed" in parts:
        speed = _speed_settings(_table(data, "speed", path), path)
    return Rubric(parts, tests, default_visibility, tolerances, limits, apis, path, speed, _graph_settings(data, path))


def _graph_settings(data: dict[str, Any], path: Path) -> GraphSettings:
    """[graph], every key checked; absent keys take GraphSettings' defaults."""
    table = _table(data, "graph", path, required=False)
    _no_unknown(table, GRAPH_KEYS, "in [graph]: ", path)
    defaults = GraphSettings()
    allow = table.get("allow", [])
    if not (isinstance(allow, list) and all(isinstance(name, str) and name.isidentifier() for name in allow)):
        raise RubricError(f'{path}: [graph] allow must be a list of ATen operation names, as "unfold"')
    return GraphSettings(
        int(_number(table.get("max_nodes", defaults.max_nodes), "[graph] max_nodes", path, minimum=1, kind=int)),
        _number(table.get("max_constant_mib", defaults.max_constant_mib), "[graph] max_constant_mib", path),
        tuple(allow),
    )


def _speed_settings(table: dict[str, Any], path: Path) -> SpeedSettings:
    """[speed] and its [[speed.workloads]], every key checked (see SPEED_SETTINGS, WORKLOAD_SETTINGS)."""
    if "rounds" in table:
        raise RubricError(
            f"{path}: [speed] rounds is no longer used: the rounds are taken until a confidence interval settles "
            "the credit; set confidence, min_rounds, batch_rounds, max_rounds and settle_points instead (see the "
            "packaged rubric.toml)"
        )
    _no_unknown(table, (*SPEED_SETTINGS, "requires", "workloads"), "in [speed]: ", path)
    values: dict[str, Any] = {}  # each an int or a float, as SPEED_SETTINGS says (`_number`)
    for name, (kind, minimum, meaning) in SPEED_SETTINGS.items():
        if name not in table:
            raise RubricError(f"{path}: [speed] {name} is missing ({meaning})")
        values[name] = _number(table[name], f"[speed] {name}", path, minimum=minimum, kind=kind)
    order = ("give_up_below", "no_credit_at", "full_credit_at", "flag_above")
    for low, high in zip(order, order[1:]):
        if not values[low] < values[high]:
            raise RubricError(
                f"{path}: [speed] needs {' < '.join(order)}; {low} = {values[low]:g} is not below "
                f"{high} = {values[high]:g}"
            )
    if not 0 < values["confidence"] < 1:
        raise RubricError(f"{path}: [speed] confidence must lie strictly between 0 and 1, not {values['confidence']:g}")
    if values["max_rounds"] < values["min_rounds"]:
        raise RubricError(
            f"{path}: [speed] max_rounds = {values['max_rounds']} is below min_rounds = {values['min_rounds']}"
        )
    try:
        verdict.plan(values["confidence"], values["min_rounds"], values["batch_rounds"], values["max_rounds"])
    except verdict.PlanError as exc:
        raise RubricError(f"{path}: [speed] {exc}") from None
    requires = table.get("requires")
    if not (isinstance(requires, list) and all(isinstance(key, str) for key in requires)):
        raise RubricError(
            f'{path}: [speed] requires must be a list of check keys, e.g. ["mha::test_matches_reference"]'
        )
    workloads = table.get("workloads")
    if not (isinstance(workloads, list) and all(isinstance(w, dict) for w in workloads)):
        raise RubricError(
            f"{path}: [speed] needs [[speed.workloads]] tables, at least one per device ({', '.join(DEVICES)})"
        )
    parsed = [_workload(w, i, path) for i, w in enumerate(workloads, start=1)]
    for device in DEVICES:
        names = [w.name for w in parsed if w.device == device]
        if not names:
            raise RubricError(
                f"{path}: [speed] has no [[speed.workloads]] for device {device!r}; every device needs one"
            )
        if len(set(names)) != len(names):
            raise RubricError(
                f"{path}: two [[speed.workloads]] for {device!r} share a name; names are unique per device"
            )
    return SpeedSettings(**values, requires=tuple(requires), workloads=tuple(parsed))


def _workload(table: dict[str, Any], index: int, path: Path) -> Workload:
    where = f"[[speed.workloads]] number {index}"
    _no_unknown(table, tuple(WORKLOAD_SETTINGS), f"in {where}: ", path)
    values = {}
    for name, (kind, meaning) in WORKLOAD_SETTINGS.items():
        if name not in table:
            raise RubricError(f"{path}: {where}: {name} is missing ({meaning})")
        value = table[name]
        if kind is str:
            if not isinstance(value, str) or not value.strip():
                raise RubricError(f"{path}: {where}: {name} must be a non-empty string ({meaning})")
        else:
            least = 0 if name == "flush_mib" else 1
            value = _number(value, f"{where}: {name}", path, minimum=least, kind=int if kind is int else float)
        values[name] = value
    if values["device"] not in DEVICES:
        raise RubricError(f"{path}: {where}: device must be one of {', '.join(DEVICES)}, not {values['device']!r}")
    if values["dtype"] not in DTYPE_NAMES:
        raise RubricError(f"{path}: {where}: dtype must be one of {', '.join(DTYPE_NAMES)}, not {values['dtype']!r}")
    if values["d_out"] % values["heads"]:
        raise RubricError(f"{path}: {where}: d_out = {values['d_out']} does not split into {values['heads']} heads")
    return Workload(**values)
