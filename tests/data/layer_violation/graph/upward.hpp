// A graph header that reaches up into ops: the layer check refuses it.
#include <normgrad/ops/op_schema.hpp>
