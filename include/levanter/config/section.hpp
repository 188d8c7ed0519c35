// levanter/config/section.hpp: compile a config section's YAML machinery once. The schema-driven templates of
// config/yaml.hpp and config/cli.hpp (decode, encode, --help) are instantiated for a section struct wherever a
// config containing it is read; a large section (the trainer's 40-odd keys) then costs every program's driver tens of
// seconds of compile time. A section header declares them extern, its .cpp instantiates them:
//
//   LEVANTER_CONFIG_SECTION_EXTERN(levanter::TrainerConfig)        // in trainer/config.hpp, at global scope
//   LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::TrainerConfig)   // in src/trainer/config.cpp, at global scope
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <levanter/config/cli.hpp>
#include <levanter/config/yaml.hpp>

#define LEVANTER_CONFIG_SECTION_FUNCTIONS_(PREFIX, S)                                                              \
  PREFIX template void levanter::config::detail::decode_struct<S>(const YAML::Node&, S&, const std::string&,       \
                                                                  levanter::config::decode_context&,       \
                                                                  std::string_view, std::vector<std::string>);     \
  PREFIX template YAML::Node levanter::config::encode<S>(const S&);                                               \
  PREFIX template void levanter::config::detail::help_struct<S>(const S&, const std::string&, std::string&,        \
                                                                const std::string&);

/// In a section's header: the section's decode/encode/help are compiled elsewhere (once).
#define LEVANTER_CONFIG_SECTION_EXTERN(S) LEVANTER_CONFIG_SECTION_FUNCTIONS_(extern, S)
/// In the section's .cpp: compile them here.
#define LEVANTER_CONFIG_SECTION_INSTANTIATE(S) LEVANTER_CONFIG_SECTION_FUNCTIONS_(, S)
