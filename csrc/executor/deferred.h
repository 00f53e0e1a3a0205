// The deferred execution core, shared by every eager mode: ops record IR
// fragments into their device's pending graph; a flush compiles the graph as
// one program (found by its structural key, printed only on a miss), runs it,
// and turns the pending values that something still holds into buffers.
// Strict mode is this core flushing after every op. No torch headers.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "ir/builder.h"

namespace torch_pjrt::executor {

// One recorded op: its name and where the user recorded it ("file.py:12";
// interned, never freed; null when unknown). Resolved into text only on error.
struct OpRecord {
  std::string op;
  const std::string* where = nullptr;
};
using ProgramOps = std::shared_ptr<const std::vector<OpRecord>>;
// "aten::add (model.py:12), aten::mm (model.py:13), ... and 40 more".
std::string describe_ops(const std::vector<OpRecord>& ops, size_t limit = 6);
std::string describe_op(const OpRecord& op);
std::string recorded_at(const OpRecord& op);  // " (recorded at file.py:12 in f)", or "" when unknown
// "aten::add" for one op, "fused graph (40 ops)" for more (metrics, storage info).
std::string program_label(const std::vector<OpRecord>& ops);

// The contents of one PyTorch storage or generator state: a real buffer, a
// value pending in the device graph, or nothing yet. The deferred fields are
// guarded by the device graph's mutex.
struct Storage {
  int device_index = 0;
  std::shared_ptr<runtime::Buffer> buffer;  // real contents (may be stale while pending)
  std::vector<int64_t> dims;                // dims of the current contents (pending or real)
  ir::DType dtype = ir::DType::U8;
  ProgramOps producer;                        // program that produced `buffer`
  std::shared_ptr<const std::string> failed;  // the program meant to produce it failed
  ir::Value pending;    // pending contents in the device graph
  int live_index = -1;  // position in the graph's list of pending storages
  int param_index = -1; // parameter of the graph bound to `buffer`

  bool is_pending() const { return pending.valid(); }
  bool has_contents() const { return buffer != nullptr || pending.valid(); }
};

// What one op records: a small graph whose parameters are storages' contents
// or fixed buffers (scalars), the new contents of the storages it writes, and
// its out-of-range conditions.
struct Fragment {
  ir::Graph graph;
  struct Param {
    Storage* storage = nullptr;               // contents of this storage, as read when recorded
    std::shared_ptr<runtime::Buffer> buffer;  // else this buffer
  };
  std::vector<Param> params;  // in graph.params() order
  std::vector<std::pair<Storage*, ir::Value>> results;
  struct Flag {
    ir::Value value;  // i1[]: true = out of range
    std::string message;
  };
  std::vector<Flag> flags;
  ir::Value nonfinite;  // debug mode: i1[], any NaN/Inf in the op's fresh results
  OpRecord record;
  // A collective among the devices of a group (global ids, in replica order): the
  // program holding it runs as one replica per device, each member launching its
  // own (recorded only while a capture is on: DeviceGraph::can_record_collective).
  std::vector<int64_t> replica_devices;
  int collectives = 0;  // how many collectives the fragment holds
};

enum class FlushReason { Op, Sync, Explicit, OptimizerStep, Loop, Size, ModeChange, Compile, Collective, Count };
const char* flush_reason_name(FlushReason r);

// Bounds and heuristics of fused mode.
struct FusionPolicy {
  size_t max_ops = 4000;    // cut when a graph holds this many ops
  size_t min_loop = 24;     // shortest repeated op sequence that counts as a loop body
  bool detect_loops = true; // cut where the graph's first op recurs
  bool donate = true;       // donate buffers that a program overwrites and nothing else reads
};
FusionPolicy& fusion_policy();

// A program failed (compile or launch); names the ops it held.
class GraphError : public std::runtime_error {
 public:
  GraphError(runtime::ErrorCode code, const std::string& what, std::vector<OpRecord> ops)
      : std::runtime_error(what), code_(code), ops_(std::move(ops)) {}
  runtime::ErrorCode code() const { return code_; }
  const std::vector<OpRecord>& ops() const { return ops_; }

 private:
  runtime::ErrorCode code_;
  std::vector<OpRecord> ops_;
};

// A deferred device-side assert: checked at the next sync point.
struct Check {
  std::shared_ptr<runtime::Buffer> flag;  // pred scalar
  std::string message;
  OpRecord op;
  bool nonfinite = false;  // debug mode: NaN/Inf in the op's results (not an index error)
};

// A recorded graph kept as a reusable program (torch.compile): what the flush
// that ended the recording ran, and which storage each parameter was read from
// and each output was written to, so a later call can bind other storages.
struct Capture {
  std::shared_ptr<runtime::LoadedExecutable> exe;  // null: the graph computed nothing
  std::vector<ir::Type> param_types;
  std::vector<Storage*> param_storage;                 // null: a fixed buffer (scalar, constant)
  std::vector<std::shared_ptr<runtime::Buffer>> fixed;  // parameter i's buffer where param_storage[i] is null
  std::vector<ir::Type> out_types;                      // every output, flags last
  std::vector<Storage*> out_storage;                    // storage output k became (k < out_storage.size())
  std::vector<std::pair<size_t, size_t>> donated;       // (parameter, output) aliased
  std::vector<std::string> flag_messages;               // outputs out_storage.size()... are out-of-range flags
  std::vector<OpRecord> flag_ops;
  ProgramOps ops;
  std::string broken;  // why the recording did not end as one program (empty: it did)
  // A program over a group's devices (its collectives inside): every member launches
  // its own replica, the n-th run of each with the same launch id (`runs` counts them).
  std::vector<int64_t> replica_devices;
  int collectives = 0;
  uint32_t launch_base = 0;
  mutable std::atomic<uint32_t> runs{0};
};

enum class RecordMode {
  Defer,        // fused: keep recording
  Run,          // strict: run now; checks are read at the next sync
  RunAndCheck,  // debug: run now and return the checks to be read at once
};

// The pending graph of one device, and the queue of programs launched on it.
class DeviceGraph {
 public:
  DeviceGraph(Runtime& rt, int device) : rt_(rt), device_(device) {}

  // Splices the fragment in (cutting the graph first when the fragment starts
  // a loop body again, and after it when the graph is full). Run modes launch
  // the graph at once. Throws GraphError when a program fails.
  std::vector<Check> record(Fragment&& f, RecordMode mode);
  // Compiles and launches the pending graph (asynchronously); no-op when empty.
  void flush(FlushReason reason);
  // Flushes when `s` is pending; returns s->buffer, read under the lock.
  std::shared_ptr<runtime::Buffer> materialize(Storage* s);
  // The storage is being destroyed: its pending value is dropped.
  void forget(Storage* s);
  // Sets the storage's contents directly (host copies): drops what was pending.
  void assign(Storage* s, std::shared_ptr<runtime::Buffer> buffer, std::vector<int64_t> dims, ir::DType dtype,
              ProgramOps producer);
  // Waits for every program launched so far.
  void await_all();
  // Deferred asserts queued since the last call.
  std::vector<Check> take_checks();
  size_t pending_ops();

  // torch.compile: flushes what is pending, then records without cuts until
  // end_capture, which runs the graph as one program and returns it with its
  // bindings. A flush, host read or host write in between marks the capture
  // broken (it still ran correctly, just not as one program).
  void begin_capture();
  std::unique_ptr<Capture> end_capture();
  void abort_capture();
  // Whether a collective over `devices` can go into the program being captured: a
  // capture is on and its program has no collective over other devices yet.
  bool can_record_collective(const std::vector<int64_t>& devices);
  // Runs a captured program on `args` (buffers of parameter types); returns its
  // outputs. An aliased parameter is donated when the caller's vector and one
  // storage are all that hold it. Flags are queued for the next sync point.
  std::vector<std::shared_ptr<runtime::Buffer>> replay(const Capture& c,
                                                       const std::vector<std::shared_ptr<runtime::Buffer>>& args);

 private:
  std::vector<Check> flush_locked(FlushReason reason, bool return_checks);
  ir::Value bind_storage(Storage* s, const ir::Type& want, ir::Key& mapping, bool* reshaped);
  ir::Key head_signature(const Fragment& f) const;
  void reset_locked();
  [[noreturn]] void fail_locked(const std::vector<Storage*>& outputs, runtime::ErrorCode code,
                                const std::string& what);

  Runtime& rt_;
  int device_;
  std::mutex mu_;
  ir::Graph graph_;
  std::vector<std::shared_ptr<runtime::Buffer>> args_;  // parameter i's buffer
  std::vector<Storage*> param_storage_;                 // storage parameter i was read from (or null)
  std::vector<Storage*> live_;                          // storages with pending contents (null: freed)
  std::vector<Fragment::Flag> flags_;
  std::vector<OpRecord> flag_ops_;
  ir::Value nonfinite_;
  std::vector<OpRecord> ops_;
  ir::Key head_;  // signature of the graph's first op (loop detection)
  std::vector<ir::Value> scratch_outs_;
  std::vector<Storage*> scratch_storage_;
  std::vector<std::pair<size_t, size_t>> scratch_donated_;
  std::vector<PJRT_Buffer*> scratch_raw_;
  std::vector<int64_t> replica_devices_;  // the pending graph's collectives' group (empty: none)
  int collectives_ = 0;
  std::unique_ptr<Capture> capture_;  // set between begin_capture and end_capture
  bool capture_ending_ = false;
  void break_capture_locked(const std::string& why);
  std::unique_ptr<Capture> finish_capture_locked();  // runs the recording, hands the capture out
  void queue_launched(std::unique_ptr<runtime::Event> done, std::vector<Check> checks);
  std::mutex queue_mu_;
  std::vector<std::unique_ptr<runtime::Event>> launched_;  // completion events not yet awaited
  std::vector<Check> checks_;
};

DeviceGraph& device_graph(Runtime& rt, int device);
// Every device graph created so far (for synchronize-all).
std::vector<DeviceGraph*> device_graphs();

}  // namespace torch_pjrt::executor
