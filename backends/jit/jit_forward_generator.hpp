// The Xbyak code generator of the JIT batch-norm forward kernels (private).
//
// One FwdGenerator emits one kernel (stats, apply or streaming apply) for one
// conf, on AVX-512 or AVX2. The shared pieces (loads and stores with dtype
// conversion and tails, the epilogue, the rows loop) are inline here; the
// four walks are in jit_forward_walks.cpp, the grouped rows walk in
// jit_forward_groups.cpp; generate_fwd_kernels is in jit_forward_generator.cpp.
// Loads, stores, conversions and sums come from VecEmitter (jit_emitter.hpp).
//
// AVX2 has no mask registers: a constant tail is a vmaskmovps mask (f32) or
// word inserts and extracts (16-bit), and the rows walk's run-time tail goes
// through a zeroed stack buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <xbyak/xbyak.h>

#include <normgrad/backends/jit/jit_emitter.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>

namespace normgrad {
namespace jit {

constexpr size_t kFwdCodeBytes = 64 * 1024;
// The AVX2 rows walk's stack buffers for a run-time tail: src, residual, dst.
constexpr int kBounceX = 0, kBounceR = 32, kBounceY = 64, kBounceBytes = 96;

class FwdGenerator : public VecEmitter {
 public:
  enum class Kind { kStats, kApply, kApplyStreaming };
  using Fn = void (*)(const FwdArgs*);

  FwdGenerator(const FwdConf& c, Kind kind)
      : VecEmitter(kFwdCodeBytes, c.isa, c.avx512_bf16, c.dt, constant_tail(c)),
        c_(c),
        cp_(padded_channels(c.c)),
        nt_(kind == Kind::kApplyStreaming) {
    if (c.ncx_rows && c.channel_group > 0) {
      kind == Kind::kStats ? rows_stats_grouped() : rows_apply_grouped();
    } else if (c.ncx_rows) {
      kind == Kind::kStats ? rows_stats() : rows_apply();
    } else {
      if (kind != Kind::kStats) {
        pixels_apply();
      } else if (c.stats_pixel_group > 0) {
        pixels_stats_grouped();
      } else {
        pixels_stats();
      }
    }
    emit_constants();
    finish();
  }
  Fn fn() const { return getCode<Fn>(); }

 private:
  // The channels of a pixel one call takes: all, or a strip's (whole lines).
  static int64_t width(const FwdConf& c) { return c.strip_channels > 0 ? c.strip_channels : c.c; }
  // The constant tail: of a pixel's channels, or of a grouped walk's rows.
  static int constant_tail(const FwdConf& c) {
    const int lanes = c.isa == Isa::kAvx512 ? 16 : 8;
    return static_cast<int>((c.ncx_rows ? c.spatial : width(c)) % lanes);
  }

  // Arguments: rdi points at FwdArgs.
  void load_args() {
    mov(r8, ptr[rdi + offsetof(FwdArgs, x)]);
    mov(r9, ptr[rdi + offsetof(FwdArgs, y)]);
    mov(r10, ptr[rdi + offsetof(FwdArgs, residual)]);
    mov(rax, ptr[rdi + offsetof(FwdArgs, coef)]);
    mov(rdx, ptr[rdi + offsetof(FwdArgs, len)]);
  }

  // Stores vector v at `a`, converted to the data type; clobbers t, n, m.
  // Unmasked stores stream (non-temporal) in the streaming apply variant,
  // unless `a` is a stack buffer (may_stream false). The AVX2 rows walks
  // store a constant tail's bytes (store_bytes): a vmaskmovps store is slow
  // on AMD cores.
  void store(const RegExp& e, int v, int t, int n, int m, bool masked, bool may_stream = true) {
    if (masked && !avx512_ && c_.ncx_rows) {
      if (c_.dt == DataType::kF32) {
        store_bytes(e, v, tail_ * 4, t);
      } else {
        to_words(t, v, n, m);
        store_bytes(e, t, tail_ * 2, m);
      }
      return;
    }
    store_vec(e, v, masked, nt_ && may_stream, t, n, m);
  }

  // The epilogue on v = the normalised value: [+ r] [relu]; clobbers t and m.
  void epilogue(int v, int t, int m, const RegExp* r_addr, bool masked) {
    const Xmm x = vmm(v);
    if (c_.residual) {
      round_to_dt(v, t);
      load_vec(t, *r_addr, masked);
      vaddps(x, x, vmm(t));
    }
    if (c_.relu && c_.leaky) {
      if (c_.dt != DataType::kF32) round_to_dt(v, t);  // the LeakyReLU reads dst's dtype
      if (avx512_) {
        vcmpps(k2, Zmm(v), Zmm(zero_), 0x11);  // less-than, ordered, quiet: NaN stays NaN
        vmulps(Zmm(v) | k2, Zmm(v), Zmm(alpha_));
      } else {
        vcmpps(vmm(m), x, vmm(zero_), 0x11);
        vmulps(vmm(t), x, vmm(alpha_));
        vblendvps(x, x, vmm(t), vmm(m));
      }
    } else if (c_.relu) {
      vmaxps(x, vmm(zero_), x);  // NaN stays NaN (second operand)
    }
  }

  void load_alpha() {
    if (c_.leaky) vbroadcastss(vmm(alpha_), ptr[rip + c_alpha_]);
  }

  int64_t width() const { return width(c_); }

  RegExp elem(const Reg64& base, int64_t off) {
    return base + rsi * es_ + static_cast<int>(off * es_);
  }

  // The rows walk's element loop: rsi counts elements; `body(u, off, masked)`
  // handles the vector at rsi + off. `unroll` vectors per step, then single
  // vectors, then the tail of rcx = len - rsi elements: masked by k1 on
  // AVX-512, and on AVX2 `avx2_tail()` (a stack-buffer bounce).
  // `step()`, when given, emits the unrolled step itself (the pairs);
  // `before_step()` runs before each unrolled step (the apply's prefetches).
  template <typename Body, typename Tail>
  void row_loop(int unroll, const Body& body, const Tail& avx2_tail,
                const std::function<void()>& step = nullptr,
                const std::function<void()>& before_step = nullptr) {
    Label main, single, tail_l, done;
    xor_(rsi, rsi);
    mov(rcx, rdx);
    and_(rcx, ~int64_t{unroll * lanes_ - 1});
    L(main);
    cmp(rsi, rcx);
    jge(single, T_NEAR);
    if (before_step) before_step();
    if (step) {
      step();
    } else {
      for (int u = 0; u < unroll; ++u) body(u, lanes_ * u, false);
    }
    add(rsi, unroll * lanes_);
    jmp(main, T_NEAR);
    L(single);
    mov(rcx, rdx);
    and_(rcx, ~int64_t{lanes_ - 1});
    Label single_loop;
    L(single_loop);
    cmp(rsi, rcx);
    jge(tail_l, T_NEAR);
    body(0, 0, false);
    add(rsi, lanes_);
    jmp(single_loop, T_NEAR);
    L(tail_l);
    mov(rcx, rdx);
    sub(rcx, rsi);
    jz(done, T_NEAR);
    if (avx512_) {
      mov(r11d, 1);  // k1 = the low rcx lanes; rcx in [1, 16)
      shl(r11d, cl);
      dec(r11d);
      kmovw(k1, r11d);
      body(0, 0, true);
    } else {
      avx2_tail();
    }
    L(done);
  }

  // AVX2: the rcx elements at base[rsi] into (in) or out of the stack buffer
  // at rsp + buf; clobbers r11, r12, r13. A buffer read in is zeroed first
  // (with vmm(scratch)), so its lanes past the tail hold 0.
  void copy_tail(int buf, const Reg64& base, bool in, int scratch = -1) {
    if (in) {
      vpxor(Ymm(scratch), Ymm(scratch), Ymm(scratch));
      vmovdqu(ptr[rsp + buf], Ymm(scratch));
    }
    lea(r12, ptr[base + rsi * es_]);
    xor_(r11, r11);
    Label loop;
    L(loop);
    if (es_ == 4) {
      const Address data = dword[r12 + r11 * 4], stack = dword[rsp + r11 * 4 + buf];
      mov(r13d, in ? data : stack);
      mov(in ? stack : data, r13d);
    } else {
      const Address data = word[r12 + r11 * 2], stack = word[rsp + r11 * 2 + buf];
      movzx(r13d, in ? data : stack);
      mov(in ? stack : data, r13w);
    }
    inc(r11);
    cmp(r11, rcx);
    jl(loop, T_NEAR);
  }

  // AVX2: vmm(m) = the low rcx dword lanes set (a window of the mask table).
  void mask_from_rcx_avx2(int m) {
    lea(r11, ptr[rip + c_masks_]);
    mov(r12, rcx);
    neg(r12);
    vmovups(Ymm(m), ptr[r11 + r12 * 4 + 32]);
  }

  // The AVX2 rows kernels keep r12, r13 (callee-saved) and a stack buffer for the tail.
  void rows_prologue() {
    if (avx512_) return;
    push(r12);
    push(r13);
    sub(rsp, kBounceBytes);
  }
  void rows_epilogue() {
    if (avx512_) return;
    add(rsp, kBounceBytes);
    pop(r13);
    pop(r12);
  }

  // The rows walk: `rows` rows of `len` elements, conf.c * conf.spatial apart.
  int64_t row_stride_bytes() const { return c_.c * c_.spatial * es_; }

  void rows_stats();
  void rows_apply();
  void rows_stats_grouped();
  void rows_apply_grouped();
  void grouped_row(int unroll, const std::function<void(int, int64_t, bool)>& body, int64_t from,
                   int64_t base);
  void grouped_tail_mask();
  void store_bytes(const RegExp& e, int v, int bytes, int scratch);
  void pair_step(const std::function<void(int)>& normalise, int64_t off = 0);
  void stats_prologue();
  void pixels_stats();
  void pixels_stats_grouped();
  void pixels_stats_block(int nb, bool tail_last, int g);
  void pixels_apply();
  void pixels_pair_block(int64_t first, int row);
  void pixels_apply_lines(int row);
  void emit_constants();

  FwdConf c_;
  int64_t cp_;
  bool nt_;
  int zero_ = 31, alpha_ = 26;
  Label c_alpha_, c_masks_;
};

}  // namespace jit
}  // namespace normgrad
