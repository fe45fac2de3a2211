// The table of algorithms: one row per (collective, algorithm) the engine
// runs. A row says where the algorithm runs (its path), what a call needs
// beyond that, whether algorithm="auto" may pick it, how to run it, whether
// the engine divides avg after it, and the name of its traffic closed form
// (ringcomm/traffic.py). The engine validates a requested algorithm against
// its row and runs row.run(call); Python reads the same rows
// (_core.algorithm_table(), ringcomm/algorithms.py), so the allow-lists of the
// door, the tuner and the benchmark are lookups, not copies.
//
// Every run function has one signature, taking AlgoCall: the call's fields,
// the link, the reducer, the layout and the step between hosts. The rows wrap
// the functions of algorithms.h (whose signatures stay as they are); the
// algorithms never see the engine or a transport.
#pragma once

#include "algorithms/algorithms.h"

#include <cstddef>
#include <cstdint>

namespace ringcomm {

// Where an algorithm runs. messages: Link's messages, on any transport,
// host or device memory; window: the shared-memory window of one host's
// ranks (host memory; refused on ranks of several hosts, whose window holds
// this host's only); hosts: across hosts, the window inside each host and an
// engine between them (Engine::attach_hierarchy).
enum class AlgoPath : uint8_t { messages = 0, window, hosts };

// What a call needs beyond its path (checked in this order; Engine::choose_algorithm).
enum AlgoNeed : uint32_t {
  kNeedNothing = 0,
  kNeedOrderedHosts = 1u << 0,  // every local index's ranks grow from host to host (HostLayout::ordered)
  kNeedArena = 1u << 1,         // the call's arrays in the shared arena (comm.empty)
  kNeedSlotTable = 1u << 2,     // all_to_all with per-peer splits: a slot holds their table (shm_all_to_all_v_fits)
  kNeedPow2 = 1u << 3,          // a power-of-two number of ranks
};

// One call as an algorithm sees it. Built on the stack by Engine::perform:
// no allocation. Pointers the collective does not use are null.
struct AlgoCall {
  Link& link;
  const Reducer* red;  // the collectives that reduce; else null
  const char* in;
  char* out;
  size_t count;  // elements of the full buffer (Engine::submit's table)
  size_t es;     // bytes per element
  size_t segment_bytes;
  int root;
  const int64_t* counts;      // per-rank counts / all_to_all's splits (null: the split rule)
  const int64_t* out_counts;  // all_to_all's out_splits
  const uintptr_t* in_places;   // blocks in arrays of their own (null: back to back)
  const uintptr_t* out_places;
  int64_t arena_out;           // zero copy: the output's offset in this rank's part of the arena
  const HostLayout* layout;    // hierarchical only
  const Across* across;        // hierarchical only: the step between hosts
  DType dtype;                 // what the reducer combines: for an algorithm that needs an element of its own
  Op op;                       // (exscan's identity on rank 0)
  RingPlan plan() const { return RingPlan(count, link.size(), es, segment_bytes); }
};

using AlgoRun = void (*)(const AlgoCall&);
// A closed form of a row's traffic, written next to its algorithm: the
// payload bytes `rank` of `n` sends to (sent[p]) and receives from
// (received[p]) each peer p in one call of `count` elements of `es` bytes
// (both arrays n long, zeroed by the caller). ringcomm/traffic.py calls it
// for a row whose traffic name is "native" (_core.closed_form).
using AlgoTraffic = void (*)(int n, int rank, size_t count, size_t es, size_t segment_bytes, int64_t* sent,
                             int64_t* received);

struct AlgoRow {
  Coll coll;
  Algo algo;
  AlgoPath path;
  uint32_t needs;       // AlgoNeed bits
  bool auto_ok;         // algorithm="auto" may pick it (Engine::auto_algorithm)
  bool finalize_avg;    // the engine divides avg after run (reduce_scatter's: its algorithms leave sums)
  bool pair_header;     // its first message goes to the partner at once: on two ranks that stamp is the header
  AlgoRun run;
  // The closed form in ringcomm/traffic.py that predicts its bytes: its
  // function there without the underscore (pairwise, shared, reduce, gather,
  // scatter, all_to_all), expected's own branches (ring, naive), or
  // expected_hierarchical (hierarchical).
  const char* traffic;
  // Engine::message_auto's default: the first message-path row of the
  // collective that auto may pick and whose auto_max (bytes) the buffer does
  // not exceed, in table order (the collectives with tuned limits of their
  // own, all_reduce and reduce, keep their policy).
  size_t auto_max = SIZE_MAX;
  AlgoTraffic closed_form = nullptr;  // traffic "native": the row's own closed form
};

// The row of (coll, algo), or null when the algorithm does not run that
// collective. O(1): an index by codes, built once.
const AlgoRow* find_algorithm(Coll coll, Algo algo);
// Every row, in the table's order (collective, then the order auto tries them).
const AlgoRow* algorithm_rows(size_t* n);
// Where an algorithm runs (every row of an algorithm shares its path).
AlgoPath algorithm_path(Algo algo);
const char* path_name(AlgoPath p);
// The names of AlgoNeed bits, for the Python table ("ordered_hosts", ...).
const char* need_name(uint32_t bit);

}  // namespace ringcomm
