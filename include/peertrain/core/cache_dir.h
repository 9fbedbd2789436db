// Where peertrain keeps what it can compute again but would rather not: measured profiles,
// trained tokenizers, decompressed data sets. One place, so that one setting moves them all.
#pragma once

#include <string>

namespace peertrain {

// $XDG_CACHE_HOME/peertrain, else $HOME/.cache/peertrain; "" when neither is set.
std::string user_cache_dir();

}  // namespace peertrain
