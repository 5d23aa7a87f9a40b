// fabric_backend/ofi_module.cpp — the ofi backend's registry entry in libami,
// and the loading of the module that does its work (libami-ofi.so).
//
// Linking libfabric into libami made every task pay for it at start, ofi
// or not: Debian's libfabric 1.17 links the psm and psm2 providers, whose
// libraries probe for their hardware from constructors (sleeping in a
// loop, reading /proc/kallsyms), about 0.2 s a process on a host without
// it. The entry answers its name, tunables and context limit from this
// library; the first question that needs libfabric loads the module, found
// beside libami (the build tree) or in its ami/ directory (installed).
#include <dlfcn.h>

#include <string>

#include "ami/error.hpp"
#include "fabric_backend.hpp"
#include "ofi_config.hpp"
#include "ofi_wire.hpp"

namespace ami::ofi {

namespace {

constexpr const char* kModule = "libami-ofi.so";

struct Loaded {
  const device::BackendInfo* info = nullptr;  // the module's entry; nullptr: why
  std::string why;
};

// Where this library lies, with a trailing '/' ("" when unknown).
std::string own_directory() {
  Dl_info self{};
  if (::dladdr(reinterpret_cast<const void*>(&own_directory), &self) == 0 || self.dli_fname == nullptr) return {};
  const std::string path(self.dli_fname);
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

Loaded load() {
  Loaded out;
  const std::string dir = own_directory();
  std::string errors;
  // Installed beside libami in its ami/ directory; in the build tree beside
  // it; else wherever the dynamic linker looks.
  for (const std::string& path : {dir + "ami/" + kModule, dir + kModule, std::string(kModule)}) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      errors += std::string(errors.empty() ? "" : "; ") + (e != nullptr ? e : path);
      continue;
    }
    // Never closed: the backend's objects live as long as the process may
    // use them.
    using Entry = const device::BackendInfo* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, "ami_ofi_backend_info"));
    out.info = entry != nullptr ? entry() : nullptr;
    if (out.info == nullptr) out.why = "ofi: " + path + " has no ami_ofi_backend_info";
    return out;
  }
  out.why = std::string("ofi: cannot load the backend's module ") + kModule + " (" + errors + ")";
  return out;
}

const Loaded& module() {
  static const Loaded loaded = load();  // (once, whichever thread asks first)
  return loaded;
}

}  // namespace

const device::BackendInfo& backend_info() {
  static const device::BackendInfo info{
      .name = "ofi",
      .params = kParams,
      .max_contexts = static_cast<std::uint16_t>(kMaxContexts),
      .available = [](const device::BackendSetup& s, std::string* why) {
        const Loaded& m = module();
        if (m.info == nullptr) {
          if (why != nullptr) *why = m.why;
          return false;
        }
        return m.info->available == nullptr || m.info->available(s, why);
      },
      .open = [](const device::BackendSetup& s) -> std::unique_ptr<device::Backend> {
        const Loaded& m = module();
        if (m.info == nullptr) throw Error(m.why);
        return m.info->open(s);
      },
      .inventory = []() -> std::string {
        const Loaded& m = module();
        if (m.info == nullptr) return m.why + "\n";
        return m.info->inventory != nullptr ? m.info->inventory() : std::string();
      },
      .memory = [](const Config& c, std::uint16_t contexts) -> std::vector<device::MemoryDemand> {
        const Loaded& m = module();
        if (m.info == nullptr || m.info->memory == nullptr) return {};
        return m.info->memory(c, contexts);
      },
  };
  return info;
}

}  // namespace ami::ofi
