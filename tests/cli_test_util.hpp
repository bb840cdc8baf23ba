// Running the `normgrad` command line from tests: exit code, signal, output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace normgrad {
namespace testing_util {

struct CliResult {
  int exit_code = -1;
  bool signaled = false;
  std::string output;  // stdout and stderr
};

// Runs `normgrad ARGS` through the shell (so ARGS may hold env prefixes' quoting).
inline CliResult run_cli(const std::string& args) {
  CliResult r;
  const std::string cmd = std::string(NORMGRAD_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.signaled = WIFSIGNALED(status);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string write_temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/ng_cli_" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace testing_util
}  // namespace normgrad
