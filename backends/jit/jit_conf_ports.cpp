// JIT conf of a partition: where its ports are, by the batch norm's port names.
//
// make_conf(partition) takes the op's conf (jit_conf.cpp) and maps the
// partition's inputs and outputs onto the kernels' PortMap: the statistics
// and sums as partition inputs, the outputs by name, and a fused producer's
// two operands as the src or diff_dst port's (dense, and only where no
// tensor of the batch norm is staged), and a fused diff_dst that others
// read too as the side output the reduce kernel writes.
#include <normgrad/backends/jit/jit_conf.hpp>

#include <normgrad/ops/op_ports.hpp>

namespace normgrad {
namespace jit {
namespace {

// Where the partition's outputs hold each of the batch norm's, by name.
Status output_ports(const Op& bn, const std::vector<LogicalTensor>& outputs, PortMap* m) {
  auto index_out = [&](const LogicalTensor& lt) -> StatusOr<int> {
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].id == lt.id) return static_cast<int>(i);
    }
    return unimplemented("the JIT writes the batch norm's outputs as partition outputs; tensor " +
                         std::to_string(lt.id) + " is not one");
  };
  if (bn.kind() == OpKind::kBatchNormBackwardReduce) {
    const BatchNormBackwardReducePorts p(bn);
    m->dx = m->diff_gamma = m->diff_beta = -1;
    NG_ASSIGN_OR_RETURN(m->sum_dy_out, index_out(p.sum_dy()));
    NG_ASSIGN_OR_RETURN(m->sum_dy_xm_out, index_out(p.sum_dy_xm()));
    NG_ASSIGN_OR_RETURN(m->count_out, index_out(p.count()));
    return ok_status();
  }
  // The other backward kinds name their outputs alike.
  using P = BatchNormTrainingBackwardPorts;
  static_assert(P::diff_beta_port() == BatchNormBackwardApplyPorts::diff_beta_port() &&
                    P::diff_beta_port() == BatchNormTrainingBackwardFromDstPorts::diff_beta_port(),
                "the backward kinds' outputs share their places");
  const std::vector<LogicalTensor>& outs = bn.outputs();
  NG_ASSIGN_OR_RETURN(m->dx, index_out(outs[P::diff_src_port()]));
  m->diff_gamma = m->diff_beta = -1;
  if (outs.size() > P::diff_beta_port()) {
    NG_ASSIGN_OR_RETURN(m->diff_gamma, index_out(outs[P::diff_gamma_port()]));
    NG_ASSIGN_OR_RETURN(m->diff_beta, index_out(outs[P::diff_beta_port()]));
  }
  return ok_status();
}

// BatchNormTrainingBackwardFromDst on the backward's kernels: src is the
// recovered y = act^-1(dst), diff_dst the gradient through act, and the
// "mean" the kernels subtract is beta; the driver turns 1/gamma and the
// variance into the coefficients (jit_driver.cpp, load_channel).
template <typename IndexOf>
StatusOr<BnConf> from_dst_ports(const Op& bn, const IndexOf& index_of, BnConf c) {
  PortMap& m = c.ports;
  const BatchNormTrainingBackwardFromDstPorts ports(bn);
  const int dst = index_of(ports.dst().id), diff_dst = index_of(ports.diff_dst().id);
  m.variance = index_of(ports.variance().id);
  m.gamma = index_of(ports.gamma().id);
  m.mean = index_of(ports.beta().id);
  if (dst < 0 || diff_dst < 0 || m.variance < 0 || m.gamma < 0 || m.mean < 0)
    return unimplemented("the JIT needs every input of " + bn.label() + " from the partition");
  m.x = dst;
  m.dy = diff_dst;
  const int residual = ports.has_residual() ? index_of(ports.residual().id) : -1;
  if (c.d.from_dst_residual && residual < 0)
    return unimplemented("the JIT needs the residual of " + bn.label() + " from the partition");
  if (c.d.alpha != 1.f || residual >= 0) {
    // The kernel reads dst twice (and the residual) where they are: all dense.
    const LogicalTensor* r = residual >= 0 ? &ports.residual() : nullptr;
    if (!c.x_strides.empty() || !c.dy_strides.empty() ||
        (r && !same_layout(r->dims, r->effective_strides(), data_strides(c, r->dims))))
      return unimplemented(
          "the JIT takes dense dst, diff_dst and residual through leaky_relu (ref runs it)");
    c.alpha = c.d.alpha;
    c.x_fuse = residual >= 0 ? Fuse::kLeakyInverseSub : Fuse::kLeakyInverse;
    m.x_second = residual;
  }
  if (c.d.alpha != 1.f && residual < 0) {
    c.dy_fuse = Fuse::kLeakyBackwardAtSrc;  // the sign from the recovered src
  } else if (c.d.alpha != 1.f) {
    c.dy_fuse = Fuse::kLeakyBackward;  // src is y - residual: the sign from dst itself
    m.dy = dst;
    m.dy_second = diff_dst;
  }
  set_apply_prefetch(&c);
  return c;
}

}  // namespace

StatusOr<BnConf> make_conf(const Partition& partition, Isa isa) {
  // The pattern that took the partition (jit_backend.cpp) bound the batch
  // norm as its anchor and any ReLUBackward/Add as the src or diff_dst producer.
  const Op* bn = partition.bound(FusionRole::kAnchor);
  if (bn == nullptr || partition.backend != kBackendName)
    return internal_error(
        "the JIT compiles partitions its own patterns matched, not " +
        (partition.pattern.empty() ? std::string("an unmatched one") : partition.pattern));
  NG_ASSIGN_OR_RETURN(BnConf c, make_conf(*bn, isa));
  auto index_of = [&](int64_t id) {
    for (size_t i = 0; i < partition.inputs.size(); ++i) {
      if (partition.inputs[i].id == id) return static_cast<int>(i);
    }
    return -1;
  };
  PortMap& m = c.ports;
  NG_RETURN_IF_ERROR(output_ports(*bn, partition.outputs, &m));
  if (c.d.from_dst) return from_dst_ports(*bn, index_of, c);
  if (c.d.phase == BackwardPhase::kReduce) {
    const BatchNormBackwardReducePorts ports(*bn);
    m.x = index_of(ports.src().id);
    m.dy = index_of(ports.diff_dst().id);
    m.mean = index_of(ports.mean().id);
    m.variance = m.gamma = -1;
    if (m.mean < 0) return unimplemented("the JIT needs the mean as a partition input");
  } else if (c.d.phase == BackwardPhase::kApply) {
    const BatchNormBackwardApplyPorts ports(*bn);
    m.x = index_of(ports.src().id);
    m.dy = index_of(ports.diff_dst().id);
    m.mean = index_of(ports.mean().id);
    m.variance = index_of(ports.variance().id);
    m.sum_dy = index_of(ports.sum_dy().id);
    m.sum_dy_xm = index_of(ports.sum_dy_xm().id);
    m.count = index_of(ports.count().id);
    m.gamma = ports.has_gamma() ? index_of(ports.gamma().id) : -1;
    if (m.mean < 0 || m.variance < 0 || m.sum_dy < 0 || m.sum_dy_xm < 0 || m.count < 0 ||
        (ports.has_gamma() && m.gamma < 0))
      return unimplemented("the JIT needs the statistics and sums as partition inputs");
    for (const LogicalTensor* lt : {&ports.sum_dy(), &ports.sum_dy_xm()}) {
      if (lt->dims[0] > 1 && lt->effective_strides()[0] != 1)
        return unimplemented("the JIT takes dense sums; tensor " + std::to_string(lt->id) +
                             " is strided (ref runs it)");
    }
  } else {
    const BatchNormTrainingBackwardPorts ports(*bn);
    m.x = index_of(ports.src().id);
    m.dy = index_of(ports.diff_dst().id);
    m.mean = index_of(ports.mean().id);
    m.variance = index_of(ports.variance().id);
    m.gamma = ports.has_gamma() ? index_of(ports.gamma().id) : -1;
    if (m.mean < 0 || m.variance < 0 || (ports.has_gamma() && m.gamma < 0)) {
      return unimplemented("the JIT needs the statistics as partition inputs");
    }
  }
  for (const BoundOp& b : partition.roles) {
    if (b.role != FusionRole::kSrcProducer && b.role != FusionRole::kDiffDstProducer) continue;
    const Op& op = *partition.bound(b.role);
    const int port = b.role == FusionRole::kSrcProducer ? 0 : 1;
    // ReLUBackward's (src/dst, diff_dst) or Add's (src_0, src_1); a
    // ReLUBackward's gradient may itself be an Add's sum (kGradientAdd).
    const bool relu = op.kind() == OpKind::kReLUBackward;
    const Op* add = port == 1 && relu ? partition.bound(FusionRole::kGradientAdd) : nullptr;
    // The kernel reads a fused port's operands where they are: they must be dense.
    if ((port == 0 && !c.x_strides.empty()) || (port == 1 && !c.dy_strides.empty()))
      return unimplemented("the JIT takes dense fused inputs");
    for (const Op* fused : {&op, add}) {
      if (fused == nullptr) continue;
      for (const LogicalTensor& lt : fused->inputs()) {
        if (!same_layout(lt.dims, lt.effective_strides(), data_strides(c, lt.dims)))
          return unimplemented("the JIT takes dense fused inputs");
      }
    }
    const int first = index_of(elementwise_src(op).id);
    int second = index_of((relu ? ReLUBackwardPorts(op).diff_dst() : AddPorts(op).src_1()).id);
    Fuse f = relu ? Fuse::kReluBackward : Fuse::kAdd;
    if (add != nullptr) {
      f = Fuse::kAddReluBackward;
      second = index_of(AddPorts(*add).src_0().id);
      m.dy_third = index_of(AddPorts(*add).src_1().id);
      if (second < 0 || m.dy_third < 0)
        return unimplemented("the JIT needs the gradient Add's operands from partition inputs");
    }
    if (port == 0) {
      c.x_fuse = f, m.x = first, m.x_second = second;
    } else {
      c.dy_fuse = f, m.dy = first, m.dy_second = second;
    }
    // A producer's output that is also read outside the partition (its
    // pattern bound it with a side output) is one of the partition's outputs.
    const LogicalTensor& made = op.outputs()[0];
    for (size_t i = 0; i < partition.outputs.size(); ++i) {
      if (partition.outputs[i].id != made.id) continue;
      if (port == 0)
        return unimplemented("the JIT writes a fused producer's output only on diff_dst");
      if (c.d.phase != BackwardPhase::kWhole || !c.needs_reduction)
        return unimplemented(
            "the JIT writes a fused diff_dst in its reduce pass; " + bn->label() +
            (c.d.phase != BackwardPhase::kWhole ? " is a split half" : " reduces nothing"));
      if (!same_layout(made.dims, made.effective_strides(), data_strides(c, made.dims)))
        return unimplemented("the JIT writes a dense side output; tensor " +
                             std::to_string(made.id) + " is strided");
      c.dy_side_out = true;
      m.dy_out = static_cast<int>(i);
    }
  }
  // Staged tensors (strided beyond what the walks take in place) are copied
  // per task into buffers of their own, and a fused operand has no staged
  // copy: fusing there would read past the buffers.
  if ((uses_second(c.x_fuse) || uses_second(c.dy_fuse)) &&
      (!c.x_strides.empty() || !c.dy_strides.empty() || !c.dx_strides.empty()))
    return unimplemented(
        "the JIT fuses producers (and the residual) only where no tensor of the batch norm is "
        "staged; a strided src, diff_dst or diff_src is");
  if (m.x < 0 || m.dy < 0)
    return unimplemented("the JIT needs src and diff_dst from partition inputs");
  set_apply_prefetch(&c);  // fused producers read more per task
  return c;
}

StatusOr<std::pair<BnConf, BnConf>> make_sibling_confs(const Partition& partition, Isa isa) {
  const Op* first = partition.bound(FusionRole::kAnchor);
  const Op* second = partition.bound(FusionRole::kSibling);
  if (first == nullptr || second == nullptr)
    return internal_error("a sibling partition binds an anchor and a sibling");
  // The first: the shared producers fused, their output t written by its
  // reduce as a side output into the second's diff_src (t's twin), from
  // which its apply reads t back. The second: a plain backward reading t
  // there (as one more input after the partition's; the driver appends that
  // buffer) and writing its diff_src over it, element by element.
  const Partition pa = partition.without(second->id());
  const LogicalTensor& t = BatchNormTrainingBackwardPorts(*second).diff_dst();
  const LogicalTensor& dx2 = BatchNormTrainingBackwardPorts(*second).diff_src();
  Partition pb = partition;
  pb.ops = {*second};
  pb.roles = {BoundOp{second->id(), FusionRole::kAnchor}};
  pb.inputs.push_back(t);
  NG_ASSIGN_OR_RETURN(BnConf a, make_conf(pa, isa));
  NG_ASSIGN_OR_RETURN(BnConf b, make_conf(pb, isa));
  for (const BnConf* c : {&a, &b}) {
    if (!c->x_strides.empty() || !c->dy_strides.empty() || !c->dx_strides.empty())
      return unimplemented("the JIT runs sibling batch norms over dense tensors; " +
                           (c == &a ? first : second)->label() + " has a strided one");
    if (c->d.phase != BackwardPhase::kWhole || c->dy_side_out)
      return internal_error("sibling batch norms are whole backwards with no side output");
  }
  if (!a.needs_reduction)
    return unimplemented(
        first->label() +
        " reduces nothing, so no pass of it writes the gradient its sibling reads");
  if (dx2.dtype != t.dtype || dx2.dims != t.dims ||
      !same_layout(dx2.dims, dx2.effective_strides(), data_strides(a, dx2.dims)))
    return unimplemented("the JIT keeps the shared gradient in " + second->label() +
                         "'s diff_src, which must be its dense twin; tensor " +
                         std::to_string(dx2.id) + " is not");
  a.dy_side_out = true;
  a.ports.dy_out = b.ports.dx;
  set_apply_prefetch(&a);  // as the side output's own partition has it
  return std::make_pair(std::move(a), std::move(b));
}

Status check_sibling_walks(const BnConf& a, const BnConf& b) {
  const WalkConf &x = a.walk, &y = b.walk;
  const std::pair<const char*, bool> same[] = {
      {"ISA", a.isa == b.isa && a.d.data_dt == b.d.data_dt},
      {"walk", x.kind == y.kind && x.cols == y.cols && x.row_stride == y.row_stride &&
                   x.channel_stride == y.channel_stride && x.dx_row_stride == y.dx_row_stride &&
                   x.dx_channel_stride == y.dx_channel_stride && x.pixel_group == y.pixel_group &&
                   x.channel_group == y.channel_group && a.d.channels == b.d.channels},
      {"empty batch", a.empty == b.empty},
      {"threads", a.single_thread == b.single_thread},
      {"reversed apply", a.stream.reverse_rows == b.stream.reverse_rows},
      {"rows", x.rows == y.rows},
      {"chunks", x.chunk_rows == y.chunk_rows && x.sweep_rows == y.sweep_rows},
      {"split",
       x.contiguous_split == y.contiguous_split && x.apply_last_first == y.apply_last_first},
      {"strips", x.strips == y.strips},
      {"calls per channel", x.batch_calls == y.batch_calls && x.batch_stride == y.batch_stride &&
                                x.dx_batch_stride == y.dx_batch_stride},
      {"bounce block", bounce_block_bytes(a) == bounce_block_bytes(b)}};
  for (const auto& [what, equal] : same) {
    if (!equal)
      return unimplemented(std::string("the JIT drives sibling batch norms with one walk; their ") +
                           what + " differs (" + a.kernel_name() + " against " + b.kernel_name() +
                           ")");
  }
  return ok_status();
}

}  // namespace jit
}  // namespace normgrad
