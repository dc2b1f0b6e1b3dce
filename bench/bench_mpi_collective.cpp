// The speed of an MPI collective itself, with nothing of Trident between the loop and the
// library: `calls` collectives over `kib` KiB of fp32 per round (the whole buffer: the
// all-reduce's, the all-gather's output, the reduce-scatter's input), after 20 untimed,
// over MPI_COMM_WORLD; rank 0 prints each round's time and bus bandwidth (nccl-tests'
// convention: 2(n-1)/n x bytes / time for the all-reduce, (n-1)/n x bytes / time for the
// others). KIND all: the three in turn in every round, in one process. Run it several times in a row to see how one machine's link speed differs
// between processes and within one, and the kinds side by side (docs/PERFORMANCE.md,
// "trident plan on CPU ranks: the least wait, and the link between runs").
// FLUSH_MIB (given, even 0): each call is timed alone, after a barrier, and the round's
// time is the sum over its calls of each call's least time over the ranks (as the
// trainer's comm_kind_least_ms); before every call each rank writes a line of every 64
// bytes of a FLUSH_MIB MiB buffer (untimed), which evicts the collective's buffers from
// the caches as a model's compute does between its collectives. 0 against 64 (larger than
// the L3) is the same call with its buffers hot and cold (docs/PERFORMANCE.md, "Cold
// collectives, and what the overlapped waits count").
//   mpirun -np 2 build/bench/bench_mpi_collective [allreduce|allgather|reduce_scatter|all]
//       [KiB, default 256] [calls, default 128] [rounds, default 5] [FLUSH_MIB]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string kind = argc > 1 ? argv[1] : "allreduce";
  const long kib = argc > 2 ? std::atol(argv[2]) : 256;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 128;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  const bool per_call = argc > 5;
  const long flush_mib = per_call ? std::atol(argv[5]) : 0;
  const long count = kib * 1024 / static_cast<long>(sizeof(float));
  const std::vector<std::string> kinds =
      kind == "all" ? std::vector<std::string>{"allreduce", "allgather", "reduce_scatter"}
                    : std::vector<std::string>{kind};
  const bool known = kind == "all" || kind == "allreduce" || kind == "allgather" || kind == "reduce_scatter";
  if (!known || kib <= 0 || calls <= 0 || rounds <= 0 || count % size != 0 || flush_mib < 0) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "bench_mpi_collective: KIND is allreduce, allgather, reduce_scatter or all; KiB, calls "
                   "and rounds are positive, the KiB's floats divide by the %d ranks, and FLUSH_MIB "
                   "is not negative\n",
                   size);
    }
    MPI_Finalize();
    return 2;
  }
  std::vector<float> buf(static_cast<size_t>(count), 1.0f), part(static_cast<size_t>(count / size), 1.0f);
  std::vector<unsigned char> flush(static_cast<size_t>(flush_mib) << 20, 0);
  const int n = static_cast<int>(count), chunk = static_cast<int>(count / size);
  auto once = [&](const std::string& k) {
    if (k == "allreduce") {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (k == "allgather") {
      MPI_Allgather(part.data(), chunk, MPI_FLOAT, buf.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
    } else {
      MPI_Reduce_scatter_block(buf.data(), part.data(), chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  };
  for (const std::string& k : kinds) {
    for (int i = 0; i < 20; ++i) once(k);
  }
  for (int r = 0; r < rounds; ++r) {
    for (const std::string& k : kinds) {
      const double factor = (k == "allreduce" ? 2.0 : 1.0) * (size - 1) / size;
      const double bus = factor * static_cast<double>(kib) * 1024 * calls;
      double t = 0;
      if (!per_call) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < calls; ++i) once(k);
        t = MPI_Wtime() - t0;
      } else {
        for (int i = 0; i < calls; ++i) {
          volatile unsigned char* line = flush.data();  // volatile: the writes are kept
          for (size_t b = 0; b < flush.size(); b += 64) line[b] = static_cast<unsigned char>(line[b] + 1);
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          once(k);
          double call = MPI_Wtime() - t0, least = 0;
          MPI_Allreduce(&call, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
          t += least;
        }
      }
      if (rank == 0) {
        std::printf("%d ranks, %d %s of %ld KiB%s: %.2f ms (%.2f GB/s bus)\n", size, calls, k.c_str(), kib,
                    per_call ? (", each call's least, flush " + std::to_string(flush_mib) + " MiB").c_str() : "",
                    t * 1e3, bus / t / 1e9);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
