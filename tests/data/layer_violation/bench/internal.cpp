// Bench code reaching a backend internal header: the layer check refuses it.
#include <normgrad/backends/ref/ref_ops.hpp>
