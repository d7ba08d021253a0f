# Two commands: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   := out/demo

.PHONY: demo test bench clean venv

venv: $(STAMP)

# uv resolves and installs in parallel: ~1 min from a cold cache where pip takes ~4 (TF + Beam[gcp]).
$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/melshards preprocess --input data/ljspeech_tiny --output $(DEMO)/shards --config configs/ljspeech_tiny.yaml --overwrite
	$(BIN)/melshards stats $(DEMO)/shards
	rm -rf $(DEMO)/model
	$(BIN)/melshards train '$(DEMO)/shards/train-*.tfrecord' --val '$(DEMO)/shards/val-*.tfrecord' \
	    --model-dir $(DEMO)/model --config configs/train_tiny.yaml --steps 40
	$(BIN)/melshards inspect '$(DEMO)/shards/*.tfrecord' --show 1 --out $(DEMO)/inspect

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf out $(VENV) *.egg-info
