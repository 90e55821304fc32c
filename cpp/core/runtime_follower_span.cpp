// A leader's followers staged with one gather_compact_group: whether their
// bound host caches tile one token-major span (each follower's rows of a
// slot adjacent to the next one's), and the launches that stage them
// (swap_in with group_gather; docs/staging.md says when that pays).
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "hisparse/data_movement.h"
#include "core/runtime.hpp"
#include "core/runtime_group.hpp"
#include "core/tensor.hpp"

namespace hisparse {

bool Runtime::followers_span(FollowerSpan* span, std::string* why) const {
  // Refusals build their text only when asked (swap_in with group_gather):
  // the info query and the success path allocate nothing.
  auto refuse = [why](auto&&... parts) {
    if (why != nullptr) *why = str(parts...);
    return false;
  };
  if (!is_leader()) return refuse("only a group leader stages its followers");
  const std::vector<Runtime*>& followers = group_->followers();
  const size_t count = followers.size();
  if (count < 2) {
    // One follower gains nothing over its own gather.
    return refuse("the group has ", count, " follower", count == 1 ? "" : "s", ", a group gather needs at least two");
  }
  for (size_t i = 0; i < count; ++i) {
    if (!followers[i]->source_bound_ || !followers[i]->hot_bound_) {
      return refuse("follower ", i, " is not bound (bind_source_cache and bind_hot_cache)");
    }
  }
  const Runtime& first = *followers[0];
  const hs_tensor_t& first_host = first.host_cache_.raw();
  const int64_t row_bytes = first.row_bytes();
  // Every follower must read rows like the first (dtype, width, slots and
  // pitch, host device) and write them like the first (one hot layout): the
  // group gather takes one host view and P hot caches of one shape.
  const char* base = static_cast<const char*>(first_host.data);
  for (size_t i = 1; i < count; ++i) {
    const Runtime& f = *followers[i];
    const hs_tensor_t& host = f.host_cache_.raw();
    if (f.options_.kv_dtype != first.options_.kv_dtype || f.row_width_ != first.row_width_) {
      return refuse("follower ", i, " has rows of (", f.row_width_, ", ", dtype_name(f.options_.kv_dtype),
                    "), follower 0 of (", first.row_width_, ", ", dtype_name(first.options_.kv_dtype), ")");
    }
    if (f.host_rows_ != first.host_rows_) {
      return refuse("follower ", i, "'s host cache has ", f.host_rows_, " rows, follower 0's ", first.host_rows_);
    }
    if (host.device_type != first_host.device_type || host.device_index != first_host.device_index) {
      return refuse("follower ", i, "'s host cache lies on another device than follower 0's");
    }
    // With one slot (or none) the pitch is never stepped over.
    if (first.host_rows_ > 1 && f.host_pitch_ != first.host_pitch_) {
      return refuse("follower ", i, "'s host slots are ", f.host_pitch_ * f.row_bytes() / f.row_width_,
                    " bytes apart, follower 0's ", first.host_pitch_ * row_bytes / first.row_width_);
    }
    if (f.hot_shape_ != first.hot_shape_ || f.hot_strides_ != first.hot_strides_ ||
        f.hot_view_.device_type != first.hot_view_.device_type ||
        f.hot_view_.device_index != first.hot_view_.device_index) {
      return refuse("follower ", i,
                    "'s hot view (blocks, block size, block stride or device) differs from follower 0's");
    }
  }
  for (const Runtime* f : followers) base = std::min(base, static_cast<const char*>(f->host_cache_.raw().data));
  // The followers' bases must be exactly pieces 0 .. P-1 of the span: each
  // offset a whole row below P rows, and no two followers on one piece.
  const int64_t pieces = static_cast<int64_t>(count);
  for (size_t i = 0; i < count; ++i) {
    const int64_t offset = static_cast<const char*>(followers[i]->host_cache_.raw().data) - base;
    if (offset % row_bytes != 0 || offset / row_bytes >= pieces) {
      return refuse("follower ", i, "'s host cache starts ", offset, " bytes past the lowest follower's, not a "
                    "multiple of row_bytes ", row_bytes, " below followers x row_bytes = ", pieces * row_bytes,
                    ": the followers' rows of a slot are not adjacent");
    }
    for (size_t j = 0; j < i; ++j) {
      if (followers[j]->host_cache_.raw().data == followers[i]->host_cache_.raw().data) {
        return refuse("followers ", j, " and ", i, " are bound to the same host rows");
      }
    }
  }
  const int64_t span_elements = pieces * first.row_width_;
  if (first.host_rows_ > 1 && first.host_pitch_ < span_elements) {
    return refuse("the host slots are ", first.host_pitch_ * row_bytes / first.row_width_,
                  " bytes apart, less than followers x row_bytes = ", pieces * row_bytes, ": slots would overlap");
  }
  if (span != nullptr) {
    span->base = base;
    span->pitch = first.host_rows_ > 1 ? first.host_pitch_ : span_elements;
    span->pieces = static_cast<int32_t>(pieces);
  }
  return true;
}

bool Runtime::followers_staged_together() const { return followers_span(nullptr, nullptr); }

void Runtime::stage_followers_together(const FollowerSpan& span, int64_t first_row, int64_t num_rows) {
  const SharedRows host_rows(group_->tensor(HS_INDEX_GROUP_SWAP_HOST_ROWS), first_row, num_rows);
  const SharedRows device_rows(group_->tensor(HS_INDEX_GROUP_SWAP_DEVICE_ROWS), first_row, num_rows);
  const SharedRows counts(group_->tensor(HS_INDEX_GROUP_SWAP_COUNTS), first_row, num_rows);
  const std::vector<Runtime*>& followers = group_->followers();
  const Runtime& first = *followers[0];
  const hs_tensor_t& first_host = first.host_cache_.raw();
  const int64_t row_bytes = first.row_bytes();
  // More pieces than one launch takes: near-equal runs of adjacent pieces,
  // each still one contiguous read per slot.
  const int32_t launches = (span.pieces + HS_MAX_GATHER_GROUP_PIECES - 1) / HS_MAX_GATHER_GROUP_PIECES;
  int32_t begin = 0;
  for (int32_t launch = 0; launch < launches; ++launch) {
    const int32_t end = static_cast<int32_t>(static_cast<int64_t>(span.pieces) * (launch + 1) / launches);
    const int32_t pieces = end - begin;
    std::array<const hs_tensor_t*, HS_MAX_GATHER_GROUP_PIECES> hot{};
    std::array<Runtime*, HS_MAX_GATHER_GROUP_PIECES> members{};
    for (Runtime* f : followers) {
      const int64_t piece = (static_cast<const char*>(f->host_cache_.raw().data) - span.base) / row_bytes;
      if (piece >= begin && piece < end) {
        hot[piece - begin] = &f->hot_view_;
        members[piece - begin] = f;
      }
    }
    std::array<int64_t, 3> shape{first.host_rows_, pieces, first.row_width_};
    std::array<int64_t, 3> strides{span.pitch, first.row_width_, 1};
    hs_tensor_t host{const_cast<char*>(span.base) + begin * row_bytes, first_host.dtype, first_host.device_type,
                     first_host.device_index, 3, shape.data(), strides.data()};
    hs_gather_compact_group_args_t g;
    hs_gather_compact_group_args_init(&g);
    g.num_hot_caches = pieces;
    g.host_rows = &host;
    g.hot_caches = hot.data();
    g.swap_host_rows = host_rows.get();
    g.swap_device_rows = device_rows.get();
    g.swap_counts = counts.get();
    g.hot_block_size = first.hot_block_size_;  // the group's (check_hot_layout_in_group)
    g.hot_block_stride = first.attention_block_stride_;
    check_status(hs_gather_compact_group(&g, group_->copy_stream()));
    for (int32_t i = 0; i < pieces; ++i) members[i]->mark_staged(first_row, num_rows);
    begin = end;
  }
}

}  // namespace hisparse
