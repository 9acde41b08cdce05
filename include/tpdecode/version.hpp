// The library's version, as built.
#pragma once

namespace tpdecode {

// e.g. "0.2.0"
const char* version();

}  // namespace tpdecode
