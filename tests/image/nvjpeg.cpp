// tests/image/nvjpeg.cpp: written by the issue-33 work (placeholder until then).
#include "testing.hpp"
