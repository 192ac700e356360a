// Nitro's compiled library: the non-template code of snapshot/.
#include <nitro/snapshot/policy-inl.hpp>
#include <nitro/snapshot/snapshot-inl.hpp>
