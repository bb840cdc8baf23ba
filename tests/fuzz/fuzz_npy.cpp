// libFuzzer target: the .npy parser on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include <normgrad/graph/npy.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto arr =
      normgrad::parse_npy(std::string(reinterpret_cast<const char*>(data), size), int64_t{1} << 20);
  (void)arr;
  return 0;
}
