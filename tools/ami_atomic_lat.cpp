// ami_atomic_lat — perftest-like measurement; everything lives in the harness.
#include "harness/harness.hpp"

int main(int argc, char** argv) { return ami::tools::run(argc, argv, ami::tools::Test::atomic_lat); }
