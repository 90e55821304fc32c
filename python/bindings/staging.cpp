// hisparse._C.StagingPlan and the staging calls (hisparse/staging.h). The
// plan's tensors are arrays of the framework of its storage (torch views of
// a torch buffer, NumPy views of the plan's own memory), made once and owned
// by that storage, so a view never outlives the bytes it shows. A plan on a
// torch buffer holds an alias of the buffer's storage, so replacing the
// buffer's storage (set_()) frees nothing the plan uses, and refuses to run
// once that storage was reallocated (resize_()).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

constexpr Access kRead = Access::kRead;
constexpr Access kWrite = Access::kWrite;

// Arrays handed to a method straight from Python cross the way
// hisparse._args converts them (CUDA tensors without a stream sync), and
// the stream is torch's current one of their device unless one is given.
nb::object exported(nb::handle value, const char* name) {
  return nb::module_::import_("hisparse._args").attr("tensor")(name, value);
}

hs_stream_t stream_of(nb::handle stream, nb::handle a, nb::handle b) {
  const nb::object handle = nb::module_::import_("hisparse._args").attr("stream")(stream, a, b);
  return stream_arg(PyInt{handle});
}

bool is_torch_tensor(nb::handle value) {
  const nb::object torch = nb::module_::import_("sys").attr("modules").attr("get")("torch");
  return !torch.is_none() && nb::isinstance(value, torch.attr("Tensor"));
}

// The plan handle, shared by the Python object and the owners of views of
// memory the plan allocated itself.
struct PlanState {
  hs_staging_plan_t handle = nullptr;
  ~PlanState() { hs_staging_plan_destroy(handle); }
};

hs_staging_plan_options_t plan_options(const PyInt& device_type, const PyInt& device_index, const PyInt& num_rows,
                                       const PyInt& num_cols, const PyInt& block_size, const PyInt& capacity) {
  hs_staging_plan_options_t options;
  hs_staging_plan_options_init(&options);
  options.device_type = int32_arg(device_type, "device_type");
  options.device_index = int32_arg(device_index, "device_index");
  options.num_rows = int_arg(num_rows, "num_rows");
  options.num_cols = int_arg(num_cols, "num_cols");
  options.block_size = int_arg(block_size, "block_size");
  options.staging_block_capacity = int_arg(capacity, "staging_block_capacity");
  return options;
}

class StagingPlan {
 public:
  StagingPlan(const PyInt& device_type, const PyInt& device_index, const PyInt& num_rows, const PyInt& num_cols,
              const PyInt& block_size, const PyInt& capacity, nb::handle storage)
      : state_(std::make_shared<PlanState>()) {
    hs_staging_plan_options_t options =
        plan_options(device_type, device_index, num_rows, num_cols, block_size, capacity);
    std::optional<TensorArg> storage_array;
    if (!storage.is_none()) {
      storage_array.emplace(exported(storage, "storage"), "storage", kWrite);
      options.storage = storage_array->get();
    }
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // an owned plan allocates
      status = hs_staging_plan_create(&options, &state_->handle);
    }
    check(status);
    const hs_staging_plan_info_t plan_info = info();
    // Views of a torch buffer are torch views of an alias of its storage (they
    // follow that storage wherever it goes); views of a NumPy buffer belong to
    // the array; views of the plan's own memory keep the plan's state alive.
    if (!storage.is_none() && is_torch_tensor(storage)) {
      storage_alias_ = nb::borrow(storage).attr("detach")();
      storage_address_ = nb::cast<uintptr_t>(storage_alias_.attr("data_ptr")());
      for (int which = 0; which < HS_STAGING_PLAN_NUM_TENSORS; ++which) {
        views_[which] = torch_view(static_cast<hs_staging_plan_tensor_t>(which));
      }
      return;
    }
    nb::object owner;
    Framework framework;
    if (!storage.is_none()) {
      owner = nb::borrow(storage);
      framework = Framework::kNumpy;
    } else {
      owner = state_owner(state_);
      framework = plan_info.device_type == HS_DEVICE_CUDA ? Framework::kTorch : Framework::kNumpy;
    }
    for (int which = 0; which < HS_STAGING_PLAN_NUM_TENSORS; ++which) {
      views_[which] = view(static_cast<hs_staging_plan_tensor_t>(which), owner, framework);
    }
  }

  // Refuses to run the plan when its torch buffer's storage was reallocated
  // since the plan was made on it: the plan holds the old address.
  void check_storage() const {
    if (!storage_alias_.is_valid()) return;
    const uintptr_t now = nb::cast<uintptr_t>(storage_alias_.attr("data_ptr")());
    if (now == storage_address_) return;
    throw std::runtime_error("storage: the plan's buffer was reallocated after the plan was made on it (e.g. by "
                             "resize_()); make a new plan");
  }

  static uint64_t storage_bytes(const PyInt& device_type, const PyInt& device_index, const PyInt& num_rows,
                                const PyInt& num_cols, const PyInt& block_size, const PyInt& capacity) {
    const hs_staging_plan_options_t options =
        plan_options(device_type, device_index, num_rows, num_cols, block_size, capacity);
    uint64_t bytes = 0;
    check(hs_staging_plan_storage_bytes(&options, &bytes));
    return bytes;
  }

  hs_staging_plan_t handle() const { return state_->handle; }

  hs_staging_plan_info_t info() const {
    hs_staging_plan_info_t info{};
    info.struct_size = sizeof(info);
    check(hs_staging_plan_get_info(state_->handle, &info));
    return info;
  }

  void build(nb::handle block_table, nb::handle seq_lens, nb::handle stream) {
    check_storage();
    const TensorArg table(exported(block_table, "block_table"), "block_table", kRead);
    const TensorArg lens(exported(seq_lens, "seq_lens"), "seq_lens", kRead);
    const hs_stream_t s = stream_of(stream, block_table, seq_lens);
    check(hs_staging_plan_build(state_->handle, table.get(), lens.get(), s));
  }

  void ensure_gpu_sources(nb::handle resident_state_rows, nb::handle state_indices, nb::handle resident_block_size,
                          nb::handle stream) {
    check_storage();
    const TensorArg resident(exported(resident_state_rows, "resident_state_rows"), "resident_state_rows", kRead);
    const TensorArg states(exported(state_indices, "state_indices"), "state_indices", kRead);
    const int64_t block_size = int_arg(PyInt{resident_block_size}, "resident_block_size");
    const hs_stream_t s = stream_of(stream, resident_state_rows, state_indices);
    check(hs_staging_plan_ensure_gpu_sources(state_->handle, resident.get(), states.get(), block_size, s));
  }

  nb::object tensor(hs_staging_plan_tensor_t which) const { return views_[which]; }
  std::optional<nb::object> gpu_row_ids() const {
    if (!info().has_gpu_sources) return std::nullopt;
    return views_[HS_STAGING_PLAN_GPU_ROW_IDS];
  }
  std::optional<std::tuple<uint64_t, int64_t>> gpu_source_key() const {
    const hs_staging_plan_info_t i = info();
    if (!i.has_gpu_sources) return std::nullopt;
    return std::make_tuple(i.gpu_source_table, i.gpu_source_block_size);
  }

  std::string repr() const {
    const hs_staging_plan_info_t i = info();
    const std::string device = i.device_type == HS_DEVICE_CUDA ? "cuda:" + std::to_string(i.device_index) : "cpu";
    return "StagingPlan(device=" + device + ", block_table=[" + std::to_string(i.num_rows) + ", " +
           std::to_string(i.num_cols) + "], block_size=" + std::to_string(i.block_size) +
           ", num_blocks=" + std::to_string(i.num_blocks) + ", gpu_sources=" + (i.has_gpu_sources ? "True" : "False") +
           ")";
  }

 private:
  enum class Framework { kTorch, kNumpy };

  nb::object view(hs_staging_plan_tensor_t which, nb::handle owner, Framework framework) const {
    hs_tensor_t t{};
    check(hs_staging_plan_get_tensor(state_->handle, which, &t));
    const size_t shape[2] = {static_cast<size_t>(t.shape[0]), static_cast<size_t>(t.shape[1])};
    const bool cuda = t.device_type == HS_DEVICE_CUDA;
    const int device_type = cuda ? nb::device::cuda::value : nb::device::cpu::value;
    const int device_id = cuda ? t.device_index : 0;
    if (framework == Framework::kTorch) {
      return nb::cast(nb::ndarray<nb::pytorch, int32_t>(t.data, 2, shape, owner, nullptr, nb::dtype<int32_t>(),
                                                        device_type, device_id),
                      nb::rv_policy::reference);
    }
    return nb::cast(
        nb::ndarray<nb::numpy, int32_t>(t.data, 2, shape, owner, nullptr, nb::dtype<int32_t>(), device_type, device_id),
        nb::rv_policy::reference);
  }

  // A torch view of the plan's tensor `which` in its torch buffer.
  nb::object torch_view(hs_staging_plan_tensor_t which) const {
    hs_tensor_t t{};
    check(hs_staging_plan_get_tensor(state_->handle, which, &t));
    const uintptr_t offset = reinterpret_cast<uintptr_t>(t.data) - storage_address_;
    const nb::object int32 = nb::module_::import_("torch").attr("int32");
    return storage_alias_.attr("narrow")(0, offset, t.shape[0] * t.shape[1] * sizeof(int32_t))
        .attr("view")(int32)
        .attr("view")(t.shape[0], t.shape[1]);
  }

  std::shared_ptr<PlanState> state_;
  std::array<nb::object, HS_STAGING_PLAN_NUM_TENSORS> views_;
  nb::object storage_alias_;        // the torch buffer's detach(), which holds its storage (unset otherwise)
  uintptr_t storage_address_ = 0;  // the buffer's data address when the plan was made
};

void gather_prefill_cache(nb::handle plan_arg, const PyArray& host_cache, const PyOptionalArray& resident_cache,
                          const PyArray& staged, const PyInt& stream) {
  const StagingPlan& plan = *object_arg<StagingPlan>(plan_arg, "plan", "a hisparse.StagingPlan");
  plan.check_storage();
  const TensorArg host(host_cache, "host_cache", kRead);
  const OptionalTensorArg resident(resident_cache, "resident_cache", kRead);
  const TensorArg out(staged, "staged", kWrite);
  check(hs_gather_prefill_cache(plan.handle(), host.get(), resident.get(), out.get(), stream_arg(stream)));
}

void gather_resident_rows(const PyArray& source, const PyArray& destination, const PyArray& row_ids,
                          const PyInt& stream) {
  const TensorArg src(source, "source", kRead), dst(destination, "destination", kWrite), ids(row_ids, "row_ids", kRead);
  check(hs_gather_resident_rows(src.get(), dst.get(), ids.get(), stream_arg(stream)));
}

uint64_t staging_remap_workspace_bytes(const PyInt& device_type, const PyInt& device_index, const PyInt& num_entries,
                                       const PyInt& block_size) {
  uint64_t bytes = 0;
  check(hs_staging_remap_workspace_bytes(int32_arg(device_type, "device_type"), int32_arg(device_index, "device_index"),
                                         int_arg(num_entries, "num_entries"), int_arg(block_size, "block_size"),
                                         &bytes));
  return bytes;
}

void staging_remap(const PyArray& block_table, const PyInt& block_size, const PyArray& out_block_table,
                   const PyArray& out_row_ids, const PyArray& workspace, const PyInt& stream) {
  const TensorArg table(block_table, "block_table", kRead), new_table(out_block_table, "out_block_table", kWrite),
      rows(out_row_ids, "out_row_ids", kWrite), scratch(workspace, "workspace", kWrite);
  hs_staging_remap_args_t args;
  hs_staging_remap_args_init(&args);
  args.block_table = table.get();
  args.block_size = int_arg(block_size, "block_size");
  args.out_block_table = new_table.get();
  args.out_row_ids = rows.get();
  args.workspace = scratch.get();
  check(hs_staging_remap(&args, stream_arg(stream)));
}

}  // namespace

void register_staging(nb::module_& m) {
  m.attr("MIN_STAGED_PREFILL_ROWS") = static_cast<int>(HS_MIN_STAGED_PREFILL_ROWS);

  nb::class_<StagingPlan>(m, "StagingPlan",
                          "The staging plan of a prefill batch (hisparse/staging.h): its distinct host blocks "
                          "renumbered 0, 1, 2, ... (0 = the null block), the renumbered block table, and where each "
                          "staged row comes from. Build one with hisparse.build_staging_plan.")
      .def(nb::init<const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, const PyInt&, nb::handle>(),
           nb::arg("device_type"), nb::arg("device_index"), nb::arg("num_rows"), nb::arg("num_cols"),
           nb::arg("block_size"), nb::arg("staging_block_capacity"), nb::arg("storage").none() = nb::none(),
           nb::sig("def __init__(self, device_type: int, device_index: int, num_rows: int, num_cols: int, "
                   "block_size: int, staging_block_capacity: int, storage: object | None = None) -> None"),
           "An unbuilt plan for [num_rows, num_cols] block tables. `storage`: a uint8 buffer of at least "
           "storage_bytes(...) bytes on the device (its framework's views become the plan's tensors); None: the "
           "plan allocates its own memory.")
      .def_static("storage_bytes", &StagingPlan::storage_bytes, nb::arg("device_type"), nb::arg("device_index"),
                  nb::arg("num_rows"), nb::arg("num_cols"), nb::arg("block_size"), nb::arg("staging_block_capacity"),
                  nb::sig("def storage_bytes(device_type: int, device_index: int, num_rows: int, num_cols: int, "
                          "block_size: int, staging_block_capacity: int) -> int"),
                  "Bytes of storage a plan of these sizes needs.")
      .def("build", &StagingPlan::build, nb::arg("block_table").none(), nb::arg("seq_lens").none(),
           nb::arg("stream").none() = nb::none(),
           nb::sig("def build(self, block_table: object, seq_lens: object, stream: object | None = None) -> None"),
           "Build the plan of a batch (block_table [num_rows, num_cols], seq_lens [>= num_rows]); drops GPU sources. "
           "Runs on torch's current stream unless `stream` is given.")
      .def("ensure_gpu_sources", &StagingPlan::ensure_gpu_sources, nb::arg("resident_state_rows").none(),
           nb::arg("state_indices").none(), nb::arg("resident_block_size").none(),
           nb::arg("stream").none() = nb::none(),
           nb::sig("def ensure_gpu_sources(self, resident_state_rows: object, state_indices: object, "
                   "resident_block_size: int, stream: object | None = None) -> None"),
           "Serve staged rows that have a GPU-resident copy from the resident cache (docs/staging.md); cached per "
           "resident table and page size.")
      .def_prop_ro(
          "block_table", [](const StagingPlan& p) { return p.tensor(HS_STAGING_PLAN_BLOCK_TABLE); },
          "int32 [B, C]: the renumbered block table.")
      .def_prop_ro(
          "row_ids", [](const StagingPlan& p) { return p.tensor(HS_STAGING_PLAN_ROW_IDS); },
          "int32 [1, N]: host slot staged into row j (-1: unused).")
      .def_prop_ro(
          "dst_rows", [](const StagingPlan& p) { return p.tensor(HS_STAGING_PLAN_DST_ROWS); },
          "int32 [1, N]: 0 .. N-1.")
      .def_prop_ro(
          "miss_mask", [](const StagingPlan& p) { return p.tensor(HS_STAGING_PLAN_MISS_MASK); },
          "int32 [1, N]: 1 where row j is loaded from the host cache.")
      .def_prop_ro("gpu_row_ids", &StagingPlan::gpu_row_ids,
                   "int32 [1, N]: flat resident-cache row of row j (-1: none); None without GPU sources.")
      .def_prop_ro("gpu_source_key", &StagingPlan::gpu_source_key,
                   "(data address of resident_state_rows, resident_block_size) of the GPU sources, or None.")
      .def_prop_ro(
          "block_size", [](const StagingPlan& p) { return p.info().block_size; }, "Tokens per block.")
      .def_prop_ro(
          "num_blocks", [](const StagingPlan& p) { return p.info().num_blocks; },
          "Blocks of the staged cache (staging_block_capacity + 1).")
      .def_prop_ro(
          "staging_block_capacity", [](const StagingPlan& p) { return p.info().staging_block_capacity; },
          "Blocks staged besides the null block.")
      .def_prop_ro(
          "device_type", [](const StagingPlan& p) { return p.info().device_type; },
          "HS_DEVICE_CPU (1) or HS_DEVICE_CUDA (2).")
      .def_prop_ro(
          "device_index", [](const StagingPlan& p) { return p.info().device_index; }, "CUDA device (0 on the CPU).")
      .def_prop_ro(
          "built", [](const StagingPlan& p) { return p.info().built != 0; }, "True once build succeeded.")
      .def("__repr__", &StagingPlan::repr);

  m.def("gather_prefill_cache", &gather_prefill_cache, nb::arg("plan").none(), nb::arg("host_cache"),
        nb::arg("resident_cache").none(), nb::arg("staged"), nb::arg("stream") = 0,
        nb::sig("def gather_prefill_cache(plan: StagingPlan, host_cache: object, resident_cache: object | None, "
                "staged: object, stream: int = 0) -> None"),
        "One layer's staged rows for `plan` into `staged` (hs_gather_prefill_cache).");
  m.def("gather_resident_rows", &gather_resident_rows, nb::arg("source"), nb::arg("destination"), nb::arg("row_ids"),
        nb::arg("stream") = 0,
        nb::sig("def gather_resident_rows(source: object, destination: object, row_ids: object, stream: int = 0) "
                "-> None"),
        "destination[j] = flat row row_ids[j] of source (hs_gather_resident_rows).");
  m.def("staging_remap_workspace_bytes", &staging_remap_workspace_bytes, nb::arg("device_type"),
        nb::arg("device_index"), nb::arg("num_entries"), nb::arg("block_size"),
        nb::sig("def staging_remap_workspace_bytes(device_type: int, device_index: int, num_entries: int, "
                "block_size: int) -> int"),
        "Workspace bytes of staging_remap over num_entries entries.");
  m.def("staging_remap", &staging_remap, nb::arg("block_table"), nb::arg("block_size"), nb::arg("out_block_table"),
        nb::arg("out_row_ids"), nb::arg("workspace"), nb::arg("stream") = 0,
        nb::sig("def staging_remap(block_table: object, block_size: int, out_block_table: object, "
                "out_row_ids: object, workspace: object, stream: int = 0) -> None"),
        "The block renumbering of a plan on its own (hs_staging_remap).");
}

}  // namespace hisparse_py
