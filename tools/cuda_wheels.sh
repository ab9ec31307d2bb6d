#!/usr/bin/env bash
# A CUDA 13.0 toolkit for building `--features cuda` on a machine without one, from NVIDIA's
# PyPI wheels: nvcc, its headers and the libraries candle links (cuBLAS, cuBLASLt, cuRAND,
# NVRTC, the CUDA runtime), laid out as candle-kernels' and cudarc's build scripts look for it.
# Usage: bash tools/cuda_wheels.sh [DIR]   (default ~/.cache/specd/cuda13; idempotent)
# then:  source DIR/env.sh && cargo build --release -p specd --features cuda
#
# CUDA 13.0 on purpose: the driver runs PTX of its own CUDA version or older, and candle ships
# its kernels as PTX, so the toolkit must not be newer than the GPU machine's driver (580:
# CUDA 13.0). The binary needs libcuda.so.1 from the driver and the five libraries above
# (major versions 13, curand 10) where it runs; PyTorch's CUDA 13 wheels carry them too.
set -euo pipefail

DIR=$(mkdir -p "${1:-$HOME/.cache/specd/cuda13}" && realpath "${1:-$HOME/.cache/specd/cuda13}")
C=$DIR/nvidia/cu13
if [[ ! -x $C/bin/nvcc || ! -e $C/include/cccl/nv/target ]]; then
    # One install: pip --target skips packages whose top-level folder (nvidia/) already exists.
    python3 -m pip install -q --no-deps --upgrade --target "$DIR" \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 \
        nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
fi

# The linker wants unversioned names; cudaforge (candle-kernels) looks in lib64.
for lib in libcublas libcublasLt libcudart libnvrtc; do ln -sf "$lib.so.13" "$C/lib/$lib.so"; done
ln -sf libcurand.so.10 "$C/lib/libcurand.so"
ln -sfn lib "$C/lib64"

# libcuda comes with the driver, which no wheel ships. A stand-in with its soname and every
# entry point cudarc declares satisfies the link; the driver's own libcuda.so.1 is loaded
# where the binary runs.
if [[ ! -e $C/lib/stubs/libcuda.so ]]; then
    sys=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*/cudarc-*/src/driver/sys/mod.rs' | sort -V | tail -n1)
    if [[ -z $sys ]]; then
        echo "cudarc's sources are not in the cargo registry: run 'cargo fetch' first" >&2
        exit 1
    fi
    mkdir -p "$C/lib/stubs" "$DIR/stub-run"
    grep -o 'pub unsafe fn cu[A-Za-z0-9_]*' "$sys" | awk '{ print $4 }' | sort -u |
        awk '{ print "int " $1 "(void) { return 999; }" }' >"$DIR/cuda_stub.c"
    cc -shared -fPIC -w -Wl,-soname,libcuda.so.1 -o "$C/lib/stubs/libcuda.so" "$DIR/cuda_stub.c"
    # The stand-in also lets the binary start here for `--device cpu` runs.
    ln -sf "$C/lib/stubs/libcuda.so" "$DIR/stub-run/libcuda.so.1"
fi

cat >"$DIR/env.sh" <<EOF
# CUDA_COMPUTE_CAP: there is no GPU here for candle-kernels' build to ask (90: H100/H200).
export PATH=$C/bin:\$PATH CUDA_HOME=$C CUDA_ROOT=$C CUDA_PATH=$C CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-90}
# LD_LIBRARY_PATH for running the binary on this machine (--device cpu only).
export CUDA_WHEELS_LD_PATH=$DIR/stub-run:$C/lib
EOF
"$C/bin/nvcc" --version | tail -n2
echo "source $DIR/env.sh"
