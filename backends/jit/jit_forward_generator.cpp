// Xbyak code of the JIT batch-norm forward (AVX-512), and generate_fwd_kernels.
//
// Four kernels, two per walk (contracts in jit_forward.hpp, FwdArgs):
//   rows stats    `rows` rows (or a row piece) of one channel: S1, S2 of (x - K);
//                 four independent vector chains, a masked tail, one fixed
//                 horizontal sum, so a row's sums depend on its data only
//   rows apply    y = ((x - hi) - lo) a + b [+ r] [relu] over a channel's rows
//   pixels stats  `len` pixels of C channels: per channel vector S1, S2; the
//                 channels in blocks of up to 8 vectors whose sums stay in
//                 registers while the pixels stream past
//   pixels apply  channel blocks of 4 vectors with their coefficients in
//                 registers, each over the call's pixels
// The data type (f32, bf16, f16), C, the epilogue and the tail are
// generation-time constants; row and pixel counts come in at run time.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>

#include <xbyak/xbyak.h>

#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {
namespace {

using namespace Xbyak;

constexpr size_t kFwdCodeBytes = 64 * 1024;
constexpr int kBlockVectors = 8;

class FwdGenerator : public CodeGenerator {
 public:
  enum class Kind { kStats, kApply, kApplyStreaming };
  using Fn = void (*)(const FwdArgs*);

  FwdGenerator(const FwdConf& c, Kind kind)
      : CodeGenerator(kFwdCodeBytes, DontSetProtectRWE),
        c_(c),
        es_(static_cast<int>(dtype_size(c.dt))),
        cp_(padded_channels(c.c)),
        nt_(kind == Kind::kApplyStreaming) {
    if (c.ncx_rows) {
      kind == Kind::kStats ? rows_stats() : rows_apply();
    } else {
      kind == Kind::kStats ? pixels_stats() : pixels_apply();
    }
    readyRE();
    setProtectModeRE();
  }
  Fn fn() const { return getCode<Fn>(); }

 private:
  // Arguments: rdi points at FwdArgs.
  void load_args() {
    mov(r8, ptr[rdi + offsetof(FwdArgs, x)]);
    mov(r9, ptr[rdi + offsetof(FwdArgs, y)]);
    mov(r10, ptr[rdi + offsetof(FwdArgs, residual)]);
    mov(rax, ptr[rdi + offsetof(FwdArgs, coef)]);
    mov(rdx, ptr[rdi + offsetof(FwdArgs, len)]);
  }

  // f32 vector from data at `a`; masked lanes (k1) read nothing and are zero.
  void load(const Zmm& v, const Address& a, bool masked) {
    switch (c_.dt) {
      case DataType::kBF16:
        if (masked) {
          vpmovzxwd(v | k1 | T_z, a);
        } else {
          vpmovzxwd(v, a);
        }
        vpslld(v, v, 16);
        break;
      case DataType::kF16:
        if (masked) {
          vcvtph2ps(v | k1 | T_z, a);
        } else {
          vcvtph2ps(v, a);
        }
        break;
      default:
        if (masked) {
          vmovups(v | k1 | T_z, a);
        } else {
          vmovups(v, a);
        }
    }
  }

  // Rounds v to the data type and back (the unfused graph stores dst before the Add reads it).
  void round_to_dt(const Zmm& v, const Zmm& tmp) {
    const Ymm t(tmp.getIdx());
    if (c_.dt == DataType::kBF16) {
      vcvtneps2bf16(t, v);
      vpmovzxwd(v, t);
      vpslld(v, v, 16);
    } else if (c_.dt == DataType::kF16) {
      vcvtps2ph(t, v, 0);
      vcvtph2ps(v, t);
    }
  }

  // Unmasked stores stream (non-temporal) in the streaming apply variant.
  void store(const Address& a, const Zmm& v, const Zmm& tmp, bool masked) {
    const Ymm t(tmp.getIdx());
    if (c_.dt == DataType::kF32) {
      if (masked) {
        vmovups(a | k1, v);
      } else if (nt_) {
        vmovntps(a, v);
      } else {
        vmovups(a, v);
      }
      return;
    }
    if (c_.dt == DataType::kBF16) {
      vcvtneps2bf16(t, v);
    } else {
      vcvtps2ph(t, v, 0);  // round to nearest even
    }
    if (masked) {
      vmovdqu16(a | k1, t);
    } else if (nt_) {
      vmovntdq(a, t);
    } else {
      vmovdqu(a, t);
    }
  }

  // The epilogue on v = the normalised value: [+ r] [relu].
  void epilogue(const Zmm& v, const Zmm& tmp, const Address* r_addr, bool masked) {
    if (c_.residual) {
      round_to_dt(v, tmp);
      load(tmp, *r_addr, masked);
      vaddps(v, v, tmp);
    }
    if (c_.relu && c_.leaky) {
      if (c_.dt != DataType::kF32)
        round_to_dt(v, tmp);       // the unfused LeakyReLU reads dst in its dtype
      vcmpps(k2, v, zmm31, 0x11);  // less-than, ordered, quiet: NaN stays NaN
      vmulps(v | k2, v, alpha_);
    } else if (c_.relu) {
      vmaxps(v, zmm31, v);  // NaN stays NaN (second operand)
    }
  }

  // alpha_ = the LeakyReLU's alpha in every lane (r11 is free before the loops).
  void load_alpha() {
    if (!c_.leaky) return;
    uint32_t bits;
    std::memcpy(&bits, &c_.alpha, sizeof bits);
    mov(r11d, bits);
    vpbroadcastd(alpha_, r11d);
  }

  // k1 = the low (rcx) lanes; rcx in [0, 16).
  void mask_from_rcx() {
    mov(r11d, 1);
    shl(r11d, cl);
    dec(r11d);
    kmovw(k1, r11d);
  }

  void hsum(const Zmm& v, const Zmm& t) {
    vextractf64x4(Ymm(t.getIdx()), v, 1);
    vaddps(Ymm(v.getIdx()), Ymm(v.getIdx()), Ymm(t.getIdx()));
    vextractf128(Xmm(t.getIdx()), Ymm(v.getIdx()), 1);
    vaddps(Xmm(v.getIdx()), Xmm(v.getIdx()), Xmm(t.getIdx()));
    vpermilps(Xmm(t.getIdx()), Xmm(v.getIdx()), 0x4e);
    vaddps(Xmm(v.getIdx()), Xmm(v.getIdx()), Xmm(t.getIdx()));
    vpermilps(Xmm(t.getIdx()), Xmm(v.getIdx()), 0xb1);
    vaddps(Xmm(v.getIdx()), Xmm(v.getIdx()), Xmm(t.getIdx()));
  }

  Address elem(const Reg64& base, int64_t off) {
    return ptr[base + rsi * es_ + static_cast<int>(off * es_)];
  }

  // The rows walk's element loop: rsi counts elements; `body(u, off, masked)`
  // handles the vector at rsi + off. Four vectors per step, then single
  // vectors, then a masked tail.
  template <typename Body>
  void row_loop(const Body& body) {
    Label main, single, tail, done;
    xor_(rsi, rsi);
    mov(rcx, rdx);
    and_(rcx, ~int64_t{63});
    L(main);
    cmp(rsi, rcx);
    jge(single, T_NEAR);
    for (int u = 0; u < 4; ++u) body(u, 16 * u, false);
    add(rsi, 64);
    jmp(main, T_NEAR);
    L(single);
    mov(rcx, rdx);
    and_(rcx, ~int64_t{15});
    Label single_loop;
    L(single_loop);
    cmp(rsi, rcx);
    jge(tail, T_NEAR);
    body(0, 0, false);
    add(rsi, 16);
    jmp(single_loop, T_NEAR);
    L(tail);
    mov(rcx, rdx);
    sub(rcx, rsi);
    jz(done, T_NEAR);
    mask_from_rcx();
    body(0, 0, true);
    L(done);
  }

  // The rows walk: `rows` rows of `len` elements, conf.c * conf.spatial apart.
  int64_t row_stride_bytes() const { return c_.c * c_.spatial * es_; }

  void rows_stats() {
    push(rbx);
    load_args();
    mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
    vbroadcastss(zmm31, ptr[rax]);
    for (int i = 0; i < 8; ++i) vpxord(Zmm(i), Zmm(i), Zmm(i));
    Label row;
    L(row);
    row_loop([&](int u, int64_t off, bool masked) {
      const Zmm t(8 + u);
      load(t, elem(r8, off), masked);
      if (masked) {
        vsubps(t | k1 | T_z, t, zmm31);
      } else {
        vsubps(t, t, zmm31);
      }
      vaddps(Zmm(u), Zmm(u), t);
      vfmadd231ps(Zmm(4 + u), t, t);
    });
    mov(rcx, row_stride_bytes());
    add(r8, rcx);
    dec(rbx);
    jnz(row, T_NEAR);
    vaddps(zmm0, zmm0, zmm1);
    vaddps(zmm2, zmm2, zmm3);
    vaddps(zmm0, zmm0, zmm2);
    vaddps(zmm4, zmm4, zmm5);
    vaddps(zmm6, zmm6, zmm7);
    vaddps(zmm4, zmm4, zmm6);
    hsum(zmm0, zmm8);
    hsum(zmm4, zmm9);
    mov(rcx, ptr[rdi + offsetof(FwdArgs, s1)]);
    vmovss(ptr[rcx], xmm0);
    mov(rcx, ptr[rdi + offsetof(FwdArgs, s2)]);
    vmovss(ptr[rcx], xmm4);
    pop(rbx);
    vzeroupper();
    ret();
  }

  void rows_apply() {
    push(rbx);
    load_args();
    mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
    vbroadcastss(zmm27, ptr[rax]);
    vbroadcastss(zmm28, ptr[rax + 4]);
    vbroadcastss(zmm29, ptr[rax + 8]);
    vbroadcastss(zmm30, ptr[rax + 12]);
    vpxord(zmm31, zmm31, zmm31);
    alpha_ = zmm26;  // zmm0..7 data, zmm27..30 coefficients
    load_alpha();
    Label row;
    L(row);
    row_loop([&](int u, int64_t off, bool masked) {
      const Zmm v(u), t(4 + u);
      load(v, elem(r8, off), masked);
      vsubps(v, v, zmm27);
      vsubps(v, v, zmm28);
      vfmadd213ps(v, zmm29, zmm30);
      const Address ra = elem(r10, off);
      epilogue(v, t, &ra, masked);
      store(elem(r9, off), v, t, masked);
    });
    mov(rcx, row_stride_bytes());
    add(r8, rcx);
    add(r9, rcx);
    if (c_.residual) add(r10, rcx);
    dec(rbx);
    jnz(row, T_NEAR);
    pop(rbx);
    if (nt_) sfence();
    vzeroupper();
    ret();
  }

  // Pixels walk. Channel vectors: nv = ceil(C / 16), the last one masked by
  // the constant tail mask in k1 when C % 16 != 0.
  int64_t vectors() const { return (c_.c + 15) / 16; }
  int tail() const { return static_cast<int>(c_.c % 16); }
  void set_tail_mask() {
    if (tail() == 0) return;
    mov(r11d, (1 << tail()) - 1);
    kmovw(k1, r11d);
  }

  void pixels_stats() {
    load_args();
    set_tail_mask();
    mov(r9, ptr[rdi + offsetof(FwdArgs, s1)]);
    mov(r10, ptr[rdi + offsetof(FwdArgs, s2)]);
    const int64_t nv = vectors();
    for (int64_t first = 0; first < nv; first += kBlockVectors) {
      const int b = static_cast<int>(std::min<int64_t>(kBlockVectors, nv - first));
      // zmm0..7 S1, zmm8..15 S2, zmm16..23 K, zmm24..31 data.
      for (int v = 0; v < b; ++v) {
        vpxord(Zmm(v), Zmm(v), Zmm(v));
        vpxord(Zmm(8 + v), Zmm(8 + v), Zmm(8 + v));
        vmovups(Zmm(16 + v), ptr[rax + static_cast<int>((first + v) * 64)]);
      }
      mov(rsi, r8);
      mov(rcx, rdx);
      Label pix;
      L(pix);
      for (int v = 0; v < b; ++v) {
        const bool masked = tail() != 0 && first + v == nv - 1;
        const Zmm t(24 + v);
        load(t, ptr[rsi + static_cast<int>((first + v) * 16 * es_)], masked);
        vsubps(t, t, Zmm(16 + v));  // K's padded lanes are 0: masked lanes stay 0
        vaddps(Zmm(v), Zmm(v), t);
        vfmadd231ps(Zmm(8 + v), t, t);
      }
      add(rsi, static_cast<int>(c_.c * es_));
      dec(rcx);
      jnz(pix, T_NEAR);
      for (int v = 0; v < b; ++v) {
        vmovups(ptr[r9 + static_cast<int>((first + v) * 64)], Zmm(v));
        vmovups(ptr[r10 + static_cast<int>((first + v) * 64)], Zmm(8 + v));
      }
    }
    vzeroupper();
    ret();
  }

  // Channel blocks of up to 4 vectors, their hi/lo/a/b in zmm12..27 for the
  // whole call, each block over the call's pixels (few enough to stay in the
  // L1/L2 from one block to the next: conf.apply_pixels).
  void pixels_apply() {
    push(rbx);
    load_args();
    set_tail_mask();
    vpxord(zmm31, zmm31, zmm31);
    alpha_ = zmm28;  // zmm0..7 data, zmm12..27 coefficients
    load_alpha();
    const int64_t nv = vectors();
    const int row = static_cast<int>(cp_ * 4);
    for (int64_t first = 0; first < nv; first += 4) {
      const int b = static_cast<int>(std::min<int64_t>(4, nv - first));
      for (int v = 0; v < b; ++v) {
        const int f = static_cast<int>((first + v) * 64);
        vmovups(Zmm(12 + v), ptr[rax + f]);
        vmovups(Zmm(16 + v), ptr[rax + row + f]);
        vmovups(Zmm(20 + v), ptr[rax + 2 * row + f]);
        vmovups(Zmm(24 + v), ptr[rax + 3 * row + f]);
      }
      mov(rsi, r8);
      mov(rcx, r9);
      mov(r11, r10);
      mov(rbx, rdx);
      Label pix;
      L(pix);
      for (int v = 0; v < b; ++v) {
        const bool masked = tail() != 0 && first + v == nv - 1;
        const int d = static_cast<int>((first + v) * 16 * es_);
        const Zmm x(v), t(4 + v);
        load(x, ptr[rsi + d], masked);
        vsubps(x, x, Zmm(12 + v));
        vsubps(x, x, Zmm(16 + v));
        vfmadd213ps(x, Zmm(20 + v), Zmm(24 + v));
        const Address ra = ptr[r11 + d];
        epilogue(x, t, &ra, masked);
        store(ptr[rcx + d], x, t, masked);
      }
      add(rsi, static_cast<int>(c_.c * es_));
      add(rcx, static_cast<int>(c_.c * es_));
      if (c_.residual) add(r11, static_cast<int>(c_.c * es_));
      dec(rbx);
      jnz(pix, T_NEAR);
    }
    pop(rbx);
    if (nt_) sfence();
    vzeroupper();
    ret();
  }

  FwdConf c_;
  int es_;
  int64_t cp_;
  bool nt_;
  Zmm alpha_ = zmm26;
};

class GeneratedFwd final : public FwdKernels {
 public:
  explicit GeneratedFwd(const FwdConf& c)
      : stats_(c, FwdGenerator::Kind::kStats),
        apply_(c, FwdGenerator::Kind::kApply),
        stream_(c.streaming ? std::make_unique<FwdGenerator>(c, FwdGenerator::Kind::kApplyStreaming)
                            : nullptr) {}
  void stats(const FwdArgs& a) const override { stats_.fn()(&a); }
  void apply(const FwdArgs& a) const override { apply_.fn()(&a); }
  void apply_streaming(const FwdArgs& a) const override {
    (stream_ ? stream_->fn() : apply_.fn())(&a);
  }

 private:
  FwdGenerator stats_, apply_;
  std::unique_ptr<FwdGenerator> stream_;
};

}  // namespace

StatusOr<std::shared_ptr<const FwdKernels>> generate_fwd_kernels(const FwdConf& conf) {
  if (conf.isa != Isa::kAvx512 || conf.empty) return portable_fwd_kernels(conf);
  return generate_guarded<FwdKernels>(conf.kernel_name(),
                                      [&] { return std::make_shared<GeneratedFwd>(conf); });
}

}  // namespace jit
}  // namespace normgrad
