# What `pip install .` puts in the wheel (scikit-build-core installs the "python" component):
# the shared allocator library inside the remat_alloc package, where the module finds it,
# the LibTorch hooks library beside it when it was built, the checkpoint runtime's extension
# in the remat package (it loads libremat_alloc.so from remat_alloc), remat.pipelining with its
# planner extension, and remat-report as a command.

# Without its extension the remat package installs and then cannot be imported, so a wheel
# that would lack it is a configure error, unless the checkpoint runtime is left out on
# purpose (REMAT_WITH_TORCH=OFF). The usual cause is pip's default build isolation, which
# hides the environment's torch from the build.
if(REMAT_WITH_TORCH AND NOT TARGET remat_python_module)
  if(NOT REMAT_HAVE_TORCH)
    set(_missing "torch is not importable by ${Python3_EXECUTABLE} here (pip's default build isolation hides \
the environment's torch from the build)")
  elseif(NOT EXISTS "${REMAT_TORCH_DIR}/lib/libtorch_python.so")
    set(_missing "${REMAT_TORCH_DIR}/lib/libtorch_python.so does not exist")
  else()
    set(_missing "Python's development headers for ${Python3_EXECUTABLE} were not found (apt install python3-dev)")
  endif()
  message(FATAL_ERROR "remat: cannot build the remat package's extension remat._C: ${_missing}. \
The extension is built against the torch it runs with: in the environment that has torch, \
with scikit-build-core installed there, run\n  pip install --no-build-isolation .\n\
To build the package without the checkpoint runtime (remat_alloc and remat-report only), \
add --config-settings=cmake.define.REMAT_WITH_TORCH=OFF.")
endif()

add_custom_target(remat_python_package)
add_dependencies(remat_python_package remat_alloc_shared)
install(TARGETS remat_alloc_shared LIBRARY DESTINATION remat_alloc COMPONENT python)
# Each extension module the configuration builds, with the package it goes into.
foreach(_module_and_package IN ITEMS remat_pluggable:remat_alloc remat_python_module:remat remat_budget_module:remat
        remat_pipeline_plan_module:remat)
  string(REPLACE ":" ";" _module_and_package "${_module_and_package}")
  list(GET _module_and_package 0 _module)
  list(GET _module_and_package 1 _package)
  if(TARGET ${_module})
    add_dependencies(remat_python_package ${_module})
    install(TARGETS ${_module} LIBRARY DESTINATION ${_package} COMPONENT python)
  endif()
endforeach()
if(TARGET remat_pipeline_plan_module)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/pipeline/python/remat/pipelining DESTINATION remat COMPONENT python
    FILES_MATCHING PATTERN "*.py")
endif()
if(TARGET remat-report)
  add_dependencies(remat_python_package remat-report)
  install(TARGETS remat-report RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT python)
endif()
