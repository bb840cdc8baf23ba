// An application's own graph/status.hpp: normgrad's headers must not pick it up.
#pragma once
namespace app {
struct Status {
  int code = 0;
};
}  // namespace app
