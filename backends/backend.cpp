// The list of built-in backends, assembled explicitly in one place.
#include <normgrad/backends/backend_registry.hpp>

#include <algorithm>
#include <atomic>
#include <thread>

namespace normgrad {

const std::vector<const Backend*>& available_backends() {
  static const std::vector<const Backend*> backends = [] {
    std::vector<const Backend*> v;
#ifdef NORMGRAD_WITH_JIT
    v.push_back(jit_backend());
#endif
#ifdef NORMGRAD_WITH_DNNL
    v.push_back(dnnl_backend());
#endif
    v.push_back(ref_backend());
    return v;
  }();
  return backends;
}

const std::vector<std::string>& known_backend_names() {
  static const std::vector<std::string> names = {"auto", "jit", "dnnl", "ref"};
  return names;
}

const Backend* find_backend(const std::string& name) {
  for (const Backend* b : available_backends()) {
    if (name == b->name()) return b;
  }
  return nullptr;
}

namespace {
std::atomic<int>& thread_cap() {
  static std::atomic<int> cap{0};
  return cap;
}
}  // namespace

void set_num_threads(int n) {
  n = std::max(0, n);
  thread_cap().store(n);
#ifdef NORMGRAD_WITH_DNNL
  // OpenMP has no "unlimited": 0 gives it back every core.
  set_dnnl_threads(n > 0 ? n : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
#endif
}

int num_threads() { return thread_cap().load(); }

void set_backend_threads(int n) { set_num_threads(n); }

}  // namespace normgrad
