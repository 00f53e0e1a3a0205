#include "executor/executor.h"
#include "executor/trace.h"
#include "ir/builder.h"
#include "kernels/host_kernels.h"
#include "lowering/nn.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <unordered_set>

namespace torch_pjrt::executor {

void Metrics::reset() {
  compiles = 0;
  compile_ns = 0;
  memory_cache_hits = 0;
  memory_cache_evictions = 0;
  disk_cache_hits = 0;
  disk_cache_rejects = 0;
  disk_cache_stores = 0;
  disk_cache_waits = 0;
  disk_cache_wait_ns = 0;
  disk_cache_stale_locks = 0;
  disk_cache_lock_timeouts = 0;
  disk_cache_evictions = 0;
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
  collectives_in_programs = 0;
  std::lock_guard<std::mutex> lock(mu);
  fallbacks.clear();
  compiles_by_op.clear();
  flush_reasons.clear();
}

Metrics& metrics() {
  static Metrics m;
  return m;
}

namespace {
BlockingScope& blocking_scope() {
  static BlockingScope scope;
  return scope;
}
}  // namespace

void set_blocking_scope(BlockingScope scope) { blocking_scope() = std::move(scope); }

std::shared_ptr<void> enter_blocking_scope() { return blocking_scope() ? blocking_scope()() : nullptr; }

runtime::MemoryCounter& memory_counter(int device) {
  constexpr int kMaxDevices = 64;
  static auto* counters = new runtime::MemoryCounter[kMaxDevices];  // leaked: buffers outlive statics
  if (device < 0 || device >= kMaxDevices) device = 0;
  return counters[device];
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

DiskCache::DiskCache(std::string dir, DiskCachePolicy policy) : dir_(std::move(dir)), policy_(policy) {}

std::string DiskCache::path_for(const std::string& key) const {
  return dir_ + "/" + hex64(ir::fnv1a(key)) + ".pjrtexe";
}

namespace {
std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

double seconds_since_modified(const struct stat& st) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) + (now.tv_nsec - st.st_mtim.tv_nsec) * 1e-9;
}

constexpr const char* kEntrySuffix = ".pjrtexe";

struct UsedEntries {
  std::mutex mu;
  std::vector<std::string> paths;
  std::unordered_set<std::string> seen;
};
UsedEntries& used_entries() {
  static UsedEntries used;
  return used;
}
void note_used(const std::string& path) {
  auto& used = used_entries();
  std::lock_guard<std::mutex> lock(used.mu);
  if (used.seen.insert(path).second) used.paths.push_back(path);
}
}  // namespace

std::vector<std::string> disk_entries_used(size_t from) {
  auto& used = used_entries();
  std::lock_guard<std::mutex> lock(used.mu);
  if (from >= used.paths.size()) return {};
  return {used.paths.begin() + static_cast<std::ptrdiff_t>(from), used.paths.end()};
}

bool DiskCache::load(const std::string& key, std::string* payload, bool count_rejects) const {
  if (!enabled()) return false;
  const std::string path = path_for(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Layout: magic | fnv(key) | payload size | fnv(payload) | key size | key | payload.
  const size_t header = sizeof(kMagic) + 8 * 4;
  auto reject = [&] {
    if (count_rejects) metrics().disk_cache_rejects++;
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
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // its time of last use, for eviction
  note_used(path);
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
  // Unique temp name per host, process and call, then an atomic rename: readers in
  // other processes see either no entry or a whole one.
  static std::atomic<uint64_t> seq{0};
  std::string final_path = path_for(key);
  std::string tmp = final_path + ".tmp." + host_name() + "." + std::to_string(::getpid()) + "." +
                    std::to_string(seq++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;  // a read-only cache dir only costs warm starts
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  if (off != data.size() || ::rename(tmp.c_str(), final_path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  metrics().disk_cache_stores++;
  note_used(final_path);
  if (policy_.max_bytes <= 0) return;
  bool over;
  {
    std::lock_guard<std::mutex> lock(usage_->mu);
    if (usage_->bytes >= 0) usage_->bytes += static_cast<int64_t>(data.size());
    over = usage_->bytes < 0 || usage_->bytes > policy_.max_bytes;
  }
  if (over) evict_to_bound();
}

void DiskCache::evict_to_bound() const {
  if (!enabled() || policy_.max_bytes <= 0) return;
  std::lock_guard<std::mutex> lock(usage_->mu);
  struct Item {
    timespec used;
    int64_t bytes;
    std::string path;
  };
  std::vector<Item> items;
  int64_t total = 0;
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      std::string path = dir_ + "/" + name;
      struct stat st{};
      if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      const bool entry = name.size() > std::strlen(kEntrySuffix) &&
                         name.compare(name.size() - std::strlen(kEntrySuffix), std::string::npos, kEntrySuffix) == 0;
      if (!entry) {
        // A temp file a dead writer left behind (a live one renames it within seconds).
        if (name.find(".pjrtexe.tmp.") != std::string::npos && seconds_since_modified(st) > 3600) {
          ::unlink(path.c_str());
        }
        continue;
      }
      items.push_back({st.st_mtim, static_cast<int64_t>(st.st_size), std::move(path)});
      total += st.st_size;
    }
    ::closedir(d);
  }
  if (total > policy_.max_bytes) {
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.used.tv_sec != b.used.tv_sec ? a.used.tv_sec < b.used.tv_sec : a.used.tv_nsec < b.used.tv_nsec;
    });
    // Down to 90% of the bound, so that the next few writes do not each rescan.
    const int64_t target = policy_.max_bytes - policy_.max_bytes / 10;
    for (const Item& item : items) {
      if (total <= target) break;
      if (::unlink(item.path.c_str()) == 0) {
        total -= item.bytes;
        metrics().disk_cache_evictions++;
      }
    }
  }
  usage_->bytes = total;
}

DiskCache::CompileLock::CompileLock(std::string path) : path_(std::move(path)) {
  heartbeat_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_.wait_for(lock, std::chrono::seconds(2), [this] { return stopping_; })) {
      ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
    }
  });
}

DiskCache::CompileLock::~CompileLock() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  heartbeat_.join();
  ::unlink(path_.c_str());
}

bool DiskCache::take_over_if_stale(const std::string& lock_path) const {
  struct stat st{};
  if (::stat(lock_path.c_str(), &st) != 0) return true;  // released meanwhile
  std::ifstream in(lock_path);
  std::string host;
  long pid = 0;
  in >> host >> pid;
  bool dead = false;
  if (in && host == host_name() && pid > 0) {
    dead = ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;  // its holder on this host is gone
  }
  if (!dead && seconds_since_modified(st) < policy_.stale_seconds) return false;
  // Renamed aside before removal, so that of several processes seeing the same stale
  // lock only one removes it (a fresh lock taken meanwhile is not touched).
  static std::atomic<uint64_t> seq{0};
  std::string aside = lock_path + ".stale." + host_name() + "." + std::to_string(::getpid()) + "." +
                      std::to_string(seq++);
  if (::rename(lock_path.c_str(), aside.c_str()) == 0) {
    ::unlink(aside.c_str());
    metrics().disk_cache_stale_locks++;
  }
  return true;
}

bool DiskCache::load_or_lock(const std::string& key, std::string* payload,
                             std::unique_ptr<CompileLock>* lock) const {
  lock->reset();
  if (!enabled()) return false;
  ::mkdir(dir_.c_str(), 0755);
  const std::string lock_path = path_for(key) + ".lock";
  const auto start = std::chrono::steady_clock::now();
  bool waited = false;
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto note_wait = [&] {
    if (!waited) return;
    metrics().disk_cache_waits++;
    metrics().disk_cache_wait_ns += static_cast<int64_t>(elapsed() * 1e9);
  };
  int pause_ms = 5;
  for (bool first = true;; first = false) {
    if (load(key, payload, first)) {
      note_wait();
      return true;
    }
    int fd = ::open(lock_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      std::string owner = host_name() + " " + std::to_string(::getpid()) + "\n";
      ssize_t written = ::write(fd, owner.data(), owner.size());
      (void)written;
      ::close(fd);
      *lock = std::make_unique<CompileLock>(lock_path);
      // The entry may have landed between the load above and taking the lock.
      if (load(key, payload, false)) {
        lock->reset();
        note_wait();
        return true;
      }
      note_wait();
      return false;
    }
    if (errno != EEXIST) return false;  // an unwritable directory: compile without a lock
    if (take_over_if_stale(lock_path)) continue;
    if (elapsed() > policy_.wait_seconds) {
      metrics().disk_cache_lock_timeouts++;
      note_wait();
      return false;
    }
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    pause_ms = std::min(pause_ms * 2, 200);
  }
}

// ---------------------------------------------------------------- runtime

Runtime::Runtime(const std::string& plugin_path, const std::vector<runtime::ClientOption>& options,
                 std::string cache_dir, const std::vector<runtime::CompileOverride>& compile_overrides,
                 DiskCachePolicy cache_policy, std::shared_ptr<runtime::KeyValueStore> store)
    : disk_(std::move(cache_dir), cache_policy) {
  auto api = runtime::Api::load(plugin_path);
  client_ = std::make_unique<runtime::Client>(api, options, compile_overrides, std::move(store));
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
  // Registered at once, before any executable loads from the disk tier: one that calls a
  // host kernel finds it in a process that has not lowered a call yet.
  const char* host_kernels = std::getenv("TORCH_PJRT_HOST_KERNELS");
  if ((host_kernels == nullptr || std::string(host_kernels) != "0") && client_->platform_name() == "cpu") {
    try {
      // All or none: a program's lowering assumes every host kernel once Runtime::host_kernels() holds.
      const std::vector<kernels::HostKernel> handlers = kernels::host_kernel_handlers();
      host_kernels_registered_ = !handlers.empty();
      for (const kernels::HostKernel& k : handlers) {
        host_kernels_registered_ = api->register_ffi_handler(k.target, "Host", k.handler) && host_kernels_registered_;
      }
    } catch (const std::exception&) {
      host_kernels_registered_ = false;
    }
  }
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
  // Programs over replica devices stay (see Entry): a rank thread may be launching one.
  for (auto it = memory_.begin(); it != memory_.end();) it = it->second.replicated ? std::next(it) : memory_.erase(it);
}

void Runtime::set_memory_cache_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = std::max<size_t>(1, capacity);
  evict_locked();
}

void Runtime::evict_locked() {
  while (recency_.size() > capacity_) {
    const ir::Key* oldest = recency_.back();
    recency_.pop_back();
    memory_.erase(*oldest);
    metrics().memory_cache_evictions++;
  }
}

bool Runtime::host_kernels() {
  std::call_once(host_kernels_once_, [this] {
    if (!host_kernels_registered_) return;
    // Some plugins take the registration yet compile without the handler: a probe compile decides.
    try {
      ir::Graph g;
      ir::Builder b(g);
      lowering::PagedAttentionParams params;
      params.host_kernel = true;
      ir::Value out = lowering::paged_attention(
          b, g.param(ir::Type{ir::DType::F32, {1, 1, 1, 1}}), g.param(ir::Type{ir::DType::F32, {2, 1, 1, 1, 1}}),
          g.param(ir::Type{ir::DType::S32, {1, 1}}), g.param(ir::Type{ir::DType::S32, {1, 1}}), params);
      g.set_outputs({out});
      client_->compile(g.to_mlir());
      host_kernels_ = true;
    } catch (const std::exception&) {
      host_kernels_ = false;  // the StableHLO lowerings serve instead
    }
  });
  return host_kernels_;
}

std::shared_ptr<runtime::LoadedExecutable> Runtime::get_executable(const ir::Key& cache_key,
                                                                   const std::function<std::string()>& print,
                                                                   const std::function<std::string()>& op,
                                                                   const std::vector<int64_t>& replica_devices) {
  ir::Key found_by = cache_key;
  for (int64_t d : replica_devices) found_by.mix(0xDE000000ULL + static_cast<uint64_t>(d));
  {
    // Threads asking for a program another thread is compiling wait for it and share its
    // executable: the replicas of a program over several devices (rank threads) must be
    // parts of one executable for XLA's CPU collectives to join them.
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = memory_.find(found_by);
      if (it != memory_.end()) {
        metrics().memory_cache_hits++;
        if (!it->second.replicated) recency_.splice(recency_.begin(), recency_, it->second.recency);
        return it->second.exe;
      }
      if (!compiling_.count(found_by)) break;
      compiled_.wait(lock);
    }
    compiling_.insert(found_by);
  }
  struct Done {  // however this call ends, its waiters look again
    Runtime* rt;
    const ir::Key& key;
    ~Done() {
      std::lock_guard<std::mutex> lock(rt->mu_);
      rt->compiling_.erase(key);
      rt->compiled_.notify_all();
    }
  } done{this, found_by};
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
  if (!replica_devices.empty()) {  // the same program over other devices is another executable
    key += "\n// replica devices:";
    for (int64_t d : replica_devices) key += " " + std::to_string(d);
  }
  std::string payload;
  // On a miss this process takes the key's lock and compiles; another process
  // compiling the same program meanwhile is waited for, and its entry read.
  std::unique_ptr<DiskCache::CompileLock> compiling;
  if (disk_.load_or_lock(key, &payload, &compiling)) {
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
    exe = client_->compile(mlir, replica_devices);
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
    compiling.reset();  // the entry is written (or cannot be): waiters go on
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = memory_.try_emplace(found_by, Entry{exe, {}, !replica_devices.empty()});
  if (inserted && !it->second.replicated) {
    recency_.push_front(&it->first);
    it->second.recency = recency_.begin();
    evict_locked();
  }
  return exe;
}

}  // namespace torch_pjrt::executor
