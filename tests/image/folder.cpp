// tests/image/folder.cpp: written by the issue-33 work (placeholder until then).
#include "testing.hpp"
