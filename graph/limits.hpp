// Resource limits: caps checked before anything is allocated.
//
// Graph files and tensor files come from other tools and other people; a
// hostile or mistaken shape must become an error, not an OOM kill. The
// defaults suit a 24 GiB machine; each can be changed through the API or an
// environment variable (read once, at first use):
//   NORMGRAD_MAX_TENSOR_BYTES  one tensor                  (default 4 GiB)
//   NORMGRAD_MAX_TOTAL_BYTES   all tensors of a graph       (default 16 GiB)
//   NORMGRAD_MAX_OPS           ops in a graph               (default 100000)
//   NORMGRAD_MAX_JSON_BYTES    graph file size              (default 512 MiB)
#pragma once

#include <cstdint>

namespace normgrad {

struct ResourceLimits {
  int64_t max_tensor_bytes = int64_t{4} << 30;
  int64_t max_total_bytes = int64_t{16} << 30;
  int64_t max_ops = 100000;
  int64_t max_json_bytes = int64_t{512} << 20;
};

// The limits in force: the defaults, overridden by the environment, then by set_resource_limits.
const ResourceLimits& resource_limits();
void set_resource_limits(const ResourceLimits& limits);

}  // namespace normgrad
