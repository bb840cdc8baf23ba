// Xbyak generator, the pixels walk: P pixels of C contiguous channels (NXC,
// or NCX with spatial 1), with per-channel sums and coefficients as vectors.
//
// Rows that fit the registers (up to 8 vectors for the reduction, 4 for the
// apply on AVX-512) keep sums or coefficients in zmm16..31 for the whole call.
// Wider f32 rows on AVX-512 take the channel-blocked kernels: pixels in groups
// of conf.walk.pixel_group, each group walked one block of channels at a time with
// the block's sums or coefficients in registers, so memory operands are paid
// once per group instead of once per pixel (docs/performance.md, "Why the
// JIT chooses what it does", has the runs). The channel-swept kernels
// (conf.walk.sweep_rows) instead take one block of channels over every pixel
// of the call before the next block. The rest use memory operands per vector.
#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {

using namespace Xbyak;

// Per-vector walk over one pixel row, fully unrolled (short rows only).
void BnGenerator::each_vector(const std::function<void(int, int64_t, bool)>& step) {
  xor_(r11, r11);
  for (int64_t v = 0; v < row_vectors(); ++v) {
    step(static_cast<int>(v), v * lanes_, tail_ != 0 && v == row_vectors() - 1);
  }
}

// Moves every data pointer (the operands, a side output, diff_src by its
// own stride) `n` rows of the walk on; next_row is one of them.
void BnGenerator::advance_rows(int64_t n, bool with_dx) {
  mov(rax, n * c_.walk.row_stride * es_);
  add(rsi, rax);
  add(rdx, rax);
  if (uses_second(c_.x_fuse)) add(r12, rax);
  if (uses_second(c_.dy_fuse)) add(r13, rax);
  if (side_out_) add(r14, rax);
  if (uses_third(c_.dy_fuse)) add(r15, rax);
  if (with_dx) {
    mov(rax, n * c_.walk.dx_row_stride * es_);
    add(rcx, rax);
  }
}

// The pixel loop of the channel-blocked kernels: body(g) for whole groups of
// g pixels, then body(1) for the pixels left over (`rows` is a runtime count).
void BnGenerator::pixel_groups(int g, bool with_dx, const std::function<void(int)>& body) {
  Label group, rest, single, done;
  L(group);
  cmp(r10, g);
  jl(rest, T_NEAR);
  body(g);
  advance_rows(g, with_dx);
  sub(r10, g);
  jmp(group, T_NEAR);
  L(rest);
  test(r10, r10);
  jz(done, T_NEAR);
  L(single);
  body(1);
  advance_rows(1, with_dx);
  dec(r10);
  jnz(single, T_NEAR);
  L(done);
}

// Runs `walk`, which moves the data pointers and counts the rows down, and
// puts them back, so that the next channel block starts on the call's first row.
void BnGenerator::rewound(bool with_dx, const std::function<void()>& walk) {
  const bool x2 = uses_second(c_.x_fuse), dy2 = uses_second(c_.dy_fuse);
  push(rsi);
  push(rdx);
  push(r10);
  if (with_dx) push(rcx);
  if (x2) push(r12);
  if (dy2) push(r13);
  if (side_out_) push(r14);
  if (uses_third(c_.dy_fuse)) push(r15);
  walk();
  if (uses_third(c_.dy_fuse)) pop(r15);
  if (side_out_) pop(r14);
  if (dy2) pop(r13);
  if (x2) pop(r12);
  if (with_dx) pop(rcx);
  pop(r10);
  pop(rdx);
  pop(rsi);
}

// The channel blocks of one pixel group: whole blocks of `b` vectors in a
// runtime loop (r11 = the block's first channel), then the vectors left
// over, the tail last. block(nv, tail) emits one block of nv vectors.
void BnGenerator::channel_blocks(int b, const std::function<void(int, bool)>& block) {
  const int64_t whole = c_.walk.cols / lanes_;
  const int64_t nblocks = whole / b;
  const int left = static_cast<int>(whole % b) + (tail_ != 0 ? 1 : 0);
  xor_(r11, r11);
  if (nblocks > 0) {
    Label blk;
    L(blk);
    block(b, false);
    add(r11, b * lanes_);
    cmp(r11, static_cast<uint32_t>(nblocks * b * lanes_));
    jl(blk, T_NEAR);
  }
  if (left > 0) block(left, tail_ != 0);
}

// The sums of vectors 0..nv-1 of a block in zmm16..31 (sum dy, sum dy (x - mean)
// interleaved): zeroed, one vector of data added, and added into the memory arrays.
void BnGenerator::zero_sums(int nv) {
  for (int v = 0; v < nv; ++v) {
    vxorps(Xmm(16 + 2 * v), Xmm(16 + 2 * v), Xmm(16 + 2 * v));
    vxorps(Xmm(17 + 2 * v), Xmm(17 + 2 * v), Xmm(17 + 2 * v));
  }
}

// The mean of vector v of a block: zmm4..7 and zmm12..15 (the data takes
// zmm0..3, the fused loads' scratch zmm8..10).
int BnGenerator::mean_reg(int v) const {
  return v < 4 ? 4 + v : 8 + v;
}

void BnGenerator::load_means(int nv) {
  for (int v = 0; v < nv; ++v) vmovups(Zmm(mean_reg(v)), f32_at(r8, v * lanes_));
}

void BnGenerator::sum_vector(int v, int64_t off, bool tail) {
  const int x = 2 * (v % 2), dy = x + 1;
  load_port(0, x, kScratch0, off, tail);
  load_port(1, dy, kScratch0, off, tail);
  vaddps(Zmm(16 + 2 * v), Zmm(16 + 2 * v), vmm(dy));
  vsubps(vmm(x), vmm(x), Zmm(mean_reg(v)));
  vfmadd231ps(Zmm(17 + 2 * v), vmm(dy), vmm(x));
}

void BnGenerator::add_sums_to_memory(int nv) {
  for (int v = 0; v < nv; ++v) {
    vaddps(Zmm(16 + 2 * v), Zmm(16 + 2 * v), f32_at(r9, v * lanes_));
    vmovups(f32_at(r9, v * lanes_), Zmm(16 + 2 * v));
    vaddps(Zmm(17 + 2 * v), Zmm(17 + 2 * v), f32_at(r9, cp_ + v * lanes_));
    vmovups(f32_at(r9, cp_ + v * lanes_), Zmm(17 + 2 * v));
  }
}

// The coefficients a, b, c, mean of vectors 0..nv-1 of a block in zmm16..31,
// and one vector of diff_src computed from them.
void BnGenerator::load_coefs(int nv) {
  for (int v = 0; v < nv; ++v) {
    for (int k = 0; k < 4; ++k) vmovups(Zmm(16 + 4 * v + k), f32_at(r8, k * cp_ + v * lanes_));
  }
}

void BnGenerator::apply_vector(int v, int64_t off, int64_t dx_off, bool tail, bool nt) {
  const int x = 2 * (v % 4), dy = x + 1;
  load_port(0, x, 8, off, tail);
  load_port(1, dy, 8, off, tail);
  vsubps(vmm(x), vmm(x), Zmm(16 + 4 * v + 3));
  vfmadd213ps(vmm(dy), Zmm(16 + 4 * v), Zmm(16 + 4 * v + 2));  // dy a + c
  vfmadd231ps(vmm(dy), vmm(x), Zmm(16 + 4 * v + 1));           // + (x - mean) b
  store(rcx, dx_off, dy, tail, nt);
}

// pixels_reduce for rows longer than the registers (AVX-512): blocks of 8
// vectors keep both sums and the means in registers over a group of pixels,
// then add the sums into the memory arrays once per group instead of once per
// pixel.
void BnGenerator::pixels_reduce_blocked() {
  pixel_groups(c_.walk.pixel_group, false, [&](int g) {
    channel_blocks(8, [&](int nv, bool tail_last) {
      zero_sums(nv);
      load_means(nv);
      for (int p = 0; p < g; ++p) {
        for (int v = 0; v < nv; ++v)
          sum_vector(v, p * c_.walk.row_stride + v * lanes_, tail_last && v == nv - 1);
      }
      add_sums_to_memory(nv);
    });
  });
}

// PrefetchConf::sweep_ahead: the line of each input at element `off`, that
// many pixels on (one prefetch per line: every vector of f32, every other of
// 16-bit data).
void BnGenerator::prefetch_ahead(int v, int64_t off) {
  if (c_.prefetch.sweep_ahead == 0 || (v * lanes_ * es_) % 64 != 0) return;
  const int64_t disp = c_.prefetch.sweep_ahead * c_.walk.row_stride;
  prefetcht1(data(rsi, off + disp));
  prefetcht1(data(rdx, off + disp));
  if (uses_second(c_.x_fuse)) prefetcht1(data(r12, off + disp));
  if (uses_second(c_.dy_fuse)) prefetcht1(data(r13, off + disp));
}

// The channel-swept reduce: per block of 8 vectors, the sums over every
// pixel of the call in registers (two pixels per iteration).
void BnGenerator::pixels_reduce_swept() {
  channel_blocks(8, [&](int nv, bool tail_last) {
    zero_sums(nv);
    load_means(nv);
    rewound(false, [&] {
      pixel_groups(2, false, [&](int g) {
        for (int p = 0; p < g; ++p) {
          for (int v = 0; v < nv; ++v) {
            sum_vector(v, p * c_.walk.row_stride + v * lanes_, tail_last && v == nv - 1);
            prefetch_ahead(v, p * c_.walk.row_stride + v * lanes_);
          }
        }
      });
    });
    add_sums_to_memory(nv);
  });
}

// The apply's channel-blocked and channel-swept kernels, given how they walk
// the pixels with blocks of 4 vectors whose a, b, c and mean are in zmm16..31.
void BnGenerator::pixels_apply_wide() {
  const bool swept = c_.walk.sweep_rows > 0;
  auto block_rows = [&](int nv, bool tail_last, int g, bool nt) {
    for (int p = 0; p < g; ++p) {
      for (int v = 0; v < nv; ++v) {
        apply_vector(v, p * c_.walk.row_stride + v * lanes_, p * c_.walk.dx_row_stride + v * lanes_,
                     tail_last && v == nv - 1, nt);
        prefetch_ahead(v, p * c_.walk.row_stride + v * lanes_);
      }
    }
  };
  auto walk = [&](bool nt) {
    if (swept) {
      channel_blocks(4, [&](int nv, bool tail_last) {
        load_coefs(nv);
        rewound(true,
                [&] { pixel_groups(2, true, [&](int g) { block_rows(nv, tail_last, g, nt); }); });
      });
      return;
    }
    pixel_groups(c_.walk.pixel_group, true, [&](int g) {
      channel_blocks(4, [&](int nv, bool tail_last) {
        load_coefs(nv);
        block_rows(nv, tail_last, g, nt);
      });
    });
  };
  // Streaming stores need every vector aligned: the call's first diff_src
  // row, and a row stride of whole vectors.
  Label plain, done;
  if (c_.stream.nt_stores && (c_.walk.dx_row_stride % lanes_) == 0) {
    test(rcx, lanes_ * es_ - 1);
    jnz(plain, T_NEAR);
    walk(true);
    sfence();
    jmp(done, T_NEAR);
  }
  L(plain);
  walk(false);
  L(done);
}

// One pixel's row in pairs (pixel_pairs): pair(j, off) for the pair at
// element r11 + off, two (j = 0, 1: a line of 16-bit data) per step, then
// the odd one out.
void BnGenerator::row_pairs(const std::function<void(int, int64_t)>& pair) {
  const int64_t pairs = c_.walk.cols / 16;
  xor_(r11, r11);
  if (pairs >= 2) {
    Label step;
    L(step);
    pair(0, 0);
    pair(1, 16);
    add(r11, 32);
    cmp(r11, static_cast<uint32_t>(pairs / 2 * 32));
    jl(step, T_NEAR);
  }
  if (pairs % 2 != 0) pair(0, 0);
}

// pixel_pairs, the reduce of one pixel's row: two pairs (a line of each
// input) per step, the sums (pair order) read and written back as memory
// operands as the vector at a time does, in the same arithmetic: the same
// bits. It spends a shift and a mask per 16 channels where that spends two
// widening loads and two shifts. x in v0..1 and v4..5, dy in v2..3 and
// v6..7. Keeping a block's sums in registers over a group of pixels instead
// was slower at DRAM sizes (groups of 2 to 16: the loads stride across rows).
void BnGenerator::pixels_reduce_pairs() {
  auto pair = [&](int j, int64_t off) {
    const int x = 4 * j, dy = x + 2;
    load_pair(x, x + 1, at(rsi, off));
    load_pair(dy, dy + 1, at(rdx, off));
    for (int h = 0; h < 2; ++h) {
      vsubps(Ymm(x + h), Ymm(x + h), f32_at(r8, off + 8 * h));
      vmulps(Ymm(x + h), Ymm(x + h), Ymm(dy + h));
      vaddps(Ymm(dy + h), Ymm(dy + h), f32_at(r9, off + 8 * h));
      vmovups(f32_at(r9, off + 8 * h), Ymm(dy + h));
      vaddps(Ymm(x + h), Ymm(x + h), f32_at(r9, cp_ + off + 8 * h));
      vmovups(f32_at(r9, cp_ + off + 8 * h), Ymm(x + h));
    }
  };
  Label row, done;
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  row_pairs(pair);
  next_row(false);
  dec(r10);
  jnz(row, T_NEAR);
  L(done);
}

// pixel_pairs, the apply of one pixel's row: two pairs per step, x in v0..1
// and v4..5, dy (then diff_src) in v2..3 and v6..7, the coefficients (pair
// order) as memory operands in the vector at a time's arithmetic; scratch v8, a in kCoef.
void BnGenerator::pixels_apply_pairs(bool nt) {
  auto pair = [&](int j, int64_t off) {
    const int x = 4 * j, dy = x + 2;
    load_pair(x, x + 1, at(rsi, off));
    load_pair(dy, dy + 1, at(rdx, off));
    for (int h = 0; h < 2; ++h) {
      vsubps(Ymm(x + h), Ymm(x + h), f32_at(r8, 3 * cp_ + off + 8 * h));
      vmovups(Ymm(kCoef), f32_at(r8, off + 8 * h));
      vfmadd213ps(Ymm(dy + h), Ymm(kCoef), f32_at(r8, 2 * cp_ + off + 8 * h));  // dy a + c
      vfmadd231ps(Ymm(dy + h), Ymm(x + h), f32_at(r8, cp_ + off + 8 * h));
    }
    store_pair(at(rcx, off), dy, dy + 1, kScratch0, nt);
  };
  row_pairs(pair);
}

// pixels_reduce: acc[c] += dy and acc[Cp + c] += dy (x - mean[c]). On AVX-512,
// rows of up to 8 vectors keep both sums in zmm16..31 across all pixels of
// the call; longer rows take the channel-blocked kernel (f32) or add into the
// memory arrays (L1-resident) per pixel.
void BnGenerator::pixels_reduce() {
  prologue();
  if (pixel_pairs(c_)) {
    keep_bf16_constants(-1, 14);  // the loop uses v0..v7
    pixels_reduce_pairs();
    drop_bf16_constants();
    epilogue();
    return;
  }
  const bool in_regs = avx512_ && row_vectors() <= 8;
  if (!in_regs && (c_.walk.pixel_group > 0 || c_.walk.sweep_rows > 0)) {
    if (c_.walk.sweep_rows > 0) {
      pixels_reduce_swept();
    } else {
      pixels_reduce_blocked();
    }
    epilogue();
    return;
  }
  Label row, done;
  if (in_regs) {
    xor_(r11, r11);
    zero_sums(static_cast<int>(row_vectors()));
    load_means(static_cast<int>(row_vectors()));
  }
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  if (in_regs) {
    each_vector([&](int v, int64_t off, bool tail) { sum_vector(v, off, tail); });
  } else {
    cols_loop([&](int j, int64_t off, bool tail) {
      const int x = 2 * j, dy = 2 * j + 1;  // v0..v7
      load_port(0, x, 8, off, tail);
      load_port(1, dy, 8, off, tail);
      vsubps(vmm(x), vmm(x), f32_at(r8, off));
      vmulps(vmm(x), vmm(x), vmm(dy));
      vaddps(vmm(dy), vmm(dy), f32_at(r9, off));
      vmovups(f32_at(r9, off), vmm(dy));
      vaddps(vmm(x), vmm(x), f32_at(r9, cp_ + off));
      vmovups(f32_at(r9, cp_ + off), vmm(x));
    });
  }
  next_row(false);
  dec(r10);
  jnz(row, T_NEAR);
  L(done);
  if (in_regs) {
    xor_(r11, r11);
    add_sums_to_memory(static_cast<int>(row_vectors()));
  }
  epilogue();
}

// pixels_apply: coef = a | b | c | mean, each Cp floats. On AVX-512, rows of
// up to 4 vectors hold their coefficients in zmm16..31; longer rows take the
// channel-blocked kernel (f32) or read them as memory operands.
void BnGenerator::pixels_apply() {
  prologue();
  if (pixel_pairs(c_)) {
    keep_bf16_constants(13, 14);  // the loop uses v0..v8 and kCoef
    apply_rows(true, [&](bool nt) { pixels_apply_pairs(nt); });
    drop_bf16_constants();
    epilogue();
    return;
  }
  const bool in_regs = avx512_ && row_vectors() <= 4;
  if (!in_regs && (c_.walk.pixel_group > 0 || c_.walk.sweep_rows > 0)) {
    pixels_apply_wide();
    epilogue();
    return;
  }
  if (in_regs) {
    xor_(r11, r11);
    load_coefs(static_cast<int>(row_vectors()));
  }
  apply_rows(true, [&](bool nt) {
    if (in_regs) {
      each_vector([&](int v, int64_t off, bool tail) { apply_vector(v, off, off, tail, nt); });
      return;
    }
    cols_loop([&](int j, int64_t off, bool tail) {
      const int x = 2 * (j % 4), dy = x + 1;
      load_port(0, x, 8, off, tail);
      load_port(1, dy, 8, off, tail);
      vsubps(vmm(x), vmm(x), f32_at(r8, 3 * cp_ + off));
      vmovups(vmm(kCoef), f32_at(r8, off));
      vfmadd213ps(vmm(dy), vmm(kCoef), f32_at(r8, 2 * cp_ + off));  // dy a + c
      vfmadd231ps(vmm(dy), vmm(x), f32_at(r8, cp_ + off));
      store(rcx, off, dy, tail, nt);
    });
  });
  epilogue();
}
}  // namespace jit
}  // namespace normgrad
