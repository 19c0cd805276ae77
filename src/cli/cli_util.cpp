#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cli/commands.hpp"

namespace strata::cli {

Result<std::string> read_token_file(const std::string& path, std::string_view who) {
  struct stat what {};
  if (::stat(path.c_str(), &what) == 0 && S_ISDIR(what.st_mode))
    return invalid_argument("--token-file " + path + ": is a directory, not a file holding the job token");
  std::ifstream in(path);
  if (!in) return invalid_argument("--token-file " + path + ": cannot read it (" + std::strerror(errno) + ")");
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  if (line.empty())
    return invalid_argument("--token-file " + path + ": the token is empty (write one, e.g. 'openssl rand -hex 16 > " +
                            path + "')");
  struct stat st {};
  // Advice, not a refusal: a shared secret file may sit on a shared file system on purpose.
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
    print_error(who, "warning: --token-file " + path + " is readable by other users (chmod 600 it)");
  return line;
}

void warn_token_on_command_line(std::string_view who) {
  print_error(who,
              "warning: --token puts the job token on the command line, where every user of this host can read "
              "it (/proc/PID/cmdline, ps); use --token-file F or STRATA_JOB_TOKEN instead");
}

bool take_option(int argc, char** argv, int& i, std::initializer_list<std::string_view> names, std::string& value,
                 std::string& error) {
  std::string_view arg = argv[i];
  // Every whole name first, then NAME=VALUE, then a short name with its value attached: "-np"
  // is its own option even where "-n" takes a value ("-n2").
  for (std::string_view name : names) {
    if (arg == name) {
      if (i + 1 >= argc) {
        error = "option " + std::string(name) + " needs a value";
        return true;
      }
      value = argv[i + 1];
      i += 2;
      return true;
    }
  }
  for (std::string_view name : names) {
    if (name.size() > 2 && arg.starts_with(name) && arg.size() > name.size() && arg[name.size()] == '=') {
      value = std::string(arg.substr(name.size() + 1));
      i += 1;
      return true;
    }
  }
  for (std::string_view name : names) {
    if (name.size() == 2 && name[0] == '-' && name[1] != '-' && arg.starts_with(name) && arg.size() > 2) {
      value = std::string(arg.substr(2));
      i += 1;
      return true;
    }
  }
  return false;
}

Result<std::string> random_hex(size_t bytes) {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("open /dev/urandom", errno);
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::read(fd, raw.data() + got, bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      return errno_status("read /dev/urandom", err);
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char* digits = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes);
  for (unsigned char c : raw) {
    hex.push_back(digits[c >> 4]);
    hex.push_back(digits[c & 15]);
  }
  return hex;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void print_error(std::string_view prefix, std::string_view msg) {
  std::string line;
  line.reserve(prefix.size() + msg.size() + 3);
  line.append(prefix).append(": ").append(msg).push_back('\n');
  write_all(STDERR_FILENO, line);
}

}  // namespace strata::cli
