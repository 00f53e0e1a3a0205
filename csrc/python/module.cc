// torch_pjrt._C: the Python surface of the C++ backend.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "device/context.h"
#include "device/fallback.h"

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
  d["executions"] = m.executions.load();
  d["host_syncs"] = m.host_syncs.load();
  d["host_to_device_bytes"] = m.host_to_device_bytes.load();
  d["device_to_host_bytes"] = m.device_to_host_bytes.load();
  std::lock_guard<std::mutex> lock(m.mu);
  d["fallbacks"] = m.fallbacks;
  d["compiles_by_op"] = m.compiles_by_op;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, mod) {
  device::register_hooks();

  mod.def("_configure", &device::configure_runtime);
  mod.def("_init", [] {
    py::gil_scoped_release no_gil;
    device::rt();
  });
  mod.def("_is_initialized", &device::runtime_ready);
  mod.def("_device_count", &device::device_count_or_zero);
  mod.def("_platform", [] {
    auto& c = device::rt().client();
    return py::make_tuple(c.platform_name(), c.platform_version(), c.api().major_version(), c.api().minor_version());
  });
  mod.def("_plugin_attributes", [] { return device::rt().client().api().attributes(); });
  mod.def("_device_kind", [](int d) { return device::rt().device(d).kind(); });
  mod.def("_metrics", &metrics_dict);
  mod.def("_reset_metrics", [] { executor::metrics().reset(); });
  mod.def("_synchronize", [](int d) {
    py::gil_scoped_release no_gil;
    device::synchronize(d);
  });
  mod.def("_set_eager_mode", [](const std::string& mode) {
    if (mode == "strict") device::set_eager_mode(device::EagerMode::Strict);
    else if (mode == "debug") device::set_eager_mode(device::EagerMode::Debug);
    else throw py::value_error("eager mode must be 'strict' or 'debug', got '" + mode + "'");
  });
  mod.def("_get_eager_mode", [] { return device::eager_mode() == device::EagerMode::Debug ? "debug" : "strict"; });
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
  mod.def("_set_cache_dir", [](const std::string& dir) { device::rt().set_cache_dir(dir); });
  mod.def("_cache_dir", [] { return device::rt().disk_cache().dir(); });
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
    d["materialized"] = static_cast<bool>(st->buffer);
    d["dtype"] = ir::dtype_name(st->dtype);
    d["producer"] = st->producer;
    return d;
  });
}
