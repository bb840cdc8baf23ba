// Xbyak code of the JIT batch-norm forward (AVX-512 and AVX2), and generate_fwd_kernels.
//
// Four kernels, two per walk (contracts in jit_forward.hpp, FwdArgs):
//   rows stats    `rows` rows (or a row piece) of one channel: S1, S2 of (x - K);
//                 four independent vector chains, a masked tail, one fixed
//                 horizontal sum, so a row's sums depend on its data only
//   rows apply    y = ((x - hi) - lo) a + b [+ r] [relu] over a channel's rows
//   pixels stats  `len` pixels of C channels: per channel vector S1, S2; the
//                 channels in blocks whose sums stay in registers while the
//                 pixels stream past (8 vectors on AVX-512, 4 on AVX2)
//   pixels apply  channel blocks with their coefficients in registers, each
//                 over the call's pixels (4 vectors on AVX-512, 2 on AVX2)
// The ISA, data type (f32, bf16, f16), C, the epilogue and the pixels walk's
// tail are generation-time constants; row and pixel counts come in at run time.
//
// AVX2 has no mask registers: a constant tail is a vmaskmovps mask (f32) or
// word inserts and extracts (16-bit), and the rows walk's run-time tail goes
// through a zeroed stack buffer. bf16 is rounded to nearest even by integer
// arithmetic (NaN keeps its top bits and gets the quiet bit) wherever
// vcvtneps2bf16 is missing: on AVX2, and on AVX-512 without avx512_bf16.
#include <algorithm>
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
// The AVX2 rows walk's stack buffers for a run-time tail: src, residual, dst.
constexpr int kBounceX = 0, kBounceR = 32, kBounceY = 64, kBounceBytes = 96;

class FwdGenerator : public CodeGenerator {
 public:
  enum class Kind { kStats, kApply, kApplyStreaming };
  using Fn = void (*)(const FwdArgs*);

  FwdGenerator(const FwdConf& c, Kind kind)
      : CodeGenerator(kFwdCodeBytes, DontSetProtectRWE),
        c_(c),
        avx512_(c.isa == Isa::kAvx512),
        native_bf16_(avx512_ && cpu_has_avx512_bf16()),
        lanes_(avx512_ ? 16 : 8),
        es_(static_cast<int>(dtype_size(c.dt))),
        cp_(padded_channels(c.c)),
        nt_(kind == Kind::kApplyStreaming) {
    if (c.ncx_rows) {
      kind == Kind::kStats ? rows_stats() : rows_apply();
    } else {
      kind == Kind::kStats ? pixels_stats() : pixels_apply();
    }
    emit_constants();
    readyRE();
    setProtectModeRE();
  }
  Fn fn() const { return getCode<Fn>(); }

 private:
  Xmm vmm(int i) const { return avx512_ ? Xmm(Zmm(i)) : Xmm(Ymm(i)); }
  // The half-width register holding 16-bit data of a full vector.
  Xmm half(int i) const { return avx512_ ? Xmm(Ymm(i)) : Xmm(i); }

  // Arguments: rdi points at FwdArgs.
  void load_args() {
    mov(r8, ptr[rdi + offsetof(FwdArgs, x)]);
    mov(r9, ptr[rdi + offsetof(FwdArgs, y)]);
    mov(r10, ptr[rdi + offsetof(FwdArgs, residual)]);
    mov(rax, ptr[rdi + offsetof(FwdArgs, coef)]);
    mov(rdx, ptr[rdi + offsetof(FwdArgs, len)]);
  }

  // f32 vector `v` from data at `a`. Masked (a tail): AVX-512 lanes outside
  // k1 read nothing and are zero; on AVX2 the pixels walk's constant tail
  // (f32 by the mask in vmm(mask_), 16-bit word by word) reads only its lanes.
  void load(int v, const RegExp& e, bool masked) {
    const Address a = ptr[e];
    const Xmm x = vmm(v);
    if (c_.dt == DataType::kF32) {
      if (!masked) {
        vmovups(x, a);
      } else if (avx512_) {
        vmovups(Zmm(v) | k1 | T_z, a);
      } else {
        vmaskmovps(x, vmm(mask_), a);
      }
      return;
    }
    const bool words = masked && !avx512_;
    if (words) {  // AVX2, 16-bit tail: the words one by one
      vpxor(Xmm(v), Xmm(v), Xmm(v));
      for (int i = 0; i < tail(); ++i) vpinsrw(Xmm(v), Xmm(v), ptr[e + i * 2], i);
    }
    if (c_.dt == DataType::kBF16) {
      if (masked && avx512_) {
        vpmovzxwd(Zmm(v) | k1 | T_z, a);
      } else if (words) {
        vpmovzxwd(x, Xmm(v));
      } else {
        vpmovzxwd(x, a);
      }
      vpslld(x, x, 16);
    } else if (masked && avx512_) {
      vcvtph2ps(Zmm(v) | k1 | T_z, a);
    } else if (words) {
      vcvtph2ps(x, Xmm(v));
    } else {
      vcvtph2ps(x, a);
    }
  }

  // vmm(t) = the bf16 bits of vmm(v) in each dword, rounded to nearest even;
  // NaN keeps its top bits and gets the quiet bit (as f32_to_bf16_bits).
  // Clobbers vmm(n) and, on AVX2, vmm(m).
  void bf16_dwords(int t, int v, int n, int m) {
    const Xmm tv = vmm(t), vv = vmm(v), nv = vmm(n);
    vpsrld(tv, vv, 16);
    if (avx512_) {
      vpandd(tv, tv, ptr[rip + c_one_]);
    } else {
      vpand(tv, tv, ptr[rip + c_one_]);
    }
    vpaddd(tv, tv, ptr[rip + c_7fff_]);
    vpaddd(tv, tv, vv);
    vpsrld(tv, tv, 16);
    vpsrld(nv, vv, 16);
    if (avx512_) {
      vpord(nv, nv, ptr[rip + c_0040_]);
      vcmpps(k2, vv, vv, 3);  // unordered: NaN
      vmovdqa32(Zmm(t) | k2, Zmm(n));
    } else {
      vpor(nv, nv, ptr[rip + c_0040_]);
      vcmpps(vmm(m), vv, vv, 3);
      vblendvps(tv, tv, nv, vmm(m));
    }
  }

  // Rounds v to the data type and back (the unfused graph stores dst before
  // the Add or the LeakyReLU reads it); clobbers t, n, m.
  void round_to_dt(int v, int t, int n, int m) {
    if (c_.dt == DataType::kF16) {
      vcvtps2ph(half(t), vmm(v), 0);
      vcvtph2ps(vmm(v), half(t));
    } else if (c_.dt == DataType::kBF16 && native_bf16_) {
      vcvtneps2bf16(Ymm(t), Zmm(v));
      vpmovzxwd(Zmm(v), Ymm(t));
      vpslld(Zmm(v), Zmm(v), 16);
    } else if (c_.dt == DataType::kBF16) {
      bf16_dwords(t, v, n, m);
      vpslld(vmm(v), vmm(t), 16);
    }
  }

  // Stores vector v at `a`, converted to the data type; clobbers t, n, m.
  // Unmasked stores stream (non-temporal) in the streaming apply variant,
  // unless `a` is a stack buffer (may_stream false).
  void store(const RegExp& e, int v, int t, int n, int m, bool masked, bool may_stream = true) {
    const Address a = ptr[e];
    const Xmm x = vmm(v);
    const bool nt = nt_ && may_stream;
    if (c_.dt == DataType::kF32) {
      if (masked && avx512_) {
        vmovups(a | k1, Zmm(v));
      } else if (masked) {
        vmaskmovps(a, vmm(mask_), x);
      } else if (nt) {
        vmovntps(a, x);
      } else {
        vmovups(a, x);
      }
      return;
    }
    if (c_.dt == DataType::kF16) {
      vcvtps2ph(half(t), x, 0);  // round to nearest even
    } else if (native_bf16_) {
      vcvtneps2bf16(Ymm(t), Zmm(v));
    } else {
      bf16_dwords(n, v, t, m);  // dwords in vmm(n), then packed into half(t)
      if (avx512_) {
        vpmovdw(Ymm(t), Zmm(n));
      } else {
        vextracti128(Xmm(m), Ymm(n), 1);
        vpackusdw(Xmm(t), Xmm(n), Xmm(m));
      }
    }
    if (masked && avx512_) {
      vmovdqu16(a | k1, Ymm(t));
    } else if (masked) {
      for (int i = 0; i < tail(); ++i) vpextrw(ptr[e + i * 2], Xmm(t), i);
    } else if (nt) {
      vmovntdq(a, half(t));
    } else {
      vmovdqu(a, half(t));
    }
  }

  // The epilogue on v = the normalised value: [+ r] [relu]; clobbers t, n, m.
  void epilogue(int v, int t, int n, int m, const RegExp* r_addr, bool masked) {
    const Xmm x = vmm(v);
    if (c_.residual) {
      round_to_dt(v, t, n, m);
      load(t, *r_addr, masked);
      vaddps(x, x, vmm(t));
    }
    if (c_.relu && c_.leaky) {
      if (c_.dt != DataType::kF32) round_to_dt(v, t, n, m);  // the LeakyReLU reads dst's dtype
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

  int tail() const { return static_cast<int>(c_.c % lanes_); }

  void hsum(int v, int t) {
    const Xmm xv(v), xt(t);
    if (avx512_) {
      vextractf64x4(Ymm(t), Zmm(v), 1);
      vaddps(Ymm(v), Ymm(v), Ymm(t));
    }
    vextractf128(xt, Ymm(v), 1);
    vaddps(xv, xv, xt);
    vpermilps(xt, xv, 0x4e);
    vaddps(xv, xv, xt);
    vpermilps(xt, xv, 0xb1);
    vaddps(xv, xv, xt);
  }

  RegExp elem(const Reg64& base, int64_t off) {
    return base + rsi * es_ + static_cast<int>(off * es_);
  }

  // The rows walk's element loop: rsi counts elements; `body(u, off, masked)`
  // handles the vector at rsi + off. `unroll` vectors per step, then single
  // vectors, then the tail of rcx = len - rsi elements: masked by k1 on
  // AVX-512, and on AVX2 `avx2_tail()` (a stack-buffer bounce).
  template <typename Body, typename Tail>
  void row_loop(int unroll, const Body& body, const Tail& avx2_tail) {
    Label main, single, tail_l, done;
    xor_(rsi, rsi);
    mov(rcx, rdx);
    and_(rcx, ~int64_t{unroll * lanes_ - 1});
    L(main);
    cmp(rsi, rcx);
    jge(single, T_NEAR);
    for (int u = 0; u < unroll; ++u) body(u, lanes_ * u, false);
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

  void zero(int i) {
    if (avx512_) {
      vpxord(Zmm(i), Zmm(i), Zmm(i));
    } else {
      vpxor(Ymm(i), Ymm(i), Ymm(i));
    }
  }

  // The rows walk: `rows` rows of `len` elements, conf.c * conf.spatial apart.
  int64_t row_stride_bytes() const { return c_.c * c_.spatial * es_; }

  void rows_stats();
  void rows_apply();
  void pixels_stats();
  void pixels_apply();
  void emit_constants();

  FwdConf c_;
  bool avx512_, native_bf16_;
  int lanes_, es_;
  int64_t cp_;
  bool nt_;
  int zero_ = 31, alpha_ = 26, mask_ = 15;
  Label c_one_, c_7fff_, c_0040_, c_alpha_, c_masks_;
};

void FwdGenerator::rows_stats() {
  // AVX-512: sums v0..7, data v8..11, K v31. AVX2: the same, K v15, tail mask v14.
  const int k = avx512_ ? 31 : 15;
  push(rbx);
  rows_prologue();
  load_args();
  mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
  vbroadcastss(vmm(k), ptr[rax]);
  for (int i = 0; i < 8; ++i) zero(i);
  auto accumulate = [&](int u, int t) {
    vaddps(vmm(u), vmm(u), vmm(t));
    vfmadd231ps(vmm(4 + u), vmm(t), vmm(t));
  };
  Label row;
  L(row);
  row_loop(
      4,
      [&](int u, int64_t off, bool masked) {
        const int t = 8 + u;
        load(t, elem(r8, off), masked);
        if (masked) {
          vsubps(Zmm(t) | k1 | T_z, Zmm(t), Zmm(k));
        } else {
          vsubps(vmm(t), vmm(t), vmm(k));
        }
        accumulate(u, t);
      },
      [&] {
        copy_tail(kBounceX, r8, true, 8);
        load(8, rsp + kBounceX, false);
        vsubps(vmm(8), vmm(8), vmm(k));
        mask_from_rcx_avx2(14);
        vandps(vmm(8), vmm(8), vmm(14));  // lanes past the tail add nothing
        accumulate(0, 8);
      });
  mov(rcx, row_stride_bytes());
  add(r8, rcx);
  dec(rbx);
  jnz(row, T_NEAR);
  vaddps(vmm(0), vmm(0), vmm(1));
  vaddps(vmm(2), vmm(2), vmm(3));
  vaddps(vmm(0), vmm(0), vmm(2));
  vaddps(vmm(4), vmm(4), vmm(5));
  vaddps(vmm(6), vmm(6), vmm(7));
  vaddps(vmm(4), vmm(4), vmm(6));
  hsum(0, 8);
  hsum(4, 9);
  mov(rcx, ptr[rdi + offsetof(FwdArgs, s1)]);
  vmovss(ptr[rcx], xmm0);
  mov(rcx, ptr[rdi + offsetof(FwdArgs, s2)]);
  vmovss(ptr[rcx], xmm4);
  rows_epilogue();
  pop(rbx);
  vzeroupper();
  ret();
}

void FwdGenerator::rows_apply() {
  // AVX-512: data v0..3, scratch v4..11, hi/lo/a/b v27..30, zero v31, alpha v26.
  // AVX2 (two vectors a step): data v0..1, scratch v2..7, hi/lo/a/b v8..11,
  // zero v12, alpha v13.
  const int unroll = avx512_ ? 4 : 2;
  const int cf = avx512_ ? 27 : 8;
  zero_ = avx512_ ? 31 : 12;
  alpha_ = avx512_ ? 26 : 13;
  push(rbx);
  rows_prologue();
  load_args();
  mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
  for (int i = 0; i < 4; ++i) vbroadcastss(vmm(cf + i), ptr[rax + 4 * i]);
  zero(zero_);
  load_alpha();
  auto normalise = [&](int v) {
    vsubps(vmm(v), vmm(v), vmm(cf));
    vsubps(vmm(v), vmm(v), vmm(cf + 1));
    vfmadd213ps(vmm(v), vmm(cf + 2), vmm(cf + 3));
  };
  // Scratch registers of unroll slot u: t, n, m.
  auto t_of = [&](int u) { return unroll + u; };
  auto n_of = [&](int u) { return 2 * unroll + u; };
  auto m_of = [&](int u) { return 3 * unroll + u; };
  Label row;
  L(row);
  row_loop(
      unroll,
      [&](int u, int64_t off, bool masked) {
        load(u, elem(r8, off), masked);
        normalise(u);
        const RegExp ra = elem(r10, off);
        epilogue(u, t_of(u), n_of(u), m_of(u), &ra, masked);
        store(elem(r9, off), u, t_of(u), n_of(u), m_of(u), masked);
      },
      [&] {
        copy_tail(kBounceX, r8, true, 0);
        if (c_.residual) copy_tail(kBounceR, r10, true, 0);
        load(0, rsp + kBounceX, false);
        normalise(0);
        const RegExp ra = rsp + kBounceR;
        epilogue(0, t_of(0), n_of(0), m_of(0), &ra, false);
        store(rsp + kBounceY, 0, t_of(0), n_of(0), m_of(0), false, false);
        copy_tail(kBounceY, r9, false);
      });
  mov(rcx, row_stride_bytes());
  add(r8, rcx);
  add(r9, rcx);
  if (c_.residual) add(r10, rcx);
  dec(rbx);
  jnz(row, T_NEAR);
  rows_epilogue();
  pop(rbx);
  if (nt_) sfence();
  vzeroupper();
  ret();
}

// Pixels walk. Channel vectors: nv = ceil(C / lanes), the last one masked
// when C is not a multiple of the lanes (k1 on AVX-512, vmm(mask_) on AVX2).
void FwdGenerator::pixels_stats() {
  const int64_t nv = (c_.c + lanes_ - 1) / lanes_;
  const int block = avx512_ ? 8 : 4;
  const int vbytes = lanes_ * 4;
  load_args();
  if (tail() != 0 && avx512_) {
    mov(r11d, (1 << tail()) - 1);
    kmovw(k1, r11d);
  } else if (tail() != 0 && c_.dt == DataType::kF32) {
    mask_ = 15;
    vmovups(Ymm(mask_), ptr[rip + c_masks_ + (8 - tail()) * 4]);
  }
  mov(r9, ptr[rdi + offsetof(FwdArgs, s1)]);
  mov(r10, ptr[rdi + offsetof(FwdArgs, s2)]);
  for (int64_t first = 0; first < nv; first += block) {
    const int b = static_cast<int>(std::min<int64_t>(block, nv - first));
    // S1 v0.., S2 v<block>..; AVX-512: K v16..23 and data v24..31; AVX2: K
    // from memory and data v8..11.
    const int k0 = 16, d0 = avx512_ ? 24 : 8;
    for (int v = 0; v < b; ++v) {
      zero(v);
      zero(block + v);
      if (avx512_) vmovups(Zmm(k0 + v), ptr[rax + static_cast<int>((first + v) * vbytes)]);
    }
    mov(rsi, r8);
    mov(rcx, rdx);
    Label pix;
    L(pix);
    for (int v = 0; v < b; ++v) {
      const bool masked = tail() != 0 && first + v == nv - 1;
      const int t = d0 + v;
      load(t, rsi + static_cast<int>((first + v) * lanes_ * es_), masked);
      // K's padded lanes are 0: masked lanes stay 0.
      if (avx512_) {
        vsubps(vmm(t), vmm(t), Zmm(k0 + v));
      } else {
        vsubps(vmm(t), vmm(t), ptr[rax + static_cast<int>((first + v) * vbytes)]);
      }
      vaddps(vmm(v), vmm(v), vmm(t));
      vfmadd231ps(vmm(block + v), vmm(t), vmm(t));
    }
    add(rsi, static_cast<int>(c_.c * es_));
    dec(rcx);
    jnz(pix, T_NEAR);
    for (int v = 0; v < b; ++v) {
      vmovups(ptr[r9 + static_cast<int>((first + v) * vbytes)], vmm(v));
      vmovups(ptr[r10 + static_cast<int>((first + v) * vbytes)], vmm(block + v));
    }
  }
  vzeroupper();
  ret();
}

// Channel blocks with their hi/lo/a(/b) in registers for the whole call, each
// block over the call's pixels (few enough to stay in the L1/L2 from one
// block to the next: conf.apply_pixels).
void FwdGenerator::pixels_apply() {
  // AVX-512: blocks of 4; data v0..3, t v4..7, n v8..11, hi/lo/a/b v12..27,
  // alpha v28, zero v31. AVX2: blocks of 2; data v0..1, t v2..3, n v4, m v5,
  // alpha v6, hi/lo/a v8..13 (b from memory), zero v14, tail mask v15.
  const int block = avx512_ ? 4 : 2;
  const int hi0 = avx512_ ? 12 : 8;
  zero_ = avx512_ ? 31 : 14;
  alpha_ = avx512_ ? 28 : 6;
  mask_ = 15;
  const int64_t nv = (c_.c + lanes_ - 1) / lanes_;
  const int vbytes = lanes_ * 4;
  push(rbx);
  load_args();
  if (tail() != 0 && avx512_) {
    mov(r11d, (1 << tail()) - 1);
    kmovw(k1, r11d);
  } else if (tail() != 0 && c_.dt == DataType::kF32) {
    vmovups(Ymm(mask_), ptr[rip + c_masks_ + (8 - tail()) * 4]);
  }
  zero(zero_);
  load_alpha();
  const int row = static_cast<int>(cp_ * 4);
  for (int64_t first = 0; first < nv; first += block) {
    const int b = static_cast<int>(std::min<int64_t>(block, nv - first));
    for (int v = 0; v < b; ++v) {
      const int f = static_cast<int>((first + v) * vbytes);
      vmovups(vmm(hi0 + v), ptr[rax + f]);
      vmovups(vmm(hi0 + block + v), ptr[rax + row + f]);
      vmovups(vmm(hi0 + 2 * block + v), ptr[rax + 2 * row + f]);
      if (avx512_) vmovups(vmm(hi0 + 3 * block + v), ptr[rax + 3 * row + f]);
    }
    mov(rsi, r8);
    mov(rcx, r9);
    mov(r11, r10);
    mov(rbx, rdx);
    Label pix;
    L(pix);
    for (int v = 0; v < b; ++v) {
      const bool masked = tail() != 0 && first + v == nv - 1;
      const int d = static_cast<int>((first + v) * lanes_ * es_);
      const int t = block + v, n = avx512_ ? 8 + v : 4, m = avx512_ ? 8 + v : 5;
      load(v, rsi + d, masked);
      vsubps(vmm(v), vmm(v), vmm(hi0 + v));
      vsubps(vmm(v), vmm(v), vmm(hi0 + block + v));
      if (avx512_) {
        vfmadd213ps(vmm(v), vmm(hi0 + 2 * block + v), vmm(hi0 + 3 * block + v));
      } else {
        vfmadd213ps(vmm(v), vmm(hi0 + 2 * block + v),
                    ptr[rax + 3 * row + static_cast<int>((first + v) * vbytes)]);
      }
      const RegExp ra = r11 + d;
      epilogue(v, t, n, m, &ra, masked);
      store(rcx + d, v, t, n, m, masked);
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

void FwdGenerator::emit_constants() {
  align(64);
  auto splat = [&](Label& l, uint32_t v) {
    L(l);
    for (int i = 0; i < 16; ++i) dd(v);
  };
  splat(c_one_, 1);
  splat(c_7fff_, 0x7fff);
  splat(c_0040_, 0x40);
  uint32_t alpha_bits;
  std::memcpy(&alpha_bits, &c_.alpha, sizeof alpha_bits);
  splat(c_alpha_, alpha_bits);
  // AVX2 tail masks: the 8 dwords from entry 8 - n have their low n lanes set.
  L(c_masks_);
  for (int i = 0; i < 16; ++i) dd(i < 8 ? 0xffffffffu : 0u);
}

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
  if (conf.isa == Isa::kPortable || conf.empty) return portable_fwd_kernels(conf);
  return generate_guarded<FwdKernels>(conf.kernel_name(),
                                      [&] { return std::make_shared<GeneratedFwd>(conf); });
}

}  // namespace jit
}  // namespace normgrad
