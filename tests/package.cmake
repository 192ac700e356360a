# Packaging tests: a consumer project (tests/package/) configured, built and run by CTest twice,
# once with find_package(nitro) against a fresh install, once with add_subdirectory; and, where
# cmake/deps.sh provided Conan, `conan create` of the package, offline, header-only and with the
# compiled library.
set(pkg ${CMAKE_BINARY_DIR}/package)
# The consumers are built without optimisation or debug information (an empty build type): they check
# that a project configures, compiles, links and runs, and half the time goes to the compiled
# library's own build in the add_subdirectory and copied cases.
set(consumer_options "-DCMAKE_BUILD_TYPE=" -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER})

add_test(NAME package.install COMMAND ${CMAKE_COMMAND} --install ${CMAKE_BINARY_DIR} --prefix ${pkg}/prefix)
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP nitro_installed LABELS package)

# One consumer build: package.<name>, configured with the given options and CMAKE_PREFIX_PATH=PREFIX
# (a list: read with PARSE_ARGV, which keeps it one argument), built, run, and its output matched
# against `expect`; INSTALLED when it needs the fresh install.
function(nitro_consumer_test name expect)
  cmake_parse_arguments(PARSE_ARGV 2 arg "INSTALLED" "PREFIX" "")
  add_test(NAME package.${name}
           COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/${name}
                   --build-generator ${CMAKE_GENERATOR} --build-noclean
                   --build-options ${consumer_options} ${arg_UNPARSED_ARGUMENTS} "-DCMAKE_PREFIX_PATH=${arg_PREFIX}"
                   --test-command nitro_consumer)
  set_tests_properties(package.${name} PROPERTIES LABELS package PASS_REGULAR_EXPRESSION "${expect}")
  if(arg_INSTALLED)
    set_tests_properties(package.${name} PROPERTIES FIXTURES_REQUIRED nitro_installed)
  endif()
endfunction()

# Header-only and with the compiled library: found installed, built by add_subdirectory, and the
# headers (and the library's sources) copied into the project, with no Nitro CMake.
nitro_consumer_test(find_package "nitro consumer ok" INSTALLED
                    -DNITRO_CONSUME=find_package PREFIX "${pkg}/prefix;${CMAKE_PREFIX_PATH}")
nitro_consumer_test(add_subdirectory "nitro consumer ok"
                    -DNITRO_CONSUME=add_subdirectory -DNITRO_SOURCE_DIR=${PROJECT_SOURCE_DIR}
                    PREFIX "${CMAKE_PREFIX_PATH}")
nitro_consumer_test(find_package_compiled "nitro consumer ok: .*compiled library" INSTALLED
                    -DNITRO_CONSUME=find_package -DNITRO_CONSUME_COMPILED=ON
                    PREFIX "${pkg}/prefix;${CMAKE_PREFIX_PATH}")
nitro_consumer_test(add_subdirectory_compiled "nitro consumer ok: .*compiled library"
                    -DNITRO_CONSUME=add_subdirectory -DNITRO_CONSUME_COMPILED=ON
                    -DNITRO_SOURCE_DIR=${PROJECT_SOURCE_DIR} PREFIX "${CMAKE_PREFIX_PATH}")
nitro_consumer_test(copied "nitro consumer ok: .*header-only"
                    -DNITRO_CONSUME=copy -DNITRO_COPY_DIR=${PROJECT_SOURCE_DIR} PREFIX "${CMAKE_PREFIX_PATH}")
nitro_consumer_test(copied_compiled "nitro consumer ok: .*compiled library"
                    -DNITRO_CONSUME=copy -DNITRO_CONSUME_COMPILED=ON -DNITRO_COPY_DIR=${PROJECT_SOURCE_DIR}
                    PREFIX "${CMAKE_PREFIX_PATH}")

if(NITRO_CONAN)
  add_test(NAME package.conan_create
           COMMAND ${CMAKE_COMMAND} -DCONAN=${NITRO_CONAN} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                   -DCONAN_HOME=${pkg}/conan-home -P ${PROJECT_SOURCE_DIR}/cmake/conan_create.cmake)
  set_tests_properties(package.conan_create PROPERTIES LABELS package
                       PASS_REGULAR_EXPRESSION "nitro test_package: version ${PROJECT_VERSION}")
  # The option compiled=True: Conan builds the library (LibTorch from this build's prefix) and the test
  # package trains with it.
  add_test(NAME package.conan_create_compiled
           COMMAND ${CMAKE_COMMAND} -DCONAN=${NITRO_CONAN} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                   -DCONAN_HOME=${pkg}/conan-home-compiled -DCOMPILED=ON "-DTORCH_PREFIX=${CMAKE_PREFIX_PATH}"
                   -P ${PROJECT_SOURCE_DIR}/cmake/conan_create.cmake)
  set_tests_properties(package.conan_create_compiled PROPERTIES LABELS package
                       PASS_REGULAR_EXPRESSION "nitro test_package: compiled library, 2 steps")
endif()

# The examples build stand-alone against the installed package, as a user copying one would.
add_test(NAME package.examples_standalone
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${PROJECT_SOURCE_DIR}/examples ${pkg}/examples
                 --build-generator ${CMAKE_GENERATOR} --build-noclean --build-target quickstart
                 --build-options ${consumer_options} "-DCMAKE_PREFIX_PATH=${pkg}/prefix;${CMAKE_PREFIX_PATH}"
                 --test-command quickstart --epochs 1 --samples 256 --batch 64)
set_tests_properties(package.examples_standalone PROPERTIES FIXTURES_REQUIRED nitro_installed LABELS package
                     PASS_REGULAR_EXPRESSION "test accuracy")

# A LibTorch location that is wrong stops the dependency step with one line saying what to do.
add_test(NAME package.deps_bad_torch_dir
         COMMAND ${CMAKE_COMMAND} -E env Torch_DIR=${CMAKE_BINARY_DIR}/no-such-torch
                 ${PROJECT_SOURCE_DIR}/cmake/deps.sh ${pkg}/deps-bad.cmake)
set_tests_properties(package.deps_bad_torch_dir PROPERTIES LABELS package
                     PASS_REGULAR_EXPRESSION "error: Torch_DIR=.*no-such-torch has no TorchConfig.cmake; point it at")
