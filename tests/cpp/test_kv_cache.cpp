// The KV cache and its kernels through the C ABI on the CPU backend:
// hs_write_rows (host store, resident copy, write-through of hot copies,
// skipped tokens), hs_read_rows, hs_update_residency (the newest pages, pages
// of several table blocks, padding rows), the KV cache's flow (admit, begin,
// write, swap_in, read give back exactly the rows written, a follower
// prefetched before its write still reads its own new row, release resets
// the row, counters per group and in total, reset), the runtime's narrow
// top-k and per-request lengths, a follower's refusal of a top-k, one cache
// per borrowed pool, host registration, and arguments that fail naming
// themselves. The CUDA kernels
// are compared with these bit for bit in tests/python/test_kv_cache.py.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "expect_status.hpp"
#include "hisparse/hisparse.hpp"
#include "unregistered_pool.hpp"

namespace {

constexpr int64_t kRowBytes = 32;

std::vector<uint8_t> row_of(uint8_t value) { return std::vector<uint8_t>(kRowBytes, value); }

hs::Tensor i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return hs::Tensor(v.data(), HS_DTYPE_INT32, shape);
}

// ------------------------------------------------------------------ write_rows

TEST(WriteRows, StoresHostResidentAndHotCopies) {
  // Two batch rows (state rows 1 and 0), source block size 4, host blocks
  // 1.. for row 0 and 5.. for row 1 (block table per batch row).
  std::vector<uint8_t> rows(3 * kRowBytes);
  for (int t = 0; t < 3; ++t) std::memset(rows.data() + t * kRowBytes, 10 + t, kRowBytes);
  std::vector<int32_t> req{0, 1, 1}, positions{5, 2, 9}, states{1, 0};
  std::vector<int32_t> source{1, 2, 3, 5, 6, 7};  // [2, 3]
  std::vector<uint8_t> host(40 * kRowBytes, 0);
  // Resident: batch row 1's page 2 (positions 8..11 at resident block size 4) in block 3.
  std::vector<int32_t> resident_table{0, 0, 0, 0, 0, 3};  // [2, 3]
  std::vector<uint8_t> resident(4 * 4 * kRowBytes, 0);   // [4 blocks, 4, W]
  // Hot: state row 1 (batch row 0) holds host slot 2*4+1 = 9 in slots 1 and 6.
  std::vector<int32_t> dgi(2 * 8, -1);
  dgi[1 * 8 + 1] = 9;
  dgi[1 * 8 + 6] = 9;
  std::vector<int32_t> hot_table{2, 0, 1, 3};           // [2, 2]: batch row 0 hot blocks 2, 0
  std::vector<uint8_t> hot(4 * 4 * kRowBytes, 0);       // [4, 4, W]
  hs::Tensor t_rows(rows.data(), HS_DTYPE_UINT8, {3, kRowBytes});
  hs::Tensor t_req = i32(req, {3}), t_pos = i32(positions, {3}), t_states = i32(states, {2});
  hs::Tensor t_source = i32(source, {2, 3}), t_rtable = i32(resident_table, {2, 3});
  hs::Tensor t_host(host.data(), HS_DTYPE_UINT8, {40, kRowBytes});
  hs::Tensor t_resident(resident.data(), HS_DTYPE_UINT8, {4, 4, kRowBytes});
  hs::Tensor t_dgi = i32(dgi, {2, 8}), t_htable = i32(hot_table, {2, 2});
  hs::Tensor t_hot(hot.data(), HS_DTYPE_UINT8, {4, 4, kRowBytes});
  hs_write_rows_args_t a;
  hs_write_rows_args_init(&a);
  a.rows = t_rows;
  a.req_id_per_token = t_req;
  a.positions = t_pos;
  a.request_state_indices = t_states;
  a.host_cache = t_host;
  a.source_block_table = t_source;
  a.block_size = 4;
  a.resident_cache = t_resident;
  a.resident_block_table = t_rtable;
  a.hot_cache = t_hot;
  a.hot_block_table = t_htable;
  a.device_global_indices = t_dgi;
  hs::write_rows(a);
  // Token 0: batch row 0, position 5 -> block 2, slot 9. Token 1: batch row
  // 1, position 2 -> block 5, slot 22. Token 2: position 9 -> block 7, slot 29.
  for (auto [slot, value] : std::vector<std::pair<int, int>>{{9, 10}, {22, 11}, {29, 12}}) {
    EXPECT_EQ(std::vector<uint8_t>(host.begin() + slot * kRowBytes, host.begin() + (slot + 1) * kRowBytes),
              row_of(value))
        << "host slot " << slot;
  }
  // Token 2's page is resident in block 3, offset 1 -> row 13.
  EXPECT_EQ(std::vector<uint8_t>(resident.begin() + 13 * kRowBytes, resident.begin() + 14 * kRowBytes), row_of(12));
  EXPECT_EQ(std::count(resident.begin(), resident.end(), 0), static_cast<long>(resident.size() - kRowBytes));
  // Slot 9's copies: hot slot 1 (block 2, row 9) and slot 6 (block 0, row 2).
  for (int row : {9, 2}) {
    EXPECT_EQ(std::vector<uint8_t>(hot.begin() + row * kRowBytes, hot.begin() + (row + 1) * kRowBytes), row_of(10))
        << "hot row " << row;
  }
  EXPECT_EQ(std::count(hot.begin(), hot.end(), 0), static_cast<long>(hot.size() - 2 * kRowBytes));
  EXPECT_EQ(dgi[1 * 8 + 1], 9) << "the hot state is kept: the copies are rewritten, not dropped";
}

TEST(WriteRows, SkipsPaddingInvalidPositionsAndMissingBlocks) {
  std::vector<uint8_t> rows(4 * kRowBytes, 7);
  std::vector<int32_t> req{0, 1, 5, 0}, positions{-1, 0, 0, 12}, states{0, -1};
  std::vector<uint8_t> host(16 * kRowBytes, 0);
  hs::Tensor t_rows(rows.data(), HS_DTYPE_UINT8, {4, kRowBytes});
  hs::Tensor t_req = i32(req, {4}), t_pos = i32(positions, {4}), t_states = i32(states, {2});
  std::vector<int32_t> source2{1, 0, 2, 1, 0, 2};  // [2, 3]: block index 1 is the null block 0
  hs::Tensor t_source = i32(source2, {2, 3});
  hs::Tensor t_host(host.data(), HS_DTYPE_UINT8, {16, kRowBytes});
  hs_write_rows_args_t a;
  hs_write_rows_args_init(&a);
  a.rows = t_rows;
  a.req_id_per_token = t_req;
  a.positions = t_pos;
  a.request_state_indices = t_states;
  a.host_cache = t_host;
  a.source_block_table = t_source;
  a.block_size = 4;
  hs::write_rows(a);
  // t0: position -1; t1: padding state row; t2: batch row out of range;
  // t3: position 12 -> block index 3, past the table. Nothing is written.
  EXPECT_EQ(std::count(host.begin(), host.end(), 0), static_cast<long>(host.size()));
  // A position on the null block writes nothing either; one on block 2 does.
  positions = {4, 8, 8, 8};
  req = {0, 0, 0, 0};
  t_rows = hs::Tensor(rows.data(), HS_DTYPE_UINT8, {2, kRowBytes});
  a.rows = t_rows;
  hs::write_rows(a);
  EXPECT_EQ(std::count(host.begin(), host.end(), 7), kRowBytes);
  EXPECT_EQ(host[8 * kRowBytes], 7) << "position 8 -> block 2, slot 8";
}

TEST(WriteRows, BadArgumentsNameThemselves) {
  std::vector<uint8_t> rows(2 * kRowBytes, 1);
  std::vector<int32_t> req{0, 0}, positions{0, 1}, states{0};
  std::vector<float> bad_positions{0, 1};
  hs::Tensor t_rows(rows.data(), HS_DTYPE_UINT8, {2, kRowBytes});
  hs::Tensor t_req = i32(req, {2}), t_pos = i32(positions, {2}), t_states = i32(states, {1});
  hs::Tensor t_fpos(bad_positions.data(), HS_DTYPE_FLOAT32, {2});
  hs_write_rows_args_t a;
  hs_write_rows_args_init(&a);
  a.rows = t_rows;
  a.req_id_per_token = t_req;
  a.positions = t_fpos;
  a.request_state_indices = t_states;
  expect_error(hs_write_rows(&a, nullptr), HS_ERROR_INVALID_DTYPE, {"positions", "int32 or int64", "float32"});
  a.positions = t_pos;
  std::vector<int32_t> short_req{0};
  hs::Tensor t_short = i32(short_req, {1});
  a.req_id_per_token = t_short;
  expect_error(hs_write_rows(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"req_id_per_token", "at least 2"});
  a.req_id_per_token = t_req;
  std::vector<int32_t> table{1};
  hs::Tensor t_table = i32(table, {1, 1});
  a.source_block_table = t_table;
  expect_error(hs_write_rows(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"block_size", "positive"});
  a.source_block_table = nullptr;
  std::vector<uint8_t> hot(4 * kRowBytes);
  hs::Tensor t_hot(hot.data(), HS_DTYPE_UINT8, {1, 4, kRowBytes});
  a.hot_cache = t_hot;
  expect_error(hs_write_rows(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"hot_block_table", "expected a tensor"});
}

// ------------------------------------------------------------------ read_rows

TEST(ReadRows, CopiesNamedRowsAndZeroesTheRest) {
  // A paged view of 3 blocks of 2 rows at a block stride of 3 rows.
  std::vector<uint8_t> slab(9 * kRowBytes);
  for (int r = 0; r < 9; ++r) std::memset(slab.data() + r * kRowBytes, r + 1, kRowBytes);
  hs::Tensor cache = hs::Tensor(slab.data(), HS_DTYPE_UINT8, {3, 2, kRowBytes}).strides({3 * kRowBytes, kRowBytes, 1});
  std::vector<int32_t> indices{0, 7, -1, 8, 99, 4};  // the view spans 2 x 3 + 2 = 8 rows
  hs::Tensor t_idx = i32(indices, {2, 3});
  std::vector<uint8_t> out(6 * kRowBytes, 0xEE);
  hs::Tensor t_out(out.data(), HS_DTYPE_UINT8, {2, 3, kRowBytes});
  hs::read_rows(cache, t_idx, t_out);
  const std::vector<int> want{1, 8, 0, 0, 0, 5};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + i * kRowBytes, out.begin() + (i + 1) * kRowBytes),
              row_of(static_cast<uint8_t>(want[i])))
        << "entry " << i;
  }
  std::vector<uint8_t> wrong(6 * 16);
  hs::Tensor t_wrong(wrong.data(), HS_DTYPE_UINT8, {2, 3, 16});
  expect_error(hs_read_rows(cache, t_idx, t_wrong, nullptr), HS_ERROR_INVALID_ARGUMENT, {"out", "32 bytes"});
}

// ------------------------------------------------------------------ update_residency

// One call's arguments: table blocks of 4 positions, one per page.
hs_update_residency_args_t residency_args(const hs::Tensor& table, const hs::Tensor& states, const hs::Tensor& lengths,
                                          const hs::Tensor& blocks, int32_t num_pages) {
  hs_update_residency_args_t a;
  hs_update_residency_args_init(&a);
  a.resident_block_table = table;
  a.table_block_size = 4;
  a.num_pages = num_pages;
  a.request_state_indices = states;
  a.seq_lens = lengths;
  a.resident_blocks = blocks;
  return a;
}

TEST(UpdateResidency, KeepsTheNewestPagesInTheirRing) {
  // 3 batch rows (state rows 2, 0, -1), table blocks of 4 positions, pages of
  // 2 table blocks, 2 resident pages; each state row owns 4 blocks.
  std::vector<int32_t> states{2, 0, -1}, lengths{19, 3, 50};
  std::vector<int32_t> blocks(3 * 4);
  std::iota(blocks.begin(), blocks.end(), 100);
  std::vector<int32_t> table(3 * 8, -7);
  hs::Tensor t_table = i32(table, {3, 8}), t_states = i32(states, {3}), t_lens = i32(lengths, {3});
  hs::Tensor t_blocks = i32(blocks, {3, 4});
  hs_update_residency_args_t a = residency_args(t_table, t_states, t_lens, t_blocks, 2);
  a.blocks_per_page = 2;
  hs::update_residency(a);
  // Row 0: length 19 -> pages 0..2 (8 positions each), newest 2 = pages 1, 2:
  // page 1 in ring slot 1 (blocks 110, 111), page 2 in slot 0 (108, 109).
  EXPECT_EQ(std::vector<int32_t>(table.begin(), table.begin() + 8),
            (std::vector<int32_t>{0, 0, 110, 111, 108, 109, 0, 0}));
  // Row 1: length 3 -> page 0 only, slot 0 (100, 101).
  EXPECT_EQ(std::vector<int32_t>(table.begin() + 8, table.begin() + 16),
            (std::vector<int32_t>{100, 101, 0, 0, 0, 0, 0, 0}));
  // Row 2: padding.
  EXPECT_EQ(std::vector<int32_t>(table.begin() + 16, table.end()), std::vector<int32_t>(8, 0));
  a.num_pages = 3;
  expect_error(hs_update_residency(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"resident_blocks", "at least 6"});
}

TEST(UpdateResidency, RingPagesKeepAPageOutOfTheSlotALaterPageHolds) {
  // One table block per page of 4 positions, 2 resident pages, ring pages
  // tracked: state row 0 reaches page 2 (length 10), then falls back to
  // page 1 (length 8: draft tokens rejected). Page 0 would come back into
  // slot 0, which page 2 has written: it stays out.
  std::vector<int32_t> states{0}, lengths{10}, blocks{50, 51}, ring{-1, -1}, table(4, -7);
  hs::Tensor t_table = i32(table, {1, 4}), t_states = i32(states, {1}), t_lens = i32(lengths, {1});
  hs::Tensor t_blocks = i32(blocks, {1, 2}), t_ring = i32(ring, {1, 2});
  hs_update_residency_args_t a = residency_args(t_table, t_states, t_lens, t_blocks, 2);
  a.ring_pages = t_ring;
  hs::update_residency(a);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 51, 50, 0}));
  EXPECT_EQ(ring, (std::vector<int32_t>{2, 1}));
  lengths[0] = 8;
  hs::update_residency(a);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 51, 0, 0}));
  EXPECT_EQ(ring, (std::vector<int32_t>{2, 1}));
  // Growing again: page 2 holds its slot still, page 3 claims slot 1.
  lengths[0] = 13;
  hs::update_residency(a);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 0, 50, 51}));
  EXPECT_EQ(ring, (std::vector<int32_t>{2, 3}));
  // Without ring pages every page of the window is resident.
  lengths[0] = 8;
  a.ring_pages = nullptr;
  hs::update_residency(a);
  EXPECT_EQ(table, (std::vector<int32_t>{50, 51, 0, 0}));
}

TEST(UpdateResidency, TwoBatchRowsOfOneStateRowClaimBeforeEitherTableRow) {
  // Both rows read state row 0: row 0 at page 0, row 1 at page 2. Page 2's
  // claim of slot 0 keeps page 0 out of row 0's table whatever the order.
  std::vector<int32_t> states{0, 0}, lengths{3, 9}, blocks{50, 51}, ring{-1, -1}, table(2 * 3, -7);
  hs::Tensor t_table = i32(table, {2, 3}), t_states = i32(states, {2}), t_lens = i32(lengths, {2});
  hs::Tensor t_blocks = i32(blocks, {1, 2}), t_ring = i32(ring, {1, 2});
  hs_update_residency_args_t a = residency_args(t_table, t_states, t_lens, t_blocks, 2);
  a.ring_pages = t_ring;
  hs::update_residency(a);
  EXPECT_EQ(table, (std::vector<int32_t>{0, 0, 0, 0, 51, 50}));
  EXPECT_EQ(ring, (std::vector<int32_t>{2, 1}));
}

TEST(UpdateResidency, RingPagesAreChecked) {
  std::vector<int32_t> states{0}, lengths{10}, blocks{50, 51, 52, 53}, ring(4, -1), table(4);
  hs::Tensor t_table = i32(table, {1, 4}), t_states = i32(states, {1}), t_lens = i32(lengths, {1});
  hs::Tensor t_blocks = i32(blocks, {2, 2});
  hs_update_residency_args_t a = residency_args(t_table, t_states, t_lens, t_blocks, 2);
  hs::Tensor one_row = i32(ring, {1, 2});
  a.ring_pages = one_row;
  expect_error(hs_update_residency(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"ring_pages", "at least 2"});
  hs::Tensor one_column = i32(ring, {2, 1});
  a.ring_pages = one_column;
  expect_error(hs_update_residency(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"ring_pages", "at least 2"});
  hs::Tensor over_the_table = i32(table, {2, 2});
  a.ring_pages = over_the_table;
  expect_error(hs_update_residency(&a, nullptr), HS_ERROR_INVALID_ARGUMENT, {"ring_pages", "resident_block_table"});
  std::vector<int64_t> wide(4, -1);
  hs::Tensor t_wide(wide.data(), HS_DTYPE_INT64, {2, 2});
  a.ring_pages = t_wide;
  expect_error(hs_update_residency(&a, nullptr), HS_ERROR_INVALID_DTYPE, {"ring_pages", "int32"});
  EXPECT_EQ(ring, std::vector<int32_t>(4, -1));
}

TEST(UpdateResidency, AVersionOneCallerHasNoRingPages) {
  // A caller built against version 1 of the struct: the bytes where
  // ring_pages now lies are not its own and are never read.
  std::vector<int32_t> states{0}, lengths{8}, blocks{50, 51}, table(4, -7);
  hs::Tensor t_table = i32(table, {1, 4}), t_states = i32(states, {1}), t_lens = i32(lengths, {1});
  hs::Tensor t_blocks = i32(blocks, {1, 2});
  hs_update_residency_args_t a = residency_args(t_table, t_states, t_lens, t_blocks, 2);
  a.struct_size = offsetof(hs_update_residency_args_t, ring_pages);
  a.struct_version = 1;
  a.ring_pages = reinterpret_cast<const hs_tensor_t*>(uintptr_t{8});
  ASSERT_EQ(hs_update_residency(&a, nullptr), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(table, (std::vector<int32_t>{50, 51, 0, 0}));
}

// ------------------------------------------------------------------ the KV cache

struct Model {
  static constexpr int32_t kLayers = 3, kRequests = 2, kTopK = 4, kHot = 8;
  hs_config_t config = hs::default_config();
  std::vector<int32_t> groups{0, 0, 1};  // layers 0 and 1 share an indexer; layer 2 its own
  hs_kv_cache_options_t options{};
  explicit Model(int32_t resident_pages = 0) {
    config.top_k = kTopK;
    config.device_buffer_size = kHot;
    config.max_union_rows = kTopK;
    config.row_bytes = kRowBytes;
    config.block_size = 4;
    config.hot_block_size = 2;
    hs_kv_cache_options_init(&options);
    options.config = &config;
    options.num_layers = kLayers;
    options.layer_groups = groups.data();
    options.max_requests = kRequests;
    options.max_seq_len = 16;
    options.resident_pages = resident_pages;
  }
};

// The row layer `layer` writes for position p of request r.
uint8_t value_of(int layer, int r, int p) { return static_cast<uint8_t>(1 + layer * 64 + r * 32 + p); }

void write_positions(hs::KvCache& cache, int layer, const std::vector<int32_t>& req, const std::vector<int32_t>& pos) {
  const int64_t n = static_cast<int64_t>(req.size());
  std::vector<uint8_t> rows(n * kRowBytes);
  for (int64_t t = 0; t < n; ++t) std::memset(rows.data() + t * kRowBytes, value_of(layer, req[t], pos[t]), kRowBytes);
  std::vector<int32_t> r = req, p = pos;
  hs::Tensor t_rows(rows.data(), HS_DTYPE_UINT8, {n, kRowBytes});
  cache.write(layer, t_rows, i32(r, {n}), i32(p, {n}));
}

// Every attention index of `attention` names the row layer `layer` wrote for
// its position in `topk`.
void expect_rows_written(hs::KvCache& cache, int layer, const std::vector<int32_t>& topk,
                         const std::vector<int32_t>& req, const int32_t* attention, int64_t row_stride, int64_t k) {
  const int64_t T = static_cast<int64_t>(req.size());
  std::vector<int32_t> indices(T * k);
  for (int64_t t = 0; t < T; ++t) std::copy_n(attention + t * row_stride, k, indices.begin() + t * k);
  std::vector<uint8_t> out(T * k * kRowBytes);
  hs::Tensor t_out(out.data(), HS_DTYPE_UINT8, {T, k, kRowBytes});
  cache.read(layer, i32(indices, {T, k}), t_out);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < k; ++c) {
      const int32_t p = topk[t * k + c];
      const uint8_t want = indices[t * k + c] < 0 ? 0 : value_of(layer, req[t], p);
      EXPECT_EQ(out[(t * k + c) * kRowBytes], want) << "layer " << layer << " token " << t << " column " << c;
      if (p >= 0) EXPECT_GE(indices[t * k + c], 0) << "a written position resolves";
    }
  }
}

TEST(KvCache, BuildsGroupsAndServesTheRowsWritten) {
  for (int32_t resident_pages : {0, 1}) {
    SCOPED_TRACE(resident_pages);
    Model m(resident_pages);
    hs::KvCache cache(m.options);
    const hs_kv_cache_info_t info = cache.info();
    EXPECT_EQ(info.num_groups, 2);
    EXPECT_EQ(info.host_bytes, hs::KvCache::host_bytes(m.options));
    EXPECT_EQ(info.blocks_per_request, 4);
    EXPECT_EQ(cache.group_of(1), 0);
    EXPECT_EQ(cache.admit(), 0);
    EXPECT_EQ(cache.admit(), 1);
    expect_error(hs_kv_cache_admit(cache.get(), -1, nullptr, nullptr), HS_ERROR_INVALID_STATE, {"admit", "release"});
    // Prefill: request 0 writes positions 0..5, request 1 positions 0..2.
    std::vector<int32_t> lens{6, 3};
    cache.begin_forward(i32(lens, {2}));
    std::vector<int32_t> req, pos;
    for (int p = 0; p < 6; ++p) req.push_back(0), pos.push_back(p);
    for (int p = 0; p < 3; ++p) req.push_back(1), pos.push_back(p);
    for (int layer = 0; layer < Model::kLayers; ++layer) write_positions(cache, layer, req, pos);
    // Decode steps: each request writes its next position and selects it,
    // with older ones; layers in order, the follower after its leader.
    for (int step = 0; step < 5; ++step) {
      lens = {7 + step, 4 + step};
      cache.begin_forward(i32(lens, {2}));
      std::vector<int32_t> dreq{0, 1}, dpos{lens[0] - 1, lens[1] - 1};
      // Narrow (3 of 4 columns), with the newest position and a position not
      // written yet (dropped by the length).
      std::vector<int32_t> topk{dpos[0], step % 6, 15, dpos[1], (step + 1) % 3, -1};
      for (int layer = 0; layer < Model::kLayers; ++layer) {
        write_positions(cache, layer, dreq, dpos);
        hs_kv_cache_swap_in_args_t a;
        hs_kv_cache_swap_in_args_init(&a);
        const bool leader = layer != 1;
        hs::Tensor t_topk = i32(topk, {2, 3});
        hs::Tensor t_req = i32(dreq, {2});
        if (leader) {
          a.topk_indices = t_topk;
          a.req_id_per_token = t_req;
        } else {
          a.num_tokens = 2;
        }
        const hs_runtime_swap_in_result_t r = cache.swap_in(layer, a);
        hs_index_group_t group = nullptr;
        ASSERT_EQ(hs_runtime_get_index_group(cache.runtime(layer), &group), HS_SUCCESS);
        hs_tensor_t att{};
        ASSERT_EQ(hs_index_group_get_tensor(group, HS_INDEX_GROUP_ATTENTION_INDICES, &att), HS_SUCCESS);
        const int32_t* attention = static_cast<const int32_t*>(att.data) + r.first_row * Model::kTopK;
        std::vector<int32_t> expected_topk = topk;
        expected_topk[2] = -1;  // position 15 is past request 0's length
        expect_rows_written(cache, layer, expected_topk, dreq, attention, Model::kTopK, 3);
        EXPECT_EQ(attention[2], -1);
        EXPECT_EQ(attention[3], -1) << "the padded column";
      }
    }
    // Counters: per group and in total; the total is the sum; reset zeroes.
    cache.copy_stats_async();
    const hs_runtime_stats_t g0 = cache.stats(0), g1 = cache.stats(1), total = cache.stats();
    EXPECT_GT(g0.misses, 0);
    EXPECT_EQ(total.misses, g0.misses + g1.misses);
    EXPECT_EQ(total.lookups, g0.lookups + g1.lookups);
    EXPECT_EQ(total.num_layers, 3);
    EXPECT_EQ(total.bytes_moved, g0.bytes_moved + g1.bytes_moved);
    EXPECT_EQ(g0.bytes_moved, static_cast<uint64_t>(g0.misses) * 2 * kRowBytes);
    if (resident_pages > 0) EXPECT_GT(total.resident, 0);
    cache.reset_stats();
    cache.copy_stats_async();
    EXPECT_EQ(cache.stats().lookups, 0);
    // Release resets the row's hot state in every group.
    cache.release(0);
    for (int layer : {0, 2}) {
      hs_index_group_t group = nullptr;
      ASSERT_EQ(hs_runtime_get_index_group(cache.runtime(layer), &group), HS_SUCCESS);
      hs_tensor_t dgi{};
      ASSERT_EQ(hs_index_group_get_tensor(group, HS_INDEX_GROUP_DEVICE_GLOBAL_INDICES, &dgi), HS_SUCCESS);
      const auto* held = static_cast<const int32_t*>(dgi.data);
      EXPECT_EQ(std::count(held, held + Model::kHot, -1), Model::kHot) << "row 0 holds nothing";
      EXPECT_LT(std::count(held + Model::kHot, held + 2 * Model::kHot, -1), Model::kHot) << "row 1 keeps its rows";
    }
    expect_error(hs_kv_cache_release(cache.get(), 0, nullptr), HS_ERROR_INVALID_STATE, {"not admitted"});
    EXPECT_EQ(cache.admit(0), 0);
  }
}

TEST(KvCache, FollowerRefusesATopKAndBadOptionsNameThemselves) {
  Model m;
  hs::KvCache cache(m.options);
  std::vector<int32_t> lens{2, 0};
  cache.begin_forward(i32(lens, {2}));
  std::vector<int32_t> topk{0, 1, -1, -1}, req{0};
  hs::Tensor t_topk = i32(topk, {1, 4}), t_req = i32(req, {1});
  hs_kv_cache_swap_in_args_t a;
  hs_kv_cache_swap_in_args_init(&a);
  a.topk_indices = t_topk;
  a.req_id_per_token = t_req;
  expect_error(hs_kv_cache_swap_in(cache.get(), 1, &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"topk_indices", "follower"});
  expect_error(hs_kv_cache_swap_in(cache.get(), 3, &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"layer", "num_layers = 3"});
  std::vector<int32_t> wide(5, 0);
  hs::Tensor t_wide = i32(wide, {1, 5});
  a.topk_indices = t_wide;
  expect_error(hs_kv_cache_swap_in(cache.get(), 0, &a, nullptr, nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"topk_indices", "top_k = 4"});
  std::vector<int32_t> short_lens{1};
  expect_error(hs_kv_cache_begin_forward(cache.get(), i32(short_lens, {1}), nullptr), HS_ERROR_INVALID_ARGUMENT,
               {"seq_lens", "size 2"});

  std::vector<int32_t> groups{0, 2, 1};
  m.options.layer_groups = groups.data();
  hs_kv_cache_t bad = nullptr;
  expect_error(hs_kv_cache_create(&m.options, &bad), HS_ERROR_INVALID_ARGUMENT, {"layer_groups[1]", "got 2"});
  EXPECT_EQ(bad, nullptr);
  m.options.layer_groups = nullptr;
  m.options.resident_page_size = 3;
  expect_error(hs_kv_cache_create(&m.options, &bad), HS_ERROR_INVALID_ARGUMENT, {"resident_page_size", "multiple"});
  m.options.resident_page_size = 0;
  m.options.max_requests = 0;
  expect_error(hs_kv_cache_create(&m.options, &bad), HS_ERROR_INVALID_ARGUMENT, {"max_requests"});
}

TEST(KvCache, APoolServesOneCacheAtATime) {
  Model m;
  uint64_t host_bytes = 0;
  ASSERT_EQ(hs_kv_cache_host_bytes(&m.options, &host_bytes), HS_SUCCESS) << hs_last_error();
  const hs_host_pool_options_t po = unregistered_pool_options(host_bytes);
  hs_host_pool_t pool = nullptr;
  ASSERT_EQ(hs_host_pool_create(&po, &pool), HS_SUCCESS) << hs_last_error();
  m.options.host_pool = pool;
  hs_kv_cache_t first = nullptr, second = nullptr;
  ASSERT_EQ(hs_kv_cache_create(&m.options, &first), HS_SUCCESS) << hs_last_error();
  // Both would keep their host cache at offset 0 of the pool.
  expect_error(hs_kv_cache_create(&m.options, &second), HS_ERROR_INVALID_ARGUMENT, {"host_pool", "another KV cache"});
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(hs_kv_cache_destroy(first), HS_SUCCESS);
  ASSERT_EQ(hs_kv_cache_create(&m.options, &second), HS_SUCCESS) << hs_last_error();
  EXPECT_EQ(hs_kv_cache_destroy(second), HS_SUCCESS);
  EXPECT_EQ(hs_host_pool_destroy(pool), HS_SUCCESS);
}

// An event a KV cache or a runtime holds is not destroyed under it.
TEST(KvCache, AHeldHostEventIsNotDestroyed) {
  Model m;
  hs_ipc_event_t event = nullptr;
  ASSERT_EQ(hs_ipc_event_create(HS_DEVICE_CPU, 0, &event), HS_SUCCESS) << hs_last_error();
  m.options.host_event = event;
  hs_kv_cache_t cache = nullptr;
  ASSERT_EQ(hs_kv_cache_create(&m.options, &cache), HS_SUCCESS) << hs_last_error();
  expect_error(hs_ipc_event_destroy(event), HS_ERROR_INVALID_STATE, {"event", "still held by 3 runtime(s)"});
  hs_runtime_t layer = nullptr;
  ASSERT_EQ(hs_kv_cache_get_runtime(cache, 0, &layer), HS_SUCCESS) << hs_last_error();
  hs_runtime_host_sharing_t sharing;
  hs_runtime_host_sharing_init(&sharing);
  ASSERT_EQ(hs_runtime_set_host_sharing(layer, &sharing), HS_SUCCESS) << hs_last_error();  // gives it up
  expect_error(hs_ipc_event_destroy(event), HS_ERROR_INVALID_STATE, {"event", "still held by 2 runtime(s)"});
  EXPECT_EQ(hs_kv_cache_destroy(cache), HS_SUCCESS);
  EXPECT_EQ(hs_ipc_event_destroy(event), HS_SUCCESS);
}

TEST(KvCache, RefusesALayerCountPastAnyModel) {
  Model m;
  m.options.layer_groups = nullptr;
  uint64_t bytes = 0;
  for (const int32_t layers : {0, (1 << 16) + 1, std::numeric_limits<int32_t>::max()}) {
    m.options.num_layers = layers;
    expect_error(hs_kv_cache_host_bytes(&m.options, &bytes), HS_ERROR_INVALID_ARGUMENT,
                 {"num_layers", "expected 1 to 65536"});
  }
}

// ------------------------------------------------------------------ host registration

TEST(HostRegistration, RecordsRangesAndRefusesOverlapsAndUnknownPointers) {
  std::vector<uint8_t> memory(4096);
  ASSERT_EQ(hs_host_register(memory.data(), 1024, HS_DEVICE_CPU, 0), HS_SUCCESS) << hs_last_error();
  int32_t registered = 0;
  ASSERT_EQ(hs_host_is_registered(memory.data() + 100, 200, &registered), HS_SUCCESS);
  EXPECT_EQ(registered, 1);
  ASSERT_EQ(hs_host_is_registered(memory.data() + 1000, 200, &registered), HS_SUCCESS);
  EXPECT_EQ(registered, 0);
  expect_error(hs_host_register(memory.data() + 512, 1024, HS_DEVICE_CPU, 0), HS_ERROR_INVALID_ARGUMENT,
               {"data", "overlaps"});
  expect_error(hs_host_register(memory.data(), 0, HS_DEVICE_CPU, 0), HS_ERROR_INVALID_ARGUMENT, {"bytes"});
  expect_error(hs_host_unregister(memory.data() + 8), HS_ERROR_INVALID_ARGUMENT, {"data", "not the start"});
  ASSERT_EQ(hs_host_unregister(memory.data()), HS_SUCCESS);
  {
    hs::HostRegistration registration(memory.data(), 4096, HS_DEVICE_CPU, 0);
    ASSERT_EQ(hs_host_is_registered(memory.data(), 4096, &registered), HS_SUCCESS);
    EXPECT_EQ(registered, 1);
  }
  ASSERT_EQ(hs_host_is_registered(memory.data(), 1, &registered), HS_SUCCESS);
  EXPECT_EQ(registered, 0);
}

}  // namespace
