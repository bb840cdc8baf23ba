// Xbyak generator of the batch-norm backward kernels (AVX-512 and AVX2+F16C):
// the shared pieces and generate_kernels.
//
// Everything the loops depend on is a generation-time constant: dtype, walk,
// row length (S or C), row stride, tail length. Main loops run U = 4 vectors
// per iteration with independent accumulators; tails use opmask registers on
// AVX-512 and vmaskmovps / vpinsrw / vpextrw on AVX2. Code is generated into
// a read-write buffer and then made read+execute (never writable and
// executable at once).
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

#include <xbyak/xbyak.h>

#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {

using namespace Xbyak;

namespace {

constexpr size_t kCodeBytes = 64 * 1024;

}  // namespace

BnGenerator::BnGenerator(const BnConf& c, Kind kind)
    : CodeGenerator(kCodeBytes, DontSetProtectRWE),
      c_(c),
      kind_(kind),
      avx512_(c.isa == Isa::kAvx512),
      lanes_(avx512_ ? 16 : 8),
      es_(static_cast<int>(dtype_size(c.d.data_dt))),
      cp_(padded_channels(c.d.channels)),
      tail_(c.walk.cols % lanes_) {
  if (c.walk.kind == Walk::kRows && c.walk.channel_group > 0) {
    kind == Kind::kReduce ? rows_reduce_grouped() : rows_apply_grouped();
  } else if (c.walk.kind == Walk::kRows) {
    kind == Kind::kReduce ? rows_reduce() : rows_apply();
  } else {
    kind == Kind::kReduce ? pixels_reduce() : pixels_apply();
  }
  emit_constants();
  readyRE();           // checks labels (and protects AutoGrow buffers only)
  setProtectModeRE();  // our fixed buffer: read-write until now, read+execute from here on
}

void BnGenerator::prologue() {
  mov(rsi, ptr[rdi + offsetof(KernelArgs, x)]);
  mov(rdx, ptr[rdi + offsetof(KernelArgs, dy)]);
  mov(rcx, ptr[rdi + offsetof(KernelArgs, dx)]);
  mov(r8, ptr[rdi + offsetof(KernelArgs, coef)]);
  mov(r9, ptr[rdi + offsetof(KernelArgs, acc)]);
  mov(r10, ptr[rdi + offsetof(KernelArgs, rows)]);
  if (bounce_stores() && avx512_) push(rbx);  // callee-saved: the streaming copy's mask
  if (fused()) {
    // Callee-saved registers for the fused producers' second inputs.
    push(r12);
    push(r13);
    mov(r12, ptr[rdi + offsetof(KernelArgs, x2)]);
    mov(r13, ptr[rdi + offsetof(KernelArgs, dy2)]);
  }
  // The grouped rows kernels keep the call's channel count in rdi (the
  // arguments are all loaded by now).
  if (c_.walk.kind == Walk::kRows && c_.walk.channel_group > 0)
    mov(rdi, ptr[rdi + offsetof(KernelArgs, channels)]);
  if (tail_ == 0) return;
  if (avx512_) {
    mov(eax, (1u << tail_) - 1);
    kmovw(k1, eax);
  } else if (c_.d.data_dt == DataType::kF32) {
    vmovups(vmm(kMask), ptr[rip + tail_mask_]);
  }
}

void BnGenerator::next_row(bool with_dx) {
  mov(rax, c_.walk.row_stride * es_);
  add(rsi, rax);
  add(rdx, rax);
  if (uses_second(c_.x_fuse)) add(r12, rax);
  if (uses_second(c_.dy_fuse)) add(r13, rax);
  if (with_dx) {  // diff_src may be laid out with its own row stride
    mov(rax, c_.walk.dx_row_stride * es_);
    add(rcx, rax);
  }
}

void BnGenerator::epilogue() {
  if (fused()) {
    pop(r13);
    pop(r12);
  }
  if (bounce_stores() && avx512_) pop(rbx);
  vzeroupper();
  ret();
}

// Rounds vmm(v) (f32) to the data dtype and back, as the unfused graph stores
// the Add's output in that dtype before the batch norm reads it.
void BnGenerator::round_to_data_dtype(int v, int tmp) {
  if (c_.d.data_dt == DataType::kF16) {
    vcvtps2ph(half(tmp), vmm(v), 0);
    vcvtph2ps(vmm(v), half(tmp));
  } else if (c_.d.data_dt == DataType::kBF16 && avx512_ && c_.avx512_bf16) {
    vcvtneps2bf16(half(tmp), vmm(v));
    vpmovzxwd(vmm(v), half(tmp));
    vpslld(vmm(v), vmm(v), 16);
  } else if (c_.d.data_dt == DataType::kBF16) {
    // Round to nearest even on the bits; sums of finite values stay finite or become Inf
    // correctly.
    vpsrld(vmm(tmp), vmm(v), 16);
    if (avx512_) {
      vpandd(vmm(tmp), vmm(tmp), ptr[rip + c_one_]);
      vpaddd(vmm(tmp), vmm(tmp), ptr[rip + c_7fff_]);
      vpaddd(vmm(v), vmm(v), vmm(tmp));
      vpandd(vmm(v), vmm(v), ptr[rip + c_hi16_]);
    } else {
      vpand(vmm(tmp), vmm(tmp), ptr[rip + c_one_]);
      vpaddd(vmm(tmp), vmm(tmp), ptr[rip + c_7fff_]);
      vpaddd(vmm(v), vmm(v), vmm(tmp));
      vpand(vmm(v), vmm(v), ptr[rip + c_hi16_]);
    }
  }
}

// Loads src (port 0) or diff_dst (port 1) into vmm(dst), computing a fused
// producer on the fly; vmm(tmp) is clobbered when the port is fused.
void BnGenerator::load_port(int port, int dst, int tmp, int64_t off, bool tail) {
  load_fused(port, dst, tmp, off, tail, port == 0 ? c_.x_fuse : c_.dy_fuse);
  x_reg_ = port == 0 ? dst : -1;  // every kernel loads port 1 right after port 0
}

void BnGenerator::load_fused(int port, int dst, int tmp, int64_t off, bool tail, Fuse f) {
  const Reg64& first = port == 0 ? rsi : rdx;
  const Reg64& second = port == 0 ? r12 : r13;
  if (f == Fuse::kNone) {
    load(dst, first, off, tail);
  } else if (f == Fuse::kAdd) {
    load(dst, first, off, tail);
    load(tmp, second, off, tail);
    vaddps(vmm(dst), vmm(dst), vmm(tmp));
    round_to_data_dtype(dst, tmp);
  } else if (f == Fuse::kLeakyBackwardAtSrc) {
    // The gradient, times alpha where port 0's value (loaded just before: it
    // has dst's sign) is < 0 (NaN compares false).
    assert(x_reg_ >= 0 && "kLeakyBackwardAtSrc follows port 0's load");
    load(dst, first, off, tail);
    if (avx512_) {
      vcmpps(k3, vmm(x_reg_), ptr[rip + c_zero_], 0x11);  // less-than, ordered, quiet
      vmulps(vmm(dst) | k3, vmm(dst), ptr[rip + c_alpha_]);
    } else {
      // No mask registers on AVX2: the factor's bits are selected, 1.0f ^ ((1.0f ^ alpha) &
      // mask), so the product is the AVX-512 one (1 + (alpha - 1) would lose alpha's low bits).
      vcmpps(vmm(tmp), vmm(x_reg_), ptr[rip + c_zero_], 0x11);
      vandps(vmm(tmp), vmm(tmp), ptr[rip + c_sel_alpha_]);
      vxorps(vmm(tmp), vmm(tmp), ptr[rip + c_onef_]);
      vmulps(vmm(dst), vmm(dst), vmm(tmp));
    }
  } else if (f == Fuse::kLeakyInverse || f == Fuse::kLeakyInverseSub || f == Fuse::kLeakyBackward) {
    // v = the forward's dst; the value is scaled where v < 0 (NaN compares
    // false): by 1/alpha to undo leaky_relu, or by alpha for its derivative.
    const bool inverse = f != Fuse::kLeakyBackward;
    const int v = inverse ? dst : tmp;
    if (inverse) {
      load(dst, first, off, tail);
    } else {
      load(dst, second, off, tail);
      load(tmp, first, off, tail);
    }
    if (avx512_ && inverse) {
      // y = the smaller of dst and dst / alpha (alpha <= 1; the larger for alpha > 1):
      // no mask, the same product, and NaN stays NaN (vminps/vmaxps return their
      // second operand), and shorter than the masked multiply's dependency chain.
      vmulps(vmm(tmp), vmm(dst), ptr[rip + c_inv_alpha_]);
      if (c_.alpha <= 1.f) {
        vminps(vmm(dst), vmm(dst), vmm(tmp));
      } else {
        vmaxps(vmm(dst), vmm(dst), vmm(tmp));
      }
    } else if (avx512_) {
      vcmpps(k3, vmm(v), ptr[rip + c_zero_], 0x11);  // less-than, ordered, quiet
      vmulps(vmm(dst) | k3, vmm(dst), ptr[rip + c_alpha_]);
    } else {
      // AVX2: the factor's bits selected as above.
      vcmpps(vmm(tmp), vmm(v), ptr[rip + c_zero_], 0x11);
      vandps(vmm(tmp), vmm(tmp), ptr[rip + (inverse ? c_sel_inv_alpha_ : c_sel_alpha_)]);
      vxorps(vmm(tmp), vmm(tmp), ptr[rip + c_onef_]);
      vmulps(vmm(dst), vmm(dst), vmm(tmp));
    }
    if (f == Fuse::kLeakyInverseSub) {  // minus the residual
      load(tmp, second, off, tail);
      vsubps(vmm(dst), vmm(dst), vmm(tmp));
    }
  } else {  // ReLU backward: the gradient where the forward value is > 0 (NaN compares false)
    load(dst, second, off, tail);
    load(tmp, first, off, tail);
    if (avx512_) {
      vcmpps(k3, vmm(tmp), ptr[rip + c_zero_], 0x1E);  // greater-than, ordered, quiet
      vmovaps(vmm(dst) | k3 | T_z, vmm(dst));
    } else {
      vcmpps(vmm(tmp), vmm(tmp), ptr[rip + c_zero_], 0x1E);
      vandps(vmm(dst), vmm(dst), vmm(tmp));
    }
  }
}

// Loads one vector of data (converted to f32) from `base` at element `off`.
void BnGenerator::load(int dst, const Reg64& base, int64_t off, bool tail) {
  const Xmm v = vmm(dst);
  if (c_.d.data_dt == DataType::kF32) {
    if (!tail) {
      vmovups(v, data(base, off));
    } else if (avx512_) {
      vmovups(v | k1 | T_z, data(base, off));
    } else {
      vmaskmovps(v, vmm(kMask), data(base, off));
    }
    return;
  }
  const Xmm h = half(dst);
  if (tail) {
    if (avx512_) {
      vmovdqu16(h | k1 | T_z, data(base, off));
    } else {
      vpxor(Xmm(dst), Xmm(dst), Xmm(dst));
      for (int i = 0; i < tail_; ++i) vpinsrw(Xmm(dst), Xmm(dst), data(base, off + i), i);
    }
  }
  if (c_.d.data_dt == DataType::kBF16) {
    if (tail) {
      vpmovzxwd(v, h);
    } else {
      vpmovzxwd(v, data(base, off));
    }
    vpslld(v, v, 16);
  } else {  // f16
    if (tail) {
      vcvtph2ps(v, h);
    } else {
      vcvtph2ps(v, data(base, off));
    }
  }
}

// Stores vector `src` (f32) to `base` at element `off`, converting; clobbers kScratch0..2
// (and, AVX2 bf16, src itself).
void BnGenerator::store(const Reg64& base, int64_t off, int src, bool tail, bool nt) {
  const Xmm s = vmm(src);
  if (c_.d.data_dt == DataType::kF32) {
    if (!tail && nt) {
      vmovntps(data(base, off), s);
    } else if (!tail) {
      vmovups(data(base, off), s);
    } else if (avx512_) {
      vmovups(data(base, off) | k1, s);
    } else {
      vmaskmovps(data(base, off), vmm(kMask), s);
    }
    return;
  }
  const int w = kScratch0;  // words land in half(w)
  if (c_.d.data_dt == DataType::kF16) {
    vcvtps2ph(half(w), s, 0);  // round to nearest even
  } else if (avx512_ && c_.avx512_bf16) {
    vcvtneps2bf16(half(w), s);
  } else if (avx512_) {
    // Round to nearest even by integer arithmetic (round_bf16_avx2's, whose
    // comment says why a NaN stays a NaN).
    const Xmm t = vmm(kScratch1);
    vpsrld(t, s, 16);
    vpandd(t, t, ptr[rip + c_one_]);
    vpaddd(t, t, ptr[rip + c_7fff_]);
    vpaddd(t, t, s);
    vpsrld(t, t, 16);
    vpmovdw(half(w), t);
  } else {
    // AVX2: rounded in place (every caller's last use of src), the words packed.
    round_bf16_avx2(src);
    vpsrld(Ymm(kScratch1), Ymm(src), 16);
    vextracti128(Xmm(kScratch2), Ymm(kScratch1), 1);
    vpackusdw(Xmm(w), Xmm(kScratch1), Xmm(kScratch2));
  }
  if (!tail && nt) {
    vmovntdq(data(base, off), half(w));
  } else if (!tail) {
    vmovdqu(data(base, off), half(w));
  } else if (avx512_) {
    vmovdqu16(data(base, off) | k1, half(w));
  } else {
    for (int i = 0; i < tail_; ++i) vpextrw(data(base, off + i), Xmm(w), i);
  }
}

// Walks one row of `cols` elements: step(j, offset, tail) with j the unroll slot.
void BnGenerator::cols_loop(const std::function<void(int, int64_t, bool)>& step) {
  const int64_t nvec = c_.walk.cols / lanes_;
  const int64_t groups = nvec / kUnroll, rem = nvec % kUnroll;
  xor_(r11, r11);
  if (groups > 0) {
    Label loop;
    mov(rax, groups * kUnroll * lanes_);
    L(loop);
    for (int j = 0; j < kUnroll; ++j) step(j, j * lanes_, false);
    add(r11, kUnroll * lanes_);
    cmp(r11, rax);
    jl(loop, T_NEAR);
  }
  for (int j = 0; j < rem; ++j) step(j, j * lanes_, false);
  if (tail_) step(static_cast<int>(rem), rem * lanes_, true);
}

// apply_in_pairs, for the kernel being generated (an apply).
bool BnGenerator::pair_vectors() const {
  return kind_ == Kind::kApply && apply_in_pairs(c_);
}

// The low bits of diff_src's address that must be zero for a streaming
// store: a vector's, or a pair's 32 bytes.
int BnGenerator::nt_align_mask() const {
  return (pair_vectors() ? 32 : lanes_ * es_) - 1;
}

// 16 bf16 elements at `off` as f32: the even ones (the low word of each
// dword, shifted up) into ymm(even), the odd ones (the high word, masked) into
// ymm(odd). The same values the vector-at-a-time load gives, in other lanes.
void BnGenerator::load_pair(int even, int odd, const Reg64& base, int64_t off) {
  vmovdqu(Ymm(odd), data(base, off));
  vpslld(Ymm(even), Ymm(odd), 16);
  vpand(Ymm(odd), Ymm(odd), ptr[rip + c_hi16_]);
}

// AVX2: ymm(v) (f32) rounded in place to bf16 in its top 16 bits, to
// nearest even by integer arithmetic: x + 0x7fff + (bit 16 of x). A NaN
// stays a NaN because its low 16 bits are zero, so nothing carries into its
// top bits: the kernels only meet NaNs loaded from bf16, made by arithmetic
// (the default NaN or an operand's) or from the driver's kernel_float, which
// makes any NaN 0x7fc00000. A test feeds NaNs with full payloads in every f32
// input. Clobbers kScratch0.
void BnGenerator::round_bf16_avx2(int v) {
  assert(v != kScratch0 && "round_bf16_avx2 uses kScratch0");
  const Ymm s(v), t(kScratch0);
  vpsrld(t, s, 16);
  vpand(t, t, ptr[rip + c_one_]);
  vpaddd(t, t, ptr[rip + c_7fff_]);
  vpaddd(s, s, t);
}

// The inverse of load_pair: ymm(even) and ymm(odd) (f32) rounded to bf16 as
// store() rounds, the even words shifted down and the odd ones blended in
// above them, one 32-byte store. Clobbers both inputs and kScratch0.
void BnGenerator::store_pair(const Reg64& base, int64_t off, int even, int odd, bool nt) {
  round_bf16_avx2(even);
  round_bf16_avx2(odd);
  vpsrld(Ymm(even), Ymm(even), 16);
  vpblendw(Ymm(even), Ymm(even), Ymm(odd), 0xaa);  // the odd (high) word of each dword
  if (nt) {
    vmovntdq(data(base, off), Ymm(even));
  } else {
    vmovdqu(data(base, off), Ymm(even));
  }
}

// Copies the grouped rows apply's bounce block (jit_generator_rows.cpp; r9:
// rdi rows of S elements) to diff_src (rcx) through emit_stream_copy;
// clobbers rax, rbx, r11, k4 and v8.
void BnGenerator::stream_block() {
  assert((avx512_ || c_.walk.cols * es_ >= 128) && "the AVX2 copy's ends take 64 bytes each");
  imul(rax, rdi, static_cast<int>(c_.walk.cols * es_));
  emit_stream_copy(*this, avx512_, r9, rcx, rax, r11, rbx, kScratch0);
}

void emit_stream_copy(Xbyak::CodeGenerator& g, bool avx512, const Xbyak::Reg64& from,
                      const Xbyak::Reg64& to, const Xbyak::Reg64& bytes, const Xbyak::Reg64& head,
                      const Xbyak::Reg64& tmp, int vec) {
  using namespace Xbyak;
  // head: the bytes up to `to`'s first line boundary, at most the block.
  g.mov(head, to);
  g.neg(head);
  g.and_(head, 63);
  g.cmp(head, bytes);
  g.cmova(head, bytes);
  Label lines, done;
  if (avx512) {
    // The partial lines at the two ends with byte-masked stores (their other
    // bytes belong to the neighbouring blocks), the whole lines between streamed.
    const Zmm t(vec);
    g.sub(bytes, head);  // bytes from that boundary on
    g.mov(tmp, -1);
    g.bzhi(tmp, tmp, head);
    g.kmovq(g.k4, tmp);
    g.vmovdqu8(t | g.k4 | g.T_z, g.ptr[from]);
    g.vmovdqu8(g.ptr[to] | g.k4, t);
    g.L(lines);
    g.cmp(bytes, 64);
    g.jb(done, g.T_NEAR);
    g.vmovdqu8(t, g.ptr[from + head]);
    g.vmovntdq(g.ptr[to + head], t);
    g.add(head, 64);
    g.sub(bytes, 64);
    g.jmp(lines, g.T_NEAR);
    g.L(done);
    g.mov(tmp, -1);
    g.bzhi(tmp, tmp, bytes);
    g.kmovq(g.k4, tmp);
    g.vmovdqu8(t | g.k4 | g.T_z, g.ptr[from + head]);
    g.vmovdqu8(g.ptr[to + head] | g.k4, t);
    return;
  }
  // AVX2 has no byte masks: the block's first and last 64 bytes with
  // ordinary 32-byte stores, which cover the partial lines at its two ends
  // (and part of a whole line, which the streaming stores then write again
  // with the same bytes), then the whole lines between streamed. Every store
  // stays inside the block, which must be 128 bytes or more.
  const Ymm t(vec);
  for (int off : {0, 32}) {
    g.vmovdqu(t, g.ptr[from + off]);
    g.vmovdqu(g.ptr[to + off], t);
  }
  for (int back : {64, 32}) {
    g.vmovdqu(t, g.ptr[from + bytes - back]);
    g.vmovdqu(g.ptr[to + bytes - back], t);
  }
  g.sub(bytes, head);  // bytes from the first line boundary on
  g.L(lines);
  g.cmp(bytes, 64);
  g.jb(done, g.T_NEAR);
  g.vmovdqu(t, g.ptr[from + head]);
  g.vmovntdq(g.ptr[to + head], t);
  g.vmovdqu(t, g.ptr[from + head + 32]);
  g.vmovntdq(g.ptr[to + head + 32], t);
  g.add(head, 64);
  g.sub(bytes, 64);
  g.jmp(lines, g.T_NEAR);
  g.L(done);
}

// cols_loop for pair_vectors: pair(p, offset) per 16 elements, two pairs per
// iteration, then single(j, offset, tail) for what is left (one vector, the
// tail).
void BnGenerator::cols_loop_pairs(const std::function<void(int, int64_t)>& pair,
                                  const std::function<void(int, int64_t, bool)>& single) {
  const int64_t pair_lanes = 2 * lanes_;
  const int64_t npairs = c_.walk.cols / pair_lanes, groups = npairs / 2;
  xor_(r11, r11);
  if (groups > 0) {
    Label loop;
    mov(rax, groups * 2 * pair_lanes);
    L(loop);
    pair(0, 0);
    pair(1, pair_lanes);
    add(r11, 2 * pair_lanes);
    cmp(r11, rax);
    jl(loop, T_NEAR);
  }
  int64_t off = 0;
  if (npairs % 2) {
    pair(0, 0);
    off = pair_lanes;
  }
  if ((c_.walk.cols % pair_lanes) / lanes_ > 0) {
    single(0, off, false);
    off += lanes_;
  }
  if (tail_) single(1, off, true);
}

// Horizontal sum of vmm(v) into lane 0 of Xmm(v); clobbers vmm(s).
void BnGenerator::hsum(int v, int s) {
  if (avx512_) {
    vextractf64x4(Ymm(s), Zmm(v), 1);
    vaddps(Ymm(v), Ymm(v), Ymm(s));
  }
  vextractf128(Xmm(s), Ymm(v), 1);
  vaddps(Xmm(v), Xmm(v), Xmm(s));
  vmovhlps(Xmm(s), Xmm(s), Xmm(v));
  vaddps(Xmm(v), Xmm(v), Xmm(s));
  vmovshdup(Xmm(s), Xmm(v));
  vaddss(Xmm(v), Xmm(v), Xmm(s));
}

void BnGenerator::emit_constants() {
  align(64);
  auto splat = [&](Label& l, uint32_t v) {
    L(l);
    for (int i = 0; i < 16; ++i) dd(v);
  };
  splat(c_zero_, 0);
  splat(c_hi16_, 0xffff0000u);
  splat(c_one_, 1);
  splat(c_7fff_, 0x7fff);
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  splat(c_alpha_, bits(c_.alpha));
  splat(c_inv_alpha_, bits(1.f / c_.alpha));
  splat(c_onef_, bits(1.f));
  splat(c_sel_alpha_, bits(1.f) ^ bits(c_.alpha));
  splat(c_sel_inv_alpha_, bits(1.f) ^ bits(1.f / c_.alpha));
  L(tail_mask_);
  for (int i = 0; i < 16; ++i) dd(i < tail_ ? 0xffffffffu : 0u);
}

namespace {

class GeneratedKernels final : public KernelSet {
 public:
  GeneratedKernels(const BnConf& c)
      : reduce_gen_(std::make_unique<BnGenerator>(c, BnGenerator::Kind::kReduce)),
        apply_gen_(std::make_unique<BnGenerator>(c, BnGenerator::Kind::kApply)) {}
  void reduce(const KernelArgs& a) const override { reduce_gen_->fn()(&a); }
  void apply(const KernelArgs& a) const override { apply_gen_->fn()(&a); }
  const BnGenerator& reduce_generator() const { return *reduce_gen_; }
  const BnGenerator& apply_generator() const { return *apply_gen_; }

 private:
  std::unique_ptr<BnGenerator> reduce_gen_, apply_gen_;
};

std::atomic<int64_t> g_generated{0};

// NORMGRAD_JIT_PROFILE=1: name each generated kernel in /tmp/perf-<pid>.map,
// the file `perf report` reads for code it has no symbols for, so profiles
// split the time between the reduce and apply kernels of each conf (what
// DNNL_JIT_PROFILE=1 does for oneDNN's kernels).
void register_with_perf(const BnGenerator& gen, const BnConf& conf, const char* kind) {
  static const bool enabled = [] {
    const char* v = std::getenv("NORMGRAD_JIT_PROFILE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (!enabled) return;
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  const std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  if (FILE* f = std::fopen(path.c_str(), "a")) {
    std::fprintf(f, "%llx %zx normgrad_%s_%s\n",
                 static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(gen.getCode())),
                 gen.getSize(), kind, conf.key().c_str());
    std::fclose(f);
  }
}

}  // namespace

int64_t generated_kernel_sets() {
  return g_generated.load();
}

StatusOr<std::shared_ptr<const KernelSet>> generate_kernels(const BnConf& conf) {
  if (conf.isa == Isa::kPortable || conf.empty) return portable_kernels(conf);
  return generate_guarded<KernelSet>(conf.kernel_name(), [&] {
    auto k = std::make_shared<GeneratedKernels>(conf);
    register_with_perf(k->reduce_generator(), conf, "reduce");
    register_with_perf(k->apply_generator(), conf, "apply");
    g_generated.fetch_add(1);
    return k;
  });
}

}  // namespace jit
}  // namespace normgrad
