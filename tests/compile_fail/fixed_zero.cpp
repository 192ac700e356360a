// expect: accumulate::Fixed<N>: N is the number of micro-batches per optimizer step and must be >= 1
#include <nitro/train/accumulate.hpp>

int main() { return static_cast<int>(nitro::accumulate::Fixed<0>::steps({})); }
