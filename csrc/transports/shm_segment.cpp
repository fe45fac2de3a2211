// Shared segments (shm_segment.h).
#include "transports/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ringcomm {

namespace {

[[noreturn]] void fail_os(const std::string& what, const std::string& name, int err, int rank) {
  std::string msg = what + " " + name + ": " + std::strerror(err);
  if (err == ENOSPC || err == ENOMEM)
    msg += " (/dev/shm is full or too small: see `df -h /dev/shm`; in a container raise --shm-size, or set "
           "RINGCOMM_TRANSPORT=mpi)";
  throw RingError(ErrKind::transport, rank, -1, 0, msg);
}

std::shared_ptr<void> map_fd(int fd, size_t bytes, const std::string& name, int rank) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) fail_os("cannot map shared segment", name, err, rank);
  return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
}

}  // namespace

// Create `name` (0600, O_EXCL), reserve `bytes` and map them.
static std::shared_ptr<void> create_mapping(const std::string& name, size_t bytes, int rank) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail_os("cannot create shared segment", name, errno, rank);
  // posix_fallocate reserves every page now: on a full tmpfs it fails here
  // (ftruncate alone would succeed and a later touch would SIGBUS).
  int err = posix_fallocate(fd, 0, off_t(bytes));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    fail_os("cannot reserve " + std::to_string(bytes) + " bytes for shared segment", name, err, rank);
  }
  try {
    return map_fd(fd, bytes, name, rank);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
}

// Map `name`, which another rank created with `bytes` bytes.
static std::shared_ptr<void> open_mapping(const std::string& name, size_t bytes, int rank) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail_os("cannot open shared segment", name, errno, rank);
  struct stat st;
  if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes || st.st_uid != geteuid()) {
    close(fd);
    throw RingError(ErrKind::transport, rank, -1, 0,
                    "shared segment " + name + " is not this job's (size or owner differs)");
  }
  return map_fd(fd, bytes, name, rank);
}

std::shared_ptr<ShmWindow> shm_create(const std::string& name, int rank, int nranks, size_t slot_bytes) {
  const size_t bytes = ShmWindow::bytes_for(nranks, slot_bytes);
  std::shared_ptr<void> keep = create_mapping(name, bytes, rank);
  return std::make_shared<ShmWindow>(keep.get(), bytes, rank, nranks, slot_bytes, true, true, keep, name);
}

std::shared_ptr<ShmWindow> shm_attach(const std::string& name, int rank, int nranks, size_t slot_bytes) {
  const size_t bytes = ShmWindow::bytes_for(nranks, slot_bytes);
  std::shared_ptr<void> keep = open_mapping(name, bytes, rank);
  return std::make_shared<ShmWindow>(keep.get(), bytes, rank, nranks, slot_bytes, false, true, keep, name);
}

void shm_arena_map(ShmWindow& w, const std::string& name, size_t per_rank, bool create) {
  const size_t bytes = per_rank * size_t(w.size());
  std::shared_ptr<void> keep = create ? create_mapping(name, bytes, w.rank()) : open_mapping(name, bytes, w.rank());
  w.attach_arena(static_cast<char*>(keep.get()), per_rank, keep);
}

void shm_local_arena(const std::vector<std::shared_ptr<ShmWindow>>& windows, size_t per_rank) {
  const size_t bytes = per_rank * windows.size();
  // Reserved lazily (MAP_NORESERVE): untouched parts cost nothing.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw RingError(ErrKind::transport, 0, -1, 0, "cannot map an in-process arena");
  std::shared_ptr<void> keep(p, [bytes](void* q) { munmap(q, bytes); });
  for (auto& w : windows) w->attach_arena(static_cast<char*>(p), per_rank, keep);
}

bool shm_remove(const std::string& name) { return shm_unlink(name.c_str()) == 0; }

std::vector<std::shared_ptr<ShmWindow>> shm_local_windows(int nranks, size_t slot_bytes) {
  const size_t bytes = ShmWindow::bytes_for(nranks, slot_bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw RingError(ErrKind::transport, 0, -1, 0, "cannot map in-process window");
  std::shared_ptr<void> keep(p, [bytes](void* q) { munmap(q, bytes); });
  std::vector<std::shared_ptr<ShmWindow>> out;
  for (int r = 0; r < nranks; ++r)
    out.push_back(std::make_shared<ShmWindow>(p, bytes, r, nranks, slot_bytes, r == 0, false, keep, "in process"));
  return out;
}

}  // namespace ringcomm
