// Version accessors: report the version the library was built with.
#include <normgrad/graph/version.hpp>

namespace normgrad {

const char* version_string() {
  return NORMGRAD_VERSION_STRING;
}
int version_major() {
  return NORMGRAD_VERSION_MAJOR;
}
int version_minor() {
  return NORMGRAD_VERSION_MINOR;
}
int version_patch() {
  return NORMGRAD_VERSION_PATCH;
}

}  // namespace normgrad
