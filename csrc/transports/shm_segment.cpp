// Shared segments (shm_segment.h).
#include "transports/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ringcomm {

namespace {

// Where POSIX shared memory lives (glibc's shm_open uses the same directory):
// the segments count against its size, as an administrator or a container's
// --shm-size set it.
constexpr const char* kDir = "/dev/shm";
constexpr const char* kPrefix = "ringcomm-";
constexpr const char* kLocked = ".flock";  // the names a creator's flock guards (shm_sweep)

[[noreturn]] void fail_os(const std::string& what, const std::string& name, int err, int rank) {
  std::string msg = what + " " + name + ": " + std::strerror(err);
  if (err == ENOSPC || err == ENOMEM)
    msg += " (/dev/shm is full or too small: see `df -h /dev/shm`; in a container raise --shm-size, or set "
           "RINGCOMM_TRANSPORT=mpi)";
  throw RingError(ErrKind::transport, rank, -1, 0, msg);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

ShmFile::ShmFile(int fd, size_t bytes, int rank) : fd_(fd), bytes_(bytes), rank_(rank) {
  struct stat st;
  if (fstat(fd_, &st) != 0) {
    const int err = errno;
    close();
    fail_os("cannot look at shared segment", "in " + std::string(kDir), err, rank);
  }
  dev_ = uint64_t(st.st_dev);
  ino_ = uint64_t(st.st_ino);
}

ShmFile::~ShmFile() { close(); }

void ShmFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string ShmFile::label() const { return std::string(kDir) + " inode " + std::to_string(ino_); }

std::shared_ptr<ShmFile> ShmFile::create(size_t bytes, int rank) {
  // Unnamed: nothing in /dev/shm can outlive the processes that map it.
  const int fd = ::open(kDir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail_os("cannot create a shared segment in", kDir, errno, rank);
  std::shared_ptr<ShmFile> f(new ShmFile(fd, bytes, rank));
  // Locked before it can get a name (link): a sweep never takes a live
  // creator's file. (Blocks no one: no other process has it open yet.)
  if (flock(fd, LOCK_EX) != 0) fail_os("cannot lock shared segment", f->label(), errno, rank);
  // posix_fallocate reserves every page now: on a full tmpfs it fails here
  // (ftruncate alone would succeed and a later touch would SIGBUS).
  const int err = posix_fallocate(fd, 0, off_t(bytes));
  if (err != 0)
    fail_os("cannot reserve " + std::to_string(bytes) + " bytes for shared segment", f->label(), err, rank);
  return f;
}

std::shared_ptr<ShmFile> ShmFile::open(const std::string& path, uint64_t dev, uint64_t ino, size_t bytes,
                                       int rank) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail_os("cannot open shared segment", path, errno, rank);
  std::shared_ptr<ShmFile> f(new ShmFile(fd, bytes, rank));
  // The creator's descriptor number, or a name, may since stand for another
  // file (a pid reused, another pid namespace's process): only the file
  // the creator described is mapped.
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_dev) != dev || uint64_t(st.st_ino) != ino ||
      size_t(st.st_size) != bytes || st.st_uid != geteuid())
    throw RingError(ErrKind::transport, rank, -1, 0,
                    path + " is not the shared segment rank 0 made (" + std::string(kDir) + " inode " +
                        std::to_string(ino) + "): another file, or another user's");
  return f;
}

void ShmFile::link(const std::string& name) {
  const std::string path = std::string(kDir) + name;
  // An unnamed file is linked through its /proc entry (AT_EMPTY_PATH, the
  // other way, needs CAP_DAC_READ_SEARCH).
  const std::string self = "/proc/self/fd/" + std::to_string(fd_);
  if (linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0 &&
      linkat(fd_, "", AT_FDCWD, path.c_str(), AT_EMPTY_PATH) != 0)
    fail_os("cannot name shared segment", path, errno, rank_);
}

std::shared_ptr<void> ShmFile::map() const {
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) fail_os("cannot map shared segment", label(), errno, rank_);
  const size_t bytes = bytes_;
  return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
}

std::shared_ptr<ShmWindow> shm_window(const ShmFile& file, int rank, int nranks, size_t slot_bytes, bool create) {
  const size_t bytes = ShmWindow::bytes_for(nranks, slot_bytes);
  if (file.bytes() != bytes) throw_invalid("shm_window: the file's size is not the window's");
  std::shared_ptr<void> keep = file.map();
  return std::make_shared<ShmWindow>(keep.get(), bytes, rank, nranks, slot_bytes, create, true, keep, file.label());
}

void shm_arena_map(ShmWindow& w, const ShmFile& file, size_t per_rank) {
  if (file.bytes() != per_rank * size_t(w.size())) throw_invalid("shm_arena_map: the file's size is not the arena's");
  std::shared_ptr<void> keep = file.map();
  w.attach_arena(static_cast<char*>(keep.get()), per_rank, keep);
}

bool shm_remove(const std::string& name) { return unlink((std::string(kDir) + name).c_str()) == 0; }

std::vector<std::string> shm_sweep() {
  std::vector<std::string> gone;
  DIR* d = opendir(kDir);
  if (!d) return gone;
  const int dir = dirfd(d);
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, std::strlen(kPrefix), kPrefix) != 0 || !ends_with(name, kLocked)) continue;
    const int fd = openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;  // another user's (mode 0600), or gone meanwhile
    struct stat st, now;
    // Only this user's, and only while no one holds the lock: a creator
    // holds it from before the name exists until after it removed the name.
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        fstatat(dir, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == st.st_ino &&
        now.st_dev == st.st_dev && unlinkat(dir, name.c_str(), 0) == 0)
      gone.push_back("/" + name);
    ::close(fd);
  }
  closedir(d);
  return gone;
}

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

void shm_local_arena(const std::vector<std::shared_ptr<ShmWindow>>& windows, size_t per_rank) {
  const size_t bytes = per_rank * windows.size();
  // Reserved lazily (MAP_NORESERVE): untouched parts cost nothing.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw RingError(ErrKind::transport, 0, -1, 0, "cannot map an in-process arena");
  std::shared_ptr<void> keep(p, [bytes](void* q) { munmap(q, bytes); });
  for (auto& w : windows) w->attach_arena(static_cast<char*>(p), per_rank, keep);
}

}  // namespace ringcomm
