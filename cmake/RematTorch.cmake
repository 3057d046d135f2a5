# Finds LibTorch inside the PyPI wheel `torch` (headers, libtorch_cpu, libc10) without
# importing it, and defines remat::torch_cpu. The CPU libraries are all the checkpoint
# runtime needs, so builds and tests here do not depend on the CUDA parts of the wheel;
# remat::torch_cuda (libtorch_cuda, libc10_cuda) is defined too on CUDA builds.
# Override the location with -DREMAT_TORCH_DIR=/path/to/site-packages/torch.

set(REMAT_TORCH_DIR "" CACHE PATH "The torch package directory (site-packages/torch)")
# Found from the interpreter's torch: again where the interpreter changed since (a build folder
# configured with another Python keeps no other environment's torch), unless the folder was given.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND AND (NOT REMAT_TORCH_DIR OR ("${REMAT_TORCH_DIR}" STREQUAL "${_REMAT_TORCH_DIR_FOUND}"
                                  AND NOT "${Python3_EXECUTABLE}" STREQUAL "${_REMAT_TORCH_DIR_FROM}")))
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util, os; s = importlib.util.find_spec('torch'); print(os.path.dirname(s.origin) if s else '')"
    OUTPUT_VARIABLE _torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(REMAT_TORCH_DIR "${_torch_dir}" CACHE PATH "The torch package directory (site-packages/torch)" FORCE)
  set(_REMAT_TORCH_DIR_FOUND "${_torch_dir}" CACHE INTERNAL "REMAT_TORCH_DIR as found, not given")
  set(_REMAT_TORCH_DIR_FROM "${Python3_EXECUTABLE}" CACHE INTERNAL "The interpreter it was found from")
endif()

# LibTorch's libraries load the shared libstdc++; a program that links them must use that one
# too. A compiler that links libstdc++ statically (some toolchains installed under /opt do)
# gives the program a second copy that LibTorch's libraries bind to, and LibTorch CUDA
# programs built that way crashed at exit.
function(remat_require_shared_libstdcxx)
  try_run(run_result compile_result ${CMAKE_BINARY_DIR}/CMakeFiles/remat_shared_libstdcxx
    ${CMAKE_CURRENT_LIST_DIR}/shared_libstdcxx_probe.cpp CXX_STANDARD 20 COMPILE_OUTPUT_VARIABLE compile_output)
  if(NOT compile_result)
    message(FATAL_ERROR "remat: could not build the libstdc++ probe with ${CMAKE_CXX_COMPILER}:\n${compile_output}")
  endif()
  if(NOT run_result EQUAL 0)
    message(FATAL_ERROR "remat: ${CMAKE_CXX_COMPILER}, with the flags in force, links the C++ standard library "
                        "statically, but LibTorch uses the shared libstdc++.so.6: a program linking both would carry "
                        "two copies and crash. Configure with the system compiler and no -static-libstdc++ (e.g. "
                        "-DCMAKE_CXX_COMPILER=/usr/bin/c++), or without the LibTorch parts (-DREMAT_WITH_TORCH=OFF)")
  endif()
endfunction()

set(REMAT_HAVE_TORCH OFF)
if(REMAT_TORCH_DIR AND EXISTS "${REMAT_TORCH_DIR}/lib/libtorch_cpu.so" AND EXISTS "${REMAT_TORCH_DIR}/include/ATen/ATen.h")
  remat_require_shared_libstdcxx()
  set(REMAT_HAVE_TORCH ON)
  file(STRINGS "${REMAT_TORCH_DIR}/version.py" _torch_version_line REGEX "^__version__")
  string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" REMAT_TORCH_VERSION "${_torch_version_line}")
  add_library(remat_torch_cpu INTERFACE)
  add_library(remat::torch_cpu ALIAS remat_torch_cpu)
  set_target_properties(remat_torch_cpu PROPERTIES EXPORT_NAME torch_cpu)
  target_include_directories(remat_torch_cpu SYSTEM INTERFACE
    ${REMAT_TORCH_DIR}/include ${REMAT_TORCH_DIR}/include/torch/csrc/api/include)
  target_link_libraries(remat_torch_cpu INTERFACE
    ${REMAT_TORCH_DIR}/lib/libtorch_cpu.so ${REMAT_TORCH_DIR}/lib/libc10.so)
  target_link_options(remat_torch_cpu INTERFACE "-Wl,-rpath,${REMAT_TORCH_DIR}/lib"
    $<BUILD_INTERFACE:$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:-Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/program_exports.map>>)
  message(STATUS "remat: LibTorch ${REMAT_TORCH_VERSION} from ${REMAT_TORCH_DIR}")

  # LibTorch's CUDA libraries, for installing the tagging allocator as its CUDA allocator.
  set(REMAT_HAVE_TORCH_CUDA OFF)
  if(REMAT_HAVE_CUDA AND EXISTS "${REMAT_TORCH_DIR}/lib/libtorch_cuda.so"
     AND EXISTS "${REMAT_TORCH_DIR}/include/torch/csrc/cuda/CUDAPluggableAllocator.h")
    set(REMAT_HAVE_TORCH_CUDA ON)
    add_library(remat_torch_cuda INTERFACE)
    add_library(remat::torch_cuda ALIAS remat_torch_cuda)
    set_target_properties(remat_torch_cuda PROPERTIES EXPORT_NAME torch_cuda)
    target_link_libraries(remat_torch_cuda INTERFACE remat::torch_cpu
      ${REMAT_TORCH_DIR}/lib/libtorch_cuda.so ${REMAT_TORCH_DIR}/lib/libc10_cuda.so CUDA::cudart)
    target_link_options(remat_torch_cuda INTERFACE "-Wl,-rpath-link,${CUDAToolkit_LIBRARY_DIR}")
    # A program that links LibTorch loads LibTorch's CUDA runtime (the wheel's), not the
    # toolkit's: its folder comes first on the search path for libcudart.so.
    file(GLOB _torch_cudart "${REMAT_TORCH_DIR}/../nvidia/cu*/lib/libcudart.so.*"
                            "${REMAT_TORCH_DIR}/../nvidia/cuda_runtime/lib/libcudart.so.*")
    if(_torch_cudart)
      list(GET _torch_cudart 0 _torch_cudart)
      get_filename_component(_torch_cudart_dir "${_torch_cudart}" DIRECTORY)
      target_link_options(remat_torch_cuda INTERFACE "-Wl,-rpath,${_torch_cudart_dir}")
    endif()
    message(STATUS "remat: LibTorch CUDA libraries found; building remat::cuda")
  endif()
else()
  if(REMAT_TORCH_DIR)
    set(_torch_missing "no LibTorch in REMAT_TORCH_DIR=${REMAT_TORCH_DIR}")
  else()
    set(_torch_missing "${Python3_EXECUTABLE} cannot import torch")
  endif()
  message(STATUS "remat: LibTorch not found: ${_torch_missing} (scripts/install-deps.sh "
                 "installs torch==2.11.0; or configure with -DPython3_EXECUTABLE=<a Python that imports torch>, or "
                 "-DREMAT_TORCH_DIR=<its site-packages/torch>); skipping the checkpoint runtime")
endif()
