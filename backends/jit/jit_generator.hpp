// The Xbyak code generator of the JIT batch-norm backward kernels (private).
//
// One BnGenerator emits one kernel (reduce or apply) for one conf. The shared
// pieces (prologue, fused producers, the column loops) are in
// jit_generator.cpp, on top of VecEmitter's loads, stores and conversions
// (jit_emitter.hpp); the rows walk, including the grouped kernels for
// short rows, in jit_generator_rows.cpp; the pixels walk, including the
// channel-blocked kernels for rows wider than the registers, in
// jit_generator_pixels.cpp. Everything the loops depend on is a
// generation-time constant: dtype, walk, row length, strides, tail length.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <xbyak/xbyak.h>

#include <normgrad/backends/jit/jit_emitter.hpp>
#include <normgrad/backends/jit/jit_kernels.hpp>

namespace normgrad {
namespace jit {

// Vectors per iteration of the unrolled row loops (the independent chains of
// the single-channel reduce).
constexpr int kUnroll = 4;

// Runs `make` (code generation, returning a shared_ptr to a set with a
// generate_ms member), records how long it took, and turns Xbyak's and other
// exceptions into a Status naming `what`. Shared by the backward's and the
// forward's generators.
template <typename Set, typename Make>
StatusOr<std::shared_ptr<const Set>> generate_guarded(const std::string& what, Make&& make) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto k = make();
    k->generate_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return std::shared_ptr<const Set>(std::move(k));
  } catch (const Xbyak::Error& e) {
    return internal_error(std::string("Xbyak: ") + e.what() + " while generating " + what);
  } catch (const std::exception& e) {
    return internal_error(std::string("JIT generation: ") + e.what());
  }
}

// What the developer tools see of a generated kernel, shared by the
// backward's kernels (reduce, apply) and the forward's (fwd_stats, fwd_apply,
// fwd_apply_nt):
// - NORMGRAD_JIT_PROFILE=1 names it in /tmp/perf-<pid>.map as
//   normgrad_<kind>_<key>, the file `perf report` reads for code it has no
//   symbols for (what DNNL_JIT_PROFILE=1 does for oneDNN's kernels);
// - NORMGRAD_JIT_DUMP=1 writes its code to normgrad_<kind>_<key>.bin in the
//   working directory ('/' written as '_'), for
//   `objdump -D -b binary -mi386:x86-64` (what ONEDNN_JIT_DUMP=1 does).
void register_kernel_code(const Xbyak::CodeGenerator& gen, const std::string& key,
                          const char* kind);

class BnGenerator : public VecEmitter {
 public:
  enum class Kind { kReduce, kApply };

  // Generates the kernel; Xbyak reports failures by throwing Xbyak::Error
  // (generate_kernels turns it into a Status).
  BnGenerator(const BnConf& c, Kind kind);

  using KernelFn = void (*)(const KernelArgs*);
  KernelFn fn() const { return getCode<KernelFn>(); }

 private:
  // Element `off` of the row at `base`, r11 elements in.
  RegExp at(const Reg64& base, int64_t off) const {
    return base + r11 * es_ + static_cast<int>(off * es_);
  }
  Address data(const Reg64& base, int64_t off) { return ptr[at(base, off)]; }
  Address f32_at(const Reg64& base, int64_t off) { return ptr[base + r11 * 4 + off * 4]; }

  bool fused() const { return c_.x_fuse != Fuse::kNone || c_.dy_fuse != Fuse::kNone; }

  // Vectors per pixel row, the last one partial when there is a tail.
  int64_t row_vectors() const { return (c_.walk.cols + lanes_ - 1) / lanes_; }

  // jit_generator.cpp: shared pieces.
  void prologue();
  void next_row(bool with_dx);
  void epilogue();
  void load_port(int port, int dst, int tmp, int64_t off, bool tail);
  void load_fused(int port, int dst, int tmp, int64_t off, bool tail, Fuse f);
  void load(int dst, const Reg64& base, int64_t off, bool tail);
  void store(const Reg64& base, int64_t off, int src, bool tail, bool nt = false);
  void cols_loop(const std::function<void(int, int64_t, bool)>& step);
  bool pair_vectors() const;
  int nt_align_mask() const;
  void cols_loop_pairs(const std::function<void(int, int64_t)>& pair,
                       const std::function<void(int, int64_t, bool)>& single);
  void cols_loop_dx_aligned(const std::function<void(int, int64_t, bool, bool)>& step);
  bool realigned_row_stores() const;
  void emit_constants();

  // jit_generator_rows.cpp: the rows walk.
  void prefetch_next_row();
  void prefetch_inputs_l2(int64_t off, int64_t ahead);
  void rows_reduce();
  // The row loop of the apply kernels; streaming stores only if allow_nt.
  void apply_rows(bool allow_nt, const std::function<void(bool)>& body);
  void broadcast_coefs(int first, int64_t g);
  void rows_apply_vector(int x, int cf, int64_t off, const Reg64& out, int64_t dx_off, bool tail,
                         bool nt);
  void rows_apply_pair(int p, int cf, int64_t off, const Reg64& out, int64_t dx_off, bool nt);
  void rows_apply_cols(int cf, int64_t off, const Reg64& out, int64_t dx_off, bool nt,
                       const std::function<void(int64_t)>& before_vector);
  void rows_apply();
  void each_group_channel(const std::function<void(int)>& body);
  int group_sum(int g, int which) const;
  void group_sums_avx512();
  void rows_reduce_grouped();
  void rows_apply_grouped();
  bool bounce_stores() const;
  bool linear_block_stores() const;
  void linear_block(int64_t lead);
  void stream_block();

  // jit_generator_pixels.cpp: the pixels walk.
  void each_vector(const std::function<void(int, int64_t, bool)>& step);
  void advance_rows(int64_t n, bool with_dx);
  void pixel_groups(int g, bool with_dx, const std::function<void(int)>& body);
  void rewound(bool with_dx, const std::function<void()>& walk);
  void channel_blocks(int b, const std::function<void(int, bool)>& block);
  void zero_sums(int nv);
  int mean_reg(int v) const;
  void load_means(int nv);
  void sum_vector(int v, int64_t off, bool tail);
  void add_sums_to_memory(int nv);
  void load_coefs(int nv);
  void apply_vector(int v, int64_t off, int64_t dx_off, bool tail, bool nt);
  void pixels_reduce_blocked();
  void prefetch_ahead(int v, int64_t off);
  void pixels_reduce_swept();
  void pixels_apply_wide();
  void pixels_reduce();
  void pixels_apply();
  void row_pairs(const std::function<void(int, int64_t)>& pair);
  void pixels_reduce_pairs();
  void pixels_apply_pairs(bool nt);

  // Fixed roles: v10 scratch for hsum in reduce kernels; v8..v10 for store conversion in
  // apply kernels (which keep data in v0..v7); v11 holds the AVX2 f32 tail mask.
  static constexpr int kScratch0 = 8, kScratch1 = 9, kScratch2 = 10, kMask = 11;
  // The apply's coefficient a for one fused multiply-add (dy a + c), in the
  // walks that read the coefficients as memory operands.
  static constexpr int kCoef = 12;

  BnConf c_;
  Kind kind_;
  int64_t cp_;
  // A reduce kernel that stores the fused diff_dst (BnConf::dy_side_out)
  // through r14, which moves with rdx.
  const bool side_out_;
  Xbyak::Label c_zero_, tail_mask_;
  // leaky_relu's alpha and 1/alpha (the kLeaky* fuses), 1.0f, and the bits
  // 1.0f ^ alpha and 1.0f ^ (1/alpha) that AVX2 selects a factor with.
  Xbyak::Label c_alpha_, c_inv_alpha_, c_onef_, c_sel_alpha_, c_sel_inv_alpha_;
  int x_reg_ = -1;  // the register port 0 was just loaded into (load_port), else -1
};

}  // namespace jit
}  // namespace normgrad
