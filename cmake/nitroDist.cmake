# nitro::dist: nitro::nitro plus what include/nitro/dist/ needs besides LibTorch, used by the build tree
# and by the installed nitroConfig.cmake alike:
#   - gloo's headers, for declarations only (dist/process_group.hpp says why): Debian's libgloo-dev
#     headers, found in the usual places or at NITRO_GLOO_INCLUDE_DIR (cmake/deps.sh unpacks them into
#     its cache without installing anything). Never linked: libtorch_cpu carries its own gloo.
#   - nccl.h, for NCCL groups, when LibTorch has CUDA: the PyTorch wheel's nvidia/nccl/include.
# nitro_define_dist(<target>): fills the INTERFACE target <target> (made by the caller).
function(nitro_define_dist target)
  find_path(NITRO_GLOO_INCLUDE_DIR gloo/context.h
            HINTS ${NITRO_GLOO_INCLUDE_DIR} $ENV{NITRO_GLOO_INCLUDE_DIR}
            DOC "gloo's headers (Debian libgloo-dev), declarations only")
  set(gloo 0)
  if(NITRO_GLOO_INCLUDE_DIR AND EXISTS "${NITRO_GLOO_INCLUDE_DIR}/gloo/rendezvous/store.h")
    set(gloo 1)
    target_include_directories(${target} SYSTEM INTERFACE "${NITRO_GLOO_INCLUDE_DIR}")
    target_compile_definitions(${target} INTERFACE USE_C10D_GLOO)
  endif()
  set(nccl 0)
  if(NITRO_WITH_CUDA)
    set(hints)
    if(TORCH_INSTALL_PREFIX)
      list(APPEND hints "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include")
    endif()
    find_path(NITRO_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} DOC "nccl.h (the PyTorch wheel's nvidia/nccl/include)")
    if(NITRO_NCCL_INCLUDE_DIR)
      set(nccl 1)
      target_include_directories(${target} SYSTEM INTERFACE "${NITRO_NCCL_INCLUDE_DIR}")
      target_compile_definitions(${target} INTERFACE USE_C10D_NCCL)
    endif()
  endif()
  target_compile_definitions(${target} INTERFACE NITRO_DIST_GLOO=${gloo} NITRO_DIST_NCCL=${nccl})
  set(NITRO_DIST_GLOO ${gloo} PARENT_SCOPE)
  set(NITRO_DIST_NCCL ${nccl} PARENT_SCOPE)
  message(STATUS "nitro::dist: Gloo ${gloo} (${NITRO_GLOO_INCLUDE_DIR}), NCCL ${nccl}")
endfunction()
