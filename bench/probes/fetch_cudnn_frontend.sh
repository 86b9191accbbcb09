#!/bin/bash
# Downloads the nvidia-cudnn-frontend wheel for a GPU machine that cannot reach PyPI (CPython 3.12, Linux x86_64)
# into .carry3/whl (git-ignored), without its dependencies: the pack uses only the frontend's cuDNN graph API, which
# runs on the cuDNN torch already ships (nvidia-cudnn-cu13 / -cu12); the wheel's declared dependencies
# (nvidia-cutlass-dsl, apache-tvm-ffi) serve its optional CuTe-DSL kernels. On the GPU machine:
#   python -m pip install --no-deps --no-index --target /tmp/site-c .carry3/whl/nvidia_cudnn_frontend-*.whl
#   export PYTHONPATH=/tmp/site-c:$PYTHONPATH
# Usage: bench/probes/fetch_cudnn_frontend.sh [VERSION] [PYTHON-VERSION]   (defaults 1.32.0 and 3.12)
set -euo pipefail
version=${1:-1.32.0}
python_version=${2:-3.12}
repo=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$repo/.carry3/whl"
python3 -m pip download "nvidia-cudnn-frontend==$version" --no-deps --only-binary=:all: \
  --python-version "$python_version" --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --dest "$repo/.carry3/whl"
ls -l "$repo/.carry3/whl"
