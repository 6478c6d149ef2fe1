#pragma once
// Decks compiled into the executable, so `fsdpp train` runs with nothing but the binary.
#include <string>

namespace fsdpp::app {
std::string embedded_tiny_deck();  // input/tiny.yaml at build time
}
