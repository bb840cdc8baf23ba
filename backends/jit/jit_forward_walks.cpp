// The four walks of the JIT batch-norm forward (FwdGenerator, declared in
// jit_forward_generator.hpp), on AVX-512 and AVX2, and their constants.
//   rows stats    `rows` rows (or a row piece) of one channel: S1, S2 of (x - K);
//                 four independent vector chains, a masked tail, one fixed
//                 horizontal sum, so a row's sums depend on its data only
//   rows apply    y = (x - hi) a + b [+ r] [relu] over a channel's rows
//   pixels stats  `len` pixels of C channels (or of a strip's, C apart:
//                 FwdConf::strip_channels): per channel vector S1, S2; the
//                 channels in blocks whose sums stay in registers while the
//                 pixels stream past (8 vectors on AVX-512, 6 on AVX2)
//   pixels apply  channel blocks with their coefficients in registers, each
//                 over the call's pixels (4 vectors on AVX-512, 2 on AVX2);
//                 16-bit data of whole lines: each pixel's row whole, a line
//                 per step, the coefficients from memory (pixels_apply_lines)
#include <algorithm>
#include <cstring>

#include <normgrad/backends/jit/jit_forward_generator.hpp>

namespace normgrad {
namespace jit {

using namespace Xbyak;

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
        load_vec(t, elem(r8, off), masked);
        if (masked) {
          vsubps(Zmm(t) | k1 | T_z, Zmm(t), Zmm(k));
        } else {
          vsubps(vmm(t), vmm(t), vmm(k));
        }
        accumulate(u, t);
      },
      [&] {
        copy_tail(kBounceX, r8, true, 8);
        load_vec(8, rsp + kBounceX, false);
        vsubps(vmm(8), vmm(8), vmm(k));
        mask_from_rcx_avx2(14);
        vandps(vmm(8), vmm(8), vmm(14));  // lanes past the tail add nothing
        accumulate(0, 8);
      });
  mov(rcx, row_stride_bytes());
  add(r8, rcx);
  dec(rbx);
  jnz(row, T_NEAR);
  fold_chains(0, 8);
  fold_chains(4, 9);
  mov(rcx, ptr[rdi + offsetof(FwdArgs, s1)]);
  vmovss(ptr[rcx], xmm0);
  mov(rcx, ptr[rdi + offsetof(FwdArgs, s2)]);
  vmovss(ptr[rcx], xmm4);
  rows_epilogue();
  pop(rbx);
  vzeroupper();
  ret();
}

// One step of the AVX2 bf16 rows apply in pairs (FwdConf::pair_vectors): 16
// elements at rsi + off, the even ones in v0 and the odd ones in v1, each
// normalised and through the epilogue (no residual) as the vector at a time
// is, and stored as 16 bf16 words in one 32-byte store. Scratch v2..7.
void FwdGenerator::pair_step(const std::function<void(int)>& normalise, int64_t off) {
  load_pair(0, 1, elem(r8, off));
  for (int h = 0; h < 2; ++h) {
    normalise(h);
    epilogue(h, 2 + 3 * h, 4 + 3 * h, nullptr, false);
  }
  store_pair(elem(r9, off), 0, 1, 2, nt_);
}

void FwdGenerator::rows_apply() {
  // AVX-512: data v0..3, scratch v4..11, hi/lo/a/b v27..30, zero v31, alpha v26.
  // AVX2 (two vectors a step): data v0..1, scratch v2..7, hi/lo/a/b v8..11,
  // zero v12, alpha v13, the bf16 pairs' constants v14..15.
  const int unroll = avx512_ ? 4 : 2;
  const int cf = avx512_ ? 27 : 8;
  zero_ = avx512_ ? 31 : 12;
  alpha_ = avx512_ ? 26 : 13;
  push(rbx);
  rows_prologue();
  load_args();
  mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
  for (int i : {0, 2, 3}) vbroadcastss(vmm(cf + i), ptr[rax + 4 * i]);  // lo (1) is 0, in b
  zero(zero_);
  load_alpha();
  if (c_.pair_vectors) keep_bf16_constants(14, 15);  // free: 16-bit data has no f32 tail mask
  auto normalise = [&](int v) {
    vsubps(vmm(v), vmm(v), vmm(cf));  // cf + 1, the mean's low part, is in b (Finish)
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
        load_vec(u, elem(r8, off), masked);
        normalise(u);
        const RegExp ra = elem(r10, off);
        epilogue(u, t_of(u), m_of(u), &ra, masked);
        store(elem(r9, off), u, t_of(u), n_of(u), m_of(u), masked);
      },
      [&] {
        copy_tail(kBounceX, r8, true, 0);
        if (c_.residual) copy_tail(kBounceR, r10, true, 0);
        load_vec(0, rsp + kBounceX, false);
        normalise(0);
        const RegExp ra = rsp + kBounceR;
        epilogue(0, t_of(0), m_of(0), &ra, false);
        store(rsp + kBounceY, 0, t_of(0), n_of(0), m_of(0), false, false);
        copy_tail(kBounceY, r9, false);
      },
      c_.pair_vectors ? std::function<void()>([&] { pair_step(normalise); }) : nullptr,
      c_.prefetch_next_channel ? std::function<void()>([&] {
        // The next channel's src at this row and offset, into the L2.
        const int64_t step_bytes = unroll * lanes_ * es_, row_bytes = c_.spatial * es_;
        for (int64_t b = 0; b < step_bytes; b += 64)
          prefetcht1(ptr[r8 + rsi * es_ + static_cast<int>(row_bytes + b)]);
      })
                               : nullptr);
  mov(rcx, row_stride_bytes());
  add(r8, rcx);
  add(r9, rcx);
  if (c_.residual) add(r10, rcx);
  dec(rbx);
  jnz(row, T_NEAR);
  rows_epilogue();
  pop(rbx);
  drop_bf16_constants();
  if (nt_) sfence();
  vzeroupper();
  ret();
}

// Pixels walk. Channel vectors: nv = ceil(C / lanes), the last one masked
// when C is not a multiple of the lanes (k1 on AVX-512, vmm(mask_) on AVX2).
// The pixels statistics' arguments: x r8, K rax, len rdx, S1 r9, S2 r10,
// and the tail's mask (AVX-512 k1, AVX2 f32 v15).
void FwdGenerator::stats_prologue() {
  load_args();
  if (tail_ != 0 && avx512_) {
    mov(r11d, (1 << tail_) - 1);
    kmovw(k1, r11d);
  } else if (tail_ != 0 && c_.dt == DataType::kF32) {
    mask_ = 15;
    vmovups(Ymm(mask_), ptr[rip + c_masks_ + (8 - tail_) * 4]);
  }
  mov(r9, ptr[rdi + offsetof(FwdArgs, s1)]);
  mov(r10, ptr[rdi + offsetof(FwdArgs, s2)]);
}

void FwdGenerator::pixels_stats() {
  const int64_t nv = (width() + lanes_ - 1) / lanes_;
  // Channel vectors per sweep over the chunk's pixels: as many as the sums
  // fit in registers, so a pixel's row is cut into few slices. On AVX2, 6
  // (three lines of f32): their two sums, one data temporary (renaming makes
  // one enough) and the tail mask take 14 of the 16 registers. 6 beats 4
  // (fewer slices), and 7's slices end inside lines (docs/jit-rules.md).
  // Each channel's sums run over the pixels in order whatever the block: the
  // same bits for any block.
  const int block = avx512_ ? 8 : 6;
  const int vbytes = lanes_ * 4;
  stats_prologue();
  for (int64_t first = 0; first < nv; first += block) {
    const int b = static_cast<int>(std::min<int64_t>(block, nv - first));
    // S1 v0.., S2 v<block>..; AVX-512: K v16..23 and data v24..31; AVX2: K
    // from memory and data v14.
    const int k0 = 16;
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
      const bool masked = tail_ != 0 && first + v == nv - 1;
      const int t = avx512_ ? 24 + v : 14;
      load_vec(t, rsi + static_cast<int>((first + v) * lanes_ * es_), masked);
      if (c_.stats_prefetch && (v * lanes_ * es_) % 64 == 0 && first + block + v < nv)
        prefetcht0(ptr[rsi + static_cast<int>((first + block + v) * lanes_ * es_)]);
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

// FwdConf::stats_pixel_group: the chunk's sums live in memory (a.s1, a.s2,
// zeroed first); the pixels go by in groups of g, and each group is walked
// one channel block at a time (r11 its first channel), the block's sums
// loaded, g pixels added, the sums stored back. Each channel's sums still
// run over the pixels in order, exactly rounded at every step: the same
// bits as pixels_stats. Registers as there.
void FwdGenerator::pixels_stats_grouped() {
  const int64_t nv = (width() + lanes_ - 1) / lanes_;
  const int block = avx512_ ? 8 : 6;
  const int g = static_cast<int>(c_.stats_pixel_group);
  const int vbytes = lanes_ * 4;
  stats_prologue();
  zero(0);
  for (int64_t v = 0; v < nv; ++v) {
    vmovups(ptr[r9 + static_cast<int>(v * vbytes)], vmm(0));
    vmovups(ptr[r10 + static_cast<int>(v * vbytes)], vmm(0));
  }
  const int64_t whole_blocks = (nv - (tail_ != 0 ? 1 : 0)) / block;
  const int left = static_cast<int>(nv - whole_blocks * block);
  auto blocks = [&](int pixels) {
    xor_(r11, r11);
    if (whole_blocks > 0) {
      Label blk;
      L(blk);
      pixels_stats_block(block, false, pixels);
      add(r11, block * static_cast<int>(lanes_));
      cmp(r11, static_cast<uint32_t>(whole_blocks * block * lanes_));
      jl(blk, T_NEAR);
    }
    if (left > 0) pixels_stats_block(left, tail_ != 0, pixels);
  };
  mov(rsi, r8);
  mov(rcx, rdx);
  Label group, rest, single, done;
  L(group);
  cmp(rcx, g);
  jl(rest, T_NEAR);
  blocks(g);
  add(rsi, static_cast<int>(g * c_.c * es_));
  sub(rcx, g);
  jmp(group, T_NEAR);
  L(rest);
  test(rcx, rcx);
  jz(done, T_NEAR);
  L(single);
  blocks(1);
  add(rsi, static_cast<int>(c_.c * es_));
  dec(rcx);
  jnz(single, T_NEAR);
  L(done);
  vzeroupper();
  ret();
}

// One block of nb channel vectors from channel r11 over `g` pixels from
// rsi: S1 v0.., S2 v<8 or 6>.., loaded and stored back; the last vector
// masked when tail_last. AVX-512: K v16..23, data v24..31; AVX2: K from
// memory, data v14.
void FwdGenerator::pixels_stats_block(int nb, bool tail_last, int g) {
  const int block = avx512_ ? 8 : 6;
  const int vbytes = lanes_ * 4;
  for (int v = 0; v < nb; ++v) {
    vmovups(vmm(v), ptr[r9 + r11 * 4 + v * vbytes]);
    vmovups(vmm(block + v), ptr[r10 + r11 * 4 + v * vbytes]);
    if (avx512_) vmovups(Zmm(16 + v), ptr[rax + r11 * 4 + v * vbytes]);
  }
  for (int p = 0; p < g; ++p) {
    for (int v = 0; v < nb; ++v) {
      const bool masked = tail_last && v == nb - 1;
      const int t = avx512_ ? 24 + v : 14;
      load_vec(t, rsi + r11 * es_ + static_cast<int>(p * c_.c * es_ + v * lanes_ * es_), masked);
      if (avx512_) {
        vsubps(vmm(t), vmm(t), Zmm(16 + v));
      } else {
        vsubps(vmm(t), vmm(t), ptr[rax + r11 * 4 + v * vbytes]);
      }
      vaddps(vmm(v), vmm(v), vmm(t));
      vfmadd231ps(vmm(block + v), vmm(t), vmm(t));
    }
  }
  for (int v = 0; v < nb; ++v) {
    vmovups(ptr[r9 + r11 * 4 + v * vbytes], vmm(v));
    vmovups(ptr[r10 + r11 * 4 + v * vbytes], vmm(block + v));
  }
}

// FwdConf::pair_vectors in the pixels walk: a block's 16 channels as their
// even and odd ones, as pair_step takes a row's elements. The block's
// coefficients (hi, lo, a, b; 16 channels each) are split the same way once
// per block: even ones in v8, v10, v12, v14, odd ones in v9, v11, v13, v15
// (vshufps picks them within each 128-bit half, vpermpd puts the halves in
// order). Per pixel: one 32-byte load and store; scratch v2..5, alpha v6,
// zero v7.
void FwdGenerator::pixels_pair_block(int64_t first, int row) {
  const int f = static_cast<int>(first * 32);
  for (int k : {0, 2, 3}) {  // lo (k = 1) is 0, in b
    vmovups(Ymm(2), ptr[rax + k * row + f]);
    vmovups(Ymm(3), ptr[rax + k * row + f + 32]);
    vshufps(Ymm(8 + 2 * k), Ymm(2), Ymm(3), 0x88);
    vpermpd(Ymm(8 + 2 * k), Ymm(8 + 2 * k), 0xD8);
    vshufps(Ymm(9 + 2 * k), Ymm(2), Ymm(3), 0xDD);
    vpermpd(Ymm(9 + 2 * k), Ymm(9 + 2 * k), 0xD8);
  }
  mov(rsi, r8);
  mov(rcx, r9);
  mov(rbx, rdx);
  const int d = static_cast<int>(first * lanes_ * es_);
  Label pix;
  L(pix);
  load_pair(0, 1, rsi + d);
  for (int h = 0; h < 2; ++h) {
    vsubps(Ymm(h), Ymm(h), Ymm(8 + h));
    vfmadd213ps(Ymm(h), Ymm(12 + h), Ymm(14 + h));
    epilogue(h, 2, 4, nullptr, false);
  }
  store_pair(rcx + d, 0, 1, 2, nt_);
  add(rsi, static_cast<int>(c_.c * es_));
  add(rcx, static_cast<int>(c_.c * es_));
  dec(rbx);
  jnz(pix, T_NEAR);
}

// FwdConf::line_walk (16-bit with C % 32 == 0, or a strip of 32s):
// pixel after pixel, each row (or the strip's part of it) 32 channels per
// step (one line of 16-bit dst, two of f32), rdi the step's byte offset in
// the row and 4 / es that its offset in the coefficient rows (f32), which
// the arithmetic reads as memory operands: x - hi, times a (loaded)
// plus b. On AVX2, bf16 without a residual in pairs (the coefficients in
// pair order, the odd channels' 32 bytes after the even ones'), otherwise
// vector by vector. Data v0..1, scratch v2..5 (alpha and zero as
// pixels_apply set them), the bf16 pairs' constants v8..9.
void FwdGenerator::pixels_apply_lines(int row) {
  const int step_bytes = 32 * es_;
  const int scale = 4 / es_;  // coefficient bytes per data byte
  auto normalise = [&](int v, int coef_disp) {
    const RegExp k = rax + rdi * scale + coef_disp;
    vsubps(vmm(v), vmm(v), ptr[k]);
    vmovups(vmm(5), ptr[k + 2 * row]);
    vfmadd213ps(vmm(v), vmm(5), ptr[k + 3 * row]);
  };
  mov(rsi, r8);
  mov(rcx, r9);
  mov(r11, r10);
  mov(rbx, rdx);
  Label pix, step;
  L(pix);
  xor_(rdi, rdi);
  L(step);
  if (c_.pair_vectors) {
    for (int p = 0; p < 2; ++p) {  // 16 channels each: 32 bytes of data, 64 of coefficients
      load_pair(0, 1, rsi + rdi + 32 * p);
      for (int h = 0; h < 2; ++h) {
        normalise(h, 64 * p + 32 * h);
        epilogue(h, 2, 4, nullptr, false);
      }
      store_pair(rcx + rdi + 32 * p, 0, 1, 2, nt_);
    }
  } else {
    // 8 channels a vector on AVX2, 16 on AVX-512: es bytes of data and 4
    // of coefficients a channel.
    const int vectors = static_cast<int>(32 / lanes_);
    for (int v = 0; v < vectors; ++v) {
      const int d = v * lanes_ * es_;
      load_vec(0, rsi + rdi + d, false);
      normalise(0, scale * d);
      const RegExp ra = r11 + rdi + d;
      epilogue(0, 2, 4, &ra, false);
      store(rcx + rdi + d, 0, 2, 3, 4, false);
    }
  }
  add(rdi, step_bytes);
  cmp(rdi, static_cast<int>(width() * es_));
  jl(step, T_NEAR);
  add(rsi, static_cast<int>(c_.c * es_));
  add(rcx, static_cast<int>(c_.c * es_));
  if (c_.residual) add(r11, static_cast<int>(c_.c * es_));
  dec(rbx);
  jnz(pix, T_NEAR);
}

// Channel blocks with their hi/lo/a(/b) in registers for the whole call, each
// block over the call's pixels (few enough to stay in the L1/L2 from one
// block to the next: conf.apply_pixels).
void FwdGenerator::pixels_apply() {
  // lo is 0 (Finish folds it into b): its registers stay unused.
  // AVX-512: blocks of 4; data v0..3, t v4..7, n v8..11, hi/lo/a/b v12..27,
  // alpha v28, zero v31. AVX2: blocks of 2; data v0..1, t v2..3, n v4, m v5,
  // alpha v6, zero v7, hi/lo/a v8..13 (b from memory), tail mask v15
  // (pixels_pair_block has its own plan).
  const int block = avx512_ ? 4 : 2;
  const int hi0 = avx512_ ? 12 : 8;
  zero_ = avx512_ ? 31 : 7;
  alpha_ = avx512_ ? 28 : 6;
  mask_ = 15;
  const int64_t nv = (width() + lanes_ - 1) / lanes_;
  const int vbytes = lanes_ * 4;
  push(rbx);
  load_args();
  if (tail_ != 0 && avx512_) {
    mov(r11d, (1 << tail_) - 1);
    kmovw(k1, r11d);
  } else if (tail_ != 0 && c_.dt == DataType::kF32) {
    vmovups(Ymm(mask_), ptr[rip + c_masks_ + (8 - tail_) * 4]);
  }
  zero(zero_);
  load_alpha();
  const int row = static_cast<int>(cp_ * 4);
  if (c_.line_walk) {
    if (c_.pair_vectors) keep_bf16_constants(8, 9);  // the line walk uses v0..v7
    pixels_apply_lines(row);
    drop_bf16_constants();
  } else {
    for (int64_t first = 0; first < nv; first += block) {
      const int b = static_cast<int>(std::min<int64_t>(block, nv - first));
      if (c_.pair_vectors && b == 2 && !(tail_ != 0 && first + 1 == nv - 1)) {
        pixels_pair_block(first, row);
        continue;
      }
      for (int v = 0; v < b; ++v) {
        const int f = static_cast<int>((first + v) * vbytes);
        vmovups(vmm(hi0 + v), ptr[rax + f]);
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
        const bool masked = tail_ != 0 && first + v == nv - 1;
        const int d = static_cast<int>((first + v) * lanes_ * es_);
        const int t = block + v, n = avx512_ ? 8 + v : 4, m = avx512_ ? 8 + v : 5;
        load_vec(v, rsi + d, masked);
        vsubps(vmm(v), vmm(v), vmm(hi0 + v));
        if (avx512_) {
          vfmadd213ps(vmm(v), vmm(hi0 + 2 * block + v), vmm(hi0 + 3 * block + v));
        } else {
          vfmadd213ps(vmm(v), vmm(hi0 + 2 * block + v),
                      ptr[rax + 3 * row + static_cast<int>((first + v) * vbytes)]);
        }
        const RegExp ra = r11 + d;
        epilogue(v, t, m, &ra, masked);
        store(rcx + d, v, t, n, m, masked);
      }
      add(rsi, static_cast<int>(c_.c * es_));
      add(rcx, static_cast<int>(c_.c * es_));
      if (c_.residual) add(r11, static_cast<int>(c_.c * es_));
      dec(rbx);
      jnz(pix, T_NEAR);
    }
  }
  pop(rbx);
  if (nt_) sfence();
  vzeroupper();
  ret();
}

void FwdGenerator::emit_constants() {
  emit_shared_constants();
  uint32_t alpha_bits;
  std::memcpy(&alpha_bits, &c_.alpha, sizeof alpha_bits);
  L(c_alpha_);
  for (int i = 0; i < 16; ++i) dd(alpha_bits);
  // AVX2 tail masks: the 8 dwords from entry 8 - n have their low n lanes set.
  L(c_masks_);
  for (int i = 0; i < 16; ++i) dd(i < 8 ? 0xffffffffu : 0u);
}

}  // namespace jit
}  // namespace normgrad
