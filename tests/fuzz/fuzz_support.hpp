// What every fuzz harness holds a reader to, whatever the bytes: it returns a
// well-formed result or throws ddp::Error naming the file at fault. Anything
// else (another exception, an error that names no file, a result that breaks
// its own invariants) is a finding: the harness aborts, so libFuzzer keeps
// the input, and so does the replay of regression inputs (replay_main.cpp).
// Sanitizer reports, hangs (-timeout) and huge allocations (-malloc_limit_mb)
// are findings by libFuzzer's own rules (scripts/fuzz.sh).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz: finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// A private directory for the files a harness hands to readers that take a
// path; on tmpfs where there is one, since every input is written there.
// Removed at exit (a crash leaves it, named in the log, for a look).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm")
                              : fs::temp_directory_path();
    std::string tmpl = (base / "ddp_fuzz_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) finding("cannot make a scratch directory under " + base.string());
    static std::string keep = tmpl;
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(keep, e);
    });
    return tmpl;
  }();
  return dir;
}

inline void write_file(const std::string& path, const void* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) finding("cannot write " + path);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) finding("cannot write " + path);
  std::fclose(f);
}

// Runs read(): a ddp::Error naming one of `paths` is an answer; any other
// exception, or an error that names none of them, is a finding. Returns
// whether read() completed.
template <typename Read>
bool read_or_error(std::initializer_list<std::string> paths, Read&& read) {
  try {
    read();
    return true;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : paths)
      if (msg.find(p) != std::string::npos) return false;
    finding("an error that names no file: " + msg);
  } catch (const std::exception& e) {
    finding(std::string("an exception other than ddp::Error: ") + e.what());
  }
}

}  // namespace ddp::fuzz
