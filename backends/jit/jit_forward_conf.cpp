// JIT batch-norm forward: the conf of a matched partition (plain C++ decisions).
//
// The partition is BatchNormForwardTraining (or a synchronized one's part, or
// BatchNormInference), optionally followed by an Add of
// a residual of dst's shape and dtype, and/or a ReLU (jit.bn_fwd_epilogue in
// passes/pattern.cpp decides the structure). This file maps its buffers,
// checks what the kernels need (dense data, f32 statistics) and fixes the
// statistics chunking from the shape alone.
#include <algorithm>
#include <type_traits>

#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/ops/batch_norm_desc.hpp>
#include <normgrad/ops/op_ports.hpp>
#include <normgrad/ops/op_registry.hpp>

namespace normgrad {
namespace jit {
namespace {

// Laid out as the kernel reads it: dense, or channels last under the view.
bool in_layout(const LogicalTensor& lt, const FwdConf& c) {
  return same_layout(
      lt.dims, lt.effective_strides(),
      c.channels_last_view ? channels_last_strides(lt.dims) : dense_strides(lt.dims));
}

bool dense_vector(const LogicalTensor& lt) {
  return lt.dims.size() == 1 && (lt.dims[0] <= 1 || lt.effective_strides()[0] == 1);
}

int index_in(const std::vector<LogicalTensor>& list, int64_t id) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].id == id) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

std::string FwdConf::kernel_name() const {
  std::string s = std::string("jit:") + isa_name(isa) + ":" + dtype_name(dt) + ":fwd:" +
                  (empty       ? "empty"
                   : ncx_rows  ? (channel_group > 0 ? "rows_grouped" : "rows")
                   : line_walk ? "pixels_lines"
                               : "pixels");
  if (strip_channels > 0) s += "_strips";
  if (stats_pixel_group > 0 && !empty) s += "+stats_groups" + std::to_string(stats_pixel_group);
  if (phase == FwdPhase::kReduce) s += "+reduce";
  if (phase == FwdPhase::kApply) s += "+apply";
  if (phase == FwdPhase::kInference) s += "+inference";
  if (residual) s += "+add";
  if (relu) s += leaky ? "+leaky_relu" : "+relu";
  if (channels_last_view) s += "+channels_last";
  if (streaming && phase != FwdPhase::kReduce)
    s += bounce ? "+nt_bounce" : "+nt";  // Reduce: no dst
  if (!tuned.empty()) s += "+tuned(" + tuned + ")";
  return s;
}

std::string FwdConf::key() const {
  return kernel_name() + ":" + std::to_string(c) + ":" + std::to_string(spatial) + ":" +
         std::to_string(affine) + (pair_vectors ? ":pairs" : "") + (avx512_bf16 ? ":bf16cvt" : "") +
         (prefetch_next_channel ? ":pf" : "") +
         (strip_channels > 0 ? ":strip=" + std::to_string(strip_channels) : "") +
         (stats_pixel_group > 0 ? ":spg=" + std::to_string(stats_pixel_group) : "") +
         (stats_prefetch ? "" : ":nospf") + (leaky ? ":alpha=" + std::to_string(alpha) : "");
}

namespace {

// What the forward's parts share, read through the kind's port class P
// (BatchNormForwardTrainingPorts, BatchNormForwardApplyPorts or
// BatchNormInferencePorts, which name src, the mean and variance inputs,
// gamma, beta and dst alike; the first two also the statistics outputs).
template <typename P, typename NeedInput>
Status forward_ports(const Partition& partition, const Op& bn, const Op* add, const Op* relu,
                     const NeedInput& need_input, FwdConf& c) {
  const P ports(bn);
  NG_ASSIGN_OR_RETURN(c.in_mean, need_input(ports.mean(), "mean"));
  NG_ASSIGN_OR_RETURN(c.in_var, need_input(ports.variance(), "variance"));
  if (c.affine) {
    NG_ASSIGN_OR_RETURN(c.in_gamma, need_input(ports.gamma(), "gamma"));
    NG_ASSIGN_OR_RETURN(c.in_beta, need_input(ports.beta(), "beta"));
  }
  // dst is the last op's output: the BN's own, the Add's or the ReLU's.
  const LogicalTensor& dst = relu != nullptr  ? elementwise_dst(*relu)
                             : add != nullptr ? elementwise_dst(*add)
                                              : ports.dst();
  if (!in_layout(dst, c)) return unimplemented("the JIT forward writes dst laid out as src");
  c.out_dst = index_in(partition.outputs, dst.id);
  if (c.out_dst < 0) return internal_error("the partition does not output dst");
  if (add != nullptr) {
    const int64_t bn_dst = ports.dst().id;
    const AddPorts sum(*add);
    const LogicalTensor& other = sum.src_0().id == bn_dst ? sum.src_1() : sum.src_0();
    if (!in_layout(other, c))
      return unimplemented("the JIT forward takes a residual laid out as src");
    NG_ASSIGN_OR_RETURN(c.in_residual, need_input(other, "the residual"));
    c.residual = true;
  }
  c.relu = relu != nullptr;
  if (relu != nullptr && relu->kind() == OpKind::kLeakyReLU) {
    NG_ASSIGN_OR_RETURN(c.alpha, relu->attr_f32("alpha"));
    c.leaky = true;
  }
  // BatchNormInference has no statistics outputs (its statistics inputs
  // share gamma's dtype, which make_fwd_conf checks is f32).
  if constexpr (!std::is_same_v<P, BatchNormInferencePorts>) {
    const std::pair<const LogicalTensor*, int*> stats[] = {
        {&ports.running_mean(), &c.out_running_mean},
        {&ports.running_variance(), &c.out_running_var},
        {&ports.batch_mean(), &c.out_batch_mean},
        {&ports.batch_variance(), &c.out_batch_var}};
    for (const auto& [lt, slot] : stats) {
      *slot = index_in(partition.outputs, lt->id);
      if (*slot >= 0 && !dense_vector(*lt))
        return unimplemented("the JIT forward writes dense statistics");
    }
  }
  return ok_status();
}

}  // namespace

bool fwd_past_cache(const FwdConf& c) {
  const int64_t bytes = c.n * c.c * c.spatial * dtype_size(c.dt);
  return (c.residual ? 3 : 2) * bytes > cache_sizes().l3_bytes / 4;
}

bool fwd_strips_possible(const FwdConf& c, int64_t width) {
  return !c.ncx_rows && c.phase == FwdPhase::kWhole && c.isa != Isa::kPortable && !c.empty &&
         width > 0 && width % 32 == 0 && c.c % width == 0 && width < c.c;
}

int64_t fwd_strip_width(const FwdConf& c) {
  if (c.dt == DataType::kF32) return kFwdStripF32;
  return c.isa == Isa::kAvx2 ? kFwdStrip16Avx2 : kFwdStrip16Avx512;
}

int64_t fwd_strip_rule(const FwdConf& c, int threads) {
  if (c.dt == DataType::kF32) return 0;
  const int64_t w = fwd_strip_width(c);
  // A pixel's row of a page or more: each page then holds one strip's run,
  // and the hardware prefetchers, which stay within a page, fetch nothing of
  // the other strips. Shorter rows share pages between strips and ran slower
  // (docs/jit-rules.md).
  if (!fwd_strips_possible(c, w) || !fwd_past_cache(c) || c.c / w < threads ||
      c.c * dtype_size(c.dt) < kFwdStripRowBytes)
    return 0;
  const int64_t strip_bytes = c.pixels * w * dtype_size(c.dt);
  return threads * strip_bytes <= cache_sizes().l3_bytes / 4 ? w : 0;
}

bool fwd_line_walk(const FwdConf& c) {
  return (c.isa != Isa::kPortable && !c.ncx_rows && c.dt != DataType::kF32 && c.c % 32 == 0 &&
          c.c > 0) ||
         c.strip_channels > 0;
}

bool fwd_bounce_possible(const FwdConf& c) {
  const int64_t row_bytes = c.spatial * dtype_size(c.dt);
  // The AVX2 copy takes blocks of 128 bytes or more (stream_copy).
  return c.channel_group > 0 && row_bytes % 64 != 0 && fwd_past_cache(c) &&
         (c.isa == Isa::kAvx512 || row_bytes >= 128);
}

StatusOr<FwdConf> make_fwd_conf(const Partition& partition, Isa isa) {
  // The roles the epilogue pattern bound (passes/pattern.hpp).
  const Op* bn = partition.bound(FusionRole::kAnchor);
  const Op* add = partition.bound(FusionRole::kResidualAdd);
  const Op* relu = partition.bound(FusionRole::kActivation);
  if (bn == nullptr ||
      (bn->kind() != OpKind::kBatchNormForwardTraining &&
       bn->kind() != OpKind::kBatchNormForwardReduce &&
       bn->kind() != OpKind::kBatchNormForwardApply && bn->kind() != OpKind::kBatchNormInference))
    return internal_error(
        "the JIT forward compiles partitions anchored at BatchNormForwardTraining, its parts or "
        "BatchNormInference");
  NG_ASSIGN_OR_RETURN(BatchNormDesc d, describe_batch_norm(*bn));
  // src is input 0 of all four kinds.
  static_assert(
      BatchNormForwardTrainingPorts::src_port() == BatchNormForwardReducePorts::src_port() &&
          BatchNormForwardApplyPorts::src_port() == BatchNormForwardReducePorts::src_port() &&
          BatchNormInferencePorts::src_port() == BatchNormForwardReducePorts::src_port(),
      "the forward's kinds read src first");
  const LogicalTensor& src = bn->inputs()[BatchNormForwardReducePorts::src_port()];
  // torch's channels_last tensors under an NCX op are dense NXC (dst and the
  // residual are checked against the same layout).
  const bool channels_last_view = view_channels_last(&d, {&src});
  if (d.stats_dt != DataType::kF32)
    return unimplemented("the JIT forward takes f32 statistics, not " +
                         std::string(dtype_name(d.stats_dt)));
  FwdConf c;
  c.channels_last_view = channels_last_view;
  c.phase = bn->kind() == OpKind::kBatchNormForwardReduce  ? FwdPhase::kReduce
            : bn->kind() == OpKind::kBatchNormForwardApply ? FwdPhase::kApply
            : bn->kind() == OpKind::kBatchNormInference    ? FwdPhase::kInference
                                                           : FwdPhase::kWhole;
  c.isa = isa;
  c.avx512_bf16 = isa == Isa::kAvx512 && cpu_has_avx512_bf16();
  c.dt = d.data_dt;
  c.format = d.format;
  c.c = d.channels;
  c.n = d.dims[0];
  c.spatial = c.n == 0 ? 0 : d.reduce_size / c.n;
  c.ncx_rows = d.format == DataFormat::kNCX && c.spatial > 1;
  c.pixels = d.reduce_size;
  c.epsilon = d.epsilon;
  c.momentum = d.momentum;
  c.affine = d.has_gamma;
  c.empty = d.reduce_size == 0 || d.channels == 0;
  if (!(c.epsilon >= 0.f)) return invalid_argument(bn->label() + ": epsilon must be >= 0");

  auto need_input = [&](const LogicalTensor& lt, const char* role) -> StatusOr<int> {
    const int i = index_in(partition.inputs, lt.id);
    if (i < 0)
      return unimplemented(std::string("the JIT forward needs ") + role + " as a partition input");
    return i;
  };
  if (!in_layout(src, c)) return unimplemented("the JIT forward takes dense src (ref runs it)");
  NG_ASSIGN_OR_RETURN(c.in_src, need_input(src, "src"));
  const OpSchema& schema = *op_registry().find(bn->kind());
  for (size_t i = 0; i < bn->inputs().size(); ++i) {
    if (schema.is_per_channel(true, i) && !dense_vector(bn->inputs()[i]))
      return unimplemented("the JIT forward takes dense statistics; " + schema.input_name(i) +
                           " is strided (ref runs it)");
  }
  if (c.phase == FwdPhase::kReduce) {
    const BatchNormForwardReducePorts ports(*bn);
    const std::pair<const LogicalTensor*, int*> outs[] = {
        {&ports.sum(), &c.out_sum}, {&ports.m2(), &c.out_m2}, {&ports.count(), &c.out_count}};
    for (const auto& [lt, slot] : outs) {
      *slot = index_in(partition.outputs, lt->id);
      if (*slot < 0) return internal_error("the partition does not output the sums");
      if (!dense_vector(*lt)) return unimplemented("the JIT forward writes dense sums");
    }
    c.out_dst = -1;
  } else if (c.phase == FwdPhase::kApply) {
    const BatchNormForwardApplyPorts ports(*bn);
    NG_ASSIGN_OR_RETURN(c.in_sum, need_input(ports.sum(), "the global sum"));
    NG_ASSIGN_OR_RETURN(c.in_m2, need_input(ports.m2(), "the global M2"));
    NG_ASSIGN_OR_RETURN(c.in_count, need_input(ports.count(), "the global count"));
    NG_RETURN_IF_ERROR(
        forward_ports<BatchNormForwardApplyPorts>(partition, *bn, add, relu, need_input, c));
  } else if (c.phase == FwdPhase::kInference) {
    NG_RETURN_IF_ERROR(
        forward_ports<BatchNormInferencePorts>(partition, *bn, add, relu, need_input, c));
  } else {
    NG_RETURN_IF_ERROR(
        forward_ports<BatchNormForwardTrainingPorts>(partition, *bn, add, relu, need_input, c));
  }
  const int64_t es = dtype_size(c.dt);
  const int64_t pixel_bytes = std::max<int64_t>(1, c.c * es);
  c.chunk_pixels = kFwdChunkPixels;
  c.apply_pixels = std::clamp<int64_t>(kFwdApplyBytes / pixel_bytes, 1, 256);
  c.chunk_rows = c.spatial >= kFwdRowPiece || c.spatial == 0 ? 1 : kFwdRowPiece / c.spatial;
  // Rows past kShortRowBytes stay one channel a call: long rows are streams
  // the prefetchers follow alone, and grouping them ran slower
  // (docs/jit-rules.md).
  if (c.ncx_rows && c.isa != Isa::kPortable && c.spatial * es <= kShortRowBytes) {
    const int64_t lanes = c.isa == Isa::kAvx512 ? 16 : 8;
    c.channel_group = c.isa == Isa::kAvx512 ? kRowGroupAvx512 : kRowGroupAvx2;
    c.chunk_rows = std::max<int64_t>(1, kFwdChainTerms / ((c.spatial + lanes - 1) / lanes));
  }
  c.prefetch_next_channel =
      c.ncx_rows && c.isa != Isa::kPortable && c.spatial * es <= (int64_t{1} << 30);
  NG_ASSIGN_OR_RETURN(int64_t total, checked_product(d.dims, bn->label()));
  c.single_thread = total * es < 64 * 1024;
  // Whole lines per NCX row or NXC pixel, so every unmasked vector store is
  // a full aligned line (or half of one, for 16-bit data).
  const int64_t line_elems = (c.ncx_rows ? c.spatial : c.c) * es;
  c.streaming = c.isa != Isa::kPortable && line_elems % 64 == 0 && fwd_past_cache(c);
  // Streaming stores pay on AVX2 and lose on AVX-512's smaller layers, as
  // streaming gives up the L3 that holds much of those tensors; hence the
  // AVX2-only bounce (docs/jit-rules.md).
  c.bounce =
      fwd_bounce_possible(c) && c.isa == Isa::kAvx2 && c.spatial * es >= kFwdAvx2BounceRowBytes;
  c.streaming = c.streaming || c.bounce;
  c.pair_vectors = c.isa == Isa::kAvx2 && c.dt == DataType::kBF16 && !c.residual;
  // The threads the forward will run on (the same bits for any).
  c.strip_channels = fwd_strip_rule(c, planned_threads());
  c.line_walk = fwd_line_walk(c);
  // 16-bit NXC pixel walks store ordinary lines: streaming their half-line
  // vectors ran 1.12-1.28x slower from 112x112 to 14x14 on both ISAs, while
  // the strips (7x7) keep streaming (docs/jit-rules.md).
  if (!c.ncx_rows && c.dt != DataType::kF32 && c.strip_channels == 0 && !c.bounce)
    c.streaming = false;
  // 16-bit NXC statistics pixel by pixel, the chunk's sums in memory, for
  // rows of 512 bytes to 2 KiB: there the sweeps, even prefetching, were
  // level or slower. Narrow pixels keep the sweeps, and so do rows of 2 KiB
  // and more, where the prefetching sweeps won (a row is many blocks, whose
  // lines no hardware prefetcher foresees), and AVX-512 strips
  // (docs/jit-rules.md).
  if (!c.ncx_rows && c.isa != Isa::kPortable && c.dt != DataType::kF32 && c.strip_channels == 0 &&
      c.c * es >= kFwdStatsGroupRowBytes && c.c * es < kFwdStatsSweepRowBytes)
    c.stats_pixel_group = 1;
  // AVX2 strips: groups of 4 pixels beat the sweeps, whose strips hold too
  // few vectors for AVX2's 16 registers; on AVX-512 the sweeps are level or
  // faster (docs/jit-rules.md).
  if (c.strip_channels > 0 && c.isa == Isa::kAvx2) c.stats_pixel_group = kFwdStripStatsGroupAvx2;
  return c;
}

StatusOr<std::pair<FwdConf, FwdConf>> make_fwd_sibling_confs(const Partition& partition, Isa isa) {
  const Op* anchor = partition.bound(FusionRole::kAnchor);
  const Op* sib = partition.bound(FusionRole::kSibling);
  if (anchor == nullptr || sib == nullptr)
    return internal_error("a sibling partition binds an anchor and a sibling");
  // The first: the sibling's plain forward, its dst r written into the
  // partition's dst (r, appended to the outputs, only lets make_fwd_conf find
  // it; out_dst is then the partition's dst). The second: the anchor with
  // its epilogue, reading r there as its residual (one input past the
  // partition's: the driver appends the dst buffer) and writing dst over it.
  const LogicalTensor& r = BatchNormForwardTrainingPorts(*sib).dst();
  Partition pa = partition;
  pa.ops = {*sib};
  pa.roles = {BoundOp{sib->id(), FusionRole::kAnchor}};
  pa.outputs.push_back(r);
  Partition pb = partition.without(sib->id());
  pb.inputs.push_back(r);
  NG_ASSIGN_OR_RETURN(FwdConf a, make_fwd_conf(pa, isa));
  NG_ASSIGN_OR_RETURN(FwdConf b, make_fwd_conf(pb, isa));
  if (a.phase != FwdPhase::kWhole || b.phase != FwdPhase::kWhole || !b.residual)
    return internal_error("forward siblings are whole forwards, the second with the residual");
  const LogicalTensor& dst = partition.outputs[static_cast<size_t>(b.out_dst)];
  if (dst.dtype != r.dtype || dst.dims != r.dims || !in_layout(dst, a))
    return unimplemented(
        "the JIT keeps the shortcut's dst in the partition's dst, which must be "
        "its dense twin; tensor " +
        std::to_string(dst.id) + " is not");
  a.out_dst = b.out_dst;
  // r is read back from the cache: ordinary stores, and the second's walk.
  a.streaming = false;
  a.bounce = false;
  a.strip_channels = b.strip_channels;
  a.line_walk = fwd_line_walk(a);
  return std::make_pair(std::move(a), std::move(b));
}

namespace {

// Whether one walk's tasks, chunks and apply calls fit both confs.
bool same_walk(const FwdConf& a, const FwdConf& b) {
  return a.isa == b.isa && a.dt == b.dt && a.c == b.c && a.n == b.n && a.spatial == b.spatial &&
         a.pixels == b.pixels && a.ncx_rows == b.ncx_rows && a.channel_group == b.channel_group &&
         a.strip_channels == b.strip_channels && a.chunk_rows == b.chunk_rows &&
         a.chunk_pixels == b.chunk_pixels && a.apply_pixels == b.apply_pixels &&
         a.single_thread == b.single_thread && a.empty == b.empty &&
         a.channels_last_view == b.channels_last_view && a.phase == b.phase;
}

}  // namespace

Status check_fwd_sibling_walks(const FwdConf& a, const FwdConf& b) {
  if (same_walk(a, b) && a.phase == FwdPhase::kWhole) return ok_status();
  return unimplemented("the JIT drives forward siblings with one walk; theirs differ (" +
                       a.kernel_name() + " against " + b.kernel_name() + ")");
}

StatusOr<std::optional<FwdConf>> make_fwd_side_conf(const Partition& partition, Isa isa) {
  const Op* act = partition.bound(FusionRole::kActivation);
  if (act == nullptr || index_in(partition.outputs, act->inputs()[0].id) < 0)
    return std::optional<FwdConf>();
  // The partition less its activation writes the activation's input (the
  // batch norm's dst or the Add's sum) as its dst, where it is an output.
  NG_ASSIGN_OR_RETURN(FwdConf side, make_fwd_conf(partition.without(act->id()), isa));
  return std::optional<FwdConf>(std::move(side));
}

Status check_fwd_side_walks(const FwdConf& conf, const FwdConf& side) {
  // The side output's apply takes the conf's coefficients as they are laid out.
  if (same_walk(conf, side) && conf.line_walk == side.line_walk &&
      conf.pair_vectors == side.pair_vectors && conf.residual == side.residual)
    return ok_status();
  return unimplemented(
      "the JIT writes a forward's side output on the forward's walk; theirs differ (" +
      conf.kernel_name() + " against " + side.kernel_name() + ")");
}

}  // namespace jit
}  // namespace normgrad
