// The translation unit that builds the precompiled header every test executable reuses (main.cpp
// cannot: it must see doctest's implementation, which the precompiled doctest.h would hide).
#include "testing.hpp"
