// Nitro's compiled library: the non-template code of infer/.
#include <nitro/infer/batcher-inl.hpp>
#include <nitro/infer/compiled-inl.hpp>
#include <nitro/infer/fold-inl.hpp>
#include <nitro/infer/quantize-inl.hpp>
