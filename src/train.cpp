// Nitro's compiled library: the non-template code of train/, optim/ and graph/.
#include <nitro/graph/capture-inl.hpp>
#include <nitro/optim/fused-inl.hpp>
#include <nitro/optim/groups-inl.hpp>
#include <nitro/train/accumulate-inl.hpp>
#include <nitro/train/amp-inl.hpp>
#include <nitro/train/autotune-inl.hpp>
#include <nitro/train/channels_last-inl.hpp>
#include <nitro/train/checkpoint-inl.hpp>
#include <nitro/train/clip-inl.hpp>
#include <nitro/train/ema-inl.hpp>
#include <nitro/train/stability-inl.hpp>
#include <nitro/train/training_loop-inl.hpp>

#include <nitro/graph/capture.hpp>
#include <nitro/train/levels.hpp>

// The predefined levels, compiled once here (their headers declare them extern with NITRO_COMPILED).
NITRO_DETAIL_LOOP_MEMBERS(template, nitro::level::Basic);
NITRO_DETAIL_LOOP_MEMBERS(template, nitro::level::Advanced);
NITRO_DETAIL_LOOP_MEMBERS(template, nitro::level::Ultra);
#if NITRO_WITH_CUDA  // graph::Capture needs CUDA
NITRO_DETAIL_LOOP_MEMBERS(template, nitro::level::Max);
#endif
