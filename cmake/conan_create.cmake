# `conan create` of Nitro's package, offline, in a private CONAN_HOME: header-only, or with the
# compiled library when COMPILED is ON (LibTorch then found through TORCH_PREFIX).
# cmake -DCONAN=<conan> -DSOURCE_DIR=<nitro> -DCONAN_HOME=<dir> [-DCOMPILED=ON -DTORCH_PREFIX=<dir>] -P cmake/conan_create.cmake
set(ENV{CONAN_HOME} "${CONAN_HOME}")
function(conan)
  execute_process(COMMAND "${CONAN}" ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "conan ${ARGN} failed (${rc})")
  endif()
endfunction()
if(NOT EXISTS "${CONAN_HOME}/profiles/default")
  conan(profile detect --force)
endif()
# Offline: no remote is ever asked; GSL comes from the system through the profile.
execute_process(COMMAND "${CONAN}" remote disable "*" OUTPUT_QUIET ERROR_QUIET)
# The test package builds in its own folder: a copy, so nothing is written into the source tree.
set(test_folder "${CONAN_HOME}/../conan_test_package")
set(options)
if(COMPILED)
  set(options -o "nitro/*:compiled=True")
  set(test_folder "${test_folder}_compiled")
  set(ENV{CMAKE_PREFIX_PATH} "${TORCH_PREFIX}")
endif()
file(REMOVE_RECURSE "${test_folder}")
file(COPY "${SOURCE_DIR}/tests/conan_package/" DESTINATION "${test_folder}")
conan(create "${SOURCE_DIR}" -pr:a "${SOURCE_DIR}/cmake/conan/profile" ${options} -tf "${test_folder}" --build=missing)
