// ami_info — what this build of ami offers on this machine, and its
// configuration (-c): every AMI_* variable with its default, current value
// and documentation, under the component that declares it. Started as a
// task of a job (srun, mpirun, or AMI_RANK/AMI_SIZE), -p adds which backend
// reaches each other task of the job from this one.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

#include "ami/ami.hpp"

namespace {

// One row: its documentation, default and bounds as comments, then its
// current value.
void print_row(const ami::Config& config, const ami::ParamSpec& p) {
  std::printf("#\n# %.*s\n", static_cast<int>(p.doc.size()), p.doc.data());
  std::printf("# default: %.*s\n", static_cast<int>(p.default_value.size()), p.default_value.data());
  if (p.type == ami::ParamType::choice)
    std::printf("# one of: %.*s\n", static_cast<int>(p.choices.size()), p.choices.data());
  else if (p.type != ami::ParamType::text && p.type != ami::ParamType::boolean)
    std::printf("# range: %llu..%llu%s\n", static_cast<unsigned long long>(p.min),
                static_cast<unsigned long long>(p.max),
                p.type == ami::ParamType::power_of_two ? ", a power of two" : "");
  if (p.allows_auto) std::printf("# or auto\n");
  const std::string& value = config.text(p);
  const std::string_view origin = config.origin(p);
  const char* shown = p.secret && !value.empty() ? "(set, not shown)" : value.c_str();
  std::printf("%.*s=%s%s\n", static_cast<int>(p.name.size()), p.name.data(), shown,
              origin == "environment" ? "   # from the environment" : "");
}

// Every component's rows under a heading with its name.
void print_config() {
  std::vector<std::string> warnings;
  const ami::Config config = ami::Config::from_environment(environ, warnings);
  for (const std::string& w : warnings) std::printf("# warning: %s\n", w.c_str());
  for (const ami::ParamGroup& g : ami::config_groups()) {
    std::printf("#\n# ---- %.*s ----\n", static_cast<int>(g.component.size()), g.component.data());
    for (const ami::ParamSpec& p : g.rows) print_row(config, p);
  }
}

// Each line of text as a comment, with an optional word before it.
void print_lines(const std::string& lines, bool backend_lines) {
  for (std::size_t start = 0, end; start < lines.size(); start = end + 1) {
    end = lines.find('\n', start);
    const std::string line = lines.substr(start, end - start);
    // The fence and acks lines say how those work across the backends; the rest are backends.
    const bool protocol = line.starts_with("fence: ") || line.starts_with("acks: ");
    std::printf(backend_lines && !protocol ? "# backend %s\n" : "# %s\n", line.c_str());
    if (end == std::string::npos) break;
  }
}

// One line per other task: the backend its context 0 is reached by from
// this task's context 0 (learning its address now when addresses come on
// first use; no lane is made), "none" when no backend reaches it.
void print_peers(ami::Client& client) {
  ami::Context& c = client.context(0);
  if (client.size() == 1) std::printf("# peers: none (a job of one task)\n");
  for (std::uint32_t t = 0; t < client.size(); ++t) {
    if (t == client.task()) continue;
    const std::string_view via = c.backend_for({t, 0});
    std::printf("# peer task %u: %.*s\n", t, static_cast<int>(via.empty() ? 4 : via.size()),
                via.empty() ? "none" : via.data());
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [-c] [-p] [-h]\n  -c  print the configuration table\n"
               "  -p  also name the backend that reaches each peer task (context 0)\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool config = false, peers = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-c") == 0) config = true;
    else if (std::strcmp(argv[i], "-p") == 0) peers = true;
    else if (std::strcmp(argv[i], "-h") == 0) return usage(argv[0]) == 2 ? 0 : 1;
    else return usage(argv[0]);
  }
  if (config) {
    try {
      print_config();
    } catch (const ami::Error& e) {  // a bad AMI_* value: named, as the tools name it
      std::fprintf(stderr, "ami_info: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  std::printf("# ami %s\n", AMI_VERSION);
  // The client first: a library a backend opens may read the job's size
  // once, at its first call (libfabric's FI_UNIVERSE_SIZE), and the
  // inventory would make that call without it.
  std::unique_ptr<ami::Client> made;
  try {
    made = std::make_unique<ami::Client>(ami::ClientOptions{.name = "ami_info", .contexts = 1});
  } catch (const ami::Error& e) {
    print_lines(ami::describe_hardware(), false);
    std::fprintf(stderr, "ami_info: %s\n", e.what());
    return 1;
  }
  print_lines(ami::describe_hardware(), false);
  try {
    ami::Client& client = *made;
    const std::string_view bootstrap = client.bootstrap_name();
    std::printf("# task %u of %u, %u context(s), bootstrap %.*s\n", client.task(), client.size(),
                client.context_count(), static_cast<int>(bootstrap.size()), bootstrap.data());
    print_lines(client.describe_backends(), true);
    if (peers) print_peers(client);
  } catch (const ami::Error& e) {
    std::fprintf(stderr, "ami_info: %s\n", e.what());
    return 1;
  }
  return 0;
}
