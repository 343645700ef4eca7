#!/usr/bin/env bash
# make gpu-check on a GPU machine without the .venv or a network: installs the wheels carried in
# .whl/ (bash benchmarks/gpu_check_wheels.sh; GPU_CHECK_WHEELS names another folder) into /tmp/site,
# each only where the machine lacks the package or has an older version (its torch, transformers,
# peft and accelerate stay), then runs benchmarks/gpu_check.py with include/ on the path. From the
# repository root:
#     bash benchmarks/gpu_check_device.sh "$OUT/gpu_check.json" [gpu_check.py options, e.g. --dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}/gpu_check.json}"
shift || true
PYTHON="${PYTHON:-python3}"
wheel_dir="${GPU_CHECK_WHEELS:-.whl}"
site="${GPU_CHECK_SITE:-/tmp/site}"
mkdir -p "$site"
if ! ls "$wheel_dir"/*.whl >/dev/null 2>&1; then
  echo "no wheels in $wheel_dir: run bash benchmarks/gpu_check_wheels.sh where there is a network, and carry it" >&2
fi

mapfile -t wheels < <("$PYTHON" - "$wheel_dir" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.version import Version

for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, carried = wheel.name.split("-")[:2]
    try:
        installed = version(name)
    except PackageNotFoundError:
        installed = None
    if installed is None or Version(installed) < Version(carried):
        print(wheel)
    else:
        print(f"keeping the installed {name} {installed} (carried: {carried})", file=sys.stderr)
PY
)
if [ "${#wheels[@]}" -gt 0 ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$site:$PWD/include${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec "$PYTHON" benchmarks/gpu_check.py --out "$out" "$@"
