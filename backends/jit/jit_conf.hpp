// JIT batch-norm backward: the plain-C++ decisions (conf) for one problem.
//
// The conf maps the canonical BatchNormTrainingBackward onto one of two 2-D
// walks that the generated kernels implement:
//   - kRows  (NCX with spatial > 1): channel c is N rows of S contiguous
//     elements, row stride C*S; per-channel values are scalars;
//   - kPixels (NXC, or NCX with spatial 1, which is the same memory): P = N*S
//     pixels of C contiguous channels; per-channel values are vectors.
// It also picks the ISA, the fixed reduction chunking (independent of the
// thread count, so results are bitwise identical for any thread count), and
// whether a problem is small enough to run on one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/op.hpp>
#include <normgrad/graph/partition.hpp>
#include <normgrad/graph/status.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>

namespace normgrad {
namespace jit {

// The backend's name, as its patterns and partitions carry it.
constexpr const char* kBackendName = "jit";

enum class Isa : uint8_t { kPortable, kAvx2, kAvx512 };
const char* isa_name(Isa isa);

// The best ISA this CPU has, capped by NORMGRAD_JIT (0 or "portable", "avx2",
// "avx512"); `forced` (same spellings) overrides the environment when not empty.
Isa detect_isa(const std::string& forced = "");
// NORMGRAD_JIT's value checked: OK when unset or one of its spellings,
// otherwise an error that names the choices.
Status check_isa_setting();
bool cpu_has_avx512_bf16();

enum class Walk : uint8_t { kRows, kPixels };

// A batch-norm data input computed on the fly from a fused producer.
enum class Fuse : uint8_t {
  kNone,
  kReluBackward,  // value = first > 0 ? second : 0 (first: ReLU's src or dst, second: the gradient)
  kAdd,           // value = first + second
  // value = first > 0 ? second + third : 0: an Add of two gradients, then the
  // ReLUBackward (a residual network's gradient sum in front of the block's ReLU)
  kAddReluBackward,
  // BatchNormTrainingBackwardFromDst through leaky_relu (first: the forward's dst):
  kLeakyInverse,     // src: value = first >= 0 ? first : first / alpha
  kLeakyInverseSub,  // src: the same minus second (a residual added before the activation)
  kLeakyBackward,    // diff_dst: value = first >= 0 ? second : alpha second
  // diff_dst: value = first, times alpha where port 0's value (kLeakyInverse:
  // it has dst's sign) is < 0, so dst is not read twice.
  kLeakyBackwardAtSrc,
};
const char* fuse_name(Fuse f);
// Whether a fused port reads a second tensor (KernelArgs x2 / dy2).
inline bool uses_second(Fuse f) {
  return f != Fuse::kNone && f != Fuse::kLeakyInverse && f != Fuse::kLeakyBackwardAtSrc;
}
// Whether it reads a third (KernelArgs dy3; diff_dst only).
inline bool uses_third(Fuse f) {
  return f == Fuse::kAddReluBackward;
}

// Where each buffer of a (possibly fused) partition comes from: indices into
// the partition's inputs; `second` is used by fused ports only.
struct PortMap {
  int x = 0, x_second = -1, dy = 1, dy_second = -1, dy_third = -1, mean = 2, variance = 3,
      gamma = 4;
  // BatchNormBackwardApply: the global sums and element count.
  int sum_dy = -1, sum_dy_xm = -1, count = -1;
  // Partition outputs: diff_src, diff_gamma and diff_beta (-1: absent), or
  // BatchNormBackwardReduce's sums and count.
  int dx = 0, diff_gamma = 1, diff_beta = 2;
  int sum_dy_out = -1, sum_dy_xm_out = -1, count_out = -1;
  // The fused diff_dst producer's output, when the partition writes it (BnConf::dy_side_out).
  int dy_out = -1;
};

// The cache model the conf decides with (backends/backend.hpp): the bench
// prints its traffic bounds from the same one.
using normgrad::cache_sizes;
using normgrad::CacheSizes;

// Pixels per group of the channel-blocked pixel kernels (the best of 2, 4, 6,
// 8 and 16 on C = 256..2048, f32; docs/performance.md).
constexpr int kPixelGroup = 8;

// NXC on AVX-512: rows of up to this many channels take the per-pixel
// kernels, from DRAM and from the cache alike. Their sums (reduce) and
// coefficients (apply) are rows of C floats read from the L1 as memory
// operands: at 2048 channels the apply's four rows take 32 KiB of a 48 KiB
// L1 and the blocked walk is faster; below that the per-pixel walk beats the
// swept and blocked ones (docs/jit-rules.md).
constexpr int64_t kPerPixelMaxChannels = 1024;

// Bytes of src + diff_dst per call of the channel-swept pixel kernels
// (WalkConf::sweep_rows, the nxc-swept variant): a quarter of a 1 MiB L2, so
// the blocks after the first find the call's rows there.
constexpr int64_t kSweepCallBytes = 256 * 1024;

// Channels per strip of the NXC backward's strips (WalkConf::strips) when
// `nxc-strips` names no width.
constexpr int64_t kBwdStripChannels = 128;
// Channels per call of the grouped rows kernels (short NCX rows): as many as
// keep both sums in registers (zmm16..31 on AVX-512, ymm0..7 on AVX2; the
// portable path takes the AVX2 group, so the driver has one rows walk per shape).
constexpr int kRowGroupAvx512 = 8;
constexpr int kRowGroupAvx2 = 4;
static_assert(kRowGroupAvx2 <= kRowGroupAvx512, "the driver sizes its arrays for the larger group");
// Rows up to this many bytes are short: one image's rows of a channel group
// are read as one contiguous block instead of a row per channel.
constexpr int64_t kShortRowBytes = 1024;
// kRows, long 16-bit rows far apart: the reduce prefetches the rows this many
// rows ahead (PrefetchConf::reduce_rows).
constexpr int64_t kReducePrefetchRows = 2;
// kRows: rows at least this long prefetch the next channel in the apply
// (PrefetchConf::next_channel): every row too long for the grouped kernels.
// Rows of 1.5 KiB (28x28 bf16) are a new stream each, 800 KB apart, and gain
// the most; longer rows give the hardware prefetchers time of their own
// (docs/jit-rules.md).
constexpr int64_t kNextChannelPrefetchRowBytes = kShortRowBytes;
// kRows, channels whose inputs exceed a quarter of the L2: the apply walks a
// channel's rows last first in calls of about this many bytes per tensor
// (StreamConf::reverse_rows).
constexpr int64_t kReverseApplyCallBytes = 16 * 1024;
// ...on hosts whose L2 is at least this large (StreamConf::reverse_rows).
constexpr int64_t kReverseApplyMinL2Bytes = int64_t{2} << 20;
// Images per grouped reduce call: bounds how many rows the f32 vector sums
// take before they are added into the f64 totals (fixed by the shape only).
constexpr int64_t kRowsPerGroupedReduce = 256;

// Pixels per reduction partial of the pixels walk, from the shape alone (so
// the sums' order, and so their bits, do not depend on the thread count): at
// most about kChunkBytes of src + diff_dst (a chunk stays in L2 and partials
// stay few next to the data), at least kMinChunkRows pixels; when that gives
// fewer than kManyChunks chunks, equal chunks in a multiple of kChunkMultiple.
constexpr int64_t kChunkBytes = int64_t{1} << 20;
constexpr int64_t kMinChunkRows = 16;
constexpr int64_t kManyChunks = 64;
constexpr int64_t kChunkMultiple = 8;
int64_t pixel_chunk_rows(int64_t pixels, int64_t bytes_per_pixel);

// How the kernels walk the data (the file comment's two walks) and how the
// driver splits the walk into tasks: chosen from the shape and strides.
struct WalkConf {
  Walk kind = Walk::kRows;
  int64_t rows = 0;  // kRows: N; kPixels: P = N * spatial
  int64_t cols = 0;  // kRows: S; kPixels: C
  int64_t row_stride =
      0;  // elements between consecutive rows of one channel (kRows: C*S; kPixels: C)
  int64_t channel_stride = 0;  // kRows: S (offset of channel c is c*S)
  int64_t chunk_rows = 0;      // kPixels: pixels per reduction partial (fixed by the problem only)
  // kPixels, rows wider than the registers: pixels per group of the
  // channel-blocked kernels (0: the per-pixel kernels with memory operands).
  int pixel_group = 0;
  // kPixels, rows wider than the registers: the channel-swept kernels, which
  // take one block of channels over every pixel of a call, its sums or
  // coefficients in registers, then the next block; the driver splits each
  // chunk into calls of at most this many pixels so that a call's rows stay
  // in the L2 for the blocks after the first (0: not swept). Every load is a
  // fixed stride from the same instruction's previous one, the pattern the
  // stride prefetchers follow.
  int64_t sweep_rows = 0;
  // kPixels: each thread takes one contiguous share of the chunks, as oneDNN
  // splits the batch, the same share in the reduce and the apply (false:
  // oneTBB's adaptive split, which balances a VM's uneven cores). The chunks,
  // so the bits, are the same either way.
  bool contiguous_split = false;
  // kPixels: the apply takes the chunks last first, to start on what the
  // reduce left in the caches: with the contiguous split each thread its own
  // share's last chunks, with the adaptive split the whole range's last ones,
  // whichever thread read them. Neither gained where each core has its own
  // L3, and the reversed whole range lost at 7x7 to 28x28
  // (docs/performance.md, "Which chunks each thread applies"), so the apply
  // runs front to back.
  bool apply_last_first = false;
  // kRows, short rows whose channels are adjacent (channel_stride == cols):
  // channels per kernel call, each image's rows of the group one contiguous
  // block (0: one channel per call).
  int channel_group = 0;
  // kPixels, dense, the whole backward: `cols` is a strip of adjacent
  // channels less than C (row_stride stays C). Each task takes one strip
  // across every pixel, its reduce, then its apply, while the strip's src and
  // diff_dst are still in the cache: they are read from DRAM once instead of
  // twice (the NCX walks' channels and groups do the same). The chunks are
  // the pixels walk's (fixed by the shape), so the bits do not depend on the
  // thread count. Only through the `nxc-strips` variant (and so `normgrad
  // tune`): they win on some AVX-512 layers and lose on others and on AVX2,
  // so a host's own measurement decides (docs/jit-rules.md).
  bool strips = false;
  // Strided data walked in place (row_stride/channel_stride set from it).
  bool strided_native = false;
  // kRows over padded rows: per channel, one call per image (batch_calls of
  // them, batch_stride apart), each over `rows` rows of `cols`.
  int64_t batch_calls = 0;
  int64_t batch_stride = 0;
  // diff_src's own strides for the same walk (equal to the above when dense).
  int64_t dx_row_stride = 0, dx_channel_stride = 0, dx_batch_stride = 0;
};

// How diff_src leaves and in which order the apply meets the data the
// reduce left in cache.
struct StreamConf {
  bool nt_stores = false;  // non-temporal dx stores: only when dx does not fit in cache
  // kRows, long rows, one call per channel whose inputs exceed a quarter of
  // the L2: the apply takes the channel's rows last first, this many per call
  // (0: one call, first row first). The reduce has just read the rows in
  // order, so the last ones are the ones still in the L2; forward, the apply
  // finds each row evicted by the rows after it and reads the channel again
  // from the L3 (rows 1.6 MB apart also meet in few L2 sets). The apply is
  // elementwise: the order changes no bits. Only the last call (the first
  // rows) prefetches the next channel, the rows its reduce starts on: spread
  // over every call those prefetches evicted the rows the walk relies on.
  int64_t reverse_rows = 0;
  // AVX2, bf16, the rows walk's apply without fused producers: 16 elements
  // per step, as the even and odd words of one 32-byte load, rounded and
  // merged back by shifts and masks into one 32-byte store. The vector at a
  // time widens each load (vpmovzxwd) and narrows each store (extract and
  // pack), and that conversion made the apply compute-bound. Elementwise:
  // the same bits either way.
  bool pair_vectors = false;
};

// Software prefetches, each where a measurement found the hardware
// prefetchers short.
struct PrefetchConf {
  // kRows, short rows: the apply kernel prefetches the next image's rows too.
  // Off when a task's inputs fit in half the L2: the apply then reads what the
  // reduce has just read, and the prefetches only cost instructions.
  bool apply = true;
  // kRows, long rows (one channel per call) of 16-bit data, rows far apart:
  // the reduce prefetches, line by line, the row kReducePrefetchRows ahead.
  // Every row is a new stream for the hardware prefetchers, and a 16-bit row
  // (6 KiB at 56x56) ends before they run far enough ahead; an f32 row is
  // twice as long and gives the prefetchers the time they need on AVX-512,
  // where the extra prefetches cost time, but not on AVX2, where f32 rows
  // gain from them (docs/jit-rules.md).
  bool reduce_rows = false;
  // kRows, long rows, one call per channel: while the apply computes channel
  // c it prefetches, line by line, channel c + 1's inputs into the L2, so that
  // the next reduce's DRAM reads overlap this apply's stores instead of
  // following them (the calls of a thread take adjacent channels). The
  // driver says per call whether c + 1 exists (KernelArgs::prefetch_next).
  bool next_channel = false;
  // kRows, grouped short rows: at each image the apply prefetches the next
  // group's block of that image into the L2 (it follows this group's), which
  // the next task's reduce reads first (a thread's tasks take adjacent
  // groups). On AVX-512, and on AVX2 for rows under 256 bytes.
  bool next_group = false;
  // kPixels, swept kernels: every load also prefetches into the L2 the line
  // this many pixels on (0: none). A walk that steps C x 4 bytes opens a new
  // 4 KiB page every few loads, where hardware prefetchers stop.
  int64_t sweep_ahead = 0;
};

struct BnConf {
  BatchNormDesc d;
  Isa isa = Isa::kPortable;
  bool avx512_bf16 = false;  // vcvtneps2bf16 for bf16 stores
  WalkConf walk;
  StreamConf stream;
  PrefetchConf prefetch;
  bool needs_reduction = false;
  // An empty batch (N or a spatial dim 0, C > 0): no data to read or write;
  // the driver writes zero sums (and count), diff_gamma and diff_beta.
  bool empty = false;
  bool single_thread = false;  // small problems skip the task overhead
  // The op is NCX but its tensors are channels last: `d` is the NXC view.
  bool channels_last_view = false;
  float alpha = 1.f;  // the kLeaky* fuses' slope (BatchNormDesc::alpha)
  // The variant the host's tune cache chose (tune_cache.hpp), with its
  // measured speedup, for the kernel's name; empty under the JIT's own rules.
  std::string tuned;
  Fuse x_fuse = Fuse::kNone;   // src computed from a fused producer
  Fuse dy_fuse = Fuse::kNone;  // diff_dst computed from a fused producer
  // The fused diff_dst producer's output is read outside the partition too:
  // the reduce kernel stores it (ports.dy_out) as it computes it, and the
  // apply reads it back as a plain diff_dst (docs/passes.md, side outputs).
  bool dy_side_out = false;
  PortMap ports;
  int64_t total_elements = 0;
  // Strided (e.g. padded) src, diff_dst or diff_src: the driver packs them into
  // dense scratch around the dense kernels. Empty: dense, used in place.
  Dims x_strides, dy_strides, dx_strides;

  // "jit:avx512:bf16/f32:rows" and the like, for verbose lines.
  std::string kernel_name() const;
  // The cache key: everything the generated code depends on.
  std::string key() const;
};

// Bytes of the 64-byte-aligned scratch block (KernelArgs::acc) through which
// the grouped rows apply streams diff_src rows that do not start on a vector
// (jit_generator_rows.cpp; on AVX2 rows of 512 bytes or more); 0 when it
// stores directly. The generator and the
// driver both ask here, so the kernel never runs without its block.
int64_t bounce_block_bytes(const BnConf& c);
// StreamConf::pair_vectors as the apply takes it: AVX2 bf16 without fused
// producers (whose loads are per vector). Rows then stream when they start
// on a pair's 32 bytes.
bool apply_in_pairs(const BnConf& c);
// The pixels walk in pairs (AVX2 bf16, whole 16s of channels, no fused
// producers): both kernels load 16 channels of a pixel as the even and odd
// words of one 32-byte load, so the means, the sums and the coefficients are
// laid out per 16 channels in that order (pair_position). The arithmetic
// is the vector at a time's, term for term: the same bits.
bool pixel_pairs(const BnConf& c);
// Where channel c sits in a pair-ordered row: per 16 channels the even ones,
// then the odd ones.
inline int64_t pair_position(int64_t c) {
  return (c & ~int64_t{15}) | ((c & 1) << 3) | ((c & 15) >> 1);
}
// Channels [first, last) (whole 16s) of a row into pair order.
void pair_order_row(float* row, int64_t first, int64_t last);
// Whether the grouped rows apply (AVX-512, rows that are not whole vectors:
// 14x14, 7x7) computes each image's block of a group as one run of vectors
// over diff_src's lines, instead of each channel's row with a masked tail
// vector: lanes of adjacent channels take blended coefficients, and with
// streaming stores the lines inside the block stream directly (no bounce
// block). Needs diff_src's images whole lines apart (so a group's block
// starts at the same place in a line in every image) and its channels
// adjacent. Generated for each start in a line that a group can have in a
// tensor on a line (grouped_linear_phases, in bytes); the kernel takes the
// per-channel rows for any other. Fully unrolled, so bounded in vectors.
std::vector<int64_t> grouped_linear_phases(const BnConf& c);
bool grouped_linear_blocks(const BnConf& c);

// How a walk covers one strided tensor (see make_conf).
struct StridedWalk {
  int64_t rows = 0, cols = 0, row_stride = 0, channel_stride = 0, batch_stride = 0, batch_calls = 0;
};
// `split_rows`: for the rows walk, describe even a dense spatial block as
// padded rows (one call per image), to match another tensor that needs it.
std::optional<StridedWalk> strided_walk(const BnConf& c, const Dims& strides, bool split_rows);

// The strides a data tensor of `dims` (the op's NCX or NXC order) has when
// the kernel reads it in place: dense, or channels last under the view.
inline Dims data_strides(const BnConf& c, const Dims& dims) {
  return c.channels_last_view ? channels_last_strides(dims) : dense_strides(dims);
}

// Decides the conf, or the reason the JIT declines (empty tensors, strided
// fused inputs); strided src/diff_dst/diff_src are repacked by the driver.
StatusOr<BnConf> make_conf(const Op& op, Isa isa);
// The same for a partition one of the JIT's patterns matched (jit_backend.cpp):
// the batch norm is its anchor, and any other op is the ReLUBackward or Add
// the pattern found feeding its src or diff_dst.
StatusOr<BnConf> make_conf(const Partition& partition, Isa isa);
// A bn_bwd_siblings partition (jit_backend.cpp): the anchor's conf (its
// side-output partition's, t written into the sibling's diff_src) and the
// sibling's (a plain backward reading t there: diff_dst one input past the
// partition's), their ports indexing this partition's inputs and outputs.
// Declines strided tensors (the siblings share no staging) and the split
// halves; check_sibling_walks, once variants are applied, says whether one
// walk can drive both.
StatusOr<std::pair<BnConf, BnConf>> make_sibling_confs(const Partition& partition, Isa isa);
// OK when the two confs walk alike, so one walk can drive both (after any
// variant or tuned choice is applied to each); else what differs.
Status check_sibling_walks(const BnConf& first, const BnConf& second);
// Pixels per call of the channel-swept kernels for calls of about
// `call_bytes` of src + diff_dst.
int64_t sweep_call_rows(const BnConf& c, int64_t call_bytes);
// NXC rows wider than the registers on AVX-512: the swept, blocked or
// per-pixel walk for all C channels (cols back to C, no strips).
void choose_pixels_walk(BnConf* c);
// Whether the walk can take strips of `width` channels: NXC, dense, the
// whole backward with a reduction, generated code, `width` a multiple of 32
// that divides C and is less than C.
bool bwd_strips_possible(const BnConf& c, int64_t width);
// The threads the JIT plans for: set_num_threads' cap, else every core.
int planned_threads();

// The apply's prefetches and reversed walk for `c`'s walk and tasks (after
// the ports are known: fused producers read more per task).
void set_apply_prefetch(BnConf* c);

// The rows per call of the reversed apply for `c` (StreamConf::reverse_rows),
// whatever the L2's size; 0 where the apply stays forward.
int64_t reverse_apply_rows(const BnConf& c);

// kRows: whether the reduce can prefetch kReducePrefetchRows rows ahead
// (PrefetchConf::reduce_rows).
bool reduce_prefetch_fits(const BnConf& c);

// Applies CompileOptions::jit_variant to a conf make_conf chose
// (jit_variants.cpp): a name of jit_variant_names(), or "A+B" for both.
Status apply_variant(const std::string& variant, BnConf* conf);
// Whether `variant` (a valid one, or "A+B") names the variant `name`. The
// backend asks it for the variants that decline a pattern rather than
// change a conf: no-siblings (sibling batch norms as two partitions) and
// fwd-no-side-output (the activation apart from its batch norm).
bool variant_names(const std::string& variant, const char* name);
// "default, nxc-per-pixel, nxc-blocked[-PIXELS], ...": every variant
// apply_variant knows, for help texts and errors.
std::string jit_variant_names();
// The same names, plain ("nxc-blocked": the number is optional).
std::vector<std::string> jit_variant_list();

}  // namespace jit
}  // namespace normgrad
