// Members of a program over several devices (its collectives inside) launch their
// parts together: each waits here until every member's thread has come to the same
// launch. XLA's CPU collectives end the process when a member is more than 40 s late
// to a rendezvous (one rank still tracing or compiling while the others run), and a
// member that raised never comes: here a late member is only waited for, and one that
// left fails the others at once, with an error that says which. No torch headers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torch_pjrt::executor {

class LaunchBarrier {
 public:
  static LaunchBarrier& get();
  // Waits until every device of `devices` (global ids) has arrived for `launch`; `me` is
  // the caller's device. Throws std::runtime_error when one of them has left (and not
  // arrived) or after `timeout`.
  void arrive(uint32_t launch, const std::vector<int64_t>& devices, int64_t me,
              std::chrono::milliseconds timeout = std::chrono::minutes(30));
  // A member's process group over `device` is made (joined) or gone (left): barriers
  // waiting for a device that left fail.
  void join(int64_t device);
  void leave(int64_t device);

 private:
  struct Round {
    std::set<int64_t> arrived;
    bool complete = false;
  };
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::pair<uint32_t, std::vector<int64_t>>, std::shared_ptr<Round>> rounds_;
  std::map<int64_t, int> groups_;  // live process groups over each device that has had one
};

}  // namespace torch_pjrt::executor
