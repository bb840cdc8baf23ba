// The JIT backend: batch-norm backward (AVX-512, AVX2) and forward training
// (AVX-512) on generated kernels or the portable path, with a process-wide
// kernel cache.
#include <mutex>
#include <optional>
#include <unordered_map>

#include <cstdio>
#include <iostream>

#include <normgrad/backends/backend_registry.hpp>
#include <normgrad/backends/jit/jit_driver.hpp>
#include <normgrad/backends/jit/jit_forward.hpp>
#include <normgrad/backends/tune_cache.hpp>

namespace normgrad {
namespace {

class JitKernel final : public Kernel {
 public:
  JitKernel(jit::BnConf conf, std::shared_ptr<const jit::KernelSet> kernels,
            std::shared_ptr<const jit::KernelSet> staged)
      : conf_(std::move(conf)), kernels_(std::move(kernels)), staged_(std::move(staged)) {}
  std::string name() const override { return conf_.kernel_name(); }
  std::string info() const override {
    return conf_.isa == jit::Isa::kPortable ? "portable"
                                            : "codegen_ms=" + std::to_string(kernels_->generate_ms);
  }
  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    return jit::run_batch_norm_backward(conf_, *kernels_, in, out, staged_.get());
  }

 private:
  jit::BnConf conf_;
  std::shared_ptr<const jit::KernelSet> kernels_;
  std::shared_ptr<const jit::KernelSet> staged_;  // strided tensors: staged per task
};

// Two sibling backwards driven by one walk (jit_dense.cpp); each conf's
// kernels are those its batch norm's own partition would have.
class JitSiblingKernel final : public Kernel {
 public:
  JitSiblingKernel(jit::BnConf first, std::shared_ptr<const jit::KernelSet> first_kernels,
                   jit::BnConf second, std::shared_ptr<const jit::KernelSet> second_kernels)
      : first_(std::move(first)),
        second_(std::move(second)),
        first_kernels_(std::move(first_kernels)),
        second_kernels_(std::move(second_kernels)) {}
  std::string name() const override { return first_.kernel_name() + "+sibling"; }
  std::string info() const override {
    return first_.isa == jit::Isa::kPortable
               ? "portable"
               : "codegen_ms=" +
                     std::to_string(first_kernels_->generate_ms + second_kernels_->generate_ms);
  }
  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    return jit::run_batch_norm_siblings(first_, *first_kernels_, second_, *second_kernels_, in,
                                        out);
  }

 private:
  jit::BnConf first_, second_;
  std::shared_ptr<const jit::KernelSet> first_kernels_, second_kernels_;
};

// Two forward confs driven by one walk (jit_forward_driver.cpp): siblings
// (the shortcut's, then the anchor's), or a forward and its side output.
class JitForwardPairKernel final : public Kernel {
 public:
  enum class Mode { kSiblings, kSideOutput };
  JitForwardPairKernel(Mode mode, jit::FwdConf first,
                       std::shared_ptr<const jit::FwdKernels> first_kernels, jit::FwdConf second,
                       std::shared_ptr<const jit::FwdKernels> second_kernels)
      : mode_(mode),
        first_(std::move(first)),
        second_(std::move(second)),
        first_kernels_(std::move(first_kernels)),
        second_kernels_(std::move(second_kernels)) {}
  std::string name() const override {
    return mode_ == Mode::kSiblings ? second_.kernel_name() + "+sibling"
                                    : first_.kernel_name() + "+side_out";
  }
  std::string config() const override { return first_.key() + " " + second_.key(); }
  std::string info() const override {
    return first_.isa == jit::Isa::kPortable
               ? "portable"
               : "codegen_ms=" +
                     std::to_string(first_kernels_->generate_ms + second_kernels_->generate_ms);
  }
  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    if (mode_ == Mode::kSideOutput)
      return jit::run_batch_norm_forward_side(first_, *first_kernels_, second_, *second_kernels_,
                                              in, out);
    return jit::run_batch_norm_forward_siblings(first_, *first_kernels_, second_, *second_kernels_,
                                                in, out);
  }

 private:
  Mode mode_;
  jit::FwdConf first_, second_;
  std::shared_ptr<const jit::FwdKernels> first_kernels_, second_kernels_;
};

class JitForwardKernel final : public Kernel {
 public:
  JitForwardKernel(jit::FwdConf conf, std::shared_ptr<const jit::FwdKernels> kernels)
      : conf_(std::move(conf)), kernels_(std::move(kernels)) {}
  std::string name() const override { return conf_.kernel_name(); }
  std::string config() const override { return conf_.key(); }
  std::string info() const override {
    return conf_.isa == jit::Isa::kPortable ? "portable"
                                            : "codegen_ms=" + std::to_string(kernels_->generate_ms);
  }
  Status execute(const std::vector<const void*>& in, const std::vector<void*>& out) const override {
    return jit::run_batch_norm_forward(conf_, *kernels_, in, out);
  }

 private:
  jit::FwdConf conf_;
  std::shared_ptr<const jit::FwdKernels> kernels_;
};

// Generated code by conf key: the same problem generates code once. One
// cache per kind of kernel set (the backward's and the forward's).
template <typename Conf, typename Set,
          StatusOr<std::shared_ptr<const Set>> (*Generate)(const Conf&)>
class KernelCache {
 public:
  StatusOr<std::shared_ptr<const Set>> get(const Conf& conf) {
    const std::string key = conf.key();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = sets_.find(key); it != sets_.end()) return it->second;
    }
    NG_ASSIGN_OR_RETURN(auto set, Generate(conf));
    std::lock_guard<std::mutex> lock(mu_);
    return sets_.emplace(key, set).first->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const Set>> sets_;
};

using BackwardCache = KernelCache<jit::BnConf, jit::KernelSet, jit::generate_kernels>;
using ForwardCache = KernelCache<jit::FwdConf, jit::FwdKernels, jit::generate_fwd_kernels>;

BackwardCache& kernel_cache() {
  static BackwardCache cache;
  return cache;
}

ForwardCache& forward_cache() {
  static ForwardCache cache;
  return cache;
}

class JitBackend final : public Backend {
 public:
  const char* name() const override { return jit::kBackendName; }

  // Batch-norm backward, with the ReLUBackward/Add producers its generated
  // code computes while it loads src and diff_dst (jit_conf.hpp, Fuse); and
  // forward training and inference with the Add/ReLU its apply computes
  // before it stores.
  std::vector<Pattern> patterns() const override {
    return {bn_backward_siblings_pattern(jit::kBackendName),
            bn_backward_producers_pattern(jit::kBackendName, /*side_output=*/true),
            bn_forward_siblings_pattern(jit::kBackendName),
            bn_forward_side_output_pattern(jit::kBackendName),
            bn_forward_epilogue_pattern(jit::kBackendName),
            single_op_pattern("bn_bwd", jit::kBackendName, bn_backward_kinds()),
            single_op_pattern("bn_bwd_from_dst", jit::kBackendName,
                              {OpKind::kBatchNormTrainingBackwardFromDst}),
            single_op_pattern("bn_fwd", jit::kBackendName,
                              {OpKind::kBatchNormForwardTraining, OpKind::kBatchNormForwardReduce,
                               OpKind::kBatchNormForwardApply}),
            bn_inference_pattern(jit::kBackendName)};
  }

  Status supports(const Partition& partition, const CompileContext& ctx) const override {
    if (forward(partition) && siblings(partition))
      return fwd_sibling_confs_of(partition, ctx).status();
    if (forward(partition)) {
      NG_ASSIGN_OR_RETURN(jit::FwdConf conf, fwd_conf_of(partition, ctx));
      return fwd_side_conf_of(partition, ctx, conf).status();
    }
    if (siblings(partition)) return sibling_confs_of(partition, ctx).status();
    return conf_of(partition, ctx).status();
  }

  StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition,
                                                  const CompileContext& ctx) const override {
    if (forward(partition) && siblings(partition)) {
      NG_ASSIGN_OR_RETURN(auto confs, fwd_sibling_confs_of(partition, ctx));
      NG_ASSIGN_OR_RETURN(auto first, forward_cache().get(confs.first));
      NG_ASSIGN_OR_RETURN(auto second, forward_cache().get(confs.second));
      return std::shared_ptr<const Kernel>(std::make_shared<JitForwardPairKernel>(
          JitForwardPairKernel::Mode::kSiblings, std::move(confs.first), std::move(first),
          std::move(confs.second), std::move(second)));
    }
    if (forward(partition)) {
      NG_ASSIGN_OR_RETURN(jit::FwdConf conf, fwd_conf_of(partition, ctx));
      NG_ASSIGN_OR_RETURN(std::optional<jit::FwdConf> side, fwd_side_conf_of(partition, ctx, conf));
      NG_ASSIGN_OR_RETURN(auto kernels, forward_cache().get(conf));
      if (side) {
        NG_ASSIGN_OR_RETURN(auto side_kernels, forward_cache().get(*side));
        return std::shared_ptr<const Kernel>(std::make_shared<JitForwardPairKernel>(
            JitForwardPairKernel::Mode::kSideOutput, std::move(conf), std::move(kernels),
            std::move(*side), std::move(side_kernels)));
      }
      return std::shared_ptr<const Kernel>(
          std::make_shared<JitForwardKernel>(std::move(conf), std::move(kernels)));
    }
    if (siblings(partition)) {
      NG_ASSIGN_OR_RETURN(auto confs, sibling_confs_of(partition, ctx));
      NG_ASSIGN_OR_RETURN(auto first, kernel_cache().get(confs.first));
      NG_ASSIGN_OR_RETURN(auto second, kernel_cache().get(confs.second));
      return std::shared_ptr<const Kernel>(std::make_shared<JitSiblingKernel>(
          std::move(confs.first), std::move(first), std::move(confs.second), std::move(second)));
    }
    NG_ASSIGN_OR_RETURN(jit::BnConf conf, conf_of(partition, ctx));
    NG_ASSIGN_OR_RETURN(auto kernels, kernel_cache().get(conf));
    std::shared_ptr<const jit::KernelSet> staged;
    if (!conf.x_strides.empty() || !conf.dy_strides.empty() || !conf.dx_strides.empty()) {
      NG_ASSIGN_OR_RETURN(staged, kernel_cache().get(jit::staged_conf(conf)));
    }
    return std::shared_ptr<const Kernel>(
        std::make_shared<JitKernel>(std::move(conf), std::move(kernels), std::move(staged)));
  }

  Status configuration() const override { return jit::check_isa_setting(); }
  std::vector<std::string> variants() const override { return jit::jit_variant_list(); }
  Status check_variant(const std::string& name) const override {
    jit::BnConf scratch;  // the variant's edits land here and are dropped
    return jit::apply_variant(name, &scratch);
  }

 private:
  static bool forward(const Partition& partition) {
    const Op* anchor = partition.bound(FusionRole::kAnchor);
    return anchor != nullptr && (anchor->kind() == OpKind::kBatchNormForwardTraining ||
                                 anchor->kind() == OpKind::kBatchNormForwardReduce ||
                                 anchor->kind() == OpKind::kBatchNormForwardApply ||
                                 anchor->kind() == OpKind::kBatchNormInference);
  }
  // Both forward siblings' confs with the variant or tuned choice each would
  // take, still walking alike (no-siblings declines them).
  static StatusOr<std::pair<jit::FwdConf, jit::FwdConf>> fwd_sibling_confs_of(
      const Partition& partition, const CompileContext& ctx) {
    if (jit::variant_names(ctx.jit_variant, "no-siblings"))
      return unimplemented("the no-siblings variant runs sibling batch norms apart");
    NG_ASSIGN_OR_RETURN(auto confs, jit::make_fwd_sibling_confs(partition, jit::detect_isa()));
    NG_RETURN_IF_ERROR(choose_fwd(ctx, partition, &confs.first));
    NG_RETURN_IF_ERROR(choose_fwd(ctx, partition, &confs.second));
    NG_RETURN_IF_ERROR(jit::check_fwd_sibling_walks(confs.first, confs.second));
    return confs;
  }
  // The variant the context names, else the host's tuned choice for the
  // anchor's class (the synchronized forward's parts keep the rules: tune
  // times the whole), else the rules.
  static Status choose_fwd(const CompileContext& ctx, const Partition& partition,
                           jit::FwdConf* conf) {
    if (!ctx.jit_variant.empty()) return jit::apply_forward_variant(ctx.jit_variant, conf);
    if (conf->phase != jit::FwdPhase::kWhole) return ok_status();
    NG_ASSIGN_OR_RETURN(BatchNormDesc d,
                        describe_batch_norm(*partition.bound(FusionRole::kAnchor)));
    take_tuned(
        conf->isa, d,
        [&](const std::string& v) {
          jit::FwdConf chosen = *conf;
          const Status s = jit::apply_forward_variant(v, &chosen);
          return std::make_pair(s, chosen);
        },
        conf);
    return ok_status();
  }
  static StatusOr<jit::FwdConf> fwd_conf_of(const Partition& partition, const CompileContext& ctx) {
    NG_ASSIGN_OR_RETURN(jit::FwdConf conf, jit::make_fwd_conf(partition, jit::detect_isa()));
    NG_RETURN_IF_ERROR(choose_fwd(ctx, partition, &conf));
    return conf;
  }
  // The side output's conf, when the partition has one, with the variant or
  // tuned choice the forward takes, on the forward's walk (fwd-no-side-output
  // declines it: the batch norm and its activation then run apart).
  static StatusOr<std::optional<jit::FwdConf>> fwd_side_conf_of(const Partition& partition,
                                                                const CompileContext& ctx,
                                                                const jit::FwdConf& conf) {
    NG_ASSIGN_OR_RETURN(std::optional<jit::FwdConf> side,
                        jit::make_fwd_side_conf(partition, jit::detect_isa()));
    if (!side) return side;
    if (jit::variant_names(ctx.jit_variant, "fwd-no-side-output"))
      return unimplemented("the fwd-no-side-output variant runs the activation apart");
    NG_RETURN_IF_ERROR(choose_fwd(ctx, partition, &*side));
    NG_RETURN_IF_ERROR(jit::check_fwd_side_walks(conf, *side));
    return side;
  }
  static bool siblings(const Partition& partition) {
    return partition.bound(FusionRole::kSibling) != nullptr;
  }
  // Both confs with the variant or tuned choice each would take, still
  // walking alike.
  static StatusOr<std::pair<jit::BnConf, jit::BnConf>> sibling_confs_of(const Partition& partition,
                                                                        const CompileContext& ctx) {
    if (jit::variant_names(ctx.jit_variant, "no-siblings"))
      return unimplemented("the no-siblings variant runs sibling batch norms apart");
    NG_ASSIGN_OR_RETURN(auto confs, jit::make_sibling_confs(partition, jit::detect_isa()));
    NG_RETURN_IF_ERROR(choose(ctx, &confs.first));
    NG_RETURN_IF_ERROR(choose(ctx, &confs.second));
    NG_RETURN_IF_ERROR(jit::check_sibling_walks(confs.first, confs.second));
    return confs;
  }
  static StatusOr<jit::BnConf> conf_of(const Partition& partition, const CompileContext& ctx) {
    if (partition.ops.empty()) return invalid_argument("empty partition");
    NG_ASSIGN_OR_RETURN(jit::BnConf conf, jit::make_conf(partition, jit::detect_isa()));
    NG_RETURN_IF_ERROR(choose(ctx, &conf));
    return conf;
  }
  // The variant the context names, else the host's tuned choice, else the rules.
  static Status choose(const CompileContext& ctx, jit::BnConf* conf_out) {
    jit::BnConf& conf = *conf_out;
    if (!ctx.jit_variant.empty()) {
      return jit::apply_variant(ctx.jit_variant, &conf);
    }
    // The host's measured choice for this shape class, when `normgrad tune`
    // made one (the split Reduce/Apply halves keep the rules: tune times the
    // whole backward).
    if (conf.d.phase != BackwardPhase::kWhole) return ok_status();
    take_tuned(
        conf.isa, conf.d,
        [&](const std::string& v) {
          jit::BnConf chosen = conf;
          const Status s = jit::apply_variant(v, &chosen);
          return std::make_pair(s, chosen);
        },
        &conf);
    return ok_status();
  }

  // Replaces *conf with apply(variant) when the tune cache holds a choice
  // for d's class on this ISA, and names it in conf->tuned. A variant this
  // build does not know is said once, and the rules stay.
  template <typename Conf, typename Apply>
  static void take_tuned(jit::Isa isa, const BatchNormDesc& d, const Apply& apply, Conf* conf) {
    const TunedChoice* tuned = find_tuned_choice(jit::isa_name(isa), tune_class(d));
    if (tuned == nullptr || tuned->variant == "default") return;
    std::pair<Status, Conf> applied = apply(tuned->variant);
    if (!applied.first.ok()) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::cerr << "normgrad: warning: tune cache " << tune_cache_path() << ": "
                  << applied.first.message() << "; using the JIT's own rules for that class\n";
      });
      return;
    }
    char speedup[32];
    std::snprintf(speedup, sizeof speedup, "%.2fx", tuned->speedup);
    applied.second.tuned = tuned->variant + " " + speedup;
    *conf = std::move(applied.second);
  }
};

}  // namespace

const Backend* jit_backend() {
  static const JitBackend backend;
  return &backend;
}

}  // namespace normgrad
