# Finds what nitro::nitro links. `make` runs cmake/deps.sh first, which finds or installs these and
# hands their location to CMake; a plain `cmake` configure needs CMAKE_PREFIX_PATH (or Torch_DIR) to
# reach a LibTorch, e.g. python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'.
if(NOT TARGET torch)
  # TorchConfig looks for the CUDA toolkit of a CUDA build; the machine's standard location is the default.
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  # GLOBAL: with add_subdirectory, the parent project links these targets too.
  find_package(Torch GLOBAL)
  if(NOT Torch_FOUND)
    message(FATAL_ERROR "nitro: LibTorch not found. Run 'make test' (it installs it), or pass "
                        "-DCMAKE_PREFIX_PATH=\"$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')\"")
  endif()
endif()
if(NOT TARGET Microsoft.GSL::GSL)
  find_package(Microsoft.GSL GLOBAL)
  if(NOT Microsoft.GSL_FOUND)
    message(FATAL_ERROR "nitro: Microsoft GSL not found; run: sudo apt-get install -y libmsgsl-dev")
  endif()
endif()
file(READ "${CMAKE_CURRENT_LIST_DIR}/torch-version" NITRO_TESTED_TORCH_VERSION)
string(STRIP "${NITRO_TESTED_TORCH_VERSION}" NITRO_TESTED_TORCH_VERSION)
if(Torch_VERSION AND NOT Torch_VERSION VERSION_EQUAL NITRO_TESTED_TORCH_VERSION)
  message(STATUS "nitro: LibTorch ${Torch_VERSION}; Nitro is tested on ${NITRO_TESTED_TORCH_VERSION}")
endif()
