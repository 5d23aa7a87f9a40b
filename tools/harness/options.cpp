// tools/harness/options.cpp — perftest-style command lines.
#include <getopt.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "ami/client.hpp"
#include "harness.hpp"

namespace ami::tools {

namespace {

// The backends this build has (the registry's): "self, shm or verbs".
bool known_backend(std::string_view name) {
  const std::vector<std::string_view> names = ami::backend_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}
std::string backend_list() {
  const std::vector<std::string_view> names = ami::backend_names();
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + std::string(names[i]);
  return out;
}

// perftest's sizes: -a sweeps 2 B..2^23 B (8 MiB) in powers of two, and
// without -s or -a the bandwidth tests move 65536 bytes (DEF_SIZE_BW) and
// the latency tests 2 (DEF_SIZE_LAT).
constexpr std::size_t kMinAllSize = 2;
constexpr std::size_t kMaxSize = 8u << 20;
constexpr std::size_t kDefaultSizeBw = 65536;
constexpr std::size_t kDefaultSizeLat = 2;
constexpr std::size_t kPerftestCqMod = 100;  // perftest's DEF_CQ_MOD
constexpr std::size_t kAtomicSize = 8;       // an atomic's word, the only size ib_atomic_* know

std::size_t default_size(Test t) {
  return is_atomic(t) ? kAtomicSize : is_latency(t) ? kDefaultSizeLat : kDefaultSizeBw;
}

void usage(Test t) {
  std::printf(
      "usage: %s [options]            start a server\n"
      "       %s [options] <server>   start a client against it (same options)\n"
      "       %s [options] --local    run both sides on this host and print the result\n\n"
      "  -s, --size=<bytes>       message size (default %zu, as perftest's %s)\n"
      "  -a, --all                every size 2 B..8 MiB (powers of two, as perftest's -a)\n"
      "  -n, --iters=<n>          iterations (default 1000 latency, 5000 bandwidth)\n"
      "  -t, --tx-depth=<n>       operations in flight in bandwidth tests (default 128);\n"
      "                           verbs: also the send queue depth (AMI_VERBS_SQ_DEPTH)\n"
      "  -A, --atomic_type=<t>    atomic tests: FETCH_AND_ADD (default) or CMP_AND_SWAP\n"
      "  -o, --outs=<n>           atomic tests: atomics in flight (ami_atomic_bw; as -t)\n"
      "  -p, --port=<port>        bootstrap port (default 18515; --local: a free one)\n"
      "      --backend=<name>     %s (default shm); a device option implies verbs; ofi takes\n"
      "                           its provider from AMI_OFI_PROVIDER\n"
      "      --local              start the server as a child process (self: a thread)\n"
      "      --report_gbits       bandwidth in Gb/s instead of MiB/s\n"
      "      --remote_done        send tests: every measured send asks for remote_done (bandwidth:\n"
      "                           a send leaves the window when it runs); each side that sent\n"
      "                           acks prints how many messages they answered (\"# acks:\")\n"
      "  -e, --events             sleep on the context's event_fd() whenever there is nothing to do,\n"
      "                           instead of busy-polling (as perftest's -e; not for the write tests)\n"
      "      --spin=<usec>        with -e: busy-poll this long after the last event before sleeping\n"
      "                           (default 0: sleep at once)\n"
      "      --stats              print this side's message, packet and rendezvous counters at the end\n"
      "                           (\"# stats:\" lines)\n"
      "      --out_json           also write the results as JSON (default file ami_out.json)\n"
      "      --out_json_file=<f>  the JSON file\n"
      "  -h, --help               this text\n\n"
      "device options, as perftest's (verbs backend):\n"
      "  -d, --ib-dev=<dev>       RDMA device (AMI_NET_DEVICES; default: first active port)\n"
      "  -i, --ib-port=<port>     its port (default 1)\n"
      "  -x, --gid-index=<n>      GID index (AMI_VERBS_GID_INDEX; default: RoCE v2 IPv4 GID)\n"
      "  -R, --rdma_cm            connect with rdma_cm (AMI_VERBS_CM=on)\n"
      "  -m, --mtu=<bytes>        path MTU cap, 256..4096 (AMI_VERBS_MTU)\n"
      "  -Q, --cq-mod=<n>         one signalled work request in n (AMI_VERBS_SIGNAL_INTERVAL;\n"
      "                           bandwidth tests: 100, or the TX depth if less, as perftest)\n"
      "  -I, --inline_size=<n>    largest inline send, 0 never (AMI_VERBS_MAX_INLINE)\n"
      "  -l, --post_list=<n>      work requests per doorbell in a burst, 1 one each\n"
      "                           (AMI_VERBS_DOORBELL_BATCH; default 16)\n"
      "\nEvery AMI_* variable of ami_info --config applies too; options override them.\n",
      tool_name(t), tool_name(t), tool_name(t), default_size(t),
      is_latency(t) ? "ib_*_lat" : "ib_*_bw", backend_list().c_str());
}


bool is_verbs_option(int c) { return c > 0 && c < 128 && std::strchr("dixRmQIl", c) != nullptr; }

}  // namespace

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

const char* tool_name(Test t) {
  switch (t) {
    case Test::send_lat: return "ami_send_lat";
    case Test::send_bw: return "ami_send_bw";
    case Test::write_lat: return "ami_write_lat";
    case Test::write_bw: return "ami_write_bw";
    case Test::read_lat: return "ami_read_lat";
    case Test::read_bw: return "ami_read_bw";
    case Test::atomic_lat: return "ami_atomic_lat";
    case Test::atomic_bw: return "ami_atomic_bw";
  }
  return "ami";
}

bool parse_options(int argc, char** argv, Test test, Options& o, bool& help) {
  enum { kBackend = 1000, kLocal, kGbits, kJson, kJsonFile, kRemoteDone, kStats, kSpin };
  static const option kLong[] = {
      {"size", required_argument, nullptr, 's'},   {"all", no_argument, nullptr, 'a'},
      {"iters", required_argument, nullptr, 'n'},  {"tx-depth", required_argument, nullptr, 't'},
      {"port", required_argument, nullptr, 'p'},   {"backend", required_argument, nullptr, kBackend},
      {"local", no_argument, nullptr, kLocal},     {"report_gbits", no_argument, nullptr, kGbits},
      {"out_json", no_argument, nullptr, kJson},   {"out_json_file", required_argument, nullptr, kJsonFile},
      {"ib-dev", required_argument, nullptr, 'd'}, {"ib-port", required_argument, nullptr, 'i'},
      {"gid-index", required_argument, nullptr, 'x'}, {"rdma_cm", no_argument, nullptr, 'R'},
      {"mtu", required_argument, nullptr, 'm'},    {"cq-mod", required_argument, nullptr, 'Q'},
      {"inline_size", required_argument, nullptr, 'I'}, {"remote_done", no_argument, nullptr, kRemoteDone},
      {"stats", no_argument, nullptr, kStats},     {"events", no_argument, nullptr, 'e'},
      {"spin", required_argument, nullptr, kSpin},
      {"post_list", required_argument, nullptr, 'l'},
      {"atomic_type", required_argument, nullptr, 'A'}, {"outs", required_argument, nullptr, 'o'},
      {"help", no_argument, nullptr, 'h'},         {nullptr, 0, nullptr, 0}};
  o = Options{};
  o.test = test;
  help = false;
  optind = 1;
  std::size_t v = 0;
  bool backend_given = false, json = false, verbs_option = false, sizes_given = false, spin_given = false;
  bool atomic_option = false;
  for (int c; (c = getopt_long(argc, argv, "s:an:t:p:hd:i:x:Rm:Q:I:l:eA:o:", kLong, nullptr)) != -1;) {
    if (is_verbs_option(c)) verbs_option = true;
    switch (c) {
      case 's':
        if (!number(optarg, v, 1, kMaxSize, "--size")) return false;
        o.sizes = {v};
        sizes_given = true;
        break;
      case 'a':
        o.sizes.clear();
        for (std::size_t s = kMinAllSize; s <= kMaxSize; s *= 2) o.sizes.push_back(s);
        sizes_given = true;
        break;
      case 'n':
        if (!number(optarg, o.iterations, 1, 100000000, "--iters")) return false;
        break;
      case 't':
        if (!number(optarg, o.tx_depth, 1, 65536, "--tx-depth")) return false;
        o.tx_depth_given = true;
        break;
      case 'd':
        o.device = optarg;
        if (o.device.empty() || o.device.find_first_of(":, ") != std::string::npos) {
          std::fprintf(stderr, "error: --ib-dev must be a device name such as rxe0, not '%s'\n", optarg);
          return false;
        }
        break;
      case 'i':
        if (!number(optarg, v, 1, 255, "--ib-port")) return false;
        o.ib_port = static_cast<unsigned>(v);
        break;
      case 'x':
        if (!number(optarg, v, 0, 65535, "--gid-index")) return false;
        o.gid_index = static_cast<unsigned>(v);
        break;
      case 'R': o.rdma_cm = true; break;
      case 'm':
        if (!number(optarg, v, 256, 4096, "--mtu")) return false;
        if ((v & (v - 1)) != 0) {
          std::fprintf(stderr, "error: --mtu must be 256, 512, 1024, 2048 or 4096\n");
          return false;
        }
        o.mtu = static_cast<unsigned>(v);
        break;
      case 'Q':
        if (!number(optarg, v, 1, 65536, "--cq-mod")) return false;
        o.cq_moderation = static_cast<unsigned>(v);
        break;
      case 'I':
        if (!number(optarg, v, 0, 65536, "--inline_size")) return false;
        o.inline_size = static_cast<unsigned>(v);
        break;
      case 'l':
        if (!number(optarg, v, 1, 256, "--post_list")) return false;
        o.post_list = static_cast<unsigned>(v);
        break;
      case kJson: json = true; break;
      case kJsonFile:
        json = true;
        o.out_json = optarg;
        if (o.out_json.empty()) {
          std::fprintf(stderr, "error: --out_json_file needs a file name\n");
          return false;
        }
        break;
      case 'p':
        if (!number(optarg, v, 1, 65535, "--port")) return false;
        o.port = static_cast<std::uint16_t>(v);
        o.port_given = true;
        break;
      case kBackend:
        o.backend = optarg;
        backend_given = true;
        if (!known_backend(o.backend)) {
          std::fprintf(stderr, "error: --backend must be %s, not '%s'\n", backend_list().c_str(), optarg);
          return false;
        }
        break;
      case kLocal: o.local = true; break;
      case kGbits: o.report_gbits = true; break;
      case kRemoteDone: o.remote_done = true; break;
      case kStats: o.stats = true; break;
      case 'e': o.events = true; break;
      case 'A':
        atomic_option = true;
        if (std::strcmp(optarg, "FETCH_AND_ADD") == 0) {
          o.compare_swap = false;
        } else if (std::strcmp(optarg, "CMP_AND_SWAP") == 0) {
          o.compare_swap = true;
        } else {
          std::fprintf(stderr, "error: --atomic_type must be FETCH_AND_ADD or CMP_AND_SWAP, not '%s'\n", optarg);
          return false;
        }
        break;
      case 'o':
        atomic_option = true;
        if (!number(optarg, o.tx_depth, 1, 65536, "--outs")) return false;
        break;
      case kSpin:
        if (!number(optarg, v, 0, 1000000, "--spin")) return false;
        o.spin_us = static_cast<unsigned>(v);
        spin_given = true;
        break;
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
  if (verbs_option) {
    if (backend_given && o.backend != "verbs") {
      std::fprintf(stderr, "error: the device options (-d -i -x -R -m -Q -I) need --backend verbs, not %s\n",
                   o.backend.c_str());
      return false;
    }
    o.backend = "verbs";
  }
  if (o.ib_port && o.device.empty()) {
    std::fprintf(stderr, "error: --ib-port needs --ib-dev: the port of which device?\n");
    return false;
  }
  if (o.remote_done && test != Test::send_lat && test != Test::send_bw) {
    std::fprintf(stderr, "error: --remote_done is for the send tests (ami_send_lat, ami_send_bw), not %s: "
                 "a PUT or GET has no remote_done\n", tool_name(test));
    return false;
  }
  if (atomic_option && !is_atomic(test)) {
    std::fprintf(stderr, "error: -A and -o are for the atomic tests (ami_atomic_lat, ami_atomic_bw), not %s\n",
                 tool_name(test));
    return false;
  }
  if (sizes_given && is_atomic(test) && (o.sizes.size() != 1 || o.sizes[0] != kAtomicSize)) {
    std::fprintf(stderr, "error: %s moves one 8-byte word: no -s or -a but -s 8\n", tool_name(test));
    return false;
  }
  if (spin_given && !o.events) {
    std::fprintf(stderr, "error: --spin is how long -e busy-polls before it sleeps: give -e too\n");
    return false;
  }
  if (o.events && (test == Test::write_lat || test == Test::write_bw)) {
    std::fprintf(stderr, "error: --events is not for %s: a PUT lands in memory with no message to wake "
                 "the side that polls it\n", tool_name(test));
    return false;
  }
  if (json && o.out_json.empty()) o.out_json = "ami_out.json";
  if (o.backend == "self") o.local = true;  // a same-process peer is always local
  if (!sizes_given) o.sizes = {default_size(test)};
  if (o.iterations == 0) o.iterations = is_latency(test) ? 1000 : 5000;
  // perftest's bandwidth tests signal one work request in 100 (at most one
  // per TX depth) unless told otherwise: so do these, side by side with
  // them, unless -Q or the environment says.
  if (!o.cq_moderation && !is_latency(test) && o.backend == "verbs" &&
      std::getenv("AMI_VERBS_SIGNAL_INTERVAL") == nullptr)
    o.cq_moderation = static_cast<unsigned>(std::min<std::size_t>(kPerftestCqMod, o.tx_depth));
  return true;
}

}  // namespace ami::tools
