// Shared segments for ShmWindow (core/shm_window.h): how the ranks of one
// host map the same memory.
//
// Between processes: a POSIX shared-memory object (/dev/shm) created by one
// rank with mode 0600 (only the job's user can read the gradients or write
// into them) and O_EXCL (a name never reused), its pages reserved with
// posix_fallocate (a full /dev/shm is an error here, never a SIGBUS on a
// later touch), mapped by every rank, then unlinked by the creator once all
// have mapped it (the bootstrap's barrier), so a crash leaves nothing behind.
// The bootstrap (ringcomm/shm.py) picks the name (user, job, random nonce)
// and hands it to the others.
//
// In process: one anonymous mapping shared by the threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/shm_window.h"

namespace ringcomm {

// Create the segment `name` ("/ringcomm-..."), lay it out, map it for `rank`.
// Throws RingError(transport) naming the cause (a full /dev/shm: ENOSPC).
std::shared_ptr<ShmWindow> shm_create(const std::string& name, int rank, int nranks, size_t slot_bytes);
// Map the segment another rank created.
std::shared_ptr<ShmWindow> shm_attach(const std::string& name, int rank, int nranks, size_t slot_bytes);
// Remove the name (the mappings stay). False when it was already gone.
bool shm_remove(const std::string& name);
// One window per in-process rank, over one anonymous mapping.
std::vector<std::shared_ptr<ShmWindow>> shm_local_windows(int nranks, size_t slot_bytes);
// The window's shared arena (ShmWindow::attach_arena): `per_rank` bytes per
// rank in a segment created (`create`) or mapped like the window's; in
// process, one anonymous mapping for every rank's window.
void shm_arena_map(ShmWindow& w, const std::string& name, size_t per_rank, bool create);
void shm_local_arena(const std::vector<std::shared_ptr<ShmWindow>>& windows, size_t per_rank);

}  // namespace ringcomm
