// hisparse._C.StagingPlan and the staging calls (hisparse/staging.h). The
// plan's tensors are arrays of the framework of its storage (torch views of
// a torch buffer, NumPy views of the plan's own memory), made once and owned
// by that storage, so a view never outlives the bytes it shows.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "bindings.hpp"

namespace hisparse_py {
namespace {

using ReadArray = nb::ndarray<nb::ro>;
using WriteArray = nb::ndarray<>;

std::string type_of(nb::handle value) { return nb::type_name(value.type()).c_str(); }

// An int argument given from Python, refusing bool, float and str with a
// message naming it (nanobind's own conversion error names nothing).
int64_t int_arg(nb::handle value, const char* name) {
  if (PyBool_Check(value.ptr()) || !PyLong_Check(value.ptr())) {
    throw nb::type_error((std::string(name) + ": expected an int, got " + type_of(value)).c_str());
  }
  int overflow = 0;
  const long long result = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0) {
    throw nb::value_error(
        (std::string(name) + ": expected an int of at most 64 bits, got " + nb::cast<std::string>(nb::str(value)))
            .c_str());
  }
  return static_cast<int64_t>(result);
}

int32_t int32_arg(nb::handle value, const char* name) {
  const int64_t result = int_arg(value, name);
  if (result < INT32_MIN || result > INT32_MAX) {
    throw nb::value_error((std::string(name) + ": expected an int32, got " + std::to_string(result)).c_str());
  }
  return static_cast<int32_t>(result);
}

// An array (anything DLPack or the buffer protocol gives) or a named TypeError.
template <typename Array>
Array array_arg(nb::handle value, const char* name) {
  Array array;
  if (value.is_none() || !nb::try_cast(value, array)) {
    throw nb::type_error(
        (std::string(name) + ": expected a tensor (torch.Tensor or numpy.ndarray), got " + type_of(value)).c_str());
  }
  return array;
}

// Arrays handed to a method straight from Python cross the way
// hisparse._args converts them (CUDA tensors without a stream sync), and
// the stream is torch's current one of their device unless one is given.
nb::object exported(nb::handle value, const char* name) {
  return nb::module_::import_("hisparse._args").attr("tensor")(name, value);
}

hs_stream_t stream_of(nb::handle stream, nb::handle a, nb::handle b) {
  const nb::object handle = nb::module_::import_("hisparse._args").attr("stream")(stream, a, b);
  return as_stream(nb::cast<uintptr_t>(handle));
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

hs_staging_plan_options_t plan_options(nb::handle device_type, nb::handle device_index, nb::handle num_rows,
                                       nb::handle num_cols, nb::handle block_size, nb::handle capacity) {
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
  StagingPlan(nb::handle device_type, nb::handle device_index, nb::handle num_rows, nb::handle num_cols,
              nb::handle block_size, nb::handle capacity, nb::handle storage)
      : state_(std::make_shared<PlanState>()) {
    hs_staging_plan_options_t options =
        plan_options(device_type, device_index, num_rows, num_cols, block_size, capacity);
    std::optional<TensorDesc> storage_desc;
    if (!storage.is_none()) {
      storage_desc.emplace(WriteArray(array_arg<WriteArray>(exported(storage, "storage"), "storage")), "storage");
      options.storage = storage_desc->get();
    }
    hs_status_t status;
    {
      nb::gil_scoped_release release;  // an owned plan allocates
      status = hs_staging_plan_create(&options, &state_->handle);
    }
    check(status);
    const hs_staging_plan_info_t plan_info = info();
    // Views of caller storage belong to that storage (and take its framework);
    // views of the plan's own memory keep the plan's state alive.
    nb::object owner;
    Framework framework;
    if (!storage.is_none()) {
      owner = nb::borrow(storage);
      framework = is_torch_tensor(storage) ? Framework::kTorch : Framework::kNumpy;
    } else {
      owner = nb::capsule(new std::shared_ptr<PlanState>(state_),
                          [](void* p) noexcept { delete static_cast<std::shared_ptr<PlanState>*>(p); });
      framework = plan_info.device_type == HS_DEVICE_CUDA ? Framework::kTorch : Framework::kNumpy;
    }
    for (int which = 0; which < HS_STAGING_PLAN_NUM_TENSORS; ++which) {
      views_[which] = view(static_cast<hs_staging_plan_tensor_t>(which), owner, framework);
    }
  }

  static uint64_t storage_bytes(nb::handle device_type, nb::handle device_index, nb::handle num_rows,
                                nb::handle num_cols, nb::handle block_size, nb::handle capacity) {
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
    const TensorDesc table(WriteArray(array_arg<ReadArray>(exported(block_table, "block_table"), "block_table")),
                           "block_table");
    const TensorDesc lens(WriteArray(array_arg<ReadArray>(exported(seq_lens, "seq_lens"), "seq_lens")), "seq_lens");
    const hs_stream_t s = stream_of(stream, block_table, seq_lens);
    check(hs_staging_plan_build(state_->handle, table.get(), lens.get(), s));
  }

  void ensure_gpu_sources(nb::handle resident_state_rows, nb::handle state_indices, nb::handle resident_block_size,
                          nb::handle stream) {
    const TensorDesc resident(
        WriteArray(array_arg<ReadArray>(exported(resident_state_rows, "resident_state_rows"), "resident_state_rows")),
        "resident_state_rows");
    const TensorDesc states(WriteArray(array_arg<ReadArray>(exported(state_indices, "state_indices"), "state_indices")),
                            "state_indices");
    const int64_t block_size = int_arg(resident_block_size, "resident_block_size");
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

  std::shared_ptr<PlanState> state_;
  std::array<nb::object, HS_STAGING_PLAN_NUM_TENSORS> views_;
};

void gather_prefill_cache(const StagingPlan& plan, nb::handle host_cache, nb::handle resident_cache, nb::handle staged,
                          uintptr_t stream) {
  const TensorDesc host(WriteArray(array_arg<ReadArray>(host_cache, "host_cache")), "host_cache");
  std::optional<TensorDesc> resident;
  if (!resident_cache.is_none()) {
    resident.emplace(WriteArray(array_arg<ReadArray>(resident_cache, "resident_cache")), "resident_cache");
  }
  const TensorDesc out(array_arg<WriteArray>(staged, "staged"), "staged");
  check(hs_gather_prefill_cache(plan.handle(), host.get(), resident ? resident->get() : nullptr, out.get(),
                                as_stream(stream)));
}

void gather_resident_rows(nb::handle source, nb::handle destination, nb::handle row_ids, uintptr_t stream) {
  const TensorDesc src(WriteArray(array_arg<ReadArray>(source, "source")), "source");
  const TensorDesc dst(array_arg<WriteArray>(destination, "destination"), "destination");
  const TensorDesc ids(WriteArray(array_arg<ReadArray>(row_ids, "row_ids")), "row_ids");
  check(hs_gather_resident_rows(src.get(), dst.get(), ids.get(), as_stream(stream)));
}

uint64_t staging_remap_workspace_bytes(nb::handle device_type, nb::handle device_index, nb::handle num_entries,
                                       nb::handle block_size) {
  uint64_t bytes = 0;
  check(hs_staging_remap_workspace_bytes(int32_arg(device_type, "device_type"), int32_arg(device_index, "device_index"),
                                         int_arg(num_entries, "num_entries"), int_arg(block_size, "block_size"),
                                         &bytes));
  return bytes;
}

void staging_remap(nb::handle block_table, nb::handle block_size, nb::handle out_block_table, nb::handle out_row_ids,
                   nb::handle workspace, uintptr_t stream) {
  const TensorDesc table(WriteArray(array_arg<ReadArray>(block_table, "block_table")), "block_table");
  const TensorDesc new_table(array_arg<WriteArray>(out_block_table, "out_block_table"), "out_block_table");
  const TensorDesc rows(array_arg<WriteArray>(out_row_ids, "out_row_ids"), "out_row_ids");
  const TensorDesc scratch(array_arg<WriteArray>(workspace, "workspace"), "workspace");
  hs_staging_remap_args_t args;
  hs_staging_remap_args_init(&args);
  args.block_table = table.get();
  args.block_size = int_arg(block_size, "block_size");
  args.out_block_table = new_table.get();
  args.out_row_ids = rows.get();
  args.workspace = scratch.get();
  check(hs_staging_remap(&args, as_stream(stream)));
}

}  // namespace

void register_staging(nb::module_& m) {
  m.attr("MIN_STAGED_PREFILL_ROWS") = static_cast<int>(HS_MIN_STAGED_PREFILL_ROWS);

  nb::class_<StagingPlan>(m, "StagingPlan",
                          "The staging plan of a prefill batch (hisparse/staging.h): its distinct host blocks "
                          "renumbered 0, 1, 2, ... (0 = the null block), the renumbered block table, and where each "
                          "staged row comes from. Build one with hisparse.build_staging_plan.")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, nb::handle, nb::handle, nb::handle>(),
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
      .def("build", &StagingPlan::build, nb::arg("block_table"), nb::arg("seq_lens"),
           nb::arg("stream").none() = nb::none(),
           nb::sig("def build(self, block_table: object, seq_lens: object, stream: object | None = None) -> None"),
           "Build the plan of a batch (block_table [num_rows, num_cols], seq_lens [>= num_rows]); drops GPU sources. "
           "Runs on torch's current stream unless `stream` is given.")
      .def("ensure_gpu_sources", &StagingPlan::ensure_gpu_sources, nb::arg("resident_state_rows"),
           nb::arg("state_indices"), nb::arg("resident_block_size"), nb::arg("stream").none() = nb::none(),
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

  m.def("gather_prefill_cache", &gather_prefill_cache, nb::arg("plan"), nb::arg("host_cache"),
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
