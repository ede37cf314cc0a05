// bench_overlap: does an all-reduce started before a stretch of compute finish
// during it? Run under mpirun, two ranks:
//
//   mpirun -np 2 --bind-to none build/bin/bench_overlap [--reps 9] [--compute-ms 50] [--poll]
//
// Table 1, per buffer size: (a) a blocking all-reduce alone, (b) compute alone
// (single-threaded GEMMs), (c) allreduce_async -> compute -> wait through our
// communicator, and (d) a bare MPI_Iallreduce -> compute -> MPI_Wait, which
// Open MPI does not progress in the background (bench/RESULTS.md, the overlap numbers). Overlap
// works when (c)'s wait is ~0 and its total ~ max(a, b) rather than a + b.
//
// Table 2 (--poll): how the communication thread should wait (MpiOptions),
// on a backward-shaped step: compute in pieces, one bucket launched after
// each, then wait for all; the last row is a thread sitting in blocking
// MPI_Allreduce instead. A thread that polls flat out competes with the
// compute for the cores; one that sleeps too long adds latency.
//
// Every number is the median over reps of the slowest rank, in ms.
#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/communicator.hpp"  // Communicator, MpiOptions
#include "ddp/runtime/world.hpp"      // init_world, set_blas_threads

namespace {

using Clock = std::chrono::steady_clock;

double now_ms() {
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

// The slowest rank's value: a step is as slow as its slowest rank.
double slowest(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Real arithmetic the size of a layer's backward, not a sleep: it competes
// for the core the way training does.
class Gemm {
 public:
  Gemm() : a_(kN * kN, 0.5f), b_(kN * kN, 0.25f), c_(kN * kN, 0.f) {}
  void run(int calls) {
    for (int i = 0; i < calls; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kN, kN, kN, 1.f, a_.data(), kN,
                  b_.data(), kN, 0.f, c_.data(), kN);
  }
  // Calls for about ms milliseconds, measured with every rank computing, and
  // agreed on (rank 0's count) so that every rank does the same work.
  int calibrate(double ms) {
    run(3);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_ms();
    run(20);
    const double per = (now_ms() - t0) / 20;
    int calls = std::max(1, int(ms / per + 0.5));
    MPI_Bcast(&calls, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return calls;
  }

 private:
  static constexpr int kN = 256;
  std::vector<float> a_, b_, c_;
};

struct Args {
  int reps = 9;
  double compute_ms = 50;
  bool poll = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--reps" && i + 1 < argc)
      a.reps = std::max(1, std::atoi(argv[++i]));
    else if (s == "--compute-ms" && i + 1 < argc)
      a.compute_ms = std::atof(argv[++i]);
    else if (s == "--poll")
      a.poll = true;
    else {
      std::fprintf(stderr, "usage: bench_overlap [--reps N] [--compute-ms MS] [--poll]\n");
      std::exit(2);
    }
  }
  return a;
}

void overlap_table(const ddp::World& world, const Args& args, Gemm& gemm, int calls) {
  auto comm = ddp::comm::make_mpi_communicator(world);
  MPI_Comm raw;
  MPI_Comm_dup(world.comm, &raw);
  if (world.rank == 0) {
    std::printf("\nall-reduce vs %.0f ms of GEMM (%d ranks, median of %d reps, slowest rank, ms)\n",
                args.compute_ms, world.size, args.reps);
    std::printf("%7s | %9s %9s %8s | %21s %7s | %8s %21s %7s\n", "size", "(a) ours", "(a) MPI",
                "(b) comp", "(c) async+comp total", "wait", "(a)+(b)", "(d) Iallred+comp total",
                "Wait");
  }
  for (double mb : {1.0, 4.0, 25.0}) {
    const size_t n = size_t(mb * 1e6 / sizeof(float));
    std::vector<float> buf(n, 0.f);
    std::vector<double> a_ours, a_mpi, b, c_total, c_wait, d_total, d_wait;
    for (int rep = 0; rep < args.reps; ++rep) {
      // Interleaved, so that drift in the machine's load hits all alike.
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_ms();
      comm->allreduce_async(buf.data(), n, ddp::comm::ReduceOp::Avg, "bench")->wait();
      a_ours.push_back(slowest(now_ms() - t0));

      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_ms();
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, raw);
      a_mpi.push_back(slowest(now_ms() - t0));

      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_ms();
      gemm.run(calls);
      b.push_back(slowest(now_ms() - t0));

      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_ms();
      auto w = comm->allreduce_async(buf.data(), n, ddp::comm::ReduceOp::Avg, "bench");
      gemm.run(calls);
      double t1 = now_ms();
      w->wait();
      double t2 = now_ms();
      c_total.push_back(slowest(t2 - t0));
      c_wait.push_back(slowest(t2 - t1));

      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_ms();
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, raw, &req);
      gemm.run(calls);
      t1 = now_ms();
      MPI_Wait(&req, MPI_STATUS_IGNORE);
      t2 = now_ms();
      d_total.push_back(slowest(t2 - t0));
      d_wait.push_back(slowest(t2 - t1));
    }
    if (world.rank == 0)
      std::printf("%4.0f MB | %9.1f %9.1f %8.1f | %21.1f %7.1f | %8.1f %21.1f %7.1f\n", mb,
                  median(a_ours), median(a_mpi), median(b), median(c_total), median(c_wait),
                  median(a_ours) + median(b), median(d_total), median(d_wait));
  }
  MPI_Comm_free(&raw);
}

// A backward-shaped step: kPieces stretches of compute, a bucket launched
// after each, then wait for all.
constexpr int kPieces = 5;

struct StepTimes {
  double comm_alone, step, compute, wait;
};

using Launcher = std::function<void(int bucket)>;  // starts bucket k
using Waiter = std::function<void()>;              // waits for every bucket

StepTimes time_step(Gemm& gemm, int calls, const Launcher& launch, const Waiter& wait_all) {
  StepTimes t{};
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_ms();
  for (int k = 0; k < kPieces; ++k) launch(k);
  wait_all();
  t.comm_alone = slowest(now_ms() - t0);

  MPI_Barrier(MPI_COMM_WORLD);
  t0 = now_ms();
  for (int k = 0; k < kPieces; ++k) {
    gemm.run(std::max(1, calls / kPieces));
    launch(k);
  }
  const double t1 = now_ms();
  wait_all();
  const double t2 = now_ms();
  t.step = slowest(t2 - t0);
  t.compute = slowest(t1 - t0);
  t.wait = slowest(t2 - t1);
  return t;
}

// The alternative to polling: a thread that sits in blocking MPI_Allreduce
// (Open MPI spins inside it), handed buckets in order. It sleeps on a
// condition variable when idle, so it costs nothing while others are timed.
class BlockingThread {
 public:
  BlockingThread(MPI_Comm world, float* buf, size_t per) : buf_(buf), per_(per) {
    MPI_Comm_dup(world, &comm_);
    th_ = std::thread([this] {
      for (;;) {
        int k;
        {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] { return stop_ || finished_ < launched_; });
          if (stop_) return;
          k = finished_;
        }
        MPI_Allreduce(MPI_IN_PLACE, buf_ + (k % kPieces) * per_, int(per_), MPI_FLOAT, MPI_SUM,
                      comm_);
        {
          std::lock_guard<std::mutex> lk(mu_);
          ++finished_;
        }
        cv_.notify_all();
      }
    });
  }
  ~BlockingThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
    MPI_Comm_free(&comm_);
  }
  void launch() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++launched_;
    }
    cv_.notify_all();
  }
  void wait_all() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return finished_ == launched_; });
  }

 private:
  float* buf_;
  size_t per_;
  MPI_Comm comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  int launched_ = 0, finished_ = 0;
  bool stop_ = false;
  std::thread th_;
};

void poll_table(const ddp::World& world, const Args& args, Gemm& gemm, int calls) {
  const size_t per = size_t(25e6 / sizeof(float)) / kPieces;
  std::vector<float> buf(per * kPieces, 0.f);
  struct Variant {
    std::string name;
    ddp::comm::MpiOptions opt;
  };
  std::vector<Variant> variants = {{"spin (MPI_Test flat out)", {0, 0}},
                                   {"spin 20us, sleep <= 1us", {20, 1}},
                                   {"spin 20us, sleep <= 10us", {20, 10}},
                                   {"spin 20us, sleep <= 50us", {20, 50}},
                                   {"spin 20us, sleep <= 200us", {20, 200}},
                                   {"spin 20us, sleep <= 1000us", {20, 1000}}};
  std::vector<std::unique_ptr<ddp::comm::Communicator>> comms;
  for (auto& v : variants) comms.push_back(ddp::comm::make_mpi_communicator(world, v.opt));
  const ddp::comm::MpiOptions defaults;
  std::vector<std::vector<StepTimes>> times(variants.size() + 1);
  BlockingThread blocking(world.comm, buf.data(), per);
  for (int rep = 0; rep < args.reps; ++rep) {
    for (size_t v = 0; v < comms.size(); ++v) {
      std::vector<std::shared_ptr<ddp::comm::Work>> works;
      times[v].push_back(time_step(
          gemm, calls,
          [&](int k) {
            works.push_back(comms[v]->allreduce_async(buf.data() + k * per, per,
                                                      ddp::comm::ReduceOp::Avg, "bench"));
          },
          [&] {
            for (auto& w : works) w->wait();
            works.clear();
          }));
    }
    times.back().push_back(time_step(
        gemm, calls, [&](int) { blocking.launch(); }, [&] { blocking.wait_all(); }));
  }
  if (world.rank != 0) return;
  std::printf("\ncommunication thread wait policy: 25 MB in %d buckets, one after each fifth of "
              "%.0f ms of GEMM\n(median of %d reps, slowest rank, ms; default: spin %d us, "
              "sleep <= %d us)\n",
              kPieces, args.compute_ms, args.reps, defaults.spin_us, defaults.max_sleep_us);
  std::printf("%-34s %10s %8s %10s %7s\n", "policy", "comm alone", "step", "compute", "wait");
  for (size_t v = 0; v <= variants.size(); ++v) {
    std::vector<double> c, s, k, w;
    for (auto& t : times[v]) {
      c.push_back(t.comm_alone);
      s.push_back(t.step);
      k.push_back(t.compute);
      w.push_back(t.wait);
    }
    const std::string name =
        v < variants.size() ? variants[v].name : "thread in blocking MPI_Allreduce";
    std::printf("%-34s %10.1f %8.1f %10.1f %7.1f\n", name.c_str(), median(c), median(s),
                median(k), median(w));
  }
}

}  // namespace

int main(int argc, char** argv) {
  ddp::World world = ddp::init_world(&argc, &argv);
  const Args args = parse(argc, argv);
  // One GEMM thread per rank: the question is whether communication hides
  // behind compute on the cores a rank has, not whether BLAS scales.
  ddp::set_blas_threads(1);
  Gemm gemm;
  const int calls = gemm.calibrate(args.compute_ms);
  if (world.rank == 0)
    std::printf("bench_overlap: %d ranks, %d cores visible, %d GEMM calls of 256^3 ~ %.0f ms\n",
                world.size, ddp::available_cores(), calls, args.compute_ms);
  if (world.size < 2 && world.rank == 0)
    std::printf("(one rank: nothing to communicate; run under mpirun -np 2)\n");
  if (args.poll)
    poll_table(world, args, gemm, calls);
  else
    overlap_table(world, args, gemm, calls);
  ddp::finalize_world(world);
  return 0;
}
