// Registration of shared memory: the window of one host's ranks, its arena
// and the blocks arrays view, the segment's file (transports/shm_segment.h),
// and the Engine's window and hierarchy (several hosts) methods.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/handles.h"
#include "transports/shm_segment.h"

namespace ringcomm {
namespace bind {

namespace py = pybind11;

inline void bind_shm(py::module_& m) {
  py::class_<ArenaBlock, std::shared_ptr<ArenaBlock>>(m, "ArenaBlock", py::buffer_protocol(), py::module_local(),
                                                      "A block of this rank's part of the shared arena; freed "
                                                      "when the last array viewing it is gone.")
      .def_buffer([](ArenaBlock& b) {
        return py::buffer_info(b.window->arena(b.window->rank()) + b.offset, 1, "B", 1, {py::ssize_t(b.bytes)}, {1});
      })
      .def_readonly("offset", &ArenaBlock::offset)
      .def_readonly("nbytes", &ArenaBlock::bytes);
  py::class_<ShmWindow, std::shared_ptr<ShmWindow>>(m, "ShmWindow", py::module_local(),
                                                    "A shared-memory window of the ranks of one host.")
      .def_property_readonly("rank", &ShmWindow::rank)
      .def_property_readonly("size", &ShmWindow::size)
      .def_property_readonly("slot_bytes", &ShmWindow::slot_bytes)
      .def_property_readonly("label", &ShmWindow::label)
      .def_property("single_copy_min", &ShmWindow::single_copy_min, &ShmWindow::set_single_copy_min,
                    "Blocks of at least this many bytes are read straight from the peers' arrays (single copy; "
                    "2**64-1: never). Set alike on every rank, before any collective (ringcomm/shm/).")
      .def_property("single_copy_min_4k", &ShmWindow::single_copy_min_4k, &ShmWindow::set_single_copy_min_4k,
                    "The same for blocks that lie in 4 KiB pages: all_to_all's (the sender asks the kernel) and "
                    "all_gather's (every rank asks of its input; all agree in one sync); the slots below it. Set "
                    "alike on every rank, before any collective (ringcomm/shm/).")
      .def(
          "small_pages",
          [](const ShmWindow& w, uintptr_t address, size_t bytes) {
            return w.small_pages(reinterpret_cast<const void*>(address), bytes);
          },
          py::arg("address"), py::arg("nbytes"),
          "Does this process's memory at [address, address + nbytes) lie in 4 KiB pages, as the kernel says of "
          "its middle page? (What all_to_all's sender asks; False where the kernel cannot tell.)")
      .def("probe_single_copy", &ShmWindow::probe_single_copy, py::call_guard<py::gil_scoped_release>(),
           "Can this rank read every peer's memory (process_vm_readv)? Call once every rank has attached.")
      .def_property_readonly("has_arena", &ShmWindow::has_arena)
      .def_property_readonly("arena_bytes", &ShmWindow::arena_bytes)
      .def("arena_alloc",
           [](std::shared_ptr<ShmWindow> w, size_t bytes) {
             const size_t off = w->arena_alloc(bytes);
             return std::make_shared<ArenaBlock>(w, off, bytes);
           },
           py::arg("nbytes"), "A block of this rank's part of the arena (symmetric: same order, same offsets).");
  py::class_<ShmFile, std::shared_ptr<ShmFile>>(m, "ShmFile", py::module_local())
      .def_static("create", &ShmFile::create, py::arg("bytes"), py::arg("rank"),
                  py::call_guard<py::gil_scoped_release>(),
                  "An unnamed file in /dev/shm (mode 0600), locked (flock), its pages reserved (posix_fallocate).")
      .def_static("open", &ShmFile::open, py::arg("path"), py::arg("dev"), py::arg("ino"), py::arg("bytes"),
                  py::arg("rank"), py::call_guard<py::gil_scoped_release>(),
                  "Open the segment another rank made: /proc/<pid>/fd/<fd> or its /dev/shm name, checked to be "
                  "that file (device, inode, size, owner).")
      .def("link", &ShmFile::link, py::arg("name"), "Give the creator's file a name in /dev/shm.")
      .def("close", &ShmFile::close, "Close the descriptor (the lock goes; mappings stay).")
      .def_property_readonly("fd", &ShmFile::fd)
      .def_property_readonly("dev", &ShmFile::dev)
      .def_property_readonly("ino", &ShmFile::ino)
      .def_property_readonly("bytes", &ShmFile::bytes);
  m.def("shm_arena_map", &shm_arena_map, py::arg("window"), py::arg("file"), py::arg("per_rank"),
        py::call_guard<py::gil_scoped_release>(), "Map the window's shared arena from its file.");
  m.def("shm_local_arena", &shm_local_arena, py::arg("windows"), py::arg("per_rank"),
        "In-process windows: one arena over plain memory.");
  m.def("shm_bytes", &ShmWindow::bytes_for, py::arg("nranks"), py::arg("slot_bytes"),
        "Bytes of a shared segment for nranks ranks with slots of slot_bytes.");
  m.def("shm_window", &shm_window, py::arg("file"), py::arg("rank"), py::arg("nranks"), py::arg("slot_bytes"),
        py::arg("create"), py::call_guard<py::gil_scoped_release>(),
        "The window over a shared segment's file: laid out (create) or checked.");
  m.def("shm_remove", &shm_remove, py::arg("name"), "Unlink a shared segment's name (mappings stay).");
  m.def("shm_sweep", &shm_sweep, py::call_guard<py::gil_scoped_release>(),
        "Remove this user's named segments (/dev/shm/ringcomm-*.flock) whose creator is gone; their names.");
  m.def("shm_local_windows", &shm_local_windows, py::arg("nranks"), py::arg("slot_bytes"),
        "One window per in-process rank over one mapping.");
}

// The Engine's window and hierarchy.
inline void def_engine_windows(py::class_<EngineHandle>& engine) {
  engine
      .def("attach_window",
           [](EngineHandle& h, std::shared_ptr<ShmWindow> w, bool for_auto, size_t flat_max) {
             if (w->size() != h.get().size() || w->rank() != h.get().rank())
               throw_invalid("the window's ranks differ from the communicator's");
             h.get().attach_window(std::move(w), for_auto, flat_max);
           },
           py::arg("window"), py::arg("for_auto"), py::arg("flat_max"))
      .def("watch_processes",
           [](EngineHandle& h, std::vector<int> pids) {
             if (int(pids.size()) != h.get().size())
               throw_invalid("watch_processes needs one pid per rank (0: not watched)");
             h.get().watch_processes(std::move(pids));
           },
           py::arg("pids"))
      .def("set_hosts",
           [](EngineHandle& h, std::vector<std::string> hosts) {
             if (int(hosts.size()) != h.get().size()) throw_invalid("set_hosts needs one host name per rank");
             h.get().set_hosts(std::move(hosts));
           },
           py::arg("hosts"), "Each rank's host by name: a failure's text names the hosts of the ranks it is about.")
      .def("set_shm_auto",
           [](EngineHandle& h, bool for_auto, size_t flat_max, std::vector<size_t> shm_max,
              std::vector<size_t> shm_from) {
             h.get().set_shm_auto(for_auto, flat_max, shm_max, shm_from);
           },
           py::arg("for_auto"), py::arg("flat_max"), py::arg("shm_max") = std::vector<size_t>{},
           py::arg("shm_from") = std::vector<size_t>{},
           "Whether auto runs in the window, the one-sync limit (all_reduce, reduce), and per collective "
           "(all_reduce, reduce_scatter, all_gather, broadcast, reduce, gather, scatter, all_to_all: ringcomm.shm."
           "COLLECTIVES) the largest buffer auto runs there, and the size from which it runs there again.")
      .def("attach_hierarchy",
           [](EngineHandle& h, std::shared_ptr<ShmWindow> local, std::vector<int> members, EngineHandle& cross,
              std::vector<int> cross_members, std::vector<int> layout) {
             const int hosts = cross.get().size(), per = local->size();
             if (int(members.size()) != per || int(cross_members.size()) != hosts ||
                 layout.size() != size_t(hosts) * size_t(per) || int(layout.size()) != h.get().size())
               throw_invalid("attach_hierarchy: member lists do not match the window and the cross engine");
             HostLayout lay{hosts, per, std::move(layout)};
             for (int q = 0; q < hosts; ++q)  // the layout agrees with this rank's own two groups
               if (lay.at(q, local->rank()) != cross_members[size_t(q)])
                 throw_invalid("attach_hierarchy: the layout disagrees with the ranks between hosts");
             for (int l = 0; l < per; ++l)
               if (lay.at(cross.get().rank(), l) != members[size_t(l)])
                 throw_invalid("attach_hierarchy: the layout disagrees with this host's ranks");
             local->set_members(std::move(members));
             h.get().attach_hierarchy(std::move(local), cross.shared(), std::move(cross_members), std::move(lay));
           },
           py::arg("window"), py::arg("members"), py::arg("cross"), py::arg("cross_members"), py::arg("layout"),
           "Ranks on several hosts: this host's window (members: their ranks), the engine between hosts "
           "(cross_members: its ranks' ranks here), and layout[h * L + l]: the rank of local index l on host h.")
      .def_property_readonly("hierarchical", [](EngineHandle& h) { return h.get().hierarchical(); })
      .def_property_readonly("last_algorithm_between_hosts",
                             [](EngineHandle& h) -> py::object {
                               const int a = h.get().cross_last_algo();
                               return a < 0 ? py::object(py::none()) : py::object(py::str(algo_name(Algo(a))));
                             })
      .def("traffic_between_hosts",
           [](EngineHandle& h) { return traffic_array(h.get().cross_traffic(), h.get().size()); },
           "The inter-host part of a hierarchical communicator's ledger (by this communicator's ranks).")
      .def_property_readonly("has_window", [](EngineHandle& h) { return h.get().has_window(); })
      .def_property_readonly("window", [](EngineHandle& h) { return h.get().window(); })
      .def_property_readonly("shm_auto", [](EngineHandle& h) { return h.get().shm_auto(); })
      .def_property_readonly("shm_flat_max", [](EngineHandle& h) { return h.get().shm_flat_max(); });
}

}  // namespace bind
}  // namespace ringcomm
