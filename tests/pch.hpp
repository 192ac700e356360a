// Precompiled once, reused by every test executable: the heavy LibTorch and doctest headers.
#pragma once
#include <doctest/doctest.h>
#include <torch/torch.h>
