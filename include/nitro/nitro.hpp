#pragma once
// Everything Nitro offers. For faster builds include only the headers you use.
#include <nitro/version.hpp>

#include <nitro/core/compat.hpp>
#include <nitro/core/compat_autocast.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>

#include <nitro/hw/settings.hpp>

#include <nitro/memory/tracking_allocator.hpp>

#include <nitro/train/accumulate.hpp>
#include <nitro/train/amp.hpp>
#include <nitro/train/checkpoint.hpp>
#include <nitro/train/clip.hpp>
#include <nitro/train/levels.hpp>
#include <nitro/train/training_loop.hpp>

#include <nitro/data/synthetic.hpp>
