# Warnings for the project's own targets; third-party code is not held to them.
function(remat_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    -Wno-missing-field-initializers)
  if(REMAT_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
