// JIT batch-norm forward training: conf, kernels and driver (private to the JIT backend).
// BatchNormForwardReduce and BatchNormForwardApply, the synchronized forward's
// parts, run the same kernels: the first pass alone, or the second alone.
//
// BatchNormForwardTraining, optionally followed by an Add of a residual and/or
// a ReLU or LeakyReLU on dst (the jit.bn_fwd_epilogue pattern, or
// jit.bn_fwd_side_output, which writes the activation's input as well),
// runs in two passes over src:
//   1. statistics: per channel, shifted sums S1 = sum (x - K), S2 = sum (x - K)^2
//      around a shift K taken from the channel's first elements. With K close
//      to the mean the sums do not cancel (a channel of constant 1e7 has
//      S1 = S2 = 0 exactly), unlike E[x^2] - E[x]^2. The kernels sum in f32
//      over fixed chunks (a row of the NCX walk, a block of pixels of the NXC
//      walk); the driver adds the chunks' sums in f64 in chunk order, so the
//      bits do not depend on the thread count;
//   2. normalisation: y = (x - hi) a + b [+ residual] [relu], with hi the
//      f64 mean's f32 rounding (x - hi is exact for x near the mean, so data
//      far from 0 keeps its low bits), a = gamma / sqrt(var + eps) and
//      b = beta - lo a, where lo = mean - hi (Finish), in one read of src
//      (and of the residual) and one write of dst.
// NCX runs channel by channel on one thread each when there are enough
// channels (rows of up to kShortRowBytes: a group of adjacent channels per
// task, FwdConf::channel_group), so a channel that fits in the L2 is read
// from DRAM once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <normgrad/backends/jit/jit_conf.hpp>
#include <normgrad/backends/jit/jit_kernels.hpp>
#include <normgrad/graph/partition.hpp>
#include <normgrad/graph/status.hpp>

namespace normgrad {
namespace jit {

// Elements per statistics chunk of the NCX walk: a row longer than this is
// summed in pieces of this many elements (each piece's f32 sums then go into
// the f64 totals). The kernel's 64 f32 chains then take at most 64 terms
// each, and the NXC chunks at most 64 pixels: an f32 chain's rounding grows
// with its length (docs/jit-rules.md).
constexpr int64_t kFwdRowPiece = 4096;
// Pixels per statistics chunk of the NXC walk (fixed, so the chunks depend
// on the shape alone); a short row's NCX chunk takes as many whole rows as
// fit in kFwdRowPiece elements.
constexpr int64_t kFwdChunkPixels = 64;
// Channels per task of the NXC walk's merge of its chunk groups.
constexpr int64_t kFwdMergeChannels = 128;
// Bytes of src per apply call of the NXC walk (the call walks its pixels once
// per block of channels, so they should stay in the L1/L2 between blocks).
constexpr int64_t kFwdApplyBytes = 64 * 1024;
// Channels per grouped NCX call (FwdConf::channel_group): the backward's
// kRowGroupAvx512 and kRowGroupAvx2, for the same reason (each channel's two
// sums take a register for the whole call).
// Channels per strip of the NXC forward (FwdConf::strip_channels). 16-bit
// data takes strips by rule: 256 bytes of each pixel on AVX2, 512 on
// AVX-512 (at 7x7, interleaved: 1.10-1.56x faster than the old 64 channels,
// and faster than the other ISA's width). f32 takes none (kFwdStripF32 is
// the variant's width): since the statistics' merge runs row by row, the
// pixels walk is 1.06-1.35x faster at 14x14 and 7x7 on both ISAs
// (docs/jit-rules.md).
constexpr int64_t kFwdStripF32 = 128;
constexpr int64_t kFwdStrip16Avx2 = 128;
constexpr int64_t kFwdStrip16Avx512 = 256;
// The 16-bit pixel rows (bytes) whose statistics go pixel by pixel
// (FwdConf::stats_pixel_group): from the first, up to the second; longer
// rows keep the prefetching sweeps.
constexpr int64_t kFwdStatsGroupRowBytes = 512;
constexpr int64_t kFwdStatsSweepRowBytes = 2048;
// Pixels per statistics group of an AVX2 strip (FwdConf::stats_pixel_group).
constexpr int kFwdStripStatsGroupAvx2 = 4;
// The shortest pixel row (bytes) the rule takes strips for: a page.
constexpr int64_t kFwdStripRowBytes = 4096;
// A grouped chunk's lane chains take at most this many terms each.
constexpr int64_t kFwdChainTerms = 64;
// The bounce buffer: a group's block at any offset within a line, and a
// vector's overrun past its end.
constexpr int64_t kFwdBounceBytes = kRowGroupAvx512 * kShortRowBytes + 128;
// The shortest rows (bytes) AVX2 streams through the bounce buffer by default.
constexpr int64_t kFwdAvx2BounceRowBytes = 256;

// The whole forward, or a part of the synchronized one: Reduce (this
// process's f64 sum, M2 about its mean and count, from the statistics pass
// alone) or Apply (the normalisation and statistics outputs from the global
// sum, M2 and count given as inputs, with no statistics pass); or
// BatchNormInference (the normalisation from the mean and variance given as
// inputs, no statistics pass and no statistics outputs).
enum class FwdPhase : uint8_t { kWhole, kReduce, kApply, kInference };

// The phases whose statistics are inputs rather than the batch's own.
inline bool fwd_given_statistics(FwdPhase phase) {
  return phase == FwdPhase::kApply || phase == FwdPhase::kInference;
}

struct FwdConf {
  FwdPhase phase = FwdPhase::kWhole;
  Isa isa = Isa::kPortable;
  DataType dt = DataType::kF32;
  DataFormat format = DataFormat::kNCX;
  int64_t n = 0, c = 0, spatial = 0;  // NCX walk: N rows of `spatial` per channel
  int64_t pixels = 0;                 // NXC walk: N * spatial pixels of C channels
  bool ncx_rows = true;               // NCX with spatial > 1 (else the NXC walk)
  int64_t chunk_pixels = 0;           // NXC: pixels per statistics chunk
  int64_t apply_pixels = 0;           // NXC: pixels per apply call
  int64_t chunk_rows = 1;             // NCX: rows per statistics chunk (1 when pieces)
  // NCX rows of up to kShortRowBytes on the generated code: channels per
  // call (0: one channel per call). A group's rows of one image are one
  // contiguous block, so the walk goes image by image over the block instead
  // of down one channel's rows, a row every C*S elements (7x7 f32: 196-byte
  // rows 400 KB apart, a new page and a missed prefetch per row); each
  // channel's sums then take one vector of chains, chunk_rows images a chunk.
  int channel_group = 0;
  // NXC, the whole forward, src past the cache: channels per task (0: the
  // pixels walk over all channels). Each task takes a strip of adjacent
  // channels across all pixels, its statistics, then its apply, while the
  // strip's src is still in the cache, so src is read from DRAM once
  // instead of twice (the NCX walks' channels and groups do the same). The
  // kernels are the pixels walk's over `strip_channels` channels a pixel, C
  // apart; the apply takes each pixel's strip whole (line_walk). Each
  // channel's sums take the same chunks in the same order: the same bits.
  // The strips of all threads together fill at most a quarter of the L3:
  // not the L2, whose sets a pixel stride of 4 or 8 KiB (14x14 and 7x7 f32)
  // confines a strip to 256 of its lines.
  int64_t strip_channels = 0;
  // NXC statistics: pixels per group of the grouped walk
  // (pixels_stats_grouped: the chunk's sums in memory, each group of
  // pixels walked one channel block at a time), 0: each channel block over
  // the whole chunk's pixels, its sums in registers. The same bits.
  int stats_pixel_group = 0;
  // The sweeps (stats_pixel_group 0) prefetch, a line at a time, the lines
  // the next channel block reads of each pixel. A block reads a few lines of
  // every pixel of the chunk, rows a pixel apart: no stream the hardware
  // prefetchers follow, so without it the next block waits on DRAM.
  bool stats_prefetch = true;
  float epsilon = 0.f, momentum = 0.1f;
  bool affine = false;  // gamma and beta given
  // The op is NCX but its tensors are channels last: walked as dense NXC.
  bool channels_last_view = false;
  bool residual = false;  // an Add's other input joins before the ReLU
  bool relu = false;      // a ReLU, or with `leaky` a LeakyReLU, ends the partition
  bool leaky = false;     // relu is LeakyReLU: y < 0 ? alpha y : y
  float alpha = 0.f;
  // Indices into the partition's inputs and outputs.
  int in_src = 0, in_mean = 1, in_var = 2, in_gamma = -1, in_beta = -1, in_residual = -1;
  int out_dst = 0, out_running_mean = -1, out_running_var = -1, out_batch_mean = -1,
      out_batch_var = -1;
  // Apply's global statistics in; Reduce's local ones out (f64, f64, s64).
  int in_sum = -1, in_m2 = -1, in_count = -1;
  int out_sum = -1, out_m2 = -1, out_count = -1;
  bool single_thread = false;
  // An empty batch: zero batch statistics, the running ones updated, no dst.
  bool empty = false;
  // Non-temporal dst stores (an apply variant the driver takes when dst is
  // 64-byte aligned and its rows or pixels are whole lines): when src and dst
  // exceed a quarter of the L3, cached stores read every line for ownership
  // first and evict the src the apply is about to read.
  bool streaming = false;
  // Grouped rows that do not start on lines (7x7, 14x14), under `streaming`:
  // each image's block of the group's rows is computed into an L1 buffer
  // (FwdArgs::bounce) and copied out, whole lines with streaming stores
  // (fwd_bounce_possible; by default AVX2 rows of kFwdAvx2BounceRowBytes).
  bool bounce = false;
  // AVX2, bf16, the apply without a residual: 16 elements per step (NCX) or
  // 16 channels per pixel (NXC), the even and odd words of one 32-byte load,
  // rounded and merged back into one 32-byte store (StreamConf::pair_vectors
  // is the backward's).
  bool pair_vectors = false;
  // 16-bit data, NXC with whole lines per 32 channels (C % 32 == 0): the
  // apply walks each pixel's row whole, 32 channels (one line of dst) per
  // step, the coefficients as memory operands. The channel blocks of the
  // other walk hold their coefficients in registers, which on AVX2 fit two
  // vectors: 32 bytes of 16-bit data, half a line per pixel, so the
  // streaming stores left every line half written until the call's next
  // block. On AVX-512 a block is two whole lines, and the line walk is
  // still faster or level (docs/jit-rules.md). With pair_vectors the driver lays
  // each coefficient row out as the pairs read it (per 16 channels the even
  // ones, then the odd ones). The same arithmetic in the same order: the
  // same bits.
  bool line_walk = false;
  // NCX: the apply prefetches into the L2 the src the next task's
  // statistics read first, which the hardware prefetchers do not foresee
  // (they restart on every row): the next channel's row at the same offset
  // (it starts where this channel's row ends), or with channel_group the
  // next group's row in the same image (its block follows this one).
  bool prefetch_next_channel = false;
  // AVX-512 with avx512_bf16: bf16 stores round with vcvtneps2bf16, else by
  // integer arithmetic (as on AVX2).
  bool avx512_bf16 = false;
  // The tune cache's variant and its measured speed-up, when compile took
  // it ("fwd-bounce 1.12x"; empty: the rules above).
  std::string tuned;

  std::string kernel_name() const;  // "jit:avx512:bf16:fwd:ncx+relu"
  std::string key() const;          // everything the generated code depends on
};

// Whether src and dst (and a residual) exceed a quarter of the cache
// model's L3: then dst's stores stream where the walk allows.
bool fwd_past_cache(const FwdConf& c);
// Whether the grouped apply can stream through the bounce buffer: grouped
// rows off lines, past the cache, and on AVX2 rows of 128 bytes or more.
bool fwd_bounce_possible(const FwdConf& c);
// Whether the walk can take strips of `width` channels (FwdConf::strip_channels):
// NXC, the whole forward on generated code, `width` a multiple of 32
// channels that divides C and is less than C.
bool fwd_strips_possible(const FwdConf& c, int64_t width);
// The rule's strip width (fwd_strip_width), or 0: strips for 16-bit data
// when src is past the cache, a pixel's row is a page or more
// (kFwdStripRowBytes), each of `threads` threads has a strip, and their
// strips' src fits in a quarter of the L3; none for f32.
int64_t fwd_strip_rule(const FwdConf& c, int threads);
// The strip width for the conf's dtype and ISA (the rule's, and the
// fwd-strips variant's without a width).
int64_t fwd_strip_width(const FwdConf& c);
// FwdConf::line_walk's rule: 16-bit data of whole lines per 32 channels, or
// strips (whose pixels the apply takes whole, any dtype).
bool fwd_line_walk(const FwdConf& c);

// The conf of a partition the JIT's forward patterns matched, or the reason
// the JIT declines it (strided tensors, non-f32 statistics, empty tensors).
StatusOr<FwdConf> make_fwd_conf(const Partition& partition, Isa isa);
// A bn_fwd_siblings partition: the sibling's conf (its dst written into
// the partition's dst, output index out_dst) and the anchor's (its residual
// read there: input index in_residual, one past the partition's inputs);
// or the reason the JIT declines. check_fwd_sibling_walks, once variants are
// applied, says whether one walk can drive both.
StatusOr<std::pair<FwdConf, FwdConf>> make_fwd_sibling_confs(const Partition& partition, Isa isa);
// OK when one walk can drive both.
Status check_fwd_sibling_walks(const FwdConf& first, const FwdConf& second);
// A bn_fwd_epilogue partition that outputs its activation's input too (a
// side output: the batch norm's dst or the Add's sum, read outside): the
// conf of the partition less its activation, which writes that tensor;
// nullopt when the partition has no side output. The driver runs both
// applies on each task's block, the side output's first, so the second
// reads src (and the residual) from the cache: src is read once, and the
// side output is never read back. check_fwd_side_walks, once variants are
// applied, says whether the side output can take the forward's walk and
// coefficients.
StatusOr<std::optional<FwdConf>> make_fwd_side_conf(const Partition& partition, Isa isa);
Status check_fwd_side_walks(const FwdConf& conf, const FwdConf& side);
// CompileOptions::jit_variant for a forward conf (jit_variants.cpp): of the
// names apply_variant knows, bf16-single-vectors applies; the others are the
// backward's and leave it as it is; an unknown name is an error.
Status apply_forward_variant(const std::string& variant, FwdConf* conf);

struct FwdArgs {
  const void* x = nullptr;
  void* y = nullptr;
  const void* residual = nullptr;
  // stats: the shift K (NCX one scalar; NXC C values); apply: hi | lo | a | b,
  // each a scalar (NCX) or a padded C-array (NXC, arrays padded_channels(C) apart)
  const float* coef = nullptr;
  float* s1 = nullptr;  // stats out: one (NCX) or C (NXC) sums
  float* s2 = nullptr;
  int64_t len = 0;   // NCX: elements of each row (piece); NXC: pixels
  int64_t rows = 1;  // NCX: rows in the call, conf.c * conf.spatial elements apart
  // NCX with conf.channel_group: the call's channels (1 to the group), their
  // rows conf.spatial elements apart in each image; coef then holds each
  // channel's shift (stats) or hi, lo, a, b (apply), and s1/s2 one sum each.
  int64_t channels = 1;
  // FwdConf::bounce: a 64-byte-aligned buffer of kFwdBounceBytes.
  void* bounce = nullptr;
};

class FwdKernels {
 public:
  virtual ~FwdKernels() = default;
  virtual void stats(const FwdArgs& a) const = 0;
  virtual void apply(const FwdArgs& a) const = 0;
  // apply with streaming stores (conf.streaming; falls back to apply).
  virtual void apply_streaming(const FwdArgs& a) const { apply(a); }
  double generate_ms = 0.0;
};

// Xbyak code (AVX-512 or AVX2) or the portable C++ path.
StatusOr<std::shared_ptr<const FwdKernels>> generate_fwd_kernels(const FwdConf& conf);
std::shared_ptr<const FwdKernels> portable_fwd_kernels(const FwdConf& conf);

Status run_batch_norm_forward(const FwdConf& conf, const FwdKernels& kernels,
                              const std::vector<const void*>& in, const std::vector<void*>& out);
// A forward with a side output (make_fwd_side_conf): each apply call of
// `conf`'s walk is preceded by the same call of `side`'s apply, into its dst.
Status run_batch_norm_forward_side(const FwdConf& conf, const FwdKernels& kernels,
                                   const FwdConf& side, const FwdKernels& side_kernels,
                                   const std::vector<const void*>& in,
                                   const std::vector<void*>& out);
// Forward siblings (make_fwd_sibling_confs) in one walk: each task's
// statistics for both, then the first's apply (into dst), then the second's.
Status run_batch_norm_forward_siblings(const FwdConf& first, const FwdKernels& first_kernels,
                                       const FwdConf& second, const FwdKernels& second_kernels,
                                       const std::vector<const void*>& in,
                                       const std::vector<void*>& out);

// The driver's parallel loop (jit_driver.cpp): body(i) for i in [0, n), on
// oneTBB under the thread cap, or serially.
void parallel_range(bool serial, int64_t n, const std::function<void(int64_t)>& body);

}  // namespace jit
}  // namespace normgrad
