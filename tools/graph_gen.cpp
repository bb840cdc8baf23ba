// Random valid graphs (graph_gen.hpp): one generator per op kind, sharing a
// pool of the data tensors the graph has made so far.
#include "tools/graph_gen.hpp"

#include <algorithm>
#include <functional>
#include <numeric>

namespace normgrad {
namespace cli {
namespace {

// The batch_mean and batch_variance a forward computed over `src`, read by a
// later backward over the same tensor in the same layout.
// A backward's diff_src, which a later backward over another src may take
// as its gradient.
struct Gradient {
  int64_t src = -1;
  LogicalTensor dx;
};

struct ForwardStats {
  int64_t src = -1;
  bool nxc = false;
  LogicalTensor mean, variance;
};

class Gen {
 public:
  Gen(uint64_t seed, const GraphGenOptions& options) : rng_(seed), options_(options) {}

  StatusOr<Graph> build() {
    const int ops = 1 + static_cast<int>(pick(options_.max_ops));
    for (int i = 0; i < ops; ++i) step();
    Graph g;
    for (Op& op : ops_) NG_RETURN_IF_ERROR(g.add_op(std::move(op)));
    return g;
  }

 private:
  int64_t pick(int64_t n) { return n <= 1 ? 0 : static_cast<int64_t>(rng_() % uint64_t(n)); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  T one_of(std::initializer_list<T> v) {
    return *(v.begin() + pick(static_cast<int64_t>(v.size())));
  }

  void step() {
    switch (pick(12)) {
      case 0:
      case 1:
        return bn_backward(data());
      case 2:
      case 3:
        return bn_forward(data());
      case 4:
        return bn_inference(data());
      case 5:
        return from_dst(data());
      case 6:
        return tf_grad();
      case 7:
        return elementwise(data());
      case 8:
        return cast_or_transpose(data());
      case 9:
        return quantize_round_trip();
      case 10:
        return conversions_around_backward();
      default:
        return relu_backward_into_pool();
    }
  }

  // ---- tensors

  DataType float_dtype() {
    return one_of({DataType::kF32, DataType::kF32, DataType::kBF16, DataType::kF16});
  }

  Dims data_shape() {
    // One shape in forty is large enough for the walks the JIT chooses by
    // size: wide pixel rows (strips, per-pixel 16-bit statistics), tensors
    // past a quarter of the cache model's L3 (streaming stores), short rows
    // of many channels (grouped rows).
    if (chance(0.025)) {
      return one_of<Dims>({{16, 2048, 7, 7},
                           {8, 1024, 14, 14},
                           {4, 512, 28, 28},
                           {2, 64, 112, 112},
                           {16, 7, 7, 2048},
                           {8, 14, 14, 1024}});
    }
    const int rank = static_cast<int>(one_of<int64_t>({2, 3, 4, 4, 4, 5}));
    Dims d;
    d.push_back(chance(options_.empty_chance) ? 0 : one_of<int64_t>({1, 2, 3, 4}));
    d.push_back(one_of<int64_t>({1, 3, 8, 16, 17, 33, 64, 80}));
    for (int i = 2; i < rank; ++i) d.push_back(one_of<int64_t>({1, 2, 3, 5, 7, 9}));
    return d;
  }

  // A new graph input; a data tensor is given non-dense strides a quarter of
  // the time: channels-last strides on an NCX shape (or the reverse), or dim
  // 0 padded.
  LogicalTensor fresh(DataType dt, Dims dims, bool may_stride = false) {
    LogicalTensor lt(next_tensor_++, dt, dims);
    if (may_stride && dims.size() >= 3 && chance(0.25)) {
      const size_t r = dims.size();
      std::vector<size_t> order(r);  // outermost first
      std::iota(order.begin(), order.end(), 0);
      if (chance(0.5)) {
        order.erase(order.begin() + 1);
        order.push_back(1);  // C innermost
      } else {
        std::swap(order[r - 1], order[r - 2]);
      }
      Dims strides(r);
      int64_t s = 1;
      for (size_t k = r; k-- > 0;) {
        strides[order[k]] = s;
        s *= std::max<int64_t>(1, dims[order[k]]) + (k == 0 && chance(0.5) ? 1 : 0);
      }
      lt.strides = strides;
    }
    return lt;
  }
  LogicalTensor vec(int64_t c) { return fresh(DataType::kF32, {c}); }
  LogicalTensor out(DataType dt, Dims dims) { return LogicalTensor(next_tensor_++, dt, dims); }

  // A data tensor to read: one the graph has (60%) or a fresh input.
  LogicalTensor data() {
    if (!pool_.empty() && chance(0.6)) return pool_[static_cast<size_t>(pick(pool_.size()))];
    LogicalTensor t = fresh(float_dtype(), data_shape(), true);
    return t;
  }
  // Another tensor of `like`'s dtype and shape: one the graph has, or fresh.
  LogicalTensor same_as(const LogicalTensor& like, int64_t avoid = -1) {
    std::vector<const LogicalTensor*> fits;
    for (const LogicalTensor& t : pool_) {
      if (t.dtype == like.dtype && t.dims == like.dims && t.id != avoid) fits.push_back(&t);
    }
    if (!fits.empty() && chance(0.4)) return *fits[static_cast<size_t>(pick(fits.size()))];
    return fresh(like.dtype, like.dims, true);
  }

  Op& add(OpKind kind, const char* name) {
    ops_.emplace_back(next_op_++, kind, name);
    return ops_.back();
  }
  static int64_t channels(const LogicalTensor& t, bool nxc) {
    return nxc ? t.dims.back() : t.dims[1];
  }
  double epsilon() { return one_of({1e-5, 1e-3, 0.1, 1.0}); }

  // ---- the batch-norm family

  void bn_forward(const LogicalTensor& x) {
    const bool nxc = chance(0.5);
    const int64_t c = channels(x, nxc);
    Op& op = add(OpKind::kBatchNormForwardTraining, "bn_fwd");
    op.set_attr("epsilon", epsilon()).set_attr("data_format", nxc ? "NXC" : "NCX");
    // Synchronized over a group of one (ref's AllReduce); an empty batch
    // has no statistics to share, which is an error of its own.
    if (options_.sync_ops && x.dims[0] > 0 && chance(0.15)) op.set_attr("sync_group", "world");
    if (chance(0.3)) op.set_attr("momentum", one_of({0.1, 0.5, 1.0}));
    op.add_input(x).add_input(vec(c)).add_input(vec(c));
    if (chance(0.8)) op.add_input(vec(c)).add_input(vec(c));
    const LogicalTensor dst = out(x.dtype, x.dims);
    const LogicalTensor bm = out(DataType::kF32, {c}), bv = out(DataType::kF32, {c});
    op.add_output(dst)
        .add_output(out(DataType::kF32, {c}))
        .add_output(out(DataType::kF32, {c}))
        .add_output(bm)
        .add_output(bv);
    stats_.push_back({x.id, nxc, bm, bv});
    LogicalTensor y = dst;
    if (chance(0.5)) {
      // The residual Add; in f32 NXC, sometimes a tensor computed from the
      // same forward's batch_mean (broadcast over the channels).
      LogicalTensor other = same_as(dst);
      if (nxc && x.dtype == DataType::kF32 && chance(0.4)) {
        other = out(DataType::kF32, {c});
        add(OpKind::kAdd, "from_mean").add_input(bm).add_input(vec(c)).add_output(other);
      }
      const LogicalTensor sum = out(x.dtype, x.dims);
      add(OpKind::kAdd, "residual").add_input(dst).add_input(other).add_output(sum);
      y = sum;
    }
    if (chance(0.6)) {
      const LogicalTensor pre = y;
      y = activation(pre);
      // A backward that reads the activation's input, as a LeakyReLU's
      // does: the JIT then writes that input as a side output.
      if (chance(0.3)) {
        const LogicalTensor dx = out(pre.dtype, pre.dims);
        add(OpKind::kReLUBackward, "act_bwd")
            .set_attr("use_dst", false)
            .add_input(pre)
            .add_input(fresh(pre.dtype, pre.dims))
            .add_output(dx);
        pool_.push_back(dx);
      }
    }
    pool_.push_back(y);
  }

  LogicalTensor activation(const LogicalTensor& x) {
    const LogicalTensor y = out(x.dtype, x.dims);
    if (chance(0.15)) {
      add(OpKind::kSigmoid, "sigmoid").add_input(x).add_output(y);  // no fusion takes it
    } else if (chance(0.5)) {
      add(OpKind::kReLU, "relu").add_input(x).add_output(y);
    } else {
      add(OpKind::kLeakyReLU, "leaky")
          .set_attr("alpha", one_of({0.01, 0.2, 1.0, 2.0}))
          .add_input(x)
          .add_output(y);
    }
    return y;
  }

  void bn_inference(const LogicalTensor& x) {
    const bool nxc = chance(0.5);
    const int64_t c = channels(x, nxc);
    const LogicalTensor dst = out(x.dtype, x.dims);
    add(OpKind::kBatchNormInference, "bn_inf")
        .set_attr("epsilon", epsilon())
        .set_attr("data_format", nxc ? "NXC" : "NCX")
        .add_input(x)
        .add_input(vec(c))
        .add_input(vec(c))
        .add_input(vec(c))
        .add_input(vec(c))
        .add_output(dst);
    pool_.push_back(chance(0.5) ? activation(dst) : dst);
  }

  // diff_dst for a backward over `src`: a fresh input, a ReLUBackward of
  // fresh inputs (a producer the JIT fuses), or, as in a training graph,
  // another backward's diff_src: as it is, through a ReLUBackward, or added
  // to a fresh gradient (a residual block's two paths). Never a function of
  // src: a diff_src is one of its own backward's src, so only a backward
  // over another src lends its diff_src.
  // `produced`: never a graph input or a diff_src as it is (a ReLUBackward's
  // or an Add's output, which the JIT fuses).
  LogicalTensor gradient_for(const LogicalTensor& src, bool produced = false) {
    std::vector<const Gradient*> lent;
    for (const Gradient& g : grads_) {
      if (g.src != src.id && g.dx.dtype == src.dtype && g.dx.dims == src.dims) lent.push_back(&g);
    }
    if (!lent.empty() && chance(0.5)) {
      const LogicalTensor dx = lent[static_cast<size_t>(pick(lent.size()))]->dx;
      const int64_t how = produced ? 1 + pick(2) : pick(3);
      if (how == 0) return dx;
      const LogicalTensor g = out(src.dtype, src.dims);
      if (how == 1) {
        add(OpKind::kReLUBackward, "relu_bwd")
            .set_attr("use_dst", chance(0.5))
            .add_input(fresh(src.dtype, src.dims, true))
            .add_input(dx)
            .add_output(g);
      } else {
        add(OpKind::kAdd, "grad_add")
            .add_input(dx)
            .add_input(fresh(src.dtype, src.dims))
            .add_output(g);
      }
      return g;
    }
    if (!produced && chance(0.6)) return fresh(src.dtype, src.dims, true);
    const LogicalTensor g = out(src.dtype, src.dims);
    add(OpKind::kReLUBackward, "relu_bwd")
        .set_attr("use_dst", chance(0.5))
        .add_input(fresh(src.dtype, src.dims, true))
        .add_input(fresh(src.dtype, src.dims))
        .add_output(g);
    return g;
  }

  void bn_backward(const LogicalTensor& src) {
    const bool nxc = chance(0.5);
    const int64_t c = channels(src, nxc);
    // A downsampling block's shortcut: a second backward over another src of
    // the same shape reads the same gradient (the JIT's sibling partitions).
    const bool sibling = chance(0.2);
    const LogicalTensor dy = gradient_for(src, sibling);
    backward_op(src, dy, nxc, c);
    if (sibling) backward_op(fresh(src.dtype, src.dims, true), dy, nxc, c);
  }

  void backward_op(const LogicalTensor& src, const LogicalTensor& dy, bool nxc, int64_t c) {
    LogicalTensor mean = vec(c), var = vec(c);
    for (const ForwardStats& s : stats_) {
      if (s.src == src.id && s.nxc == nxc && chance(0.7)) {
        mean = s.mean;
        var = s.variance;
      }
    }
    Op& op = add(OpKind::kBatchNormTrainingBackward, "bn_bwd");
    op.set_attr("epsilon", epsilon()).set_attr("data_format", nxc ? "NXC" : "NCX");
    if (options_.sync_ops && chance(0.1)) op.set_attr("sync_group", "world");
    op.add_input(src).add_input(dy).add_input(mean).add_input(var);
    if (chance(0.8)) op.add_input(vec(c));
    const LogicalTensor dx = out(src.dtype, src.dims);
    op.add_output(dx);
    if (chance(0.7)) op.add_output(out(DataType::kF32, {c})).add_output(out(DataType::kF32, {c}));
    pool_gradient(dx, c);
    grads_.push_back({src.id, dx});
  }

  void from_dst(const LogicalTensor& dst) {
    const bool nxc = chance(0.5);
    const int64_t c = channels(dst, nxc);
    Op& op = add(OpKind::kBatchNormTrainingBackwardFromDst, "bn_bwd_from_dst");
    op.set_attr("epsilon", epsilon()).set_attr("data_format", nxc ? "NXC" : "NCX");
    if (chance(0.6)) {
      op.set_attr("activation", "leaky_relu").set_attr("alpha", one_of({0.01, 0.3, 1.0}));
    }
    op.add_input(dst)
        .add_input(fresh(dst.dtype, dst.dims, true))
        .add_input(vec(c))
        .add_input(vec(c))
        .add_input(vec(c));
    if (chance(0.3)) op.add_input(fresh(dst.dtype, dst.dims));
    const LogicalTensor dx = out(dst.dtype, dst.dims);
    op.add_output(dx);
    if (chance(0.7)) op.add_output(out(DataType::kF32, {c})).add_output(out(DataType::kF32, {c}));
    pool_gradient(dx, c);
  }

  void tf_grad() {
    const OpKind kind = one_of({OpKind::kFusedBatchNormGrad, OpKind::kFusedBatchNormGradV2,
                                OpKind::kFusedBatchNormGradV3});
    const bool nhwc = chance(0.5);
    const bool five = kind == OpKind::kFusedBatchNormGradV3 && chance(0.3);
    const DataType dt = kind == OpKind::kFusedBatchNormGrad ? DataType::kF32 : float_dtype();
    Dims dims = data_shape();
    dims.resize(five ? 5 : 4, 3);
    const int64_t c = nhwc ? dims.back() : dims[1];
    Op& op = add(kind, "tf_grad");
    op.set_attr("epsilon", epsilon())
        .set_attr("data_format", five ? (nhwc ? "NDHWC" : "NCDHW") : (nhwc ? "NHWC" : "NCHW"))
        .set_attr("is_training", chance(0.7));
    const LogicalTensor x = fresh(dt, dims, true);
    op.add_input(fresh(dt, dims, true))
        .add_input(x)
        .add_input(vec(c))
        .add_input(vec(c))
        .add_input(vec(c));
    if (kind == OpKind::kFusedBatchNormGradV3) op.add_input(vec(c));
    const LogicalTensor dx = out(dt, dims);
    op.add_output(dx)
        .add_output(out(DataType::kF32, {c}))
        .add_output(out(DataType::kF32, {c}))
        .add_output(out(DataType::kF32, {0}))
        .add_output(out(DataType::kF32, {0}));
    pool_gradient(dx, c);
  }

  // A backward's diff_src becomes data for later ops only when its channels
  // have enough elements: with few (1 or 2: diff_src is 0 in exact
  // arithmetic) it is rounding noise, and whatever reads it (a ReLU's sign,
  // another batch norm's normalisation) amplifies the noise past any
  // tolerance.
  void pool_gradient(const LogicalTensor& dx, int64_t channels) {
    const int64_t elements =
        std::accumulate(dx.dims.begin(), dx.dims.end(), int64_t{1}, std::multiplies<int64_t>());
    if (channels > 0 && elements / channels >= kMinPooledReduction) pool_.push_back(dx);
  }
  static constexpr int64_t kMinPooledReduction = 8;

  // ---- the ops around them

  void elementwise(const LogicalTensor& x) {
    if (chance(0.5)) {
      pool_.push_back(activation(x));
      return;
    }
    const LogicalTensor y = out(x.dtype, x.dims);
    add(OpKind::kAdd, "add").add_input(x).add_input(same_as(x, x.id)).add_output(y);
    pool_.push_back(y);
  }

  void relu_backward_into_pool() {
    const LogicalTensor x = data();
    const LogicalTensor y = out(x.dtype, x.dims);
    add(OpKind::kReLUBackward, "relu_bwd")
        .set_attr("use_dst", chance(0.5))
        .add_input(x)
        .add_input(same_as(x, x.id))
        .add_output(y);
    pool_.push_back(y);
  }

  void cast_or_transpose(const LogicalTensor& x) {
    if (chance(0.5)) {
      const DataType to =
          x.dtype == DataType::kF32 ? one_of({DataType::kBF16, DataType::kF16}) : DataType::kF32;
      const LogicalTensor y = out(to, x.dims);
      add(OpKind::kTypeCast, "cast").add_input(x).add_output(y);
      pool_.push_back(y);
      return;
    }
    std::vector<int64_t> order(x.dims.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin() + 1, order.end(), rng_);  // keep N first: pool shapes stay data
    if (chance(0.3)) order[1] -= static_cast<int64_t>(order.size());  // a negative axis
    Dims dims;
    const auto rank = static_cast<int64_t>(x.dims.size());
    for (int64_t o : order) dims.push_back(x.dims[static_cast<size_t>((o + rank) % rank)]);
    const LogicalTensor y = out(x.dtype, dims);
    add(OpKind::kStaticTranspose, "transpose").set_attr("order", order).add_input(x).add_output(y);
    if (dims.size() >= 2 && dims[1] >= 1) pool_.push_back(y);
  }

  // A batch-norm backward between conversions that fold-transpose or
  // fold-cast folds into it: NCX data transposed to NXC and back, or 16-bit
  // data cast to f32 and back. Its diff_src joins the pool, so later ops may
  // read the outer conversion's tensor.
  void conversions_around_backward() {
    const LogicalTensor x = data();
    if (x.dims.size() < 3) return bn_backward(x);  // no layout to fold
    const int64_t c = x.dims[1];
    const bool transpose = x.dtype == DataType::kF32 || chance(0.5);
    const auto rank = static_cast<int64_t>(x.dims.size());
    std::vector<int64_t> to_last = {0}, to_first = {0, rank - 1};
    for (int64_t i = 2; i < rank; ++i) to_last.push_back(i);
    to_last.push_back(1);
    for (int64_t i = 1; i < rank - 1; ++i) to_first.push_back(i);
    Dims inner_dims = x.dims;
    if (transpose) {
      inner_dims.clear();
      for (int64_t o : to_last) inner_dims.push_back(x.dims[static_cast<size_t>(o)]);
    }
    const DataType inner_dt = transpose ? x.dtype : DataType::kF32;
    auto convert_in = [&](const LogicalTensor& t) {
      const LogicalTensor y = out(inner_dt, inner_dims);
      if (transpose) {
        add(OpKind::kStaticTranspose, "to_nxc").set_attr("order", to_last).add_input(t);
      } else {
        add(OpKind::kTypeCast, "to_f32").add_input(t);
      }
      ops_.back().add_output(y);
      return y;
    };
    const LogicalTensor src = convert_in(x);
    const LogicalTensor dy = convert_in(fresh(x.dtype, x.dims));
    const LogicalTensor dx_inner = out(inner_dt, inner_dims);
    Op& bn = add(OpKind::kBatchNormTrainingBackward, "bn_bwd_folded");
    bn.set_attr("epsilon", epsilon()).set_attr("data_format", transpose ? "NXC" : "NCX");
    bn.add_input(src).add_input(dy).add_input(vec(c)).add_input(vec(c));
    if (chance(0.8)) bn.add_input(vec(c));
    bn.add_output(dx_inner);
    if (chance(0.7)) bn.add_output(out(DataType::kF32, {c})).add_output(out(DataType::kF32, {c}));
    const LogicalTensor dx = out(x.dtype, x.dims);
    if (transpose) {
      add(OpKind::kStaticTranspose, "to_ncx").set_attr("order", to_first).add_input(dx_inner);
    } else {
      add(OpKind::kTypeCast, "to_narrow").add_input(dx_inner);
    }
    ops_.back().add_output(dx);
    pool_gradient(dx, c);
  }

  void quantize_round_trip() {
    const LogicalTensor x = fresh(DataType::kF32, data_shape(), true);
    const bool u8 = chance(0.5);
    const LogicalTensor q = out(u8 ? DataType::kU8 : DataType::kS8, x.dims);
    const float scale = one_of({0.01f, 0.1f, 0.5f});
    const int64_t zp = u8 ? one_of<int64_t>({0, 3, 128}) : 0;
    add(OpKind::kQuantize, "quantize")
        .set_attr("scales", std::vector<float>{scale})
        .set_attr("zps", std::vector<int64_t>{zp})
        .add_input(x)
        .add_output(q);
    const LogicalTensor y = out(DataType::kF32, x.dims);
    add(OpKind::kDequantize, "dequantize")
        .set_attr("scales", std::vector<float>{scale})
        .set_attr("zps", std::vector<int64_t>{zp})
        .add_input(q)
        .add_output(y);
    pool_.push_back(y);
  }

  std::mt19937_64 rng_;
  GraphGenOptions options_;
  int64_t next_tensor_ = 0, next_op_ = 0;
  std::vector<Op> ops_;
  std::vector<LogicalTensor> pool_;
  std::vector<ForwardStats> stats_;
  std::vector<Gradient> grads_;
};

}  // namespace

StatusOr<Graph> random_graph(uint64_t seed, const GraphGenOptions& options) {
  return Gen(seed, options).build();
}

}  // namespace cli
}  // namespace normgrad
