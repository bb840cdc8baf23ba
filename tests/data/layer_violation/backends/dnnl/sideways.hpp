// One backend including another: the layer check refuses it.
#include <normgrad/backends/jit/jit_conf.hpp>
