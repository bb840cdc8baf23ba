// The list of built-in backends, assembled explicitly in one place.
#include <normgrad/backends/backend_registry.hpp>

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

void set_backend_threads(int n) {
#ifdef NORMGRAD_WITH_DNNL
  set_dnnl_threads(n);
#endif
  (void)n;
}

}  // namespace normgrad
