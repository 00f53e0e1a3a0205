// PJRT C API client: RAII wrappers that turn PJRT errors into C++ exceptions.
// No torch headers here: this layer is unit-tested on its own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "pjrt_c_api.h"

namespace torch_pjrt::runtime {

// Absl status codes as PJRT reports them.
enum class ErrorCode : int {
  kOk = 0, kCancelled = 1, kUnknown = 2, kInvalidArgument = 3, kDeadlineExceeded = 4,
  kNotFound = 5, kAlreadyExists = 6, kPermissionDenied = 7, kResourceExhausted = 8,
  kFailedPrecondition = 9, kAborted = 10, kOutOfRange = 11, kUnimplemented = 12,
  kInternal = 13, kUnavailable = 14, kDataLoss = 15, kUnauthenticated = 16,
};

class PjrtError : public std::runtime_error {
 public:
  PjrtError(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// Element types as the PJRT C API numbers them (not xla::PrimitiveType).
using ElementType = PJRT_Buffer_Type;

class Api;
class Client;
class Device;

// Owns a PJRT_Event; await() rethrows the event's error.
class Event {
 public:
  Event(std::shared_ptr<const Api> api, PJRT_Event* event);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void await();
  bool is_ready() const;
  // Calls `fn` (on a plugin thread) once the event is ready, failed or not.
  void on_ready(std::function<void()> fn);

 private:
  std::shared_ptr<const Api> api_;
  PJRT_Event* event_;
};

// Bytes of device memory held by live buffers (plugins such as the CPU one
// report none, so buffers count themselves).
struct MemoryCounter {
  std::atomic<int64_t> allocated{0}, peak{0}, num_allocs{0}, num_frees{0};
  // Bytes ever allocated and freed (torch's "allocated_bytes.all.allocated"/".freed").
  std::atomic<int64_t> bytes_allocated_total{0}, bytes_freed_total{0};
  void add(int64_t bytes);
  void sub(int64_t bytes);
};

// Owns a PJRT_Buffer: an immutable array on one device.
class Buffer {
 public:
  Buffer(std::shared_ptr<const Api> api, PJRT_Buffer* buffer);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  PJRT_Buffer* raw() const { return buffer_; }
  std::vector<int64_t> dims() const;
  ElementType element_type() const;
  size_t on_device_size_bytes() const;
  // Copies the dense row-major contents to dst (dst_size bytes) and waits.
  void to_host(void* dst, size_t dst_size) const;
  // Where the plugin keeps the contents (PJRT_Buffer_UnsafePointer): a host address on a
  // host platform, nothing to dereference elsewhere.
  uintptr_t unsafe_pointer() const;
  // Waits until the buffer is computed; rethrows any execution error.
  void await_ready() const;
  // A copy on another device of the same client, made by the plugin (device to device where
  // the hardware links them); PjrtError kUnimplemented where the plugin has no such copy.
  std::unique_ptr<Buffer> copy_to_device(const Device& dst) const;
  // Counts `bytes` in `counter` until the buffer is destroyed or donated.
  void track(MemoryCounter* counter, int64_t bytes);
  // A program consumed this buffer (input/output aliasing): its memory is the output's now.
  void mark_donated();

 private:
  std::shared_ptr<const Api> api_;
  PJRT_Buffer* buffer_;
  MemoryCounter* counter_ = nullptr;
  int64_t bytes_ = 0;
};

class Device {
 public:
  Device(std::shared_ptr<const Api> api, PJRT_Device* device);
  PJRT_Device* raw() const { return device_; }
  int id() const;
  std::string kind() const;
  std::string debug_string() const;
  // The device description's attributes (e.g. compute_capability, core_count on GPUs)
  // as "name=value" strings.
  std::vector<std::string> attributes() const;
  struct MemoryStats {
    int64_t bytes_in_use = 0;
    int64_t peak_bytes_in_use = 0;
    int64_t bytes_limit = 0;
  };
  // False when the plugin has no memory statistics (the CPU plugin has none).
  bool memory_stats(MemoryStats* out) const;

 private:
  std::shared_ptr<const Api> api_;
  PJRT_Device* device_;
};

class LoadedExecutable {
 public:
  LoadedExecutable(std::shared_ptr<const Api> api, PJRT_LoadedExecutable* exe);
  ~LoadedExecutable();
  LoadedExecutable(const LoadedExecutable&) = delete;
  LoadedExecutable& operator=(const LoadedExecutable&) = delete;

  size_t num_outputs() const { return num_outputs_; }
  // Runs on one device. Inputs are borrowed; outputs are owned by the caller.
  // Execution is asynchronous: errors surface when an output is awaited. With
  // `done`, it receives an event that fires when the execution has finished.
  // Parameters listed in `keep` are not donated even where the program aliases
  // them to an output (the plugin copies instead).
  // A program over several devices (Client::compile with replica devices) runs
  // its part on `device` only; the other devices' parts are launched by their
  // own callers with the same `launch_id`, and the plugin joins them.
  std::vector<std::unique_ptr<Buffer>> execute(const Device& device, const std::vector<PJRT_Buffer*>& args,
                                               std::unique_ptr<Event>* done = nullptr,
                                               const std::vector<int64_t>* keep = nullptr, int launch_id = 0) const;
  std::string serialize() const;

 private:
  std::shared_ptr<const Api> api_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_ = 0;
};

// The plugin's function table plus checks on every call.
class Api {
 public:
  // dlopen()s the plugin, checks its version and initializes it.
  static std::shared_ptr<const Api> load(const std::string& path);
  const PJRT_Api* raw() const { return api_; }
  // Throws PjrtError if the plugin's table is too short to hold `offset`.
  void check_has(size_t offset, const char* name) const;
  // Converts and destroys a PJRT error; no-op for nullptr.
  void throw_if_error(PJRT_Error* error, const char* what) const;
  int major_version() const { return api_->pjrt_api_version.major_version; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }
  std::string path() const { return path_; }
  // Plugin attributes (xla_version, stablehlo versions) as "name=value" strings.
  std::vector<std::string> attributes() const;
  // Registers a typed XLA FFI handler (an XLA_FFI_Handler*) as custom call `target` of
  // `platform` ("Host" for CPU plugins) through the plugin's FFI extension. False when the
  // plugin has no such extension or one too old to register handlers; a plugin error throws.
  // Registration is no proof that compiles find the handler: probe with a compile.
  bool register_ffi_handler(const std::string& target, const std::string& platform, void* handler) const;
  // True once a client of this plugin reported a host platform ("cpu") and the plugin has
  // PJRT_Buffer_UnsafePointer: its device memory is this process's memory, so a ready buffer
  // is read with a memcpy instead of a copy the plugin schedules on its threads (two thread
  // hand-offs, about 70 us per read).
  bool device_memory_is_host() const { return device_memory_is_host_.load(std::memory_order_relaxed); }
  void note_platform(const std::string& platform_name) const;

 private:
  Api(const PJRT_Api* api, std::string path) : api_(api), path_(std::move(path)) {}
  const PJRT_Api* api_;
  std::string path_;
  mutable std::atomic<bool> device_memory_is_host_{false};
};

#define TORCH_PJRT_CALL(api, fn, args, what)                                \
  ((api).check_has(offsetof(PJRT_Api, fn), #fn),                           \
   (api).throw_if_error((api).raw()->fn(args), what))

struct ClientOption {
  std::string name;
  int64_t value;
};

// One XLA DebugOptions field set for every compile, by name
// ("xla_cpu_use_xnnpack" = false): sent as CompileOptionsProto's
// env_option_overrides, which the plugin applies on top of its own defaults
// and XLA_FLAGS (a DebugOptions message would replace all of them by zeros).
struct CompileOverride {
  std::string name;
  std::variant<bool, int64_t, double, std::string> value;
};
// xla.CompileOptionsProto bytes: a portable executable for 1 replica and 1
// partition, plus the overrides (in the given order). With replica devices
// (global device ids): one replica per device, replica i on replica_devices[i].
std::string encode_compile_options(const std::vector<CompileOverride>& overrides,
                                   const std::vector<int64_t>& replica_devices = {});

// A key-value store shared by the processes of one job (a c10d Store behind it):
// a plugin whose client spans processes (node_id/num_nodes) exchanges its
// topology and collective ids through it. Implementations are thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Blocks until `key` is set; throws PjrtError(kDeadlineExceeded) after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // The value, or nullopt at once when `key` is not set.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  virtual void put(const std::string& key, const std::string& value) = 0;
};

// The PJRT C API's key-value callbacks over a KeyValueStore (passed as the
// callbacks' user argument); an exception becomes the plugin's error.
struct KeyValueCallbacks {
  PJRT_KeyValueGetCallback get;
  PJRT_KeyValueTryGetCallback try_get;
  PJRT_KeyValuePutCallback put;
};
KeyValueCallbacks key_value_callbacks();

class Client {
 public:
  // With `store`, the plugin gets key-value callbacks over it (kept alive as long
  // as the client): what a client spanning processes needs, with the options
  // node_id and num_nodes.
  Client(std::shared_ptr<const Api> api, const std::vector<ClientOption>& options,
         const std::vector<CompileOverride>& compile_overrides = {},
         std::shared_ptr<KeyValueStore> store = nullptr);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Api& api() const { return *api_; }
  const std::shared_ptr<const Api>& api_ptr() const { return api_; }
  std::string platform_name() const;
  std::string platform_version() const;
  // This process's devices (the addressable ones).
  const std::vector<Device>& devices() const { return devices_; }
  // Every process's devices (a client spanning processes has more than devices()).
  size_t global_device_count() const;
  // This process's index among the client's processes (0 when it spans one).
  int process_index() const;

  // Copies host data (dense row-major) to a new device buffer; the copy is
  // complete when this returns, so `data` may be reused at once.
  std::unique_ptr<Buffer> buffer_from_host(const void* data, ElementType type,
                                           const std::vector<int64_t>& dims,
                                           const Device& device) const;
  // Compiles StableHLO (MLIR text) for a single device, or with replica devices
  // (global device ids) a program of one replica per device: its collectives'
  // replica groups count replicas in that order.
  std::unique_ptr<LoadedExecutable> compile(const std::string& mlir,
                                            const std::vector<int64_t>& replica_devices = {}) const;
  std::unique_ptr<LoadedExecutable> deserialize(const std::string& bytes) const;
  // Bytes of the CompileOptionsProto used for every compile (part of cache keys).
  const std::string& compile_options() const { return compile_options_; }

 private:
  std::shared_ptr<const Api> api_;
  PJRT_Client* client_ = nullptr;
  std::vector<Device> devices_;
  std::vector<CompileOverride> compile_overrides_;
  std::string compile_options_;
  std::shared_ptr<KeyValueStore> store_;  // the plugin may call back into it at any time
};

}  // namespace torch_pjrt::runtime
