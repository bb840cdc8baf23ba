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

#include <algorithm>
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
    : VecEmitter(kCodeBytes, c.isa, c.avx512_bf16, c.d.data_dt,
                 static_cast<int>(c.walk.cols % (c.isa == Isa::kAvx512 ? 16 : 8))),
      c_(c),
      kind_(kind),
      cp_(padded_channels(c.d.channels)),
      side_out_(kind == Kind::kReduce && c.dy_side_out) {
  mask_ = kMask;
  // With a side output the apply reads the reduce's stored diff_dst: no producer.
  if (kind == Kind::kApply && c_.dy_side_out) c_.dy_fuse = Fuse::kNone;
  if (c.walk.kind == Walk::kRows && c.walk.channel_group > 0) {
    kind == Kind::kReduce ? rows_reduce_grouped() : rows_apply_grouped();
  } else if (c.walk.kind == Walk::kRows) {
    kind == Kind::kReduce ? rows_reduce() : rows_apply();
  } else {
    kind == Kind::kReduce ? pixels_reduce() : pixels_apply();
  }
  emit_constants();
  finish();
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
  if (side_out_) {
    push(r14);
    mov(r14, ptr[rdi + offsetof(KernelArgs, dy_out)]);
  }
  if (uses_third(c_.dy_fuse)) {
    push(r15);
    mov(r15, ptr[rdi + offsetof(KernelArgs, dy3)]);
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
  advance_rows(1, with_dx);
}

void BnGenerator::epilogue() {
  if (uses_third(c_.dy_fuse)) pop(r15);
  if (side_out_) pop(r14);
  if (fused()) {
    pop(r13);
    pop(r12);
  }
  if (bounce_stores() && avx512_) pop(rbx);
  vzeroupper();
  ret();
}

// Loads src (port 0) or diff_dst (port 1) into vmm(dst), computing a fused
// producer on the fly; vmm(tmp) is clobbered when the port is fused.
void BnGenerator::load_port(int port, int dst, int tmp, int64_t off, bool tail) {
  load_fused(port, dst, tmp, off, tail, port == 0 ? c_.x_fuse : c_.dy_fuse);
  // The side output: the fused diff_dst, exact in the data type (masked, or
  // rounded as the Add's output is), stored where the apply will read it.
  if (port == 1 && side_out_) store_exact(at(r14, off), dst, tail, tmp);
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
    round_to_dt(dst, tmp);  // as the unfused graph stores the Add's output
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
  } else {
    // ReLU backward: the gradient where the forward value is > 0 (NaN
    // compares false); with kAddReluBackward the gradient is two gradients'
    // sum, rounded as the unfused Add stores it.
    load(dst, second, off, tail);
    if (f == Fuse::kAddReluBackward) {
      load(tmp, r15, off, tail);
      vaddps(vmm(dst), vmm(dst), vmm(tmp));
      round_to_dt(dst, tmp);
    }
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
  load_vec(dst, at(base, off), tail);
}

// Stores vector `src` (f32) to `base` at element `off`, converting; clobbers
// kScratch0..2.
void BnGenerator::store(const Reg64& base, int64_t off, int src, bool tail, bool nt) {
  store_vec(at(base, off), src, tail, nt && !tail, kScratch0, kScratch1, kScratch2);
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

// Copies the grouped rows apply's bounce block (jit_generator_rows.cpp; r9:
// rdi rows of S elements) to diff_src (rcx) through stream_copy;
// clobbers rax, rbx, r11, k4 and v8.
void BnGenerator::stream_block() {
  assert((avx512_ || c_.walk.cols * es_ >= 128) && "the AVX2 copy's ends take 64 bytes each");
  imul(rax, rdi, static_cast<int>(c_.walk.cols * es_));
  stream_copy(r9, rcx, rax, r11, rbx, kScratch0);
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

void BnGenerator::emit_constants() {
  emit_shared_constants();
  auto splat = [&](Label& l, uint32_t v) {
    L(l);
    for (int i = 0; i < 16; ++i) dd(v);
  };
  splat(c_zero_, 0);
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

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// NORMGRAD_JIT_DUMP's file name: the kernel's kind and key, '/' (as in
// "bf16/f32") written as '_'.
std::string dump_file_name(const std::string& key, const char* kind) {
  std::string name = std::string("normgrad_") + kind + "_" + key + ".bin";
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

}  // namespace

void register_kernel_code(const Xbyak::CodeGenerator& gen, const std::string& key,
                          const char* kind) {
  static const bool profile = env_is_one("NORMGRAD_JIT_PROFILE");
  static const bool dump = env_is_one("NORMGRAD_JIT_DUMP");
  if (!profile && !dump) return;
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  if (profile) {
    const std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
    if (FILE* f = std::fopen(path.c_str(), "a")) {
      std::fprintf(f, "%llx %zx normgrad_%s_%s\n",
                   static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(gen.getCode())),
                   gen.getSize(), kind, key.c_str());
      std::fclose(f);
    }
  }
  if (dump) {
    const std::string name = dump_file_name(key, kind);
    FILE* f = std::fopen(name.c_str(), "wb");
    const bool ok =
        f != nullptr && std::fwrite(gen.getCode(), 1, gen.getSize(), f) == gen.getSize();
    if (f != nullptr && std::fclose(f) != 0)
      std::fprintf(stderr, "normgrad: NORMGRAD_JIT_DUMP: closing %s failed\n", name.c_str());
    if (!ok) std::fprintf(stderr, "normgrad: NORMGRAD_JIT_DUMP: cannot write %s\n", name.c_str());
  }
}

int64_t generated_kernel_sets() {
  return g_generated.load();
}

StatusOr<std::shared_ptr<const KernelSet>> generate_kernels(const BnConf& conf) {
  if (conf.isa == Isa::kPortable || conf.empty) return portable_kernels(conf);
  return generate_guarded<KernelSet>(conf.kernel_name(), [&] {
    auto k = std::make_shared<GeneratedKernels>(conf);
    register_kernel_code(k->reduce_generator(), conf.key(), "reduce");
    register_kernel_code(k->apply_generator(), conf.key(), "apply");
    g_generated.fetch_add(1);
    return k;
  });
}

}  // namespace jit
}  // namespace normgrad
