#include "shared_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "peertrain/core/error.h"

namespace peertrain::net {
namespace {

// The segment: one page of header (the fields below; `consumed` on a cache line of its
// own, since the receiver writes it while the sender reads the rest), then the ring.
constexpr std::uint64_t kRingMagic = 0x474e495254524550ULL;  // "PERTRING"
constexpr std::size_t kHeaderPage = 4096;
constexpr std::size_t kConsumedOffset = 64;
constexpr std::size_t kMaxCapacity = std::size_t{1} << 30;

struct SegmentHeader {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint64_t capacity;
};

void put64(std::byte* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
std::uint64_t get64(const std::byte* in) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

std::atomic_ref<std::uint64_t> consumed_of(std::uint64_t* consumed) {
  return std::atomic_ref<std::uint64_t>(*consumed);
}

}  // namespace

std::array<std::byte, SharedRing::Offer::kBytes> SharedRing::Offer::encode() const {
  std::array<std::byte, kBytes> bytes{};
  put64(bytes.data(), pid);
  put64(bytes.data() + 8, fd);
  put64(bytes.data() + 16, capacity);
  put64(bytes.data() + 24, nonce);
  return bytes;
}

bool SharedRing::Offer::decode(std::span<const std::byte> bytes, Offer& out) {
  if (bytes.size() != kBytes) return false;
  out.pid = get64(bytes.data());
  out.fd = get64(bytes.data() + 8);
  out.capacity = get64(bytes.data() + 16);
  out.nonce = get64(bytes.data() + 24);
  return true;
}

std::unique_ptr<SharedRing> SharedRing::create(std::size_t capacity) {
  capacity =
      std::clamp<std::size_t>((capacity + kHeaderPage - 1) / kHeaderPage * kHeaderPage, kHeaderPage, kMaxCapacity);
  std::unique_ptr<SharedRing> ring(new SharedRing);
  ring->fd_ = memfd_create("peertrain-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ring->fd_ < 0) throw Error(ErrorKind::kIo, str("memfd_create for a shared-memory ring: ", std::strerror(errno)));
  ring->map_bytes_ = kHeaderPage + capacity;
  // Sealed against shrinking: a receiver's mapping of a shrunk file would fault (SIGBUS).
  if (ftruncate(ring->fd_, static_cast<off_t>(ring->map_bytes_)) != 0 ||
      fcntl(ring->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw Error(ErrorKind::kIo, str("sizing a shared-memory ring of ", capacity, " bytes: ", std::strerror(errno)));
  ring->map_ = mmap(nullptr, ring->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, ring->fd_, 0);
  if (ring->map_ == MAP_FAILED) {
    ring->map_ = nullptr;
    throw Error(ErrorKind::kIo, str("mapping a shared-memory ring of ", capacity, " bytes: ", std::strerror(errno)));
  }
  ring->capacity_ = capacity;
  std::random_device random;
  ring->nonce_ = (static_cast<std::uint64_t>(random()) << 32 | random()) | 1;  // never 0
  auto* header = static_cast<SegmentHeader*>(ring->map_);
  *header = {kRingMagic, ring->nonce_, capacity};
  auto* base = static_cast<std::byte*>(ring->map_);
  ring->consumed_ = reinterpret_cast<std::uint64_t*>(base + kConsumedOffset);
  ring->data_ = base + kHeaderPage;
  return ring;
}

std::unique_ptr<SharedRing> SharedRing::open(const Offer& offer, std::string& why) {
  if (offer.capacity == 0 || offer.capacity > kMaxCapacity || offer.capacity % kHeaderPage != 0) {
    why = str("an offered ring of ", offer.capacity, " bytes");
    return nullptr;
  }
  const std::string path = str("/proc/", offer.pid, "/fd/", offer.fd);
  std::unique_ptr<SharedRing> ring(new SharedRing);
  // Not blocking and never a controlling terminal: the path is the peer's word, and until
  // the checks below it may name any file that process has open (a tty, a FIFO).
  ring->fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (ring->fd_ < 0) {
    why = str("cannot open ", path, ": ", std::strerror(errno), " (another host, pid namespace or user)");
    return nullptr;
  }
  struct stat st {};
  const int seals = fcntl(ring->fd_, F_GET_SEALS);
  if (fstat(ring->fd_, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) != kHeaderPage + offer.capacity || seals < 0 ||
      (seals & F_SEAL_SHRINK) == 0) {
    why = str(path, " is not a sealed ring of ", offer.capacity, " bytes");
    return nullptr;
  }
  ring->map_bytes_ = kHeaderPage + offer.capacity;
  ring->map_ = mmap(nullptr, ring->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, ring->fd_, 0);
  if (ring->map_ == MAP_FAILED) {
    ring->map_ = nullptr;
    why = str("cannot map ", path, ": ", std::strerror(errno));
    return nullptr;
  }
  const SegmentHeader header = *static_cast<const SegmentHeader*>(ring->map_);
  if (header.magic != kRingMagic || header.nonce != offer.nonce || header.capacity != offer.capacity) {
    why = str(path, " is not the ring offered (its nonce differs: a process of the same pid elsewhere?)");
    return nullptr;
  }
  // The mapping keeps the segment; the descriptor is not needed any more.
  ::close(ring->fd_);
  ring->fd_ = -1;
  ring->capacity_ = offer.capacity;
  ring->nonce_ = offer.nonce;
  auto* base = static_cast<std::byte*>(ring->map_);
  ring->consumed_ = reinterpret_cast<std::uint64_t*>(base + kConsumedOffset);
  ring->data_ = base + kHeaderPage;
  return ring;
}

SharedRing::~SharedRing() {
  if (map_) munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

SharedRing::Offer SharedRing::offer() const {
  return {static_cast<std::uint64_t>(getpid()), static_cast<std::uint64_t>(fd_), capacity_, nonce_};
}

std::uint64_t SharedRing::start_after(std::uint64_t position, std::size_t bytes) const {
  const std::uint64_t offset = position % capacity_;
  return offset + bytes > capacity_ ? position + (capacity_ - offset) : position;
}

std::ptrdiff_t SharedRing::claim(std::size_t bytes) {
  if (bytes == 0 || bytes > capacity_) return -1;
  const std::uint64_t start = start_after(position_, bytes);
  // The receiver's word is trusted only as far as it can be: never past what was claimed.
  const std::uint64_t consumed = std::min(consumed_of(consumed_).load(std::memory_order_acquire), position_);
  if (start + bytes - consumed > capacity_) return -1;
  position_ = start + bytes;
  return static_cast<std::ptrdiff_t>(start % capacity_);
}

std::ptrdiff_t SharedRing::next(std::size_t bytes) {
  if (bytes == 0 || bytes > capacity_) return -1;
  const std::uint64_t start = start_after(position_, bytes);
  position_ = start + bytes;
  return static_cast<std::ptrdiff_t>(start % capacity_);
}

void SharedRing::release() { consumed_of(consumed_).store(position_, std::memory_order_release); }

}  // namespace peertrain::net
