// The grouped rows walk of the JIT batch-norm forward (FwdConf::channel_group):
// NCX rows of up to kShortRowBytes (7x7, 14x14, 10x10), a call taking up to
// a group of adjacent channels over `rows` images.
//
// Channel by channel, a 7x7 f32 layer reads 196 bytes and then jumps 400 KB
// to the channel's next row: a new page and a missed prefetch per row, and
// the masked tail and the call's setup for 49 elements. In NCX the group's
// rows of one image are one contiguous block (8 x 196 bytes), so the grouped
// kernels walk image by image, block after block, and the hardware
// prefetchers see one stream per image. Each row is straight-line code:
// whole vectors, then a constant tail (a k1 mask on AVX-512; on AVX2 a
// vmaskmovps load and stores of the tail's bytes: a whole vector would
// reach into the next row, and vmaskmovps stores are slow on AMD cores).
//   stats   each channel's S1, S2 of (x - K) in one vector of lane chains
//           each for the whole call (the group gives the independent
//           chains), summed across lanes at the end; the driver keeps each
//           chain to kFwdChainTerms terms through the rows it passes.
//   apply   channel after channel within an image, its hi, lo, a, b
//           broadcast from the call's coefficients; the same arithmetic as
//           the one-channel apply (the same bits for the same coefficients).
//           It prefetches the next group's row of the image (its block
//           follows this one) into the L2 for the next task's statistics,
//           and with FwdConf::bounce computes each image's block into an L1
//           buffer that stream_copy streams out.
#include <algorithm>

#include <normgrad/backends/jit/jit_forward_generator.hpp>
#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {

using namespace Xbyak;

// Elements [from, S) of one row as body(u, base + off, masked): the whole
// vectors (slot u cycling through `unroll`), then the constant tail.
void FwdGenerator::grouped_row(int unroll, const std::function<void(int, int64_t, bool)>& body,
                               int64_t from, int64_t base) {
  const int64_t s = c_.spatial;
  int u = 0;
  int64_t off = from;
  for (; off + lanes_ <= s; off += lanes_, u = (u + 1) % unroll) body(u, base + off, false);
  if (off < s) body(u, base + off, true);
}

// The low `bytes` bytes of vector v (under 32) to `e`: a 16-byte store of
// the low half if that much, then 8-, 4- and 2-byte pieces, each shifted
// down into scratch. Stores nothing past e + bytes.
void FwdGenerator::store_bytes(const RegExp& e, int v, int bytes, int scratch) {
  Xmm src(v);
  int pos = 0;
  if (bytes >= 16) {
    vmovdqu(ptr[e], Xmm(v));
    vextracti128(Xmm(scratch), Ymm(v), 1);
    src = Xmm(scratch);
    pos = 16;
  }
  for (int piece : {8, 4, 2}) {
    if (bytes - pos < piece) continue;
    if (piece == 8) {
      vmovq(ptr[e + pos], src);
    } else if (piece == 4) {
      vmovd(ptr[e + pos], src);
    } else {
      vpextrw(ptr[e + pos], src, 0);
    }
    pos += piece;
    if (pos < bytes) {
      vpsrldq(Xmm(scratch), src, piece);
      src = Xmm(scratch);
    }
  }
}

// The constant tail's mask: k1 on AVX-512, vmm(mask_) on AVX2 (f32 loads
// use it; 16-bit loads read the tail's words; the stats zero the lanes past
// the tail with it after subtracting K).
void FwdGenerator::grouped_tail_mask() {
  if (tail_ == 0) return;
  if (avx512_) {
    mov(r11d, (1 << tail_) - 1);
    kmovw(k1, r11d);
  } else {
    vmovups(Ymm(mask_), ptr[rip + c_masks_ + (8 - tail_) * 4]);
  }
}

void FwdGenerator::rows_stats_grouped() {
  // AVX-512: S1 of channel g in v16 + g, S2 in v24 + g, data v0..3, K v4.
  // AVX2: S1 v0..3, S2 v4..7, data v8..11, K v13, tail mask v14.
  const int group = c_.channel_group;
  const int s1 = avx512_ ? 16 : 0, s2 = avx512_ ? 24 : group;
  const int data = avx512_ ? 0 : 8, k = avx512_ ? 4 : 13;
  mask_ = 14;
  push(rbx);
  load_args();
  mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
  mov(rcx, ptr[rdi + offsetof(FwdArgs, channels)]);
  xor_(rsi, rsi);
  grouped_tail_mask();
  for (int g = 0; g < group; ++g) {
    zero(s1 + g);
    zero(s2 + g);
  }
  Label image, next;
  L(image);
  for (int g = 0; g < group; ++g) {
    if (g > 0) {
      cmp(rcx, g);
      jle(next, T_NEAR);
    }
    vbroadcastss(vmm(k), ptr[rax + 4 * g]);
    grouped_row(
        4,
        [&](int u, int64_t off, bool masked) {
          const int t = data + u;
          load_vec(t, elem(r8, off), masked);
          if (masked && avx512_) {
            vsubps(Zmm(t) | k1 | T_z, Zmm(t), Zmm(k));
          } else {
            vsubps(vmm(t), vmm(t), vmm(k));
            if (masked) vandps(vmm(t), vmm(t), vmm(mask_));  // lanes past the tail add nothing
          }
          vaddps(vmm(s1 + g), vmm(s1 + g), vmm(t));
          vfmadd231ps(vmm(s2 + g), vmm(t), vmm(t));
        },
        0, g * c_.spatial);
  }
  L(next);
  mov(r11, row_stride_bytes());
  add(r8, r11);
  dec(rbx);
  jnz(image, T_NEAR);
  // Every channel of the group's sums (a short group's others are zero).
  mov(r9, ptr[rdi + offsetof(FwdArgs, s1)]);
  mov(r10, ptr[rdi + offsetof(FwdArgs, s2)]);
  for (int g = 0; g < group; ++g) {
    for (int which = 0; which < 2; ++which) {
      if (avx512_) {
        vmovaps(Zmm(data), Zmm((which == 0 ? s1 : s2) + g));
      } else {
        vmovaps(Ymm(data), Ymm((which == 0 ? s1 : s2) + g));
      }
      hsum(data, data + 1);
      vmovss(ptr[(which == 0 ? r9 : r10) + 4 * g], Xmm(data));
    }
  }
  pop(rbx);
  vzeroupper();
  ret();
}

void FwdGenerator::rows_apply_grouped() {
  // As rows_apply. AVX-512: data v0..3, scratch v4..15, hi/lo/a/b v27..30,
  // zero v31, alpha v26. AVX2: data v0..1, scratch v2..7, hi/lo/a/b v8..11,
  // zero v12, alpha v13, tail mask v14.
  const int unroll = avx512_ ? 4 : 2;
  const int cf = avx512_ ? 27 : 8;
  const int64_t row_bytes = c_.spatial * es_;
  const bool bounce = nt_ && c_.bounce;
  zero_ = avx512_ ? 31 : 12;
  alpha_ = avx512_ ? 26 : 13;
  mask_ = 14;
  for (const Reg64& r : {rbx, r12, r13, r14}) push(r);
  load_args();
  mov(rbx, ptr[rdi + offsetof(FwdArgs, rows)]);
  xor_(rsi, rsi);
  grouped_tail_mask();
  zero(zero_);
  load_alpha();
  // r13: the block's bytes (the call's rows of one image); rdx: from the row
  // after the group's last to the next image's first row.
  mov(r13, ptr[rdi + offsetof(FwdArgs, channels)]);
  imul(r13, r13, static_cast<int>(row_bytes));
  mov(rdx, row_stride_bytes());
  sub(rdx, r13);
  auto normalise = [&](int v) {
    vsubps(vmm(v), vmm(v), vmm(cf));  // cf + 1, the mean's low part, is in b (Finish)
    vfmadd213ps(vmm(v), vmm(cf + 2), vmm(cf + 3));
  };
  Label image, channel;
  L(image);
  mov(rcx, ptr[rdi + offsetof(FwdArgs, channels)]);
  mov(r11, rax);
  if (bounce) {
    // dst's block (r12) at the same offset within a line in the buffer (r9
    // and r14), so the copy's lines line up.
    mov(r12, r9);
    and_(r9, 63);
    add(r9, ptr[rdi + offsetof(FwdArgs, bounce)]);
    mov(r14, r9);
    nt_ = false;  // the rows go to the buffer with ordinary stores
  }
  L(channel);
  if (c_.prefetch_next_channel) {
    // The next group's row in this image (its block follows this one), into
    // the L2: the next group's statistics read it first.
    for (int64_t off = 0; off < row_bytes; off += 64)
      prefetcht1(ptr[r8 + static_cast<int>(c_.channel_group * row_bytes + off)]);
  }
  for (int i : {0, 2, 3}) vbroadcastss(vmm(cf + i), ptr[r11 + 4 * i]);  // lo (1) is 0, in b
  int64_t from = 0;
  if (c_.pair_vectors) {
    for (; from + 2 * lanes_ <= c_.spatial; from += 2 * lanes_) pair_step(normalise, from);
  }
  grouped_row(
      unroll,
      [&](int u, int64_t off, bool masked) {
        const int t = unroll + u, n = 2 * unroll + u, m = 3 * unroll + u;
        load_vec(u, elem(r8, off), masked);
        normalise(u);
        const RegExp ra = elem(r10, off);
        epilogue(u, t, m, &ra, masked);
        // Into the buffer a tail is stored whole: the next row, or nothing
        // the copy reads, takes its lanes past the row.
        store(elem(r9, off), u, t, n, m, masked && !bounce);
      },
      from, 0);
  add(r8, static_cast<int>(row_bytes));
  add(r9, static_cast<int>(row_bytes));
  if (c_.residual) add(r10, static_cast<int>(row_bytes));
  add(r11, 16);
  dec(rcx);
  jnz(channel, T_NEAR);
  if (bounce) {
    nt_ = true;
    mov(rcx, r13);
    stream_copy(r14, r12, rcx, r11, r9, avx512_ ? 4 : 2);
    lea(r9, ptr[r12 + r13]);
  }
  add(r8, rdx);
  add(r9, rdx);
  if (c_.residual) add(r10, rdx);
  dec(rbx);
  jnz(image, T_NEAR);
  for (const Reg64& r : {r14, r13, r12, rbx}) pop(r);
  if (nt_) sfence();
  vzeroupper();
  ret();
}

}  // namespace jit
}  // namespace normgrad
