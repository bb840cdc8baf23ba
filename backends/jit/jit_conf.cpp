// JIT conf: ISA detection, cache sizes from sysfs, and the walk and chunking.
#include <normgrad/backends/jit/jit_conf.hpp>

#include <algorithm>
#include <numeric>
#include <optional>
#include <thread>

#include <cstdint>
#include <cstdlib>
#include <fstream>

#include <unistd.h>

#include <xbyak/xbyak_util.h>

#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {
namespace jit {
namespace {

Isa parse_isa(const std::string& s, Isa best) {
  if (s == "0" || s == "portable") return Isa::kPortable;
  if (s == "avx2") return best == Isa::kPortable ? best : Isa::kAvx2;
  return best;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

Isa detect_isa(const std::string& forced) {
  static const Isa best = [] {
    const Xbyak::util::Cpu cpu;
    using C = Xbyak::util::Cpu;
    if (cpu.has(C::tAVX512F) && cpu.has(C::tAVX512BW) && cpu.has(C::tAVX512VL)) return Isa::kAvx512;
    if (cpu.has(C::tAVX2) && cpu.has(C::tFMA) && cpu.has(C::tF16C)) return Isa::kAvx2;
    return Isa::kPortable;
  }();
  if (!forced.empty()) return parse_isa(forced, best);
  const char* env = std::getenv("NORMGRAD_JIT");
  return env ? parse_isa(env, best) : best;
}

Status check_isa_setting() {
  const char* env = std::getenv("NORMGRAD_JIT");
  if (env == nullptr) return ok_status();
  const std::string s = env;
  if (s.empty() || s == "0" || s == "portable" || s == "avx2" || s == "avx512") return ok_status();
  return invalid_argument("NORMGRAD_JIT='" + s +
                          "' is not a JIT ISA: use portable (or 0), avx2 or avx512, or unset it "
                          "for the best this CPU has");
}

bool cpu_has_avx512_bf16() {
  static const bool has = Xbyak::util::Cpu().has(Xbyak::util::Cpu::tAVX512_BF16);
  return has;
}

const char* fuse_name(Fuse f) {
  switch (f) {
    case Fuse::kNone:
      return "none";
    case Fuse::kReluBackward:
      return "relu_bwd";
    case Fuse::kAdd:
      return "add";
    case Fuse::kAddReluBackward:
      return "add_relu_bwd";
    case Fuse::kLeakyInverse:
      return "leaky_inverse";
    case Fuse::kLeakyInverseSub:
      return "leaky_inverse_sub";
    case Fuse::kLeakyBackward:
      return "leaky_bwd";
    case Fuse::kLeakyBackwardAtSrc:
      return "leaky_bwd_at_src";
  }
  return "?";
}

std::string BnConf::kernel_name() const {
  if (empty)
    return std::string("jit:") + dtype_name(d.data_dt) + "/" + dtype_name(d.stats_dt) + ":empty";
  std::string n = std::string("jit:") + isa_name(isa) + ":" + dtype_name(d.data_dt) + "/" +
                  dtype_name(d.stats_dt) + ":" +
                  (walk.kind == Walk::kRows ? (walk.channel_group > 0 ? "rows_grouped" : "rows")
                   : walk.strips            ? "pixels_strips"
                   : walk.sweep_rows > 0    ? "pixels_swept"
                   : walk.pixel_group > 0   ? "pixels_blocked"
                                            : "pixels");
  if (pixel_pairs(*this)) n += "+pairs";
  if (x_fuse != Fuse::kNone) n += std::string("+src_") + fuse_name(x_fuse);
  if (dy_fuse != Fuse::kNone) n += std::string("+diff_dst_") + fuse_name(dy_fuse);
  if (dy_side_out) n += "+side_out";
  if (!x_strides.empty() || !dy_strides.empty() || !dx_strides.empty()) n += "+staged";
  if (walk.strided_native) n += "+strided";
  if (channels_last_view) n += "+channels_last";
  if (d.phase == BackwardPhase::kReduce) n += ":reduce";
  if (d.phase == BackwardPhase::kApply) n += ":apply";
  if (!tuned.empty()) n += "+tuned(" + tuned + ")";
  return n;
}

std::string BnConf::key() const {
  // The generated code depends on the ISA, dtypes, walk, the inner length and strides.
  return kernel_name() + (avx512_bf16 ? "+bf16cvt" : "") + (stream.nt_stores ? "+nt" : "") +
         (stream.pair_vectors ? "+pairs" : "") + ":cols=" + std::to_string(walk.cols) +
         ":rs=" + std::to_string(walk.row_stride) + ":cs=" + std::to_string(walk.channel_stride) +
         ":dxrs=" + std::to_string(walk.dx_row_stride) +
         ":dxcs=" + std::to_string(walk.dx_channel_stride) +
         ":cg=" + std::to_string(walk.channel_group) + ":pg=" + std::to_string(walk.pixel_group) +
         (walk.sweep_rows > 0 ? ":swept" : "") + (prefetch.apply ? "" : ":nopf") +
         (prefetch.reduce_rows ? ":rpf" : "") + (prefetch.next_channel ? ":pfc" : "") +
         (prefetch.next_group ? ":pfg" : "") +
         (prefetch.sweep_ahead > 0 ? ":pfa=" + std::to_string(prefetch.sweep_ahead) : "") +
         (x_fuse == Fuse::kLeakyInverse || x_fuse == Fuse::kLeakyInverseSub
              ? ":alpha=" + std::to_string(alpha)
              : "");
}

// How the walk chosen in `c` covers a tensor with strides `st`, when it can.
std::optional<StridedWalk> strided_walk(const BnConf& c, const Dims& st, bool split_rows) {
  const BatchNormDesc& d = c.d;
  const auto rank = static_cast<int>(d.dims.size());
  StridedWalk w;
  w.rows = c.walk.rows;
  w.cols = c.walk.cols;
  if (c.walk.kind == Walk::kRows) {
    const Dims sp(d.dims.begin() + 2, d.dims.end()), sps(st.begin() + 2, st.end());
    if (!split_rows && sps == dense_strides(sp)) {  // the spatial block is dense within a channel
      w.row_stride = st[0];
      w.channel_stride = st[1];
      return w;
    }
    if (rank < 4 || sps.back() != 1) return std::nullopt;
    for (int k = rank - 3; k >= 2; --k) {
      if (st[k] != st[k + 1] * d.dims[k + 1]) return std::nullopt;
    }
    w.cols = d.dims[rank - 1];  // padded rows: one call per (channel, image)
    w.rows = (d.reduce_size / d.dims[0]) / w.cols;
    w.row_stride = st[rank - 2];
    w.channel_stride = st[1];
    w.batch_stride = st[0];
    w.batch_calls = d.dims[0];
    return w;
  }
  if (st[d.channel_axis] != 1) return std::nullopt;
  Dims px, pxs;  // every non-channel dim a multiple of one pixel stride, row-major
  for (int k = 0; k < rank; ++k) {
    if (k == d.channel_axis) continue;
    px.push_back(d.dims[k]);
    pxs.push_back(st[k]);
  }
  const int64_t pstride = pxs.back();
  Dims want = dense_strides(px);
  for (int64_t& v : want) v *= pstride;
  if (pxs != want || pstride < d.channels) return std::nullopt;
  w.row_stride = pstride;
  w.channel_stride = 1;
  return w;
}

int64_t pixel_chunk_rows(int64_t pixels, int64_t bytes_per_pixel) {
  const int64_t max_rows =
      std::max<int64_t>(kMinChunkRows, kChunkBytes / std::max<int64_t>(1, bytes_per_pixel));
  int64_t chunks = (pixels + max_rows - 1) / max_rows;
  // Few chunks: as many as a multiple of kChunkMultiple, all of one size
  // (the last short by less than one pixel per chunk), so that 2, 4 or 8 threads get equal
  // shares. 1 MiB chunks alone gave 4x512x14x14 f32 chunks of 256, 256, 256
  // and 16 pixels, and its bf16 twin one chunk: one thread for the whole
  // reduction.
  if (chunks < kManyChunks) {
    chunks = (chunks + kChunkMultiple - 1) / kChunkMultiple * kChunkMultiple;
    chunks = std::max<int64_t>(1, std::min(chunks, pixels / kMinChunkRows));
  }
  return std::max<int64_t>(1, (pixels + chunks - 1) / chunks);
}

// f32 lanes of an AVX-512 vector: the grouped rows' linear blocks are
// AVX-512 only.
constexpr int64_t kAvx512Lanes = 16;
// The shortest rows AVX2 streams through the bounce block (bounce_block_bytes).
constexpr int64_t kAvx2BounceRowBytes = 512;

bool apply_in_pairs(const BnConf& c) {
  return c.stream.pair_vectors && c.isa == Isa::kAvx2 && c.d.data_dt == DataType::kBF16 &&
         c.x_fuse == Fuse::kNone && c.dy_fuse == Fuse::kNone && !c.dy_side_out;
}

bool pixel_pairs(const BnConf& c) {
  return apply_in_pairs(c) && c.walk.kind == Walk::kPixels && c.walk.cols % 16 == 0 &&
         c.walk.row_stride % 16 == 0 && c.walk.dx_row_stride % 16 == 0;
}

void pair_order_row(float* row, int64_t first, int64_t last) {
  float block[16];
  for (int64_t f = first; f + 16 <= last; f += 16) {
    for (int64_t i = 0; i < 16; ++i) block[pair_position(i)] = row[f + i];
    std::copy(block, block + 16, row + f);
  }
}

int64_t bounce_block_bytes(const BnConf& c) {
  if (c.isa == Isa::kPortable || c.walk.kind != Walk::kRows || c.walk.channel_group == 0 ||
      !c.stream.nt_stores)
    return 0;
  // The rows stream straight to diff_src when each starts on what the apply
  // stores: a vector, or on AVX2 with bf16 pairs 16 elements (32 bytes).
  const int64_t step = c.isa == Isa::kAvx512 ? kAvx512Lanes : apply_in_pairs(c) ? 16 : 8;
  if (c.walk.cols % step == 0) return 0;
  // On AVX2 the bounce block pays off against ordinary stores only on long
  // rows: shorter ones belong to tensors near the L3's size, which streaming
  // stores give up (figures in docs/jit-rules.md).
  const int64_t row_bytes = c.walk.cols * dtype_size(c.d.data_dt);
  if (c.isa == Isa::kAvx2 && row_bytes < kAvx2BounceRowBytes) return 0;
  return c.walk.channel_group * row_bytes;
}

std::vector<int64_t> grouped_linear_phases(const BnConf& c) {
  // Groups start c0 * S elements in, c0 a multiple of the group, so in a
  // tensor on a line their blocks start at multiples of gcd(group bytes, 64).
  const int64_t es = dtype_size(c.d.data_dt), group_bytes = c.walk.channel_group * c.walk.cols * es;
  const int64_t step = std::gcd(group_bytes, int64_t{64});
  std::vector<int64_t> phases;
  for (int64_t p = 0; p < 64; p += step) phases.push_back(p);
  return phases;
}

bool grouped_linear_blocks(const BnConf& c) {
  constexpr int64_t kMaxLinearVectors = 256;
  if (c.isa != Isa::kAvx512 || c.walk.kind != Walk::kRows || c.walk.channel_group == 0 ||
      c.walk.cols % kAvx512Lanes == 0)
    return false;
  const int64_t es = dtype_size(c.d.data_dt), vector_bytes = kAvx512Lanes * es;
  const int64_t block_bytes = c.walk.channel_group * c.walk.cols * es;
  const auto phases = static_cast<int64_t>(grouped_linear_phases(c).size());
  return phases * (block_bytes / vector_bytes + 2) <= kMaxLinearVectors &&
         (c.walk.dx_row_stride * es) % 64 == 0 && c.walk.dx_channel_stride == c.walk.cols &&
         c.walk.channel_stride == c.walk.cols;
}

namespace {

// kRows: what the apply prefetches (see PrefetchConf::apply and
// next_channel). A task's inputs are its channels' rows over
// the batch: src and diff_dst, or the two operands of each fused producer.
int64_t rows_task_bytes(const BnConf& c) {
  const int tensors = (uses_second(c.x_fuse) ? 2 : 1) + (uses_second(c.dy_fuse) ? 2 : 1) +
                      (uses_third(c.dy_fuse) ? 1 : 0);
  return std::max(1, c.walk.channel_group) * c.walk.cols * c.walk.rows * dtype_size(c.d.data_dt) *
         tensors;
}

}  // namespace

void set_apply_prefetch(BnConf* c) {
  if (c->walk.kind != Walk::kRows) return;
  const int64_t es = dtype_size(c->d.data_dt);
  c->prefetch.apply = rows_task_bytes(*c) > cache_sizes().l2_bytes / 2;
  // The next channel's line is a 32-bit displacement from the current one's;
  // packed (staged) channels are not adjacent, per-image calls not one channel.
  c->prefetch.next_channel = c->walk.channel_group == 0 && c->walk.batch_calls == 0 &&
                             c->walk.cols * es >= kNextChannelPrefetchRowBytes &&
                             c->d.channels > 1 && c->x_strides.empty() && c->dy_strides.empty() &&
                             (c->walk.channel_stride + c->walk.cols) * es <= INT32_MAX;
  // The next group's block, prefetched by the apply for the next task's
  // reduce: the hardware prefetchers do not foresee the jump to it. On AVX2
  // too, for rows of 256 bytes and more: 1.08-1.24x at 10x10 to 20x20 with
  // the memory at 42 GB/s, where 0.94-1.01x had been measured at a faster
  // state (docs/jit-rules.md).
  c->prefetch.next_group = c->walk.channel_group > 0;
  // The reversed apply starts on the rows the reduce left in a large L2; it
  // paid on large channels with an L2 of 2 MiB and cost time on channels that
  // fit and on an L2 of 1 MiB, hence kReverseApplyMinL2Bytes
  // (docs/performance.md, "Why the JIT chooses what it does").
  if (cache_sizes().l2_bytes >= kReverseApplyMinL2Bytes)
    c->stream.reverse_rows = reverse_apply_rows(*c);
}

int64_t reverse_apply_rows(const BnConf& c) {
  if (c.walk.kind != Walk::kRows || c.walk.channel_group != 0 || c.walk.batch_calls != 0 ||
      !c.x_strides.empty() || !c.dy_strides.empty() || !c.dx_strides.empty() || c.walk.rows <= 1 ||
      !c.needs_reduction || rows_task_bytes(c) <= cache_sizes().l2_bytes / 4)
    return 0;
  const int64_t row_bytes = std::max<int64_t>(1, c.walk.cols * dtype_size(c.d.data_dt));
  return std::min(c.walk.rows, (kReverseApplyCallBytes + row_bytes - 1) / row_bytes);
}

namespace {

// The data ports every backward kind has, by name: what it normalizes (src;
// FromDst's dst), diff_dst, and (not Reduce) diff_src.
struct DataPorts {
  const LogicalTensor* x = nullptr;
  const LogicalTensor* dy = nullptr;
  const LogicalTensor* dx = nullptr;
};
DataPorts data_ports(const Op& op) {
  switch (op.kind()) {
    case OpKind::kBatchNormBackwardReduce: {
      const BatchNormBackwardReducePorts p(op);
      return {&p.src(), &p.diff_dst(), nullptr};
    }
    case OpKind::kBatchNormBackwardApply: {
      const BatchNormBackwardApplyPorts p(op);
      return {&p.src(), &p.diff_dst(), &p.diff_src()};
    }
    case OpKind::kBatchNormTrainingBackwardFromDst: {
      const BatchNormTrainingBackwardFromDstPorts p(op);
      return {&p.dst(), &p.diff_dst(), &p.diff_src()};
    }
    default: {
      const BatchNormTrainingBackwardPorts p(op);
      return {&p.src(), &p.diff_dst(), &p.diff_src()};
    }
  }
}

// The data tensors' strides (empty: the layout's own), through a channels-
// last view where the tensors are NCX with channels-last strides, and the
// statistics and sums checked dense. Strided data is packed into dense
// scratch by the driver (a copy costs less than a second kernel family, and
// ref would be far slower), unless set_inplace_walk finds a walk over it.
Status set_data_strides(const Op& op, BatchNormDesc* d, BnConf* cp) {
  BnConf& c = *cp;
  const DataPorts data = data_ports(op);
  c.channels_last_view = view_channels_last(d, {data.x, data.dy, data.dx});
  auto strided = [&](const LogicalTensor& lt) {
    const Dims s = lt.effective_strides();
    return same_layout(lt.dims, s, data_strides(c, lt.dims)) ? Dims{} : s;
  };
  c.x_strides = strided(*data.x);
  c.dy_strides = strided(*data.dy);
  // Reduce writes per-channel sums, not diff_src.
  if (data.dx != nullptr) c.dx_strides = strided(*data.dx);
  // The per-channel ports, as the schema names them (FromDst's residual is
  // data: from_dst_ports checks it).
  const OpSchema& schema = *op_registry().find(op.kind());
  auto dense_vector = [](const LogicalTensor& lt) {
    return lt.dims[0] <= 1 || lt.effective_strides()[0] == 1;
  };
  for (size_t i = 0; i < op.inputs().size(); ++i) {
    if (schema.is_per_channel(true, i) && !dense_vector(op.inputs()[i]))
      return unimplemented("the JIT takes dense statistics; " + schema.input_name(i) +
                           " is strided (ref runs it)");
  }
  for (size_t i = 0; data.dx == nullptr && i < op.outputs().size(); ++i) {
    if (schema.is_per_channel(false, i) && !dense_vector(op.outputs()[i]))
      return unimplemented("the JIT writes dense sums; " + schema.output_name(i) +
                           " is strided (ref runs it)");
  }
  return ok_status();
}

// The walk of dense data: NCX rows of a channel's pixels, or NXC pixels.
void set_dense_walk(BnConf* cp) {
  BnConf& c = *cp;
  const BatchNormDesc& d = c.d;
  const int64_t n = d.dims[0];
  const int64_t spatial = d.reduce_size / n;
  if (d.format == DataFormat::kNCX && spatial > 1) {
    c.walk.kind = Walk::kRows;
    c.walk.rows = n;
    c.walk.cols = spatial;
    c.walk.row_stride = d.channels * spatial;
    c.walk.channel_stride = spatial;
  } else {
    c.walk.kind = Walk::kPixels;
    c.walk.rows = d.reduce_size;
    c.walk.cols = d.channels;
    c.walk.row_stride = d.channels;
    c.walk.channel_stride = 1;
  }
}

// Strided data the kernels walk in place: src and diff_dst share one stride
// set, diff_src may have its own, and each is regular enough for the walk:
//  - NCX, spatial block dense within a channel: any channel and batch stride;
//  - NCX, last spatial dim contiguous and the others uniform above it
//    (padded rows): one kernel call per (channel, image) over the rows;
//  - NXC (or NCX with spatial 1): channels contiguous, pixels uniform.
// Anything else is staged through per-thread buffers by the driver.
void set_inplace_walk(BnConf* cp) {
  BnConf& c = *cp;
  const BatchNormDesc& d = c.d;
  if (!c.x_strides.empty() || !c.dy_strides.empty() || !c.dx_strides.empty()) {
    const Dims dense = dense_strides(d.dims);
    const Dims xs = c.x_strides.empty() ? dense : c.x_strides;
    const Dims dys = c.dy_strides.empty() ? dense : c.dy_strides;
    const Dims dxs = c.dx_strides.empty() ? dense : c.dx_strides;
    auto x_walk = strided_walk(c, xs, false), dx_walk = strided_walk(c, dxs, false);
    // One of them needs the per-image split over padded rows: walk both so.
    if (x_walk && dx_walk && x_walk->batch_calls != dx_walk->batch_calls) {
      x_walk = strided_walk(c, xs, true);
      dx_walk = strided_walk(c, dxs, true);
    }
    if (xs == dys && x_walk && dx_walk && x_walk->rows == dx_walk->rows &&
        x_walk->cols == dx_walk->cols && x_walk->batch_calls == dx_walk->batch_calls) {
      c.walk.rows = x_walk->rows;
      c.walk.cols = x_walk->cols;
      c.walk.batch_calls = x_walk->batch_calls;
      c.walk.row_stride = x_walk->row_stride;
      c.walk.channel_stride = x_walk->channel_stride;
      c.walk.batch_stride = x_walk->batch_stride;
      c.walk.dx_row_stride = dx_walk->row_stride;
      c.walk.dx_channel_stride = dx_walk->channel_stride;
      c.walk.dx_batch_stride = dx_walk->batch_stride;
      c.x_strides.clear();  // walked in place: no staging
      c.dy_strides.clear();
      c.dx_strides.clear();
      c.walk.strided_native = true;
    }
  }
  if (!c.walk.strided_native) {
    c.walk.dx_row_stride = c.walk.row_stride;
    c.walk.dx_channel_stride = c.walk.channel_stride;
  }
}

// The walk's variants, prefetches and stores, by shape, dtype, ISA and cache.
void set_walk_rules(BnConf* cp) {
  BnConf& c = *cp;
  const BatchNormDesc& d = c.d;
  const Isa isa = c.isa;
  c.walk.chunk_rows = pixel_chunk_rows(c.walk.rows, 2 * c.walk.cols * dtype_size(d.data_dt));
  // Rows wider than the registers (C > 64 on AVX-512): the per-pixel walk
  // up to kPerPixelMaxChannels, two sequential streams, which the
  // prefetchers follow best; wider rows the channel-blocked walk, whose
  // groups of pixels stay long enough there (choose_pixels_walk). The
  // channel-swept kernels are a variant (nxc-swept). The runs behind each
  // rule: docs/jit-rules.md.
  const int64_t data_bytes = c.total_elements * dtype_size(d.data_dt);  // one tensor
  if (c.walk.kind == Walk::kPixels) choose_pixels_walk(&c);
  // Short rows of adjacent channels (NCX 7x7 and 14x14 f32, say) take the
  // grouped rows kernels: each image's rows of a channel group are one
  // contiguous block.
  const bool dense_rows = c.x_strides.empty() && c.dy_strides.empty() && c.dx_strides.empty() &&
                          c.walk.batch_calls == 0 && c.walk.channel_stride == c.walk.cols &&
                          c.walk.dx_channel_stride == c.walk.cols;
  if (c.walk.kind == Walk::kRows && dense_rows && d.channels > 1 &&
      c.walk.cols * dtype_size(d.data_dt) <= kShortRowBytes)
    c.walk.channel_group = isa == Isa::kAvx512 ? kRowGroupAvx512 : kRowGroupAvx2;
  set_apply_prefetch(&c);
  c.prefetch.reduce_rows = reduce_prefetch_fits(c) &&
                           (dtype_size(d.data_dt) == 2 || isa == Isa::kAvx2) &&
                           c.walk.cols * dtype_size(d.data_dt) > kShortRowBytes;
  c.single_thread = c.total_elements < 100000;
  // Streaming stores pay off unless all three tensors stay in the cache from
  // one use to the next. Cached diff_src stores read each line for ownership
  // first, a third more traffic when the lines come from DRAM, and they evict
  // the inputs the apply is about to re-read; a streamed line that the next
  // use would have found in the cache is lost. So: stream when the three
  // take more than a quarter of the L3 (docs/performance.md, "Why the JIT
  // chooses what it does"). AVX2
  // streams too (32-byte vmovntps, 16-byte vmovntdq for 16-bit data); the
  // realigned rows and the grouped rows' linear blocks stay AVX-512's.
  c.stream.nt_stores = isa != Isa::kPortable && 3 * data_bytes > cache_sizes().l3_bytes / 4;
  c.stream.pair_vectors = isa == Isa::kAvx2 && d.data_dt == DataType::kBF16;
}

}  // namespace

StatusOr<BnConf> make_conf(const Op& op, Isa isa) {
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(op));
  BnConf c;
  if (d.reduce_size == 0 || d.channels == 0) {
    // Nothing to walk: the driver writes the per-channel results alone.
    c.d = d;
    c.isa = Isa::kPortable;
    c.empty = true;
    return c;
  }
  NG_RETURN_IF_ERROR(set_data_strides(op, &d, &c));
  c.d = d;
  c.isa = isa;
  c.avx512_bf16 = isa == Isa::kAvx512 && cpu_has_avx512_bf16();
  NG_ASSIGN_OR_RETURN(c.total_elements, checked_product(d.dims, op.label()));
  set_dense_walk(&c);
  set_inplace_walk(&c);
  c.needs_reduction = d.phase == BackwardPhase::kReduce ||
                      (d.phase == BackwardPhase::kWhole &&
                       (d.mode == BackwardMode::kTraining || d.diff_scale_shift));
  set_walk_rules(&c);
  return c;
}

// kRows: whether the reduce can prefetch kReducePrefetchRows rows ahead
// (PrefetchConf::reduce_rows): one channel per call, rows apart, and the
// prefetches' displacement (the row offset plus a line's) a 32-bit immediate.
bool reduce_prefetch_fits(const BnConf& c) {
  const int64_t ahead =
      (kReducePrefetchRows * c.walk.row_stride + c.walk.cols) * dtype_size(c.d.data_dt);
  return c.walk.kind == Walk::kRows && c.walk.channel_group == 0 &&
         c.walk.row_stride != c.walk.cols && ahead <= INT32_MAX;
}

void choose_pixels_walk(BnConf* c) {
  const BatchNormDesc& d = c->d;
  c->walk.cols = d.channels;
  c->walk.strips = false;
  c->walk.sweep_rows = 0;
  c->walk.pixel_group = 0;
  const int64_t data_bytes = c->total_elements * dtype_size(d.data_dt);  // one tensor
  const bool cache_resident = 2 * data_bytes <= cache_sizes().l3_bytes / 2;
  // Pixel by pixel up to kPerPixelMaxChannels even where src and diff_dst
  // would fit in the cache: run after run on the same tensors the swept and
  // blocked walks were level with it or up to 10% faster, but a call meets
  // its tensors cold after the layers between (through torch, a network's
  // step), and there it ran 1.15-1.8x faster (docs/jit-rules.md). Wider f32
  // rows, and wider 16-bit rows in half the L3, take the blocked walk.
  if (c->isa == Isa::kAvx512 && c->walk.cols > kPerPixelMaxChannels &&
      (d.data_dt == DataType::kF32 || cache_resident))
    c->walk.pixel_group = kPixelGroup;
}

bool bwd_strips_possible(const BnConf& c, int64_t width) {
  return c.walk.kind == Walk::kPixels && c.isa != Isa::kPortable && !c.empty &&
         c.d.phase == BackwardPhase::kWhole && c.needs_reduction && c.x_strides.empty() &&
         c.dy_strides.empty() && c.dx_strides.empty() && !c.walk.strided_native && width > 0 &&
         width % 32 == 0 && c.d.channels % width == 0 && width < c.d.channels;
}

int planned_threads() {
  const int cap = num_threads();
  // hardware_concurrency() reads sysfs on every call, and every kernel's conf
  // asks: a network's compile would spend more here than in the conf itself.
  static const int kCores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return cap > 0 ? cap : kCores;
}

int64_t sweep_call_rows(const BnConf& c, int64_t call_bytes) {
  const int64_t pixel_bytes = 2 * c.walk.cols * dtype_size(c.d.data_dt);
  return std::max<int64_t>(1, call_bytes / std::max<int64_t>(1, pixel_bytes));
}

}  // namespace jit
}  // namespace normgrad
