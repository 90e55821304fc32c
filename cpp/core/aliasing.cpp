#include "core/aliasing.hpp"

#include "core/error.hpp"

namespace hisparse {

void check_apart(const ByteRange& a, bool a_written, const ByteRange& b, bool b_written) {
  if (!(a_written || b_written) || !a.overlaps(b)) return;
  const char* how = a_written ? (b_written ? "the call writes both" : "the call writes the first and reads the other")
                              : "the call reads the first and writes the other";
  invalid_argument(a.name, ": shares memory with ", b.name, " (", how, "); pass tensors that do not overlap");
}

AliasCheck& AliasCheck::add(const ByteRange& range, bool written) {
  if (range.empty()) return *this;
  if (count_ == kCapacity) fail(HS_ERROR_INTERNAL, "AliasCheck: more than ", kCapacity, " ranges");
  entries_[count_++] = Entry{range, written};
  return *this;
}

AliasCheck& AliasCheck::writes(const TensorArg& t) { return t.present() ? add(t.bytes(), true) : *this; }
AliasCheck& AliasCheck::writes(const ByteRange& range) { return add(range, true); }
AliasCheck& AliasCheck::writes(const char* name, const void* data, uint64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  return add(ByteRange{name, begin, begin + bytes}, true);
}
AliasCheck& AliasCheck::reads(const TensorArg& t) { return t.present() ? add(t.bytes(), false) : *this; }
AliasCheck& AliasCheck::reads(const ByteRange& range) { return add(range, false); }
AliasCheck& AliasCheck::reads(const char* name, const void* data, uint64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  return add(ByteRange{name, begin, begin + bytes}, false);
}

void AliasCheck::check() const {
  for (size_t i = 0; i < count_; ++i) {
    for (size_t j = i + 1; j < count_; ++j) {
      check_apart(entries_[i].range, entries_[i].written, entries_[j].range, entries_[j].written);
    }
  }
}

}  // namespace hisparse
