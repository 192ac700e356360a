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

add_test(NAME package.find_package
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/find_package
                 --build-generator ${CMAKE_GENERATOR} --build-noclean
                 --build-options ${consumer_options} -DNITRO_CONSUME=find_package
                                 "-DCMAKE_PREFIX_PATH=${pkg}/prefix;${CMAKE_PREFIX_PATH}"
                 --test-command nitro_consumer)
set_tests_properties(package.find_package PROPERTIES FIXTURES_REQUIRED nitro_installed LABELS package
                     PASS_REGULAR_EXPRESSION "nitro consumer ok")

add_test(NAME package.add_subdirectory
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/add_subdirectory
                 --build-generator ${CMAKE_GENERATOR} --build-noclean
                 --build-options ${consumer_options} -DNITRO_CONSUME=add_subdirectory
                                 -DNITRO_SOURCE_DIR=${PROJECT_SOURCE_DIR} "-DCMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH}"
                 --test-command nitro_consumer)
set_tests_properties(package.add_subdirectory PROPERTIES LABELS package PASS_REGULAR_EXPRESSION "nitro consumer ok")

# The headers copied into a project (no Nitro CMake); and the same with the compiled library: found
# installed, built by add_subdirectory, and compiled from its sources by the consumer's own project
# (as a project that copies include/ and src/ does).
add_test(NAME package.find_package_compiled
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/find_package_compiled
                 --build-generator ${CMAKE_GENERATOR} --build-noclean
                 --build-options ${consumer_options} -DNITRO_CONSUME=find_package -DNITRO_CONSUME_COMPILED=ON
                                 "-DCMAKE_PREFIX_PATH=${pkg}/prefix;${CMAKE_PREFIX_PATH}"
                 --test-command nitro_consumer)
set_tests_properties(package.find_package_compiled PROPERTIES FIXTURES_REQUIRED nitro_installed LABELS package
                     PASS_REGULAR_EXPRESSION "nitro consumer ok: .*compiled library")
add_test(NAME package.add_subdirectory_compiled
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/add_subdirectory_compiled
                 --build-generator ${CMAKE_GENERATOR} --build-noclean
                 --build-options ${consumer_options} -DNITRO_CONSUME=add_subdirectory -DNITRO_CONSUME_COMPILED=ON
                                 -DNITRO_SOURCE_DIR=${PROJECT_SOURCE_DIR} "-DCMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH}"
                 --test-command nitro_consumer)
set_tests_properties(package.add_subdirectory_compiled PROPERTIES LABELS package
                     PASS_REGULAR_EXPRESSION "nitro consumer ok: .*compiled library")
add_test(NAME package.copied
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/copied
                 --build-generator ${CMAKE_GENERATOR} --build-noclean
                 --build-options ${consumer_options} -DNITRO_CONSUME=copy -DNITRO_COPY_DIR=${PROJECT_SOURCE_DIR}
                                 "-DCMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH}"
                 --test-command nitro_consumer)
set_tests_properties(package.copied PROPERTIES LABELS package PASS_REGULAR_EXPRESSION "nitro consumer ok: .*header-only")
add_test(NAME package.copied_compiled
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${CMAKE_CURRENT_SOURCE_DIR}/package ${pkg}/copied_compiled
                 --build-generator ${CMAKE_GENERATOR} --build-noclean
                 --build-options ${consumer_options} -DNITRO_CONSUME=copy -DNITRO_CONSUME_COMPILED=ON
                                 -DNITRO_COPY_DIR=${PROJECT_SOURCE_DIR}
                                 "-DCMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH}"
                 --test-command nitro_consumer)
set_tests_properties(package.copied_compiled PROPERTIES LABELS package
                     PASS_REGULAR_EXPRESSION "nitro consumer ok: .*compiled library")

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
