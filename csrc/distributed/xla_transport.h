// The XLA transport: a group's collectives as StableHLO programs over its
// members' devices (lowering/collectives.h), each member launching its own
// device's part; the bytes never leave the devices. Used where every member's
// device is addressable by this process's client (ranks as threads of one
// process: torch_pjrt.distributed.spawn). Not between processes yet, even over a
// client that spans them: point to point copies and the launch barrier are in-process.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace torch_pjrt::distributed {

// control: the transport that carries `exchange` (the ranks' signatures, a few
// integers). device_ids: every member's global device id, by rank. Point to point
// copies device to device between the members (this process's devices all); a
// receive waits for its message up to `timeout`. in_programs: a collective called while
// torch.compile captures a graph on this rank's device becomes ops of that program.
std::unique_ptr<Transport> make_xla_transport(std::unique_ptr<Transport> control, int rank, int size,
                                              std::vector<int64_t> device_ids, std::chrono::milliseconds timeout,
                                              bool in_programs = false);

// Collectives run so far in this process, by transport name, and the bytes the
// host-staged transport moved through the host.
struct TransportStats {
  std::map<std::string, int64_t> collectives;
  int64_t host_bytes = 0;
};
TransportStats transport_stats();
void reset_transport_stats();
void count_collective(const std::string& transport);
void count_host_bytes(int64_t bytes);

}  // namespace torch_pjrt::distributed
