// The kernel source of the CUDA backend's smaller kernels (mirror_rows,
// read_rows, gather_plan, swap_blocks_batch, warm_host_pages, copy_bytes, reset_request,
// prepare_topk, the index group kernels, build_residency_hint and
// invalidate_written_slots), run by the CPU emulation of the CUDA execution
// model through their launchers, against the CPU reference on random
// inputs, every output byte. (write_rows and update_residency compute their
// entries with the helpers of cpp/core that the reference shares; staging's
// sorts are CUB's.) A check of the kernels' logic without a GPU; the GPU
// suite is what says the CUDA build is right.
// clang-format off
#include "emulated/cuda_emulation.hpp"  // first: before any CUDA header
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/data_movement_params.hpp"
#include "core/index_group_params.hpp"
#include "core/kv_params.hpp"
#include "cpu/data_movement_reference.hpp"
#include "cpu/index_group_reference.hpp"
#include "cpu/kv_reference.hpp"
#include "cuda/cuda_kernels.hpp"
#include "emulated/emulated_checks.hpp"

namespace {

using hisparse::emulated::expect_same;
using hisparse::emulated::uniform;

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(uniform(rng, 0, 255));
  return bytes;
}

// `count` values, each -1 (with chance 1/8), `past` or more (1/8), else
// distinct values below `past` while they last (then -1).
std::vector<int64_t> distinct_or_skipped(std::mt19937& rng, int64_t count, int64_t past) {
  std::vector<int64_t> free(static_cast<size_t>(past));
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  std::vector<int64_t> values(static_cast<size_t>(count));
  size_t next = 0;
  for (int64_t& v : values) {
    const int kind = uniform(rng, 0, 7);
    v = kind == 0 || next == free.size() ? -1 : (kind == 1 ? past + uniform(rng, 0, 3) : free[next++]);
  }
  return values;
}

constexpr int kScenarios = 16;

TEST(DataKernelsEmulated, MirrorRowsMatchesTheReference) {
  std::mt19937 rng(31);
  for (int n = 0; n < kScenarios; ++n) {
    const int64_t count = uniform(rng, 0, 300), row_bytes = 16 * uniform(rng, 1, 48);
    const int64_t src_pitch = row_bytes + 16 * uniform(rng, 0, 2), host_rows = uniform(rng, 1, 400);
    const int64_t host_pitch = row_bytes + 16 * uniform(rng, 0, 2);
    const std::vector<uint8_t> src = random_bytes(rng, static_cast<size_t>(std::max<int64_t>(count, 1) * src_pitch));
    const std::vector<int64_t> slots = distinct_or_skipped(rng, count, host_rows);
    const bool wide = n % 2 == 1;
    std::vector<int32_t> slots32(slots.begin(), slots.end());
    const std::vector<uint8_t> host = random_bytes(rng, static_cast<size_t>(host_rows * host_pitch));
    std::vector<uint8_t> reference = host, kernel = host;
    hisparse::MirrorRowsParams p;
    p.src = src.data();
    p.src_pitch = src_pitch;
    p.count = count;
    p.host_rows = host_rows;
    p.host_pitch = host_pitch;
    p.row_bytes = row_bytes;
    p.slot_mapping = wide ? static_cast<const void*>(slots.data()) : static_cast<const void*>(slots32.data());
    p.slot_mapping_int64 = wide;
    p.host = reference.data();
    hisparse::mirror_rows_reference(p);
    p.host = kernel.data();
    hisparse::cuda::launch_mirror_rows(p, nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n));
  }
}

TEST(DataKernelsEmulated, ReadRowsMatchesTheReference) {
  std::mt19937 rng(32);
  for (int n = 0; n < kScenarios; ++n) {
    const int32_t rows = uniform(rng, 1, 12), width = uniform(rng, 1, 40);
    const int64_t row_bytes = 16 * uniform(rng, 1, 48), span_rows = uniform(rng, 1, 300);
    const int64_t stride = width + uniform(rng, 0, 3);
    const std::vector<uint8_t> cache = random_bytes(rng, static_cast<size_t>(span_rows * row_bytes));
    std::vector<int32_t> indices(static_cast<size_t>(rows * stride));
    for (int32_t& i : indices) i = uniform(rng, -2, static_cast<int>(span_rows) + 2);
    std::vector<uint8_t> reference(static_cast<size_t>(rows * width * row_bytes), 0xEE), kernel = reference;
    hisparse::ReadRowsParams p;
    p.cache = cache.data();
    p.span_rows = span_rows;
    p.row_bytes = row_bytes;
    p.indices = indices.data();
    p.index_row_stride = stride;
    p.num_rows = rows;
    p.width = width;
    p.out = reference.data();
    hisparse::read_rows_reference(p);
    p.out = kernel.data();
    hisparse::cuda::launch_read_rows(p, nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n));
  }
}

TEST(DataKernelsEmulated, GatherPlanMatchesTheReference) {
  std::mt19937 rng(33);
  for (int n = 0; n < kScenarios; ++n) {
    const int64_t count = uniform(rng, 0, 300), row_bytes = 16 * uniform(rng, 1, 48);
    const int64_t src_rows = uniform(rng, 1, 300), src_pitch = row_bytes + 16 * uniform(rng, 0, 2);
    const int64_t staged_rows = uniform(rng, 1, 300);
    const std::vector<uint8_t> src = random_bytes(rng, static_cast<size_t>(src_rows * src_pitch));
    std::vector<int32_t> row_ids(static_cast<size_t>(count)), dst_rows(row_ids.size()), miss(row_ids.size());
    const std::vector<int64_t> dsts = distinct_or_skipped(rng, count, staged_rows);
    for (int64_t j = 0; j < count; ++j) {
      row_ids[j] = uniform(rng, -1, static_cast<int>(src_rows));
      dst_rows[j] = static_cast<int32_t>(dsts[j]);
      miss[j] = uniform(rng, 0, 3) != 0;
    }
    std::vector<uint8_t> reference = random_bytes(rng, static_cast<size_t>(staged_rows * row_bytes)),
                         kernel = reference;
    hisparse::GatherPlanParams p;
    p.src = src.data();
    p.src_rows = src_rows;
    p.src_pitch = src_pitch;
    p.staged_rows = staged_rows;
    p.row_bytes = row_bytes;
    p.row_ids = row_ids.data();
    p.dst_rows = dst_rows.data();
    p.miss_mask = miss.data();
    p.count = count;
    p.staged = reference.data();
    hisparse::gather_plan_reference(p);
    p.staged = kernel.data();
    hisparse::cuda::launch_gather_plan(p, nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n));
  }
}

TEST(DataKernelsEmulated, SwapBlocksBatchMatchesTheReference) {
  std::mt19937 rng(34);
  for (int n = 0; n < kScenarios; ++n) {
    // Sources anywhere in the first half of the buffer, destinations in
    // disjoint slices of the second half, so that the copies commute; some
    // entries skipped (size <= 0, a null source or destination).
    const int64_t count = uniform(rng, 0, 40), slice = 16 * uniform(rng, 1, 64);
    std::vector<int64_t> src_offset(static_cast<size_t>(count), -1), dst_offset(src_offset.size(), -1);
    std::vector<int64_t> sizes(src_offset.size());
    for (int64_t i = 0; i < count; ++i) {
      const int kind = uniform(rng, 0, 9);
      sizes[i] = kind == 0 ? -uniform(rng, 0, 4) : uniform(rng, 1, static_cast<int>(slice));
      if (kind != 1) src_offset[i] = uniform(rng, 0, static_cast<int>(count * slice - std::max<int64_t>(sizes[i], 0)));
      if (kind != 2) dst_offset[i] = (count + i) * slice;
    }
    std::vector<uint8_t> reference = random_bytes(rng, static_cast<size_t>(2 * count * slice + 16)), kernel = reference;
    // The entries' addresses (0: none) within `buffer`.
    auto run = [&](std::vector<uint8_t>& buffer, bool on_kernel) {
      std::vector<int64_t> src(src_offset.size()), dst(src.size());
      for (size_t i = 0; i < src.size(); ++i) {
        src[i] = src_offset[i] < 0 ? 0 : reinterpret_cast<int64_t>(buffer.data() + src_offset[i]);
        dst[i] = dst_offset[i] < 0 ? 0 : reinterpret_cast<int64_t>(buffer.data() + dst_offset[i]);
      }
      hisparse::SwapBlocksParams p;
      p.src = src.data();
      p.dst = dst.data();
      p.sizes = sizes.data();
      p.count = count;
      if (on_kernel) {
        hisparse::cuda::launch_swap_blocks_batch(p, nullptr);
      } else {
        hisparse::swap_blocks_batch_reference(p);
      }
    };
    run(reference, false);
    run(kernel, true);
    expect_same(reference, kernel, "scenario " + std::to_string(n));
  }
}

TEST(DataKernelsEmulated, WarmHostPagesMatchesTheReference) {
  std::mt19937 rng(41);
  for (int n = 0; n < kScenarios; ++n) {
    // Rows of 16-1024 bytes at a random 16-byte offset into the buffer;
    // tables of consecutive runs, skipped entries and blocks past the cache;
    // pages from 16 bytes to 4 KiB; lengths or none.
    const int64_t row_bytes = 16 * uniform(rng, 1, 64), rows = uniform(rng, 0, 300);
    const int64_t block_size = uniform(rng, 1, 20), offset = 16 * uniform(rng, 0, 255);
    const int64_t blocks = (rows + block_size - 1) / block_size;
    const std::vector<uint8_t> host = random_bytes(rng, static_cast<size_t>(offset + rows * row_bytes + 16));
    const int32_t requests = uniform(rng, 0, 6), width = uniform(rng, 0, 40);
    std::vector<int32_t> table(static_cast<size_t>(requests) * width);
    for (size_t i = 0; i < table.size(); ++i) {
      const int kind = uniform(rng, 0, 9);
      table[i] = kind == 0                   ? -1
                 : kind == 1                 ? static_cast<int32_t>(blocks + uniform(rng, 0, 2))
                 : kind < 6 && i % width > 0 ? table[i - 1] + 1
                                             : uniform(rng, 0, static_cast<int>(std::max<int64_t>(blocks - 1, 0)));
    }
    std::vector<int32_t> lengths(static_cast<size_t>(requests));
    for (int32_t& length : lengths) length = uniform(rng, -3, static_cast<int>((width + 1) * block_size));
    hisparse::WarmHostPagesParams p;
    p.host = host.data() + offset;
    p.extent = rows * row_bytes;
    p.host_blocks = blocks;
    p.block_bytes = block_size * row_bytes;
    p.block_table = table.data();
    p.block_table_row_stride = width;
    p.num_requests = requests;
    p.table_width = width;
    p.seq_lens = n % 2 == 0 ? lengths.data() : nullptr;
    p.block_size = block_size;
    p.page_bytes = int64_t{16} << uniform(rng, 0, 8);
    std::vector<int64_t> reference(2, -1), kernel(2, -1);
    p.out = reference.data();
    hisparse::warm_host_pages_reference(p);
    p.out = kernel.data();
    hisparse::cuda::launch_warm_host_pages(p, nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n));
    EXPECT_GE(reference[0], 0);
  }
}

TEST(DataKernelsEmulated, CopyBytesMatchesMemcpy) {
  std::mt19937 rng(35);
  for (int n = 0; n < kScenarios; ++n) {
    // Aligned sizes and pointers (the 16-byte path) or not (the byte path).
    const bool aligned = n % 2 == 0;
    const size_t bytes = aligned ? 16 * uniform(rng, 0, 3000) : uniform(rng, 1, 50000);
    const size_t offset = aligned ? 0 : uniform(rng, 1, 15);
    const std::vector<uint8_t> src = random_bytes(rng, bytes + 16);
    std::vector<uint8_t> reference = random_bytes(rng, bytes + 16), kernel = reference;
    std::memcpy(reference.data() + offset, src.data() + offset, bytes);
    hisparse::cuda::launch_copy_bytes(kernel.data() + offset, src.data() + offset, bytes, nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n) + ": " + std::to_string(bytes) + " bytes");
  }
}

TEST(DataKernelsEmulated, ResetRequestMatchesTheReferenceAndClearsTheHint) {
  std::mt19937 rng(36);
  for (int n = 0; n < kScenarios; ++n) {
    const int32_t states = uniform(rng, 1, 6), hot = uniform(rng, 1, 700), row = uniform(rng, 0, states - 1);
    const int64_t host_rows = uniform(rng, 1, 2000);
    std::vector<int32_t> dgi(static_cast<size_t>(states * hot));
    for (int32_t& g : dgi) g = uniform(rng, -2, static_cast<int>(host_rows) + 2);
    std::vector<int16_t> lru(dgi.size());
    for (int16_t& j : lru) j = static_cast<int16_t>(uniform(rng, 0, hot - 1));
    std::vector<uint32_t> hint((host_rows + 31) / 32);
    for (uint32_t& word : hint) word = static_cast<uint32_t>(rng());
    // The reference clears the bits of the rows the state row held, then resets it.
    std::vector<uint32_t> hint_reference = hint;
    for (int32_t j = 0; j < hot; ++j) {
      const int32_t g = dgi[static_cast<size_t>(row) * hot + j];
      if (g >= 0 && g < host_rows) hint_reference[g >> 5] &= ~(1u << (g & 31));
    }
    std::vector<int32_t> dgi_reference = dgi;
    std::vector<int16_t> lru_reference = lru;
    hisparse::ResetRequestParams p;
    p.num_state_rows = states;
    p.hot_size = hot;
    p.state_row = row;
    p.device_global_indices = dgi_reference.data();
    p.lru_slots = lru_reference.data();
    hisparse::reset_request_reference(p);
    p.device_global_indices = dgi.data();
    p.lru_slots = lru.data();
    p.residency_hint = hint.data();
    p.host_rows = host_rows;
    hisparse::cuda::launch_reset_request(p, nullptr);
    const std::string where = "scenario " + std::to_string(n);
    expect_same(dgi_reference, dgi, where + ": device_global_indices");
    expect_same(lru_reference, lru, where + ": lru_slots");
    expect_same(hint_reference, hint, where + ": residency hint");
  }
}

TEST(DataKernelsEmulated, PrepareTopkMatchesTheReference) {
  std::mt19937 rng(37);
  for (int n = 0; n < kScenarios; ++n) {
    const int32_t tokens = uniform(rng, 1, 20), top_k = uniform(rng, 1, 300), width = uniform(rng, 0, top_k);
    const int32_t batch = uniform(rng, 1, 6);
    const int64_t in_stride = width + uniform(rng, 0, 3), out_stride = top_k + uniform(rng, 0, 3);
    std::vector<int32_t> topk(static_cast<size_t>(tokens * in_stride) + 1), req(tokens), lens(batch);
    for (int32_t& x : topk) x = uniform(rng, -3, 500);
    for (int32_t& b : req) b = uniform(rng, -1, batch);
    for (int32_t& l : lens) l = uniform(rng, -1, 500);
    const bool limited = n % 2 == 0;
    std::vector<int32_t> reference(static_cast<size_t>(tokens * out_stride), -7), kernel = reference;
    hisparse::PrepareTopkParams p;
    p.topk = topk.data();
    p.topk_row_stride = in_stride;
    p.width = width;
    p.out_row_stride = out_stride;
    p.top_k = top_k;
    p.num_tokens = tokens;
    p.req_id_per_token = req.data();
    p.seq_lens = limited ? lens.data() : nullptr;
    p.num_batch_rows = batch;
    p.out = reference.data();
    hisparse::prepare_topk_reference(p);
    p.out = kernel.data();
    hisparse::cuda::launch_prepare_topk(p, nullptr);
    expect_same(reference, kernel, "scenario " + std::to_string(n));
  }
}

TEST(DataKernelsEmulated, IndexGroupKernelsMatchTheReference) {
  std::mt19937 rng(38);
  for (int n = 0; n < kScenarios; ++n) {
    const int32_t states = uniform(rng, 0, 6), hot = uniform(rng, 1, 600);
    const int64_t host_rows = uniform(rng, 1, 3000);
    std::vector<int32_t> dgi(static_cast<size_t>(states * hot));
    for (int32_t& g : dgi) g = uniform(rng, -2, static_cast<int>(host_rows) + 2);
    const std::string where = "scenario " + std::to_string(n);

    // build_residency_hint
    std::vector<uint32_t> hint_reference((host_rows + 31) / 32, 0xDEADBEEFu), hint = hint_reference;
    hisparse::ResidencyHintParams h;
    h.device_global_indices = dgi.data();
    h.entries = static_cast<int64_t>(dgi.size());
    h.host_rows = host_rows;
    h.hint = hint_reference.data();
    hisparse::build_residency_hint_reference(h);
    h.hint = hint.data();
    hisparse::cuda::launch_build_residency_hint(h, nullptr);
    expect_same(hint_reference, hint, where + ": residency hint");

    // invalidate_sorted_slots: an ascending list (binary search) or not (scan)
    std::vector<int32_t> slots(static_cast<size_t>(uniform(rng, 1, 200)));
    for (int32_t& s : slots) s = uniform(rng, -1, static_cast<int>(host_rows));
    if (n % 2 == 0) std::sort(slots.begin(), slots.end());
    std::vector<int32_t> listed(static_cast<size_t>(uniform(rng, 1, 8)));
    for (int32_t& s : listed) s = uniform(rng, -1, states);
    std::vector<int32_t> dgi_reference = dgi, dgi_kernel = dgi;
    hisparse::InvalidateSortedSlotsParams v;
    v.num_state_rows = states;
    v.hot_size = hot;
    v.sorted_slots = slots.data();
    v.num_slots = static_cast<int64_t>(slots.size());
    v.state_indices = listed.data();
    v.num_state_indices = static_cast<int64_t>(listed.size());
    v.device_global_indices = dgi_reference.data();
    hisparse::invalidate_sorted_slots_reference(v);
    v.device_global_indices = dgi_kernel.data();
    hisparse::cuda::launch_invalidate_sorted_slots(v, nullptr);
    expect_same(dgi_reference, dgi_kernel, where + ": invalidate_sorted_slots");

    // reset_hot_state, with counters
    std::vector<int16_t> lru_init(static_cast<size_t>(hot)), lru(dgi.size());
    for (int16_t& j : lru_init) j = static_cast<int16_t>(uniform(rng, 0, hot - 1));
    std::vector<int64_t> counters(static_cast<size_t>(uniform(rng, 0, 9)), 77);
    std::vector<int16_t> lru_reference = lru;
    std::vector<int64_t> counters_reference = counters;
    dgi_reference = dgi;
    dgi_kernel = dgi;
    hisparse::ResetHotStateParams r;
    r.lru_init = lru_init.data();
    r.num_state_rows = states;
    r.hot_size = hot;
    r.num_counters = static_cast<int32_t>(counters.size());
    r.device_global_indices = dgi_reference.data();
    r.lru_slots = lru_reference.data();
    r.counters = counters_reference.data();
    hisparse::reset_hot_state_reference(r);
    r.device_global_indices = dgi_kernel.data();
    r.lru_slots = lru.data();
    r.counters = counters.data();
    hisparse::cuda::launch_reset_hot_state(r, nullptr);
    expect_same(dgi_reference, dgi_kernel, where + ": reset_hot_state dgi");
    expect_same(lru_reference, lru, where + ": reset_hot_state lru");
    expect_same(counters_reference, counters, where + ": reset_hot_state counters");
  }
}

// Tables passed inline (in launches of up to 64) and through a device array
// of their addresses.
TEST(DataKernelsEmulated, InvalidateWrittenSlotsMatchesTheReference) {
  std::mt19937 rng(39);
  for (int n = 0; n < kScenarios; ++n) {
    const int32_t states = uniform(rng, 1, 5), hot = uniform(rng, 1, 300), batch = uniform(rng, 1, 5);
    const int32_t tokens = uniform(rng, 1, 12), tables = n % 4 == 0 ? uniform(rng, 65, 140) : uniform(rng, 1, 6);
    const bool through_pointers = n % 3 == 0;
    std::vector<int32_t> state_of(batch), req(tokens), written(tokens);
    for (int32_t& s : state_of) s = uniform(rng, -1, states);
    for (int32_t& b : req) b = uniform(rng, -1, batch);
    for (int32_t& w : written) w = uniform(rng, -1, 40);
    std::vector<std::vector<int32_t>> reference(tables), kernel;
    for (auto& table : reference) {
      table.resize(static_cast<size_t>(states * hot));
      for (int32_t& g : table) g = uniform(rng, -1, 40);
    }
    kernel = reference;
    std::vector<int32_t*> reference_tables, kernel_tables;
    std::vector<int64_t> kernel_addresses;
    for (int32_t i = 0; i < tables; ++i) {
      reference_tables.push_back(reference[i].data());
      kernel_tables.push_back(kernel[i].data());
      kernel_addresses.push_back(reinterpret_cast<int64_t>(kernel[i].data()));
    }
    hisparse::InvalidateSlotsParams p;
    p.num_tables = tables;
    p.num_state_rows = states;
    p.hot_size = hot;
    p.request_state_indices = state_of.data();
    p.num_batch_rows = batch;
    p.req_id_per_token = req.data();
    p.written_slots = written.data();
    p.num_tokens = tokens;
    p.tables = reference_tables.data();
    hisparse::invalidate_written_slots_reference(p);
    p.tables = kernel_tables.data();
    p.table_pointers = through_pointers ? kernel_addresses.data() : nullptr;
    hisparse::cuda::launch_invalidate_written_slots(p, nullptr);
    for (int32_t i = 0; i < tables; ++i) {
      expect_same(reference[i], kernel[i], "scenario " + std::to_string(n) + ": table " + std::to_string(i));
    }
  }
}

}  // namespace
