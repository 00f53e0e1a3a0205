#include "runtime/pjrt_runtime.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <sstream>

namespace torch_pjrt::runtime {
namespace {

template <typename T>
T make_args(size_t struct_size) {
  T args;
  std::memset(&args, 0, sizeof(T));
  args.struct_size = struct_size;
  return args;
}

#define ARGS(T) make_args<T>(T##_STRUCT_SIZE)

}  // namespace

// ---------------------------------------------------------------- Api

std::shared_ptr<const Api> Api::load(const std::string& path) {
  // RTLD_LOCAL: the plugin's own protobuf/abseil must not clash with libtorch's.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw PjrtError(ErrorCode::kNotFound, "cannot load PJRT plugin '" + path +
                                              "': " + (why ? why : "unknown dlopen error"));
  }
  using GetApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    throw PjrtError(ErrorCode::kNotFound,
                    "'" + path + "' is not a PJRT plugin: it exports no GetPjrtApi symbol");
  }
  const PJRT_Api* raw = get_api();
  if (raw == nullptr) {
    throw PjrtError(ErrorCode::kInternal, "GetPjrtApi() of '" + path + "' returned null");
  }
  if (raw->pjrt_api_version.major_version != PJRT_API_MAJOR) {
    std::ostringstream msg;
    msg << "PJRT plugin '" << path << "' has C API major version "
        << raw->pjrt_api_version.major_version << ", torch_pjrt was built for "
        << PJRT_API_MAJOR;
    throw PjrtError(ErrorCode::kFailedPrecondition, msg.str());
  }
  std::shared_ptr<const Api> api(new Api(raw, path));
  auto init = ARGS(PJRT_Plugin_Initialize_Args);
  TORCH_PJRT_CALL(*api, PJRT_Plugin_Initialize, &init, "PJRT_Plugin_Initialize");
  return api;
}

void Api::check_has(size_t offset, const char* name) const {
  if (offset >= api_->struct_size ||
      *reinterpret_cast<void* const*>(reinterpret_cast<const char*>(api_) + offset) == nullptr) {
    throw PjrtError(ErrorCode::kUnimplemented,
                    std::string("the PJRT plugin does not implement ") + name);
  }
}

namespace {
// The PJRT FFI extension's ABI (pjrt_c_api_ffi_extension.h, which no package ships; the
// layout is versioned by struct_size): the extension and its handler registration.
struct FfiRegisterHandlerArgs {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;
  const char* platform_name;
  size_t platform_name_size;
  unsigned traits;
};
struct FfiExtension {
  PJRT_Extension_Base base;
  void* type_id_register;
  void* user_data_add;
  PJRT_Error* (*register_handler)(FfiRegisterHandlerArgs*);
};
}  // namespace

bool Api::register_ffi_handler(const std::string& target, const std::string& platform, void* handler) const {
  for (const PJRT_Extension_Base* e = api_->extension_start; e != nullptr; e = e->next) {
    if (e->type != PJRT_Extension_Type_FFI) continue;
    if (e->struct_size < sizeof(FfiExtension) || handler == nullptr) return false;
    const auto* ffi = reinterpret_cast<const FfiExtension*>(e);
    if (ffi->register_handler == nullptr) return false;
    FfiRegisterHandlerArgs args{sizeof(FfiRegisterHandlerArgs), target.data(), target.size(), handler,
                                platform.data(), platform.size(), 0};
    throw_if_error(ffi->register_handler(&args), "PJRT FFI register_handler");
    return true;
  }
  return false;
}

void Api::throw_if_error(PJRT_Error* error, const char* what) const {
  if (error == nullptr) return;
  auto msg_args = ARGS(PJRT_Error_Message_Args);
  msg_args.error = error;
  api_->PJRT_Error_Message(&msg_args);
  std::string message(msg_args.message, msg_args.message_size);
  auto code_args = ARGS(PJRT_Error_GetCode_Args);
  code_args.error = error;
  int code = static_cast<int>(ErrorCode::kUnknown);
  if (api_->PJRT_Error_GetCode(&code_args) == nullptr) code = code_args.code;
  auto destroy = ARGS(PJRT_Error_Destroy_Args);
  destroy.error = error;
  api_->PJRT_Error_Destroy(&destroy);
  throw PjrtError(static_cast<ErrorCode>(code), std::string(what) + ": " + message);
}

namespace {
// "name=value" for each of a plugin's named values (int64 lists joined with '.').
std::vector<std::string> format_named_values(const PJRT_NamedValue* values, size_t count) {
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    const PJRT_NamedValue& v = values[i];
    std::ostringstream s;
    s << std::string(v.name, v.name_size) << "=";
    switch (v.type) {
      case PJRT_NamedValue_kString: s << std::string(v.string_value, v.value_size); break;
      case PJRT_NamedValue_kInt64: s << v.int64_value; break;
      case PJRT_NamedValue_kInt64List:
        for (size_t j = 0; j < v.value_size; ++j) s << (j ? "." : "") << v.int64_array_value[j];
        break;
      case PJRT_NamedValue_kFloat: s << v.float_value; break;
      case PJRT_NamedValue_kBool: s << (v.bool_value ? "true" : "false"); break;
      default: s << "?";
    }
    out.push_back(s.str());
  }
  return out;
}
}  // namespace

std::vector<std::string> Api::attributes() const {
  auto args = ARGS(PJRT_Plugin_Attributes_Args);
  TORCH_PJRT_CALL(*this, PJRT_Plugin_Attributes, &args, "PJRT_Plugin_Attributes");
  return format_named_values(args.attributes, args.num_attributes);
}

// ---------------------------------------------------------------- Event

Event::Event(std::shared_ptr<const Api> api, PJRT_Event* event)
    : api_(std::move(api)), event_(event) {}

Event::~Event() {
  if (event_ == nullptr) return;
  auto args = ARGS(PJRT_Event_Destroy_Args);
  args.event = event_;
  api_->raw()->PJRT_Event_Destroy(&args);
}

void Event::await() {
  if (event_ == nullptr) return;
  auto args = ARGS(PJRT_Event_Await_Args);
  args.event = event_;
  // Await returns the event's own error, if any.
  TORCH_PJRT_CALL(*api_, PJRT_Event_Await, &args, "asynchronous PJRT operation failed");
}

void Event::on_ready(std::function<void()> fn) {
  if (event_ == nullptr) {
    fn();
    return;
  }
  struct Pending {
    std::shared_ptr<const Api> api;
    std::function<void()> fn;
  };
  auto pending = std::make_unique<Pending>(Pending{api_, std::move(fn)});
  auto args = ARGS(PJRT_Event_OnReady_Args);
  args.event = event_;
  args.user_arg = pending.get();
  args.callback = [](PJRT_Error* error, void* user_arg) {
    std::unique_ptr<Pending> p(static_cast<Pending*>(user_arg));
    if (error != nullptr) {  // ours to destroy; whoever awaits the event sees the error
      auto destroy = make_args<PJRT_Error_Destroy_Args>(PJRT_Error_Destroy_Args_STRUCT_SIZE);
      destroy.error = error;
      p->api->raw()->PJRT_Error_Destroy(&destroy);
    }
    try {
      p->fn();
    } catch (...) {  // never across the plugin's C frames
    }
  };
  TORCH_PJRT_CALL(*api_, PJRT_Event_OnReady, &args, "PJRT_Event_OnReady");
  pending.release();  // the callback owns it now
}

bool Event::is_ready() const {
  if (event_ == nullptr) return true;
  auto args = ARGS(PJRT_Event_IsReady_Args);
  args.event = event_;
  TORCH_PJRT_CALL(*api_, PJRT_Event_IsReady, &args, "PJRT_Event_IsReady");
  return args.is_ready;
}

// ---------------------------------------------------------------- Buffer

Buffer::Buffer(std::shared_ptr<const Api> api, PJRT_Buffer* buffer)
    : api_(std::move(api)), buffer_(buffer) {}

void MemoryCounter::add(int64_t bytes) {
  int64_t now = allocated += bytes;
  int64_t prev = peak.load();
  while (now > prev && !peak.compare_exchange_weak(prev, now)) {
  }
  num_allocs++;
  bytes_allocated_total += bytes;
}

void MemoryCounter::sub(int64_t bytes) {
  allocated -= bytes;
  num_frees++;
  bytes_freed_total += bytes;
}

void Buffer::track(MemoryCounter* counter, int64_t bytes) {
  if (counter_) counter_->sub(bytes_);
  counter_ = counter;
  bytes_ = bytes;
  if (counter_) counter_->add(bytes_);
}

void Buffer::mark_donated() {
  if (counter_) counter_->sub(bytes_);
  counter_ = nullptr;
}

Buffer::~Buffer() {
  if (counter_) counter_->sub(bytes_);
  if (buffer_ == nullptr) return;
  auto args = ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = buffer_;
  PJRT_Error* err = api_->raw()->PJRT_Buffer_Destroy(&args);
  try {
    api_->throw_if_error(err, "PJRT_Buffer_Destroy");
  } catch (const PjrtError&) {
    // A destructor must not throw; the buffer is gone either way.
  }
}

std::vector<int64_t> Buffer::dims() const {
  auto args = ARGS(PJRT_Buffer_Dimensions_Args);
  args.buffer = buffer_;
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_Dimensions, &args, "PJRT_Buffer_Dimensions");
  return std::vector<int64_t>(args.dims, args.dims + args.num_dims);
}

ElementType Buffer::element_type() const {
  auto args = ARGS(PJRT_Buffer_ElementType_Args);
  args.buffer = buffer_;
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_ElementType, &args, "PJRT_Buffer_ElementType");
  return args.type;
}

size_t Buffer::on_device_size_bytes() const {
  auto args = ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args);
  args.buffer = buffer_;
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_OnDeviceSizeInBytes, &args,
                  "PJRT_Buffer_OnDeviceSizeInBytes");
  return args.on_device_size_in_bytes;
}

void Buffer::to_host(void* dst, size_t dst_size) const {
  // The plugin's own copy keeps the buffer's on-device layout, which on a host platform is
  // dense: the same bytes a memcpy of its memory gives, once the buffer is computed.
  if (api_->device_memory_is_host()) {
    await_ready();
    if (dst_size == 0) return;
    if (on_device_size_bytes() == dst_size) {
      std::memcpy(dst, reinterpret_cast<const void*>(unsafe_pointer()), dst_size);
      return;
    }
  }
  auto args = ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer_;
  args.dst = dst;
  args.dst_size = dst_size;
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_ToHostBuffer, &args, "PJRT_Buffer_ToHostBuffer");
  Event(api_, args.event).await();
}

uintptr_t Buffer::unsafe_pointer() const {
  auto args = ARGS(PJRT_Buffer_UnsafePointer_Args);
  args.buffer = buffer_;
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_UnsafePointer, &args, "PJRT_Buffer_UnsafePointer");
  return args.buffer_pointer;
}

void Buffer::await_ready() const {
  auto args = ARGS(PJRT_Buffer_ReadyEvent_Args);
  args.buffer = buffer_;
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_ReadyEvent, &args, "PJRT_Buffer_ReadyEvent");
  Event(api_, args.event).await();
}

std::unique_ptr<Buffer> Buffer::copy_to_device(const Device& dst) const {
  if (offsetof(PJRT_Api, PJRT_Buffer_CopyToDevice) >= api_->raw()->struct_size ||
      api_->raw()->PJRT_Buffer_CopyToDevice == nullptr) {
    throw PjrtError(ErrorCode::kUnimplemented, "PJRT_Buffer_CopyToDevice: not in this plugin's API");
  }
  auto args = ARGS(PJRT_Buffer_CopyToDevice_Args);
  args.buffer = buffer_;
  args.dst_device = dst.raw();
  TORCH_PJRT_CALL(*api_, PJRT_Buffer_CopyToDevice, &args, "PJRT_Buffer_CopyToDevice");
  return std::make_unique<Buffer>(api_, args.dst_buffer);
}

// ---------------------------------------------------------------- Device

Device::Device(std::shared_ptr<const Api> api, PJRT_Device* device)
    : api_(std::move(api)), device_(device) {}

namespace {
PJRT_DeviceDescription* description_of(const Api& api, PJRT_Device* device) {
  auto args = ARGS(PJRT_Device_GetDescription_Args);
  args.device = device;
  TORCH_PJRT_CALL(api, PJRT_Device_GetDescription, &args, "PJRT_Device_GetDescription");
  return args.device_description;
}
}  // namespace

int Device::id() const {
  auto args = ARGS(PJRT_DeviceDescription_Id_Args);
  args.device_description = description_of(*api_, device_);
  TORCH_PJRT_CALL(*api_, PJRT_DeviceDescription_Id, &args, "PJRT_DeviceDescription_Id");
  return args.id;
}

std::string Device::kind() const {
  auto args = ARGS(PJRT_DeviceDescription_Kind_Args);
  args.device_description = description_of(*api_, device_);
  TORCH_PJRT_CALL(*api_, PJRT_DeviceDescription_Kind, &args, "PJRT_DeviceDescription_Kind");
  return std::string(args.device_kind, args.device_kind_size);
}

std::vector<std::string> Device::attributes() const {
  auto args = ARGS(PJRT_DeviceDescription_Attributes_Args);
  args.device_description = description_of(*api_, device_);
  TORCH_PJRT_CALL(*api_, PJRT_DeviceDescription_Attributes, &args, "PJRT_DeviceDescription_Attributes");
  return format_named_values(args.attributes, args.num_attributes);
}

std::string Device::debug_string() const {
  auto args = ARGS(PJRT_DeviceDescription_DebugString_Args);
  args.device_description = description_of(*api_, device_);
  TORCH_PJRT_CALL(*api_, PJRT_DeviceDescription_DebugString, &args,
                  "PJRT_DeviceDescription_DebugString");
  return std::string(args.debug_string, args.debug_string_size);
}

bool Device::memory_stats(MemoryStats* out) const {
  if (offsetof(PJRT_Api, PJRT_Device_MemoryStats) >= api_->raw()->struct_size ||
      api_->raw()->PJRT_Device_MemoryStats == nullptr) {
    return false;
  }
  auto args = ARGS(PJRT_Device_MemoryStats_Args);
  args.device = device_;
  try {
    api_->throw_if_error(api_->raw()->PJRT_Device_MemoryStats(&args), "memory stats");
  } catch (const PjrtError&) {
    return false;  // UNIMPLEMENTED on the CPU plugin.
  }
  out->bytes_in_use = args.bytes_in_use;
  out->peak_bytes_in_use = args.peak_bytes_in_use_is_set ? args.peak_bytes_in_use : 0;
  out->bytes_limit = args.bytes_limit_is_set ? args.bytes_limit : 0;
  return true;
}

// ---------------------------------------------------------------- Executable

LoadedExecutable::LoadedExecutable(std::shared_ptr<const Api> api, PJRT_LoadedExecutable* exe)
    : api_(std::move(api)), exe_(exe) {
  auto get = ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe_;
  TORCH_PJRT_CALL(*api_, PJRT_LoadedExecutable_GetExecutable, &get,
                  "PJRT_LoadedExecutable_GetExecutable");
  auto n = ARGS(PJRT_Executable_NumOutputs_Args);
  n.executable = get.executable;
  PJRT_Error* err = api_->raw()->PJRT_Executable_NumOutputs(&n);
  auto destroy = ARGS(PJRT_Executable_Destroy_Args);
  destroy.executable = get.executable;
  api_->raw()->PJRT_Executable_Destroy(&destroy);
  api_->throw_if_error(err, "PJRT_Executable_NumOutputs");
  num_outputs_ = n.num_outputs;
}

LoadedExecutable::~LoadedExecutable() {
  auto args = ARGS(PJRT_LoadedExecutable_Destroy_Args);
  args.executable = exe_;
  PJRT_Error* err = api_->raw()->PJRT_LoadedExecutable_Destroy(&args);
  try {
    api_->throw_if_error(err, "PJRT_LoadedExecutable_Destroy");
  } catch (const PjrtError&) {
  }
}

std::vector<std::unique_ptr<Buffer>> LoadedExecutable::execute(const Device& device,
                                                               const std::vector<PJRT_Buffer*>& args,
                                                               std::unique_ptr<Event>* done,
                                                               const std::vector<int64_t>* keep,
                                                               int launch_id) const {
  auto options = ARGS(PJRT_ExecuteOptions);
  options.launch_id = launch_id;
  if (keep && !keep->empty()) {
    options.non_donatable_input_indices = keep->data();
    options.num_non_donatable_input_indices = keep->size();
  }
  std::vector<PJRT_Buffer*> outputs(num_outputs_, nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** output_list = outputs.data();
  auto exec = ARGS(PJRT_LoadedExecutable_Execute_Args);
  exec.executable = exe_;
  exec.options = &options;
  exec.argument_lists = &arg_list;
  exec.num_devices = 1;
  exec.num_args = args.size();
  exec.output_lists = &output_list;
  PJRT_Event* complete = nullptr;
  exec.device_complete_events = done ? &complete : nullptr;
  exec.execute_device = device.raw();
  TORCH_PJRT_CALL(*api_, PJRT_LoadedExecutable_Execute, &exec, "PJRT_LoadedExecutable_Execute");
  if (done && complete) *done = std::make_unique<Event>(api_, complete);
  std::vector<std::unique_ptr<Buffer>> result;
  result.reserve(outputs.size());
  for (PJRT_Buffer* b : outputs) result.push_back(std::make_unique<Buffer>(api_, b));
  return result;
}

std::string LoadedExecutable::serialize() const {
  auto get = ARGS(PJRT_LoadedExecutable_GetExecutable_Args);
  get.loaded_executable = exe_;
  TORCH_PJRT_CALL(*api_, PJRT_LoadedExecutable_GetExecutable, &get,
                  "PJRT_LoadedExecutable_GetExecutable");
  auto ser = ARGS(PJRT_Executable_Serialize_Args);
  ser.executable = get.executable;
  PJRT_Error* err = api_->raw()->PJRT_Executable_Serialize(&ser);
  std::string bytes;
  if (err == nullptr) {
    bytes.assign(ser.serialized_bytes, ser.serialized_bytes_size);
    if (ser.serialized_executable_deleter) ser.serialized_executable_deleter(ser.serialized_executable);
  }
  auto destroy = ARGS(PJRT_Executable_Destroy_Args);
  destroy.executable = get.executable;
  api_->raw()->PJRT_Executable_Destroy(&destroy);
  api_->throw_if_error(err, "PJRT_Executable_Serialize");
  return bytes;
}

// ---------------------------------------------------------------- Client

namespace {
// The callbacks run on plugin threads: no exception may cross back into the plugin.
PJRT_Error* callback_failure(PJRT_CallbackError* make_error, const std::exception& e) {
  const auto* pjrt = dynamic_cast<const PjrtError*>(&e);
  auto code = static_cast<PJRT_Error_Code>(pjrt ? static_cast<int>(pjrt->code()) : PJRT_Error_Code_INTERNAL);
  std::string message = std::string("key-value store: ") + e.what();
  return (*make_error)(code, message.data(), message.size());
}

char* copy_value(const std::string& value) {
  char* out = new char[value.size() + 1];
  std::memcpy(out, value.data(), value.size());
  out[value.size()] = '\0';
  return out;
}

void delete_value(char* value) { delete[] value; }

PJRT_Error* kv_get(PJRT_KeyValueGetCallback_Args* args) {
  try {
    auto* store = static_cast<KeyValueStore*>(args->user_arg);
    std::string value = store->get(std::string(args->key, args->key_size),
                                   std::chrono::milliseconds(args->timeout_in_ms));
    args->value = copy_value(value);
    args->value_size = value.size();
    args->value_deleter_callback = delete_value;
    return nullptr;
  } catch (const std::exception& e) {
    return callback_failure(args->callback_error, e);
  }
}

PJRT_Error* kv_try_get(PJRT_KeyValueTryGetCallback_Args* args) {
  try {
    auto* store = static_cast<KeyValueStore*>(args->user_arg);
    std::string key(args->key, args->key_size);
    std::optional<std::string> value = store->try_get(key);
    if (!value) throw PjrtError(ErrorCode::kNotFound, "no key " + key);
    args->value = copy_value(*value);
    args->value_size = value->size();
    args->value_deleter_callback = delete_value;
    return nullptr;
  } catch (const std::exception& e) {
    return callback_failure(args->callback_error, e);
  }
}

PJRT_Error* kv_put(PJRT_KeyValuePutCallback_Args* args) {
  try {
    static_cast<KeyValueStore*>(args->user_arg)->put(std::string(args->key, args->key_size),
                                                     std::string(args->value, args->value_size));
    return nullptr;
  } catch (const std::exception& e) {
    return callback_failure(args->callback_error, e);
  }
}
}  // namespace

KeyValueCallbacks key_value_callbacks() { return {kv_get, kv_try_get, kv_put}; }

Client::Client(std::shared_ptr<const Api> api, const std::vector<ClientOption>& options,
               const std::vector<CompileOverride>& compile_overrides, std::shared_ptr<KeyValueStore> store)
    : api_(std::move(api)),
      compile_overrides_(compile_overrides),
      compile_options_(encode_compile_options(compile_overrides)),
      store_(std::move(store)) {
  std::vector<PJRT_NamedValue> named(options.size());
  for (size_t i = 0; i < options.size(); ++i) {
    std::memset(&named[i], 0, sizeof(PJRT_NamedValue));
    named[i].struct_size = PJRT_NamedValue_STRUCT_SIZE;
    named[i].name = options[i].name.c_str();
    named[i].name_size = options[i].name.size();
    named[i].type = PJRT_NamedValue_kInt64;  // the CPU plugin reads int64 with std::get
    named[i].int64_value = options[i].value;
    named[i].value_size = 1;
  }
  auto args = ARGS(PJRT_Client_Create_Args);
  args.create_options = named.data();
  args.num_options = named.size();
  if (store_) {
    const KeyValueCallbacks callbacks = key_value_callbacks();
    args.kv_get_callback = callbacks.get;
    args.kv_get_user_arg = store_.get();
    args.kv_try_get_callback = callbacks.try_get;
    args.kv_try_get_user_arg = store_.get();
    args.kv_put_callback = callbacks.put;
    args.kv_put_user_arg = store_.get();
  }
  TORCH_PJRT_CALL(*api_, PJRT_Client_Create, &args, "PJRT_Client_Create");
  client_ = args.client;
  api_->note_platform(platform_name());

  auto devs = ARGS(PJRT_Client_AddressableDevices_Args);
  devs.client = client_;
  TORCH_PJRT_CALL(*api_, PJRT_Client_AddressableDevices, &devs, "PJRT_Client_AddressableDevices");
  for (size_t i = 0; i < devs.num_addressable_devices; ++i) {
    devices_.emplace_back(api_, devs.addressable_devices[i]);
  }
}

Client::~Client() {
  auto args = ARGS(PJRT_Client_Destroy_Args);
  args.client = client_;
  PJRT_Error* err = api_->raw()->PJRT_Client_Destroy(&args);
  try {
    api_->throw_if_error(err, "PJRT_Client_Destroy");
  } catch (const PjrtError&) {
  }
}

size_t Client::global_device_count() const {
  auto args = ARGS(PJRT_Client_Devices_Args);
  args.client = client_;
  TORCH_PJRT_CALL(*api_, PJRT_Client_Devices, &args, "PJRT_Client_Devices");
  return args.num_devices;
}

int Client::process_index() const {
  auto args = ARGS(PJRT_Client_ProcessIndex_Args);
  args.client = client_;
  TORCH_PJRT_CALL(*api_, PJRT_Client_ProcessIndex, &args, "PJRT_Client_ProcessIndex");
  return args.process_index;
}

void Api::note_platform(const std::string& platform_name) const {
  // Decided once per plugin: a host platform whose table has PJRT_Buffer_UnsafePointer.
  const bool has_pointer = offsetof(PJRT_Api, PJRT_Buffer_UnsafePointer) < api_->struct_size &&
                           api_->PJRT_Buffer_UnsafePointer != nullptr;
  if ((platform_name == "cpu" || platform_name == "host") && has_pointer) {
    device_memory_is_host_.store(true, std::memory_order_relaxed);
  }
}

std::string Client::platform_name() const {
  auto args = ARGS(PJRT_Client_PlatformName_Args);
  args.client = client_;
  TORCH_PJRT_CALL(*api_, PJRT_Client_PlatformName, &args, "PJRT_Client_PlatformName");
  return std::string(args.platform_name, args.platform_name_size);
}

std::string Client::platform_version() const {
  auto args = ARGS(PJRT_Client_PlatformVersion_Args);
  args.client = client_;
  TORCH_PJRT_CALL(*api_, PJRT_Client_PlatformVersion, &args, "PJRT_Client_PlatformVersion");
  return std::string(args.platform_version, args.platform_version_size);
}

std::unique_ptr<Buffer> Client::buffer_from_host(const void* data, ElementType type,
                                                 const std::vector<int64_t>& dims,
                                                 const Device& device) const {
  auto args = ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = client_;
  args.data = data;
  args.type = type;
  args.dims = dims.data();
  args.num_dims = dims.size();
  // The call copies before returning, so callers may free `data` right away.
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = device.raw();
  TORCH_PJRT_CALL(*api_, PJRT_Client_BufferFromHostBuffer, &args,
                  "PJRT_Client_BufferFromHostBuffer");
  Event done(api_, args.done_with_host_buffer);
  auto buffer = std::make_unique<Buffer>(api_, args.buffer);
  done.await();
  return buffer;
}

namespace {
// Protocol buffer wire format, just what CompileOptionsProto needs.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire_type) { put_varint(out, (field << 3) | wire_type); }
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// xla.OptionOverrideProto: string_field (1), bool_field (2), int_field (3), double_field (4).
std::string encode_override_value(const CompileOverride& o) {
  std::string v;
  if (const bool* b = std::get_if<bool>(&o.value)) {
    put_tag(v, 2, 0);
    put_varint(v, *b ? 1 : 0);
  } else if (const int64_t* i = std::get_if<int64_t>(&o.value)) {
    put_tag(v, 3, 0);
    put_varint(v, static_cast<uint64_t>(*i));
  } else if (const double* d = std::get_if<double>(&o.value)) {
    put_tag(v, 4, 1);
    uint64_t bits;
    std::memcpy(&bits, d, sizeof(bits));
    for (int k = 0; k < 8; ++k) v.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
  } else {
    put_bytes(v, 1, std::get<std::string>(o.value));
  }
  return v;
}
}  // namespace

std::string encode_compile_options(const std::vector<CompileOverride>& overrides,
                                   const std::vector<int64_t>& replica_devices) {
  std::string out;
  // executable_build_options (3) { num_replicas (4), num_partitions (5) = 1,
  //   device_assignment (9) { replica_count (1), computation_count (2) = 1,
  //     computation_devices (3) { replica_device_ids (1), packed } } }.
  const bool replicated = !replica_devices.empty();
  std::string build;
  put_tag(build, 4, 0);
  put_varint(build, replicated ? replica_devices.size() : 1);
  put_tag(build, 5, 0);
  put_varint(build, 1);
  if (replicated) {
    std::string ids;
    for (int64_t id : replica_devices) put_varint(ids, static_cast<uint64_t>(id));
    std::string computation;
    put_bytes(computation, 1, ids);
    std::string assignment;
    put_tag(assignment, 1, 0);
    put_varint(assignment, replica_devices.size());
    put_tag(assignment, 2, 0);
    put_varint(assignment, 1);
    put_bytes(assignment, 3, computation);
    put_bytes(build, 9, assignment);
  }
  put_bytes(out, 3, build);
  // compile_portable_executable (4) = true: the executable runs on whichever
  // device Execute names (a replicated one on the devices assigned to it).
  if (!replicated) {
    put_tag(out, 4, 0);
    put_varint(out, 1);
  }
  // env_option_overrides (7): map<string, OptionOverrideProto>, one entry
  // message { key (1), value (2) } each.
  for (const auto& o : overrides) {
    std::string entry;
    put_bytes(entry, 1, o.name);
    put_bytes(entry, 2, encode_override_value(o));
    put_bytes(out, 7, entry);
  }
  return out;
}

std::unique_ptr<LoadedExecutable> Client::compile(const std::string& mlir,
                                                  const std::vector<int64_t>& replica_devices) const {
  auto program = ARGS(PJRT_Program);
  program.code = const_cast<char*>(mlir.data());
  program.code_size = mlir.size();
  static const char kFormat[] = "mlir";
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  auto args = ARGS(PJRT_Client_Compile_Args);
  args.client = client_;
  args.program = &program;
  const std::string replicated =
      replica_devices.empty() ? std::string() : encode_compile_options(compile_overrides_, replica_devices);
  const std::string& options = replica_devices.empty() ? compile_options() : replicated;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  TORCH_PJRT_CALL(*api_, PJRT_Client_Compile, &args, "PJRT_Client_Compile");
  return std::make_unique<LoadedExecutable>(api_, args.executable);
}

std::unique_ptr<LoadedExecutable> Client::deserialize(const std::string& bytes) const {
  auto args = ARGS(PJRT_Executable_DeserializeAndLoad_Args);
  args.client = client_;
  args.serialized_executable = bytes.data();
  args.serialized_executable_size = bytes.size();
  TORCH_PJRT_CALL(*api_, PJRT_Executable_DeserializeAndLoad, &args,
                  "PJRT_Executable_DeserializeAndLoad");
  return std::make_unique<LoadedExecutable>(api_, args.loaded_executable);
}

}  // namespace torch_pjrt::runtime
