// `strata store`: the rendezvous store on its own, for jobs whose ranks are started by
// something else (several hosts, a scheduler, a debugger).

#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>

#include "bootstrap/store.hpp"
#include "cli/commands.hpp"
#include "common/env.hpp"
#include "common/parse.hpp"

namespace strata::cli {
namespace {

constexpr const char* kWho = "strata store";

const char kUsage[] =
    "usage: strata store [--host H] [--port P] [--token-file F | --token T]\n"
    "\n"
    "Runs a rendezvous store until SIGINT or SIGTERM, and prints the STRATA_STORE value\n"
    "for the ranks (and the token when it made one up).\n"
    "\n"
    "options:\n"
    "  --host H          address to listen on (default 127.0.0.1: this host only; give an\n"
    "                    address of an interface, or 0.0.0.0 for every one, to serve other hosts)\n"
    "  --port P          port (default 0: any free port)\n"
    "  --token-file F    read the job token from the first line of file F\n"
    "  --token T         job token on the command line (readable by every user of the host:\n"
    "                    prefer --token-file or STRATA_JOB_TOKEN; default: STRATA_JOB_TOKEN,\n"
    "                    else a random one, printed). Clients prove they know the token\n"
    "                    (challenge-response); it never crosses the network.\n"
    "  -h, --help        show this help\n";

int usage_error(const std::string& msg) {
  print_error(kWho, msg + " (try 'strata store --help')");
  return kUsageError;
}

}  // namespace

int store_main(int argc, char** argv) {
  std::string host = "127.0.0.1", token;
  bool token_given = false;
  long port = 0;
  for (int i = 1; i < argc;) {
    std::string_view arg = argv[i];
    std::string value, error;
    if (arg == "-h" || arg == "--help") {
      write_all(STDOUT_FILENO, kUsage);
      return 0;
    } else if (take_option(argc, argv, i, {"--host"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      host = value;
    } else if (take_option(argc, argv, i, {"--port"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto p = parse_int(value);
      if (!p || *p < 0 || *p > 65535) return usage_error("--port must be 0-65535, got '" + value + "'");
      port = *p;
    } else if (token_given && (take_option(argc, argv, i, {"--token"}, value, error) ||
                               take_option(argc, argv, i, {"--token-file"}, value, error))) {
      return usage_error("--token and --token-file both give the job token (or one was given twice); pass one");
    } else if (take_option(argc, argv, i, {"--token"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      if (value.empty()) return usage_error("--token is empty; a store needs a job token");
      warn_token_on_command_line(kWho);
      token = value;
      token_given = true;
    } else if (take_option(argc, argv, i, {"--token-file"}, value, error)) {
      if (!error.empty()) return usage_error(error);
      auto t = read_token_file(value, kWho);
      if (!t.is_ok()) return usage_error(t.status().message());
      token = *t;
      token_given = true;
    } else {
      return usage_error("unexpected argument '" + std::string(arg) + "'");
    }
  }
  bool token_made_up = false;
  if (!token_given) token = Env::get().job_token;
  if (!token_given && token.empty()) {
    auto t = random_hex(16);
    if (!t.is_ok()) {
      print_error(kWho, t.status().message());
      return 1;
    }
    token = *t;
    token_made_up = true;
  }

  // Blocked before the server thread exists, so only sigwaitinfo below receives them.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);

  auto server = bootstrap::StoreServer::start(host, static_cast<uint16_t>(port), token);
  if (!server.is_ok()) {
    print_error(kWho, server.status().message());
    return 1;
  }
  uint16_t bound = (*server)->port();
  std::string advertised = host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    char name[HOST_NAME_MAX + 1] = {};
    advertised = ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
  }
  std::string listen_desc = bootstrap::StoreAddress{host, bound}.to_string();
  std::string addr = bootstrap::StoreAddress{advertised, bound}.to_string();
  std::printf("strata store: serving on %s\nSTRATA_STORE=%s\n", listen_desc.c_str(), addr.c_str());
  if (token_made_up) std::printf("STRATA_JOB_TOKEN=%s\n", token.c_str());
  std::fflush(stdout);

  int sig = 0;
  while ((sig = ::sigwaitinfo(&set, nullptr)) < 0) {
  }
  (*server)->stop();
  print_error(kWho, "received " + signal_name(sig) + "; stopped");
  return 0;
}

}  // namespace strata::cli
