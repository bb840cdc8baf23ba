// The per-host tune cache (tune_cache.hpp): shape classes, the host key,
// reading the file once and writing it whole.
#include <normgrad/backends/tune_cache.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <normgrad/backends/backend.hpp>
#include <normgrad/graph/version.hpp>

namespace normgrad {
namespace {

using Json = nlohmann::json;

// The bucket's upper end: the first of `ends` at or above `v` ("more" past the last).
std::string bucket(int64_t v, std::initializer_list<int64_t> ends) {
  for (int64_t e : ends) {
    if (v <= e) return "<=" + std::to_string(e);
  }
  return ">" + std::to_string(*(ends.end() - 1));
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "unknown";
}

int threads_in_use() {
  if (num_threads() > 0) return num_threads();
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// What a tuned choice depends on: the CPU, its caches, the thread count and
// normgrad's version (its kernels). The JIT ISA is the level below, in "isa".
Json host_fields() {
  const CacheSizes& cs = cache_sizes();
  return Json{{"cpu", cpu_model()},
              {"l2_kib", cs.l2_bytes >> 10},
              {"l3_kib", cs.l3_bytes >> 10},
              {"threads", threads_in_use()},
              {"normgrad", version_string()}};
}

struct Loaded {
  std::map<std::string, std::map<std::string, TunedChoice>> by_isa;
  bool loaded = false;
};

std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}
Loaded& loaded() {
  static Loaded l;
  return l;
}

bool tuning_off() {
  const char* v = std::getenv("NORMGRAD_TUNE");
  return v != nullptr && std::string(v) == "0";
}

void warn(const std::string& what) {
  std::cerr << "normgrad: warning: tune cache " << tune_cache_path() << ": " << what
            << "; using the JIT's own rules\n";
}

// The file's entries for this host, or empty (with a warning when a file
// exists but cannot be used).
std::map<std::string, std::map<std::string, TunedChoice>> read_file(bool quiet) {
  std::map<std::string, std::map<std::string, TunedChoice>> out;
  const std::string path = tune_cache_path();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return out;
  std::ifstream in(path);
  if (!in) {
    if (!quiet) warn("cannot be read");
    return out;
  }
  Json j = Json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("host") || !j.contains("isa") ||
      !j["host"].is_object() || !j["isa"].is_object()) {
    if (!quiet) warn("is not a tune cache (corrupt?)");
    return out;
  }
  // Every field of the host must match; the warning names the first that does not.
  const Json here = host_fields();
  for (const auto& [field, value] : here.items()) {
    const Json there = j["host"].contains(field) ? j["host"][field] : Json();
    if (there != value) {
      if (!quiet)
        warn("was written for another host or normgrad version (" + field + ": " +
             (there.is_null() ? std::string("missing") : there.dump()) + " there, " + value.dump() +
             " here)");
      return out;
    }
  }
  if (j["host"].size() != here.size()) {
    if (!quiet) warn("records a host this normgrad does not describe (fields differ)");
    return out;
  }
  for (const auto& [isa, entries] : j["isa"].items()) {
    if (!entries.is_object()) continue;
    for (const auto& [cls, e] : entries.items()) {
      if (!e.is_object() || !e.contains("variant") || !e["variant"].is_string()) {
        if (!quiet) warn("entry " + isa + " " + cls + " is malformed");
        return {};
      }
      TunedChoice c;
      c.variant = e["variant"].get<std::string>();
      if (e.contains("speedup") && e["speedup"].is_number()) c.speedup = e["speedup"].get<double>();
      out[isa][cls] = c;
    }
  }
  return out;
}

}  // namespace

std::string tune_class(const BatchNormDesc& d) {
  std::ostringstream s;
  const bool forward = d.kind == OpKind::kBatchNormForwardTraining;
  s << (forward      ? "fwd"
        : d.from_dst ? "from-dst"
                     : "bwd")
    << "/" << (d.format == DataFormat::kNXC ? "NXC" : "NCX") << "/" << dtype_name(d.data_dt) << "/c"
    << bucket(d.channels, {64, 256, 1024}) << "/m"
    << bucket(d.reduce_size, {1024, 4096, 16384, 65536});
  int64_t elems = 1;
  for (int64_t v : d.dims) elems *= v;
  const int64_t bytes = 2 * elems * dtype_size(d.data_dt);  // src and diff_dst (or dst)
  s << "/" << (bytes <= cache_sizes().l3_bytes / 2 ? "cached" : "dram");
  return s.str();
}

std::string tune_host_key() {
  const Json h = host_fields();
  std::ostringstream s;
  s << h["cpu"].get<std::string>() << "; L2 " << h["l2_kib"] << " KiB; L3 " << h["l3_kib"]
    << " KiB; " << h["threads"] << " threads; normgrad " << h["normgrad"].get<std::string>();
  return s.str();
}

std::string tune_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  std::string root;
  if (xdg != nullptr && *xdg != '\0') {
    root = xdg;
  } else {
    const char* home = std::getenv("HOME");
    root = std::string(home != nullptr ? home : ".") + "/.cache";
  }
  return root + "/normgrad/tune.json";
}

const TunedChoice* find_tuned_choice(const std::string& isa, const std::string& cls) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  Loaded& l = loaded();
  if (!l.loaded) {
    l.by_isa = tuning_off() ? decltype(l.by_isa){} : read_file(false);
    l.loaded = true;
  }
  auto i = l.by_isa.find(isa);
  if (i == l.by_isa.end()) return nullptr;
  auto c = i->second.find(cls);
  return c == i->second.end() ? nullptr : &c->second;
}

void reload_tune_cache() {
  std::lock_guard<std::mutex> lock(cache_mutex());
  loaded().loaded = false;
}

Status write_tuned_choices(const std::string& isa,
                           const std::map<std::string, TunedChoice>& choices) {
  const std::string path = tune_cache_path();
  auto all = read_file(true);  // this host's other ISAs stay
  all[isa] = choices;
  Json j;
  j["host"] = host_fields();
  j["isa"] = Json::object();
  for (const auto& [i, entries] : all) {
    Json e = Json::object();
    for (const auto& [cls, c] : entries) e[cls] = {{"variant", c.variant}, {"speedup", c.speedup}};
    j["isa"][i] = e;
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return not_found(path + ": cannot create its folder: " + ec.message());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!(out << j.dump(2) << "\n")) return not_found(path + ": cannot be written");
  }
  std::filesystem::rename(tmp, path, ec);  // readers never see half a file
  if (ec) return not_found(path + ": cannot be written: " + ec.message());
  reload_tune_cache();
  return ok_status();
}

}  // namespace normgrad
