# tb-numerics: every target sets up what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all install proto test test-py test-js demo report demo-logdir bench clean

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): setup.py $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Regenerates the committed Python code from proto/.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. proto/tb_numerics_plugin/proto/*.proto

# Browser tests need Debian's chromium; install it where missing.
/usr/bin/chromium:
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

test: $(STAMP) /usr/bin/chromium
	$(BIN)/python -m pytest -q tests
	node --test frontend/tests/

# The main job: TensorBoard serving the committed demo dumps.
demo: $(STAMP)
	$(BIN)/tensorboard --logdir demo_logdir --host 127.0.0.1 --port 6006

report: $(STAMP)
	$(BIN)/tb-numerics report demo_logdir

demo-logdir: $(STAMP)
	rm -rf demo_logdir
	$(BIN)/python -m tb_numerics_plugin.demo.torch_mnist --dump_dir demo_logdir/torch_mnist --dump_tensor_debug_mode FULL_HEALTH
	$(BIN)/python -m tb_numerics_plugin.demo.tf_mnist --dump_dir demo_logdir/tf_mnist --dump_tensor_debug_mode FULL_HEALTH

bench: $(STAMP)
	$(BIN)/python bench/reader_scale.py
	$(BIN)/python bench/capture_overhead.py
	$(BIN)/python bench/root_cause.py

clean:
	rm -rf $(VENV) build *.egg-info
