// Internal: the registration functions of the built-in backends, called once
// from available_backends(). Not installed; users pick backends by name.
#pragma once

#include <normgrad/backends/backend.hpp>

namespace normgrad {

const Backend* ref_backend();
#ifdef NORMGRAD_WITH_JIT
const Backend* jit_backend();
#endif
#ifdef NORMGRAD_WITH_MPI
const Backend* mpi_backend();
#endif
#ifdef NORMGRAD_WITH_DNNL
const Backend* dnnl_backend();
void set_dnnl_threads(int n);
#endif

}  // namespace normgrad
