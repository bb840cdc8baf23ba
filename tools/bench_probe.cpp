// Host description, roofline probe, cache flush and the oneDNN nChw16c columns.
#include "tools/bench_probe.hpp"

#include <normgrad/backends/backend.hpp>

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#ifdef NORMGRAD_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace normgrad {
namespace cli {
namespace {

int64_t sysfs_cache_bytes(int level, const char* type) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream lv(dir + "level"), ty(dir + "type"), sz(dir + "size");
    int l = 0;
    std::string t, size;
    if (!(lv >> l) || !(ty >> t) || !(sz >> size)) continue;
    if (l != level || (t != type && t != "Unified")) continue;
    int64_t v = std::atoll(size.c_str());
    if (size.find('K') != std::string::npos) v <<= 10;
    if (size.find('M') != std::string::npos) v <<= 20;
    return v;
  }
  return 0;
}

// Cache sizes from CPUID (deterministic cache parameters: leaf 4 on Intel,
// 0x8000001D on AMD) when sysfs has none, as in some VMs.
int64_t cpuid_cache_bytes(int level, bool data) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __get_cpuid(0, &a, &b, &c, &d);
  const bool amd = b == 0x68747541;  // "Auth"enticAMD
  const unsigned leaf = amd ? 0x8000001D : 4;
  for (unsigned sub = 0; sub < 8; ++sub) {
    if (!__get_cpuid_count(leaf, sub, &a, &b, &c, &d)) return 0;
    const unsigned type = a & 0x1f, lvl = (a >> 5) & 0x7;
    if (type == 0) break;
    if (static_cast<int>(lvl) != level || (data ? type == 2 : type != 3)) continue;
    const int64_t ways = ((b >> 22) & 0x3ff) + 1, parts = ((b >> 12) & 0x3ff) + 1;
    const int64_t line = (b & 0xfff) + 1, sets = static_cast<int64_t>(c) + 1;
    return ways * parts * line * sets;
  }
  // AMD's legacy leaves: L1d in 0x80000005 ECX[31:24] KiB, L2 in 0x80000006
  // ECX[31:16] KiB, L3 in 0x80000006 EDX[31:18] x 512 KiB.
  if (level == 1 && __get_cpuid(0x80000005, &a, &b, &c, &d)) return int64_t{(c >> 24) & 0xff} << 10;
  if (level == 2 && __get_cpuid(0x80000006, &a, &b, &c, &d))
    return int64_t{(c >> 16) & 0xffff} << 10;
  if (level == 3 && __get_cpuid(0x80000006, &a, &b, &c, &d))
    return int64_t{(d >> 18) & 0x3fff} << 19;
  return 0;
}

float* aligned_floats(int64_t n) {
  return static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
}

// c = a + b over [begin, end) with non-temporal stores; 64-byte aligned chunks.
__attribute__((target("avx"))) void add_stream(const float* a, const float* b, float* c,
                                               int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 8) {
    _mm256_stream_ps(c + i, _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i)));
  }
}

// c = 1 over [begin, end) with non-temporal stores: writes alone.
__attribute__((target("avx"))) void write_stream(float* c, int64_t begin, int64_t end) {
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t i = begin; i < end; i += 8) _mm256_stream_ps(c + i, one);
}

// The reduce's pattern: reads a and b over [begin, end) and keeps sums of b
// and b * a (4 accumulators each, so adds do not limit the rate).
__attribute__((target("avx,fma"))) void read_two(const float* a, const float* b, int64_t begin,
                                                 int64_t end) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = begin; i < end; i += 16) {
    const __m256 b0 = _mm256_load_ps(b + i), b1 = _mm256_load_ps(b + i + 8);
    s0 = _mm256_add_ps(s0, b0);
    s1 = _mm256_add_ps(s1, b1);
    s2 = _mm256_fmadd_ps(b0, _mm256_load_ps(a + i), s2);
    s3 = _mm256_fmadd_ps(b1, _mm256_load_ps(a + i + 8), s3);
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  asm volatile("" : : "x"(sum));  // keep the reads
}

}  // namespace

HostInfo host_info() {
  HostInfo h;
  h.model_l3_bytes = cache_sizes().l3_bytes;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool avx512 = false, avx512_bf16 = false, avx512_fp16 = false, avx2 = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0 && h.cpu_model == "unknown") {
      h.cpu_model = line.substr(line.find(':') + 2);
    } else if (line.rfind("flags", 0) == 0) {
      avx512 = avx512 || line.find(" avx512f") != std::string::npos;
      avx512_bf16 = avx512_bf16 || line.find(" avx512_bf16") != std::string::npos;
      avx512_fp16 = avx512_fp16 || line.find(" avx512_fp16") != std::string::npos;
      avx2 = avx2 || line.find(" avx2") != std::string::npos;
    }
  }
  h.logical_cpus = std::thread::hardware_concurrency();
  h.l1d_bytes = sysfs_cache_bytes(1, "Data");
  h.l2_bytes = sysfs_cache_bytes(2, "Unified");
  h.l3_bytes = sysfs_cache_bytes(3, "Unified");
  if (h.l1d_bytes == 0) h.l1d_bytes = cpuid_cache_bytes(1, true);
  if (h.l2_bytes == 0) h.l2_bytes = cpuid_cache_bytes(2, false);
  if (h.l3_bytes == 0) h.l3_bytes = cpuid_cache_bytes(3, false);
  h.isa = avx512
              ? std::string("avx512") + (avx512_bf16 ? "+bf16" : "") + (avx512_fp16 ? "+fp16" : "")
          : avx2 ? "avx2"
                 : "baseline";
  return h;
}

void StreamProbe::Free::operator()(float* p) const {
  std::free(p);
}

StreamProbe::StreamProbe(int64_t floats_per_array)
    : n_(floats_per_array / 1024 * 1024),
      a_(aligned_floats(n_)),
      b_(aligned_floats(n_)),
      c_(aligned_floats(n_)) {
  if (!a_ || !b_ || !c_) n_ = 0;  // no memory for the probe: it reports 0 GB/s
  tbb::parallel_for(int64_t{0}, n_ / 1024, [&](int64_t k) {
    for (int64_t i = k * 1024; i < (k + 1) * 1024; ++i)
      a_.get()[i] = 1.f, b_.get()[i] = 2.f, c_.get()[i] = 0.f;
  });
}

double StreamProbe::measure(int reps) {
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tbb::parallel_for(int64_t{0}, n_ / 1024, [&](int64_t k) {
      add_stream(a_.get(), b_.get(), c_.get(), k * 1024, (k + 1) * 1024);
    });
    _mm_sfence();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 3.0 * static_cast<double>(n_) * 4.0 / s / 1e9);
  }
  return best;
}

double StreamProbe::measure_read_only(int reps) {
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tbb::parallel_for(int64_t{0}, n_ / 1024,
                      [&](int64_t k) { read_two(a_.get(), b_.get(), k * 1024, (k + 1) * 1024); });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n_) * 4.0 / s / 1e9);
  }
  return best;
}

CoreRates StreamProbe::measure_one_core(int reps) {
  CoreRates r;
  if (n_ == 0) return r;
  // A third of the arrays: each pattern still passes the L3 many times over.
  const int64_t n = n_ / 3 / 1024 * 1024;
  tbb::task_arena one(1);
  one.execute([&] {
    for (int k = 0; k < reps; ++k) {
      auto gbps = [&](double bytes, auto&& body) {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        _mm_sfence();
        return bytes /
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
      };
      const double bytes = static_cast<double>(n) * 4.0;
      r.reads = std::max(r.reads, gbps(2 * bytes, [&] { read_two(a_.get(), b_.get(), 0, n); }));
      r.writes = std::max(r.writes, gbps(bytes, [&] { write_stream(c_.get(), 0, n); }));
      r.mixed = std::max(r.mixed,
                         gbps(3 * bytes, [&] { add_stream(a_.get(), b_.get(), c_.get(), 0, n); }));
    }
  });
  return r;
}

TwoPassTraffic two_pass_traffic(const std::string& layout, int64_t n, int64_t c, int64_t spatial,
                                int64_t elem_bytes, int64_t l3_bytes) {
  if (n <= 0 || c <= 0 || spatial <= 0 || elem_bytes <= 0 || l3_bytes <= 0) return {};
  const double tensor = static_cast<double>(n) * c * spatial * elem_bytes;
  const double l3 = static_cast<double>(l3_bytes);
  if (2.0 * tensor <= l3) return {};
  // src + diff_dst of one unit. A subset of NXC channels keeps nothing
  // cached at a power-of-two stride; with another stride the bound charges
  // no re-read at all.
  double unit_pair = 0.0;
  if (layout == "NXC") {
    unit_pair = (c & (c - 1)) == 0 ? 2.0 * tensor : 0.0;
  } else {
    const int64_t per_unit = std::min<int64_t>(c, layout == "nChw16c" ? 16 : 1);
    unit_pair = 2.0 * tensor * static_cast<double>(per_unit) / static_cast<double>(c);
  }
  const double reread = unit_pair > l3 ? 2.0 * tensor * (1.0 - l3 / unit_pair) : 0.0;
  return {3.0 * tensor + reread, 3.0 + reread / tensor};
}

std::vector<int64_t> williams_order(int64_t n, int64_t it) {
  std::vector<int64_t> first(static_cast<size_t>(std::max<int64_t>(0, n)));
  for (int64_t j = 1, lo = 1, hi = n - 1; j < n; ++j) first[j] = j % 2 == 1 ? lo++ : hi--;
  const bool mirrored = n % 2 == 1 && (it / n) % 2 == 1;
  std::vector<int64_t> row(first.size());
  for (int64_t j = 0; j < n; ++j) row[j] = (first[mirrored ? n - 1 - j : j] + it) % n;
  return row;
}

void flush_caches(int64_t bytes) {
  // Written once, then only read: the lines it leaves in the caches are clean,
  // so the timed run that follows evicts them without write-backs. (Writing it
  // on every call left up to an L3 of dirty lines to be written back inside
  // the next timed run.)
  static std::vector<char> junk;
  if (junk.size() < static_cast<size_t>(bytes)) junk.assign(static_cast<size_t>(bytes), 1);
  uint64_t sum = 0;
  for (size_t i = 0; i < static_cast<size_t>(bytes); i += 64) sum += static_cast<uint8_t>(junk[i]);
  asm volatile("" : : "r"(sum));  // keep the reads
}

void evict_lines(const void* p, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t a = begin; a < end; a += 64) _mm_clflush(reinterpret_cast<const void*>(a));
  _mm_mfence();  // the flushes are ordered only by a fence
}

#ifdef NORMGRAD_WITH_DNNL
namespace {

class DnnlBlockedRunner final : public BlockedRunner {
 public:
  DnnlBlockedRunner(int64_t n, int64_t c, int64_t h, int64_t w, DataType dt,
                    const std::string& plain_layout)
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
    if (plain_layout.empty()) return;
    const memory::desc plain(
        {n, c, h, w}, ddt,
        plain_layout == "NXC" ? memory::format_tag::nhwc : memory::format_tag::nchw);
    plain_ = {make(plain, 0.5f), make(plain, 0.25f), make(plain, 0.f)};
    const memory& src = args_.at(DNNL_ARG_SRC);
    const memory& diff_dst = args_.at(DNNL_ARG_DIFF_DST);
    const memory& diff_src = args_.at(DNNL_ARG_DIFF_SRC);
    reorders_ = {{reorder(plain_[0], src), plain_[0], src},
                 {reorder(plain_[1], diff_dst), plain_[1], diff_dst}};
    back_ = {reorder(diff_src, plain_[2]), diff_src, plain_[2]};
  }
  double run_once() override {
    const auto t0 = std::chrono::steady_clock::now();
    for (Reorder& r : reorders_) r.prim.execute(s_, r.from, r.to);
    prim_.execute(s_, args_);
    if (!plain_.empty()) back_.prim.execute(s_, back_.from, back_.to);
    s_.wait();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string impl() const override { return impl_; }
  void evict() const override {
    for (const auto& [arg, m] : args_) evict_lines(m.get_data_handle(), m.get_desc().get_size());
    for (const dnnl::memory& m : plain_) evict_lines(m.get_data_handle(), m.get_desc().get_size());
  }

 private:
  struct Reorder {
    dnnl::reorder prim;
    dnnl::memory from, to;
  };
  dnnl::engine eng_;
  dnnl::stream s_;
  dnnl::batch_normalization_backward prim_;
  std::unordered_map<int, dnnl::memory> args_;
  std::string impl_;
  // With a plain layout: src, diff_dst and diff_src in it, and the reorders.
  std::vector<dnnl::memory> plain_;
  std::vector<Reorder> reorders_;
  Reorder back_;
};

}  // namespace
#endif

StatusOr<std::unique_ptr<BlockedRunner>> BlockedRunner::make(int64_t n, int64_t c, int64_t h,
                                                             int64_t w, DataType dt,
                                                             const std::string& plain_layout) {
#ifdef NORMGRAD_WITH_DNNL
  if (dt != DataType::kF32 && dt != DataType::kBF16)
    return unimplemented("oneDNN 2.6 has no f16 batch normalization on CPU");
  try {
    return std::unique_ptr<BlockedRunner>(
        std::make_unique<DnnlBlockedRunner>(n, c, h, w, dt, plain_layout));
  } catch (const std::exception& e) {
    return unimplemented(std::string("oneDNN blocked: ") + e.what());
  }
#else
  (void)n, (void)c, (void)h, (void)w, (void)dt, (void)plain_layout;
  return unimplemented("built without oneDNN");
#endif
}

}  // namespace cli
}  // namespace normgrad
