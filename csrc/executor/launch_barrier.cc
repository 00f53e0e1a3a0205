#include "executor/launch_barrier.h"

#include <stdexcept>
#include <string>

namespace torch_pjrt::executor {

LaunchBarrier& LaunchBarrier::get() {
  static LaunchBarrier* barrier = new LaunchBarrier();  // leaked: rank threads may outlive static teardown
  return *barrier;
}

void LaunchBarrier::arrive(uint32_t launch, const std::vector<int64_t>& devices, int64_t me,
                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto key = std::make_pair(launch, devices);
  auto& slot = rounds_[key];
  if (!slot) slot = std::make_shared<Round>();
  std::shared_ptr<Round> round = slot;
  round->arrived.insert(me);
  if (round->arrived.size() == devices.size()) {
    round->complete = true;
    rounds_.erase(key);
    changed_.notify_all();
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto missing = [&] {
    std::string list;
    for (int64_t d : devices) {
      if (!round->arrived.count(d)) list += (list.empty() ? "" : ", ") + std::to_string(d);
    }
    return list;
  };
  for (;;) {
    if (round->complete) return;
    for (int64_t d : devices) {
      auto g = groups_.find(d);
      if (g != groups_.end() && g->second == 0 && !round->arrived.count(d)) {
        round->arrived.erase(me);
        throw std::runtime_error("pjrt: a compiled program's collectives wait for the rank on device " +
                                 std::to_string(d) + ", whose process group is gone (it raised, or destroyed it)");
      }
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !round->complete) {
      const std::string late = missing();
      round->arrived.erase(me);
      const std::string waited = timeout.count() < 1000 ? std::to_string(timeout.count()) + " ms"
                                                        : std::to_string(timeout.count() / 1000) + " s";
      throw std::runtime_error("pjrt: a compiled program's collectives waited " + waited +
                               " for the ranks on devices " + late + " to launch their part");
    }
  }
}

void LaunchBarrier::join(int64_t device) {
  std::lock_guard<std::mutex> lock(mu_);
  ++groups_[device];
}

void LaunchBarrier::leave(int64_t device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    int& live = groups_[device];
    if (live > 0) --live;
  }
  changed_.notify_all();
}

}  // namespace torch_pjrt::executor
