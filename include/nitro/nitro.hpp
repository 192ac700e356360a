#pragma once
// Nitro's headers that need nothing beyond LibTorch and GSL. Included by name instead: nitro/dist/*
// (link nitro::dist), the image decoders data/image.hpp, image_folder.hpp, packed.hpp, nvjpeg.hpp (link
// nitro::image), and, for their compile time, data/augment.hpp, train/autotune.hpp, monitor/trace.hpp
// and infer/compiled.hpp. graph/capture.hpp is here: using graph::Capture or level::Max (not including
// it) is a compile-time error on a LibTorch without CUDA. For faster builds include only the headers you use.
#include <nitro/version.hpp>

#include <nitro/core/compat.hpp>
#include <nitro/core/compat_autocast.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/core/step_result.hpp>

#include <nitro/hw/settings.hpp>

#include <nitro/graph/capture.hpp>
#include <nitro/io/file.hpp>
#include <nitro/snapshot/policy.hpp>
#include <nitro/snapshot/snapshot.hpp>

#include <nitro/memory/batch_size.hpp>
#include <nitro/memory/monitor.hpp>
#include <nitro/memory/oom.hpp>
#include <nitro/memory/nvml.hpp>
#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/memory/watch.hpp>

#include <nitro/optim/fused.hpp>
#include <nitro/optim/fused_step.hpp>
#include <nitro/optim/groups.hpp>

#include <nitro/train/accumulate.hpp>
#include <nitro/train/amp.hpp>
#include <nitro/train/channels_last.hpp>
#include <nitro/train/checkpoint.hpp>
#include <nitro/train/clip.hpp>
#include <nitro/train/ema.hpp>
#include <nitro/train/hooks.hpp>
#include <nitro/train/levels.hpp>
#include <nitro/train/stability.hpp>
#include <nitro/train/training_loop.hpp>

#include <nitro/cache/cache.hpp>
#include <nitro/cache/cached_dataset.hpp>
#include <nitro/cache/disk_tier.hpp>
#include <nitro/cache/evict/clairvoyant.hpp>
#include <nitro/cache/evict/fifo.hpp>
#include <nitro/cache/evict/lfu.hpp>
#include <nitro/cache/evict/lru.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/cache/evict/s3fifo.hpp>
#include <nitro/cache/evict/sieve.hpp>
#include <nitro/cache/evict/wtinylfu.hpp>

#include <nitro/data/pinned_pool.hpp>
#include <nitro/data/pipeline.hpp>
// data/augment.hpp is left out here (it includes <ATen/ATen.h>): include it where images are augmented.
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/record_file.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/stage_stats.hpp>
#include <nitro/data/source.hpp>
#include <nitro/data/synthetic.hpp>

#include <nitro/monitor/phases.hpp>
#include <nitro/monitor/progress.hpp>
#include <nitro/monitor/report.hpp>
#include <nitro/monitor/sinks.hpp>
#include <nitro/monitor/tensorboard.hpp>
// monitor/trace.hpp is left out here (it includes LibTorch's profiler): include it where a run is traced.

// Serving: infer/compiled.hpp (AOTInductor packages, TorchScript files) is left out here: it pulls in
// the JIT's headers; include it where a compiled model is loaded.
#include <nitro/infer/batcher.hpp>
#include <nitro/infer/fold.hpp>
#include <nitro/infer/model.hpp>
#include <nitro/infer/quantize.hpp>
#include <nitro/infer/runner.hpp>
