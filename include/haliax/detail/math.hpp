// Math functions usable inside Kokkos kernels on every backend (Kokkos 3 keeps them in Experimental).
#pragma once

#include <Kokkos_Core.hpp>

namespace haliax::detail::math {
#if KOKKOS_VERSION >= 40000
using Kokkos::acos;
using Kokkos::asin;
using Kokkos::atan;
using Kokkos::atan2;
using Kokkos::ceil;
using Kokkos::cos;
using Kokkos::cosh;
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::expm1;
using Kokkos::fabs;
using Kokkos::floor;
using Kokkos::fmod;
using Kokkos::isfinite;
using Kokkos::isinf;
using Kokkos::isnan;
using Kokkos::log;
using Kokkos::log10;
using Kokkos::log1p;
using Kokkos::log2;
using Kokkos::nearbyint;
using Kokkos::pow;
using Kokkos::sin;
using Kokkos::sinh;
using Kokkos::sqrt;
using Kokkos::tan;
using Kokkos::tanh;
using Kokkos::trunc;
#else
using Kokkos::Experimental::acos;
using Kokkos::Experimental::asin;
using Kokkos::Experimental::atan;
using Kokkos::Experimental::atan2;
using Kokkos::Experimental::ceil;
using Kokkos::Experimental::cos;
using Kokkos::Experimental::cosh;
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::expm1;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::floor;
using Kokkos::Experimental::fmod;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::isinf;
using Kokkos::Experimental::isnan;
using Kokkos::Experimental::log;
using Kokkos::Experimental::log10;
using Kokkos::Experimental::log1p;
using Kokkos::Experimental::log2;
using Kokkos::Experimental::nearbyint;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::sinh;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tan;
using Kokkos::Experimental::tanh;
using Kokkos::Experimental::trunc;
#endif
}  // namespace haliax::detail::math
