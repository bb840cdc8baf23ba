// The DLPack ABI (dmlc/dlpack v0.x, the version torch 1.13 exports), declared
// here since Debian has no DLPack package; only the parts a consumer reads.
// A producer's __dlpack__() returns a PyCapsule named "dltensor" holding a
// DLManagedTensor; the consumer renames it "used_dltensor" and calls the
// deleter when done.
#pragma once

#include <cstdint>

namespace normgrad {
namespace python {

enum DLDeviceType : int32_t { kDLCPU = 1 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

}  // namespace python
}  // namespace normgrad
