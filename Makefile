# Every target that needs the virtualenv depends on `setup`, which (re)creates .venv only when it is
# missing or when the dependency list (pyproject.toml, TORCH_SPEC) changed.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
DEVICE     ?= auto
SUBMISSION ?= assignments/release/mha/mha.py
OUT        ?= results.json
COURSE     ?= assignments
JOBS       ?=
FORCE      ?=
STUDENT    ?=
RELEASED   ?=
DIST       ?= dist

BIN := $(abspath $(VENV))/bin
# nbgrader runs `alembic` as a subprocess, so the virtualenv's bin/ must be on PATH.
export PATH := $(BIN):$(PATH)
PY := $(BIN)/python

.PHONY: setup test release grade check preview grade-one student-kit gradescope help

help:
	@echo "make test                      set up .venv and run the project's tests"
	@echo "make grade                     grade every submission in assignments/submitted/ (what changed)"
	@echo "     DEVICE=cpu|cuda JOBS=n (default 2 per CPU, 2..8) FORCE=1 (regrade all) STUDENT=name RELEASED=1 (past the due date)"
	@echo "make check SUBMISSION=mha.py   the notebook's self-checks, part by part (what students run; runs the file's code)"
	@echo "make preview SUBMISSION=...    instructors: the grader's visible checks on a file, sandboxed (needs reference/)"
	@echo "make student-kit               what students receive: $(DIST)/mha-student-kit.zip"
	@echo "make gradescope                Gradescope's autograder: $(DIST)/mha-gradescope.zip"
	@echo "make grade-one SUBMISSION=...  grade one submission into OUT=results.json"
	@echo "make release                   regenerate the student release from reference/"

setup:
	@$(PYTHON) tools/setup_venv.py --venv "$(VENV)" --torch "$(TORCH_SPEC)"

test: setup
	$(PY) -m pytest

release: setup
	$(PY) -m autograder release

check: setup
	$(PY) -m autograder.selfcheck "$(SUBMISSION)"

preview: setup
	$(PY) -m autograder check "$(SUBMISSION)" --device $(DEVICE)

grade-one: setup
	$(PY) -m autograder grade "$(SUBMISSION)" --device $(DEVICE) --out "$(OUT)"

grade: setup
	$(PY) -m autograder grade-class "$(COURSE)" --device $(DEVICE) $(if $(JOBS),--jobs $(JOBS)) $(if $(FORCE),--force) \
		$(if $(STUDENT),--student "$(STUDENT)") $(if $(RELEASED),--released)

student-kit: setup
	$(PY) -m autograder student-kit --out "$(DIST)"

gradescope: setup
	$(PY) -m autograder gradescope --out "$(DIST)"
