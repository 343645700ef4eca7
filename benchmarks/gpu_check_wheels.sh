#!/usr/bin/env bash
# The wheels make gpu-check needs on a GPU machine that has torch, transformers, peft and accelerate
# (and numpy, pandas, pyarrow, safetensors, tokenizers, pyyaml, requests, tqdm) but no network:
# downloaded here into .whl/ (git-ignored through .git/info/exclude) for CPython 3.12 on x86-64 Linux,
# the versions of requirements.lock where the machine's own packages allow them.
# benchmarks/gpu_check_device.sh installs them there. Usage: bash benchmarks/gpu_check_wheels.sh [DIR]
# (GPU_CHECK_PYTHON_VERSION=3.11: the wheels for another CPython, e.g. to try the device script here).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl}"
PYTHON="${PYTHON:-python3}"
python_version="${GPU_CHECK_PYTHON_VERSION:-3.12}"

# bitsandbytes: QLoRA's 4-bit NF4 layers (43 MB, most of the total).
# trl: the SFT trainer the project's trainer subclasses; datasets (with dill, multiprocess): what
# trl and the training splits read. pydantic (with its core, annotated-types, typing-inspection and
# a typing_extensions it accepts): the pipeline's params. huggingface_hub 1.x: datasets 5.2 needs
# 1.31 or later and transformers 5.17 refuses 2.x; the device script installs it (and any other
# carried wheel) only over an older copy.
WHEELS=(
  bitsandbytes==0.50.2
  trl==1.16.0
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
  pydantic==2.14.3
  pydantic_core==2.50.4
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing_extensions==4.16.0
  huggingface_hub==1.33.0
)

mkdir -p "$dest"
# Never committed: listed in this clone's own ignore file, not in .gitignore.
if exclude="$(git rev-parse --git-path info/exclude 2>/dev/null)" && [ "$dest" = .whl ]; then
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$dest" "${WHEELS[@]}"
ls -l "$dest"/*.whl | awk '{printf "%10d  %s\n", $5, $NF; total += $5} END {printf "%10d  total (%.1f MiB)\n", total, total / 1048576}'
