// bootstrap_tree.cpp — the tree the tables travel down (the shape and the
// reasons are in bootstrap.hpp): the Table, rank 0 telling each rank where
// its parent listens, a child's link to its parent, and the table's way from
// rank 0 to every rank, read from the parent as untrusted input, checked, and
// forwarded to the children as it is.
#include <algorithm>

#include "ami/error.hpp"
#include "bootstrap_impl.hpp"

namespace ami::bootstrap {

using namespace wire;

// ---- the table ----------------------------------------------------------

std::span<const std::byte> Table::operator[](std::uint32_t rank) const {
  const std::size_t end = rank + 1 < starts_.size() ? starts_[rank + 1] : frame_bytes_;
  return std::span<const std::byte>(frame()).subspan(starts_[rank], end - starts_[rank]);
}

std::vector<Blob> Table::blobs() const {
  std::vector<Blob> all(size());
  for (std::uint32_t r = 0; r < size(); ++r) all[r].assign((*this)[r].begin(), (*this)[r].end());
  return all;
}

// A table of `count` blobs whose lengths are in `lengths` (count words, as
// on the wire): the frame allocated, its head written, room for the blobs.
Table TcpBootstrap::Impl::table_for(std::span<const std::byte> lengths) {
  Table table;
  const std::size_t count = lengths.size() / 4;
  std::size_t total = 4 + lengths.size();
  table.starts_.resize(count);
  for (std::size_t r = 0; r < count; ++r) {
    table.starts_[r] = total;
    total += get_u32(&lengths[4 * r]);
  }
  table.frame_ = std::make_unique_for_overwrite<std::byte[]>(total);
  table.frame_bytes_ = total;
  put_u32(table.frame_.get(), static_cast<std::uint32_t>(count));
  std::ranges::copy(lengths, table.frame_.get() + 4);
  return table;
}

Table TcpBootstrap::Impl::pack(const std::vector<Blob>& all) {
  Blob lengths;
  for (const Blob& b : all) append_u32(lengths, static_cast<std::uint32_t>(b.size()));
  Table table = table_for(lengths);
  for (std::size_t r = 0; r < all.size(); ++r) std::ranges::copy(all[r], table.frame_.get() + table.starts_[r]);
  return table;
}

// ---- wiring the tree ----------------------------------------------------

// Rank 0's children are reached over the star; everyone else's have links of
// their own.
std::vector<TcpBootstrap::Impl::Member*> TcpBootstrap::Impl::downstream() {
  std::vector<Member*> links;
  if (options.rank != 0) {
    for (auto& [rank, m] : children) links.push_back(&m);
    return links;
  }
  for (std::uint64_t r = first_child(0); r < end_of_children(0, options.size); ++r)
    links.push_back(&members.at(static_cast<std::uint32_t>(r)));
  return links;
}

// A rank with children listens where it reaches rank 0 from (its
// local_host, when it has one): an address its children, which reach rank 0
// too, are likeliest to reach. Opened before its
// hello, since the hello says the port; its children connect once the whole
// job has joined, and until this rank serves them the kernel holds them.
void TcpBootstrap::Impl::open_children_acceptor() {
  error_code ec;
  const tcp::endpoint star = root().socket.local_endpoint(ec);
  if (ec) fail_now(ec.message(), root().name, "finding the address it reaches rank 0 from");
  open_acceptor({star.address(), 0});
}

// Rank 0, once the job has formed: every rank whose parent is not rank 0
// learns where its parent listens, the address rank 0 sees the parent at and
// the port the parent said. A frame of a few bytes each, after the answer:
// it fits in the socket's buffer.
void TcpBootstrap::Impl::tell_parents() {
  const std::string step = "telling it where its parent listens";
  for (auto& [rank, m] : members) {
    if (parent_of(rank) == 0) continue;
    Member& up = members.at(parent_of(rank));
    error_code ec;
    const asio::ip::address address = up.socket.remote_endpoint(ec).address();
    if (ec) fail_now(ec.message(), up.name, step);
    if (!send_now(m.socket, parent_frame(address.to_string(), up.children_port)))
      fail_now("could not send it where its parent listens", m.name, step);
  }
}

// A rank other than 0, once rank 0 has answered: the link to a parent other
// than rank 0, then its own children's links.
void TcpBootstrap::Impl::join_tree(Clock::time_point deadline) {
  const std::uint32_t up = parent_of(options.rank);
  if (up != 0) {
    const tcp::endpoint at = read_parent_address(deadline);
    parent.emplace(Member{tcp::socket(io), up, "rank " + std::to_string(up) + " at " + endpoint_text(at)});
    join(*parent, {at}, deadline);
  }
  if (has_children(options.rank, options.size)) serve(deadline);
}

// Rank 0's frame comes once every rank has joined: until then this rank
// waits here (or learns that rank 0 failed, and why).
tcp::endpoint TcpBootstrap::Impl::read_parent_address(Clock::time_point deadline) {
  const std::string step = "waiting to learn where its parent listens";
  const std::uint32_t length = read_word(root(), deadline, step);
  if (length == kFailureMark) sender_failed(root(), deadline, step);
  if (length > kMaxHostBytes)
    fail_now("malformed parent address: a host of " + std::to_string(length) + " bytes exceeds the limit of " +
                 std::to_string(kMaxHostBytes),
             root().name, step);
  std::string host(length, '\0');
  if (length != 0) read_exact(root(), asio::buffer(host), deadline, step);
  const std::uint32_t port = read_word(root(), deadline, step);
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec || port == 0 || port > 65535)
    fail_now("malformed parent address: '" + printable(host) + "' port " + std::to_string(port), root().name, step);
  return {address, static_cast<std::uint16_t>(port)};
}

// ---- the table's way down -----------------------------------------------

// Reads the table from the parent (rank 0 itself for its children): the
// count, the lengths, each checked as it comes, then the blobs into one
// buffer of the size the lengths add up to. The table must hold this rank's
// own blob as it was sent.
Table TcpBootstrap::Impl::receive_table(std::span<const std::byte> mine, Clock::time_point deadline) {
  Member& from = upstream();
  const std::string step = "reading the blob table";
  const bool watch = &from != &root();
  if (watch) watch_root(step);
  const std::uint32_t count = read_word(from, deadline, step);
  if (count == kFailureMark) sender_failed(from, deadline, step);
  if (count != options.size)
    fail_now("malformed table: " + std::to_string(count) + " entries for a job of " + std::to_string(options.size),
             from.name, step);
  Blob lengths(4 * std::size_t{count});
  read_lengths(from, lengths, deadline, step);
  Table table = table_for(lengths);
  const std::size_t head = 4 + lengths.size();
  if (table.frame_bytes_ > head)
    read_exact(from, asio::buffer(table.frame_.get() + head, table.frame_bytes_ - head), deadline, step);
  if (watch) stop_watching_root(deadline);
  if (!std::ranges::equal(table[options.rank], mine))
    fail_now("malformed table: the blob it holds for this rank is not the one this rank sent", from.name, step);
  return table;
}

// The lengths as they arrive, so that an oversize one is refused at once,
// not after the rest of the table (which may never come).
void TcpBootstrap::Impl::read_lengths(Member& from, std::span<std::byte> words, Clock::time_point deadline,
                                      const std::string& step) {
  std::size_t have = 0, checked = 0;
  while (have < words.size()) {
    std::size_t got = 0;
    const error_code ec = wait_one(from, deadline, step, [&](auto done) {
      from.socket.async_read_some(asio::buffer(words.data() + have, words.size() - have),
                                  [&got, done](const error_code& e, std::size_t n) {
                                    got = n;
                                    done(e, n);
                                  });
    });
    if (ec) fail_now(is_closed(ec) ? "peer closed the connection" : ec.message(), from.name, step);
    for (have += got; checked + 4 <= have; checked += 4)
      if (const std::uint32_t length = get_u32(&words[checked]); length > kMaxBlobBytes)
        fail_now("malformed table: a blob length of " + std::to_string(length) + " bytes exceeds the limit of " +
                     std::to_string(kMaxBlobBytes),
                 from.name, step);
  }
}

// While a rank reads the table from a parent other than rank 0, rank 0 may
// fail (a rank died before sending its blob, say) and say why on the star:
// the notice is read here, so that this rank fails at once with rank 0's
// reason. Rank 0 closing without a notice is no failure of this exchange:
// rank 0 may be done with it and gone; if it failed, its children fail, and
// the failure comes down the tree.
void TcpBootstrap::Impl::watch_root(const std::string& step) {
  watching_root = true;
  asio::async_read(root().socket, asio::buffer(root_word), [this, step](const error_code& ec, std::size_t) {
    if (ec) return (void)(watching_root = false);
    if (const std::uint32_t word = get_u32(root_word.data()); word != kFailureMark) {
      watching_root = false;
      return fail("malformed frame: " + hex(word) + " where only a failure notice may come", root().name, step);
    }
    asio::async_read(root().socket, asio::buffer(root_word), [this, step](const error_code& e, std::size_t) {
      const std::uint32_t length = get_u32(root_word.data());
      if (e || length > kMaxReasonBytes) {
        watching_root = false;
        return fail(e ? "rank 0 failed (its notice was cut short)"
                      : "malformed failure notice: a reason of " + std::to_string(length) +
                            " bytes exceeds the limit of " + std::to_string(kMaxReasonBytes),
                    root().name, step);
      }
      root_reason.assign(length, '\0');
      asio::async_read(root().socket, asio::buffer(root_reason), [this, step](const error_code& e2, std::size_t) {
        watching_root = false;
        fail("rank 0 failed" + (e2 ? std::string(" (its notice was cut short)") : ": " + printable(root_reason)),
             root().name, step);
      });
    });
  });
}

// The table came whole: no notice is pending, and nothing may stay queued on
// the star between exchanges (the connection watch reads it then).
void TcpBootstrap::Impl::stop_watching_root(Clock::time_point deadline) {
  error_code ignored;
  root().socket.cancel(ignored);
  run(deadline, [&] { return !watching_root; }, [&] { return root().name + ", reading the blob table"; });
}

// Sends the table to every child at once, the received bytes as they are.
void TcpBootstrap::Impl::forward(const Table& table, Clock::time_point deadline) {
  const std::vector<Member*> links = downstream();
  std::size_t writes = links.size();
  const std::string step = "receiving the blob table";
  for (Member* m : links) {
    m->sending = true;
    asio::async_write(m->socket, asio::buffer(table.frame_.get(), table.frame_bytes_),
                      [this, m, &writes, &step](const error_code& ec, std::size_t n) {
      m->sending = false;
      bytes_sent += n;
      if (completed(ec, m->name, step)) --writes;
    });
  }
  run(deadline, [&] { return writes == 0; }, [&] {
    Listing missing;
    for (const Member* m : links)
      if (m->sending) missing.add(m->name);
    return missing.text() + ", " + step;
  });
}

}  // namespace ami::bootstrap
