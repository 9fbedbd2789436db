// Payloads between two peers on one host, through shared memory instead of loopback TCP
// (NCCL's SHM transport is the model). Each direction of a link has a ring that its sender
// creates (a sealed memfd) and offers over the TCP connection; the receiver maps it through
// /proc/<pid>/fd/<fd>, which works only on the same host, in the same pid namespace, for
// the same user, and proves it by the nonce the offer carries. The TCP connection still
// carries every frame's header, in order, so ordering, heartbeats, authentication and the
// loss of a peer work as before; a shared frame's header says only that its payload lies
// in the ring.
//
// Loopback TCP copies each byte twice through the kernel and runs the whole TCP stack for
// it: 1.4 ms of system time a 2.7 MB message on a 2-core host, taken from the gradient the
// exchange overlaps (bench/dpsgd_overlap.sh). Here the sender copies the payload in once
// and the receiver copies it out once.
//
// Allocation is deterministic, so no offset travels: frames take the ring's bytes in wire
// order, each contiguous (one that would wrap starts at the beginning instead), and the
// receiver, seeing the same lengths in the same order, mirrors the sender's position.
// The receiver publishes how far it has copied out (`consumed`, in the segment); the
// sender claims only bytes below that, and sends a frame inline over TCP when the ring has
// no room for it, which the receiver tells from the header.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace peertrain::net {

class SharedRing {
 public:
  // What the sender tells the receiver: where to find the segment and how to know it.
  struct Offer {
    std::uint64_t pid = 0;
    std::uint64_t fd = 0;
    std::uint64_t capacity = 0;
    std::uint64_t nonce = 0;
    static constexpr std::size_t kBytes = 32;
    std::array<std::byte, kBytes> encode() const;
    // False when the bytes are not an offer.
    static bool decode(std::span<const std::byte> bytes, Offer& out);
  };

  // The sender's side: a fresh ring of `capacity` bytes in a memfd of this process. Throws
  // Error(kIo) when the segment cannot be made.
  static std::unique_ptr<SharedRing> create(std::size_t capacity);
  // The receiver's side: maps the ring of `offer`, or returns null and says why (another
  // host, another pid namespace or user, a segment that is not the one offered).
  static std::unique_ptr<SharedRing> open(const Offer& offer, std::string& why);

  ~SharedRing();
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  Offer offer() const;
  std::size_t capacity() const { return capacity_; }
  std::byte* data() const { return data_; }

  // Sender: room for a payload of `bytes` in wire order; its offset in data(), or -1 when
  // the ring is too full (or too small) and the frame must go inline.
  std::ptrdiff_t claim(std::size_t bytes);
  // Receiver: the offset of the next shared payload of `bytes`, as the sender claimed it.
  // -1 when no sender could have claimed it (more than the ring holds).
  std::ptrdiff_t next(std::size_t bytes);
  // Receiver: everything up to the last next() has been copied out; the sender may reuse it.
  void release();

 private:
  SharedRing() = default;
  // Where a payload of `bytes` starts after `position` (the ring's running byte count).
  std::uint64_t start_after(std::uint64_t position, std::size_t bytes) const;

  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::size_t capacity_ = 0;
  std::uint64_t nonce_ = 0;
  std::byte* data_ = nullptr;
  std::uint64_t* consumed_ = nullptr;  // in the segment; accessed atomically
  std::uint64_t position_ = 0;         // sender: bytes claimed; receiver: bytes mirrored
};

}  // namespace peertrain::net
