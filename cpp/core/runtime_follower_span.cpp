// A leader's followers staged with one group gather: whether their
// bound host caches tile one token-major span (each follower's rows of a
// slot adjacent to the next one's), and the launches that stage them
// (swap_in with group_gather; docs/staging.md says when that pays).
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/data_movement_params.hpp"
#include "core/error.hpp"
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
  const hs_tensor_t& first_host = first.source_.cache.raw();
  const int64_t row_bytes = first.row_bytes();
  // Every follower must read rows like the first (dtype, width, slots and
  // pitch, host device) and write them like the first (one hot layout): the
  // group gather takes one host view and P hot caches of one shape.
  const char* base = static_cast<const char*>(first_host.data);
  for (size_t i = 1; i < count; ++i) {
    const Runtime& f = *followers[i];
    const hs_tensor_t& host = f.source_.cache.raw();
    if (f.options_.kv_dtype != first.options_.kv_dtype || f.row_width_ != first.row_width_) {
      return refuse("follower ", i, " has rows of (", f.row_width_, ", ", dtype_name(f.options_.kv_dtype),
                    "), follower 0 of (", first.row_width_, ", ", dtype_name(first.options_.kv_dtype), ")");
    }
    if (f.source_.rows != first.source_.rows) {
      return refuse("follower ", i, "'s host cache has ", f.source_.rows, " rows, follower 0's ", first.source_.rows);
    }
    if (host.device_type != first_host.device_type || host.device_index != first_host.device_index) {
      return refuse("follower ", i, "'s host cache lies on another device than follower 0's");
    }
    // With one slot (or none) the pitch is never stepped over.
    if (first.source_.rows > 1 && f.source_.pitch != first.source_.pitch) {
      return refuse("follower ", i, "'s host slots are ", f.source_.pitch * f.row_bytes() / f.row_width_,
                    " bytes apart, follower 0's ", first.source_.pitch * row_bytes / first.row_width_);
    }
    const hs_tensor_t& view = f.hot_.view.raw();
    const hs_tensor_t& first_view = first.hot_.view.raw();
    if (!std::equal(view.shape, view.shape + 3, first_view.shape) ||
        !std::equal(view.strides, view.strides + 3, first_view.strides) || view.device_type != first_view.device_type ||
        view.device_index != first_view.device_index) {
      return refuse("follower ", i,
                    "'s hot view (blocks, block size, block stride or device) differs from follower 0's");
    }
  }
  for (const Runtime* f : followers) base = std::min(base, static_cast<const char*>(f->source_.cache.raw().data));
  // The followers' bases must be exactly pieces 0 .. P-1 of the span: each
  // offset a whole row below P rows, and no two followers on one piece.
  const int64_t pieces = static_cast<int64_t>(count);
  for (size_t i = 0; i < count; ++i) {
    const int64_t offset = static_cast<const char*>(followers[i]->source_.cache.raw().data) - base;
    if (offset % row_bytes != 0 || offset / row_bytes >= pieces) {
      return refuse("follower ", i, "'s host cache starts ", offset,
                    " bytes past the lowest follower's, not a "
                    "multiple of row_bytes ",
                    row_bytes, " below followers x row_bytes = ", pieces * row_bytes,
                    ": the followers' rows of a slot are not adjacent");
    }
    for (size_t j = 0; j < i; ++j) {
      if (followers[j]->source_.cache.raw().data == followers[i]->source_.cache.raw().data) {
        return refuse("followers ", j, " and ", i, " are bound to the same host rows");
      }
    }
  }
  const int64_t span_elements = pieces * first.row_width_;
  if (first.source_.rows > 1 && first.source_.pitch < span_elements) {
    return refuse("the host slots are ", first.source_.pitch * row_bytes / first.row_width_,
                  " bytes apart, less than followers x row_bytes = ", pieces * row_bytes, ": slots would overlap");
  }
  if (span != nullptr) {
    span->base = base;
    span->pitch = first.source_.rows > 1 ? first.source_.pitch : span_elements;
    span->pieces = static_cast<int32_t>(pieces);
  }
  return true;
}

bool Runtime::followers_staged_together() const { return followers_span(nullptr, nullptr); }

void Runtime::stage_followers_together(const FollowerSpan& span, int64_t first_row, int64_t num_rows) {
  const std::vector<Runtime*>& followers = group_->followers();
  const Runtime& first = *followers[0];
  const int64_t row_bytes = first.row_bytes();
  const int64_t itemsize = row_bytes / first.row_width_;
  // Every follower's caches passed the gather's checks at bind, and their
  // host rows tile the span, so the span is host memory the kernel can read;
  // the hot layout is the first follower's (followers_span checked it).
  GatherCompactParams g = first.gather_params(first_row, num_rows);
  g.host_pitch = span.pitch * itemsize;
  g.variant = HS_GATHER_ROW_PERSISTENT;
  // More pieces than one launch takes: near-equal runs of adjacent pieces,
  // each still one contiguous read per slot.
  const int32_t launches = (span.pieces + kMaxGatherPieces - 1) / kMaxGatherPieces;
  int32_t begin = 0;
  for (int32_t launch = 0; launch < launches; ++launch) {
    const int32_t end = static_cast<int32_t>(static_cast<int64_t>(span.pieces) * (launch + 1) / launches);
    std::array<Runtime*, kMaxGatherPieces> members{};
    for (Runtime* f : followers) {
      const int64_t piece = (static_cast<const char*>(f->source_.cache.raw().data) - span.base) / row_bytes;
      if (piece >= begin && piece < end) {
        members[piece - begin] = f;
        g.piece_hot[piece - begin] = f->gather_.hot;
      }
    }
    g.pieces = end - begin;
    g.host = reinterpret_cast<const uint8_t*>(span.base) + begin * row_bytes;
    g.hot = g.piece_hot[0];
    if (num_rows > 0) backend_->gather_compact(g, group_->copy_stream());
    for (int32_t i = 0; i < g.pieces; ++i) members[i]->mark_staged(first_row, num_rows);
    begin = end;
  }
}

}  // namespace hisparse
