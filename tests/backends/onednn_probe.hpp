// What Debian's oneDNN builds on this CPU, asked of oneDNN itself (not of
// normgrad's dnnl backend): tests that need a oneDNN primitive ask here
// first, then run it, or expect normgrad's clear refusal where oneDNN has no
// implementation (oneDNN 2.6 has bf16 batch norm, eltwise and binary only from
// AVX-512 on; ONEDNN_MAX_CPU_ISA=AVX2 emulates a host without it).
#pragma once

#include <string>

#include <oneapi/dnnl/dnnl.hpp>

#include <normgrad/graph/logical_tensor.hpp>

namespace normgrad {
namespace onednn_probe {

inline dnnl::memory::data_type probe_dt(DataType dt) {
  return dt == DataType::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// Whether oneDNN creates a training batch-norm primitive (forward, or
// backward with scale and shift) on `dt` data.
inline bool has_batch_norm(DataType dt, bool backward) {
  try {
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc md({2, 16, 4, 4}, probe_dt(dt), dnnl::memory::format_tag::nchw);
    const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    dnnl::batch_normalization_forward::primitive_desc fwd(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md, 1e-5f,
                                                flags),
        eng);
    if (!backward) return true;
    dnnl::batch_normalization_backward::primitive_desc bwd(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, md, md, 1e-5f, flags),
        eng, fwd);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// Whether oneDNN creates a ReLU eltwise backward primitive on `dt` data.
inline bool has_relu_backward(DataType dt) {
  try {
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc md({2, 16, 4, 4}, probe_dt(dt), dnnl::memory::format_tag::nchw);
    dnnl::eltwise_forward::primitive_desc fwd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::eltwise_relu, md, 0.f),
        eng);
    dnnl::eltwise_backward::primitive_desc bwd(
        dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu, md, md, 0.f), eng, fwd);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// Whether oneDNN creates a binary add primitive on `dt` data.
inline bool has_binary_add(DataType dt) {
  try {
    const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dnnl::memory::desc md({3, 7}, probe_dt(dt), dnnl::memory::format_tag::ab);
    dnnl::binary::primitive_desc pd(dnnl::binary::desc(dnnl::algorithm::binary_add, md, md, md),
                                    eng);
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

}  // namespace onednn_probe
}  // namespace normgrad
