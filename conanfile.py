"""Conan 2 recipe: Nitro header-only (the default), or with its compiled library (-o "nitro/*:compiled=True").

LibTorch is the user's own (find_package(Torch) in the consuming project, and, to build the compiled
library, CMAKE_PREFIX_PATH pointing at it when `conan create` runs); Microsoft GSL is a regular
requirement that a profile may satisfy from the system, as cmake/conan/profile does:

    conan create . -pr:a cmake/conan/profile -tf tests/conan_package
    CMAKE_PREFIX_PATH="$(cmake/deps.sh --print-prefix)" \\
        conan create . -pr:a cmake/conan/profile -o "nitro/*:compiled=True" -tf tests/conan_package

Header-only, the package's target is nitro::nitro. With compiled=True the package carries Nitro's own
CMake package (find_package(nitro) gives nitro::nitro, nitro::compiled, nitro::compiled_dist and
nitro::compiled_image, as an install does).
"""
import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class NitroConan(ConanFile):
    name = "nitro"
    description = "C++20 toolkit for fast, memory-lean LibTorch training: header-only, or with a compiled library"
    license = "MIT"
    topics = ("libtorch", "pytorch", "deep-learning", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"compiled": [True, False]}
    default_options = {"compiled": False}
    exports_sources = "include/*", "src/*", "cmake/*", "CMakeLists.txt", "LICENSE"

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "include", "nitro", "version.hpp"))
        parts = [re.search(rf"#define NITRO_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def configure(self):
        if self.options.compiled:
            self.package_type = "static-library"

    def layout(self):
        if self.options.compiled:
            cmake_layout(self, src_folder=".")
        else:
            basic_layout(self, src_folder=".")

    def requirements(self):
        self.requires("ms-gsl/[>=4.0 <5]")

    def validate(self):
        check_min_cppstd(self, 20)

    def generate(self):
        if not self.options.compiled:
            return
        toolchain = CMakeToolchain(self)
        for option in ("NITRO_BUILD_TESTS", "NITRO_BUILD_EXAMPLES", "NITRO_BUILD_BENCH"):
            toolchain.cache_variables[option] = False
        toolchain.cache_variables["NITRO_INSTALL"] = True
        # LibTorch's CMake package enables CUDA with CMAKE_CUDA_STANDARD = CMAKE_CXX_STANDARD (20, from the
        # profile), which CMake 3.25 cannot give nvcc; Nitro compiles no CUDA code of its own.
        toolchain.cache_variables["CMAKE_CUDA_STANDARD"] = "17"
        toolchain.generate()
        CMakeDeps(self).generate()

    def build(self):
        if self.options.compiled:
            cmake = CMake(self)
            cmake.configure()
            cmake.build()

    def package_id(self):
        if not self.info.options.compiled:
            self.info.clear()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        if self.options.compiled:
            CMake(self).install()
        else:
            copy(self, "*.hpp", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))

    def package_info(self):
        if self.options.compiled:
            # Nitro's own CMake package (lib/cmake/nitro): its targets know the library, the CUDA
            # definition and the dependencies it was built with.
            self.cpp_info.set_property("cmake_find_mode", "none")
            self.cpp_info.builddirs = [os.path.join("lib", "cmake", "nitro")]
            self.cpp_info.libs = ["nitro_compiled"]
            self.cpp_info.defines = ["NITRO_COMPILED=1"]
        else:
            self.cpp_info.bindirs = []
            self.cpp_info.libdirs = []
            self.cpp_info.set_property("cmake_file_name", "nitro")
            self.cpp_info.set_property("cmake_target_name", "nitro::nitro")
