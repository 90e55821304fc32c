#include "core/slot_invalidator.hpp"

#include <algorithm>
#include <string>

#include "core/data_movement.hpp"
#include "core/error.hpp"

namespace hisparse {

SlotInvalidator::~SlotInvalidator() {
  for (auto& entry : cache_) backend_.deallocate(entry.second, device_.index);
}

const int64_t* SlotInvalidator::pointers_for(const std::vector<const hs_tensor_t*>& tables) {
  std::vector<uintptr_t> key;
  key.reserve(tables.size());
  for (const hs_tensor_t* table : tables) key.push_back(reinterpret_cast<uintptr_t>(table->data));
  const auto found = cache_.find(key);
  if (found != cache_.end()) return static_cast<const int64_t*>(found->second);

  const std::vector<int64_t> values(key.begin(), key.end());
  const size_t bytes = values.size() * sizeof(int64_t);
  void* array = backend_.allocate(bytes, device_.index);
  try {
    hs_stream_t stream = backend_.create_stream(device_.index);
    try {
      backend_.copy_async(array, values.data(), bytes, stream);
      backend_.synchronize_stream(stream);
    } catch (...) {
      backend_.destroy_stream(stream, device_.index);
      throw;
    }
    backend_.destroy_stream(stream, device_.index);
    cache_.emplace(std::move(key), array);
  } catch (...) {
    backend_.deallocate(array, device_.index);
    throw;
  }
  return static_cast<const int64_t*>(array);
}

void SlotInvalidator::run(const std::vector<const hs_tensor_t*>& tables, const hs_tensor_t* request_state_indices,
                          const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots, hs_stream_t stream) {
  if (tables.size() > static_cast<size_t>(HS_MAX_INVALIDATION_TABLES)) {
    invalid_argument("num_runtimes: expected at most ", HS_MAX_INVALIDATION_TABLES, " index groups, got ",
                     tables.size());
  }
  const TensorArg written(written_slots, "written_slots");
  const TensorArg req_ids(req_id_per_token, "req_id_per_token");
  if (tables.empty() || std::min(written.numel(), req_ids.numel()) == 0) return;
  // Checked before a set is cached, so a refused set leaves nothing behind.
  std::vector<std::string> names;
  names.reserve(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    names.push_back(str("runtimes[", i, "]"));
    const TensorArg table(tables[i], names.back().c_str());
    table.on(device_, "the slot invalidator");
    if (table.raw().ndim != 2 || tables[0]->ndim != 2 || table.size(0) != tables[0]->shape[0] ||
        table.size(1) != tables[0]->shape[1]) {
      invalid_argument("runtimes: hisparse index groups must share one hot layout: the group of ", names.back(),
                       " has device_global_indices of shape ", table.shape_string(), ", the group of runtimes[0] ",
                       TensorArg(tables[0], "runtimes[0]").shape_string());
    }
  }
  InvalidateSlotsParams p;
  invalidation_inputs(TensorArg(request_state_indices, "request_state_indices"), req_ids, written, device_,
                      "the slot invalidator", &p);
  std::vector<int32_t*> data;
  data.reserve(tables.size());
  for (const hs_tensor_t* table : tables) data.push_back(static_cast<int32_t*>(table->data));
  p.tables = data.data();
  p.num_tables = static_cast<int32_t>(tables.size());
  p.num_state_rows = static_cast<int32_t>(tables[0]->shape[0]);
  p.hot_size = static_cast<int32_t>(tables[0]->shape[1]);
  p.table_pointers = pointers_for(tables);
  if (p.num_tokens == 0 || p.num_state_rows == 0 || p.hot_size == 0) return;
  backend_.invalidate_written_slots(p, stream);
}

}  // namespace hisparse
