// `strata`: dispatches to a subcommand through a table, so a new one (bench) is one line.

#include <cstdio>
#include <string_view>

#include "cli/commands.hpp"
#include "common/env.hpp"

namespace strata::cli {
namespace {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*main)(int argc, char** argv);
};

constexpr Subcommand kSubcommands[] = {
    {"run", "start N ranks with a rendezvous store; output prefixed by rank", run_main},
    {"store", "run a standalone rendezvous store", store_main},
    {"info", "print host identity, topology, transports and settings", info_main},
    {"bench", "collective benchmarks (time, algbw, busbw per size)", bench_main},
};

void print_usage(FILE* to) {
  std::fprintf(to,
               "usage: strata <command> [options]\n"
               "\n"
               "Strata launcher and tools (version %s).\n"
               "\n"
               "commands:\n",
               STRATA_VERSION);
  for (const auto& s : kSubcommands) std::fprintf(to, "  %-8s %s\n", s.name, s.summary);
  std::fprintf(to,
               "\n"
               "Run 'strata <command> --help' for the options of a command.\n"
               "Example: strata run -n 4 ./my_program\n");
}

}  // namespace
}  // namespace strata::cli

int main(int argc, char** argv) {
  using namespace strata::cli;
  if (argc < 2) {
    print_usage(stderr);
    return kUsageError;
  }
  std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    print_usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("strata %s\n", STRATA_VERSION);
    return 0;
  }
  for (const auto& s : kSubcommands) {
    if (cmd != s.name) continue;
    // A setting that does not parse ends every command but `info` (which shows the settings)
    // before anything starts: the ranks would refuse it anyway, one by one.
    if (cmd != "info")
      if (strata::Status st = strata::Env::get().check(); !st.is_ok()) {
        print_error("strata " + std::string(cmd), st.message());
        return kUsageError;
      }
    return s.main(argc - 1, argv + 1);
  }
  print_error("strata", "unknown command '" + std::string(cmd) + "' (try 'strata --help')");
  return kUsageError;
}
