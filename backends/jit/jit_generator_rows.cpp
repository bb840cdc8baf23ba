// Xbyak generator, the rows walk: NCX with spatial > 1, channel c being N
// rows of S contiguous elements, a row every C*S elements.
//
// Long rows take one channel per call (rows_reduce / rows_apply). Short rows
// (up to kShortRowBytes, e.g. 7x7 and 14x14 f32) of adjacent channels take
// the grouped kernels: up to conf.walk.channel_group channels per call, walked
// image by image, so each image's rows of the group are one contiguous block
// (8 x 49 f32 = 1.5 KiB) instead of one 196-byte row per channel 400 KiB
// from the next -- the pattern that defeated the hardware prefetchers and the
// TLB -- and the per-call and masked-tail costs are shared by the group.
// Their rows do not start on vectors (S = 49, 196): the apply computes a
// group's block per image as one run of vectors over diff_src's lines
// (linear_block), or, when diff_src's layout does not allow that, row by row,
// streaming through an aligned bounce block.
#include <algorithm>

#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {

using namespace Xbyak;

namespace {

constexpr int64_t kPerRowSumCols = 256;  // rows this long get a horizontal sum each

}  // namespace

// Short rows far apart (NCX with small spatial: a row every C*S elements) miss
// the TLB and the hardware prefetchers on every row; touch the next row of the
// inputs while this one is computed.
void BnGenerator::prefetch_next_row() {
  if (kind_ == Kind::kApply && c_.walk.kind == Walk::kRows && c_.prefetch.next_group) {
    // The next group's block of this image follows this one's: into the L2
    // for the next task's reduce (PrefetchConf::next_group).
    const int64_t block = c_.walk.channel_group * c_.walk.channel_stride * es_;
    for (int64_t off = 0; off < c_.walk.channel_group * c_.walk.cols * es_; off += 64) {
      const int disp = static_cast<int>(block + off);
      prefetcht1(ptr[rsi + disp]);
      prefetcht1(ptr[rdx + disp]);
      if (uses_second(c_.x_fuse)) prefetcht1(ptr[r12 + disp]);
      if (uses_second(c_.dy_fuse)) prefetcht1(ptr[r13 + disp]);
    }
  }
  // A group's rows of one image are one block: the next image's block (the
  // nearest that pays; docs/performance.md, "Why the JIT chooses what it does").
  if (c_.walk.kind != Walk::kRows || c_.walk.cols * es_ > kShortRowBytes) return;
  if (kind_ == Kind::kApply && !c_.prefetch.apply) return;
  const int64_t row_bytes = c_.walk.cols * es_ * std::max(1, c_.walk.channel_group);
  mov(rax, c_.walk.row_stride * es_);
  for (int64_t off = 0; off < row_bytes; off += 64) {
    prefetcht0(ptr[rsi + rax + off]);
    prefetcht0(ptr[rdx + rax + off]);
    if (uses_second(c_.x_fuse)) prefetcht0(ptr[r12 + rax + off]);
    if (uses_second(c_.dy_fuse)) prefetcht0(ptr[r13 + rax + off]);
  }
}

// The line at element `off` of the current row, `ahead` elements on, of every
// input tensor, into the L2: the line is used a row or a channel later, and
// the L1 would lose it to the current row's stream first.
void BnGenerator::prefetch_inputs_l2(int64_t off, int64_t ahead) {
  const int64_t disp = (ahead + off) * es_;
  prefetcht1(ptr[rsi + r11 * es_ + disp]);
  prefetcht1(ptr[rdx + r11 * es_ + disp]);
  if (uses_second(c_.x_fuse)) prefetcht1(ptr[r12 + r11 * es_ + disp]);
  if (uses_second(c_.dy_fuse)) prefetcht1(ptr[r13 + r11 * es_ + disp]);
}

// rows_reduce: a_j = v0..3 (sum dy), b_j = v4..7 (sum dy (x - mean)), x/dy temps v8/v9,
// mean v12, f64 totals xmm13/xmm14.
void BnGenerator::rows_reduce() {
  // Short rows keep their vector sums across rows (a horizontal sum per row
  // would cost more than the row); long rows are summed per row and
  // accumulated in f64. Both orders are fixed, so results do not depend on threads.
  const bool per_row = c_.walk.cols >= kPerRowSumCols;
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
    fold_chains(0, 10);
    fold_chains(4, 10);
    vcvtss2sd(Xmm(15), Xmm(15), Xmm(0));
    vaddsd(Xmm(13), Xmm(13), Xmm(15));
    vcvtss2sd(Xmm(15), Xmm(15), Xmm(4));
    vaddsd(Xmm(14), Xmm(14), Xmm(15));
  };
  // One row into the sums; with `ahead`, each line of the inputs
  // kReducePrefetchRows rows on is prefetched into the L2 as well.
  auto row_body = [&](bool ahead) {
    prefetch_next_row();
    if (per_row) zero_sums();
    cols_loop([&](int j, int64_t off, bool tail) {
      if (ahead && !tail && (off * es_) % 64 == 0)
        prefetch_inputs_l2(off, kReducePrefetchRows * c_.walk.row_stride);
      load_port(0, 8, 10, off, tail);
      load_port(1, 9, 10, off, tail);
      vaddps(vmm(j), vmm(j), vmm(9));
      vsubps(vmm(8), vmm(8), vmm(12));
      vfmadd231ps(vmm(4 + j), vmm(9), vmm(8));
    });
    if (per_row) fold_sums();
    next_row(false);
    dec(r10);
  };
  if (!per_row) zero_sums();
  if (c_.prefetch.reduce_rows) {
    // All but the last kReducePrefetchRows rows prefetch: the rows after
    // those are not this call's (or not the tensor's).
    Label ahead_row, rest;
    L(ahead_row);
    cmp(r10, kReducePrefetchRows);
    jle(rest, T_NEAR);
    row_body(true);
    jmp(ahead_row, T_NEAR);
    L(rest);
  }
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  row_body(false);
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
void BnGenerator::apply_rows(bool allow_nt, const std::function<void(bool)>& body) {
  const bool nt = c_.stream.nt_stores && allow_nt;
  Label row, plain, row_end, done;
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  prefetch_next_row();
  if (nt) {
    // Realigned rows need diff_src on elements only; the others on vectors.
    test(rcx, realigned_row_stores() ? es_ - 1 : nt_align_mask());
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
  if (nt) sfence();
  L(done);
}

// Long rows whose diff_src does not start on a vector (S = 71x71, or any row
// of a tensor off a line) stream too: the row is split where diff_src's
// vectors start (cols_loop_dx_aligned). The apply is elementwise, so where
// the row is split does not change a bit. AVX-512 only, as are the streaming
// stores; grouped rows have their own linear blocks.
bool BnGenerator::realigned_row_stores() const {
  return avx512_ && kind_ == Kind::kApply && c_.stream.nt_stores && c_.walk.kind == Walk::kRows &&
         c_.walk.channel_group == 0 && c_.walk.cols >= 2 * lanes_;
}

// One row as step(j, off, tail, nt), with the vectors placed on diff_src's
// (rcx, element-aligned): a head of up to lanes - 1 elements up to the first
// vector boundary, whole vectors streamed from there, and the rest. The head
// and the rest are masked with k1, set at run time and then put back to the
// row tail's mask; r11 counts elements at run time. Clobbers rax and rdi.
void BnGenerator::cols_loop_dx_aligned(const std::function<void(int, int64_t, bool, bool)>& step) {
  Label head_done, unrolled, single, rest, row_done;
  xor_(r11, r11);
  mov(rdi, rcx);
  shr(rdi, es_ == 4 ? 2 : 1);
  neg(rdi);
  and_(edi, static_cast<int>(lanes_ - 1));  // head elements
  jz(head_done, T_NEAR);
  mov(eax, -1);
  bzhi(eax, eax, edi);
  kmovw(k1, eax);
  step(0, 0, true, false);
  mov(r11, rdi);
  L(head_done);
  L(unrolled);
  lea(rax, ptr[r11 + kUnroll * lanes_]);
  cmp(rax, static_cast<int>(c_.walk.cols));
  jg(single, T_NEAR);
  for (int j = 0; j < kUnroll; ++j) step(j, j * lanes_, false, true);
  add(r11, static_cast<int>(kUnroll * lanes_));
  jmp(unrolled, T_NEAR);
  L(single);
  lea(rax, ptr[r11 + lanes_]);
  cmp(rax, static_cast<int>(c_.walk.cols));
  jg(rest, T_NEAR);
  step(0, 0, false, true);
  add(r11, static_cast<int>(lanes_));
  jmp(single, T_NEAR);
  L(rest);
  mov(eax, static_cast<int>(c_.walk.cols));
  sub(eax, r11d);
  jz(row_done, T_NEAR);
  mov(edi, -1);
  bzhi(edi, edi, eax);
  kmovw(k1, edi);
  step(0, 0, true, false);
  L(row_done);
  if (tail_ > 0) {
    mov(eax, (1u << tail_) - 1);
    kmovw(k1, eax);
  }
}

// Channel g's a, b, c, mean (coef[4g..4g+3]) broadcast into v[first..first+3].
void BnGenerator::broadcast_coefs(int first, int64_t g) {
  for (int k = 0; k < 4; ++k) vbroadcastss(vmm(first + k), ptr[r8 + 16 * g + 4 * k]);
}

// dx = a dy + b (x - mean) + c for the vector at element `off` of the inputs,
// stored to `out` at `dx_off`, with the coefficients in v[cf..cf+3]; x in
// v[x], dy (then dx) in v[x + 4].
void BnGenerator::rows_apply_vector(int x, int cf, int64_t off, const Reg64& out, int64_t dx_off,
                                    bool tail, bool nt) {
  load_port(0, x, 8, off, tail);
  load_port(1, x + 4, 8, off, tail);
  vsubps(vmm(x), vmm(x), vmm(cf + 3));
  vfmadd213ps(vmm(x + 4), vmm(cf), vmm(cf + 2));  // dy a + c
  vfmadd231ps(vmm(x + 4), vmm(x), vmm(cf + 1));   // + (x - mean) b
  store(out, dx_off, x + 4, tail, nt);
}

// rows_apply_vector for 16 elements (pair_vectors): x in v[2p], v[2p + 1]
// (even and odd elements), dy (then dx) in v[2p + 4], v[2p + 5].
void BnGenerator::rows_apply_pair(int p, int cf, int64_t off, const Reg64& out, int64_t dx_off,
                                  bool nt) {
  const int x = 2 * p, dy = 2 * p + 4;
  load_pair(x, x + 1, at(rsi, off));
  load_pair(dy, dy + 1, at(rdx, off));
  for (int h = 0; h < 2; ++h) {
    vsubps(vmm(x + h), vmm(x + h), vmm(cf + 3));
    vfmadd213ps(vmm(dy + h), vmm(cf), vmm(cf + 2));     // dy a + c
    vfmadd231ps(vmm(dy + h), vmm(x + h), vmm(cf + 1));  // + (x - mean) b
  }
  store_pair(at(out, dx_off), dy, dy + 1, kScratch0, nt);
}

// One row of the apply, inputs at element `off` and diff_src at `dx_off`
// from the row's start, coefficients in v[cf..cf+3]: vector by vector, or in
// pairs (pair_vectors). before_vector(offset) runs before each step that
// starts a vector (the apply's prefetches).
void BnGenerator::rows_apply_cols(int cf, int64_t off, const Reg64& out, int64_t dx_off, bool nt,
                                  const std::function<void(int64_t)>& before_vector) {
  auto single = [&](int j, int64_t o, bool tail) {
    if (!tail) before_vector(o);
    rows_apply_vector(j, cf, off + o, out, dx_off + o, tail, nt);
  };
  if (pair_vectors()) {
    cols_loop_pairs(
        [&](int p, int64_t o) {
          before_vector(o);
          rows_apply_pair(p, cf, off + o, out, dx_off + o, nt);
        },
        single);
  } else {
    cols_loop(single);
  }
}

// rows_apply: x_j = v0..3, dy_j = v4..7; a, b, c, mean broadcast in v12..v15.
// With PrefetchConf::next_channel, a call whose next channel exists takes the
// copy of the loop that also prefetches that channel's lines.
void BnGenerator::rows_apply() {
  prologue();
  if (pair_vectors()) keep_bf16_constants(kMask, -1);  // 16-bit data: no f32 tail mask
  broadcast_coefs(12, 0);
  Label last_channel, done;
  if (c_.prefetch.next_channel) {
    cmp(qword[rdi + offsetof(KernelArgs, prefetch_next)], 0);
    je(last_channel, T_NEAR);
  }
  auto rows = [&](bool next_channel) {
    auto prefetch = [&](int64_t off) {
      if (next_channel && (off * es_) % 64 == 0) prefetch_inputs_l2(off, c_.walk.channel_stride);
    };
    apply_rows(true, [&](bool nt) {
      if (nt && realigned_row_stores()) {
        cols_loop_dx_aligned([&](int j, int64_t off, bool tail, bool vnt) {
          if (!tail) prefetch(off);
          rows_apply_vector(j, 12, off, rcx, off, tail, vnt);
        });
      } else {
        rows_apply_cols(12, 0, rcx, 0, nt, prefetch);
      }
    });
  };
  rows(c_.prefetch.next_channel);
  if (c_.prefetch.next_channel) {
    jmp(done, T_NEAR);
    L(last_channel);
    rows(false);
    L(done);
  }
  drop_bf16_constants();
  epilogue();
}

// body(g) for each channel g of a grouped call: the first always (a call has
// at least one), the others only while g < the call's channel count (rdi).
void BnGenerator::each_group_channel(const std::function<void(int)>& body) {
  Label end;
  for (int g = 0; g < c_.walk.channel_group; ++g) {
    if (g > 0) {
      cmp(rdi, g);
      jle(end, T_NEAR);
    }
    body(g);
  }
  L(end);
}

// The sum registers of channel g of a group: zmm16..23 / zmm24..31 on AVX-512
// (groups of 8), ymm0..3 / ymm4..7 on AVX2 (groups of 4).
int BnGenerator::group_sum(int g, int which) const {
  return avx512_ ? 16 + which * c_.walk.channel_group + g : which * c_.walk.channel_group + g;
}

// rows_reduce over a channel group: both sums of each channel in registers for
// the whole call, one vector each (the group supplies the independent chains
// the single-channel kernel gets from unrolling); x/dy temps v8/v9, scratch
// v10, mean v12, f64 conversion xmm15.
void BnGenerator::rows_reduce_grouped() {
  prologue();
  for (int g = 0; g < c_.walk.channel_group; ++g) {
    for (int which = 0; which < 2; ++which) {
      const int r = group_sum(g, which);
      vxorps(Xmm(r), Xmm(r), Xmm(r));
    }
  }
  Label row, done;
  test(r10, r10);
  jz(done, T_NEAR);
  L(row);
  prefetch_next_row();
  each_group_channel([&](int g) {
    vbroadcastss(vmm(12), ptr[r8 + 16 * g + 12]);
    cols_loop([&](int, int64_t off, bool tail) {
      const int64_t o = off + g * c_.walk.channel_stride;
      load_port(0, 8, 10, o, tail);
      load_port(1, 9, 10, o, tail);
      vaddps(vmm(group_sum(g, 0)), vmm(group_sum(g, 0)), vmm(9));
      vsubps(vmm(8), vmm(8), vmm(12));
      vfmadd231ps(vmm(group_sum(g, 1)), vmm(9), vmm(8));
    });
  });
  next_row(false);
  dec(r10);
  jnz(row, T_NEAR);
  L(done);
  if (avx512_) {
    group_sums_avx512();
  } else {
    each_group_channel([&](int g) {
      for (int which = 0; which < 2; ++which) {
        vmovaps(vmm(8), vmm(group_sum(g, which)));
        hsum(8, 10);
        vcvtss2sd(Xmm(15), Xmm(15), Xmm(8));
        vaddsd(Xmm(15), Xmm(15), ptr[r9 + 16 * g + 8 * which]);
        vmovsd(ptr[r9 + 16 * g + 8 * which], Xmm(15));
      }
    });
  }
  epilogue();
}

// The grouped reduce's 16 sum vectors (8 channels x 2 sums) summed across
// their lanes at once: a transpose tree of 15 adds in place of 16 separate
// horizontal sums (8 instructions each), then two f64 adds into the totals.
// Every lane sum takes the additions hsum() does, in the same tree (lanes
// i + i+8, then i + i+4, i + i+2, i + i+1), so the bits are the same. The
// inputs go into the tree in the order that puts channel g's sums in lanes
// 2g and 2g+1, the layout of the f64 totals. Unused channels of a short last
// group have zero sums, and their totals are the driver's spare slots.
void BnGenerator::group_sums_avx512() {
  static_assert(kRowGroupAvx512 == 8, "the tree sums exactly 16 vectors");
  const Zmm x(8), y(9);
  // Tree slot i ends in lane 4 (i % 4) + i / 4, so it takes that total.
  auto slot = [&](int i) {
    const int total = 4 * (i % 4) + i / 4;
    return Zmm(group_sum(total / 2, total % 2));
  };
  // Level 1, 256-bit halves: v[j] = [A lo + A hi | B lo + B hi].
  for (int j = 0; j < 8; ++j) {
    vshuff64x2(x, slot(2 * j), slot(2 * j + 1), 0x44);
    vshuff64x2(y, slot(2 * j), slot(2 * j + 1), 0xee);
    vaddps(Zmm(j), x, y);
  }
  // Level 2, 128-bit blocks: four sources per vector, one per block.
  for (int k = 0; k < 4; ++k) {
    vshuff64x2(x, Zmm(2 * k), Zmm(2 * k + 1), 0x88);
    vshuff64x2(y, Zmm(2 * k), Zmm(2 * k + 1), 0xdd);
    vaddps(Zmm(k), x, y);
  }
  // Level 3, lane pairs within each block: lanes 0,1 + lanes 2,3.
  for (int m = 0; m < 2; ++m) {
    vshufps(x, Zmm(2 * m), Zmm(2 * m + 1), 0x44);
    vshufps(y, Zmm(2 * m), Zmm(2 * m + 1), 0xee);
    vaddps(Zmm(m), x, y);
  }
  // Level 4: lane 0 + lane 1 of each pair; lane 4b + q is tree slot 4q + b.
  vshufps(x, Zmm(0), Zmm(1), 0x88);
  vshufps(y, Zmm(0), Zmm(1), 0xdd);
  vaddps(Zmm(0), x, y);
  vextractf32x8(Ymm(1), Zmm(0), 1);
  vcvtps2pd(Zmm(2), Ymm(0));
  vcvtps2pd(Zmm(3), Ymm(1));
  vaddpd(Zmm(2), Zmm(2), ptr[r9]);
  vaddpd(Zmm(3), Zmm(3), ptr[r9 + 64]);
  vmovupd(ptr[r9], Zmm(2));
  vmovupd(ptr[r9 + 64], Zmm(3));
}

// rows_apply over a channel group: per image, the group's block as one run
// of vectors (linear_block, when grouped_linear_blocks and diff_src's block
// starts at one of grouped_linear_phases), else each channel's a, b, c, mean
// broadcast into v12..v15 and its row computed as in rows_apply. Streaming
// stores go straight to diff_src when every channel's row starts on a vector
// (S whole vectors); otherwise (14x14, 7x7) through the bounce block.
void BnGenerator::rows_apply_grouped() {
  prologue();
  if (pair_vectors()) keep_bf16_constants(kMask, -1);  // 16-bit data: no f32 tail mask
  auto group_rows = [&](const Reg64& out, bool nt) {
    each_group_channel([&](int g) {
      broadcast_coefs(12, g);
      rows_apply_cols(12, g * c_.walk.channel_stride, out, g * c_.walk.dx_channel_stride, nt,
                      [](int64_t) {});
    });
  };
  Label done;
  if (linear_block_stores()) {
    // Where diff_src's block starts within a line: the same for every image
    // (the image stride is whole lines), one of the phases a group's block
    // can have in a tensor that starts on a line; any other falls through.
    test(r10, r10);
    jz(done, T_NEAR);
    mov(rax, rcx);
    and_(eax, 63);
    for (int64_t phase : grouped_linear_phases(c_)) {
      Label other, linear_row;
      cmp(eax, static_cast<int>(phase));
      jne(other, T_NEAR);
      L(linear_row);
      prefetch_next_row();
      linear_block(phase / es_);
      next_row(true);
      dec(r10);
      jnz(linear_row, T_NEAR);
      if (c_.stream.nt_stores) sfence();
      jmp(done, T_NEAR);
      L(other);
    }
  }
  if (bounce_stores()) {
    Label row;
    test(r10, r10);
    jz(done, T_NEAR);
    L(row);
    prefetch_next_row();
    group_rows(r9, false);
    stream_block();
    next_row(true);
    dec(r10);
    jnz(row, T_NEAR);
    sfence();
  } else {
    // Streaming needs every channel's row on a vector (on a pair's 32 bytes with pairs).
    apply_rows(c_.walk.cols % (pair_vectors() ? 2 * lanes_ : lanes_) == 0,
               [&](bool nt) { group_rows(rcx, nt); });
  }
  L(done);
  drop_bf16_constants();
  epilogue();
}

// Grouped short rows that do not start on a vector (S*es not a multiple of the
// vector: 14x14, 7x7) could not take streaming stores, so diff_src paid a read
// for ownership of every line. When the conf streams, each image's rows of the
// group are computed into a 64-byte-aligned block in L1 (KernelArgs::acc) and
// copied out: whole lines with non-temporal stores, the partial lines at the
// block's two ends with masked ordinary stores (their other parts belong to
// the neighbouring groups).
bool BnGenerator::bounce_stores() const {
  return kind_ == Kind::kApply && bounce_block_bytes(c_) > 0;
}

bool BnGenerator::linear_block_stores() const {
  return kind_ == Kind::kApply && grouped_linear_blocks(c_);
}

// One image's block of the group (rdi channels of S elements, from rsi/rdx
// to rcx), starting `lead` elements into a line: vector by vector, each over
// one line of diff_src. Lanes before the block or past its end (the first and
// last vectors, when the block does not start or end on a line, and the
// vector where a short last group ends) are masked: those vectors load with
// k1 (no access to the lanes outside) and store with an ordinary masked
// store, as their lines are shared with the neighbouring blocks; the others
// stream. A vector whose lanes span channels g0..g1 takes per-lane
// coefficients: channel g0's, blended (k5) with each later channel's from its
// first lane on. Registers: v0/v4 data, v8..v10 store scratch, v12..15 the
// current channel's a, b, c, mean, v16..19 the next channel's, v20..23 blended.
void BnGenerator::linear_block(int64_t lead) {
  const int64_t s = c_.walk.cols, full = c_.walk.channel_group * s;
  const int64_t nvec = (lead + full + lanes_ - 1) / lanes_;
  // Lanes [lo, hi) of the vector at element `off`; masked unless all 16, and
  // streamed only when the whole line is the block's (a 16-bit vector is half
  // a line).
  const int64_t line = 64 / es_;
  auto compute = [&](int cf, int64_t off, int64_t lo, int64_t hi) {
    const bool masked = lo > 0 || hi < lanes_;
    const int64_t line_start = (off + lead) / line * line - lead;
    const bool nt = c_.stream.nt_stores && !masked && line_start >= 0 && line_start + line <= full;
    if (masked) {
      mov(eax, static_cast<uint32_t>(((1u << hi) - 1) & ~((1u << lo) - 1)));
      kmovw(k1, eax);
    }
    rows_apply_vector(0, cf, off, rcx, off, masked, nt);
  };
  Label end;
  xor_(r11, r11);
  broadcast_coefs(12, 0);
  int64_t cur = 0;
  for (int64_t v = 0; v < nvec; ++v) {
    const int64_t e0 = v * lanes_ - lead;  // the block's element in lane 0
    const int64_t first = std::max<int64_t>(e0, 0), last = std::min(e0 + lanes_, full) - 1;
    const int64_t g0 = first / s, g1 = last / s;
    if (g0 != cur) {  // channel g0 starts on this vector
      cmp(rdi, static_cast<int>(g0));
      jle(end, T_NEAR);
      broadcast_coefs(12, g0);
      cur = g0;
    }
    const int64_t lo = first - e0, hi = last + 1 - e0;
    if (g1 == g0) {
      compute(12, e0, lo, hi);
      continue;
    }
    for (int i = 0; i < 4; ++i) vmovaps(vmm(20 + i), vmm(12 + i));
    for (int64_t h = g0 + 1; h <= g1; ++h) {
      const int64_t h_lane = h * s - e0;  // channel h's first lane
      Label present;
      cmp(rdi, static_cast<int>(h));
      jg(present, T_NEAR);
      compute(20, e0, lo, h_lane);  // the block ends before channel h
      jmp(end, T_NEAR);
      L(present);
      broadcast_coefs(16, h);
      mov(eax, ~((1u << h_lane) - 1) & 0xffffu);
      kmovw(k5, eax);
      for (int i = 0; i < 4; ++i) vblendmps(vmm(20 + i) | k5, vmm(20 + i), vmm(16 + i));
    }
    compute(20, e0, lo, hi);
    for (int i = 0; i < 4; ++i) vmovaps(vmm(12 + i), vmm(16 + i));
    cur = g1;
  }
  L(end);
  if (tail_ > 0) {  // k1 back to the row tail's mask
    mov(eax, (1u << tail_) - 1);
    kmovw(k1, eax);
  }
}

}  // namespace jit
}  // namespace normgrad
