// Test runner: doctest with Kokkos initialised for the whole run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <haliax/core.hpp>

int main(int argc, char** argv) {
  haliax::runtime rt(argc, argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
