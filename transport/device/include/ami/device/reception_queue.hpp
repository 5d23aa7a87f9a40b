// ami/device/reception_queue.hpp — a bounded ring of fixed-size cells that
// packets arrive in, one per receiving context.
//
// The ring is laid out in memory it does not own (heap for the self backend,
// a shared segment for shm), holds offsets and counters only, never
// pointers, and starts with a versioned header checked on attach. Producers
// (any number, any process) reserve a cell, fill it and commit it; a reserved
// cell that is not wanted after all is discarded, which the consumer skips.
// Each cell carries a sequence number published with release and read with
// acquire (the bounded queue of D. Vyukov): a producer may fill its cell
// while others fill theirs. Head and tail live on separate cache lines.
// One consumer: the thread advancing the receiving context. The shape is
// copied out of the header when the ring is created or attached, so a peer
// scribbling on the header later cannot steer writes outside the ring.
//
// Sleeping (docs/DESIGN.md, "Event-driven progress"): a consumer about to
// sleep sets kArmed in the tail word, which it can only do while the ring
// is empty (tail == consumed). The producer whose reservation takes that
// word clears the bit by the same compare-and-swap and learns so from its
// Reservation (wake): it must wake the consumer once it has committed or
// discarded the cell. A producer that finds the bit clear pays nothing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace ami::device {

inline constexpr std::size_t kCacheLine = 64;

class ReceptionQueue {
 public:
  static constexpr std::uint32_t kMagic = 0x51524D41;  // "AMRQ"
  static constexpr std::uint32_t kVersion = 2;  // 2: kArmed in the tail word

  struct alignas(kCacheLine) Header {
    std::uint32_t magic;
    std::uint32_t version;
    std::uint32_t depth;       // cells, a power of two
    std::uint32_t cell_bytes;  // stride of one cell, a multiple of kCacheLine
    std::uint64_t cells_offset;
    alignas(kCacheLine) std::atomic<std::uint64_t> tail;  // next cell to reserve, | kArmed
    alignas(kCacheLine) std::atomic<std::uint64_t> head;  // next cell to consume
  };

  // Who sent a cell and what the backend put in it. The receiver treats it
  // as a claim to check, not a fact.
  struct Origin {
    std::uint32_t task = 0;
    std::uint16_t context = 0;
    std::uint16_t kind = 0;  // the backend's: protocol packet or its own traffic
  };

  struct Cell {
    std::atomic<std::uint64_t> sequence;
    std::uint32_t length;  // bytes of data; kDiscarded marks a discarded cell
    std::uint32_t origin_task;
    std::uint16_t origin_context;
    std::uint16_t kind;
    std::uint32_t reserved;
    // data follows
  };
  static constexpr std::uint32_t kDiscarded = 0xFFFFFFFFu;
  // In the tail word: the consumer sleeps until woken (see arm()).
  static constexpr std::uint64_t kArmed = std::uint64_t{1} << 63;
  static constexpr std::size_t kCellHeader = sizeof(Cell);
  static_assert(kCellHeader == 24);

  static std::size_t bytes_needed(std::uint32_t depth, std::uint32_t cell_bytes) {
    return sizeof(Header) + std::size_t{depth} * cell_bytes;
  }
  static bool valid_shape(std::uint32_t depth, std::uint32_t cell_bytes) {
    return depth >= 2 && (depth & (depth - 1)) == 0 && cell_bytes >= 2 * kCacheLine &&
           cell_bytes % kCacheLine == 0;
  }

  ReceptionQueue() = default;

  // Lays a fresh ring out in memory (kCacheLine-aligned, bytes_needed() long).
  static ReceptionQueue create(void* memory, std::uint32_t depth, std::uint32_t cell_bytes) {
    auto* h = new (memory) Header{};
    h->magic = kMagic;
    h->version = kVersion;
    h->depth = depth;
    h->cell_bytes = cell_bytes;
    h->cells_offset = sizeof(Header);
    h->tail.store(0, std::memory_order_relaxed);
    h->head.store(0, std::memory_order_relaxed);
    ReceptionQueue q(h);
    for (std::uint32_t i = 0; i < depth; ++i) {
      Cell* c = new (q.cell(i)) Cell{};
      c->sequence.store(0, std::memory_order_relaxed);  // ready means position + 1 >= 1
    }
    std::atomic_thread_fence(std::memory_order_release);
    return q;
  }

  // Checks the header of a ring made elsewhere; false if it is not one.
  static bool attach(void* memory, std::size_t bytes, ReceptionQueue& out) {
    if (bytes < sizeof(Header)) return false;
    auto* h = static_cast<Header*>(memory);
    if (h->magic != kMagic || h->version != kVersion) return false;
    if (!valid_shape(h->depth, h->cell_bytes) || h->cells_offset != sizeof(Header)) return false;
    if (bytes_needed(h->depth, h->cell_bytes) > bytes) return false;
    out = ReceptionQueue(h);
    return true;
  }

  bool valid() const { return header_ != nullptr; }
  std::uint32_t depth() const { return depth_; }
  std::size_t max_data() const { return cell_bytes_ - kCellHeader; }

  // Producer side. A reservation holds one cell until commit() or discard().
  struct Reservation {
    Cell* cell = nullptr;
    std::uint64_t position = 0;
    bool wake = false;  // this reservation took kArmed: wake the consumer after commit()
    std::byte* data() const { return reinterpret_cast<std::byte*>(cell) + kCellHeader; }
    explicit operator bool() const { return cell != nullptr; }
  };

  Reservation reserve() {
    std::atomic_ref<std::uint64_t> cached(cached_head_);
    std::uint64_t word = header_->tail.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t pos = word & ~kArmed;
      // Acquire and release on the cached head too: a producer that uses a
      // head another producer read must be ordered after the consumer's
      // reads of the cells that head frees, as the reader was.
      if (pos - cached.load(std::memory_order_acquire) >= depth_) {
        // Looks full: see how far the consumer really is. The acquire pairs
        // with its release of the cell we are about to reuse.
        const std::uint64_t head = header_->head.load(std::memory_order_acquire);
        cached.store(head, std::memory_order_release);
        if (pos - head >= depth_) return {};  // full
      }
      if (header_->tail.compare_exchange_weak(word, pos + 1, std::memory_order_acquire,
                                              std::memory_order_relaxed))
        return {cell(pos), pos, (word & kArmed) != 0};
    }
  }

  // False if the consumer gave the cell up (give_up()) before it was
  // committed: the packet is lost and the producer must say so. A look and
  // a store, not a compare-and-swap: the locked instruction would wait for
  // the cache line on every packet and cost the ring 40% of its message
  // rate. The look catches every give-up but one that falls between it and
  // the store — after the producer has stalled for the whole timeout — and
  // that store then leaves the cell as the give-up did.
  [[nodiscard]] bool commit(const Reservation& r, std::uint32_t length, Origin origin) {
    r.cell->length = length;
    r.cell->origin_task = origin.task;
    r.cell->origin_context = origin.context;
    r.cell->kind = origin.kind;
    if (r.cell->sequence.load(std::memory_order_relaxed) != free_mark(r.position)) return false;
    r.cell->sequence.store(r.position + 1, std::memory_order_release);
    return true;
  }
  [[nodiscard]] bool discard(const Reservation& r) { return commit(r, kDiscarded, {}); }

  // Consumer side: the next committed cell's data, or an empty span. A
  // discarded cell is released and skipped.
  struct Arrival {
    std::span<const std::byte> data;
    Origin origin;
  };
  bool peek(Arrival& out) {
    for (;;) {
      const std::uint64_t pos = consumed_;
      Cell* c = cell(pos);
      if (c->sequence.load(std::memory_order_acquire) != pos + 1) return false;
      if (c->length == kDiscarded || c->length > max_data()) {
        release();  // discarded, or a length no honest producer writes
        continue;
      }
      out.data = {reinterpret_cast<const std::byte*>(c) + kCellHeader, c->length};
      out.origin = Origin{c->origin_task, c->origin_context, c->kind};
      return true;
    }
  }
  // Consumer side: whether the next cell is reserved but not committed, and
  // its position. A producer holds a cell for a few instructions; one that
  // holds it for long has most likely died there, and every cell behind it
  // waits. Reads the producers' tail: not for every poll.
  bool stalled(std::uint64_t& position) const {
    position = consumed_;
    return tail() > consumed_ && cell(consumed_)->sequence.load(std::memory_order_acquire) != consumed_ + 1;
  }
  // Consumer side: skips the stalled cell at position (stalled() said so),
  // unless its producer commits it first. Its commit() then fails, so the
  // cell is never written to after the consumer went past it. True if the
  // cell was skipped.
  bool give_up(std::uint64_t position) {
    if (position != consumed_) return false;
    std::uint64_t expected = free_mark(position);
    if (!cell(position)->sequence.compare_exchange_strong(expected, position + 1, std::memory_order_acq_rel,
                                                         std::memory_order_acquire))
      return false;  // committed meanwhile: peek() delivers it
    release();
    return true;
  }
  // Cells reserved by producers and not yet released by the consumer: how
  // full the queue is, as the consumer sees it (a hint, not a promise).
  std::uint32_t occupancy() const {
    const std::uint64_t tail = header_->tail.load(std::memory_order_relaxed) & ~kArmed;
    const std::uint64_t head = consumed_;
    return tail > head ? static_cast<std::uint32_t>(std::min<std::uint64_t>(tail - head, depth_)) : 0;
  }
  // Producer side: cells reserved by all producers that the consumer has
  // not handed back yet (it does so in batches: a hint, from above). The
  // head first: a tail read before it could lie behind it.
  std::uint64_t unconsumed() const {
    const std::uint64_t head = header_->head.load(std::memory_order_acquire);
    const std::uint64_t tail = header_->tail.load(std::memory_order_acquire) & ~kArmed;
    return tail > head ? tail - head : 0;
  }
  // Consumer side: cells reserved so far by all producers, and consumed so
  // far. Every cell a producer had reserved when tail() was read lies below
  // it: once consumed() reaches it, none of them is left.
  std::uint64_t tail() const { return header_->tail.load(std::memory_order_acquire) & ~kArmed; }
  // Consumer side, before it sleeps: true when the ring is empty (nothing
  // reserved past what was consumed) and kArmed is now set, so the next
  // producer wakes the consumer; false when a cell came, to consume first.
  // The bit stays until a producer takes it: a consumer that went on
  // polling costs that producer one needless wake-up, nothing more.
  bool arm() {
    std::uint64_t word = header_->tail.load(std::memory_order_acquire);
    if (word == (consumed_ | kArmed)) return true;
    if (word != consumed_) return false;
    return header_->tail.compare_exchange_strong(word, consumed_ | kArmed, std::memory_order_acq_rel,
                                                 std::memory_order_acquire) ||
           word == (consumed_ | kArmed);
  }
  std::uint64_t consumed() const { return consumed_; }
  // Done with the cell peek() returned. It goes back to the producers (the
  // head moves) once credit_batch() cells are done, or at publish().
  void release() {
    ++consumed_;
    if (consumed_ - published_ >= credit_batch_) publish();
  }
  // Hands every cell released so far back to the producers; returns how many.
  std::uint64_t publish() {
    const std::uint64_t n = consumed_ - published_;
    if (n != 0) {
      header_->head.store(consumed_, std::memory_order_release);
      published_ = consumed_;
    }
    return n;
  }
  // Cells released before the head moves: 1 (the default) returns each at
  // once; a larger batch touches the producers' cache line less often and
  // holds back at most batch - 1 cells. Clamped to [1, depth / 2].
  void set_credit_batch(std::uint32_t batch) {
    credit_batch_ = std::clamp<std::uint32_t>(batch, 1, std::max<std::uint32_t>(1, depth_ / 2));
  }
  std::uint32_t credit_batch() const { return credit_batch_; }

 private:
  explicit ReceptionQueue(Header* h)
      : header_(h), cells_(reinterpret_cast<std::byte*>(h) + sizeof(Header)), depth_(h->depth),
        cell_bytes_(h->cell_bytes), consumed_(h->head.load(std::memory_order_acquire)),
        published_(consumed_) {}
  // A cell's sequence while free for the producer of position pos: what the
  // commit of the round before left there, or 0 from create().
  std::uint64_t free_mark(std::uint64_t pos) const { return pos >= depth_ ? pos - depth_ + 1 : 0; }
  Cell* cell(std::uint64_t pos) const {
    return reinterpret_cast<Cell*>(cells_ + (pos & (depth_ - 1)) * cell_bytes_);
  }

  Header* header_ = nullptr;
  std::byte* cells_ = nullptr;
  std::uint32_t depth_ = 0;
  std::uint32_t cell_bytes_ = 0;
  std::uint64_t cached_head_ = 0;  // a producer's last look at the head (atomic_ref: several threads)
  // The consumer's own: the next cell to consume, the head last published.
  std::uint64_t consumed_ = 0;
  std::uint64_t published_ = 0;
  std::uint32_t credit_batch_ = 1;
};

}  // namespace ami::device
