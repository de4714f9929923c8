# make demo   - create .venv, install, train a small model on the CPU, write a sample grid
# make test   - create/use .venv, run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Local images for the demo (folder or .zip); empty = CIFAR-10 via torchvision (downloads when online).
DATA ?= $(wildcard ../shared/datasets/cifar10-jpeg/train.zip)
DEMO_DIR ?= runs/demo
# Demo precision: bf16 where the CPU computes it natively, fp32 ("no") where PyTorch would emulate it (~10x slower;
# docs/performance.md). Evaluated when the demo runs, with the venv's Python; override: make demo DEMO_PRECISION=bf16
DEMO_PRECISION ?= $$($(PY) -c "from adaptive.build import cpu_has_native_bf16 as n; print('bf16' if n() else 'no')")
# Test processes (pytest-xdist): most of a test's time is a subprocess importing torch + diffusers on one core.
TEST_WORKERS ?= 2

.PHONY: install demo test clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	p=$(DEMO_PRECISION) || exit 1; echo "demo: --mixed_precision $$p"; \
	$(VENV)/bin/accelerate launch --num_processes 1 --num_machines 1 --mixed_precision $$p --dynamo_backend no \
		train_accelerate.py --preset cpu-tiny16 --timestep_sampler adaptive --mixed_precision $$p \
		$(if $(DATA),--train_data_dir $(DATA),--dataset_name cifar10) \
		--output_dir $(DEMO_DIR) --overwrite_output_dir --max_train_steps 300 --train_batch_size 64 \
		--save_images_steps 100 --checkpointing_steps 100 --logger none
	@echo "sample grids: $(DEMO_DIR)/samples/   pipeline: $(DEMO_DIR)/ (DDPMPipeline.from_pretrained)"

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests

clean:
	rm -rf $(VENV) runs/demo
