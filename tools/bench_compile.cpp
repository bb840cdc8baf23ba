// `normgrad bench --compile`: the compiler's own cost on generated graphs of
// 10^3 to 10^5 ops, phase by phase (loading the text and the JSON forms,
// finalize, the pass pipeline, partitioning, and compile end to end), in
// microseconds per op, with the process's peak memory.
//
// Three shapes of graph, each a repeated block:
//   chain     ReLUBackward -> BatchNormTrainingBackward in oneDNN's
//             single-output form (the canonicalize pass rewrites every one),
//             each block's diff_src the next block's gradient: a training
//             graph's backward;
//   ladder    ReLU then an Add of the ReLU's output and its input (a residual
//             block's fan-in), each Add's output the next block's input;
//   fan-out   one tensor read by every op (ReLUs of the same input);
//   resnet    a ResNet training step's basic blocks, 16 ops each, as
//             scripts/resnet_graph.py writes them: Convolution ->
//             BatchNormForwardTraining -> ReLU -> Convolution ->
//             BatchNormForwardTraining -> Add(residual) -> ReLU, then the
//             backward in reverse (ReLUBackward, BatchNormTrainingBackward,
//             ConvolutionBackwardData and -Weights, twice, and the gradient
//             Add); the convolutions are ops normgrad hands back;
//   folds     a channels-last batch-norm backward between StaticTransposes
//             from and to NCX, each block's diff_src the next block's
//             gradient: fold-transpose erases three of every four ops, so
//             it times edits (each erase costs the edit, not the graph).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <normgrad/compile/compiler.hpp>
#include <normgrad/compile/pipeline.hpp>
#include <normgrad/graph/json_io.hpp>
#include <normgrad/graph/text_io.hpp>
#include "tools/cli.hpp"

namespace normgrad {
namespace cli {
namespace {

// `blocks` ResNet basic blocks (f32 2x8x4x4, 3x3 convolutions), forward
// then backward, in the text form.
void resnet_blocks(std::ostringstream& os, int64_t blocks) {
  const std::string t = ":f32[2,8,4,4]", c = ":f32[8]", w = ":f32[8,8,3,3]";
  const std::string conv =
      "strides=[1,1], pads_begin=[1,1], pads_end=[1,1], dilations=[1,1], auto_pad=\"None\", "
      "groups=1, data_format=\"NCX\", weights_format=\"OIX\"";
  const std::string bn = "data_format=\"NCX\", epsilon=1e-05f";
  int64_t next_id = 1, next_op = 1;
  auto id = [&] { return next_id++; };
  auto T = [&](int64_t i, const std::string& type) { return "%" + std::to_string(i) + type; };
  auto op = [&](const std::string& outs, const std::string& kind, const std::string& ins,
                const std::string& attrs) {
    os << outs << " = " << kind << "#" << next_op++ << " \"" << kind << "\"(" << ins << ")";
    if (!attrs.empty()) os << " {" << attrs << "}";
    os << "\n";
  };
  struct Saved {
    int64_t x, c[2], w[2], gamma[2], mean[2], var[2], r1, out;
  };
  std::vector<Saved> saved;
  int64_t x = 0;
  for (int64_t k = 0; k < blocks; ++k) {
    Saved b{};
    b.x = x;
    int64_t in = x;
    for (int i = 0; i < 2; ++i) {
      b.w[i] = id();
      b.c[i] = id();
      op(T(b.c[i], t), "Convolution", T(in, t) + ", " + T(b.w[i], w), conv);
      const int64_t rm = id(), rv = id(), y = id(), rmo = id(), rvo = id();
      b.gamma[i] = id();
      const int64_t beta = id();
      b.mean[i] = id();
      b.var[i] = id();
      op(T(y, t) + ", " + T(rmo, c) + ", " + T(rvo, c) + ", " + T(b.mean[i], c) + ", " +
             T(b.var[i], c),
         "BatchNormForwardTraining",
         T(b.c[i], t) + ", " + T(rm, c) + ", " + T(rv, c) + ", " + T(b.gamma[i], c) + ", " +
             T(beta, c),
         bn + ", momentum=0.1f");
      if (i == 0) {
        b.r1 = id();
        op(T(b.r1, t), "ReLU", T(y, t), "");
        in = b.r1;
      } else {
        const int64_t sum = id();
        op(T(sum, t), "Add", T(y, t) + ", " + T(x, t), "");
        b.out = x = id();
        op(T(x, t), "ReLU", T(sum, t), "");
      }
    }
    saved.push_back(b);
  }
  int64_t dout = id();
  for (int64_t k = blocks; k-- > 0;) {
    const Saved& b = saved[static_cast<size_t>(k)];
    const int64_t ds = id();
    op(T(ds, t), "ReLUBackward", T(b.out, t) + ", " + T(dout, t), "use_dst=true");
    int64_t grad = ds;
    for (int i = 1; i >= 0; --i) {
      if (i == 0) {
        const int64_t g = id();
        op(T(g, t), "ReLUBackward", T(b.r1, t) + ", " + T(grad, t), "use_dst=true");
        grad = g;
      }
      const int64_t dsrc = id(), dg = id(), db = id();
      op(T(dsrc, t) + ", " + T(dg, c) + ", " + T(db, c), "BatchNormTrainingBackward",
         T(b.c[i], t) + ", " + T(grad, t) + ", " + T(b.mean[i], c) + ", " + T(b.var[i], c) + ", " +
             T(b.gamma[i], c),
         bn);
      const int64_t dw = id(), dx = id();
      op(T(dw, w), "ConvolutionBackwardWeights", T(i == 0 ? b.x : b.r1, t) + ", " + T(dsrc, t),
         conv + ", weights_shape=[8,8,3,3]");
      op(T(dx, t), "ConvolutionBackwardData", T(dsrc, t) + ", " + T(b.w[i], w),
         conv + ", dst_shape=[2,8,4,4]");
      grad = dx;
    }
    dout = id();
    op(T(dout, t), "Add", T(grad, t) + ", " + T(ds, t), "");
  }
}

// The text form of a graph of about `ops` ops of `shape`.
std::string generate(const std::string& shape, int64_t ops) {
  std::ostringstream os;
  const char* t = ":f32[2,8,6]";
  const char* c = ":f32[8]";
  if (shape == "chain") {
    int64_t prev = 0;  // the first block's gradient is a graph input
    for (int64_t i = 0; i < ops / 2; ++i) {
      const int64_t b = 10 * i + 100;
      os << "%" << b + 1 << t << " = ReLUBackward#" << 2 * i + 1 << " \"rb\"(%" << b + 2 << t
         << ", %" << prev << t << ")\n";
      os << "%" << b + 3 << t << " = BatchNormTrainingBackward#" << 2 * i + 2 << " \"bn\"(%"
         << b + 6 << t << ", %" << b + 1 << t << ", %" << b + 7 << c << ", %" << b + 8 << c
         << ") {data_format=\"NCX\", epsilon=0.001f}\n";
      prev = b + 3;
    }
  } else if (shape == "ladder") {
    int64_t x = 0;
    for (int64_t i = 0; i < ops / 2; ++i) {
      const int64_t b = 10 * i + 100;
      os << "%" << b + 1 << t << " = ReLU#" << 2 * i + 1 << " \"relu\"(%" << x << t << ")\n";
      os << "%" << b + 2 << t << " = Add#" << 2 * i + 2 << " \"add\"(%" << b + 1 << t << ", %" << x
         << t << ")\n";
      x = b + 2;
    }
  } else if (shape == "folds") {
    const char* nxc = ":f32[2,6,8]";
    int64_t prev = 0;
    for (int64_t i = 0; i < ops / 4; ++i) {
      const int64_t b = 10 * i + 100, o = 4 * i;
      os << "%" << b + 1 << nxc << " = StaticTranspose#" << o + 1 << " \"t\"(%" << b << t
         << ") {order=[0,2,1]}\n";
      os << "%" << b + 2 << nxc << " = StaticTranspose#" << o + 2 << " \"t\"(%" << prev << t
         << ") {order=[0,2,1]}\n";
      os << "%" << b + 3 << nxc << ", %" << b + 4 << c << ", %" << b + 5 << c
         << " = BatchNormTrainingBackward#" << o + 3 << " \"bn\"(%" << b + 1 << nxc << ", %"
         << b + 2 << nxc << ", %" << b + 6 << c << ", %" << b + 7 << c << ", %" << b + 8 << c
         << ") {data_format=\"NXC\", epsilon=0.001f, is_training=true}\n";
      os << "%" << b + 9 << t << " = StaticTranspose#" << o + 4 << " \"t\"(%" << b + 3 << nxc
         << ") {order=[0,2,1]}\n";
      prev = b + 9;
    }
  } else if (shape == "resnet") {
    resnet_blocks(os, std::max<int64_t>(1, ops / 16));
  } else {  // fan-out
    for (int64_t i = 0; i < ops; ++i)
      os << "%" << i + 1 << t << " = ReLU#" << i + 1 << " \"relu\"(%0" << t << ")\n";
  }
  return os.str();
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

struct Row {
  std::string shape;
  int64_t ops = 0;
  // Milliseconds per phase.
  double text = 0, json = 0, finalize = 0, passes = 0, partition = 0, compile = 0;
  double rss_mb = 0;
  int64_t partitions = 0;
  std::string json_note;  // why the JSON form was not loaded
};

Status time_phases(Graph g, Row* row);

// Times one graph; `what` names the failing phase.
Status time_one(const std::string& shape, int64_t ops, bool json, Row* row) {
  row->shape = shape;
  const std::string text = generate(shape, ops);
  double t0 = now_ms();
  NG_ASSIGN_OR_RETURN(Graph g, graph_from_text(text));
  row->text = now_ms() - t0;
  row->ops = static_cast<int64_t>(g.ops().size());
  if (json) {
    const std::string j = graph_to_json(g);
    t0 = now_ms();
    auto from_json = graph_from_json(j);
    row->json = now_ms() - t0;
    if (!from_json.ok()) {
      // Over the loader's size limit (JsonLimits, 64 MB by default): said, not timed.
      row->json = -1;
      row->json_note = from_json.status().message();
    }
  }
  return time_phases(std::move(g), row);
}

// Times a graph file: loading it (the JSON column, or the text column for
// the text form), then the phases.
Status time_file(const std::string& path, Row* row) {
  row->shape = std::filesystem::path(path).filename().string();
  NG_ASSIGN_OR_RETURN(std::string text, read_text_file(path, JsonLimits{}.max_bytes));
  const bool json = text.find_first_not_of(" \t\r\n") != std::string::npos &&
                    text[text.find_first_not_of(" \t\r\n")] == '{';
  const double t0 = now_ms();
  auto g = json ? graph_from_json(text) : graph_from_text(text);
  if (!g.ok()) return g.status().with_context(path);
  (json ? row->json : row->text) = now_ms() - t0;
  (json ? row->text : row->json) = -1;
  row->ops = static_cast<int64_t>(g->ops().size());
  return time_phases(std::move(g).value(), row);
}

Status time_phases(Graph g, Row* row) {
  double t0 = now_ms();
  NG_RETURN_IF_ERROR(g.finalize());
  row->finalize = now_ms() - t0;
  const Graph unlowered = g;
  NG_ASSIGN_OR_RETURN(PassPipeline pipeline, build_pipeline(CompileOptions{}));
  t0 = now_ms();
  NG_ASSIGN_OR_RETURN(bool changed, pipeline.run(g));
  (void)changed;
  row->passes = now_ms() - t0;
  t0 = now_ms();
  // A network's convolutions are handed back, as `normgrad partitions` does.
  CompileOptions options;
  options.allow_unsupported = true;
  NG_ASSIGN_OR_RETURN(std::vector<Partition> parts, partition_graph(g, options));
  row->partition = now_ms() - t0;
  row->partitions = static_cast<int64_t>(parts.size());
  t0 = now_ms();
  NG_ASSIGN_OR_RETURN(CompiledGraph cg, CompiledGraph::compile(unlowered, options));
  row->compile = now_ms() - t0;
  row->rss_mb = peak_rss_mb();
  return ok_status();
}

}  // namespace

int bench_compile(const std::vector<int64_t>& sizes, const std::vector<std::string>& shapes,
                  const std::string& graph_path, const std::string& json_out) {
  std::cout << "compile time per op (us/op), one run each, 1 thread of work (the compiler is "
               "serial); peak RSS is the process's so far\n";
  std::cout << std::left << std::setw(8) << "shape" << std::right << std::setw(8) << "ops"
            << std::setw(10) << "text" << std::setw(10) << "json" << std::setw(10) << "finalize"
            << std::setw(10) << "passes" << std::setw(10) << "partition" << std::setw(10)
            << "compile" << std::setw(12) << "peak MB"
            << "\n";
  nlohmann::json out = nlohmann::json::array();
  auto report = [&](const Row& r) {
    const double per = 1000.0 / static_cast<double>(std::max<int64_t>(r.ops, 1));
    auto cell = [&](double ms, const char* missing) {
      if (ms < 0) {
        std::cout << std::setw(10) << missing;
      } else {
        std::cout << std::setw(10) << ms * per;
      }
    };
    std::cout << std::left << std::setw(8) << r.shape << std::right << std::setw(8) << r.ops
              << std::fixed << std::setprecision(1);
    cell(r.text, "-");
    cell(r.json, r.json_note.empty() ? "-" : "limit");
    std::cout << std::setw(10) << r.finalize * per << std::setw(10) << r.passes * per
              << std::setw(10) << r.partition * per << std::setw(10) << r.compile * per
              << std::setw(12) << r.rss_mb << "\n";
    if (!r.json_note.empty()) std::cout << "  json: " << r.json_note << "\n";
    std::cout.flush();
    auto ms_or_null = [](double ms) { return ms < 0 ? nlohmann::json() : nlohmann::json(ms); };
    out.push_back({{"shape", r.shape},
                   {"ops", r.ops},
                   {"partitions", r.partitions},
                   {"ms",
                    {{"text", ms_or_null(r.text)},
                     {"json", ms_or_null(r.json)},
                     {"finalize", r.finalize},
                     {"passes", r.passes},
                     {"partition", r.partition},
                     {"compile", r.compile}}},
                   {"peak_rss_mb", r.rss_mb}});
  };
  int rc = 0;
  if (!graph_path.empty()) {
    Row r;
    if (Status s = time_file(graph_path, &r); !s.ok()) {
      std::cerr << "normgrad bench --compile: " << s.to_string() << "\n";
      return 1;
    }
    report(r);
  }
  for (const std::string& shape : graph_path.empty() ? shapes : std::vector<std::string>{}) {
    if (shape != "chain" && shape != "ladder" && shape != "fan-out" && shape != "folds" &&
        shape != "resnet") {
      std::cerr << "normgrad bench --compile: unknown graph shape '" << shape
                << "' (chain, ladder, fan-out, folds, resnet)\n";
      return 2;
    }
    for (int64_t n : sizes) {
      Row r;
      // The JSON form of 10^5 ops is about 100 MB; its DOM is several times that.
      const Status s = time_one(shape, n, true, &r);
      if (!s.ok()) {
        std::cerr << "normgrad bench --compile: " << shape << " " << n << ": " << s.to_string()
                  << "\n";
        rc = 1;
        continue;
      }
      report(r);
    }
  }
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    if (!(f << out.dump(2) << "\n")) {
      std::cerr << "normgrad bench --compile: cannot write " << json_out << "\n";
      return 1;
    }
  }
  return rc;
}

}  // namespace cli
}  // namespace normgrad
