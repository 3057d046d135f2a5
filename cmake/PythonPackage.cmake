# What `pip install .` puts in the wheel (scikit-build-core installs the "python" component):
# the shared allocator library inside the remat_alloc package, where the module finds it,
# the LibTorch hooks library beside it when it was built, the checkpoint runtime's extension
# in the remat package (it loads libremat_alloc.so from remat_alloc), and remat-report as a
# command.
add_custom_target(remat_python_package)
add_dependencies(remat_python_package remat_alloc_shared)
install(TARGETS remat_alloc_shared LIBRARY DESTINATION remat_alloc COMPONENT python)
if(TARGET remat_pluggable)
  add_dependencies(remat_python_package remat_pluggable)
  install(TARGETS remat_pluggable LIBRARY DESTINATION remat_alloc COMPONENT python)
endif()
if(TARGET remat_python_module)
  add_dependencies(remat_python_package remat_python_module)
  install(TARGETS remat_python_module LIBRARY DESTINATION remat COMPONENT python)
endif()
if(TARGET remat-report)
  add_dependencies(remat_python_package remat-report)
  install(TARGETS remat-report RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT python)
endif()
