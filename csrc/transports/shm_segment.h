// Shared segments for ShmWindow (core/shm_window.h): how the ranks of one
// host map the same memory.
//
// Between processes: a file in /dev/shm that never has a name while it can
// be left behind. One rank creates it unnamed (O_TMPFILE, mode 0600: only the
// job's user can read the gradients or write into them), reserves its pages
// (posix_fallocate: a full /dev/shm is an error here, never a SIGBUS on a
// later touch) and keeps it open; the others open it through the creator's
// descriptor, /proc/<pid>/fd/<fd>, checking that it is that file (device and
// inode). The file lives exactly as long as a mapping or a descriptor of it:
// a SIGKILL of every rank at any moment leaves nothing in /dev/shm.
//
// Where a peer cannot reach the creator's /proc (another pid namespace: a
// container that shares /dev/shm but not the pids, or a process it may not
// inspect), the creator gives the file a name (".flock") for as long as the
// hand-shake needs it. It holds an flock on the file from before the name
// exists until after it removed it, so a named file whose lock anyone can
// take has lost its creator: shm_sweep() removes those (any later hand-shake
// on the host sweeps first).
// The bootstrap (ringcomm/shm/) hands the creator's pid, descriptor,
// device and inode (or the name) to the others.
//
// In process: one anonymous mapping shared by the threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/shm_window.h"

namespace ringcomm {

// An open file of a shared segment: the creator's (made unnamed, locked) or
// a peer's. Errors are RingError(transport) naming the cause (a full
// /dev/shm: ENOSPC).
class ShmFile {
 public:
  // Create an unnamed file of `bytes` bytes in /dev/shm, locked (flock),
  // its pages reserved.
  static std::shared_ptr<ShmFile> create(size_t bytes, int rank);
  // Open `path` (/proc/<pid>/fd/<fd> or /dev/shm/<name>), which must be the
  // file `dev`/`ino` of `bytes` bytes and this user's.
  static std::shared_ptr<ShmFile> open(const std::string& path, uint64_t dev, uint64_t ino, size_t bytes,
                                       int rank);
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;
  ~ShmFile();

  // Give the creator's file the name `name` ("/ringcomm-....flock") in
  // /dev/shm (shm_remove takes it away again).
  void link(const std::string& name);
  // Map the whole file (read-write, shared); the mapping outlives close().
  std::shared_ptr<void> map() const;
  // Close the descriptor (and so drop the lock). Idempotent.
  void close();

  int fd() const { return fd_; }
  uint64_t dev() const { return dev_; }
  uint64_t ino() const { return ino_; }
  size_t bytes() const { return bytes_; }
  // What names it in messages ("/dev/shm inode N").
  std::string label() const;

 private:
  ShmFile(int fd, size_t bytes, int rank);
  int fd_;
  uint64_t dev_ = 0, ino_ = 0;
  size_t bytes_;
  int rank_;
};

// The window over `file` for `rank`: laid out afresh (`create`: the
// creator's) or checked against its layout.
std::shared_ptr<ShmWindow> shm_window(const ShmFile& file, int rank, int nranks, size_t slot_bytes, bool create);
// Remove the name (the mappings stay). False when it was already gone.
bool shm_remove(const std::string& name);
// Remove the named segments of this user ("ringcomm-*.flock" in /dev/shm)
// whose creator is gone (no one holds their lock). Returns their names.
// Never throws: what cannot be looked at is left alone.
std::vector<std::string> shm_sweep();
// One window per in-process rank, over one anonymous mapping.
std::vector<std::shared_ptr<ShmWindow>> shm_local_windows(int nranks, size_t slot_bytes);
// The window's shared arena (ShmWindow::attach_arena): `per_rank` bytes per
// rank in `file` (made and shared like the window's); in process, one
// anonymous mapping for every rank's window.
void shm_arena_map(ShmWindow& w, const ShmFile& file, size_t per_rank);
void shm_local_arena(const std::vector<std::shared_ptr<ShmWindow>>& windows, size_t per_rank);

}  // namespace ringcomm
