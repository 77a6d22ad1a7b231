# PyTorch from the project's Python environment (docs/python.md, "Which PyTorch").
#
# Every libtorch target builds against the torch installed in one Python: the one named by
# -DPython_EXECUTABLE=..., else the project's own environment (.venv, made by
# scripts/setup-python.sh), else the first python3 on PATH. Its torch package carries
# libtorch's headers, libraries and CMake files (torch.utils.cmake_prefix_path), so the C++
# targets, the tests and the Python extension share one libtorch with the Python package.
#
# Sets FP8LAB_TORCH_VERSION (torch.__version__, e.g. "2.13.0+cpu"), which the Python package
# records and checks at import.

set(FP8LAB_TORCH_TESTED "2.13.0")
set(FP8LAB_TORCH_MIN "2.4")

if(NOT Python_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(Python_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import torch; print(torch.utils.cmake_prefix_path); print(torch.__version__)"
  RESULT_VARIABLE _fp8lab_torch_rc
  OUTPUT_VARIABLE _fp8lab_torch_out
  ERROR_VARIABLE _fp8lab_torch_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _fp8lab_torch_rc EQUAL 0)
  message(FATAL_ERROR
    "fp8lab: ${Python_EXECUTABLE} cannot import torch (${_fp8lab_torch_err}).\n"
    "Run scripts/setup-python.sh (it makes .venv with torch==${FP8LAB_TORCH_TESTED}), or pass "
    "-DPython_EXECUTABLE=<a python with torch 2.x>, or -DFP8LAB_WITH_TORCH=OFF for core and kernels alone.")
endif()
string(REPLACE "\n" ";" _fp8lab_torch_out "${_fp8lab_torch_out}")
list(GET _fp8lab_torch_out 0 _fp8lab_torch_prefix)
list(GET _fp8lab_torch_out 1 FP8LAB_TORCH_VERSION)
list(PREPEND CMAKE_PREFIX_PATH "${_fp8lab_torch_prefix}")
# Always this Python's torch, also in a build folder first configured for another one (pip
# reuses build-pip/<wheel tag> across environments): what torch's CMake files cached for
# another torch is dropped.
if(DEFINED CACHE{FP8LAB_TORCH_PREFIX} AND NOT FP8LAB_TORCH_PREFIX STREQUAL _fp8lab_torch_prefix)
  message(STATUS "fp8lab: torch changed (${FP8LAB_TORCH_PREFIX} -> ${_fp8lab_torch_prefix})")
  foreach(v Torch_DIR Caffe2_DIR TORCH_LIBRARY c10_LIBRARY kineto_LIBRARY)
    unset(${v} CACHE)
  endforeach()
endif()
set(FP8LAB_TORCH_PREFIX "${_fp8lab_torch_prefix}" CACHE INTERNAL "torch.utils.cmake_prefix_path of the last configure")

find_package(Torch ${FP8LAB_TORCH_MIN} REQUIRED CONFIG)
if(Torch_VERSION VERSION_GREATER_EQUAL 3)
  message(FATAL_ERROR "fp8lab: torch ${Torch_VERSION} is not a 2.x release (tested: ${FP8LAB_TORCH_TESTED})")
endif()
if(NOT Torch_VERSION VERSION_EQUAL FP8LAB_TORCH_TESTED)
  message(WARNING "fp8lab: building against torch ${Torch_VERSION}; the tested release is ${FP8LAB_TORCH_TESTED}")
endif()
message(STATUS "fp8lab: torch ${FP8LAB_TORCH_VERSION} from ${Python_EXECUTABLE}")

# libtorch's own directory, where libtorch_python also lies.
get_filename_component(FP8LAB_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
