// The translation unit that builds the tests' precompiled header (haliax and doctest, parsed once for every
// test program; see tests/CMakeLists.txt). It has no code of its own.
