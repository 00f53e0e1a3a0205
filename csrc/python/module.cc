// torch_pjrt._C: the Python surface of the C++ backend.
#include <Python.h>
#include <frameobject.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "device/compiled.h"
#include "device/context.h"
#include "device/fallback.h"
#include "aten/user_kernels.h"
#include "distributed/process_group.h"
#include "kernels/host_kernels.h"

#include <unordered_map>

namespace py = pybind11;
using namespace torch_pjrt;

namespace torch_pjrt::device {
void register_hooks();
}

namespace {

py::dict metrics_dict() {
  auto& m = executor::metrics();
  py::dict d;
  d["compiles"] = m.compiles.load();
  d["compile_seconds"] = static_cast<double>(m.compile_ns.load()) / 1e9;
  d["memory_cache_hits"] = m.memory_cache_hits.load();
  d["memory_cache_evictions"] = m.memory_cache_evictions.load();
  d["disk_cache_hits"] = m.disk_cache_hits.load();
  d["disk_cache_rejects"] = m.disk_cache_rejects.load();
  d["disk_cache_stores"] = m.disk_cache_stores.load();
  d["disk_cache_waits"] = m.disk_cache_waits.load();
  d["disk_cache_wait_seconds"] = static_cast<double>(m.disk_cache_wait_ns.load()) / 1e9;
  d["disk_cache_stale_locks"] = m.disk_cache_stale_locks.load();
  d["disk_cache_lock_timeouts"] = m.disk_cache_lock_timeouts.load();
  d["disk_cache_evictions"] = m.disk_cache_evictions.load();
  d["executions"] = m.executions.load();
  d["host_syncs"] = m.host_syncs.load();
  d["host_to_device_bytes"] = m.host_to_device_bytes.load();
  d["device_to_host_bytes"] = m.device_to_host_bytes.load();
  d["device_to_device_bytes"] = m.device_to_device_bytes.load();
  d["ops_recorded"] = m.ops_recorded.load();
  d["graphs"] = m.graphs.load();
  d["graph_ops"] = m.graph_ops.load();
  d["max_graph_ops"] = m.max_graph_ops.load();
  d["graph_outputs"] = m.graph_outputs.load();
  d["donated_buffers"] = m.donated_buffers.load();
  d["dropped_values"] = m.dropped_values.load();
  d["compiled_runs"] = m.compiled_runs.load();
  d["collectives_in_programs"] = m.collectives_in_programs.load();
  std::lock_guard<std::mutex> lock(m.mu);
  d["fallbacks"] = m.fallbacks;
  d["compiles_by_op"] = m.compiles_by_op;
  d["flush_reasons"] = m.flush_reasons;
  return d;
}

// Fused mode's error messages name the user's line that recorded each op. The
// innermost frame outside torch and torch_pjrt is found by walking the stack;
// "is this a library frame" is cached per code object and the "file:line"
// text per (code, instruction), both interned for the life of the process,
// so recording an op costs a GIL round trip and a few lookups.
std::string g_package_dir;

bool is_library_code(PyCodeObject* code) {
  static std::unordered_map<PyCodeObject*, bool> cache;
  auto it = cache.find(code);
  if (it != cache.end()) return it->second;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (!file) PyErr_Clear();
  std::string path = file ? file : "";
  bool library = path.rfind("<frozen", 0) == 0 || path.find("/torch/") != std::string::npos ||
                 (!g_package_dir.empty() && path.rfind(g_package_dir, 0) == 0);
  if (cache.size() < (1u << 16)) {
    Py_INCREF(code);  // kept alive: its address stays a valid key
    cache.emplace(code, library);
  }
  return library;
}

const std::string* line_of(PyCodeObject* code, int lasti) {
  struct Hash {
    size_t operator()(const std::pair<PyCodeObject*, int>& k) const {
      return std::hash<void*>()(k.first) ^ (static_cast<size_t>(k.second) * 0x9E3779B97F4A7C15ULL);
    }
  };
  static std::unordered_map<std::pair<PyCodeObject*, int>, const std::string*, Hash> cache;
  auto key = std::make_pair(code, lasti);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= (1u << 16)) return nullptr;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (!file) PyErr_Clear();
  const char* name = PyUnicode_AsUTF8(code->co_name);
  if (!name) PyErr_Clear();
  auto* text = new std::string(std::string(file ? file : "?") + ":" + std::to_string(PyCode_Addr2Line(code, lasti)) +
                               " in " + (name ? name : "?"));
  Py_INCREF(code);
  cache.emplace(key, text);
  return text;
}

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

const std::string* capture_user_frame() {
  // A thread that never ran Python (autograd's engine threads) has no frame to report.
  if (!Py_IsInitialized() || python_finalizing() || PyGILState_GetThisThreadState() == nullptr) return nullptr;
  PyGILState_STATE gil = PyGILState_Ensure();
  const std::string* where = nullptr;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  PyCodeObject* innermost = nullptr;
  int innermost_lasti = 0;
  for (int depth = 0; frame && depth < 64; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    int lasti = PyFrame_GetLasti(frame);
    if (!innermost) {
      innermost = code;
      innermost_lasti = lasti;
      Py_INCREF(innermost);
    }
    bool library = is_library_code(code);
    if (!library) where = line_of(code, lasti);
    Py_DECREF(code);
    if (!library) break;
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  if (!where && innermost) where = line_of(innermost, innermost_lasti);
  Py_XDECREF(innermost);
  PyGILState_Release(gil);
  return where;
}

}  // namespace

PYBIND11_MODULE(_C, mod) {
  device::register_hooks();

  mod.def("_configure", [](const std::string& plugin_path, int64_t cpu_device_count, const std::string& cache_dir,
                           const std::string& missing_message,
                           const std::vector<std::pair<std::string, std::variant<bool, int64_t, double, std::string>>>&
                               compile_overrides,
                           int64_t cache_max_bytes, double cache_wait_seconds) {
    std::vector<runtime::CompileOverride> overrides;
    for (const auto& [name, value] : compile_overrides) overrides.push_back({name, value});
    executor::DiskCachePolicy policy;
    policy.max_bytes = cache_max_bytes;
    policy.wait_seconds = cache_wait_seconds;
    device::configure_runtime(plugin_path, cpu_device_count, cache_dir, missing_message, overrides, policy);
  });
  executor::set_blocking_scope([]() -> std::shared_ptr<void> {
    if (!PyGILState_Check()) return nullptr;
    return std::make_shared<py::gil_scoped_release>();
  });
  mod.def("_define_kernel", &device::define_user_kernel, py::arg("name"), py::arg("definitions"));
  mod.def("_call_kernel", &device::call_user_kernel, py::arg("op_name"), py::arg("name"), py::arg("inputs"),
          py::arg("like"));
  mod.def("_compile_options", [] { return py::bytes(device::rt().client().compile_options()); });
  // Whether this build has host kernels (csrc/kernels), and whether programs call them here.
  mod.def("_host_kernels_built", [] { return !kernels::host_kernel_handlers().empty(); });
  mod.def("_host_kernel_isa", &kernels::host_kernel_isa);
  mod.def("_host_kernel_isas", &kernels::host_kernel_isas);
  mod.def("_host_kernels", [] { return device::rt().host_kernels(); });
  mod.def("_cache_identity", [] { return device::rt().identity(); });
  mod.def("_init", [] {
    py::gil_scoped_release no_gil;
    device::rt();
  });
  mod.def("_is_initialized", &device::runtime_ready);
  // One backward per device through its autograd thread, made and run in C++ without
  // the GIL: no Python object in its state, its tensors or its result (see
  // torch_pjrt/_autograd_exit.py).
  mod.def("_drain_autograd_device_threads", [] {
    if (!device::runtime_ready()) return;
    py::gil_scoped_release no_gil;
    for (int index = 0; index < device::rt().device_count(); ++index) {
      auto options = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, index));
      at::Tensor leaf = at::empty({1}, options).requires_grad_(true);
      torch::autograd::grad({leaf.view({1})}, {leaf}, {at::empty({1}, options)});
    }
  });
  mod.def("_device_count", &device::device_count_or_zero);
  mod.def("_platform", [] {
    auto& c = device::rt().client();
    return py::make_tuple(c.platform_name(), c.platform_version(), c.api().major_version(), c.api().minor_version());
  });
  mod.def("_plugin_attributes", [] { return device::rt().client().api().attributes(); });
  mod.def("_device_kind", [](int d) { return device::rt().device(d).kind(); });
  mod.def("_device_global_id", [](int d) { return device::rt().device(d).id(); });
  mod.def("_device_attributes", [](int d) { return device::rt().device(d).attributes(); });
  mod.def("_metrics", &metrics_dict);
  mod.def("_reset_metrics", [] { executor::metrics().reset(); });
  mod.def("_synchronize", [](int d) {
    py::gil_scoped_release no_gil;
    device::synchronize(d);
  });
  mod.def("_set_eager_mode", [](const std::string& mode) {
    auto m = device::parse_eager_mode(mode);
    py::gil_scoped_release no_gil;
    device::set_eager_mode(m);
  });
  mod.def("_get_eager_mode", [] { return device::eager_mode_name(device::eager_mode()); });
  mod.def("_set_package_dir", [](const std::string& dir) {
    g_package_dir = dir;
    device::set_frame_capture(&capture_user_frame);
  });
  mod.def("_flush", [](const std::string& reason) {
    auto r = reason == "optimizer_step" ? executor::FlushReason::OptimizerStep : executor::FlushReason::Explicit;
    py::gil_scoped_release no_gil;
    device::flush_all(r);
  });
  mod.def("_pending_ops", [](int d) {
    if (!device::runtime_ready()) return size_t{0};
    return device::graph_of(d).pending_ops();
  });
  mod.def("_set_fusion_policy", [](size_t max_ops, size_t min_loop, bool detect_loops, bool donate) {
    TORCH_CHECK_VALUE(max_ops >= 1, "pjrt: max_ops must be at least 1");
    auto& p = executor::fusion_policy();
    p.max_ops = max_ops;
    p.min_loop = min_loop;
    p.detect_loops = detect_loops;
    p.donate = donate;
  });
  mod.def("_fusion_policy", [] {
    auto& p = executor::fusion_policy();
    py::dict d;
    d["max_ops"] = p.max_ops;
    d["min_loop"] = p.min_loop;
    d["detect_loops"] = p.detect_loops;
    d["donate"] = p.donate;
    return d;
  });
  mod.def("_set_fallback_mode", [](const std::string& mode) {
    if (mode == "warn") device::set_fallback_mode(device::FallbackMode::Warn);
    else if (mode == "log") device::set_fallback_mode(device::FallbackMode::Log);
    else if (mode == "error") device::set_fallback_mode(device::FallbackMode::Error);
    else throw py::value_error("fallback mode must be 'warn', 'log' or 'error', got '" + mode + "'");
  });
  mod.def("_get_fallback_mode", [] {
    switch (device::fallback_mode()) {
      case device::FallbackMode::Log: return "log";
      case device::FallbackMode::Error: return "error";
      default: return "warn";
    }
  });
  // An op (a library's, with a Python kernel for pjrt) run on the CPU for a case that kernel
  // does not cover: the same path, counting and policy as the fallback for ops with no kernel.
  mod.def("_run_on_cpu", [](const std::string& name, const std::string& overload, const py::args& args,
                            const py::kwargs& kwargs) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    auto stack = torch::jit::createStackForSchema(op.schema(), args, kwargs, std::nullopt);
    {
      py::gil_scoped_release no_gil;
      device::run_on_cpu(op, &stack);
    }
    return torch::jit::createPyObjectForStack(std::move(stack));
  });
  mod.def("_set_fallback_logger", [](py::function fn) {
    // Deliberately never freed: it must not be released without the GIL at exit.
    auto* holder = new py::function(std::move(fn));
    device::set_fallback_logger([holder](const std::string& op) {
      py::gil_scoped_acquire gil;
      (*holder)(op);
    });
  });
  mod.def("_memory_stats", [](int d) {
    auto c = device::memory_counters(d);
    py::dict out;
    out["allocated_bytes"] = c.allocated;
    out["peak_allocated_bytes"] = c.peak;
    out["num_allocs"] = c.num_allocs;
    out["num_frees"] = c.num_frees;
    runtime::Device::MemoryStats s;
    if (device::rt().device(d).memory_stats(&s)) {
      out["plugin_bytes_in_use"] = s.bytes_in_use;
      out["plugin_bytes_limit"] = s.bytes_limit;
    }
    return out;
  });
  mod.def("_reset_peak_memory", &device::reset_peak_memory);
  mod.def("_reset_accumulated_memory", &device::reset_accumulated_memory);
  mod.def("_memory_info", &device::memory_info);
  mod.def("_set_cache_dir", [](const std::string& dir) { device::rt().set_cache_dir(dir); });
  mod.def("_cache_dir", [] { return device::rt().disk_cache().dir(); });
  mod.def("_disk_entries_used", [](size_t from) { return executor::disk_entries_used(from); }, py::arg("from") = 0);
  mod.def("_memory_cache_size", [] { return device::rt().memory_cache_size(); });
  mod.def("_clear_memory_cache", [] { device::rt().clear_memory_cache(); });
  mod.def("_set_memory_cache_capacity", [](size_t n) { device::rt().set_memory_cache_capacity(n); });
  mod.def("_default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(device::default_generator(d)));
  });
  mod.def("_manual_seed", [](int d, uint64_t seed) {
    auto gen = device::default_generator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  });
  mod.def("_storage_info", [](const at::Tensor& t) {
    auto* st = device::state_of(t);
    if (!st) return py::dict();
    py::dict d;
    d["nbytes"] = st->nbytes;
    d["pending"] = st->is_pending();
    d["materialized"] = static_cast<bool>(st->buffer) && !st->is_pending();
    d["dtype"] = ir::dtype_name(st->dtype);
    d["producer"] = st->producer ? executor::program_label(*st->producer) : std::string();
    return d;
  });

  // torch.compile (torch_pjrt/compiler.py): capture an FX graph's run as one
  // program, then replay it.
  py::class_<device::CompiledGraph, std::shared_ptr<device::CompiledGraph>>(mod, "_CompiledGraph")
      // Without the GIL: a program holding collectives may wait for the other ranks'
      // parts, which rank threads launch from Python.
      .def("run", &device::CompiledGraph::run, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("mutated_inputs", &device::CompiledGraph::mutated_inputs);
  mod.def("_capture_begin", &device::begin_capture);
  mod.def("_capture_abort", &device::abort_capture);
  mod.def("_capture_end", [](int device, const std::vector<at::Tensor>& inputs,
                             const std::vector<std::optional<at::Tensor>>& outputs,
                             const std::vector<at::Tensor>& constants) {
    std::string why;
    std::shared_ptr<device::CompiledGraph> g;
    {
      py::gil_scoped_release no_gil;  // (as run)
      g = device::CompiledGraph::finish(device, inputs, outputs, constants, &why);
    }
    return py::make_tuple(g ? py::cast(g) : py::none(), why);
  });
  // The hot path of every compiled call: tensors and ints (a dynamic graph's
  // sizes) in order; anything else keys 0. No overload resolution, whose
  // failure would format the arguments (printing a tensor reads it).
  // torch.distributed (torch_pjrt/distributed.py): the c10d backend.
  torch_pjrt::distributed::add_python_bindings(mod);

  mod.def("_layout_key", [](const py::list& inputs) -> uint64_t {
    std::vector<at::Tensor> tensors;
    std::vector<int64_t> ints;
    tensors.reserve(inputs.size());
    for (const py::handle item : inputs) {
      PyObject* obj = item.ptr();
      if (THPVariable_Check(obj)) {
        tensors.push_back(THPVariable_Unpack(obj));
      } else if (PyLong_Check(obj)) {  // bools too
        int overflow = 0;
        const long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow) return 0;
        ints.push_back(static_cast<int64_t>(tensors.size()));  // where it sits among the tensors
        ints.push_back(value);
      } else {
        return 0;
      }
    }
    return device::layout_key(tensors, ints);
  });
}
