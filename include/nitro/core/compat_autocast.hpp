#pragma once
// The autocast part of core/compat.hpp (kept apart because <ATen/autocast_mode.h> is as heavy as
// <ATen/ATen.h>): the device-agnostic at::autocast API of LibTorch 2.4 and newer.
#include <nitro/core/config.hpp>
#include <nitro/core/compat.hpp>

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace nitro::compat {

// ---- autocast ---------------------------------------------------------------------------------------

/// Whether LibTorch can autocast on this device type at all.
inline bool autocast_available(c10::DeviceType device) { return at::autocast::is_autocast_available(device); }
/// Whether autocast is on for this device type in this thread.
inline bool autocast_enabled(c10::DeviceType device) { return at::autocast::is_autocast_enabled(device); }
/// Turns autocast on or off for this device type in this thread.
inline void set_autocast_enabled(c10::DeviceType device, bool on) { at::autocast::set_autocast_enabled(device, on); }
/// The dtype autocast casts to on this device type.
inline c10::ScalarType autocast_dtype(c10::DeviceType device) { return at::autocast::get_autocast_dtype(device); }
/// Sets the dtype autocast casts to on this device type.
NITRO_INLINE void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype);
/// Nesting depth bookkeeping: the outermost autocast region clears the cast cache on exit.
inline int autocast_increment_nesting() { return at::autocast::increment_nesting(); }
/// Leaves an autocast region; returns the depth left (0: the outermost region ended).
inline int autocast_decrement_nesting() { return at::autocast::decrement_nesting(); }
/// Drops the cached casts of weights (call when the outermost region ends).
inline void autocast_clear_cache() { at::autocast::clear_cache(); }

}  // namespace nitro::compat

#if !NITRO_COMPILED
#include <nitro/core/compat_autocast-inl.hpp>
#endif
