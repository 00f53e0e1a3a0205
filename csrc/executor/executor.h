// Compile cache (memory, then disk), execution, metrics. No torch headers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"
#include "runtime/pjrt_runtime.h"

namespace torch_pjrt::executor {

struct Metrics {
  std::atomic<int64_t> compiles{0};
  std::atomic<int64_t> compile_ns{0};
  std::atomic<int64_t> memory_cache_hits{0};
  std::atomic<int64_t> memory_cache_evictions{0};
  std::atomic<int64_t> disk_cache_hits{0};
  std::atomic<int64_t> disk_cache_rejects{0};  // corrupt, truncated or mismatched entries
  // The disk tier shared by processes (a fleet): entries written, waits for another
  // process's compile of the same program (and their time), locks taken over from a
  // compiler that died, waits given up (compiled here instead), entries evicted.
  std::atomic<int64_t> disk_cache_stores{0};
  std::atomic<int64_t> disk_cache_waits{0};
  std::atomic<int64_t> disk_cache_wait_ns{0};
  std::atomic<int64_t> disk_cache_stale_locks{0};
  std::atomic<int64_t> disk_cache_lock_timeouts{0};
  std::atomic<int64_t> disk_cache_evictions{0};
  std::atomic<int64_t> executions{0};
  std::atomic<int64_t> host_syncs{0};
  std::atomic<int64_t> host_to_device_bytes{0};
  std::atomic<int64_t> device_to_host_bytes{0};
  std::atomic<int64_t> device_to_device_bytes{0};  // copies between two devices of the client
  // Deferred execution: graphs run, the ops they held, their outputs, buffers
  // donated to them, and pending values dropped because nothing held them.
  std::atomic<int64_t> ops_recorded{0};
  std::atomic<int64_t> graphs{0};
  std::atomic<int64_t> graph_ops{0};
  std::atomic<int64_t> max_graph_ops{0};
  std::atomic<int64_t> graph_outputs{0};
  std::atomic<int64_t> donated_buffers{0};
  std::atomic<int64_t> dropped_values{0};
  std::atomic<int64_t> compiled_runs{0};  // replays of torch.compile graphs
  std::atomic<int64_t> collectives_in_programs{0};  // collectives run inside captured programs
  std::mutex mu;
  std::map<std::string, int64_t> flush_reasons;  // why graphs were cut
  std::map<std::string, int64_t> fallbacks;  // op name -> calls run on the CPU
  std::map<std::string, int64_t> compiles_by_op;  // op name -> compiles (explains recompiles)
  void reset();
};

Metrics& metrics();

// Held around a program launch, which may block (the plugin's limit on programs in
// flight per device, while one of them waits in a collective for other ranks' parts):
// the Python layer makes it release the GIL, so that the other rank threads can launch
// those parts. Null (the default): nothing to release.
using BlockingScope = std::function<std::shared_ptr<void>()>;
void set_blocking_scope(BlockingScope scope);
std::shared_ptr<void> enter_blocking_scope();
// Device memory held by live buffers, per device (never destroyed).
runtime::MemoryCounter& memory_counter(int device);

// How the disk tier is shared and bounded.
struct DiskCachePolicy {
  // Total size of the entries; beyond it the least recently used go (0: unbounded).
  // Approximate: each process counts its own writes between scans of the directory.
  int64_t max_bytes = 10LL << 30;
  // The longest a process waits for another's compile of the same program before
  // compiling it itself.
  double wait_seconds = 1800;
  // A lock whose holder stopped refreshing it for this long is taken over (the holder
  // died on another host; on this host a dead holder's pid is noticed at once).
  double stale_seconds = 30;
};

// The disk entries this process read or wrote, in first-use order (each once): what
// torch.compiler.save_cache_artifacts ships so another machine starts warm.
std::vector<std::string> disk_entries_used(size_t from);

// Disk tier: one file per executable, written atomically (tmp + rename), with a
// header that is checked before the payload is trusted. Shared by every process
// pointing at the directory (a fleet on NFS or a bucket mount): a lock file per
// key makes one process compile a program while the others wait and read it.
class DiskCache {
 public:
  // Held while this process compiles a key: the lock file, refreshed by a thread so
  // that waiters can tell a slow compile from a dead compiler; removed on destruction.
  class CompileLock {
   public:
    explicit CompileLock(std::string path);
    ~CompileLock();
    CompileLock(const CompileLock&) = delete;
    CompileLock& operator=(const CompileLock&) = delete;

   private:
    std::string path_;
    std::mutex mu_;
    std::condition_variable stop_;
    bool stopping_ = false;
    std::thread heartbeat_;
  };

  explicit DiskCache(std::string dir, DiskCachePolicy policy = {});
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  const DiskCachePolicy& policy() const { return policy_; }
  // Returns false when absent; corrupt entries count as absent (and are reported).
  // A hit marks the entry as recently used. `count_rejects`: false for a re-read.
  bool load(const std::string& key, std::string* payload, bool count_rejects = true) const;
  void store(const std::string& key, const std::string& payload) const;
  std::string path_for(const std::string& key) const;
  // Before compiling `key` on a miss: returns true with `payload` filled when another
  // process compiled it meanwhile (this one waited); otherwise returns false, and
  // `lock` holds the key's lock for this process's compile (null when the wait timed out).
  bool load_or_lock(const std::string& key, std::string* payload, std::unique_ptr<CompileLock>* lock) const;
  // Drops least recently used entries until the directory is within max_bytes.
  void evict_to_bound() const;

 private:
  std::string dir_;
  DiskCachePolicy policy_;
  struct Usage {
    std::mutex mu;
    int64_t bytes = -1;  // the directory's size as this process knows it (-1: not scanned)
  };
  std::shared_ptr<Usage> usage_ = std::make_shared<Usage>();
  bool take_over_if_stale(const std::string& lock_path) const;
};

// Identifies the host CPU's instruction set (CPU executables hold machine code).
std::string host_cpu_features();

class Runtime {
 public:
  Runtime(const std::string& plugin_path, const std::vector<runtime::ClientOption>& options,
          std::string cache_dir, const std::vector<runtime::CompileOverride>& compile_overrides = {},
          DiskCachePolicy cache_policy = {}, std::shared_ptr<runtime::KeyValueStore> store = nullptr);
  ~Runtime();

  runtime::Client& client() { return *client_; }
  const runtime::Device& device(int index) const;
  int device_count() const { return static_cast<int>(client_->devices().size()); }

  // Finds the executable of the program with structural key `key`; on a miss
  // prints it (`mlir()`), then tries the disk tier, then compiles. `op()`
  // names the requester in metrics (both are called only on a miss).
  // replica_devices: a program of one replica per device (global ids; part of the key).
  std::shared_ptr<runtime::LoadedExecutable> get_executable(const ir::Key& key,
                                                           const std::function<std::string()>& mlir,
                                                           const std::function<std::string()>& op,
                                                           const std::vector<int64_t>& replica_devices = {});
  // Identity of the plugin (path, file size and time, API version, platform,
  // attributes), the compile options and XLA_FLAGS (both change the code
  // generated) and the CPU: part of every disk key, so an executable compiled
  // by one plugin or flag set is never loaded by another.
  const std::string& identity() const { return identity_; }
  // Whether programs may call the host kernels (kernels/host_kernels.h): a host (CPU) plugin
  // took their registration and a probe compile found them. Decided once, on the first
  // call; TORCH_PJRT_HOST_KERNELS=0 turns them off.
  bool host_kernels();
  DiskCache& disk_cache() { return disk_; }
  void set_cache_dir(const std::string& dir) { disk_ = DiskCache(dir, disk_.policy()); }
  size_t memory_cache_size();
  void clear_memory_cache();
  // Least recently used executables beyond `capacity` are dropped (the disk
  // tier reloads them cheaply); bounds memory under shape churn.
  void set_memory_cache_capacity(size_t capacity);

 private:
  std::unique_ptr<runtime::Client> client_;
  std::string identity_;
  DiskCache disk_;
  std::mutex mu_;
  // A program over replica devices is never evicted (it has no recency position): rank
  // threads must launch parts of the very same executable every time, since the replicas
  // of two executables never join in XLA's collectives.
  struct Entry {
    std::shared_ptr<runtime::LoadedExecutable> exe;
    std::list<const ir::Key*>::iterator recency;  // position in recency_, when not replicated
    bool replicated = false;
  };
  std::unordered_map<ir::Key, Entry, ir::KeyHash> memory_;
  std::unordered_set<ir::Key, ir::KeyHash> compiling_;  // keys a thread is compiling (or loading) now
  std::condition_variable compiled_;
  std::list<const ir::Key*> recency_;  // most recently used first; points at memory_'s keys
  size_t capacity_ = 4096;
  bool host_kernels_registered_ = false;
  std::once_flag host_kernels_once_;
  bool host_kernels_ = false;
  void evict_locked();
};

std::string hex64(uint64_t v);

}  // namespace torch_pjrt::executor
