// Resource limits: defaults, environment overrides, API setter.
#include <normgrad/graph/limits.hpp>

#include <cstdlib>
#include <mutex>

namespace normgrad {
namespace {

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return (*end == '\0' && x > 0) ? x : fallback;
}

std::mutex g_mu;
ResourceLimits& current() {
  static ResourceLimits limits = [] {
    ResourceLimits l;
    l.max_tensor_bytes = env_or("NORMGRAD_MAX_TENSOR_BYTES", l.max_tensor_bytes);
    l.max_total_bytes = env_or("NORMGRAD_MAX_TOTAL_BYTES", l.max_total_bytes);
    l.max_ops = env_or("NORMGRAD_MAX_OPS", l.max_ops);
    l.max_json_bytes = env_or("NORMGRAD_MAX_JSON_BYTES", l.max_json_bytes);
    return l;
  }();
  return limits;
}

}  // namespace

const ResourceLimits& resource_limits() {
  std::lock_guard<std::mutex> lock(g_mu);
  return current();
}

void set_resource_limits(const ResourceLimits& limits) {
  std::lock_guard<std::mutex> lock(g_mu);
  current() = limits;
}

}  // namespace normgrad
