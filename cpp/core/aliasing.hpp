// Refusal of aliased arguments: a kernel that writes bytes it also reads
// through another argument (an output over an input, over the state it
// updates, or over another output) gives an answer that depends on the
// order of its threads. Every entry point lists what it writes and what it
// reads, its caller's tensors and the library's own memory alike, and one
// check compares the byte ranges before anything runs.
#pragma once

#include <array>
#include <cstddef>

#include "core/tensor.hpp"

namespace hisparse {

// Throws HS_ERROR_INVALID_ARGUMENT naming both when `a` and `b` share a
// byte and the call writes at least one of them.
void check_apart(const ByteRange& a, bool a_written, const ByteRange& b, bool b_written);

class AliasCheck {
 public:
  // Memory the call writes (outputs, updated state) and memory it only
  // reads; absent tensors and empty ranges are ignored.
  AliasCheck& writes(const TensorArg& t);
  AliasCheck& writes(const ByteRange& range);
  AliasCheck& writes(const char* name, const void* data, uint64_t bytes);
  AliasCheck& reads(const TensorArg& t);
  AliasCheck& reads(const ByteRange& range);
  AliasCheck& reads(const char* name, const void* data, uint64_t bytes);

  // Throws HS_ERROR_INVALID_ARGUMENT naming both arguments of the first
  // pair (in the order given: list the caller's arguments before the
  // library's own memory, so that the message leads with them) that share a
  // byte while the call writes at least one of them.
  void check() const;

 private:
  static constexpr size_t kCapacity = 48;
  struct Entry {
    ByteRange range;
    bool written = false;
  };
  AliasCheck& add(const ByteRange& range, bool written);

  std::array<Entry, kCapacity> entries_{};
  size_t count_ = 0;
};

}  // namespace hisparse
