// generate_fwd_kernels: the forward's generated kernels (FwdGenerator, on
// AVX-512 or AVX2) or the portable C++ path.
#include <memory>

#include <normgrad/backends/jit/jit_forward_generator.hpp>
#include <normgrad/backends/jit/jit_generator.hpp>

namespace normgrad {
namespace jit {
namespace {

class GeneratedFwd final : public FwdKernels {
 public:
  explicit GeneratedFwd(const FwdConf& c)
      : stats_(c, FwdGenerator::Kind::kStats),
        apply_(c, FwdGenerator::Kind::kApply),
        stream_(c.streaming ? std::make_unique<FwdGenerator>(c, FwdGenerator::Kind::kApplyStreaming)
                            : nullptr) {}
  void stats(const FwdArgs& a) const override { stats_.fn()(&a); }
  void apply(const FwdArgs& a) const override { apply_.fn()(&a); }
  void apply_streaming(const FwdArgs& a) const override {
    (stream_ ? stream_->fn() : apply_.fn())(&a);
  }
  void register_code(const std::string& key) const {
    register_kernel_code(stats_, key, "fwd_stats");
    register_kernel_code(apply_, key, "fwd_apply");
    if (stream_) register_kernel_code(*stream_, key, "fwd_apply_nt");
  }

 private:
  FwdGenerator stats_, apply_;
  std::unique_ptr<FwdGenerator> stream_;
};

}  // namespace

StatusOr<std::shared_ptr<const FwdKernels>> generate_fwd_kernels(const FwdConf& conf) {
  if (conf.isa == Isa::kPortable || conf.empty) return portable_fwd_kernels(conf);
  return generate_guarded<FwdKernels>(conf.kernel_name(), [&] {
    auto k = std::make_shared<GeneratedFwd>(conf);
    k->register_code(conf.key());
    return k;
  });
}

}  // namespace jit
}  // namespace normgrad
