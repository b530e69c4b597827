# Every target that needs the virtualenv depends on `setup`, which (re)creates .venv only when it is
# missing or when the dependency list (pyproject.toml, TORCH_SPEC) changed.
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
DEVICE     ?= auto
SUBMISSION ?= assignments/release/mha/mha.py
OUT        ?= results.json

BIN := $(abspath $(VENV))/bin
# nbgrader runs `alembic` as a subprocess, so the virtualenv's bin/ must be on PATH.
export PATH := $(BIN):$(PATH)
PY := $(BIN)/python

.PHONY: setup test test-speed bench release grade check grade-one help

help:
	@echo "make test                      set up .venv and run the project's tests"
	@echo "make test-speed                the speed part's verdicts, each graded 10 times beside a CPU burner (long)"
	@echo "make bench                     time the wrapper, the weight split and fast peers; table, plot, JSON"
	@echo "make grade                     grade every submission in assignments/submitted/"
	@echo "make check SUBMISSION=mha.py   the visible checks, for students"
	@echo "make grade-one SUBMISSION=...  grade one submission into OUT=results.json"
	@echo "make release                   regenerate the student release from reference/"

setup:
	@$(PYTHON) tools/setup_venv.py --venv "$(VENV)" --torch "$(TORCH_SPEC)"

test: setup
	$(PY) -m pytest

test-speed: setup
	SPEED_VERDICTS=1 $(PY) -m pytest tests/test_speed_verdicts.py -s -q

bench: setup
	$(PY) -m autograder.bench --device $(DEVICE) --out bench

release: setup
	$(PY) -m autograder release

check: setup
	$(PY) -m autograder check "$(SUBMISSION)" --device $(DEVICE)

grade-one: setup
	$(PY) -m autograder grade "$(SUBMISSION)" --device $(DEVICE) --out "$(OUT)"

grade: setup
	$(PY) -m autograder grade-class assignments --device $(DEVICE)
