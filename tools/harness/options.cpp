// tools/harness/options.cpp — perftest-style command lines.
#include <getopt.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "harness.hpp"

namespace ami::tools {

namespace {

constexpr std::size_t kMaxSize = 8u << 20;

const char* test_name(Test t) {
  switch (t) {
    case Test::send_lat: return "ami_send_lat";
    case Test::send_bw: return "ami_send_bw";
    case Test::write_bw: return "ami_write_bw";
    case Test::read_bw: return "ami_read_bw";
  }
  return "ami";
}

void usage(Test t) {
  std::printf(
      "usage: %s [options]            start a server\n"
      "       %s [options] <server>   start a client against it (same options)\n"
      "       %s [options] --local    run both sides on this host and print the result\n\n"
      "  -s, --size=<bytes>       message size (default 2)\n"
      "  -a, --all                every size 2 B..8 MiB (powers of two)\n"
      "  -n, --iters=<n>          iterations (default 1000 latency, 5000 bandwidth)\n"
      "  -t, --tx-depth=<n>       operations in flight in bandwidth tests (default 128)\n"
      "  -p, --port=<port>        bootstrap port (default 18515)\n"
      "      --backend=<name>     shm (default) | self | verbs\n"
      "      --local              start the server as a child process (self: a thread)\n"
      "      --report_gbits       bandwidth in Gb/s instead of MiB/s\n"
      "  -h, --help               this text\n",
      test_name(t), test_name(t), test_name(t));
}

bool number(const char* text, std::size_t& out, std::size_t min, std::size_t max, const char* what) {
  std::size_t v = 0;
  const std::string_view s(text);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || v < min || v > max) {
    std::fprintf(stderr, "error: %s must be a number in %zu..%zu, not '%s'\n", what, min, max, text);
    return false;
  }
  out = v;
  return true;
}

}  // namespace

bool parse_options(int argc, char** argv, Test test, Options& o, bool& help) {
  enum { kBackend = 1000, kLocal, kGbits };
  static const option kLong[] = {
      {"size", required_argument, nullptr, 's'},   {"all", no_argument, nullptr, 'a'},
      {"iters", required_argument, nullptr, 'n'},  {"tx-depth", required_argument, nullptr, 't'},
      {"port", required_argument, nullptr, 'p'},   {"backend", required_argument, nullptr, kBackend},
      {"local", no_argument, nullptr, kLocal},     {"report_gbits", no_argument, nullptr, kGbits},
      {"help", no_argument, nullptr, 'h'},         {nullptr, 0, nullptr, 0}};
  o = Options{};
  o.test = test;
  help = false;
  optind = 1;
  std::size_t v = 0;
  for (int c; (c = getopt_long(argc, argv, "s:an:t:p:h", kLong, nullptr)) != -1;) {
    switch (c) {
      case 's':
        if (!number(optarg, v, 1, kMaxSize, "--size")) return false;
        o.sizes = {v};
        break;
      case 'a':
        o.sizes.clear();
        for (std::size_t s = 2; s <= kMaxSize; s *= 2) o.sizes.push_back(s);
        break;
      case 'n':
        if (!number(optarg, o.iterations, 1, 100000000, "--iters")) return false;
        break;
      case 't':
        if (!number(optarg, o.tx_depth, 1, 65536, "--tx-depth")) return false;
        break;
      case 'p':
        if (!number(optarg, v, 1, 65535, "--port")) return false;
        o.port = static_cast<std::uint16_t>(v);
        break;
      case kBackend:
        o.backend = optarg;
        if (o.backend != "shm" && o.backend != "self" && o.backend != "verbs") {
          std::fprintf(stderr, "error: --backend must be shm, self or verbs, not '%s'\n", optarg);
          return false;
        }
        break;
      case kLocal: o.local = true; break;
      case kGbits: o.report_gbits = true; break;
      case 'h':
        usage(test);
        help = true;
        return false;
      default:
        usage(test);
        return false;
    }
  }
  if (optind < argc) o.server = argv[optind++];
  if (optind < argc) {
    std::fprintf(stderr, "error: unexpected argument '%s'\n", argv[optind]);
    return false;
  }
  if (o.local && !o.server.empty()) {
    std::fprintf(stderr, "error: --local starts both sides; give no server name with it\n");
    return false;
  }
  if (o.backend == "self") o.local = true;  // a same-process peer is always local
  if (o.iterations == 0) o.iterations = test == Test::send_lat ? 1000 : 5000;
  return true;
}

}  // namespace ami::tools
