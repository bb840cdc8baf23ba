// _torch_allocator: torch's CPU allocator served by normgrad's caching pool.
//
// A training step allocates its activations and gradients afresh every step.
// Through glibc, each block above the mmap threshold is a new mapping whose
// pages fault in again (on a VM about 10 us per 4 KiB), and blocks below it
// stay in a heap whose holes hold the step's high-water mark and more. With
// this allocator installed, torch's CPU tensors of kPoolMinBytes or more come
// from the same pool as normgrad's outputs: reused from step to step, held
// only within the most the pool has had in use at once (its kPeak policy),
// and mapped 2 MiB at a time when new. Smaller tensors keep malloc.
//
// c10::SetCPUAllocator swaps the allocator for tensors made afterwards; each
// tensor keeps the deleter it was made with, so tensors from either
// allocator can be freed at any time after a swap. Built only where c10's
// headers (libtorch-dev) are installed.
#include <cstdlib>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/api/include/torch/version.h>

#include <normgrad/backends/caching_allocator.hpp>

namespace {

namespace py = pybind11;

// Below this, malloc's arenas serve small tensors well and a pool block of
// 4 KiB or more would waste most of itself.
constexpr size_t kPoolMinBytes = size_t{256} << 10;
// Above the default CPU allocator's (0): SetCPUAllocator takes an allocator
// of equal or higher priority than the one in place.
constexpr uint8_t kPriority = 100;

void release_pooled(void* p) {
  normgrad::default_caching_allocator().deallocate(p);
}

void release_small(void* p) {
  std::free(p);
}

// Any block this allocator made, for raw_deallocate, which hands over only
// the pointer: the pool's go back to the pool, the rest to free. Tensors
// carry the deleter of their own kind, so a small tensor's free never takes
// the pool's lock.
void release_any(void* p) {
  if (!normgrad::default_caching_allocator().try_deallocate(p)) std::free(p);
}

struct PoolAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) const override {
    void* p = nullptr;
    const bool pooled = n >= kPoolMinBytes;
    if (pooled) {
      p = normgrad::default_caching_allocator().allocate(n, 64);
    } else if (posix_memalign(&p, 64, n == 0 ? 64 : n) != 0) {
      p = nullptr;
    }
    TORCH_CHECK(p != nullptr, "normgrad's pool allocator: out of memory for ", n, " bytes");
    return {p, p, pooled ? &release_pooled : &release_small, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_any; }
};

PoolAllocator g_pool_allocator;
bool g_installed = false;

}  // namespace

PYBIND11_MODULE(_torch_allocator, m) {
  m.doc() = "torch's CPU allocator served by normgrad's caching pool";
  m.attr("TORCH_VERSION") =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  m.attr("POOL_MIN_BYTES") = kPoolMinBytes;
  m.def(
      "set_installed",
      [](bool on) {
        c10::SetCPUAllocator(
            on ? static_cast<c10::Allocator*>(&g_pool_allocator) : c10::GetDefaultCPUAllocator(),
            kPriority);
        g_installed = on;
      },
      py::arg("on"));
  m.def("installed", [] { return g_installed; });
}
