#include "core/slot_invalidator.hpp"

#include <algorithm>
#include <string>

#include "core/data_movement.hpp"
#include "core/error.hpp"

namespace hisparse {

SlotInvalidator::~SlotInvalidator() {
  for (auto& entry : cache_) backend_.deallocate(entry.second, device_.index);
}

const int64_t* SlotInvalidator::pointers_for(const std::vector<int32_t*>& tables) {
  std::vector<uintptr_t> key;
  key.reserve(tables.size());
  for (const int32_t* table : tables) key.push_back(reinterpret_cast<uintptr_t>(table));
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

void SlotInvalidator::run(const std::vector<const IndexGroup*>& groups, const hs_tensor_t* request_state_indices,
                          const hs_tensor_t* req_id_per_token, const hs_tensor_t* written_slots, hs_stream_t stream) {
  if (groups.size() > static_cast<size_t>(HS_MAX_INVALIDATION_TABLES)) {
    invalid_argument("num_runtimes: expected at most ", HS_MAX_INVALIDATION_TABLES, " index groups, got ",
                     groups.size());
  }
  const TensorArg written(written_slots, "written_slots");
  const TensorArg req_ids(req_id_per_token, "req_id_per_token");
  if (groups.empty() || std::min(written.numel(), req_ids.numel()) == 0) return;
  // The groups' own sizes, compared before a set is cached, so a refused set
  // leaves nothing behind.
  const IndexGroupOptions& first = groups[0]->options();
  for (size_t i = 0; i < groups.size(); ++i) {
    const IndexGroupOptions& o = groups[i]->options();
    if (o.device != device_) {
      invalid_argument("runtimes[", i, "]: expected a runtime on ", device_.describe(),
                       " (the device of the slot invalidator), got one on ", o.device.describe());
    }
    if (o.max_num_reqs != first.max_num_reqs || o.device_buffer_size != first.device_buffer_size) {
      invalid_argument("runtimes: hisparse index groups must share one hot layout: the group of runtimes[", i,
                       "] has device_global_indices of shape [", o.max_num_reqs, ", ", o.device_buffer_size,
                       "], the group of runtimes[0] [", first.max_num_reqs, ", ", first.device_buffer_size, "]");
    }
  }
  InvalidateSlotsParams p;
  invalidation_inputs(TensorArg(request_state_indices, "request_state_indices"), req_ids, written, device_,
                      "the slot invalidator", &p);
  std::vector<int32_t*> tables;
  tables.reserve(groups.size());
  for (const IndexGroup* group : groups) tables.push_back(group->data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES));
  p.tables = tables.data();
  p.num_tables = static_cast<int32_t>(tables.size());
  p.num_state_rows = first.max_num_reqs;
  p.hot_size = first.device_buffer_size;
  p.table_pointers = pointers_for(tables);
  if (p.num_tokens == 0) return;
  backend_.invalidate_written_slots(p, stream);
}

}  // namespace hisparse
