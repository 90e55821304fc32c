#include "core/runtime_group.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/runtime.hpp"

namespace hisparse {

RuntimeGroup::Streams::Streams(Backend& backend_in, int device_in, hs_stream_t borrowed_copy_stream)
    : backend(backend_in), device(device_in) {
  try {
    if (borrowed_copy_stream != nullptr) {
      copy = borrowed_copy_stream;
    } else {
      copy = backend.create_stream(device);
      owns_copy = true;
    }
    fork = backend.create_event(device);
    join = backend.create_event(device);
  } catch (...) {
    // The destructor does not run for a constructor that throws.
    backend.destroy_event(fork, device);
    if (owns_copy) backend.destroy_stream(copy, device);
    throw;
  }
}

RuntimeGroup::Streams::~Streams() {
  backend.destroy_event(join, device);
  backend.destroy_event(fork, device);
  if (owns_copy) backend.destroy_stream(copy, device);
}

RuntimeGroup::RuntimeGroup(const GroupOptions& options, Backend& backend)
    : backend_(backend),
      index_group_(options.index_group, backend),
      streams_(backend, options.index_group.device.index, options.copy_stream),
      padded_topk_(
          backend, index_group_.options().device.index,
          static_cast<size_t>(index_group_.options().max_swap_rows) * index_group_.options().top_k * sizeof(int32_t)),
      topk_ready_(options.topk_ready),
      keeps_hint_(options.residency_hint) {}

RuntimeGroup::~RuntimeGroup() = default;

void RuntimeGroup::rebuild_residency_hint(int64_t host_rows) {
  if (!device().is_cuda() || host_rows <= 0) return;
  const int device_index = device().index;
  if (hint_ == nullptr || hint_rows_ != host_rows) {
    hint_.reset();  // the old buffer goes first: no two hints live at once
    hint_ = std::make_unique<DeviceBuffer>(backend_, device_index,
                                           static_cast<size_t>((host_rows + 31) / 32) * sizeof(uint32_t));
    hint_rows_ = host_rows;
  }
  const IndexGroupOptions& o = index_group_.options();
  ResidencyHintParams p;
  p.device_global_indices = index_group_.data<int32_t>(HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES);
  p.entries = static_cast<int64_t>(o.max_num_reqs) * o.device_buffer_size;
  p.hint = hint_->data<uint32_t>();
  p.host_rows = host_rows;
  p.device = device_index;
  backend_.build_residency_hint(p, streams_.copy);
}

void RuntimeGroup::copy_waits_for(hs_stream_t stream) {
  backend_.record_event(streams_.fork, stream);
  backend_.stream_wait_event(streams_.copy, streams_.fork);
}

void RuntimeGroup::stream_waits_for_copy(hs_stream_t stream) {
  backend_.record_event(streams_.join, streams_.copy);
  backend_.stream_wait_event(stream, streams_.join);
}

void RuntimeGroup::copy_waits_for_topk(hs_stream_t compute, bool ignore_topk_ready) {
  if (topk_ready_ != nullptr && !ignore_topk_ready) {
    backend_.stream_wait_event(streams_.copy, topk_ready_);
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
