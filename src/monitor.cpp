// Nitro's compiled library: the non-template code of monitor/.
#include <nitro/monitor/phases-inl.hpp>
#include <nitro/monitor/progress-inl.hpp>
#include <nitro/monitor/report-inl.hpp>
#include <nitro/monitor/sinks-inl.hpp>
#include <nitro/monitor/tensorboard-inl.hpp>
#include <nitro/monitor/trace-inl.hpp>
