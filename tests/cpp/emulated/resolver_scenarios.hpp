// Random scenarios for checking the CUDA resolver against the CPU
// reference (test_resolve_residency_emulated.cpp): every input a launch
// reads, with the faults the contract covers (docs/residency.md): duplicate,
// invalid and out-of-range positions, padding, duplicate and out-of-range
// state rows, orphan rows, corrupt LRU rows, empty and shared slots,
// missing and huge hot blocks, source and resident tables, union overflow,
// the fused gather's schedules. Outputs start as garbage, so that a value
// the kernel should write and does not shows as a mismatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/resolve_residency_params.hpp"
#include "hisparse/hisparse.h"

namespace hisparse {
namespace emulated {

// The inputs of a launch and of the steps after it.
struct Scenario {
  int32_t B, T, K, H, S;  // batch rows, token rows, top-k, hot slots, state rows
  int32_t hbs;            // hot_block_size
  int32_t max_union;
  int32_t block_size = 0, source_width = 0, resident_width = 0;
  int64_t stride;  // attention_block_stride
  int64_t host_rows;
  bool source = false, resident = false;  // source and resident tables
  bool shared_stride = true;              // the four per-entry outputs share a row stride
  bool stats = true;
  bool valid_rows = false;  // a num_valid_rows word (num_valid)
  int32_t num_valid = 0;
  int fused = 0;  // fused gather: 0 none, 1 the fused schedule, 2 auto, 3 auto with a handoff array
  bool hint = false;  // a residency hint (kept by every CUDA launch given one)
  int32_t row_bytes = 64;
  std::vector<int32_t> topk, req, state_idx, dgi, hot_table, source_table, resident_table;
  std::vector<int16_t> lru;
  std::vector<uint8_t> host_cache;
};

// What one side (reference or kernel) writes: outputs, state, counters,
// hot cache, handoff records.
struct Outputs {
  std::vector<int32_t> attention, hot_rows, resolved, miss, swap_host, swap_device, valid_counts, swap_counts;
  std::vector<int32_t> dgi;
  std::vector<int16_t> lru;
  std::vector<int64_t> stats;
  std::vector<uint8_t> hot_cache;
  std::vector<int32_t> handoff;
  std::vector<uint32_t> hint;  // ceil(host_rows / 32) words
  int32_t valid_rows_word = 0;
};

inline int32_t pick(std::mt19937& rng, std::initializer_list<int32_t> values) {
  std::vector<int32_t> v(values);
  return v[rng() % v.size()];
}

// A random shape and state for `batch` batch rows; `single_rows`: one token
// row per request (else one to three).
inline Scenario make_scenario(std::mt19937& rng, bool single_rows, int32_t batch) {
  Scenario s;
  s.B = batch;
  s.K = pick(rng, {1, 3, 64, 500, 1024, 2048});
  s.H = std::max<int32_t>(s.K, pick(rng, {16, 37, 100, 1000, 1001, 2048, 4096}));  // odd sizes: partial quads
  if (!single_rows && rng() % 3 == 0) s.H = std::max<int32_t>(s.H, pick(rng, {4096, 5000}));
  s.hbs = pick(rng, {1, 16, 64});
  s.stride = s.hbs * pick(rng, {1, 1, 2});
  if (rng() % 8 == 0) s.stride = int64_t{1} << 27;  // attention indices past int32 for large blocks
  s.host_rows = pick(rng, {60000, 200000});
  s.S = s.B + 2;
  const int32_t q_max = single_rows ? 1 : 3;
  s.max_union = std::min<int32_t>(s.H, s.K * q_max + (rng() % 2 ? 0 : 17));
  if (rng() % 6 == 0) s.max_union = std::max<int32_t>(1, s.K / 2);  // union overflow (general phases)
  s.source = rng() % 3 == 0;
  if (s.source) {
    s.block_size = pick(rng, {16, 64});
    s.source_width = 20000 / s.block_size;
  }
  s.resident = rng() % 3 == 0;
  if (s.resident) s.resident_width = 20000 / s.hbs;
  s.shared_stride = rng() % 4 != 0;
  s.stats = rng() % 5 != 0;
  s.fused = static_cast<int>(rng() % 4);
  s.hint = rng() % 3 == 0;
  // Token rows: per request q rows (contiguous), a few orphans.
  for (int32_t b = 0; b < s.B; ++b) {
    const int32_t q = single_rows ? 1 : 1 + static_cast<int32_t>(rng() % q_max);
    for (int32_t r = 0; r < q; ++r) s.req.push_back(b);
  }
  if (rng() % 4 == 0) s.req.push_back(s.B + 3);  // orphan
  if (!single_rows && rng() % 4 == 0) s.req.push_back(-1);
  s.T = static_cast<int32_t>(s.req.size());
  s.valid_rows = rng() % 5 == 0;
  s.num_valid = s.valid_rows ? s.T - static_cast<int32_t>(rng() % 2) : s.T;
  // State rows: mostly distinct, some padding, duplicate or out of range.
  for (int32_t b = 0; b < s.B; ++b) s.state_idx.push_back(b + 1);
  std::shuffle(s.state_idx.begin(), s.state_idx.end(), rng);
  if (s.B > 2 && rng() % 4 == 0) s.state_idx[rng() % s.B] = -1;
  if (s.B > 2 && rng() % 5 == 0) s.state_idx[1] = s.state_idx[0];
  if (s.B > 2 && rng() % 6 == 0) s.state_idx[rng() % s.B] = s.S + 5;
  // State: dgi rows hold random host slots, some empty, a few duplicated.
  s.dgi.assign(static_cast<size_t>(s.S) * s.H, -1);
  s.lru.assign(static_cast<size_t>(s.S) * s.H, 0);
  for (int32_t r = 0; r < s.S; ++r) {
    for (int32_t j = 0; j < s.H; ++j) {
      const uint32_t u = rng() % 10;
      s.dgi[r * s.H + j] = u == 0 ? -1 : static_cast<int32_t>(rng() % 30000);
    }
    if (rng() % 4 == 0) s.dgi[r * s.H + rng() % s.H] = s.dgi[r * s.H + rng() % s.H];
    std::vector<int16_t> order(s.H);
    for (int32_t j = 0; j < s.H; ++j) order[j] = static_cast<int16_t>(j);
    std::shuffle(order.begin(), order.end(), rng);
    if (rng() % 5 == 0) order[rng() % s.H] = order[rng() % s.H];       // a slot twice
    if (rng() % 6 == 0) order[rng() % s.H] = static_cast<int16_t>(-1);  // corrupt
    if (rng() % 7 == 0) order[rng() % s.H] = static_cast<int16_t>(s.H + 3);
    for (int32_t i = 0; i < s.H; ++i) s.lru[r * s.H + i] = order[i];
  }
  // Hot table: blocks of each batch row, a few missing or huge.
  const int32_t width = (s.H + s.hbs - 1) / s.hbs + 1;
  s.hot_table.resize(static_cast<size_t>(s.B) * width);
  for (int32_t b = 0; b < s.B; ++b) {
    for (int32_t w = 0; w < width; ++w) {
      int32_t block = b * width + w + 1;
      if (rng() % 50 == 0) block = -1;
      if (rng() % 60 == 0) block = 40000000;
      s.hot_table[b * width + w] = block;
    }
  }
  if (s.source) {
    s.source_table.resize(static_cast<size_t>(s.B) * s.source_width);
    for (auto& h : s.source_table) h = rng() % 20 == 0 ? 0 : static_cast<int32_t>(rng() % 900) + 1;
  }
  if (s.resident) {
    s.resident_table.resize(static_cast<size_t>(s.B) * s.resident_width);
    for (auto& r : s.resident_table) r = rng() % 10 == 0 ? static_cast<int32_t>(rng() % 1000) + 1 : 0;
  }
  s.host_cache.resize(static_cast<size_t>(s.host_rows) * s.row_bytes);
  for (size_t i = 0; i < s.host_cache.size(); i += 4) {
    const uint32_t v = static_cast<uint32_t>(i * 2654435761u);
    std::memcpy(&s.host_cache[i], &v, 4);
  }
  return s;
}

// Top-k rows for one step: positions the request's slots hold (hits, when
// the slot's host row is the position's), new ones at `miss_rate`, and noise.
inline void make_topk(std::mt19937& rng, Scenario& s, double miss_rate) {
  s.topk.assign(static_cast<size_t>(s.T) * s.K, -1);
  for (int32_t t = 0; t < s.T; ++t) {
    const int32_t b = s.req[t];
    const int32_t state = b >= 0 && b < s.B ? s.state_idx[b] : -1;
    for (int32_t k = 0; k < s.K; ++k) {
      int32_t p;
      const double u = static_cast<double>(rng() % 100000) / 100000.0;
      if (u < miss_rate || state < 0 || state >= s.S) {
        p = static_cast<int32_t>(rng() % 25000);
      } else if (u < 0.97) {
        // a position whose host slot (without a source table) a slot holds
        p = s.dgi[state * s.H + rng() % s.H];
        if (p < 0) p = static_cast<int32_t>(rng() % 25000);
      } else if (u < 0.985) {
        p = -1;
      } else {
        p = k > 0 ? s.topk[t * s.K + rng() % k] : 7;  // duplicate
      }
      s.topk[t * s.K + k] = p;
    }
  }
}

// The launch's parameters over `s` and side `o` (allocated and filled with
// garbage on first use; the state copied from `s` then).
inline ResolveResidencyParams bind(const Scenario& s, Outputs& o) {
  const int64_t row_stride = s.shared_stride ? s.K : s.K + 3;
  const size_t entries = static_cast<size_t>(s.T) * (s.K + 3);
  if (o.attention.empty()) {
    o.attention.assign(entries, 77);
    o.hot_rows.assign(entries, 77);
    o.resolved.assign(entries, 77);
    o.miss.assign(entries, 77);
    o.swap_host.assign(entries, 77);
    o.swap_device.assign(entries, 77);
    o.valid_counts.assign(s.T, 77);
    o.swap_counts.assign(s.T, 77);
    o.dgi = s.dgi;
    o.lru = s.lru;
    o.stats.assign(5, 0);
    const int32_t width = (s.H + s.hbs - 1) / s.hbs + 1;
    const int64_t hot_rows = static_cast<int64_t>(s.B * width + 2) * s.hbs;
    o.hot_cache.assign(static_cast<size_t>(hot_rows) * s.row_bytes, 0);
    o.handoff.assign(static_cast<size_t>(s.S) * HS_RESOLVER_HANDOFF_WORDS, 0);
    // Arbitrary bits: a hint is only ever a prediction.
    o.hint.resize(static_cast<size_t>((s.host_rows + 31) / 32));
    for (size_t w = 0; w < o.hint.size(); ++w) o.hint[w] = static_cast<uint32_t>(w * 2654435761u) ^ 0x5A5A5A5Au;
  }
  o.valid_rows_word = s.num_valid;
  ResolveResidencyParams p;
  p.topk_indices = s.topk.data();
  p.topk_row_stride = s.K;
  p.num_tokens = s.T;
  p.top_k = s.K;
  p.req_id_per_token = s.req.data();
  p.request_state_indices = s.state_idx.data();
  p.num_batch_rows = s.B;
  p.num_valid_rows = s.valid_rows ? &o.valid_rows_word : nullptr;
  p.device_global_indices = o.dgi.data();
  p.lru_slots = o.lru.data();
  p.num_state_rows = s.S;
  p.hot_size = s.H;
  const int32_t width = (s.H + s.hbs - 1) / s.hbs + 1;
  p.hot_block_table = s.hot_table.data();
  p.hot_table_row_stride = width;
  p.hot_table_width = width;
  p.hot_block_size = s.hbs;
  p.attention_block_stride = s.stride;
  p.host_rows = s.host_rows;
  p.max_union_rows = s.max_union;
  if (s.source) {
    p.source_block_table = s.source_table.data();
    p.source_table_row_stride = s.source_width;
    p.source_table_width = s.source_width;
    p.block_size = s.block_size;
  }
  if (s.resident) {
    p.resident_block_table = s.resident_table.data();
    p.resident_table_row_stride = s.resident_width;
    p.resident_table_width = s.resident_width;
    p.resident_block_size = s.hbs;
  }
  p.out_attention = o.attention.data();
  p.out_attention_row_stride = row_stride;
  p.out_hot_rows = o.hot_rows.data();
  p.out_hot_rows_row_stride = s.shared_stride ? row_stride : s.K + 1;
  p.out_resolved = o.resolved.data();
  p.out_resolved_row_stride = row_stride;
  p.out_miss_mask = o.miss.data();
  p.out_miss_mask_row_stride = row_stride;
  p.out_swap_host_rows = o.swap_host.data();
  p.out_swap_host_rows_row_stride = s.K + 2;
  p.out_swap_device_rows = o.swap_device.data();
  p.out_swap_device_rows_row_stride = s.K;
  p.out_valid_counts = o.valid_counts.data();
  p.out_swap_counts = o.swap_counts.data();
  p.stats = s.stats ? o.stats.data() : nullptr;
  if (s.fused != 0) {
    p.fused_gather = true;
    GatherCompactParams& g = p.gather;
    g.host = s.host_cache.data();
    g.host_rows = s.host_rows;
    g.host_pitch = s.row_bytes;
    g.hot = o.hot_cache.data();
    g.hot_span_rows = static_cast<int64_t>(o.hot_cache.size() / s.row_bytes);
    g.hot_block_size = s.hbs;
    g.hot_block_stride = s.hbs;
    g.row_bytes = s.row_bytes;
    g.swap_host_rows = p.out_swap_host_rows;
    g.swap_device_rows = p.out_swap_device_rows;
    g.swap_host_row_stride = p.out_swap_host_rows_row_stride;
    g.swap_device_row_stride = p.out_swap_device_rows_row_stride;
    g.swap_counts = p.out_swap_counts;
    g.num_token_rows = s.T;
    g.top_k = s.K;
    p.gather_schedule = s.fused == 1 ? HS_RESOLVE_GATHER_FUSED : HS_RESOLVE_GATHER_AUTO;
    if (s.fused == 3) p.handoff = o.handoff.data();
  }
  if (s.hint) p.residency_hint = o.hint.data();
  return p;
}

// The residency hint's upkeep (docs/residency.md, "Residency hint"), which
// the CPU reference does not keep: every slot that took a miss (its
// device_global_indices entry changed) clears the bit of the row it held
// (when that is a host row) and sets its new row's, state row by state row
// in batch order (the emulation runs the blocks in that order; within a
// request the cleared rows, which no member is, and the set ones, members,
// never meet).
inline void keep_hint(const Scenario& s, const std::vector<int32_t>& dgi_before, Outputs& o) {
  if (!s.hint) return;
  for (int32_t b = 0; b < s.B; ++b) {
    const int32_t state = s.state_idx[b];
    if (state < 0 || state >= s.S) continue;
    for (int32_t j = 0; j < s.H; ++j) {
      const int32_t before = dgi_before[static_cast<size_t>(state) * s.H + j];
      const int32_t after = o.dgi[static_cast<size_t>(state) * s.H + j];
      if (before == after) continue;
      if (before >= 0 && before < s.host_rows) o.hint[before >> 5] &= ~(1u << (before & 31));
      o.hint[after >> 5] |= 1u << (after & 31);
    }
  }
}

// The first word of every handoff record (idle, 0, after a launch).
inline std::vector<int32_t> handoff_states(const Outputs& o) {
  std::vector<int32_t> states;
  for (size_t r = 0; r < o.handoff.size(); r += HS_RESOLVER_HANDOFF_WORDS) states.push_back(o.handoff[r]);
  return states;
}

// The launches the CUDA resolver chooses between, on a device of 8 SMs
// (cuda_emulation.hpp's Device).
enum class Kind {
  kAny,         // any batch of 1-5 requests, any schedule
  kTurns,       // 8-14 requests, one-row or mixed, with a fused gather: two requests per block in turn
  kHandoff,     // 7 one-row or 4-7 multi-row requests, auto with a handoff array: no helper blocks
  kEarlyReads,  // 1-3 one-row requests, auto with a handoff array: early-read helpers
  kTailReads,   // 4-6 one-row requests, auto with a handoff array: tail-read helpers for 1-3 of them
};

inline Scenario make_scenario_of_kind(std::mt19937& rng, Kind kind) {
  int32_t batch = 1 + static_cast<int32_t>(rng() % 5);
  if (kind == Kind::kTurns) batch = 8 + static_cast<int32_t>(rng() % 7);
  if (kind == Kind::kHandoff) batch = 4 + static_cast<int32_t>(rng() % 4);
  if (kind == Kind::kEarlyReads) batch = 1 + static_cast<int32_t>(rng() % 3);
  if (kind == Kind::kTailReads) batch = 4 + static_cast<int32_t>(rng() % 3);
  bool single_rows = kind != Kind::kAny || rng() % 4 != 0;
  // Half the launches in turns mix requests of one to three token rows.
  if (kind == Kind::kTurns) single_rows = rng() % 2 == 0;
  // Several token rows per request keep a batch below the SM count from tail reads.
  if (kind == Kind::kHandoff) single_rows = batch == 7;
  Scenario s = make_scenario(rng, single_rows, batch);
  if (kind == Kind::kTurns) {
    s.fused = 1 + static_cast<int>(rng() % 3);
    s.hint = rng() % 2 == 0;
  }
  if (kind == Kind::kHandoff || kind == Kind::kEarlyReads || kind == Kind::kTailReads) s.fused = 3;
  return s;
}

}  // namespace emulated
}  // namespace hisparse
