// The graphs `normgrad bench` times: the backward (with a fused producer),
// the forward (with its epilogue), and the backward's two phases apart.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {
namespace cli {

// Problems as "NxCxHxW" with their {N, C, H, W}.
using NamedShapes = std::vector<std::pair<std::string, Dims>>;

// The named problem sets of `bench --shapes` and `tune --shapes`: "small"
// (two shapes, one odd-sized), "resnet50" (ResNet-50's batch-32 layers, then
// small's) and "cached" (cache-resident). Empty for any other name.
NamedShapes bench_shape_set(const std::string& name);

// BatchNormTrainingBackward with gamma and 3 outputs, optionally fed by
// ReLUBackward ("relu") or Add ("add") on diff_dst, or by a ReLUBackward
// whose output is a graph output too ("relu-side"). `nchw` is {N, C, H, W}.
Graph make_graph(const Dims& nchw, const std::string& layout, DataType dt,
                 const std::string& fused);
// BatchNormForwardTraining with gamma and beta, optionally followed by ReLU
// ("relu") or by Add of a residual and ReLU ("add").
Graph make_forward_graph(const Dims& nchw, const std::string& layout, DataType dt,
                         const std::string& fused);
// The backward's phases alone: BatchNormBackwardReduce (reads src and
// diff_dst: 2 tensor passes) or BatchNormBackwardApply (reads both again and
// writes diff_src: 3), as the JIT runs them inside the fused backward.
Graph make_phase_graph(const Dims& nchw, const std::string& layout, DataType dt, bool reduce);
// BatchNormTrainingBackwardFromDst through leaky_relu(alpha), 3 outputs: the
// backward InPlace-ABN runs instead of BatchNormTrainingBackward (same traffic,
// dst read where src was).
Graph make_from_dst_graph(const Dims& nchw, const std::string& layout, DataType dt, float alpha);

}  // namespace cli
}  // namespace normgrad
