# explorl: the two quickstart commands are `make demo` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-verl bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel of torch lies on this machine's disk; on a GPU machine pip picks the CUDA build instead
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.3"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

# verl pins its own transformers/tensordict ranges: explorl[verl] lives in its own venv, `make test` is untouched
VENV_VERL := .venv-verl
STAMP_VERL := $(VENV_VERL)/.installed

$(STAMP_VERL): pyproject.toml
	$(PYTHON) -m venv $(VENV_VERL)
	$(VENV_VERL)/bin/python -m pip install -q --upgrade pip
	$(VENV_VERL)/bin/python -m pip install -q "torch==2.13.0" || $(VENV_VERL)/bin/python -m pip install -q "torch>=2.3"
	$(VENV_VERL)/bin/python -m pip install -q -e ".[verl,test]"
	touch $(STAMP_VERL)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/explorl demo configs/quickstart.yaml

test: $(STAMP)
	$(PY) -m pytest -q

test-verl: $(STAMP_VERL)
	$(VENV_VERL)/bin/python -m pytest -q tests/integrations

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	# the speed part of bench/RESULTS.md (about 10 minutes on 2 cores); TRL is needed for train_step.py
	$(PY) -m pip install -q trl datasets "torch==$$($(PY) -c 'import torch; print(torch.__version__.split("+")[0])')"
	$(PY) bench/sampler.py
	$(PY) bench/train_step.py
	$(PY) bench/methods.py --quick
	$(PY) bench/memory.py

clean:
	rm -rf $(VENV) $(VENV_VERL) runs .pytest_cache
