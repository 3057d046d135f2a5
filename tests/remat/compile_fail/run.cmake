# Builds the target that must not compile and checks that it fails with one clear
# static_assert message per misuse (EXPECTED of them).
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
  OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE status)
if(status EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but nesting inputs or outputs deeper than one level must be refused")
endif()
string(REGEX MATCHALL "static assertion failed: remat: [^\n]*one level deep" messages "${output}")
list(LENGTH messages count)
if(NOT count EQUAL EXPECTED)
  message(FATAL_ERROR "expected ${EXPECTED} remat static_assert messages, found ${count}:\n${output}")
endif()
list(REMOVE_DUPLICATES messages)
string(REPLACE ";" "\n" messages "${messages}")
message(STATUS "refused as expected:\n${messages}")
