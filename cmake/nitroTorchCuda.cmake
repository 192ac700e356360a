# Decides NITRO_WITH_CUDA for a target from the Torch package in scope: 1 when that LibTorch was built
# with CUDA (it ships c10_cuda), else 0. Used by the build tree and by the installed nitroConfig.cmake,
# so the consumer's own Torch decides. Headers copied without CMake infer it (core/config.hpp).
# nitro_set_cuda_definition(<target> [BUILD_INTERFACE]): BUILD_INTERFACE keeps it out of the export.
function(nitro_set_cuda_definition target)
  if(TARGET c10_cuda OR TORCH_CUDA_LIBRARIES OR C10_CUDA_LIBRARY)
    set(with_cuda 1)
  else()
    set(with_cuda 0)
  endif()
  set(definition NITRO_WITH_CUDA=${with_cuda})
  if(ARGV1 STREQUAL "BUILD_INTERFACE")
    set(definition "$<BUILD_INTERFACE:${definition}>")
  endif()
  set_property(TARGET ${target} APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS "${definition}")
  set(NITRO_WITH_CUDA ${with_cuda} PARENT_SCOPE)
endfunction()
