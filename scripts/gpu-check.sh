#!/usr/bin/env bash
# GPU verification, for a machine with an NVIDIA GPU, CMake, a C++ compiler, the CUDA toolkit
# and a CUDA build of PyTorch, but without Debian packages or network access.
#
#   scripts/gpu-check.sh prepare   here (Debian, network): unpacks the build and test
#                                  dependencies into .gpu-deps/ (ignored by git), to carry along
#   scripts/gpu-check.sh run       there: builds everything against that machine's PyTorch with
#                                  CUDA on, runs the whole test suite, then the GPU suites one by
#                                  one (CUDA backend, LibTorch's CUDA allocator hook, checkpoint
#                                  runtime on CUDA tensors, PyTorch's pluggable allocator end to
#                                  end), then the benchmarks against PyTorch's own allocator.
#
# `run` writes its logs, dumps and figures into $OUT (default build-gpu/out): summary.txt, the
# figures, and gpu-check.tar.gz with everything else. STEPS (default "build tests gpu-tests
# torch-snapshot runtime-bench torch-bench headline") picks the stages; each has a time limit, so
# the run stays bounded (all of them together take longer than one 10-minute call: split them).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
deps="$root/.gpu-deps"

prepare() {
  set -e
  rm -rf "$deps"
  mkdir -p "$deps/debs" "$deps/wheels"
  (cd "$deps/debs" && apt-get download libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev \
    libfmt-dev libfmt9 libsimdjson-dev libsimdjson14)
  for deb in "$deps"/debs/*.deb; do dpkg -x "$deb" "$deps/root"; done
  rm -rf "$deps/debs" "$deps/root/usr/share/doc"
  # remat's schema tests check dumps with python-jsonschema; the GPU machine's Python lacks it.
  local wheel_platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$deps/wheels")
  python3 -m pip download --quiet --no-deps "${wheel_platform[@]}" jsonschema==4.10.3 pyrsistent==0.20.0
  # The headline table: a Hugging Face Llama (transformers and what it imports, not torch) and
  # torch_remat 0.2.2 beside this project's runtime.
  python3 -m pip download --quiet "${wheel_platform[@]}" transformers==5.24.0
  python3 -m pip download --quiet --no-deps "${wheel_platform[@]}" torch-remat==0.2.2
  echo "prepared $(du -sh "$deps" | cut -f1) in $deps; carry .gpu-deps to the GPU machine"
}

# Runs a stage with a time limit, its output into $logs/NAME.log; records the outcome.
stage() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local verdict=passed
  [ "$rc" -eq 0 ] || verdict="FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ", time limit ${limit}s"))"
  printf '%-28s %-40s %4ds\n' "$name" "$verdict" $((SECONDS - start)) | tee -a "$summary"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

run() {
  out="${OUT:-$root/build-gpu/out}"
  logs="$root/build-gpu/logs"
  summary="$out/summary.txt"
  build="$root/build-gpu"
  status=0
  mkdir -p "$out" "$logs"
  : > "$summary"
  local steps=" ${STEPS:-build tests gpu-tests torch-snapshot runtime-bench torch-bench headline} "
  local python
  python=$(command -v python3)

  {
    echo "== machine"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    echo "compiler: $(c++ --version 2>&1 | head -n 1)"
    echo "nvcc: $(nvcc --version 2>&1 | tail -n 1)"
    echo "cmake: $(cmake --version | head -n 1)"
    echo "python: $python $("$python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2> /dev/null)"
    echo "cores: $(nproc)"
  } | tee -a "$summary"
  echo "== stages" | tee -a "$summary"

  if [ -d "$deps/wheels" ]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/remat-site \
      "$deps"/wheels/*.whl > "$logs/wheels.log" 2>&1 || echo "could not install the carried wheels" | tee -a "$summary"
    export PYTHONPATH="/tmp/remat-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  local torch_dir
  if ! torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2> /dev/null); then
    echo "$python cannot import torch: the GPU checks need a CUDA build of PyTorch" | tee -a "$summary"
    return 1
  fi
  local generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  # The system compiler, whose libstdc++ is the shared one LibTorch loads: a toolchain named in
  # CC/CXX may link a static copy, which CMake refuses for programs that link LibTorch.
  local compilers=()
  [ -x /usr/bin/cc ] && [ -x /usr/bin/c++ ] && compilers=(-DCMAKE_C_COMPILER=/usr/bin/cc -DCMAKE_CXX_COMPILER=/usr/bin/c++)

  if [[ $steps == *" build "* ]]; then
    # Warnings stay warnings here: another compiler's new warnings must not hide the GPU results.
    stage configure 120 cmake -S "$root" -B "$build" "${generator[@]}" "${compilers[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$deps/root/usr" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DREMAT_WERROR=OFF \
      -DREMAT_TORCH_DIR="$torch_dir" -DPython3_EXECUTABLE="$python" -DREMAT_SYSTEM_PYTHON="$python" \
      -DREMAT_BUILD_TESTS=ON
    grep -E '^-- remat:' "$logs/configure.log" | tee -a "$summary"
    if ! grep -q 'remat: CUDA backend enabled' "$logs/configure.log" ||
       ! grep -q "remat: LibTorch CUDA libraries found" "$logs/configure.log"; then
      echo "the build has no CUDA backend or no LibTorch CUDA support: the GPU checks cannot run" | tee -a "$summary"
      status=1
    fi
    stage build 420 cmake --build "$build" -j "$(nproc)"
  fi
  if [[ $steps == *" tests "* ]]; then
    stage tests 300 ctest --test-dir "$build" -LE gpu -j "$(nproc)" --timeout 240 --output-on-failure --no-tests=error
    grep -E 'tests passed|tests failed|Skipped|Failed|\(Failed\)' "$logs/tests.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [[ $steps == *" gpu-tests "* ]]; then
    for gpu_test in remat_alloc_cuda_tests remat_cuda_tests.suite remat_cuda_tests.late-install \
                    python_pluggable_end_to_end; do
      stage "$gpu_test" 240 ctest --test-dir "$build" -R "^${gpu_test}\$" -V --no-tests=error
      if grep -q '(Skipped)' "$logs/$gpu_test.log"; then
        echo "    $gpu_test was skipped: it saw no GPU (or no torch)" | tee -a "$summary"
        status=1
      fi
      grep -E '^[0-9]+: \[  (PASSED|FAILED) |^[0-9]+: FAILED|Skipped|\(Failed\)|all checks passed|check\(s\) failed|refused as expected|\[ (parity|dropout) \]' \
        "$logs/$gpu_test.log" | sed 's/^[0-9]*: /    /' | tee -a "$summary"
    done
  fi
  if [[ $steps == *" gpu-tests "* ]]; then
    # remat.CpuOffload on CUDA: copies on their own stream, prefetch, bitwise gradients, memory freed.
    for allocator in native remat; do
      stage "offload_$allocator" 180 env PYTHONPATH="$build/python:$root/allocator/python:${PYTHONPATH:-}" \
        REMAT_ALLOC_LIBRARY="$build/allocator/libremat_alloc.so" \
        "$python" "$root/bench/gpu/offload_check.py" --allocator "$allocator"
      grep -E '^\[(ok|FAILED)\]|checks passed|failed' "$logs/offload_$allocator.log" | sed 's/^/    /' | tee -a "$summary"
    done
  fi
  if [[ $steps == *" torch-snapshot "* ]]; then
    # A snapshot made by PyTorch's own allocator, through remat-report and back into PyTorch's viewer.
    local pickle="$out/torch-snapshot.pickle" report="$build/cli/remat-report"
    if stage torch_snapshot_record 120 "$python" "$root/bench/gpu/record_torch_snapshot.py" "$pickle"; then
      stage torch_snapshot_import 60 "$report" import "$pickle" -o "$out/torch-snapshot.json"
      stage torch_snapshot_summary 60 "$report" summary "$out/torch-snapshot.json"
      stage torch_snapshot_segments 60 "$report" segments "$out/torch-snapshot.json"
      stage torch_snapshot_timeline 60 "$report" timeline "$out/torch-snapshot.json" -o "$out/torch-snapshot.svg"
      stage torch_snapshot_whatif 60 "$report" whatif "$pickle" --conf expandable_segments:True \
        --conf roundup_power2_divisions:4
      sed -n '/^Replayed/,$p' "$logs/torch_snapshot_whatif.log" | sed 's/^/    /' | tee -a "$summary"
      stage torch_snapshot_export 60 "$report" export "$out/torch-snapshot.json" --to torch-snapshot -o "$out/torch-snapshot-export.pickle"
      stage torch_snapshot_viewer 60 "$python" -m torch.cuda._memory_viz trace "$out/torch-snapshot-export.pickle"
    fi
  fi
  if [[ $steps == *" runtime-bench "* ]]; then
    stage runtime_bench_cuda 180 "$build/bench/remat_runtime_bench_cuda" --device cuda
    sed -n '/^memory/,$p' "$logs/runtime_bench_cuda.log" | sed 's/^/    /' | tee -a "$summary"
    # The allocator's own figures on this machine's CPU (host backend): tagging and trace costs.
    stage alloc_bench 60 "$build/bench/remat_alloc_bench" --quick
    sed -n '/^cached 4 KiB/,/^$/p' "$logs/alloc_bench.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [[ $steps == *" torch-bench "* ]]; then
    stage torch_allocator_bench 300 env REMAT_ALLOC_LIBRARY="$build/allocator/libremat_alloc.so" \
      PYTHONPATH="$root/allocator/python:${PYTHONPATH:-}" \
      "$python" "$root/bench/gpu/torch_allocator_bench.py" --out "$out" --rounds 3
    sed -n '/^allocator vs/,$p' "$logs/torch_allocator_bench.log" | sed 's/^/    /' | tee -a "$summary"
  fi

  if [[ $steps == *" headline "* ]]; then
    # The README's GPU table: a Llama-shaped model (hidden 2048, 16 heads, sequence 2048, bf16) on
    # PyTorch's own allocator, every checkpointing variant eager and then compiled. HEADLINE_LAYERS
    # sizes it (default 8).
    local headline=("$python" "$root/bench/python/hf_llama_bench.py" --device cuda --dtype bfloat16 --hidden 2048
      --heads 16 --kv-heads 8 --layers "${HEADLINE_LAYERS:-8}" --batch 2 --sequence 2048 --vocab 32000 --rounds 5)
    "$python" -c 'import torch_remat' 2> /dev/null && headline+=(--torch-remat)
    local with_remat=(env PYTHONPATH="$build/python:$root/allocator/python:${PYTHONPATH:-}"
      REMAT_ALLOC_LIBRARY="$build/allocator/libremat_alloc.so")
    stage headline_eager 240 "${with_remat[@]}" "${headline[@]}"
    sed -n '/^Llama/,$p' "$logs/headline_eager.log" | sed 's/^/    /' | tee -a "$summary"
    stage headline_compiled 420 "${with_remat[@]}" "${headline[@]}" --compile
    sed -n '/^Llama/,$p' "$logs/headline_compiled.log" | sed 's/^/    /' | tee -a "$summary"
  fi

  echo "== overall: $([ "$status" -eq 0 ] && echo passed || echo FAILED)" | tee -a "$summary"
  tar -czf "$out/gpu-check.tar.gz" -C "$root/build-gpu" logs \
    $(cd "$root/build-gpu" && ls -d tests/gpu_end_to_end 2> /dev/null) 2> /dev/null
  return "$status"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
