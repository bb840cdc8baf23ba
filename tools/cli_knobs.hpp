// benchdnn's graph-driver knobs for one case, and how they rewrite a loaded
// graph before it is finalized, as benchdnn rewrites a --case file
// (oneDNN's benchdnn documentation, "Graph Driver", tests/benchdnn/doc/driver_graph.md
// in the oneDNN repository):
//
//   --dt=bf16 | --dt=ID:DT[+ID:DT]   every data tensor (the batch-norm family's
//                                    statistics stay f32, as in benchdnn), or
//                                    the listed tensors; `undef` keeps the file's
//   --in-shapes=ID:SHAPE[*STRIDES|*TAG][+...]   graph input shapes and strides;
//                                    `ID:-` is rank 0, `ID:*TAG` strides only
//   --op-attrs=ID:NAME:VALUE[*NAME:VALUE][+ID:...]   attributes, typed by the
//                                    op's schema (or the file's own type)
//   --op-kind=ID:KIND[+ID:KIND]      op kinds; `undef` removes a unary or binary op
//   --mb=N                           dim 0 of every data input (0 keeps; wins
//                                    over --in-shapes)
//   --attr-fpmath=MODE[:true|false]  the graph's fpmath mode
//   --expected-n-partitions=N        checked after compile (0 skips)
//   --tensor-property=ID:PROPERTY[+...]
// The driver (cli_driver.hpp) expands comma lists into one Knobs per case.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <normgrad/graph/graph.hpp>

namespace normgrad {
namespace cli {

struct OpAttrRewrite {
  int64_t op_id = 0;
  std::string name;
  std::string value;
};

struct InShape {
  bool rank0 = false;           // `ID:-`
  std::optional<Dims> dims;     // absent: keep the file's shape (`ID:*TAG`)
  std::optional<Dims> strides;  // from STRIDES, or a TAG resolved against the dims
  std::string tag;              // `abcd`-style, resolved when the dims are known
};

struct Knobs {
  std::string dt;                          // one dtype for every data tensor; empty: keep
  std::map<int64_t, DataType> tensor_dts;  // --dt=ID:DT+...
  std::map<int64_t, InShape> in_shapes;
  std::vector<OpAttrRewrite> op_attrs;
  std::map<int64_t, std::string> op_kinds;
  std::map<int64_t, std::string> tensor_properties;
  int64_t mb = 0;  // 0: keep
  std::string fpmath;
  int64_t expected_n_partitions = 1;  // benchdnn's default; 0 skips the check
  std::string mode = "C";             // C, P, CP, R or L (list)
  std::string backend = "auto";
  // Each case knob as given (one value of a comma list), for __REPRO lines.
  std::map<std::string, std::string> text;
};

// A whole-string decimal integer in [lo, hi]; false for anything else.
bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out);

// Parses one value of case knob `key` (without "--") into `knobs`; the empty
// value means "as in the file". Unknown keys are an error.
Status parse_case_knob(const std::string& key, const std::string& value, Knobs* knobs);
// True for the knobs parse_case_knob takes (the ones --reset restores).
bool is_case_knob(const std::string& key);
// Applies the rewrites to a loaded, not yet finalized graph.
Status apply_knobs(const Knobs& knobs, Graph* graph);
// The canonical knobs of one case: "--mode=C --dt=bf16 ... --case=PATH".
std::string repro_line(const Knobs& knobs, const std::string& case_path, int64_t seed);

}  // namespace cli
}  // namespace normgrad
