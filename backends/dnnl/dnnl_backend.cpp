// The oneDNN backend: lowers single-op partitions to oneDNN 2.6 primitives and
// declines, with the reason, whatever oneDNN cannot run exactly.
#include <dlfcn.h>

#include "backends/backend_registry.hpp"
#include "backends/dnnl/dnnl_kernels.hpp"

namespace normgrad {
namespace {

class DnnlBackend final : public Backend {
 public:
  const char* name() const override { return "dnnl"; }

  Status supports(const Partition& partition) const override { return build(partition).status(); }

  StatusOr<std::shared_ptr<const Kernel>> compile(const Partition& partition) const override {
    return build(partition);
  }

 private:
  // Plans are cached by signature, so supports() followed by compile() builds once.
  static StatusOr<std::shared_ptr<const Kernel>> build(const Partition& partition) {
    const Op& op = partition.ops[0];
    if (op.kind() == OpKind::kBatchNormInference || op.kind() == OpKind::kBatchNormForwardTraining)
      return dnnl_impl::make_batch_norm_forward(partition);
    if (partition.ops.size() != 1)
      return unimplemented("only the BatchNormInference+ReLU group is lowered fused to oneDNN");
    switch (op.kind()) {
      case OpKind::kBatchNormTrainingBackward:
        return dnnl_impl::make_batch_norm_backward(op);
      case OpKind::kAdd:
        if (op.inputs()[0].dims != op.inputs()[1].dims ||
            op.inputs()[0].dtype != op.inputs()[1].dtype ||
            op.inputs()[0].dtype != op.outputs()[0].dtype) {
          return unimplemented("Add with broadcasting or mixed dtypes is not lowered to oneDNN");
        }
        return dnnl_impl::make_neighbour(op);
      case OpKind::kQuantize:
      case OpKind::kDequantize:
      case OpKind::kReLU:
      case OpKind::kReLUBackward:
      case OpKind::kTypeCast:
      case OpKind::kStaticTranspose:
        return dnnl_impl::make_neighbour(op);
      default:
        break;
    }
    return unimplemented(std::string(op_kind_name(op.kind())) +
                         " is not lowered to oneDNN (ref runs it)");
  }
};

}  // namespace

const Backend* dnnl_backend() {
  static const DnnlBackend backend;
  return &backend;
}

// oneDNN on Debian threads with OpenMP (libgomp, loaded with libdnnl). The call
// is looked up at run time so normgrad itself never links an OpenMP runtime,
// which keeps clang builds (whose -fopenmp means libomp) from mixing two.
void set_dnnl_threads(int n) {
  using SetThreads = void (*)(int);
  static const auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set != nullptr) set(n);
}

}  // namespace normgrad
