// haliax/haliax.hpp: the umbrella header. `#include <haliax/haliax.hpp>` gives the whole library.
#pragma once

#include "axis.hpp"
#include "bf16.hpp"
#include "core.hpp"
#include "ops/elementwise.hpp"
