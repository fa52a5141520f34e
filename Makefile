# tb-numerics: every target sets up what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all install proto ptx test test-py test-js test-compat demo report demo-logdir bench clean

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): setup.py pyproject.toml $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/tb-numerics build-native
	touch $(STAMP)

install: $(STAMP)

# Regenerates the committed Python code from proto/ with protoc 3.21 (grpcio-tools 1.51.3, in
# its own venv: it needs protobuf 4): gencode of that age loads on protobuf 3.20 ... 7.x, while
# newer gencode refuses runtimes older than itself.
PROTO_VENV := .venv-proto
$(PROTO_VENV)/bin/python:
	$(PY) -m venv $(PROTO_VENV)
	$(PROTO_VENV)/bin/pip install -q grpcio-tools==1.51.3

proto: $(PROTO_VENV)/bin/python
	$(PROTO_VENV)/bin/python -m grpc_tools.protoc -Iproto --python_out=. proto/tb_numerics_plugin/proto/*.proto

# The CUDA health kernels, shipped as PTX (the driver compiles it at run time; needs nvcc here
# only). compute_75 is the oldest target CUDA 13 keeps; the PTX needs a CUDA 13 driver (>= 580).
CUDA_PTX := tb_numerics_plugin/torch/_health_cuda.ptx
ptx: $(CUDA_PTX)
$(CUDA_PTX): tb_numerics_plugin/torch/_health_cuda.cu
	nvcc -ptx -arch=compute_75 -O3 -o $@ $<

# Browser tests need Debian's chromium; install it where missing.
/usr/bin/chromium:
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

# The torch capture's tests run on its default per-op path, the native hook (built first, or
# found built: its sources may have changed since install), and again on the dispatch mode
# (TB_NUMERICS_CAPTURE=python), its fallback.
TORCH_TESTS := tests/test_torch_*.py tests/test_integrations_transformers.py \
	tests/test_integrations_lightning.py tests/test_root_cause_models.py
test: $(STAMP) /usr/bin/chromium
	$(BIN)/tb-numerics build-native
	$(BIN)/python -m pytest -q tests
	TB_NUMERICS_CAPTURE=python $(BIN)/python -m pytest -q -p no:cacheprovider $(TORCH_TESTS)
	node --test frontend/tests/
	$(MAKE) test-compat

# The lowest versions we declare, without TensorFlow or torch: the built wheel in a fresh venv
# with protobuf 3.20.3, tensorboard 2.15, numpy 1.23.5, running the reader, analysis, CLI and
# plugin tests against the installed package (tests that need TF or torch skip).
COMPAT := .venv-compat
test-compat: $(STAMP)
	rm -rf $(COMPAT) .whl
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w .whl .
	$(PY) -m venv $(COMPAT)
	$(COMPAT)/bin/pip install -q protobuf==3.20.3 tensorboard==2.15.0 numpy==1.23.5 crc32c==2.3 \
		pytest .whl/*.whl
	$(COMPAT)/bin/pip check
	TB_NUMERICS_INSTALLED=1 $(COMPAT)/bin/pytest -q -p no:cacheprovider tests/test_analysis_*.py \
		tests/test_plugin_*.py tests/test_reader_*.py tests/test_records.py tests/test_writer.py \
		tests/test_cli.py tests/test_proto.py
	cd /tmp && $(CURDIR)/$(COMPAT)/bin/tb-numerics report $(CURDIR)/demo_logdir > /dev/null

# The main job: TensorBoard serving the committed demo dumps.
demo: $(STAMP)
	$(BIN)/tensorboard --logdir demo_logdir --host 127.0.0.1 --port 6006

report: $(STAMP)
	$(BIN)/tb-numerics report demo_logdir

demo-logdir: $(STAMP)
	rm -rf demo_logdir
	$(BIN)/python -m tb_numerics_plugin.demo.torch_mnist --dump_dir demo_logdir/torch_mnist --dump_tensor_debug_mode FULL_HEALTH
	$(BIN)/python -m tb_numerics_plugin.demo.tf_mnist --dump_dir demo_logdir/tf_mnist --dump_tensor_debug_mode FULL_HEALTH
	# A transformers Trainer under NumericsCallback: ops traced for steps 20-24, numerics over
	# time for every step; the loss goes +inf at step 24 and the callback stops the run (exit 1).
	$(BIN)/python -m tb_numerics_plugin.demo.trainer_demo --dump_dir demo_logdir/trainer_gpt2 \
		--steps 30 --blowup_step 24 --trace_steps 20-24; test $$? -eq 1
	rm -rf demo_logdir/trainer_gpt2.trainer

bench: $(STAMP)
	$(BIN)/python bench/reader_scale.py
	$(BIN)/python bench/capture_overhead.py
	$(BIN)/python bench/root_cause.py

clean:
	rm -rf $(VENV) $(PROTO_VENV) $(COMPAT) .whl build *.egg-info
