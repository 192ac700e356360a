// Nitro's compiled library for several processes (nitro::compiled_dist): the non-template code of dist/.
#include <nitro/dist/data_parallel-inl.hpp>
#include <nitro/dist/process_group-inl.hpp>
#include <nitro/dist/sampler-inl.hpp>
#include <nitro/dist/snapshot-inl.hpp>

extern "C" int nitro_compiled_dist_library_is_not_linked__link_nitro_compiled_dist() noexcept { return 0; }
