// oneDNN backend helpers: engine, memory descriptors, errors, scratchpads.
#include <normgrad/backends/dnnl/dnnl_common.hpp>

namespace normgrad {
namespace dnnl_impl {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

StatusOr<dnnl::memory::data_type> to_dnnl(DataType dt) {
  switch (dt) {
    case DataType::kF32:
      return dnnl::memory::data_type::f32;
    case DataType::kBF16:
      return dnnl::memory::data_type::bf16;
    case DataType::kS8:
      return dnnl::memory::data_type::s8;
    case DataType::kU8:
      return dnnl::memory::data_type::u8;
    default:
      break;
  }
  return unimplemented(std::string("dtype ") + dtype_name(dt) +
                       " is not lowered to oneDNN 2.6 on CPU");
}

StatusOr<dnnl::memory::desc> make_md(const LogicalTensor& lt, DataType dt,
                                     const std::vector<int>& perm) {
  NG_ASSIGN_OR_RETURN(dnnl::memory::data_type ddt, to_dnnl(dt));
  const Dims strides = lt.effective_strides();
  dnnl::memory::dims dims, strd;
  for (size_t i = 0; i < lt.dims.size(); ++i) {
    const size_t from = perm.empty() ? i : static_cast<size_t>(perm[i]);
    dims.push_back(lt.dims[from]);
    strd.push_back(strides[from]);
  }
  dnnl::memory::desc md;
  NG_RETURN_IF_ERROR(guard("memory descriptor for tensor " + std::to_string(lt.id),
                           [&] { md = dnnl::memory::desc(dims, ddt, strd); }));
  return md;
}

std::vector<int> channel_second_perm(int rank, int channel_axis) {
  std::vector<int> perm = {0, channel_axis};
  for (int i = 1; i < rank; ++i) {
    if (i != channel_axis) perm.push_back(i);
  }
  return perm;
}

std::vector<float> channel_values_f32(const void* p, const LogicalTensor& lt, int64_t c) {
  std::vector<float> v(static_cast<size_t>(c));
  const int64_t stride = lt.effective_strides()[0];
  for (int64_t i = 0; i < c; ++i)
    v[i] = static_cast<float>(load_as_double(p, i * stride, lt.dtype));
  return v;
}

Status guard(const std::string& what, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dnnl::error& e) {
    // Building a primitive that oneDNN does not have, whatever status it
    // gives, is a decline (ref or the JIT may run it). At execute time the
    // status says whose fault it is: arguments, memory or oneDNN itself.
    const std::string msg = "oneDNN: " + what + ": " + e.what() + " (status " +
                            std::to_string(static_cast<int>(e.status)) + ")";
    if (what.find("execute") == std::string::npos) return unimplemented(msg);
    switch (e.status) {
      case dnnl_unimplemented:
        return unimplemented(msg);
      case dnnl_invalid_arguments:
        return invalid_argument(msg);
      case dnnl_out_of_memory:
        return out_of_range(msg);
      default:
        return internal_error(msg);
    }
  } catch (const std::exception& e) {
    return internal_error("oneDNN: " + what + ": " + e.what());
  }
  return ok_status();
}

std::string effective_isa_name() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::sse41:
      return "sse41";
    case cpu_isa::avx:
      return "avx";
    case cpu_isa::avx2:
      return "avx2";
    case cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case cpu_isa::avx512_core:
      return "avx512_core";
    case cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(static_cast<int>(dnnl::get_effective_cpu_isa()));
  }
}

Status explain_decline(Status s, const char* primitive, DataType dt) {
  if (s.code() != StatusCode::kUnimplemented) return s;
  const std::string isa = effective_isa_name();
  // oneDNN 2.6's CPU batch norm and eltwise kernels take bf16 from
  // avx512_core on; below it there is no implementation at all.
  std::string need;
  if (dt == DataType::kBF16 && isa.rfind("avx512", 0) != 0)
    need = "; it needs AVX-512 (avx512_core)";
  return unimplemented("oneDNN 2.6 has no " + std::string(dtype_name(dt)) + " " + primitive +
                       " on this CPU (" + isa + ")" + need + " [" + s.message() + "]");
}

Scratchpad make_scratchpad(const dnnl::primitive_desc_base& pd) {
  Scratchpad s;
  const dnnl::memory::desc md = pd.scratchpad_desc();
  s.bytes = ScratchBuffer(md.get_size() + 1);
  if (s.bytes.data() == nullptr) throw dnnl::error(dnnl_out_of_memory, "scratchpad allocation");
  s.mem = dnnl::memory(md, cpu_engine(), s.bytes.data());
  return s;
}

}  // namespace dnnl_impl
}  // namespace normgrad
