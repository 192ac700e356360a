"""Conan 2 recipe: Nitro as a header-only package.

LibTorch is the user's own (find_package(Torch) in the consuming project); Microsoft GSL is a
regular requirement that a profile may satisfy from the system, as cmake/conan/profile does:

    conan create . -pr:a cmake/conan/profile -tf tests/conan_package
"""
import os
import re

from conan import ConanFile
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class NitroConan(ConanFile):
    name = "nitro"
    description = "Header-only C++20 toolkit for fast, memory-lean LibTorch training"
    license = "MIT"
    topics = ("libtorch", "pytorch", "deep-learning", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    exports_sources = "include/*", "LICENSE"
    no_copy_source = True

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "include", "nitro", "version.hpp"))
        parts = [re.search(rf"#define NITRO_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def layout(self):
        basic_layout(self, src_folder=".")

    def requirements(self):
        self.requires("ms-gsl/[>=4.0 <5]")

    def validate(self):
        check_min_cppstd(self, 20)

    def package_id(self):
        self.info.clear()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_file_name", "nitro")
        self.cpp_info.set_property("cmake_target_name", "nitro::nitro")
