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
# `run` writes into $OUT (default build-gpu/out): summary.txt (every stage's verdict, time and
# figures), the PyTorch-made snapshot pickle, and gpu-check.tar.gz with every log and dump.
# STEPS picks the stages (default "build gpu-tests pytest-gpu offload peak offload-plans headline plans torch-bench
# torch-snapshot runtime-bench", run in that order: the most wanted first); "tests" adds the whole CPU suite, "compiled" the headline under
# torch.compile). Each stage has a time limit, cut to what is left of GPU_CHECK_SECONDS (default
# 560) for the whole run, so one call stays inside the device's 10-minute limit; a stage with no
# time left is listed as skipped. Without "tests" only the targets the GPU stages use are built.
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
  # transformers alone: what it imports (huggingface_hub, tokenizers, safetensors) is on the GPU
  # machine's image in versions it accepts.
  python3 -m pip download --quiet --no-deps "${wheel_platform[@]}" transformers==5.24.0 torch-remat==0.2.2
  # accelerate (and psutil, which it imports) for the tests that train with transformers.Trainer
  python3 -m pip download --quiet --no-deps "${wheel_platform[@]}" accelerate==1.16.0 psutil==7.2.2
  echo "prepared $(du -sh "$deps" | cut -f1) in $deps; carry .gpu-deps to the GPU machine"
}

# Runs a stage with a time limit (cut to what is left of the run's), its output into
# $logs/NAME.log; records the outcome.
stage() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 20 ]; then
    printf '%-28s %-40s\n' "$name" "SKIPPED (no time left)" | tee -a "$summary"
    status=1
    return 124
  fi
  [ "$limit" -le "$left" ] || limit=$left
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
  artifacts="$build/artifacts"
  status=0
  deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-560}))
  mkdir -p "$out" "$logs" "$artifacts"
  : > "$summary"
  local steps=" ${STEPS:-build gpu-tests pytest-gpu offload peak offload-plans headline plans torch-bench torch-snapshot runtime-bench} "
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
    # Without the CPU suite, only what the GPU stages run.
    local targets=()
    [[ $steps == *" tests "* ]] || targets=(--target remat_alloc_shared remat_pluggable remat_python_module remat-report
      remat_alloc_cuda_tests remat_cuda_tests remat_runtime_bench_cuda remat_alloc_bench)
    # Keep going past a failure: a unit another compiler refuses costs its own targets, not every stage.
    local keep_going=(-k)
    [ ${#generator[@]} -eq 0 ] || keep_going=(-k 0)
    stage build 420 cmake --build "$build" -j "$(nproc)" "${targets[@]}" -- "${keep_going[@]}"
    grep -E 'error|Error' "$logs/build.log" | head -n 20 | sed 's/^/    /' | tee -a "$summary"
  fi
  local with_remat=(env PYTHONPATH="$build/python:$root/allocator/python:${PYTHONPATH:-}"
    REMAT_ALLOC_LIBRARY="$build/allocator/libremat_alloc.so" REMAT_REPORT="$build/cli/remat-report")
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
  if [[ $steps == *" pytest-gpu "* ]]; then
    # The Python suite's CUDA tests (skipped on CPU CI): parity on CUDA tensors under install(), the
    # CUDA RNG hooks with dropout, PyTorch's native OOM observer firing for real.
    stage pytest_gpu 150 "${with_remat[@]}" OMP_NUM_THREADS=1 "$python" -m pytest -q -p no:cacheprovider -rs \
      -k "cuda or gpu" "$root/tests/python/remat" "$root/tests/python/test_with_torch.py"
    grep -E 'passed|failed|FAILED|SKIPPED|Error' "$logs/pytest_gpu.log" | tail -n 20 | sed 's/^/    /' | tee -a "$summary"
  fi
  if [[ $steps == *" offload "* ]]; then
    # remat.CpuOffload on CUDA: copies on their own stream, prefetch, bitwise gradients, memory freed.
    for allocator in native remat; do
      stage "offload_$allocator" 120 "${with_remat[@]}" "$python" "$root/bench/gpu/offload_check.py" --allocator "$allocator"
      grep -E '^\[(ok|FAILED)\]|checks passed|failed' "$logs/offload_$allocator.log" | sed 's/^/    /' | tee -a "$summary"
    done
  fi

  if [[ $steps == *" peak "* ]]; then
    # Step-peak budgets under install(): plans by predicted peak at five budgets, remat.fit with a
    # sequence that doubles, remat.track naming a Llama step's bytes (bench/gpu/peak_check.py).
    stage peak 150 "${with_remat[@]}" "$python" "$root/bench/gpu/peak_check.py"
    grep -E '^\[(ok|FAILED|skipped)\]|^ *budget|^ *[0-9]+ +[0-9]+ +[0-9]+|checks passed|failed' "$logs/peak.log" |
      sed 's/^/    /' | tee -a "$summary"
  fi

  if [[ $steps == *" offload-plans "* ]]; then
    # Offload as a planned choice: peak and step time for every region saved, every region
    # recomputed, the best plan without offload and the best with it, the same two per op
    # (bench/gpu/offload_plan_check.py).
    stage offload_plans 120 "${with_remat[@]}" "$python" "$root/bench/gpu/offload_plan_check.py"
    grep -E '^\[(ok|FAILED)\]|^profile on|^row |^(all|best|per op|by peak) |checks passed|failed' "$logs/offload_plans.log" |
      sed 's/^/    /' | tee -a "$summary"
  fi

  # The README's GPU table: a Llama-shaped model (hidden 2048, 16 heads, sequence 2048, bf16),
  # every checkpointing variant, on PyTorch's own allocator and then under remat_alloc.install()
  # (the same rows: the allocator's cost on a real step). HEADLINE_LAYERS sizes it (default 8).
  local llama=(--device cuda --dtype bfloat16 --hidden 2048 --heads 16 --kv-heads 8 --layers "${HEADLINE_LAYERS:-8}"
    --batch 2 --sequence 2048 --vocab 32000)
  local headline=("$python" "$root/bench/python/hf_llama_bench.py" "${llama[@]}" --rounds 7)
  "$python" -c 'import torch_remat' 2> /dev/null && headline+=(--torch-remat)
  if [[ $steps == *" headline "* ]]; then
    for allocator in native remat; do
      stage "headline_$allocator" 150 "${with_remat[@]}" "${headline[@]}" --allocator "$allocator"
      sed -n '/^Llama/,$p' "$logs/headline_$allocator.log" | sed 's/^/    /' | tee -a "$summary"
    done
  fi
  if [[ $steps == *" plans "* ]]; then
    # Budget plans on the same Llama in bf16: the profile timed by CUDA events, five budgets.
    stage plans_bf16 150 "${with_remat[@]}" "$python" "$root/bench/python/budget_bench.py" "${llama[@]}" \
      --rounds 5 --compile-budgets ""
    sed -n '/^Llama/,$p' "$logs/plans_bf16.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [[ $steps == *" torch-bench "* ]]; then
    stage torch_allocator_bench 150 "${with_remat[@]}" \
      "$python" "$root/bench/gpu/torch_allocator_bench.py" --out "$artifacts" --rounds 3
    sed -n '/^allocator vs/,$p' "$logs/torch_allocator_bench.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [[ $steps == *" torch-snapshot "* ]]; then
    # A snapshot made by PyTorch's own allocator, through remat-report and back into PyTorch's viewer.
    local pickle="$out/torch-snapshot.pickle" report="$build/cli/remat-report"
    if stage torch_snapshot_record 120 "$python" "$root/bench/gpu/record_torch_snapshot.py" "$pickle"; then
      stage torch_snapshot_import 60 "$report" import "$pickle" -o "$artifacts/torch-snapshot.json"
      stage torch_snapshot_summary 60 "$report" summary "$artifacts/torch-snapshot.json"
      stage torch_snapshot_segments 60 "$report" segments "$artifacts/torch-snapshot.json"
      stage torch_snapshot_timeline 60 "$report" timeline "$artifacts/torch-snapshot.json" -o "$artifacts/torch-snapshot.svg"
      stage torch_snapshot_whatif 60 "$report" whatif "$pickle" --conf expandable_segments:True \
        --conf roundup_power2_divisions:4
      sed -n '/^Replayed/,$p' "$logs/torch_snapshot_whatif.log" | sed 's/^/    /' | tee -a "$summary"
      stage torch_snapshot_export 60 "$report" export "$artifacts/torch-snapshot.json" --to torch-snapshot \
        -o "$artifacts/torch-snapshot-export.pickle"
      stage torch_snapshot_viewer 60 "$python" -m torch.cuda._memory_viz trace "$artifacts/torch-snapshot-export.pickle"
    fi
  fi
  if [[ $steps == *" runtime-bench "* ]]; then
    stage runtime_bench_cuda 90 "$build/bench/remat_runtime_bench_cuda" --device cuda
    sed -n '/^memory/,$p' "$logs/runtime_bench_cuda.log" | sed 's/^/    /' | tee -a "$summary"
    # The allocator's own figures on this machine's CPU (host backend): tagging and trace costs.
    stage alloc_bench 60 "$build/bench/remat_alloc_bench" --quick
    sed -n '/^cached 4 KiB/,/^$/p' "$logs/alloc_bench.log" | sed 's/^/    /' | tee -a "$summary"
  fi
  if [[ $steps == *" compiled "* ]]; then
    stage headline_compiled 420 "${with_remat[@]}" "${headline[@]}" --compile
    sed -n '/^Llama/,$p' "$logs/headline_compiled.log" | sed 's/^/    /' | tee -a "$summary"
  fi

  echo "== overall: $([ "$status" -eq 0 ] && echo passed || echo FAILED) in $((SECONDS))s" | tee -a "$summary"
  tar -czf "$out/gpu-check.tar.gz" -C "$build" logs artifacts \
    $(cd "$build" && ls -d tests/gpu_end_to_end 2> /dev/null) 2> /dev/null
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
