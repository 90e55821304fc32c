// hisparse._C: a slim layer over the C ABI. Importing it never initialises
// CUDA; device work runs on the stream the caller passes (an integer handle).
#include "bindings.hpp"

NB_MODULE(_C, m) {
  m.doc() = "hisparse native core (C ABI bindings). Use the hisparse package, not this module.";
  hisparse_py::register_core(m);
  hisparse_py::register_host_pool(m);
  hisparse_py::register_ops(m);
  hisparse_py::register_index_group(m);
  hisparse_py::register_data_movement(m);
  hisparse_py::register_runtime(m);
  hisparse_py::register_staging(m);
  hisparse_py::register_shared_host_pool(m);
  hisparse_py::register_ipc_event(m);
  hisparse_py::register_kv_cache(m);
}
