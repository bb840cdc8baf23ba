// Helpers of `normgrad bench`: the host's description, the in-run bandwidth
// roofline probe, cache flushing for --cold, and oneDNN's blocked nChw16c
// reference columns (the kernel alone, and with its reorders).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <normgrad/graph/data_type.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace cli {

// The machine a run was measured on, so runs on different hosts can be told apart.
struct HostInfo {
  std::string cpu_model = "unknown";
  int64_t logical_cpus = 0;
  int64_t l1d_bytes = 0, l2_bytes = 0,
          l3_bytes = 0;  // as sysfs reports them (a VM may show the host's)
  // The L3 of the kernels' cache model (normgrad::cache_sizes(): an
  // implausible per-CPU share capped), which the traffic bounds use, so every
  // host prints one.
  int64_t model_l3_bytes = 0;
  std::string isa;
};

// CPU model, logical CPUs, cache sizes (sysfs, else CPUID) and vector ISA.
HostInfo host_info();

// The in-run roofline: GB/s of a 2-read-1-write stream (c = a + b) with
// streaming stores, over arrays far larger than the L3, on the current oneTBB
// thread limit; the best of `reps` passes. The arrays are kept, so the probe
// can run next to every case: a shared host's bandwidth changes within a run
// (one VM here alternated between about 55 and 100 GB/s). Without memory for
// the arrays it reports 0 GB/s (shares then read 0).
// What one core reaches alone (GB/s): 2 reads, streaming writes, and the
// two together in one loop (the probe's pattern). A core may serve the mix
// well above either alone, so a kernel that reads and writes in separate
// phases stays below the probe (docs/performance.md).
struct CoreRates {
  double reads = 0.0, writes = 0.0, mixed = 0.0;
};

class StreamProbe {
 public:
  explicit StreamProbe(int64_t floats_per_array);
  double measure(int reps);
  // GB/s of reading two of the arrays with nothing written: the pattern of a
  // reduction pass (the NXC reduce reads src and diff_dst this way). A host
  // may serve it below measure()'s rate (0.74-0.86 of it here).
  double measure_read_only(int reps);
  // The three patterns on one thread, over a third of the arrays each; the
  // best of `reps` passes.
  CoreRates measure_one_core(int reps);

 private:
  struct Free {
    void operator()(float* p) const;
  };
  int64_t n_;
  std::unique_ptr<float, Free> a_, b_, c_;
};

// The least DRAM traffic of a batch-norm backward on one layout, in bytes.
// diff_src needs a unit's complete sums, so a unit is reduced before it is
// applied: src, diff_dst and diff_src each pass once, and src and diff_dst
// are read a second time except what of the unit stays in its share of the
// L3 between the passes (the apply walking the reduce's order backwards).
// The bound takes the best case, every thread on one unit with the whole L3:
//   "NCX"      a unit is one channel.
//   "nChw16c"  a unit is 16 channels (one channel alone pulls the same lines).
//   "NXC"      a unit is every channel when C is a power of two: a channel
//              subset then sits at a power-of-two row stride and maps to
//              the same fraction of the cache's sets as of the row, so no
//              walk keeps a subset cached between the passes
//              (docs/performance.md, the traffic bound). Other C: no
//              re-read is charged, as a slab walk might avoid it.
// A lower bound on time is bytes over the host's streaming rate. Returns 0
// when src and diff_dst fit the L3 together: a run may then find them
// cached, and DRAM bounds nothing.
struct TwoPassTraffic {
  double bytes = 0.0;   // src + diff_dst + diff_src + the re-read
  double passes = 0.0;  // bytes over one tensor's bytes: 3 to 5
};
TwoPassTraffic two_pass_traffic(const std::string& layout, int64_t n, int64_t c, int64_t spatial,
                                int64_t elem_bytes, int64_t l3_bytes);

// Reads `bytes` of memory: the caches fill with clean lines of a junk buffer,
// so a --cold run pays no write-backs of an earlier run's data.
void flush_caches(int64_t bytes = int64_t{96} << 20);

// The order of n columns in iteration `it` of an interleaved run: the rows of
// a Williams design (a row-complete Latin square: 0, 1, n-1, 2, n-2, ...
// shifted by `it`, mirrored every other n rows when n is odd), so that over
// every n iterations (2n for odd n) each column runs right after every other
// one equally often, and first equally often.
std::vector<int64_t> williams_order(int64_t n, int64_t it);

// Writes back and drops every cache line of [p, p + bytes) (clflush). --cold
// also needs this: flush_caches alone left part of a 25.7 MB input pair in
// this host's L3 (apparently kept as lines read twice, by the reduce and the
// apply), and the "cold" reduce then read faster than the host's read-only
// rate (measured on the AMD host: git log -S evict_lines has the runs).
void evict_lines(const void* p, size_t bytes);

// oneDNN 2.6 batch_normalization_backward on nChw16c with blocked inputs
// prepared outside the timing: the best oneDNN does. run_once() times one call.
// With a plain layout ("NCX" or "NXC"), the call also reorders src and
// diff_dst from that layout to nChw16c and diff_src back, all inside the
// timing: what a user whose tensors are plain pays to use the blocked kernel.
class BlockedRunner {
 public:
  static StatusOr<std::unique_ptr<BlockedRunner>> make(int64_t n, int64_t c, int64_t h, int64_t w,
                                                       DataType dt,
                                                       const std::string& plain_layout = "");
  virtual ~BlockedRunner() = default;
  virtual double run_once() = 0;  // ms
  virtual std::string impl() const = 0;
  // evict_lines over every tensor of the call (for --cold).
  virtual void evict() const = 0;
};

}  // namespace cli
}  // namespace normgrad
