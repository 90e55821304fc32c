// CPU reference of residency resolution. Each numbered step is the step of
// the same number in docs/residency.md; clarity over speed throughout.
#include "cpu/resolve_residency_reference.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "hisparse/hisparse.h"

namespace hisparse {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

enum class EntryKind { kInvalid, kResident, kHot };

struct Entry {
  EntryKind kind = EntryKind::kInvalid;
  int64_t host_slot = -1;      // g
  int64_t resident_row = -1;   // physical row in the resident cache
  int64_t member_rank = -1;    // rank in the candidate union (hot entries)
};

class Resolver {
 public:
  explicit Resolver(const ResolveResidencyParams& p) : p_(p) {}

  void run() {
    int32_t valid_rows = p_.num_tokens;
    if (p_.num_valid_rows != nullptr) valid_rows = std::clamp(*p_.num_valid_rows, 0, p_.num_tokens);

    // Orphan rows: past num_valid_rows, or naming no batch row.
    for (int32_t t = 0; t < p_.num_tokens; ++t) {
      const int32_t b = p_.req_id_per_token[t];
      if (t >= valid_rows || b < 0 || b >= p_.num_batch_rows) write_inactive_row(t);
    }

    for (int32_t b = 0; b < p_.num_batch_rows; ++b) {
      int32_t first = -1, last = -1, count = 0;
      for (int32_t t = 0; t < valid_rows; ++t) {
        if (p_.req_id_per_token[t] != b) continue;
        if (first < 0) first = t;
        last = t;
        ++count;
      }
      if (count == 0) continue;
      const int32_t s = p_.request_state_indices[b];
      if (s < 0) {  // padding
        for_each_row(b, valid_rows, [&](int32_t t) { write_inactive_row(t); });
        continue;
      }
      if (is_rejected(b, s, first, last, count)) {
        for_each_row(b, valid_rows, [&](int32_t t) {
          write_inactive_row(t);
          stats_[HS_STAT_LOOKUPS] += p_.top_k;
          stats_[HS_STAT_INVALID] += p_.top_k;
        });
        continue;
      }
      resolve_request(b, s, first, count);
    }

    if (p_.stats != nullptr) {
      for (int i = 0; i < HS_NUM_STATS; ++i) p_.stats[i] += stats_[i];
    }
  }

 private:
  template <typename Fn>
  void for_each_row(int32_t b, int32_t valid_rows, Fn&& fn) {
    for (int32_t t = 0; t < valid_rows; ++t) {
      if (p_.req_id_per_token[t] == b) fn(t);
    }
  }

  bool is_rejected(int32_t b, int32_t s, int32_t first, int32_t last, int32_t count) const {
    if (s >= p_.num_state_rows) return true;
    for (int32_t earlier = 0; earlier < b; ++earlier) {
      if (p_.request_state_indices[earlier] == s) return true;
    }
    return last - first + 1 != count;
  }

  void write_inactive_row(int32_t t) {
    for (int32_t k = 0; k < p_.top_k; ++k) {
      at(p_.out_attention, p_.out_attention_row_stride, t, k) = -1;
      at(p_.out_hot_rows, p_.out_hot_rows_row_stride, t, k) = -1;
      at(p_.out_resolved, p_.out_resolved_row_stride, t, k) = -1;
      at(p_.out_miss_mask, p_.out_miss_mask_row_stride, t, k) = 0;
    }
    p_.out_valid_counts[t] = 0;
    p_.out_swap_counts[t] = 0;
  }

  static int32_t& at(int32_t* base, int64_t row_stride, int64_t row, int64_t column) {
    return base[row * row_stride + column];
  }

  // (row / hot_block_size) * attention_block_stride + row % hot_block_size
  int64_t attention_index(int64_t row) const {
    return row / p_.hot_block_size * p_.attention_block_stride + row % p_.hot_block_size;
  }

  // Step 1: classify one entry.
  Entry classify(int32_t b, int32_t position) const {
    Entry entry;
    if (position < 0) return entry;
    int64_t g = position;
    if (p_.source_block_table != nullptr) {
      const int64_t block = position / p_.block_size;
      if (block >= p_.source_table_width) return entry;
      const int32_t host_block = p_.source_block_table[b * p_.source_table_row_stride + block];
      if (host_block <= 0) return entry;
      g = static_cast<int64_t>(host_block) * p_.block_size + position % p_.block_size;
    }
    if (g >= p_.host_rows) return entry;
    entry.host_slot = g;
    if (p_.resident_block_table != nullptr) {
      const int64_t page = position / p_.resident_block_size;
      if (page < p_.resident_table_width) {
        const int32_t resident_block = p_.resident_block_table[b * p_.resident_table_row_stride + page];
        if (resident_block > 0) {
          const int64_t row =
              static_cast<int64_t>(resident_block) * p_.resident_block_size + position % p_.resident_block_size;
          if (attention_index(row) > kInt32Max) return Entry{};
          entry.kind = EntryKind::kResident;
          entry.resident_row = row;
          return entry;
        }
      }
    }
    entry.kind = EntryKind::kHot;
    return entry;
  }

  void resolve_request(int32_t b, int32_t s, int32_t t0, int32_t q) {
    const int32_t K = p_.top_k;
    const int32_t H = p_.hot_size;
    int32_t* dgi = p_.device_global_indices + static_cast<int64_t>(s) * H;
    int16_t* lru = p_.lru_slots + static_cast<int64_t>(s) * H;

    // Steps 1 and 2: classify entries and build the union in first-occurrence order.
    std::vector<Entry> entries(static_cast<size_t>(q) * K);
    std::unordered_map<int64_t, int64_t> rank_of;  // host slot -> candidate rank
    std::vector<int64_t> members;                  // host slot of each rank < max_union_rows
    std::vector<int64_t> first_entry;              // first entry index of each member
    for (int32_t r = 0; r < q; ++r) {
      for (int32_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(r) * K + k;
        Entry& entry = entries[e];
        entry = classify(b, p_.topk_indices[(t0 + r) * p_.topk_row_stride + k]);
        if (entry.kind != EntryKind::kHot) continue;
        auto [it, inserted] = rank_of.emplace(entry.host_slot, static_cast<int64_t>(rank_of.size()));
        entry.member_rank = it->second;
        if (entry.member_rank >= p_.max_union_rows) {
          entry.kind = EntryKind::kInvalid;  // overflow
        } else if (inserted) {
          members.push_back(entry.host_slot);
          first_entry.push_back(e);
        }
      }
    }
    const auto member_rank_of = [&](int64_t host_slot) -> int64_t {
      const auto it = rank_of.find(host_slot);
      return it == rank_of.end() || it->second >= p_.max_union_rows ? -1 : it->second;
    };

    // Step 3: usable slots.
    std::vector<int32_t> occurrences(H, 0);
    for (int32_t i = 0; i < H; ++i) {
      if (lru[i] >= 0 && lru[i] < H) ++occurrences[lru[i]];
    }
    const auto physical_row = [&](int32_t j) -> int64_t {
      const int32_t block = p_.hot_block_table[b * p_.hot_table_row_stride + j / p_.hot_block_size];
      return static_cast<int64_t>(block) * p_.hot_block_size + j % p_.hot_block_size;
    };
    const auto usable = [&](int32_t j) {
      if (j < 0 || j >= H || occurrences[j] != 1) return false;
      const int32_t block = p_.hot_block_table[b * p_.hot_table_row_stride + j / p_.hot_block_size];
      return block >= 0 && attention_index(physical_row(j)) <= kInt32Max;
    };

    // Step 4: hits and evictable positions; the last hit position of a member serves it.
    std::vector<int32_t> member_slot(members.size(), -1);
    std::vector<char> hit(members.size(), 0);
    std::vector<int32_t> evictable, hit_positions;
    for (int32_t i = 0; i < H; ++i) {
      const int32_t j = lru[i];
      const int64_t rank = usable(j) ? member_rank_of(dgi[j]) : -1;
      if (rank >= 0) {
        hit_positions.push_back(i);
        member_slot[rank] = j;
        hit[rank] = 1;
      } else {
        evictable.push_back(i);
      }
    }

    // Step 5: misses take evictable positions oldest first.
    std::vector<int64_t> misses;
    for (size_t rank = 0; rank < members.size(); ++rank) {
      if (!hit[rank]) misses.push_back(static_cast<int64_t>(rank));
    }
    const size_t n = std::min(misses.size(), evictable.size());
    std::vector<int64_t> assigned;
    for (size_t m = 0; m < n; ++m) {
      const int32_t j = lru[evictable[m]];
      if (!usable(j)) continue;  // dropped: misses again later
      dgi[j] = static_cast<int32_t>(members[misses[m]]);
      member_slot[misses[m]] = j;
      assigned.push_back(misses[m]);
    }

    // Step 6: new LRU order E[n:], E[:n], hits.
    const std::vector<int16_t> old_lru(lru, lru + H);
    int32_t out = 0;
    for (size_t m = n; m < evictable.size(); ++m) lru[out++] = old_lru[evictable[m]];
    for (size_t m = 0; m < n; ++m) lru[out++] = old_lru[evictable[m]];
    for (int32_t i : hit_positions) lru[out++] = old_lru[i];

    // Step 7: per-entry outputs and valid counts.
    for (int32_t r = 0; r < q; ++r) {
      const int32_t t = t0 + r;
      int32_t valid = 0;
      for (int32_t k = 0; k < K; ++k) {
        const int64_t e = static_cast<int64_t>(r) * K + k;
        const Entry& entry = entries[e];
        int64_t row = -1, slot_of_entry = -1;
        int32_t miss = 0;
        if (entry.kind == EntryKind::kResident) {
          row = entry.resident_row;
          ++stats_[HS_STAT_RESIDENT];
        } else if (entry.kind == EntryKind::kHot && member_slot[entry.member_rank] >= 0) {
          row = physical_row(member_slot[entry.member_rank]);
          miss = !hit[entry.member_rank] && first_entry[entry.member_rank] == e;
        }
        if (row >= 0) slot_of_entry = entry.host_slot;
        at(p_.out_hot_rows, p_.out_hot_rows_row_stride, t, k) = static_cast<int32_t>(row);
        at(p_.out_attention, p_.out_attention_row_stride, t, k) =
            row >= 0 ? static_cast<int32_t>(attention_index(row)) : -1;
        at(p_.out_resolved, p_.out_resolved_row_stride, t, k) = static_cast<int32_t>(slot_of_entry);
        at(p_.out_miss_mask, p_.out_miss_mask_row_stride, t, k) = miss;
        valid += row >= 0;
      }
      p_.out_valid_counts[t] = valid;
      stats_[HS_STAT_INVALID] += K - valid;
    }
    stats_[HS_STAT_LOOKUPS] += static_cast<int64_t>(q) * K;

    // Step 7: the swap list, misses in rank order packed K per token row.
    for (size_t m = 0; m < assigned.size(); ++m) {
      const int64_t t = t0 + static_cast<int64_t>(m) / K;
      const int64_t column = static_cast<int64_t>(m) % K;
      at(p_.out_swap_host_rows, p_.out_swap_host_rows_row_stride, t, column) =
          static_cast<int32_t>(members[assigned[m]]);
      at(p_.out_swap_device_rows, p_.out_swap_device_rows_row_stride, t, column) =
          static_cast<int32_t>(physical_row(member_slot[assigned[m]]));
    }
    for (int32_t r = 0; r < q; ++r) {
      const int64_t remaining = static_cast<int64_t>(assigned.size()) - static_cast<int64_t>(r) * K;
      p_.out_swap_counts[t0 + r] = static_cast<int32_t>(std::clamp<int64_t>(remaining, 0, K));
    }

    // Step 8: member counters.
    stats_[HS_STAT_HITS] += std::count(hit.begin(), hit.end(), 1);
    stats_[HS_STAT_MISSES] += static_cast<int64_t>(assigned.size());
  }

  const ResolveResidencyParams& p_;
  int64_t stats_[HS_NUM_STATS] = {0, 0, 0, 0, 0};
};

}  // namespace

void resolve_residency_reference(const ResolveResidencyParams& params) { Resolver(params).run(); }

}  // namespace hisparse
