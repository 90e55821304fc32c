#include "core/runtime_group.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/runtime.hpp"

namespace hisparse {

void check_status(hs_status_t status) {
  if (status != HS_SUCCESS) throw Error(status, hs_last_error());
}

SharedRows::SharedRows(const hs_tensor_t& whole, int64_t first, int64_t count) : tensor_(whole) {
  const int64_t columns = whole.ndim == 2 ? whole.shape[1] : 1;
  shape_ = {count, columns};
  tensor_.data = static_cast<char*>(whole.data) + first * columns * static_cast<int64_t>(dtype_size(whole.dtype));
  tensor_.shape = shape_.data();
  tensor_.strides = nullptr;
}

RuntimeGroup::RuntimeGroup(const GroupOptions& options, Backend& backend) : options_(options), backend_(backend) {
  hs_index_group_options_t o;
  hs_index_group_options_init(&o);
  o.device_type = options_.device.is_cuda() ? HS_DEVICE_CUDA : HS_DEVICE_CPU;
  o.device_index = options_.device.is_cuda() ? options_.device.index : 0;
  o.max_num_reqs = options_.max_num_reqs;
  o.device_buffer_size = options_.device_buffer_size;
  o.max_swap_rows = options_.max_swap_rows;
  o.top_k = options_.top_k;
  o.max_union_rows = options_.max_union_rows;
  check_status(hs_index_group_create(&o, &index_group_));
  // From here on a failure must free what exists: the destructor does not
  // run for a constructor that throws.
  try {
    for (int which = 0; which < HS_INDEX_GROUP_NUM_TENSORS; ++which) {
      check_status(hs_index_group_get_tensor(index_group_, static_cast<hs_index_group_tensor_t>(which),
                                             &tensors_[which]));
    }
    const int device = options_.device.index;
    if (options_.copy_stream != nullptr) {
      copy_stream_ = options_.copy_stream;
    } else {
      copy_stream_ = backend_.create_stream(device);
      owns_copy_stream_ = true;
    }
    fork_event_ = backend_.create_event(device);
    join_event_ = backend_.create_event(device);
  } catch (...) {
    const int device = options_.device.index;
    backend_.destroy_event(join_event_, device);
    backend_.destroy_event(fork_event_, device);
    if (owns_copy_stream_) backend_.destroy_stream(copy_stream_, device);
    hs_index_group_destroy(index_group_);
    throw;
  }
}

RuntimeGroup::~RuntimeGroup() {
  const int device = options_.device.index;
  backend_.destroy_event(join_event_, device);
  backend_.destroy_event(fork_event_, device);
  if (owns_copy_stream_) backend_.destroy_stream(copy_stream_, device);
  hs_index_group_destroy(index_group_);
}

void RuntimeGroup::copy_waits_for(hs_stream_t stream) {
  backend_.record_event(fork_event_, stream);
  backend_.stream_wait_event(copy_stream_, fork_event_);
}

void RuntimeGroup::stream_waits_for_copy(hs_stream_t stream) {
  backend_.record_event(join_event_, copy_stream_);
  backend_.stream_wait_event(stream, join_event_);
}

void RuntimeGroup::copy_waits_for_topk(hs_stream_t compute, bool ignore_topk_ready) {
  if (options_.topk_ready != nullptr && !ignore_topk_ready) {
    backend_.stream_wait_event(copy_stream_, options_.topk_ready);
  } else {
    copy_waits_for(compute);
  }
}

void RuntimeGroup::remove(Runtime* member) {
  if (leader_ == member) leader_ = nullptr;
  followers_.erase(std::remove(followers_.begin(), followers_.end(), member), followers_.end());
}

uint64_t RuntimeGroup::row_bytes() const {
  uint64_t total = leader_ != nullptr ? static_cast<uint64_t>(leader_->row_bytes()) : 0;
  for (const Runtime* follower : followers_) total += static_cast<uint64_t>(follower->row_bytes());
  return total;
}

}  // namespace hisparse
