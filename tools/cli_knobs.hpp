// benchdnn's graph-driver knobs on a loaded graph: --dt, --in-shapes,
// --op-attrs and --mb rewrite it before it is finalized, exactly as benchdnn
// rewrites a --case file.
//
//   --dt=bf16                 data tensors become bf16; for the batch-norm family
//                             only src/diff_dst/diff_src (and dst) change, the
//                             statistics stay f32, as in benchdnn
//   --in-shapes=0:2x3x4+1:... input tensor shapes (dense); every produced tensor
//                             is then re-inferred
//   --op-attrs=0:epsilon:0.5  attribute NAME of op ID, typed by the op's schema
//   --mb=N                    the first dim of every data tensor
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace normgrad {
namespace cli {

struct OpAttrRewrite {
  int64_t op_id = 0;
  std::string name;
  std::string value;
};

struct Knobs {
  std::string dt;  // empty: keep the file's dtypes
  std::map<int64_t, Dims> in_shapes;
  std::vector<OpAttrRewrite> op_attrs;
  int64_t mb = 0;          // 0: keep
  std::string mode = "C";  // C, P, CP or R
  std::string backend = "auto";
  std::string in_shapes_text, op_attrs_text;  // as given, for __REPRO lines
};

// A whole-string decimal integer in [lo, hi]; false for anything else.
bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out);

Status parse_in_shapes(const std::string& text, Knobs* knobs);
Status parse_op_attrs(const std::string& text, Knobs* knobs);
// Applies the rewrites to a loaded, not yet finalized graph.
Status apply_knobs(const Knobs& knobs, Graph* graph);
// The canonical knobs of one case: "--mode=C --dt=bf16 ... --case=PATH".
std::string repro_line(const Knobs& knobs, const std::string& case_path);

}  // namespace cli
}  // namespace normgrad
