// haliax/haliax.hpp: the umbrella header. `#include <haliax/haliax.hpp>` gives the whole library.
#pragma once

#include "axis.hpp"
#include "bf16.hpp"
#include "core.hpp"
#include "ops/elementwise.hpp"
#include "ops/reduction.hpp"
#include "ops/dot.hpp"
#include "ops/layout.hpp"
#include "ops/indexing.hpp"
#include "random.hpp"
#include "nn/functions.hpp"
