// Xbyak generator of the batch-norm backward kernels (AVX-512 and AVX2+F16C):
// the shared pieces, the rows walk, and generate_kernels.
//
// Everything the loops depend on is a generation-time constant: dtype, walk,
// row length (S or C), row stride, tail length. Main loops run U = 4 vectors
// per iteration with independent accumulators; tails use opmask registers on
// AVX-512 and vmaskmovps / vpinsrw / vpextrw on AVX2. Code is generated into
// a read-write buffer and then made read+execute (never writable and
// executable at once).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>

#include <xbyak/xbyak.h>

#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {

using namespace Xbyak;

namespace {

constexpr int kUnroll = 4;
constexpr int64_t kPerRowSumCols = 256;      // rows this long get a horizontal sum each
constexpr int64_t kPrefetchRowBytes = 1024;  // rows up to this long get the next one prefetched
constexpr size_t kCodeBytes = 64 * 1024;

}  // namespace

BnGenerator::BnGenerator(const BnConf& c, Kind kind)
    : CodeGenerator(kCodeBytes, DontSetProtectRWE),
      c_(c),
      avx512_(c.isa == Isa::kAvx512),
      lanes_(avx512_ ? 16 : 8),
      es_(static_cast<int>(dtype_size(c.d.data_dt))),
      cp_(padded_channels(c.d.channels)),
      tail_(c.cols % lanes_) {
  if (c.walk == Walk::kRows) {
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
  if (fused()) {
    // Callee-saved registers for the fused producers' second inputs.
    push(r12);
    push(r13);
    mov(r12, ptr[rdi + offsetof(KernelArgs, x2)]);
    mov(r13, ptr[rdi + offsetof(KernelArgs, dy2)]);
  }
  if (tail_ == 0) return;
  if (avx512_) {
    mov(eax, (1u << tail_) - 1);
    kmovw(k1, eax);
  } else if (c_.d.data_dt == DataType::kF32) {
    vmovups(vmm(kMask), ptr[rip + tail_mask_]);
  }
}

// Short rows far apart (NCX with small spatial: a row every C*S elements) miss
// the TLB and the hardware prefetchers on every row; touch the next row of the
// inputs while this one is computed.
void BnGenerator::prefetch_next_row() {
  const int64_t row_bytes = c_.cols * es_;
  if (c_.walk != Walk::kRows || row_bytes > kPrefetchRowBytes) return;
  mov(rax, c_.row_stride * es_);
  for (int64_t off = 0; off < row_bytes; off += 64) {
    prefetcht0(ptr[rsi + rax + off]);
    prefetcht0(ptr[rdx + rax + off]);
    if (c_.x_fuse != Fuse::kNone) prefetcht0(ptr[r12 + rax + off]);
    if (c_.dy_fuse != Fuse::kNone) prefetcht0(ptr[r13 + rax + off]);
  }
}

void BnGenerator::next_row(bool with_dx) {
  mov(rax, c_.row_stride * es_);
  add(rsi, rax);
  add(rdx, rax);
  if (c_.x_fuse != Fuse::kNone) add(r12, rax);
  if (c_.dy_fuse != Fuse::kNone) add(r13, rax);
  if (with_dx) {  // diff_src may be laid out with its own row stride
    mov(rax, c_.dx_row_stride * es_);
    add(rcx, rax);
  }
}

void BnGenerator::epilogue() {
  if (fused()) {
    pop(r13);
    pop(r12);
  }
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
  const Fuse f = port == 0 ? c_.x_fuse : c_.dy_fuse;
  const Reg64& first = port == 0 ? rsi : rdx;
  const Reg64& second = port == 0 ? r12 : r13;
  if (f == Fuse::kNone) {
    load(dst, first, off, tail);
  } else if (f == Fuse::kAdd) {
    load(dst, first, off, tail);
    load(tmp, second, off, tail);
    vaddps(vmm(dst), vmm(dst), vmm(tmp));
    round_to_data_dtype(dst, tmp);
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

// Stores vector `src` (f32) to `base` at element `off`, converting; clobbers kScratch0..2.
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
  } else {
    // Round to nearest even by integer arithmetic; NaN keeps its top bits and gets the quiet bit.
    const Xmm t = vmm(kScratch1), n = vmm(kScratch2);
    vpsrld(t, s, 16);
    if (avx512_) {
      vpandd(t, t, ptr[rip + c_one_]);
    } else {
      vpand(t, t, ptr[rip + c_one_]);
    }
    vpaddd(t, t, ptr[rip + c_7fff_]);
    vpaddd(t, t, s);
    vpsrld(t, t, 16);
    vpsrld(n, s, 16);
    if (avx512_) {
      vpord(n, n, ptr[rip + c_0040_]);
    } else {
      vpor(n, n, ptr[rip + c_0040_]);
    }
    if (avx512_) {
      vcmpps(k2, s, s, 3);  // unordered: NaN
      vmovdqa32(t | k2, n);
      vpmovdw(half(w), t);
    } else {
      vcmpps(vmm(w), s, s, 3);
      vblendvps(t, t, n, vmm(w));
      vextracti128(Xmm(kScratch2), Ymm(kScratch1), 1);
      vpackusdw(Xmm(w), Xmm(kScratch1), Xmm(kScratch2));
    }
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
  const int64_t nvec = c_.cols / lanes_;
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

// rows_reduce: a_j = v0..3 (sum dy), b_j = v4..7 (sum dy (x - mean)), x/dy temps v8/v9,
// mean v12, f64 totals xmm13/xmm14.
void BnGenerator::rows_reduce() {
  // Short rows keep their vector sums across rows (a horizontal sum per row
  // would cost more than the row); long rows are summed per row and
  // accumulated in f64. Both orders are fixed, so results do not depend on threads.
  const bool per_row = c_.cols >= kPerRowSumCols;
  prologue();
  vbroadcastss(vmm(12), ptr[r8 + 12]);
  vxorpd(Xmm(13), Xmm(13), Xmm(13));
  vxorpd(Xmm(14), Xmm(14), Xmm(14));
  Label row, done;
  auto zero_sums = [&] {
    for (int j = 0; j < 8; ++j)
      vxorps(Xmm(j), Xmm(j), Xmm(j));  // VEX zeroing clears the full register
  };
  auto fold_sums = [&] {
    vaddps(vmm(0), vmm(0), vmm(1));
    vaddps(vmm(2), vmm(2), vmm(3));
    vaddps(vmm(0), vmm(0), vmm(2));
    vaddps(vmm(4), vmm(4), vmm(5));
    vaddps(vmm(6), vmm(6), vmm(7));
    vaddps(vmm(4), vmm(4), vmm(6));
    hsum(0, 10);
    hsum(4, 10);
    vcvtss2sd(Xmm(15), Xmm(15), Xmm(0));
    vaddsd(Xmm(13), Xmm(13), Xmm(15));
    vcvtss2sd(Xmm(15), Xmm(15), Xmm(4));
    vaddsd(Xmm(14), Xmm(14), Xmm(15));
  };
  if (!per_row) zero_sums();
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  prefetch_next_row();
  if (per_row) zero_sums();
  cols_loop([&](int j, int64_t off, bool tail) {
    load_port(0, 8, 10, off, tail);
    load_port(1, 9, 10, off, tail);
    vaddps(vmm(j), vmm(j), vmm(9));
    vsubps(vmm(8), vmm(8), vmm(12));
    vfmadd231ps(vmm(4 + j), vmm(9), vmm(8));
  });
  if (per_row) fold_sums();
  next_row(false);
  dec(r10);
  jnz(row, T_NEAR);
  L(done);
  if (!per_row) fold_sums();
  vaddsd(Xmm(13), Xmm(13), ptr[r9]);
  vmovsd(ptr[r9], Xmm(13));
  vaddsd(Xmm(14), Xmm(14), ptr[r9 + 8]);
  vmovsd(ptr[r9 + 8], Xmm(14));
  epilogue();
}

// The row loop of both apply kernels. With streaming stores, a row whose dx
// start is vector-aligned takes the non-temporal copy of the body; others (and
// tails) use ordinary stores.
void BnGenerator::apply_rows(const std::function<void(bool)>& body) {
  Label row, plain, row_end, done;
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  prefetch_next_row();
  if (c_.streaming_stores) {
    test(rcx, lanes_ * es_ - 1);
    jnz(plain, T_NEAR);
    body(true);
    jmp(row_end, T_NEAR);
  }
  L(plain);
  body(false);
  L(row_end);
  next_row(true);
  dec(r10);
  jnz(row, T_NEAR);
  if (c_.streaming_stores) sfence();
  L(done);
}

// rows_apply: x_j = v0..3, dy_j = v4..7; a, b, c, mean broadcast in v12..v15.
void BnGenerator::rows_apply() {
  prologue();
  for (int k = 0; k < 4; ++k) vbroadcastss(vmm(12 + k), ptr[r8 + 4 * k]);
  apply_rows([&](bool nt) {
    cols_loop([&](int j, int64_t off, bool tail) {
      load_port(0, j, 8, off, tail);
      load_port(1, 4 + j, 8, off, tail);
      vsubps(vmm(j), vmm(j), vmm(15));
      vfmadd213ps(vmm(4 + j), vmm(12), vmm(14));  // dy a + c
      vfmadd231ps(vmm(4 + j), vmm(j), vmm(13));   // + (x - mean) b
      store(rcx, off, 4 + j, tail, nt);
    });
  });
  epilogue();
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
  splat(c_0040_, 0x40);
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

 private:
  std::unique_ptr<BnGenerator> reduce_gen_, apply_gen_;
};

std::atomic<int64_t> g_generated{0};

}  // namespace

int64_t generated_kernel_sets() {
  return g_generated.load();
}

StatusOr<std::shared_ptr<const KernelSet>> generate_kernels(const BnConf& conf) {
  if (conf.isa == Isa::kPortable) return portable_kernels(conf);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto k = std::make_shared<GeneratedKernels>(conf);
    g_generated.fetch_add(1);
    k->generate_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return std::shared_ptr<const KernelSet>(std::move(k));
  } catch (const Xbyak::Error& e) {
    return internal_error(std::string("Xbyak: ") + e.what() + " while generating " +
                          conf.kernel_name());
  } catch (const std::exception& e) {
    return internal_error(std::string("JIT generation: ") + e.what());
  }
}

}  // namespace jit
}  // namespace normgrad
