// Roofline probe, cache flush and the oneDNN blocked-layout column.
#include "tools/bench_probe.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include <tbb/parallel_for.h>

#ifdef NORMGRAD_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace normgrad {
namespace cli {
namespace {

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Array = std::unique_ptr<float, AlignedFree>;

Array make_array(int64_t n) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
  return Array(p);
}

// c = a + b over [begin, end) with non-temporal stores; 64-byte aligned chunks.
__attribute__((target("avx"))) void add_stream(const float* a, const float* b, float* c,
                                               int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 8) {
    _mm256_stream_ps(c + i, _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i)));
  }
}

}  // namespace

double measure_stream_gbps(int64_t floats_per_array, int reps) {
  const int64_t n = floats_per_array / 1024 * 1024;
  Array a = make_array(n), b = make_array(n), c = make_array(n);
  tbb::parallel_for(int64_t{0}, n / 1024, [&](int64_t k) {
    for (int64_t i = k * 1024; i < (k + 1) * 1024; ++i)
      a.get()[i] = 1.f, b.get()[i] = 2.f, c.get()[i] = 0.f;
  });
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tbb::parallel_for(int64_t{0}, n / 1024, [&](int64_t k) {
      add_stream(a.get(), b.get(), c.get(), k * 1024, (k + 1) * 1024);
    });
    _mm_sfence();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 3.0 * static_cast<double>(n) * 4.0 / s / 1e9);
  }
  return best;
}

void flush_caches(int64_t bytes) {
  static std::vector<char> junk;
  junk.resize(static_cast<size_t>(bytes));
  for (size_t i = 0; i < junk.size(); i += 64) junk[i] = static_cast<char>(junk[i] + 1);
}

#ifdef NORMGRAD_WITH_DNNL
namespace {

class DnnlBlockedRunner final : public BlockedRunner {
 public:
  DnnlBlockedRunner(int64_t n, int64_t c, int64_t h, int64_t w, DataType dt)
      : eng_(dnnl::engine::kind::cpu, 0), s_(eng_) {
    using namespace dnnl;
    const auto ddt = dt == DataType::kF32 ? memory::data_type::f32 : memory::data_type::bf16;
    const memory::desc md({n, c, h, w}, ddt, memory::format_tag::nChw16c);
    const auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    batch_normalization_forward::primitive_desc fwd(
        batch_normalization_forward::desc(prop_kind::forward_training, md, 1e-5f, flags), eng_);
    batch_normalization_backward::primitive_desc pd(
        batch_normalization_backward::desc(prop_kind::backward, md, md, 1e-5f, flags), eng_, fwd);
    prim_ = batch_normalization_backward(pd);
    impl_ = pd.impl_info_str();
    const memory::desc cmd({c}, memory::data_type::f32, memory::format_tag::a);
    auto make = [&](const memory::desc& d, float v) {
      memory m(d, eng_);
      auto* p = static_cast<char*>(m.get_data_handle());
      std::fill(p, p + d.get_size(), static_cast<char>(0));
      if (d.data_type() == memory::data_type::f32) {
        std::fill(static_cast<float*>(m.get_data_handle()),
                  static_cast<float*>(m.get_data_handle()) + d.get_size() / 4, v);
      }
      return m;
    };
    args_ = {{DNNL_ARG_SRC, make(md, 0.5f)},       {DNNL_ARG_DIFF_DST, make(md, 0.25f)},
             {DNNL_ARG_MEAN, make(cmd, 0.5f)},     {DNNL_ARG_VARIANCE, make(cmd, 1.f)},
             {DNNL_ARG_SCALE, make(cmd, 1.f)},     {DNNL_ARG_SHIFT, make(cmd, 0.f)},
             {DNNL_ARG_DIFF_SRC, make(md, 0.f)},   {DNNL_ARG_DIFF_SCALE, make(cmd, 0.f)},
             {DNNL_ARG_DIFF_SHIFT, make(cmd, 0.f)}};
  }
  double run_once() override {
    const auto t0 = std::chrono::steady_clock::now();
    prim_.execute(s_, args_);
    s_.wait();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string impl() const override { return impl_; }

 private:
  dnnl::engine eng_;
  dnnl::stream s_;
  dnnl::batch_normalization_backward prim_;
  std::unordered_map<int, dnnl::memory> args_;
  std::string impl_;
};

}  // namespace
#endif

StatusOr<std::unique_ptr<BlockedRunner>> BlockedRunner::make(int64_t n, int64_t c, int64_t h,
                                                             int64_t w, DataType dt) {
#ifdef NORMGRAD_WITH_DNNL
  if (dt != DataType::kF32 && dt != DataType::kBF16)
    return unimplemented("oneDNN 2.6 has no f16 batch normalization on CPU");
  try {
    return std::unique_ptr<BlockedRunner>(std::make_unique<DnnlBlockedRunner>(n, c, h, w, dt));
  } catch (const std::exception& e) {
    return unimplemented(std::string("oneDNN blocked: ") + e.what());
  }
#else
  (void)n, (void)c, (void)h, (void)w, (void)dt;
  return unimplemented("built without oneDNN");
#endif
}

}  // namespace cli
}  // namespace normgrad
