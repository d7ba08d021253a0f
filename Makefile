# Two commands: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   := out/demo

.PHONY: demo test lint bench clean venv

venv: $(STAMP)

# uv resolves and installs in parallel. --compile-bytecode: uv writes no .pyc by default, so every
# process (Beam's workers too) would compile its imports from source (docs/performance.md#install).
$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[test,bench]'
	# numba compiles librosa's gufuncs at its first import (~20 s), and Griffin-Lim's overlap-add and pyin's
	# Viterbi at their first call (~7 s), and caches them in the venv: done here, once, not by the first job,
	# synthesis or test processes (which wait for the import's: preprocess/clip/audio.py load_librosa)
	$(BIN)/python -c 'import numpy as np; from melshards.preprocess.clip.audio import load_librosa; librosa = load_librosa(); \
	    librosa.griffinlim(np.ones((257, 9)), n_iter=1, n_fft=512, hop_length=128, random_state=0); \
	    librosa.pyin(np.sin(np.arange(8192) / 5.6).astype(np.float32), fmin=65, fmax=800, sr=22050)'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/melshards preprocess --input data/ljspeech_tiny --output $(DEMO)/shards --config configs/ljspeech_tiny.yaml --overwrite
	$(BIN)/melshards stats $(DEMO)/shards
	rm -rf $(DEMO)/model
	$(BIN)/melshards train '$(DEMO)/shards/train-*.tfrecord' --val '$(DEMO)/shards/val-*.tfrecord' \
	    --model-dir $(DEMO)/model --config configs/train_tiny.yaml --steps 40
	$(BIN)/melshards inspect '$(DEMO)/shards/*.tfrecord' --show 1 --out $(DEMO)/inspect

# Two pytest workers, one test file each at a time: XLA compiles are single-threaded, so two
# overlap on 2 cores. Files in the order tests/conftest.py gives (the long training files first), not
# xdist's (most tests first, which left the long few-test files to the end, on one worker).
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# Lint, format and types (ruff.toml, mypy.ini), before the tests; .pre-commit-config.yaml runs the same.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf out $(VENV) *.egg-info
