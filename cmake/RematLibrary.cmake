# remat_add_library(<name> <export name> <source>...): a static library of the installed package,
# remat::<export name>, with the public headers in the calling folder's include/ (built and
# installed with it) and the project's warnings.
function(remat_add_library name export_name)
  add_library(${name} STATIC ${ARGN})
  add_library(remat::${export_name} ALIAS ${name})
  set_target_properties(${name} PROPERTIES OUTPUT_NAME ${name} EXPORT_NAME ${export_name}
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  remat_set_warnings(${name})
  install(TARGETS ${name} EXPORT rematTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY include/remat DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
endfunction()
