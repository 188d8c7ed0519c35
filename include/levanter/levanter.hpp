// levanter/levanter.hpp: the umbrella header of the training framework. It brings in haliax; the framework's
// subsystems (config, data, checkpoint, optim, models, trainer, tracker) are added here as they land.
#pragma once

#include <haliax/haliax.hpp>
#include <haliax/tree.hpp>

namespace levanter {

/// Version of the levanter library (matches the CMake project version).
inline constexpr const char* version = "0.1.0";

}  // namespace levanter
