// Compiled by check_include.cmake in the include context of one layer with
// QKV_PROBE_HEADER set to a header of that layer, of a layer below, or of a layer
// above (which must be "No such file": docs/architecture.md).
#include QKV_PROBE_HEADER

int main() { return 0; }
