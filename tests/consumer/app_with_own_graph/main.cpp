// An application with its own "graph/status.hpp" on its include path, next to
// an installed normgrad: both headers coexist because normgrad's are included
// as <normgrad/...> everywhere.
#include <cstdio>

#include <normgrad/normgrad.hpp>
#include "graph/status.hpp"

int main() {
  app::Status mine;
  normgrad::Status theirs = normgrad::ok_status();
  if (mine.code != 0 || !theirs.ok()) return 1;
  std::printf("consumer ok: an app's own graph/status.hpp and normgrad %s\n",
              normgrad::version_string());
  return 0;
}
