// TensorBoardWriter: the file TensorFlow's writers make (name, version record,
// framing, one Event per scalar), read back with our own TFRecord reader and
// the generated messages; and the errors, each naming the directory or file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/observe/tensorboard.hpp"
#include "src/observe/proto/event.pb.h"
#include "tfrecord_reader.hpp"

namespace ddp::observe {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddp_tb_test.XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

std::vector<tensorflow::Event> read_events(const std::string& path) {
  std::vector<tensorflow::Event> events;
  for (const std::string& data : test::read_tfrecords(test::file_bytes(path))) {
    tensorflow::Event e;
    EXPECT_TRUE(e.ParseFromString(data)) << path;
    events.push_back(e);
  }
  return events;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// Runs f and returns the message of the ddp::Error it throws ("" when none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorBoardWriter, FileNameAndVersionRecord) {
  TempDir tmp;
  const std::string dir = (tmp.path / "runs" / "a").string();  // parents too
  const double before = now_seconds();
  TensorBoardWriter w(dir);
  const fs::path p = w.path();
  EXPECT_EQ(p.parent_path(), fs::path(dir));
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string name = p.filename().string();
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const std::string suffix = std::string(".") + host + "." + std::to_string(::getpid());
  ASSERT_GE(name.size(), prefix.size() + suffix.size());
  EXPECT_EQ(name.substr(name.size() - suffix.size()), suffix) << name;
  const long long secs = std::stoll(name.substr(prefix.size()));
  EXPECT_NEAR(static_cast<double>(secs), before, 2.0);

  // Readable at once, before any scalar or flush.
  const auto events = read_events(w.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[0].step(), 0);
  EXPECT_NEAR(events[0].wall_time(), before, 5.0);
  // TensorFlow's writers give the same first 12 bytes.
  EXPECT_EQ(test::file_bytes(w.path()).substr(0, 12), std::string("\x18\0\0\0\0\0\0\0\xa3\x7f\x4b\x22", 12));
}

TEST(TensorBoardWriter, ScalarsReadBackAfterFlush) {
  TempDir tmp;
  TensorBoardWriter w(tmp.path.string());
  struct Point {
    std::string tag;
    int64_t step;
    double value;
  };
  std::vector<Point> points;
  for (int64_t step = 0; step < 2000; ++step) {
    points.push_back({"train/loss", step, 2.5 / (1.0 + step)});
    points.push_back({"train/lr", step, -1e-30 * step});
  }
  points.push_back({"epoch/accuracy", int64_t(1) << 53, 0.8125});
  points.push_back({"epoch/accuracy", -7, 1e300});  // float: inf
  for (size_t i = 0; i < points.size(); ++i)
    w.scalar(points[i].tag, points[i].step, points[i].value, 1.7e9 + 0.25 * static_cast<double>(i));
  w.flush();

  const auto events = read_events(w.path());
  ASSERT_EQ(events.size(), points.size() + 1);
  for (size_t i = 0; i < points.size(); ++i) {
    const tensorflow::Event& e = events[i + 1];
    ASSERT_TRUE(e.has_summary()) << i;
    ASSERT_EQ(e.summary().value_size(), 1) << i;
    const auto& v = e.summary().value(0);
    EXPECT_EQ(v.tag(), points[i].tag) << i;
    EXPECT_EQ(e.step(), points[i].step) << i;
    ASSERT_TRUE(v.has_simple_value()) << i;
    EXPECT_EQ(v.simple_value(), static_cast<float>(points[i].value)) << i;
    EXPECT_EQ(e.wall_time(), 1.7e9 + 0.25 * static_cast<double>(i)) << i;
  }
  EXPECT_TRUE(std::isinf(events.back().summary().value(0).simple_value()));
}

TEST(TensorBoardWriter, WallTimeIsNowByDefault) {
  TempDir tmp;
  TensorBoardWriter w(tmp.path.string());
  const double before = now_seconds();
  w.scalar("loss", 3, 0.5);
  const double after = now_seconds();
  w.flush();
  const auto events = read_events(w.path());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_GE(events[1].wall_time(), before);
  EXPECT_LE(events[1].wall_time(), after);
  EXPECT_EQ(events[1].step(), 3);
}

TEST(TensorBoardWriter, DestructorWritesTheRest) {
  TempDir tmp;
  std::string path;
  {
    TensorBoardWriter w(tmp.path.string());
    path = w.path();
    w.scalar("loss", 1, 1.0);
  }
  EXPECT_EQ(read_events(path).size(), 2u);
}

TEST(TensorBoardWriter, TwoWritersInOneDirectoryDoNotShareAFile) {
  TempDir tmp;
  TensorBoardWriter a(tmp.path.string());
  TensorBoardWriter b(tmp.path.string());
  TensorBoardWriter c(tmp.path.string());
  EXPECT_NE(a.path(), b.path());
  EXPECT_NE(a.path(), c.path());
  EXPECT_NE(b.path(), c.path());
  a.scalar("x", 1, 1.0);
  b.scalar("x", 1, 2.0);
  c.scalar("x", 1, 3.0);
  a.flush();
  b.flush();
  c.flush();
  EXPECT_EQ(read_events(a.path()).at(1).summary().value(0).simple_value(), 1.0f);
  EXPECT_EQ(read_events(b.path()).at(1).summary().value(0).simple_value(), 2.0f);
  EXPECT_EQ(read_events(c.path()).at(1).summary().value(0).simple_value(), 3.0f);
}

// TensorBoard's reader gives up on a whole run at a tag that is not UTF-8.
TEST(TensorBoardWriter, TagMustBeUtf8) {
  TempDir tmp;
  TensorBoardWriter w(tmp.path.string());
  for (const std::string bad : {"loss\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "cut\xe2\x82"}) {
    const std::string msg = error_of([&] { w.scalar(bad, 1, 1.0); });
    EXPECT_NE(msg.find("is not UTF-8"), std::string::npos) << msg;
    EXPECT_NE(msg.find(w.path()), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { w.scalar("", 1, 1.0); }).find("needs a tag"), std::string::npos);
  for (const std::string good : {"train/loss", "\xc3\xbc", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"})
    w.scalar(good, 1, 1.0);
  w.flush();
  EXPECT_EQ(read_events(w.path()).size(), 6u);  // the version record and the five good ones
}

TEST(TensorBoardWriter, DirectoryThatCannotBeMadeIsNamed) {
  TempDir tmp;
  const fs::path file = tmp.path / "plain_file";
  std::ofstream(file) << "not a directory";
  const std::string dir = (file / "runs").string();
  const std::string msg = error_of([&] { TensorBoardWriter w(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  // The path exists, but as a file.
  const std::string msg2 = error_of([&] { TensorBoardWriter w(file.string()); });
  EXPECT_NE(msg2.find(file.string()), std::string::npos) << msg2;
}

TEST(TensorBoardWriter, UnwritableDirectoryIsNamed) {
  // procfs takes no new files, whoever asks (root included).
  const std::string msg = error_of([] { TensorBoardWriter w("/proc/self"); });
  EXPECT_NE(msg.find("/proc/self/events.out.tfevents."), std::string::npos) << msg;
}

TEST(TensorBoardWriter, ReadOnlyDirectoryIsNamed) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a mode 0500 directory all the same";
  TempDir tmp;
  const fs::path ro = tmp.path / "read_only";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string msg2 = error_of([&] { TensorBoardWriter w(ro.string()); });
  EXPECT_NE(msg2.find(ro.string()), std::string::npos) << msg2;
}

// A full disk, as the file-size limit makes one: write(2) fails with EFBIG
// (SIGXFSZ ignored) the way it fails with ENOSPC on a full file system.
TEST(TensorBoardWriter, WriteErrorNamesTheFile) {
  TempDir tmp;
  std::optional<TensorBoardWriter> w;
  w.emplace(tmp.path.string());
  const std::string path = w->path();

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 16 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  const std::string msg = error_of([&] {
    for (int64_t step = 0; step < 100000; ++step) w->scalar("train/loss", step, 1.0);
    w->flush();
  });
  w.reset();  // its last write fails too, silently
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot write"), std::string::npos) << msg;
  std::cerr << "[ message  ] " << msg << "\n";
}

}  // namespace
}  // namespace ddp::observe
