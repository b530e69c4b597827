# Every target that needs the virtualenv depends on `setup`, which (re)creates .venv only when it is
# missing or when the dependency list (pyproject.toml, requirements.lock, TORCH_SPEC) changed.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
DEVICE     ?= auto
SUBMISSION ?= assignments/release/mha/mha.py
OUT        ?= results.json
COURSE     ?= assignments
JOBS       ?=
SHARD      ?=
FORCE      ?=
STUDENT    ?=
SEED       ?=
RESULTS    ?= $(OUT)
CHECK      ?=
RELEASED   ?=
CANVAS_ASSIGNMENT ?=
DIST       ?= dist
PYTHONS_JOBS ?= 1
PYTHONS_ARGS ?=
TEST_SHARD ?=

BIN := $(abspath $(VENV))/bin
# nbgrader runs `alembic` as a subprocess, so the virtualenv's bin/ must be on PATH.
export PATH := $(BIN):$(PATH)
PY := $(BIN)/python

.PHONY: explain setup test test-fast test-long test-long-suites test-speed test-pythons doctor lint lock bench release grade merge grade-slurm selfcheck check preview grade-one student-kit gradescope help

help:
	@echo "make test                      set up .venv and run the project's tests (all but the long suites)"
	@echo "     TEST_SHARD='K/N ...' (here and in test-long-suites): only those shards of the test modules"
	@echo "make test-fast                 the quick tests only (no whole-submission grading, no CUDA)"
	@echo "make test-long                 the long suites: hostile and wrong submissions, Slurm, the wheel, the"
	@echo "                               environment matrix (Docker, Slurm, Kubernetes emulated), then test-pythons"
	@echo "make test-long-suites          the long suites without test-pythons (.ci/run: shards in three processes at once)"
	@echo "make test-pythons              make setup and the smoke set on every supported Python here (3.10-3.13, the system's), PYTHONS_JOBS at once (1)"
	@echo "                               PYTHONS_ARGS=--setup-only makes their virtualenvs only"
	@echo "make test-speed                the speed part's verdicts, each graded 10 times beside a CPU burner (long)"
	@echo "make doctor                    what this machine allows the grader, and whether its speed part can be trusted"
	@echo "make lint                      ruff's checks and formatting, and mypy's type check of the whole package (strict)"
	@echo "make lock                      regenerate requirements.lock from pyproject.toml"
	@echo "make bench                     time the wrapper, the weight split and fast peers; table, plot, JSON"
	@echo "make grade                     grade every submission in COURSE/submitted/ (what changed; COURSE=assignments)"
	@echo "     COURSE=path/to/course (a course folder anywhere: submitted/<student>/mha/; outputs go there too)"
	@echo "     DEVICE=cpu|cuda JOBS=n (default 2 per CPU, 2..8) FORCE=1 (regrade all) STUDENT=name RELEASED=1 (past the due date)"
	@echo "     CANVAS_ASSIGNMENT='Name (id)' (the Canvas file's column, as a Canvas gradebook export heads it)"
	@echo "make grade SHARD=K/N           grade shard K of N (K from 0) only; SHARD=auto in a Slurm array task"
	@echo "make merge                     the class's outputs from every shard's results, grading nothing (COURSE=...)"
	@echo "make grade-slurm SHARDS=4      grade on a Slurm cluster: a job array and a merge job (deploy/slurm/)"
	@echo "make selfcheck SUBMISSION=...  the notebook's self-checks, part by part: runs the file's code on your machine, UNSANDBOXED"
	@echo "make check SUBMISSION=...      the same as make selfcheck (the name students know from their kit)"
	@echo "make preview SUBMISSION=...    instructors: the grader's visible checks on a file; its code runs SANDBOXED (needs reference/)"
	@echo "                               check and preview end with a line saying how many passed; they exit 0 whenever"
	@echo "                               they ran, whatever they found, and 2 when they could not run"
	@echo "make student-kit               what students receive: $(DIST)/mha-student-kit.zip"
	@echo "make gradescope                Gradescope's autograder: $(DIST)/mha-gradescope.zip"
	@echo "make grade-one SUBMISSION=...  grade one submission into OUT=results.json; SEED=n repeats a run (its extra_data.seed)"
	@echo "make explain RESULTS=...       a disputed grade: each failed check's hidden inputs, expected and actual values (CHECK=key)"
	@echo "make release                   regenerate the student release from reference/, and the sample class from it"

setup:
	@$(PYTHON) tools/setup_venv.py --venv "$(VENV)" --torch "$(TORCH_SPEC)"

# One marker scheme selects every suite: `slow` (more than a few seconds), `long` (minutes: whole suites of
# gradings, a cluster, the environment matrix), `verdicts` (the speed verdicts, also long), `cuda`, and `smoke`
# (slow tests that every other supported Python runs too: make test-pythons). TEST_SHARD="K/N ..." runs only those
# shards of the selected modules (tests/sharding.py: whole modules, each in one shard of N), as .ci/run does.
test: setup
	$(PY) -m pytest -m "not long" $(foreach shard,$(TEST_SHARD),--shard $(shard))

test-long: setup
	$(MAKE) --no-print-directory test-long-suites
	$(MAKE) --no-print-directory test-pythons

test-long-suites: setup
	$(PY) -m pytest -m "long and not verdicts and not cuda" -rs $(foreach shard,$(TEST_SHARD),--shard $(shard))

test-pythons:
	@$(PYTHON) tools/test_pythons.py --torch "$(TORCH_SPEC)" --skip-venv "$(VENV)" --jobs $(PYTHONS_JOBS) $(PYTHONS_ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow and not long and not cuda"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

lock:
	@$(PYTHON) tools/lock.py --venv "$(VENV)" --torch "$(TORCH_SPEC)"

test-speed: setup
	$(PY) -m pytest -m "verdicts and not cuda" -s -q -rA

doctor: setup
	$(PY) -m autograder doctor --device $(DEVICE)

bench: setup
	$(PY) tools/bench.py --device $(DEVICE) --out bench

release: setup
	$(PY) -m autograder release

# The self-check runs the file's code in this process, unsandboxed: only on files you trust. Exit 0 whenever
# it ran (its last line says how many parts passed; the command itself exits 1 while one is not), 2 when not.
selfcheck: setup
	@$(PY) -m autograder.authoring.selfcheck "$(SUBMISSION)" || [ $$? -eq 1 ]

check: selfcheck

# The grader's visible checks: the file's code runs only in the sandboxed worker. Exit status as make check's.
preview: setup
	@$(PY) -m autograder preview "$(SUBMISSION)" --device $(DEVICE) || [ $$? -eq 1 ]

grade-one: setup
	$(PY) -m autograder grade "$(SUBMISSION)" --device $(DEVICE) --out "$(OUT)" $(if $(SEED),--seed $(SEED))

explain: setup
	$(PY) -m autograder explain "$(RESULTS)" $(if $(CHECK),--check "$(CHECK)")

# One line each, so that make echoes the command as it runs, with only the options given.
GRADE_OPTIONS = $(strip --device $(DEVICE) $(if $(JOBS),--jobs $(JOBS)) $(if $(FORCE),--force) \
	$(if $(STUDENT),--student "$(STUDENT)") $(if $(RELEASED),--released) $(if $(SHARD),--shard $(SHARD)) \
	$(if $(CANVAS_ASSIGNMENT),--canvas-assignment "$(CANVAS_ASSIGNMENT)"))
MERGE_OPTIONS = $(strip $(if $(RELEASED),--released) $(if $(CANVAS_ASSIGNMENT),--canvas-assignment "$(CANVAS_ASSIGNMENT)"))

grade: setup
	$(PY) -m autograder grade-class "$(COURSE)" $(GRADE_OPTIONS)

merge: setup
	$(PY) -m autograder grade-class "$(COURSE)" --merge $(MERGE_OPTIONS)

grade-slurm: setup
	COURSE="$(COURSE)" VENV="$(VENV)" deploy/slurm/submit.sh

student-kit: setup
	$(PY) -m autograder student-kit --out "$(DIST)" --torch "$(TORCH_SPEC)"

gradescope: setup
	$(PY) -m autograder gradescope --out "$(DIST)"
