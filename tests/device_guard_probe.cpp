// The device guard's own check (scripts/check-device-access.sh): `device_guard_probe good` reads an array through
// to_host() and must pass under HALIAX_DEVICE_GUARD=1; `device_guard_probe bad` reads it through data() on the
// host, which a GPU build cannot do, and must be stopped by AddressSanitizer. Without the second, a clean run of
// the check could mean the guard is not working.
#include <cstdio>
#include <cstring>
#include <haliax/haliax.hpp>

namespace hax = haliax;
inline constexpr struct Probe final : hax::axis<"probe"> {
} Probe;

int main(int argc, char** argv) {
  hax::runtime rt(argc, argv);
  if (argc < 2 || (std::strcmp(argv[1], "good") != 0 && std::strcmp(argv[1], "bad") != 0)) {
    std::fprintf(stderr, "usage: device_guard_probe good|bad\n");
    return 2;
  }
  auto x = hax::arange<float>(1000 * Probe) * 2.0f;  // kernels write it
  float v = 0;
  if (std::strcmp(argv[1], "good") == 0) {
    v = x.to_host()[10];
  } else {
    v = x.data()[10];  // a host read of array memory: a GPU build crashes here
  }
  std::printf("element 10 = %g\n", static_cast<double>(v));
  return v == 20.0f ? 0 : 1;
}
