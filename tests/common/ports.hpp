// ports.hpp — a TCP port on 127.0.0.1 for a test job's bootstrap.
#pragma once

#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <cstdint>
#include <fstream>
#include <random>

namespace test {

// A port nothing listens on, for rank 0 to listen on a moment later. Taken
// below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so
// that a connection another test makes meanwhile is not given it as its
// own local port (one that the kernel handed out as free once made rank 0's
// listen fail with "Address already in use"); at random in 10000 ports, so
// that tests running at once seldom pick the same. Where the ephemeral
// range starts too low for that, the kernel's pick.
inline std::uint16_t free_port() {
  boost::asio::io_context io;
  const auto loopback = boost::asio::ip::make_address("127.0.0.1");
  int ephemeral_low = 32768, ephemeral_high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low >> ephemeral_high;
  if (ephemeral_low > 12000) {
    static std::mt19937 pick{std::random_device{}()};
    std::uniform_int_distribution<int> below(ephemeral_low - 10000, ephemeral_low - 1);
    for (int tries = 0; tries < 64; ++tries) {
      const auto port = static_cast<std::uint16_t>(below(pick));
      boost::system::error_code ec;
      boost::asio::ip::tcp::acceptor probe(io);
      probe.open(boost::asio::ip::tcp::v4(), ec);
      if (!ec) probe.bind({loopback, port}, ec);
      if (!ec) return port;
    }
  }
  boost::asio::ip::tcp::acceptor acc(io, {loopback, 0});
  return acc.local_endpoint().port();
}

}  // namespace test
