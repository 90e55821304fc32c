// A test double of the backend that records host-memory registration (and
// can be told to fail the n-th register or unregister call), with the
// mapping and residency probes the host-pool tests check it with. Shared by
// the private and the shared host pool tests.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/error.hpp"

namespace hisparse_test {

using hisparse::Backend;

inline uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

// True when [pointer, pointer + bytes) is mapped in this process; mincore
// fails with ENOMEM on any unmapped page of the range.
inline bool is_mapped(const void* pointer, uint64_t bytes) {
  std::vector<unsigned char> residency((bytes + page_size() - 1) / page_size());
  return mincore(const_cast<void*>(pointer), bytes, residency.data()) == 0;
}

// True when every page of the range is resident (populated).
inline bool is_resident(const void* pointer, uint64_t bytes) {
  std::vector<unsigned char> residency((bytes + page_size() - 1) / page_size());
  if (mincore(const_cast<void*>(pointer), bytes, residency.data()) != 0) return false;
  for (unsigned char page : residency) {
    if ((page & 1) == 0) return false;
  }
  return true;
}

// A backend that records host-memory registration and can be told to fail
// the n-th register or unregister call. Everything else is unreachable from
// the host pool and fails loudly if called.
class RecordingBackend final : public Backend {
 public:
  struct Call {
    enum Kind { kRegister, kUnregister } kind;
    void* pointer;
    uint64_t bytes;  // 0 for unregister
    int device;
    bool populated;  // register: every page resident when registered
    bool mapped;     // unregister: the memory was still mapped
  };

  std::vector<Call> calls;
  int fail_register_call = -1;    // 0-based index among register calls
  int fail_unregister_call = -1;  // 0-based index among unregister calls

  const char* name() const override { return "recording"; }
  bool available() const override { return true; }
  std::string unavailable_reason() const override { return ""; }
  int device_count() const override { return 8; }
  int current_device() const override { return 0; }
  hisparse::DeviceProperties device_properties(int) const override { return {}; }
  void* allocate(size_t, int) override { unexpected("allocate"); }
  void deallocate(void*, int) noexcept override {}
  void copy_async(void*, const void*, size_t, hs_stream_t) override { unexpected("copy_async"); }
  void fill_async(void*, int, size_t, hs_stream_t) override { unexpected("fill_async"); }
  void check_accessible(const void*, size_t, int, const char*) const override {}
  bool can_register_host_memory() const override { return true; }

  void register_host_memory(void* pointer, size_t bytes, int device) override {
    if (registers_++ == fail_register_call) hisparse::fail(HS_ERROR_CUDA, "injected register failure");
    calls.push_back({Call::kRegister, pointer, bytes, device, is_resident(pointer, bytes), true});
  }
  void unregister_host_memory(void* pointer, int device) override {
    if (unregisters_++ == fail_unregister_call) hisparse::fail(HS_ERROR_CUDA, "injected unregister failure");
    calls.push_back({Call::kUnregister, pointer, 0, device, false, is_mapped(pointer, page_size())});
  }

  hs_stream_t create_stream(int) override { unexpected("create_stream"); }
  void destroy_stream(hs_stream_t, int) noexcept override {}
  hisparse::Event create_event(int) override { unexpected("create_event"); }
  void destroy_event(hisparse::Event, int) noexcept override {}
  void record_event(hisparse::Event, hs_stream_t) override { unexpected("record_event"); }
  void stream_wait_event(hs_stream_t, hisparse::Event) override { unexpected("stream_wait_event"); }
  void synchronize_stream(hs_stream_t) override { unexpected("synchronize_stream"); }
  void copy_bytes(void*, const void*, size_t, int, hs_stream_t) override { unexpected("copy_bytes"); }
  void resolve_residency(const hisparse::ResolveResidencyParams&, hs_stream_t) override {
    unexpected("resolve_residency");
  }

  std::vector<Call> of_kind(Call::Kind kind) const {
    std::vector<Call> out;
    for (const Call& call : calls) {
      if (call.kind == kind) out.push_back(call);
    }
    return out;
  }

 private:
  [[noreturn]] static void unexpected(const char* what) {
    hisparse::fail(HS_ERROR_INTERNAL, "the host pool must not call Backend::", what);
  }
  int registers_ = 0;
  int unregisters_ = 0;
};

}  // namespace hisparse_test
