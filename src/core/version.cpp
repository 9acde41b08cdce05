#include "tpdecode/version.hpp"

namespace tpdecode {

const char* version() { return TPDECODE_VERSION_STRING; }

}  // namespace tpdecode
