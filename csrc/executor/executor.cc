#include "executor/executor.h"
#include "executor/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace torch_pjrt::executor {

void Metrics::reset() {
  compiles = 0;
  compile_ns = 0;
  memory_cache_hits = 0;
  memory_cache_evictions = 0;
  disk_cache_hits = 0;
  disk_cache_rejects = 0;
  executions = 0;
  host_syncs = 0;
  host_to_device_bytes = 0;
  device_to_host_bytes = 0;
  ops_recorded = 0;
  graphs = 0;
  graph_ops = 0;
  max_graph_ops = 0;
  graph_outputs = 0;
  donated_buffers = 0;
  dropped_values = 0;
  compiled_runs = 0;
  std::lock_guard<std::mutex> lock(mu);
  fallbacks.clear();
  compiles_by_op.clear();
  flush_reasons.clear();
}

Metrics& metrics() {
  static Metrics m;
  return m;
}

runtime::MemoryCounter& memory_counter(int device) {
  constexpr int kMaxDevices = 64;
  static auto* counters = new runtime::MemoryCounter[kMaxDevices];  // leaked: buffers outlive statics
  if (device < 0 || device >= kMaxDevices) device = 0;
  return counters[device];
}

runtime::ElementType to_pjrt(ir::DType d) {
  switch (d) {
    case ir::DType::Pred: return PJRT_Buffer_Type_PRED;
    case ir::DType::S8: return PJRT_Buffer_Type_S8;
    case ir::DType::S16: return PJRT_Buffer_Type_S16;
    case ir::DType::S32: return PJRT_Buffer_Type_S32;
    case ir::DType::S64: return PJRT_Buffer_Type_S64;
    case ir::DType::U8: return PJRT_Buffer_Type_U8;
    case ir::DType::U16: return PJRT_Buffer_Type_U16;
    case ir::DType::U32: return PJRT_Buffer_Type_U32;
    case ir::DType::U64: return PJRT_Buffer_Type_U64;
    case ir::DType::F16: return PJRT_Buffer_Type_F16;
    case ir::DType::BF16: return PJRT_Buffer_Type_BF16;
    case ir::DType::F32: return PJRT_Buffer_Type_F32;
    case ir::DType::F64: return PJRT_Buffer_Type_F64;
    case ir::DType::C64: return PJRT_Buffer_Type_C64;
    case ir::DType::C128: return PJRT_Buffer_Type_C128;
  }
  return PJRT_Buffer_Type_INVALID;
}

ir::DType from_pjrt(runtime::ElementType t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: return ir::DType::Pred;
    case PJRT_Buffer_Type_S8: return ir::DType::S8;
    case PJRT_Buffer_Type_S16: return ir::DType::S16;
    case PJRT_Buffer_Type_S32: return ir::DType::S32;
    case PJRT_Buffer_Type_S64: return ir::DType::S64;
    case PJRT_Buffer_Type_U8: return ir::DType::U8;
    case PJRT_Buffer_Type_U16: return ir::DType::U16;
    case PJRT_Buffer_Type_U32: return ir::DType::U32;
    case PJRT_Buffer_Type_U64: return ir::DType::U64;
    case PJRT_Buffer_Type_F16: return ir::DType::F16;
    case PJRT_Buffer_Type_BF16: return ir::DType::BF16;
    case PJRT_Buffer_Type_F32: return ir::DType::F32;
    case PJRT_Buffer_Type_F64: return ir::DType::F64;
    case PJRT_Buffer_Type_C64: return ir::DType::C64;
    case PJRT_Buffer_Type_C128: return ir::DType::C128;
    default: throw runtime::PjrtError(runtime::ErrorCode::kInvalidArgument, "unsupported PJRT type");
  }
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string host_cpu_features() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) return line;
  }
  return "unknown-cpu";
}

// ---------------------------------------------------------------- disk cache

namespace {
constexpr char kMagic[8] = {'T', 'P', 'J', 'R', 'T', 'C', '0', '1'};

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
}  // namespace

std::string DiskCache::path_for(const std::string& key) const {
  return dir_ + "/" + hex64(ir::fnv1a(key)) + ".pjrtexe";
}

bool DiskCache::load(const std::string& key, std::string* payload) const {
  if (!enabled()) return false;
  std::ifstream in(path_for(key), std::ios::binary);
  if (!in) return false;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Layout: magic | fnv(key) | payload size | fnv(payload) | key size | key | payload.
  const size_t header = sizeof(kMagic) + 8 * 4;
  auto reject = [&] {
    metrics().disk_cache_rejects++;
    return false;
  };
  if (data.size() < header || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) return reject();
  size_t at = sizeof(kMagic);
  uint64_t key_hash = get_u64(data, at);
  uint64_t size = get_u64(data, at + 8);
  uint64_t sum = get_u64(data, at + 16);
  uint64_t key_size = get_u64(data, at + 24);
  if (key_hash != ir::fnv1a(key) || key_size != key.size() || data.size() != header + key_size + size)
    return reject();
  if (data.compare(header, key_size, key) != 0) return reject();
  payload->assign(data, header + key_size, size);
  if (ir::fnv1a(*payload) != sum) return reject();
  return true;
}

void DiskCache::store(const std::string& key, const std::string& payload) const {
  if (!enabled()) return;
  ::mkdir(dir_.c_str(), 0755);
  std::string data(kMagic, sizeof(kMagic));
  put_u64(data, ir::fnv1a(key));
  put_u64(data, payload.size());
  put_u64(data, ir::fnv1a(payload));
  put_u64(data, key.size());
  data += key;
  data += payload;
  // Unique temp name per process and call, then an atomic rename: readers in
  // other processes see either no entry or a whole one.
  static std::atomic<uint64_t> seq{0};
  std::string final_path = path_for(key);
  std::string tmp = final_path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(seq++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;  // a read-only cache dir only costs warm starts
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  if (off != data.size() || ::rename(tmp.c_str(), final_path.c_str()) != 0) ::unlink(tmp.c_str());
}

// ---------------------------------------------------------------- runtime

Runtime::Runtime(const std::string& plugin_path, const std::vector<runtime::ClientOption>& options,
                 std::string cache_dir, const std::vector<runtime::CompileOverride>& compile_overrides)
    : disk_(std::move(cache_dir)) {
  auto api = runtime::Api::load(plugin_path);
  client_ = std::make_unique<runtime::Client>(api, options, compile_overrides);
  std::ostringstream id;
  id << "plugin=" << plugin_path;
  // The build: a reinstalled or rebuilt plugin at the same path is another plugin.
  struct stat st{};
  if (::stat(plugin_path.c_str(), &st) == 0) {
    id << ";size=" << st.st_size << ";mtime=" << st.st_mtim.tv_sec << "." << st.st_mtim.tv_nsec;
  }
  id << ";api=" << api->major_version() << "." << api->minor_version()
     << ";platform=" << client_->platform_name() << " " << client_->platform_version() << ";";
  for (const auto& a : api->attributes()) id << a << ";";
  id << "options=" << hex64(ir::fnv1a(client_->compile_options())) << ";";
  const char* xla_flags = std::getenv("XLA_FLAGS");
  id << "xla_flags=" << (xla_flags ? xla_flags : "") << ";";
  id << "cpu=" << hex64(ir::fnv1a(host_cpu_features()));
  identity_ = id.str();
}

Runtime::~Runtime() {
  // Executables must go before the client.
  std::lock_guard<std::mutex> lock(mu_);
  recency_.clear();
  memory_.clear();
}

const runtime::Device& Runtime::device(int index) const {
  if (index < 0 || index >= device_count()) {
    throw runtime::PjrtError(runtime::ErrorCode::kInvalidArgument,
                             "pjrt device index " + std::to_string(index) + " out of range (have " +
                                 std::to_string(device_count()) + ")");
  }
  return client_->devices()[index];
}

size_t Runtime::memory_cache_size() {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_.size();
}

void Runtime::clear_memory_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  recency_.clear();
  memory_.clear();
}

void Runtime::set_memory_cache_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = std::max<size_t>(1, capacity);
  evict_locked();
}

void Runtime::evict_locked() {
  while (memory_.size() > capacity_) {
    const ir::Key* oldest = recency_.back();
    recency_.pop_back();
    memory_.erase(*oldest);
    metrics().memory_cache_evictions++;
  }
}

std::shared_ptr<runtime::LoadedExecutable> Runtime::get_executable(const ir::Key& cache_key,
                                                                   const std::function<std::string()>& print,
                                                                   const std::function<std::string()>& op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(cache_key);
    if (it != memory_.end()) {
      metrics().memory_cache_hits++;
      recency_.splice(recency_.begin(), recency_, it->second.recency);
      return it->second.exe;
    }
  }
  std::shared_ptr<runtime::LoadedExecutable> exe;
  std::string mlir = print();
  if (const char* dump = std::getenv("TORCH_PJRT_DUMP_DIR"); dump && *dump) {
    // Every program text printed (a memory-tier miss), for reading and profiling.
    static std::atomic<int> dumped{0};
    std::ofstream(std::string(dump) + "/" + std::to_string(dumped++) + "-" +
                  std::to_string(std::hash<std::string>()(mlir) & 0xFFFFFF) + ".mlir")
        << "// " << op() << "\n" << mlir;
  }
  std::string key = identity_ + "\n" + mlir;
  std::string payload;
  if (disk_.load(key, &payload)) {
    try {
      exe = client_->deserialize(payload);
      metrics().disk_cache_hits++;
    } catch (const runtime::PjrtError&) {
      metrics().disk_cache_rejects++;
      exe.reset();
    }
  }
  if (!exe) {
    auto start = std::chrono::steady_clock::now();
    TraceScope traced(TraceKind::Compile, "compile", 0);
    exe = client_->compile(mlir);
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - start).count();
    metrics().compiles++;
    metrics().compile_ns += ns;
    {
      std::lock_guard<std::mutex> lock(metrics().mu);
      metrics().compiles_by_op[op()]++;
    }
    if (disk_.enabled()) {
      try {
        disk_.store(key, exe->serialize());
      } catch (const runtime::PjrtError&) {
        // Plugins without serialization still work, just without a warm start.
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = memory_.try_emplace(cache_key, Entry{exe, {}});
  if (inserted) {
    recency_.push_front(&it->first);
    it->second.recency = recency_.begin();
    evict_locked();
  }
  return exe;
}

}  // namespace torch_pjrt::executor
