// Precompiled once, reused by every test executable.
#pragma once
#include "testing.hpp"
