// Runtime + executor tests against the real CPU PJRT plugin.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <mutex>
#include <map>
#include <condition_variable>
#include <thread>

#include "executor/executor.h"
#include "ir/builder.h"
#include "lowering/collectives.h"
#include "runtime/pjrt_runtime.h"

using namespace torch_pjrt;

namespace {
std::string plugin_path() {
  const char* p = std::getenv("TORCH_PJRT_TEST_PLUGIN");
  return p ? p : "";
}

std::shared_ptr<runtime::Client> shared_client() {
  static std::shared_ptr<runtime::Client> client = [] {
    auto api = runtime::Api::load(plugin_path());
    return std::make_shared<runtime::Client>(api, std::vector<runtime::ClientOption>{{"cpu_device_count", 2}});
  }();
  return client;
}

std::string add_module() {
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({ir::DType::F32, {2, 3}});
  auto y = g.param({ir::DType::F32, {2, 3}});
  g.set_outputs({b.binary("add", x, y)});
  return g.to_mlir();
}
}  // namespace

TEST(Runtime, MissingPluginIsAnError) {
  try {
    runtime::Api::load("/nonexistent/plugin.so");
    FAIL() << "expected an exception";
  } catch (const runtime::PjrtError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot load PJRT plugin"), std::string::npos);
  }
}

TEST(Runtime, NotAPluginIsAnError) {
  EXPECT_THROW(runtime::Api::load("libc.so.6"), runtime::PjrtError);
}

TEST(Runtime, ClientHasRequestedDevices) {
  auto client = shared_client();
  EXPECT_EQ(client->devices().size(), 2u);
  EXPECT_EQ(client->platform_name(), "cpu");
  EXPECT_GE(client->api().minor_version(), 1);
}

// The key-value store the plugin reaches through its callbacks (what a client over
// several processes exchanges its topology with), in memory.
class MemoryStore : public runtime::KeyValueStore {
 public:
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
      throw runtime::PjrtError(runtime::ErrorCode::kDeadlineExceeded, "no " + key);
    }
    return values_[key];
  }
  std::optional<std::string> try_get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    return it == values_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  void put(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// What the plugin's PJRT_CallbackError would make: the code and message, kept.
PJRT_Error_Code g_callback_code;
std::string g_callback_message;
PJRT_Error* record_callback_error(PJRT_Error_Code code, const char* message, size_t size) {
  g_callback_code = code;
  g_callback_message.assign(message, size);
  static char sentinel;
  return reinterpret_cast<PJRT_Error*>(&sentinel);
}

TEST(Runtime, KeyValueCallbacksReachTheStoreAndReportItsErrors) {
  MemoryStore store;
  runtime::KeyValueCallbacks callbacks = runtime::key_value_callbacks();
  PJRT_CallbackError make_error = record_callback_error;
  std::string value("topology\0bytes", 14);  // values are bytes, zeros included
  PJRT_KeyValuePutCallback_Args put{};
  put.struct_size = PJRT_KeyValuePutCallback_Args_STRUCT_SIZE;
  put.key = "node/1";
  put.key_size = 6;
  put.value = value.data();
  put.value_size = value.size();
  put.callback_error = &make_error;
  put.user_arg = &store;
  EXPECT_EQ(callbacks.put(&put), nullptr);

  // A get blocks until another process puts the key: here a thread, a moment later.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store.put("node/0", "first");
  });
  PJRT_KeyValueGetCallback_Args get{};
  get.struct_size = PJRT_KeyValueGetCallback_Args_STRUCT_SIZE;
  get.key = "node/0";
  get.key_size = 6;
  get.timeout_in_ms = 10000;
  get.callback_error = &make_error;
  get.user_arg = &store;
  EXPECT_EQ(callbacks.get(&get), nullptr);
  late.join();
  EXPECT_EQ(std::string(get.value, get.value_size), "first");
  get.value_deleter_callback(get.value);

  PJRT_KeyValueTryGetCallback_Args try_get{};
  try_get.struct_size = PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE;
  try_get.key = "node/1";
  try_get.key_size = 6;
  try_get.callback_error = &make_error;
  try_get.user_arg = &store;
  EXPECT_EQ(callbacks.try_get(&try_get), nullptr);
  EXPECT_EQ(std::string(try_get.value, try_get.value_size), value);
  try_get.value_deleter_callback(try_get.value);

  // A missing key: NOT_FOUND at once from try_get, DEADLINE_EXCEEDED after get's timeout;
  // the store's exception becomes the plugin's error, never an exception through C.
  try_get.key = "node/2";
  EXPECT_NE(callbacks.try_get(&try_get), nullptr);
  EXPECT_EQ(g_callback_code, PJRT_Error_Code_NOT_FOUND);
  EXPECT_NE(g_callback_message.find("node/2"), std::string::npos) << g_callback_message;
  get.key = "node/2";
  get.timeout_in_ms = 20;
  EXPECT_NE(callbacks.get(&get), nullptr);
  EXPECT_EQ(g_callback_code, PJRT_Error_Code_DEADLINE_EXCEEDED);
}

// XLA's CPU plugin takes node_id/num_nodes and the callbacks, and still makes a client
// of this process's devices only (it cannot join processes): what torch_pjrt reports.
TEST(Runtime, TheCpuPluginsClientSpansOneProcessWhateverItIsTold) {
  auto api = runtime::Api::load(plugin_path());
  auto store = std::make_shared<MemoryStore>();
  runtime::Client client(api, {{"node_id", 0}, {"num_nodes", 2}, {"cpu_device_count", 2}}, {}, store);
  EXPECT_EQ(client.devices().size(), 2u);
  EXPECT_EQ(client.global_device_count(), 2u);
  EXPECT_EQ(client.process_index(), 0);
}

TEST(Runtime, BufferRoundTrip) {
  auto client = shared_client();
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  auto buf = client->buffer_from_host(data.data(), PJRT_Buffer_Type_F32, {2, 3}, client->devices()[1]);
  EXPECT_EQ(buf->dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(buf->element_type(), PJRT_Buffer_Type_F32);
  std::vector<float> out(6);
  buf->to_host(out.data(), out.size() * 4);
  EXPECT_EQ(out, data);
}

TEST(Runtime, BufferCopiedToAnotherDeviceRunsThere) {
  auto client = shared_client();
  std::vector<float> a{1, 2, 3, 4, 5, 6}, c{10, 20, 30, 40, 50, 60};
  auto& from = client->devices()[1];
  auto& to = client->devices()[0];
  auto copied = client->buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {2, 3}, from)->copy_to_device(to);
  EXPECT_EQ(copied->dims(), (std::vector<int64_t>{2, 3}));
  auto bc = client->buffer_from_host(c.data(), PJRT_Buffer_Type_F32, {2, 3}, to);
  auto outs = client->compile(add_module())->execute(to, {copied->raw(), bc->raw()});
  std::vector<float> r(6);
  outs[0]->to_host(r.data(), 24);
  EXPECT_EQ(r, (std::vector<float>{11, 22, 33, 44, 55, 66}));
}

TEST(Runtime, CompileAndExecute) {
  auto client = shared_client();
  auto exe = client->compile(add_module());
  ASSERT_EQ(exe->num_outputs(), 1u);
  std::vector<float> a{1, 2, 3, 4, 5, 6}, c{10, 20, 30, 40, 50, 60};
  auto& dev = client->devices()[0];
  auto ba = client->buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {2, 3}, dev);
  auto bc = client->buffer_from_host(c.data(), PJRT_Buffer_Type_F32, {2, 3}, dev);
  auto outs = exe->execute(dev, {ba->raw(), bc->raw()});
  std::vector<float> r(6);
  outs[0]->to_host(r.data(), 24);
  EXPECT_EQ(r, (std::vector<float>{11, 22, 33, 44, 55, 66}));
}

TEST(Runtime, AHostPlatformsResultsAreReadFromItsMemory) {
  // The CPU plugin's buffers live in this process: to_host copies them directly once ready,
  // and must give what the plugin's own copy gives, for every element size.
  auto client = shared_client();
  ASSERT_TRUE(client->api().device_memory_is_host());
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({ir::DType::F32, {3, 2}});
  auto y = g.param({ir::DType::F32, {3, 2}});
  auto sum = b.binary("add", x, y);
  g.set_outputs({b.transpose(x, {1, 0}), b.compare(x, y, "GT"), b.convert(sum, ir::DType::S8),
                 b.slice(sum, {0, 0}, {0, 2}, {1, 1})});
  std::vector<float> a{1, 2, 3, 4, 5, 6}, c{6, 5, 4, 3, 2, 1};
  auto& dev = client->devices()[0];
  auto ba = client->buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {3, 2}, dev);
  auto bc = client->buffer_from_host(c.data(), PJRT_Buffer_Type_F32, {3, 2}, dev);
  auto outs = client->compile(g.to_mlir())->execute(dev, {ba->raw(), bc->raw()});
  ASSERT_EQ(outs.size(), 4u);
  std::vector<float> transposed(6);
  outs[0]->to_host(transposed.data(), 24);
  EXPECT_EQ(transposed, (std::vector<float>{1, 3, 5, 2, 4, 6}));
  uint8_t greater[6];
  outs[1]->to_host(greater, 6);
  EXPECT_EQ(std::vector<uint8_t>(greater, greater + 6), (std::vector<uint8_t>{0, 0, 0, 1, 1, 1}));
  int8_t narrowed[6];
  outs[2]->to_host(narrowed, 6);
  EXPECT_EQ(std::vector<int8_t>(narrowed, narrowed + 6), (std::vector<int8_t>{7, 7, 7, 7, 7, 7}));
  outs[3]->to_host(nullptr, 0);  // an empty result: nothing to read, no dereference
}

TEST(Runtime, IntegerDivisionOfEmptyConstantsCompiles) {
  // The plugin's folder divided a 0x10x3 splat of zeros by itself and raised SIGFPE
  // (test_ops' test_out__refs_lcm); the builder emits no arithmetic on zero elements.
  ir::Graph g;
  ir::Builder b(g);
  auto zeros = b.constant_int(ir::DType::S64, 0, {0, 10, 3});
  g.set_outputs({b.binary("divide", zeros, zeros), b.binary("remainder", zeros, zeros)});
  EXPECT_EQ(g.to_mlir().find("stablehlo.divide"), std::string::npos);
  auto exe = shared_client()->compile(g.to_mlir());
  EXPECT_EQ(exe->num_outputs(), 2u);
}

TEST(Runtime, BadProgramIsAnErrorNotAnAbort) {
  auto client = shared_client();
  try {
    client->compile("module { this is not mlir }");
    FAIL();
  } catch (const runtime::PjrtError& e) {
    EXPECT_NE(e.code(), runtime::ErrorCode::kOk);
  }
}

TEST(CompileOptions, OverridesAreEnvOptionOverrides) {
  // build options {num_replicas 1, num_partitions 1}, portable, then one map entry per override.
  std::string base("\x1a\x04\x20\x01\x28\x01\x20\x01", 8);
  EXPECT_EQ(runtime::encode_compile_options({}), base);
  std::string with_bool = runtime::encode_compile_options({{"xla_cpu_use_xnnpack", false}});
  // field 7 (0x3a), entry {key (0x0a) "xla_cpu_use_xnnpack", value (0x12) {bool_field (0x10) 0}}.
  std::string entry = std::string("\x0a\x13") + "xla_cpu_use_xnnpack" + std::string("\x12\x02\x10\x00", 4);
  EXPECT_EQ(with_bool, base + "\x3a" + static_cast<char>(entry.size()) + entry);
  std::string with_int = runtime::encode_compile_options({{"n", int64_t{300}}});
  EXPECT_EQ(with_int, base + std::string("\x3a\x08\x0a\x01n\x12\x03\x18\xac\x02", 10));
  std::string with_text = runtime::encode_compile_options({{"m", std::string("ab")}});
  EXPECT_EQ(with_text, base + std::string("\x3a\x09\x0a\x01m\x12\x04\x0a\x02" "ab", 11));
}

TEST(CompileOptions, ThePluginAppliesThemAndRejectsUnknownNames) {
  auto api = runtime::Api::load(plugin_path());
  runtime::Client known(api, {}, {{"xla_cpu_enable_fast_math", false}});
  auto exe = known.compile(add_module());
  EXPECT_EQ(exe->num_outputs(), 1u);
  runtime::Client unknown(api, {}, {{"xla_no_such_option", true}});
  try {
    unknown.compile(add_module());
    FAIL() << "an unknown option compiled";
  } catch (const runtime::PjrtError& e) {
    EXPECT_NE(std::string(e.what()).find("xla_no_such_option"), std::string::npos) << e.what();
  }
}

TEST(Runtime, SerializeAndDeserialize) {
  auto client = shared_client();
  auto exe = client->compile(add_module());
  auto again = client->deserialize(exe->serialize());
  std::vector<float> a{1, 1, 1, 1, 1, 1};
  auto& dev = client->devices()[0];
  auto ba = client->buffer_from_host(a.data(), PJRT_Buffer_Type_F32, {2, 3}, dev);
  auto outs = again->execute(dev, {ba->raw(), ba->raw()});
  std::vector<float> r(6);
  outs[0]->to_host(r.data(), 24);
  EXPECT_EQ(r, (std::vector<float>(6, 2.0f)));
}

TEST(DiskCache, StoreLoadAndRejectCorruption) {
  char tmpl[] = "/tmp/pjrt_cache_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  executor::DiskCache cache(dir);
  std::string payload(1000, 'x');
  payload[3] = 'y';
  cache.store("key-1", payload);
  std::string got;
  ASSERT_TRUE(cache.load("key-1", &got));
  EXPECT_EQ(got, payload);
  EXPECT_FALSE(cache.load("key-2", &got));
  // Flip one payload byte: the checksum must reject it.
  {
    std::fstream f(cache.path_for("key-1"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('z');
  }
  int64_t rejects = executor::metrics().disk_cache_rejects;
  EXPECT_FALSE(cache.load("key-1", &got));
  EXPECT_EQ(executor::metrics().disk_cache_rejects, rejects + 1);
  // Truncate it.
  cache.store("key-1", payload);
  ASSERT_EQ(0, truncate(cache.path_for("key-1").c_str(), 40));
  EXPECT_FALSE(cache.load("key-1", &got));
}

namespace {
std::string temp_dir() {
  char tmpl[] = "/tmp/pjrt_cache_XXXXXX";
  return mkdtemp(tmpl);
}

void set_mtime(const std::string& path, time_t seconds_ago) {
  timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ASSERT_EQ(0, ::utimensat(AT_FDCWD, path.c_str(), times, 0));
}

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}
}  // namespace

TEST(DiskCache, ASecondProcessWaitsForTheCompilerAndReadsItsEntry) {
  std::string dir = temp_dir();
  executor::DiskCache compiler(dir), waiter(dir);  // two processes' views of one directory
  std::string got;
  std::unique_ptr<executor::DiskCache::CompileLock> lock;
  ASSERT_FALSE(compiler.load_or_lock("prog", &got, &lock));
  ASSERT_TRUE(lock);
  int64_t waits = executor::metrics().disk_cache_waits;
  std::thread compiling([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    compiler.store("prog", "executable");
    lock.reset();
  });
  std::unique_ptr<executor::DiskCache::CompileLock> second;
  EXPECT_TRUE(waiter.load_or_lock("prog", &got, &second));  // waited, then read: no compile of its own
  compiling.join();
  EXPECT_FALSE(second);
  EXPECT_EQ(got, "executable");
  EXPECT_EQ(executor::metrics().disk_cache_waits, waits + 1);
  EXPECT_FALSE(std::ifstream(compiler.path_for("prog") + ".lock"));  // released
}

TEST(DiskCache, ALockWhoseHolderDiedIsTakenOver) {
  std::string dir = temp_dir();
  executor::DiskCache cache(dir);
  const std::string lock_path = cache.path_for("prog") + ".lock";
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // a pid on this host that no longer runs
  std::ofstream(lock_path) << this_host() << " " << child << "\n";
  int64_t stale = executor::metrics().disk_cache_stale_locks;
  std::string got;
  std::unique_ptr<executor::DiskCache::CompileLock> lock;
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(cache.load_or_lock("prog", &got, &lock));
  EXPECT_TRUE(lock);  // this process compiles now
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));  // not after the stale age
  EXPECT_EQ(executor::metrics().disk_cache_stale_locks, stale + 1);
}

TEST(DiskCache, AnotherHostsLockIsWaitedForUntilItGoesStale) {
  std::string dir = temp_dir();
  executor::DiskCachePolicy policy;
  policy.wait_seconds = 0.5;
  executor::DiskCache cache(dir, policy);
  const std::string lock_path = cache.path_for("prog") + ".lock";
  std::string got;
  std::unique_ptr<executor::DiskCache::CompileLock> lock;
  // Refreshed a moment ago by a compiler elsewhere: waited for, up to wait_seconds.
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(lock_path) << "another-host 1\n";
  int64_t timeouts = executor::metrics().disk_cache_lock_timeouts;
  EXPECT_FALSE(cache.load_or_lock("prog", &got, &lock));
  EXPECT_FALSE(lock);  // gave up waiting: compiles without the lock
  EXPECT_EQ(executor::metrics().disk_cache_lock_timeouts, timeouts + 1);
  // Not refreshed for longer than the stale age: its holder is gone.
  set_mtime(lock_path, 120);
  EXPECT_FALSE(cache.load_or_lock("prog", &got, &lock));
  EXPECT_TRUE(lock);
}

TEST(DiskCache, TheSizeBoundEvictsTheLeastRecentlyUsed) {
  std::string dir = temp_dir();
  executor::DiskCachePolicy policy;
  policy.max_bytes = 4500;
  executor::DiskCache cache(dir, policy);
  const std::string payload(1000, 'p');
  for (int i = 0; i < 4; ++i) {
    cache.store("key-" + std::to_string(i), payload);
    set_mtime(cache.path_for("key-" + std::to_string(i)), 100 - i);  // key-0 oldest
  }
  std::string got;
  ASSERT_TRUE(cache.load("key-0", &got));  // used now: the most recent
  int64_t evictions = executor::metrics().disk_cache_evictions;
  cache.store("key-4", payload);  // over the bound: down to 90% of it
  EXPECT_EQ(executor::metrics().disk_cache_evictions, evictions + 2);
  EXPECT_TRUE(cache.load("key-0", &got));
  EXPECT_FALSE(cache.load("key-1", &got));
  EXPECT_FALSE(cache.load("key-2", &got));
  EXPECT_TRUE(cache.load("key-3", &got));
  EXPECT_TRUE(cache.load("key-4", &got));
}

// Looks a module up by a key made from its text (the device layer keys by graph structure).
std::shared_ptr<runtime::LoadedExecutable> get(executor::Runtime& rt, const std::string& mlir, const char* op) {
  ir::Key key;
  key.mix(mlir);
  return rt.get_executable(key, [&] { return mlir; }, [&] { return std::string(op); });
}

TEST(Executor, RuntimeCachesExecutables) {
  char tmpl[] = "/tmp/pjrt_cache_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  executor::metrics().reset();
  {
    executor::Runtime rt(plugin_path(), {{"cpu_device_count", 1}}, dir);
    get(rt, add_module(), "add");
    get(rt, add_module(), "add");
    EXPECT_EQ(executor::metrics().compiles, 1);
    EXPECT_EQ(executor::metrics().memory_cache_hits, 1);
  }
  {
    // A second runtime (as a second process would) loads from disk.
    executor::Runtime rt(plugin_path(), {{"cpu_device_count", 1}}, dir);
    get(rt, add_module(), "add");
    EXPECT_EQ(executor::metrics().compiles, 1);
    EXPECT_EQ(executor::metrics().disk_cache_hits, 1);
  }
}

TEST(Executor, MemoryCacheEvictsLeastRecentlyUsed) {
  executor::metrics().reset();
  executor::Runtime rt(plugin_path(), {{"cpu_device_count", 1}}, "");
  rt.set_memory_cache_capacity(2);
  auto module = [](int64_t n) {
    ir::Graph g;
    ir::Builder b(g);
    g.set_outputs({b.unary("negate", g.param({ir::DType::F32, {n}}))});
    return g.to_mlir();
  };
  get(rt, module(1), "neg");
  get(rt, module(2), "neg");
  get(rt, module(1), "neg");  // 1 is now the most recent
  get(rt, module(3), "neg");  // evicts 2
  EXPECT_EQ(rt.memory_cache_size(), 2u);
  EXPECT_EQ(executor::metrics().memory_cache_evictions, 1);
  int64_t compiles = executor::metrics().compiles;
  get(rt, module(1), "neg");
  EXPECT_EQ(executor::metrics().compiles, compiles);  // still cached
  get(rt, module(2), "neg");
  EXPECT_EQ(executor::metrics().compiles, compiles + 1);  // was evicted
}


// A program over several devices stays, whatever the bound: rank threads must launch
// parts of the very same executable each time (two executables' replicas never join).
TEST(Executor, AProgramOverSeveralDevicesIsNeverEvicted) {
  executor::Runtime rt(plugin_path(), {{"cpu_device_count", 2}}, "");
  rt.set_memory_cache_capacity(1);
  const std::string collective =
      lowering::collective_module({lowering::CollectiveKind::AllReduce, ir::DType::F32, {3}, 2});
  ir::Key key;
  key.mix(collective);
  auto over_two = [&] { return rt.get_executable(key, [&] { return collective; }, [] { return "all_reduce"; }, {0, 1}); };
  auto first = over_two();
  for (int64_t n = 1; n <= 3; ++n) {
    ir::Graph g;
    ir::Builder b(g);
    g.set_outputs({b.unary("negate", g.param({ir::DType::F32, {n}}))});
    get(rt, g.to_mlir(), "neg");  // each evicts the last single-device program
  }
  EXPECT_EQ(over_two().get(), first.get());
  EXPECT_EQ(rt.memory_cache_size(), 2u);  // the replicated program and the newest other
}

// A program over several devices, each device's part launched by its own thread
// (as each rank of a process group launches its own): the plugin joins them.
TEST(Runtime, ReplicatedProgramLaunchedPerDeviceFromThreads) {
  auto api = runtime::Api::load(plugin_path());
  runtime::Client client(api, {{"cpu_device_count", 4}});
  ASSERT_EQ(client.devices().size(), 4u);
  // Replica r on device 3 - r: the replica order is the assignment's, not the ids'.
  std::vector<int64_t> assignment;
  for (int r = 0; r < 4; ++r) assignment.push_back(client.devices()[3 - r].id());
  auto exe = client.compile(lowering::collective_module({lowering::CollectiveKind::AllReduce, ir::DType::F32, {3}, 4}),
                            assignment);
  for (int launch = 1; launch <= 3; ++launch) {
    std::vector<std::vector<float>> results(4, std::vector<float>(3));
    std::vector<std::thread> ranks;
    for (int r = 0; r < 4; ++r) {
      ranks.emplace_back([&, r] {
        const runtime::Device& device = client.devices()[3 - r];
        std::vector<float> mine{float(r + 1), float(10 * (r + 1)), float(launch)};
        auto in = client.buffer_from_host(mine.data(), PJRT_Buffer_Type_F32, {3}, device);
        auto out = exe->execute(device, {in->raw()}, nullptr, nullptr, launch);
        out.at(0)->to_host(results[r].data(), 3 * sizeof(float));
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 4; ++r) EXPECT_EQ(results[r], (std::vector<float>{10, 100, 4.0f * launch})) << "replica " << r;
  }
}
