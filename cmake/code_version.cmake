# Writes OUT (a header defining FP8LAB_CODE_VERSION as "VERSION+<git describe --always
# --dirty>") when its text would change: run at every build, so that the code version a run
# records is the one it was built from, not the one CMake was configured at.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty
                OUTPUT_VARIABLE git OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT git)
  set(git "unknown")
endif()
set(text "#pragma once\n#define FP8LAB_CODE_VERSION \"${VERSION}+${git}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
